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

import pytest

from tests.cluster import Cluster

from .replaying import replay_round

LISTS = ("mguard", "mbare")
N = 30  # jobs per list: about a third have the frozen node as their master

pytestmark = pytest.mark.timeout(180)


def test_a_resumed_nodes_mark_does_not_undo_a_job_run_again(cluster3: Cluster) -> None:
    in_doubt, live, final = replay_round(cluster3, "mark_replayer", str(N), prep="dead")
    moved = live["moved"]

    undone = {name: {t: final[name][str(t)] for t in moved[name] if final[name][str(t)] != ["done", "B", "live"]}
              for name in LISTS}
    print(f"\nmark replay: marks in doubt {[len(in_doubt[n]) for n in LISTS]}, jobs run again elsewhere "
          f"{[len(moved[n]) for n in LISTS]}, undone by the resumed node {[len(undone[n]) for n in LISTS]} "
          f"({', '.join(LISTS)})")
    assert all(moved[n] for n in LISTS), f"no mark went to the frozen node: {in_doubt}"
    assert undone["mbare"], "the control: no replayed mark without a deadline undid a job, so this run shows nothing"
    assert not undone["mguard"], f"jobs undone by replayed marks despite their deadline (state, by, result): {undone}"
