"""Losing a node of a replication-factor-2 cluster, under load.

Worker processes work through a list while the test kills a node (SIGKILL), or
freezes it (SIGSTOP) past the cluster's heartbeat timeout, at a random moment.
While it is down, `aeroqueue status`, a new worker and the web handler must
start and work with the full seed list (the lost node among the seeds); then
the node comes back. On two nodes, once the copies are made again, the other
node (the first seed) goes the same way; on three, a second node is killed. At
the end every job is done, acknowledged exactly once, and none is still
claimed; a job whose handler ran twice was given back after an acknowledgement
failed or as an orphaned claim (losses in flight surface as retries), and no
worker died.

A frozen node that resumes may find the others silent for longer than the
heartbeat timeout and, for a second or so before it rejoins, form a cluster of
its own with the data it had when it froze (its log: "principal node - applied
new succession list" naming itself alone): a split. Clients that know another
node ignore the partition map of such a one-node cluster, so the workers never
use it; the test reports when it happened and still demands exactly-once. With
three nodes the fixture sets min-cluster-size 2, which leaves a resumed node no
cluster of its own: the test checks that it formed none.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from aeroqueue.backends.base import CLIENT_TIMEOUT_MS, CLOCK_MARGIN_MS
from tests.cluster import Cluster
from tests.logs import json_events
from tests.waiting import wait_for

from .conftest import agent, aq, in_namespace

N_JOBS = 3000
PROBE = 20  # jobs of each round's probe list: the web handler and the new worker take them
N_WORKERS = 3
# The expiry must outlast a node's loss: the cluster drops a node after 1.5 s
# (heartbeat interval 150 ms x timeout 10), and the client learns the new
# partition map within about 2 s more, while calls to a frozen node time out.
HEARTBEAT_S, EXPIRY_S = 0.5, 8.0
# A frozen node stays frozen at least this long. Clients keep sending it calls
# until they learn the new partition map (3 to 5 s after the freeze in these
# runs), and a call it runs on resuming before that call's deadline (the
# client's timeout plus the clock margin, 1.5 s) can still undo a transition:
# the limit the README states, shown alone by test_replay.py. The down checks
# used to take long enough by themselves; on a faster machine the freeze
# shrank to 6.5 s, inside that window, and a job was acknowledged twice.
MIN_FREEZE_S = 5.0 + (CLIENT_TIMEOUT_MS + CLOCK_MARGIN_MS) / 1000 + 3.0

pytestmark = pytest.mark.timeout(240)


class Workers:
    """Worker processes inside the namespace, each logging JSON lines to its own file."""

    def __init__(self, cluster: Cluster, list_name: str, logs: Path) -> None:
        self.cluster = cluster
        self.list_name = list_name
        self.logs = logs
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, *more_lists: str) -> Path:
        log = self.logs / f"worker-{len(self.procs)}.jsonl"
        lists = [arg for name in (*more_lists, self.list_name) for arg in ("--list", name)]
        cmd = [
            sys.executable, "-m", "aeroqueue", "--url", self.cluster.url(), "worker",
            "--handler", "tests.multinode.handler:handle", *lists, "--concurrency", "3",
            "--heartbeat", str(HEARTBEAT_S), "--expiry", str(EXPIRY_S), "--sweep-every", "5", "--sweep-grace", "5",
            "--until-complete", "--log-format", "json", "--drain-timeout", "10",
        ]
        where = in_namespace(self.cluster)
        where["env"]["AEROQUEUE_CHAOS_LOG"] = str(self.logs)
        with open(log, "w") as stderr:
            proc = self.cluster.popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, **where)
        self.procs.append((proc, log))
        return log

    def events(self) -> list[dict[str, Any]]:
        return [event for _, log in self.procs for event in json_events(log)]  # a killed worker's last line may be cut

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def probes(tmp_path: Path, n: int) -> Path:
    path = tmp_path / f"probe-{n}.csv"
    path.write_text("id,n\n" + "".join(f"p{n}-{i},{i}\n" for i in range(PROBE)))
    return path


def done_count(log: Path) -> int:
    return log.read_text().count('"job_done"')


def complete(cluster: Cluster, list_name: str) -> bool:
    out = aq(cluster, "status", list_name, "--json")
    return out.returncode == 0 and bool(json.loads(out.stdout)["complete"])


def down_checks(cluster: Cluster, workers: Workers, list_name: str, probe: str, victim: int) -> dict[str, float]:
    """With node `victim` down, every kind of process starts and works through the full seed
    list. The web handler and the new worker take jobs from `probe`, so that they have jobs
    to take however far the workers got with the main list."""
    took: dict[str, float] = {}
    t = time.monotonic()
    st = aq(cluster, "status", list_name, "--json")
    assert st.returncode == 0, f"status with node {victim} down: {st.stderr}"
    assert json.loads(st.stdout)["total"] == N_JOBS
    took["status"] = time.monotonic() - t

    t = time.monotonic()
    web = agent(cluster, "web", cluster.url(), probe, "2")["answers"]
    # 503 (with Retry-After) is how the web handler says "try again"; it must serve.
    assert all(a["status"] in (200, 503) for a in web) and any(a["status"] == 200 for a in web), web
    took["web"] = time.monotonic() - t

    t = time.monotonic()
    log = workers.start(probe)
    wait_for(f"a worker started with node {victim} down completes jobs", lambda: done_count(log) > 0, 30)
    took["new worker"] = time.monotonic() - t
    return took


_LOG_TIME = re.compile(r"^(\w{3} \d{2} \d{4} \d{2}:\d{2}:\d{2}) GMT")
_ALONE = re.compile(r"principal node - applied new succession list: (\S+)\s*$")
_SIZE = re.compile(r"applied cluster size (\d+)")


def splits(cluster: Cluster, victim: int, since: float) -> list[tuple[float, float]]:
    """The windows (Unix seconds) during which node `victim`, resumed after `since`,
    was the principal of a cluster of its own while the others went on without it:
    from its log, from "applied new succession list: <itself alone>" to the next
    cluster it applies with every node. Log times have whole seconds."""
    me = cluster.nodes[victim].node_id
    out: list[tuple[float, float]] = []
    start: float | None = None
    for line in cluster.nodes[victim].log.read_text(errors="replace").splitlines():
        m = _LOG_TIME.match(line)
        if not m:
            continue
        at = datetime.strptime(m.group(1), "%b %d %Y %H:%M:%S").replace(tzinfo=UTC).timestamp()
        if at < int(since):
            continue
        alone = _ALONE.search(line)
        if alone and start is None and alone.group(1) == me:
            start = at
        size = _SIZE.search(line)
        if size and start is not None and int(size.group(1)) == len(cluster.nodes):
            out.append((start, at + 1))
            start = None
    if start is not None:
        out.append((start, time.time()))
    return out


def audit(cluster: Cluster, workers: Workers, list_name: str, logs: Path) -> dict[str, int]:
    got = agent(cluster, "audit", cluster.url(), list_name, str(N_JOBS), timeout=120)
    (logs / "audit.json").write_text(json.dumps(got))  # to look at a failure
    st = got["status"]
    assert (st["done"], st["dead"], st["in_flight"], st["reservable"], st["retry_pending"]) == (N_JOBS, 0, 0, 0, 0), st

    events = workers.events()
    acked = Counter(e["jid"] for e in events if e.get("event") == "job_done")
    ack_failed = {e["jid"] for e in events if e.get("event") == "ack_failed"}
    runs: dict[str, list[str]] = defaultdict(list)
    for f in logs.glob("exec-*.log"):
        for line in f.read_text().splitlines():
            jid, _pid, sess, at = line.split()
            runs[jid].append(f"{sess[:8]}@{at}")
    for job in got["jobs"]:
        assert job is not None, "a job record is missing"
        jid = job["jid"]
        assert job["state"] == "done", f"{jid} is {job['state']}"
        assert job["sess"] is None, f"{jid} is still claimed by {job['sess']}"
        assert jid in runs, f"{jid} is done, but no handler ran it"
        # Its worker logs each acknowledgement it heard succeed: one at most. None when
        # the answer was lost past every retry (ack_failed), though it did land.
        assert acked[jid] == 1 or (acked[jid] == 0 and jid in ack_failed), (
            f"{jid} acknowledged {acked[jid]} times; runs (session@time) {runs[jid]}, last claim {job['rid']}"
        )
        assert job["by"] == job["result"]["session"], f"{jid}: completed by a session other than the one that ran it"
    given_back = ack_failed | {e["jid"] for e in events if e.get("event") == "orphan_released"}
    reruns = sorted(jid for jid, ats in runs.items() if len(ats) > 1)
    assert set(reruns) <= given_back, f"jobs that ran twice without a loss in flight: {set(reruns) - given_back}"
    return {"reruns": len(reruns)}


KILL, STOP = signal.SIGKILL, signal.SIGSTOP


# The 3-node round (min-cluster-size 2: node 0 frozen and resumed, then, once
# migrations finished, node 1 killed and restarted) found jobs acknowledged twice
# (issue 20): the frozen node, on resuming, ran the calls clients had sent it
# during the freeze on its stale copy, and its replica writes replaced the newer
# records of the live nodes (Aerospike CE keeps the later last-update time for a
# replica write, whatever the generations). A job acknowledged on the live nodes
# came back claimed, was given back as an orphaned claim, ran and was
# acknowledged again. tests/multinode/test_replay.py shows the mechanism alone; job
# transitions now carry a deadline past which they change nothing, and this round
# passes. Its freeze (MIN_FREEZE_S at least) outlasts the deadline of the last
# call sent to the frozen node by seconds; a node that resumes sooner is the
# limit the README states.
@pytest.mark.parametrize(
    ("size", "rounds"),
    # Both signals on each cluster size, in one run each: on 2 nodes node 1 is killed
    # and restarted, then the first seed is frozen and resumed.
    [(2, ((1, KILL), (0, STOP))), (3, ((0, STOP), (1, KILL)))],
    ids=["2-nodes-SIGKILL-SIGSTOP", "3-nodes-SIGSTOP-SIGKILL"],
)
def test_losing_a_node_loses_no_job(
    request: pytest.FixtureRequest, size: int, rounds: tuple[tuple[int, signal.Signals], ...], tmp_path: Path
) -> None:
    cluster: Cluster = request.getfixturevalue(f"cluster{size}")
    list_name = f"fo-{size}-" + "-".join(sig.name.lower() for _, sig in rounds)
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,n\n" + "".join(f"c{i},{i}\n" for i in range(N_JOBS)))
    out = aq(cluster, "load", list_name, str(jobs), "--seal")
    assert out.returncode == 0, out.stderr
    logs = tmp_path / "logs"
    logs.mkdir()
    workers = Workers(cluster, list_name, logs)
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    figures: list[str] = [f"seed {seed}"]
    try:
        pace = logs / "pace-ms"
        pace.write_text("30")  # at most ~35 jobs/s per handler thread while nodes come and go
        for _ in range(N_WORKERS):
            workers.start()
        started = time.monotonic()
        # Node 0 is the first seed of every process's URL.
        split: list[tuple[float, float]] = []
        for n, (victim, how) in enumerate(rounds):
            probe = f"probe-{n}"
            out = aq(cluster, "load", probe, str(probes(tmp_path, n)), "--seal")
            assert out.returncode == 0, out.stderr
            wait_for("workers progress", lambda: sum(done_count(log) for _, log in workers.procs) > 0, 60)
            time.sleep(rng.uniform(0.2, 1.5))  # a random moment of the run
            t = time.monotonic()
            if how == KILL:
                cluster.kill(victim)
            else:
                cluster.signal(victim, STOP)
                time.sleep(2.5)  # past the heartbeat timeout (1.5 s): the others drop it
            live = [node.index for node in cluster.nodes if node.index != victim]
            cluster.wait_stable(live, timeout_s=30)
            took = down_checks(cluster, workers, list_name, probe, victim)
            if how == STOP:
                time.sleep(max(0.0, t + MIN_FREEZE_S - time.monotonic()))
            resumed = time.time()
            if how == KILL:
                cluster.start(victim, wait=False)
            else:
                cluster.signal(victim, signal.SIGCONT)
            took["back"] = time.monotonic() - t
            if n + 1 < len(rounds):
                # The next node may go only once the copies are made again (replication factor 2).
                pace.write_text("150")  # slower meanwhile, so that the next round has jobs left
                cluster.wait_stable(migrations=True, timeout_s=90)
                pace.write_text("30")
            if how == STOP:
                cluster.wait_stable(timeout_s=30)
                split += splits(cluster, victim, resumed)
            figures.append(
                f"node {victim} {how.name} at {t - started:.1f}s, back after {took['back']:.1f}s "
                f"(status {took['status']:.2f}s, web {took['web']:.2f}s, new worker's first job {took['new worker']:.2f}s)"
                + "".join(f"; a cluster of its own after resuming for {hi - lo:.0f}s (log times)" for lo, hi in split)
            )
        pace.write_text("0")
        for name in (list_name, *(f"probe-{n}" for n in range(len(rounds)))):
            wait_for(f"{name} completes", lambda name=name: complete(cluster, name), 90)
        elapsed = time.monotonic() - started
        for proc, log in workers.procs:
            code = proc.wait(60)
            assert code == 0, f"worker exited {code}:\n{log.read_text()[-2000:]}"
    finally:
        workers.stop_all()
        for node in cluster.nodes:  # the nodes' own account, to look at a failure
            if node.log.exists():
                shutil.copy(node.log, logs / f"asd-{node.index}.log")
    counts = audit(cluster, workers, list_name, logs)
    events = Counter(e.get("event") for e in workers.events())
    # A line of another library's logger has no event: left out before sorting the names.
    retries = dict(sorted((k, v) for k, v in events.items() if k and (k.endswith("_failed") or k == "orphan_released")))
    print(
        f"\nfailover {size} nodes {'+'.join(sig.name for _, sig in rounds)}: {N_JOBS} jobs in {elapsed:.1f}s "
        f"by {len(workers.procs)} workers; {counts['reruns']} handler reruns; retries {retries}\n  " + "\n  ".join(figures)
    )
    if size >= 3:
        assert not split, f"a resumed node formed a cluster of its own despite min-cluster-size: {split}"
