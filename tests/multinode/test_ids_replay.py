"""A frozen node that resumes must not put an ID store chunk back as it had it
(test_replay.py has the mechanism: Aerospike CE lets the replayed write replace the
newer copy).

A pop sent to a frozen node is in doubt; on the live nodes the call is made again
and a worker pops one more ID. When the node resumes it runs the waiting pop on its
stale copy: the chunk is back with the IDs popped since, handed out again. A kick's
remove the same way. Lists "pg" and "rg" get the call with its deadline
(aq_ids_v1.lua, header): nothing is undone. "pb" and "rb" get it without one, as
before: the control, which shows that replays happened.
"""

from __future__ import annotations

import pytest

from tests.cluster import Cluster

from .replaying import replay_round

LISTS = ("pg", "pb", "rg", "rb")
K = 30  # chunks per list: about a third have the frozen node as their master

pytestmark = pytest.mark.timeout(180)


def test_a_resumed_node_does_not_put_back_ids_popped_since(cluster3: Cluster) -> None:
    in_doubt, redone, final = replay_round(cluster3, "ids_replayer", str(K))

    undone = {name: {c: final[name][c] for c, left in redone[name].items() if final[name][c] != left} for name in LISTS}
    print(f"\nID store replay: in doubt {[len(in_doubt[n]) for n in LISTS]}, redone and popped on the live nodes "
          f"{[len(redone[n]) for n in LISTS]}, put back by the resumed node {[len(undone[n]) for n in LISTS]} "
          f"({', '.join(LISTS)})")
    assert all(redone[n] for n in LISTS), f"no call went to the frozen node: {in_doubt}"
    assert undone["pb"] and undone["rb"], (
        f"the control: no replay without a deadline put a chunk back ({undone}), so this run shows nothing")
    assert not undone["pg"] and not undone["rg"], f"chunks put back by replays despite the deadline: {undone}"
