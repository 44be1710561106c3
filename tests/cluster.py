"""A multi-node Aerospike cluster on one machine, inside a network namespace.

Aerospike never advertises a loopback address to clients, so the nodes of a
cluster on one machine need addresses of their own: this module makes a
network namespace ``aqtest-<name>`` with veth pairs inside it (10.77.S.1,
10.77.S.2, ... one address per node, ``lo`` up), and starts one
``/work/shared/aerospike/asd`` per address from its own directory, each with
its own ``node-id``, ports, ``access-address`` and mesh seeds naming the other
nodes. Namespace ``test`` has ``replication-factor 2``, ``nsup-period 1`` and
in-memory storage. No traffic leaves the namespace: clients, workers and tests
run inside it (`Cluster.run`, `Cluster.popen`, or ``ip netns exec``).

The test fixtures (tests/cluster/conftest.py) use `Cluster`; people use the
same code from the command line (as root, from the repository's root)::

    python -m tests.cluster up --nodes 3            # prints the store URL
    python -m tests.cluster exec -- .venv/bin/aeroqueue udf register
    python -m tests.cluster exec -- .venv/bin/aeroqueue status customers
    python -m tests.cluster kill 1                  # SIGKILL node 1 (stop/cont: SIGSTOP/SIGCONT)
    python -m tests.cluster start 1                 # start it again (empty: in-memory storage)
    python -m tests.cluster down                    # stop every node, delete the namespace

``exec`` runs ``AEROQUEUE_URL`` set to the cluster's URL. ``--name`` (default
``dev``) and ``--subnet`` (default 10.77.9) let several clusters coexist.

Only the standard library is imported here: the same module runs inside the
namespace to speak Aerospike's info protocol (``wait``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ASD = Path(os.environ.get("AEROQUEUE_ASD", ROOT.parent / "shared" / "aerospike" / "asd"))
if not ASD.exists():  # a worktree beside the shared directory
    ASD = Path("/work/shared/aerospike/asd")
PREFIX = "aqtest-"
DEFAULT_SUBNET = "10.77.9"
BASE_PORT = 3000
PORT_STEP = 10  # node i: service 3000+10i, fabric +1, heartbeat +2, admin +3
FD_LIMIT = 20000  # asd refuses to start below proto-fd-max (15000)


class ClusterError(RuntimeError):
    """The cluster could not be made, started or reached."""


def namespaces_possible() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (ip netns add)"
    if not ASD.exists():
        return f"the Aerospike server binary {ASD} is missing"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        veth = subprocess.run(
            ["ip", "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"], capture_output=True, text=True
        )
        if veth.returncode != 0:
            return f"cannot make a veth pair in a namespace: {veth.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass(frozen=True)
class Node:
    index: int
    addr: str
    port: int
    dir: Path

    @property
    def conf(self) -> Path:
        return self.dir / "aerospike.conf"

    @property
    def pidfile(self) -> Path:
        return self.dir / "asd.pid"

    @property
    def log(self) -> Path:
        return self.dir / "asd.log"

    @property
    def node_id(self) -> str:
        return f"a{self.index + 1}"  # hex; the default derives from the MAC and collides


class Cluster:
    """N asd processes in one network namespace (see the module docstring)."""

    def __init__(
        self, name: str, nodes: int, *, subnet: str = DEFAULT_SUBNET, root: Path | None = None, min_cluster_size: int = 1
    ) -> None:
        if not 1 <= nodes <= 9:
            raise ClusterError(f"nodes must be 1..9, not {nodes}")
        if not 1 <= min_cluster_size <= nodes:
            raise ClusterError(f"min_cluster_size must be 1..{nodes}, not {min_cluster_size}")
        # Above 1, a node (or a group) cut off from the rest forms no cluster of its own
        # unless it has this many nodes: no second master for the same partitions.
        self.min_cluster_size = min_cluster_size
        self.name = name
        self.netns = f"{PREFIX}{name}"
        self.root = root or Path(f"/tmp/aeroqueue-cluster-{name}")
        self.subnet = subnet
        self.nodes = [
            Node(i, f"{subnet}.{i + 1}", BASE_PORT + PORT_STEP * i, self.root / f"node{i}") for i in range(nodes)
        ]
        self._procs: dict[int, subprocess.Popen[bytes]] = {}

    # -- addresses ---------------------------------------------------------------

    def url(self, nodes: Sequence[int] | None = None, namespace: str = "test", query: str = "") -> str:
        """The store URL naming these nodes (all by default) as seeds."""
        picked = [self.nodes[i] for i in (nodes if nodes is not None else range(len(self.nodes)))]
        hosts = ",".join(f"{n.addr}:{n.port}" for n in picked)
        return f"aerospike://{hosts}/{namespace}" + (f"?{query}" if query else "")

    # -- running things inside the namespace ---------------------------------------

    def command(self, cmd: Sequence[str | os.PathLike[str]]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *map(str, cmd)]

    def run(self, cmd: Sequence[str | os.PathLike[str]], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """Run a command inside the namespace (subprocess.run arguments)."""
        return subprocess.run(self.command(cmd), **kw)

    def popen(self, cmd: Sequence[str | os.PathLike[str]], **kw: Any) -> subprocess.Popen[Any]:
        """Start a command inside the namespace; `ip netns exec` execs it, so the pid is the command's."""
        return subprocess.Popen(self.command(cmd), **kw)

    # -- life cycle ------------------------------------------------------------------

    def up(self, *, timeout_s: float = 60.0) -> Cluster:
        """Make the namespace and start every node; returns once they form one cluster."""
        self.down()  # what a crashed run of the same name left behind
        self.root.mkdir(parents=True, exist_ok=True)
        saved = {"nodes": len(self.nodes), "subnet": self.subnet, "min_cluster_size": self.min_cluster_size}
        (self.root / "cluster.json").write_text(json.dumps(saved) + "\n")
        self._make_namespace()
        for node in self.nodes:
            self._write_conf(node)
        for node in self.nodes:
            self.start(node.index, wait=False)
        self.wait_stable(timeout_s=timeout_s)
        return self

    def _make_namespace(self) -> None:
        def ip(*args: str) -> None:
            out = subprocess.run(["ip", *args], capture_output=True, text=True)
            if out.returncode != 0:
                raise ClusterError(f"ip {' '.join(args)}: {out.stderr.strip()}")

        ip("netns", "add", self.netns)
        ip("-n", self.netns, "link", "set", "lo", "up")
        # One veth pair per two nodes, both ends inside the namespace: each end holds
        # one node's address (a veth end stands alone for an odd node out).
        for pair in range((len(self.nodes) + 1) // 2):
            a, b = f"aq{pair}a", f"aq{pair}b"
            ip("-n", self.netns, "link", "add", a, "type", "veth", "peer", "name", b)
            for end, i in ((a, 2 * pair), (b, 2 * pair + 1)):
                if i < len(self.nodes):
                    ip("-n", self.netns, "addr", "add", f"{self.nodes[i].addr}/24", "dev", end)
                ip("-n", self.netns, "link", "set", end, "up")

    def _write_conf(self, node: Node) -> None:
        for sub in ("work/smd", "udf/lua"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        seeds = "\n".join(
            f"\t\tmesh-seed-address-port {other.addr} {other.port + 2}" for other in self.nodes if other is not node
        )
        # Modelled on the config /work/shared/aerospike/server writes, with the
        # cluster's own addresses, ports, node-id and replication factor 2.
        node.conf.write_text(f"""# aeroqueue test cluster {self.name!r}, node {node.index} (written by tests/cluster.py)
service {{
	cluster-name aeroqueue-{self.name}
	node-id {node.node_id}
	min-cluster-size {self.min_cluster_size}
	proto-fd-max 15000
	migrate-threads 4
	work-directory {node.dir / 'work'}
	pidfile {node.pidfile}
}}

mod-lua {{
	user-path {node.dir / 'udf' / 'lua'}
}}

logging {{
	file {node.log} {{
		context any info
	}}
}}

network {{
	service {{
		address {node.addr}
		port {node.port}
		access-address {node.addr}
	}}

	fabric {{
		address {node.addr}
		port {node.port + 1}
	}}

	heartbeat {{
		mode mesh
		address {node.addr}
		port {node.port + 2}
{seeds}
		interval 150
		timeout 10
	}}

	admin {{
		address 127.0.0.1
		port {node.port + 3}
	}}
}}

namespace test {{
	replication-factor 2
	nsup-period 1
	allow-ttl-without-nsup true
	default-ttl 0

	storage-engine memory {{
		data-size 1G
	}}
}}
""")

    def start(self, index: int, *, wait: bool = True, timeout_s: float = 60.0) -> None:
        """Start node `index` (again: in-memory storage, so it comes back empty and
        refills by migration). With `wait`, return once every running node is one cluster."""
        node = self.nodes[index]
        if self.pid(index) is not None:
            raise ClusterError(f"node {index} is already running")
        node.pidfile.unlink(missing_ok=True)
        # asd's cwd must not hold client .lua files (they would shadow modules).
        with open(node.dir / "asd.console", "ab") as console:
            proc = self.popen(
                [ASD, "--foreground", "--config-file", node.conf],
                cwd=node.dir / "work", stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=_raise_fd_limit,
            )
        self._procs[index] = proc
        node.pidfile.write_text(f"{proc.pid}\n")
        if wait:
            self.wait_stable(timeout_s=timeout_s)

    def pid(self, index: int) -> int | None:
        """The pid of node `index`'s asd if it runs (stopped counts as running)."""
        node = self.nodes[index]
        proc = self._procs.get(index)
        if proc is not None:
            return proc.pid if proc.poll() is None else None
        try:
            pid = int(node.pidfile.read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            return None
        state = _proc_state(pid)
        return pid if str(node.conf).encode() in cmdline and state not in ("Z", "X", None) else None

    def running(self) -> list[int]:
        return [n.index for n in self.nodes if self.pid(n.index) is not None]

    def signal(self, index: int, sig: signal.Signals) -> None:
        pid = self.pid(index)
        if pid is None:
            raise ClusterError(f"node {index} is not running")
        os.kill(pid, sig)

    def kill(self, index: int) -> None:
        """SIGKILL node `index` and reap it."""
        self.signal(index, signal.SIGKILL)
        proc = self._procs.pop(index, None)
        if proc is not None:
            proc.wait(10)
        else:
            _wait_gone(self.nodes[index], 10)

    def wait_stable(self, nodes: Sequence[int] | None = None, *, migrations: bool = False, timeout_s: float = 60.0) -> str:
        """Wait until the running nodes (or `nodes`) agree on one cluster of their
        number (and, with `migrations`, have finished migrating); returns the cluster key."""
        picked = list(nodes) if nodes is not None else self.running()
        if not picked:
            raise ClusterError("no node is running")
        hosts = ",".join(f"{self.nodes[i].addr}:{self.nodes[i].port}" for i in picked)
        out = self.run(
            [sys.executable, "-m", "tests.cluster", "wait", "--hosts", hosts, "--timeout", str(timeout_s)]
            + (["--migrations"] if migrations else []),
            cwd=ROOT, capture_output=True, text=True,
        )
        if out.returncode != 0:
            tails = "\n".join(f"--- node {i} log:\n{_tail(self.nodes[i].log)}" for i in picked)
            raise ClusterError(f"cluster {self.name}: {out.stderr.strip() or out.stdout.strip()}\n{tails}")
        return out.stdout.strip()

    def info(self, index: int, command: str) -> str:
        """One info command on one node (run inside the namespace)."""
        node = self.nodes[index]
        out = self.run(
            [sys.executable, "-m", "tests.cluster", "info", "--host", f"{node.addr}:{node.port}", command],
            cwd=ROOT, capture_output=True, text=True,
        )
        if out.returncode != 0:
            raise ClusterError(f"info {command!r} on node {index}: {out.stderr.strip()}")
        return out.stdout.strip()

    def down(self) -> None:
        """Stop every node and every other process in the namespace, delete it. Safe to repeat."""
        for node in self.nodes:
            pid = self.pid(node.index)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
                proc = self._procs.pop(node.index, None)
                if proc is not None:
                    proc.wait(10)
                else:
                    _wait_gone(node, 10)
        self._procs.clear()
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if self.netns in listed:
            # Whatever else still runs in it (clients, workers) was started inside it by us.
            pids = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout.split()
            for p in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(p), signal.SIGCONT)
                    os.kill(int(p), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        hard = max(hard, FD_LIMIT)  # root may raise the hard limit; others get asd's own error
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, FD_LIMIT), hard))


def _proc_state(pid: int) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        return None
    return None


def _wait_gone(node: Node, timeout_s: float) -> None:
    try:
        pid = int(node.pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    give_up = time.monotonic() + timeout_s
    while _proc_state(pid) not in (None, "Z", "X") and time.monotonic() < give_up:
        time.sleep(0.05)


def _tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


# -- Aerospike's info protocol (inside the namespace) ------------------------------------


def info(host: str, port: int, command: str, timeout_s: float = 2.0) -> str:
    """Send one info command (protocol v2, type 1); the answer's value."""
    body = (command + "\n").encode()
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(struct.pack(">Q", (2 << 56) | (1 << 48) | len(body)) + body)
        head = _recv(s, 8)
        size = struct.unpack(">Q", head)[0] & 0xFFFFFFFFFFFF
        answer = _recv(s, size).decode(errors="replace")
    line = answer.split("\n", 1)[0]
    return line.split("\t", 1)[1] if "\t" in line else line


def _recv(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def _wait(hosts: list[tuple[str, int]], migrations: bool, timeout_s: float) -> str:
    """Every host answers the same cluster key for a cluster of len(hosts) nodes."""
    check = f"cluster-stable:size={len(hosts)};ignore-migrations={'false' if migrations else 'true'}"
    give_up = time.monotonic() + timeout_s
    last = ""
    while True:
        keys = set()
        for host, port in hosts:
            try:
                keys.add(info(host, port, check))
            except OSError as e:
                keys.add(f"ERROR {e}")
        last = ", ".join(sorted(keys))
        if len(keys) == 1:
            (key,) = keys
            if key and all(c in "0123456789ABCDEFabcdef" for c in key) and key != "0":
                return key
        if time.monotonic() > give_up:
            what = "finished migrating" if migrations else "formed"
            raise ClusterError(f"{len(hosts)}-node cluster not {what} within {timeout_s:.0f}s (last answers: {last})")
        time.sleep(0.1)


def _parse_hosts(text: str) -> list[tuple[str, int]]:
    out = []
    for part in text.split(","):
        host, _, port = part.rpartition(":")
        out.append((host, int(port)))
    return out


def default_min_cluster_size(nodes: int) -> int:
    """A majority from 3 nodes up: a node frozen (SIGSTOP) and resumed, or cut off,
    cannot form a cluster of its own beside the others and accept writes there. Two
    nodes keep 1, or losing either would stop the other."""
    return nodes // 2 + 1 if nodes >= 3 else 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; the shared options go before or after the command
    (``up --nodes 3`` as well as ``--nodes 3 up``)."""
    def shared(parser: argparse.ArgumentParser, default: Any) -> None:
        # On the subcommands the default is SUPPRESS, so that a value given before
        # the command is not overwritten by the subcommand's default.
        parser.add_argument("--name", default="dev" if default is None else default,
                            help="cluster name; namespace aqtest-NAME (default: dev)")
        parser.add_argument("--subnet", default=default,
                            help=f"first three octets of the node addresses (default: {DEFAULT_SUBNET})")
        parser.add_argument("--nodes", type=int, default=default, help="number of nodes (default: 2, or what `up` made)")
        parser.add_argument("--min-cluster-size", dest="min_cluster_size", type=int, default=default,
                            help="nodes a cluster needs to form (default: a majority from 3 nodes up, else 1)")

    p = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.split("\n\n")[0])
    shared(p, None)
    common = argparse.ArgumentParser(add_help=False)
    shared(common, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", parents=[common], help="make the namespace and start the nodes")
    sub.add_parser("down", parents=[common], help="stop the nodes and delete the namespace")
    sub.add_parser("url", parents=[common], help="print the store URL")
    sub.add_parser("status", parents=[common], help="which nodes run")
    for name, what in (("kill", "SIGKILL"), ("stop", "SIGSTOP"), ("cont", "SIGCONT"), ("start", "start")):
        sp = sub.add_parser(name, parents=[common], help=f"{what} one node")
        sp.add_argument("node", type=int)
    ex = sub.add_parser("exec", parents=[common], help="run a command inside the namespace with AEROQUEUE_URL set")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    w = sub.add_parser("wait", help="(inside the namespace) wait until HOSTS form one cluster")
    w.add_argument("--hosts", required=True)
    w.add_argument("--migrations", action="store_true")
    w.add_argument("--timeout", type=float, default=60.0)
    i = sub.add_parser("info", help="(inside the namespace) one info command")
    i.add_argument("--host", required=True)
    i.add_argument("command")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    try:
        if args.cmd == "wait":
            print(_wait(_parse_hosts(args.hosts), args.migrations, args.timeout))
            return 0
        if args.cmd == "info":
            ((host, port),) = _parse_hosts(args.host)
            print(info(host, port, args.command))
            return 0
        # What `up` made, unless told otherwise.
        saved_file = Path(f"/tmp/aeroqueue-cluster-{args.name}") / "cluster.json"
        saved = json.loads(saved_file.read_text()) if saved_file.exists() and args.cmd != "up" else {}
        nodes = args.nodes or saved.get("nodes") or 2
        min_size = args.min_cluster_size or saved.get("min_cluster_size") or default_min_cluster_size(nodes)
        cluster = Cluster(args.name, nodes, subnet=args.subnet or saved.get("subnet") or DEFAULT_SUBNET,
                          min_cluster_size=min_size)
        if args.cmd == "up":
            why = namespaces_possible()
            if why:
                raise ClusterError(why)
            cluster.up()
            print(cluster.url())
        elif args.cmd == "down":
            cluster.down()
            shutil.rmtree(cluster.root, ignore_errors=True)
        elif args.cmd == "url":
            print(cluster.url())
        elif args.cmd == "status":
            for n in cluster.nodes:
                print(f"node {n.index} {n.addr}:{n.port} pid {cluster.pid(n.index) or '-'}")
        elif args.cmd in ("kill", "stop", "cont"):
            sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "cont": signal.SIGCONT}[args.cmd]
            cluster.signal(args.node, sig)
        elif args.cmd == "start":
            cluster.start(args.node)
        elif args.cmd == "exec":
            argv_ = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not argv_:
                raise ClusterError("exec needs a command")
            env = {**os.environ, "AEROQUEUE_URL": cluster.url()}
            return cluster.run(argv_, env=env).returncode
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
