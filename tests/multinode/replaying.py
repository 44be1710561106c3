"""What the frozen-node replay tests share (test_replay.py and test_*_replay.py): a replayer process driven one command at
a time, a node frozen until the others drop it, and a wait past a call's deadline.

Each replayer module holds a client whose partition map still names the frozen
node, so its calls wait in that node's sockets, and a live client seeded with the
other nodes; the test freezes node 0, has the replayer send the calls to be
replayed ("stale"), redo them on the live side, waits past their deadline, and
resumes the node, which then runs the calls it held on its stale copy.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aeroqueue.backends.base import CLOCK_MARGIN_MS
from tests.cluster import Cluster

from .conftest import in_namespace

TIMEOUT_MS = 300  # the replayers' client timeout: a call's deadline is this plus CLOCK_MARGIN_MS
FROZEN = 0  # the node frozen; its clients' maps still name it


class Replayer:
    """tests/multinode/<module>.py, given the stale and the live cluster URLs, then `args`."""

    def __init__(self, cluster: Cluster, module: str, *args: str) -> None:
        query = f"total_timeout={TIMEOUT_MS}"
        live = [i for i in range(len(cluster.nodes)) if i != FROZEN]
        cmd = [sys.executable, "-m", f"tests.multinode.{module}", cluster.url(query=query),
               cluster.url(live, query=query), *args]
        self.module = module
        self.proc = cluster.popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **in_namespace(cluster))

    def answer(self) -> Any:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"{self.module} died (exit {self.proc.wait(10)})"
        return json.loads(line)

    def ask(self, cmd: str) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@contextmanager
def node_frozen(cluster: Cluster) -> Iterator[None]:
    """Node FROZEN stopped (SIGSTOP) until the other nodes have dropped it, for the
    block; then resumed, and the cluster settled, migrations included."""
    cluster.signal(FROZEN, signal.SIGSTOP)
    try:
        # The others dropped it; the replayers' stale clients never learn it.
        cluster.wait_stable([i for i in range(len(cluster.nodes)) if i != FROZEN], timeout_s=30)
        yield
    finally:
        cluster.signal(FROZEN, signal.SIGCONT)
    cluster.wait_stable(timeout_s=30)
    cluster.wait_stable(migrations=True, timeout_s=60)


def past_deadline(sent: float) -> None:
    """Sleep until a call sent at `sent` (time.monotonic) is past its deadline, and not
    much longer: the frozen node still runs what it holds (test_replay.py: not at all
    past about 3 s)."""
    time.sleep(max(0.0, sent + (TIMEOUT_MS + CLOCK_MARGIN_MS) / 1000 + 0.4 - time.monotonic()))


def replay_round(cluster: Cluster, module: str, *args: str, prep: str = "prep") -> tuple[Any, Any, Any]:
    """The round of most replay tests, through `Replayer(cluster, module, *args)`:
    `prep` with every node up; with node FROZEN frozen, "stale" (the calls it will
    replay) then "live" (the calls again on the live nodes), and a wait past the stale
    calls' deadline; with it resumed, "read". The answers to stale, live and read."""
    client = Replayer(cluster, module, *args)
    try:
        assert client.ask(prep) == "ok"
        with node_frozen(cluster):
            in_doubt = client.ask("stale")
            sent = time.monotonic()  # the stale calls' last retries went just before this
            live = client.ask("live")
            past_deadline(sent)
        return in_doubt, live, client.ask("read")
    finally:
        client.close()

