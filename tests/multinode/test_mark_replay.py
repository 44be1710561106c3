"""A frozen node that resumes must not undo, with a sync's mark, a job run again since.

The mechanism is tests/multinode/test_replay.py's: calls sent to a node frozen past
the heartbeat timeout wait in its sockets and run when it resumes, on its stale copy,
and in Community Edition its replica write replaces the newer record on the live
nodes. A sync's mark (`aeroqueue.sync.mark`), sent to the frozen node and given up
as in doubt, is such a call: meanwhile an operator kicks the dead job it was for and
a worker completes it; replayed, the mark passes on the stale copy (the dead job
it vouches for) and brings that copy back over the completion, whose result is lost
(and which the sync never copies). List "mbare" gets marks without a deadline (the
control: as before marks had one), "mguard" the sync's own, with the deadline
(`Backend.job_deadline`) in their filter: nothing is undone there.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from aeroqueue.backends.base import CLOCK_MARGIN_MS
from tests.cluster import Cluster

from .conftest import in_namespace

LISTS = ("mguard", "mbare")
N = 30  # jobs per list: about a third have the frozen node as their master
TIMEOUT_MS = 300  # the client's timeout: the deadline is this plus CLOCK_MARGIN_MS

pytestmark = pytest.mark.timeout(180)


class Replayer:
    """tests/multinode/mark_replayer.py, one command at a time."""

    def __init__(self, cluster: Cluster) -> None:
        query = f"total_timeout={TIMEOUT_MS}"
        cmd = [sys.executable, "-m", "tests.multinode.mark_replayer", cluster.url(query=query),
               cluster.url([1, 2], query=query), str(N)]
        self.proc = cluster.popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **in_namespace(cluster))

    def ask(self, cmd: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the replayer died at {cmd!r} (exit {self.proc.wait(10)})"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def test_a_resumed_nodes_mark_does_not_undo_a_job_run_again(cluster3: Cluster) -> None:
    client = Replayer(cluster3)
    try:
        assert client.ask("dead") == "ok"
        cluster3.signal(0, signal.SIGSTOP)
        try:
            cluster3.wait_stable([1, 2], timeout_s=30)  # the others dropped it; the replayer's client never learns it
            in_doubt = client.ask("stale")
            sent = time.monotonic()  # the last marks' retries went just before this
            moved = client.ask("live")["moved"]
            time.sleep(max(0.0, sent + (TIMEOUT_MS + CLOCK_MARGIN_MS) / 1000 + 0.4 - time.monotonic()))
        finally:
            cluster3.signal(0, signal.SIGCONT)
        cluster3.wait_stable(timeout_s=30)
        cluster3.wait_stable(migrations=True, timeout_s=60)
        final = client.ask("read")
    finally:
        client.close()

    undone = {name: {t: final[name][str(t)] for t in moved[name] if final[name][str(t)] != ["done", "B", "live"]}
              for name in LISTS}
    print(f"\nmark replay: marks in doubt {[len(in_doubt[n]) for n in LISTS]}, jobs run again elsewhere "
          f"{[len(moved[n]) for n in LISTS]}, undone by the resumed node {[len(undone[n]) for n in LISTS]} "
          f"({', '.join(LISTS)})")
    assert all(moved[n] for n in LISTS), f"no mark went to the frozen node: {in_doubt}"
    assert undone["mbare"], "the control: no replayed mark without a deadline undid a job, so this run shows nothing"
    assert not undone["mguard"], f"jobs undone by replayed marks despite their deadline (state, by, result): {undone}"
