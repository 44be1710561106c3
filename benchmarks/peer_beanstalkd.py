"""beanstalkd: reserve / delete, on a server this harness launches and stops.

The harness runs Debian's ``beanstalkd`` as a subprocess on a free port of
127.0.0.1, by default with a binlog in a scratch directory (fsync at most
every 50 ms, the daemon's default) so that it keeps jobs across a restart as
the other peers do; ``--no-beanstalkd-binlog`` runs it in memory only.
A reserved job whose worker dies comes back when its time-to-run runs out;
``delete`` is refused unless this connection holds the reservation.
beanstalkd has no batch reserve.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from .harness import Peer, PeerInfo, PeerUnavailable, Prepared, Worker

STARTUP_TIMEOUT_S = 10.0
TTR_S = 60  # longer than any job here takes: no reservation expires mid-run


class BeanstalkdWorker(Worker):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import greenstalk

        self._timed_out = greenstalk.TimedOutError
        self._not_found = greenstalk.NotFoundError
        self.client = greenstalk.Client(tuple(config["address"]), use=config["tube"], watch=config["tube"])

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        self.calls += 1
        try:
            # Timeout 0: answer at once; a worker that found the tube empty is done.
            job = self.client.reserve(timeout=0)
        except self._timed_out:
            return []
        return [(json.loads(job.body)["id"], job)]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        accepted = []
        for number, job in jobs:
            self.calls += 1
            try:
                self.client.delete(job)
            except self._not_found:  # the reservation ran out and someone else holds the job
                self.lost += 1
                continue
            accepted.append(number)
        return accepted

    def close(self) -> None:
        self.client.close()


class BeanstalkdPeer(Peer):
    name = "beanstalkd"
    batch_form = None

    def __init__(self, binary: str = "beanstalkd", *, binlog: bool = True) -> None:
        self.binary = binary
        self.binlog = binlog
        self.proc: subprocess.Popen[bytes] | None = None
        self.address: tuple[str, int] | None = None
        self._dir: Path | None = None
        self._version = "?"

    def start(self) -> PeerInfo:
        path = shutil.which(self.binary)
        if path is None:
            raise PeerUnavailable(f"{self.binary!r} not found (apt-get install beanstalkd)")
        try:
            import greenstalk
        except ImportError:
            raise PeerUnavailable("the greenstalk package is not installed (pip install greenstalk)") from None
        self.binary = path
        self._launch()
        assert self.address is not None
        with greenstalk.Client(self.address) as client:
            self._version = str(client.stats().get("version", "?"))
        return PeerInfo(
            name=self.name,
            version=f"beanstalkd {self._version} (launched by the harness), greenstalk {_dist_version('greenstalk')}",
            target=f"{self.address[0]}:{self.address[1]}",
            recipe=(
                "reserve (timeout 0) / delete; delete is refused unless this connection holds the reservation; "
                f"a dead worker's job comes back when its TTR ({TTR_S} s) runs out"
            ),
            durability=(
                "binlog in a scratch directory, fsync at most every 50 ms (the default)"
                if self.binlog
                else "in memory only (no binlog): a restart loses every job"
            ),
        )

    def _launch(self) -> None:
        """Start a fresh server on a free loopback port (and a fresh binlog directory)."""
        self._dir = Path(tempfile.mkdtemp(prefix="aeroqueue-beanstalkd-"))
        last_error = ""
        for _ in range(3):  # the free port can be taken between our probe and the daemon's bind
            port = _free_port()
            cmd = [self.binary, "-l", "127.0.0.1", "-p", str(port)]
            if self.binlog:
                cmd += ["-b", str(self._dir)]
            log = (self._dir / "beanstalkd.log").open("wb")
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            log.close()
            give_up = time.monotonic() + STARTUP_TIMEOUT_S
            while time.monotonic() < give_up and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                except OSError:
                    time.sleep(0.05)
                    continue
                self.address = ("127.0.0.1", port)
                return
            last_error = (self._dir / "beanstalkd.log").read_text(errors="replace").strip()
            self._terminate()
        raise PeerUnavailable(f"beanstalkd did not start: {last_error or 'no output'}")

    def _terminate(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None
        self.address = None

    def _client(self, tube: str) -> Any:
        import greenstalk

        assert self.address is not None, "start() first"
        return greenstalk.Client(self.address, use=tube, watch=tube)

    def prepare(self, n_jobs: int) -> Prepared:
        tube = f"aq-bench-{uuid.uuid4().hex[:10]}"
        with self._client(tube) as client:
            # No batch put in the protocol: one command per job.
            for i in range(n_jobs):
                client.put(json.dumps({"id": i, "payload": {"i": i}}), ttr=TTR_S)
        return Prepared(BeanstalkdWorker, {"address": list(self.address or ()), "tube": tube}, n_jobs)

    def verify(self, prepared: Prepared, acked: int) -> str | None:
        import greenstalk

        with self._client(prepared.config["tube"]) as client:
            try:
                stats = client.stats_tube(prepared.config["tube"])
            except greenstalk.NotFoundError:  # a drained, unwatched tube is gone
                stats = {}
        problems = []
        ready = int(stats.get("current-jobs-ready", 0))
        if ready != prepared.jobs - acked:
            problems.append(f"{ready} jobs ready, {prepared.jobs - acked} expected")
        for state in ("reserved", "buried", "delayed"):
            if int(stats.get(f"current-jobs-{state}", 0)):
                problems.append(f"{stats[f'current-jobs-{state}']} jobs {state}")
        return "; ".join(problems) or None

    def discard(self, prepared: Prepared) -> None:
        import greenstalk

        with self._client(prepared.config["tube"]) as client:
            try:
                left = int(client.stats_tube(prepared.config["tube"]).get("current-jobs-ready", 0))
            except greenstalk.NotFoundError:
                left = 0
        if left:
            # Deleting a sampled million-job tube one job at a time takes longer
            # than the run; the server is ours, so start a fresh one instead.
            self.stop()
            self._launch()

    def stop(self) -> None:
        self._terminate()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"
