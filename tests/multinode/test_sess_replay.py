"""A frozen node that resumes must not take back, with a session call it ran late,
what the session recorded since (test_replay.py has the mechanism: Aerospike CE lets
the replayed write replace the newer copy).

A heartbeat sent to a frozen node is in doubt; the session goes on and leases jobs on
the live nodes (a lease lives only in the session record: the jobs stay queued while
they run). When the node resumes it runs the waiting beat on its stale copy, and the
session record is back as it was, the lease gone: a sweep then offers its jobs to
others while the session still runs them. Group "g" gets the beat with its deadline
(aq_sess_v1.lua): nothing is taken back. Group "b" gets it without one, as before:
the control, which shows that replays happened.
"""

from __future__ import annotations

import pytest

from tests.cluster import Cluster

from .replaying import replay_round

K = 24  # sessions per group: about a third have the frozen node as their master

pytestmark = pytest.mark.timeout(180)


def test_a_resumed_node_does_not_take_back_a_lease_recorded_since(cluster3: Cluster) -> None:
    in_doubt, leased, gone = replay_round(cluster3, "sess_replayer", str(K))
    print(f"\nsession replay: beats in doubt {[len(in_doubt[g]) for g in 'gb']}, leased on the live nodes "
          f"{[len(leased[g]) for g in 'gb']}, leases taken back by the resumed node {[len(gone[g]) for g in 'gb']} (g, b)")
    assert leased["g"] and leased["b"], f"no beat went to the frozen node: {in_doubt}"
    assert gone["b"], "the control: no replay without a deadline took a lease back, so this run shows nothing"
    assert not gone["g"], f"leases taken back by replayed beats despite the deadline: {gone['g']}"
