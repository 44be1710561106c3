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

import pytest

from tests.cluster import Cluster

from .replaying import replay_round

LISTS = ("kg", "kb", "bg", "bb")
N = 30  # jobs per list: about a third have the frozen node as their master

pytestmark = pytest.mark.timeout(180)


def test_a_resumed_node_does_not_undo_a_job_kicked_and_completed_since(cluster3: Cluster) -> None:
    in_doubt, redone, final = replay_round(cluster3, "kick_replayer", str(N))

    undone = {name: {t: final[name][str(t)] for t in redone[name] if final[name][str(t)][:3] != ["done", "B", "live"]}
              for name in LISTS}
    print(f"\nkick/bury replay: in doubt {[len(in_doubt[n]) for n in LISTS]}, redone and completed on the live "
          f"nodes {[len(redone[n]) for n in LISTS]}, undone by the resumed node {[len(undone[n]) for n in LISTS]} "
          f"({', '.join(LISTS)})")
    assert all(redone[n] for n in LISTS), f"no call went to the frozen node: {in_doubt}"
    assert undone["kb"] and undone["bb"], (
        f"the control: no replay without a deadline undid a completion ({undone}), so this run shows nothing")
    assert not undone["kg"] and not undone["bg"], f"completions undone by replays despite the deadline: {undone}"
