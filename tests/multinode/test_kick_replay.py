"""A frozen node that resumes must not undo, with an operator's kick or bury it ran
late, what the cluster did since (test_replay.py has the mechanism: Aerospike CE lets
the replayed write replace the newer copy).

A kick sent to a frozen node is in doubt; the operator repeats it on the live nodes,
and the job runs again and completes. When the node resumes it runs the waiting kick
on its stale copy (the job still dead there): the job is back queued with no
attempts, its result lost, and runs once more. A bury the same way buries a job
that was buried, kicked and completed since. Lists "kg" and "bg" get the call with
its deadline (aq_job_v1.lua, `kick` and `bury`): nothing is undone. "kb" and "bb"
get it without one, as before: the control, which shows that replays happened.
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

LISTS = ("kg", "kb", "bg", "bb")
N = 30  # jobs per list: about a third have the frozen node as their master
TIMEOUT_MS = 300  # the client's timeout: the deadline is this plus CLOCK_MARGIN_MS

pytestmark = pytest.mark.timeout(180)


class Replayer:
    """tests/multinode/kick_replayer.py, one command at a time."""

    def __init__(self, cluster: Cluster) -> None:
        query = f"total_timeout={TIMEOUT_MS}"
        cmd = [sys.executable, "-m", "tests.multinode.kick_replayer", cluster.url(query=query),
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


def test_a_resumed_node_does_not_undo_a_job_kicked_and_completed_since(cluster3: Cluster) -> None:
    client = Replayer(cluster3)
    try:
        assert client.ask("prep") == "ok"
        cluster3.signal(0, signal.SIGSTOP)
        try:
            cluster3.wait_stable([1, 2], timeout_s=30)  # the others dropped it; the replayer's client never learns it
            in_doubt = client.ask("stale")
            sent = time.monotonic()
            redone = client.ask("live")
            time.sleep(max(0.0, sent + (TIMEOUT_MS + CLOCK_MARGIN_MS) / 1000 + 0.4 - time.monotonic()))
        finally:
            cluster3.signal(0, signal.SIGCONT)
        cluster3.wait_stable(timeout_s=30)
        cluster3.wait_stable(migrations=True, timeout_s=60)
        final = client.ask("read")
    finally:
        client.close()

    undone = {name: {t: final[name][str(t)] for t in redone[name] if final[name][str(t)][:3] != ["done", "B", "live"]}
              for name in LISTS}
    print(f"\nkick/bury replay: in doubt {[len(in_doubt[n]) for n in LISTS]}, redone and completed on the live "
          f"nodes {[len(redone[n]) for n in LISTS]}, undone by the resumed node {[len(undone[n]) for n in LISTS]} "
          f"({', '.join(LISTS)})")
    assert all(redone[n] for n in LISTS), f"no call went to the frozen node: {in_doubt}"
    assert undone["kb"] and undone["bb"], (
        f"the control: no replay without a deadline undid a completion ({undone}), so this run shows nothing")
    assert not undone["kg"] and not undone["bg"], f"completions undone by replays despite the deadline: {undone}"
