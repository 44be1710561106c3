"""A frozen node that resumes must not bring back an ID-store chunk as the loader or
a recovery first wrote it (test_replay.py has the mechanism: Aerospike CE lets the
replayed write replace the newer copy).

A loader writes each range's chunk create-only (load.finish_range). One sent to a
node that is frozen past the heartbeat timeout waits in its socket; the loader
repeats it on the live nodes once its client learns the new partition map, and
workers pop the chunk empty. When the node resumes it runs the waiting create on its
own copy, where the chunk does not exist, and its replica write brings the chunk
back full on the live nodes: its IDs are handed out again. A recovery's write of a
chunk's `due` the same way: the replica write ships the whole record, the stale
copy's `ids` with it. So both carry the loader's deadline (`Backend.job_deadline`):
run later, they write nothing. Lists "cg" and "dg" get them with it; "cb" and "db"
without (the control, as the embedded store writes them), which shows that replays
happened in the run.

What a chunk brought back costs: its IDs' jobs are done (or delayed), so their claims
refuse them, a wasted claim each; nothing runs twice, no count changes.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.cluster import Cluster

from .replaying import Replayer, node_frozen, past_deadline

K = 18  # ranges (chunks) per list: about a third have the frozen node as their master
C = 4  # jobs per range (chunk_replayer.C)
N = K * C

pytestmark = pytest.mark.timeout(180)


def replay(cluster: Cluster, cmd: str, prep: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], float]:
    """chunk_replayer's `cmd` sent with node 0 frozen; (its answer, what "read" and
    "again" answer once the node resumed, seconds from the last call it was sent to
    its resuming)."""
    cluster.wait_stable(migrations=True, timeout_s=60)  # the stale client's map: the settled one
    client = Replayer(cluster, "chunk_replayer", str(K))
    try:
        assert client.answer() == "ready"
        if prep:
            assert client.ask("prep") == "ok"
        sent = time.monotonic()
        with node_frozen(cluster):
            out = client.ask(cmd)
            sent = time.monotonic() - out["since_sent_s"]
            past_deadline(sent)  # of the last write the frozen node holds
            resumed = time.monotonic() - sent
        return out, client.ask("read"), client.ask("again"), resumed
    finally:
        client.close()


def check(names: tuple[str, str], out: dict[str, Any], final: dict[str, Any], again: dict[str, Any],
          resumed: float, what: str, delayed: set[int]) -> None:
    guarded, bare = names
    # Every chunk was popped empty by the worker: one holding IDs was brought back.
    back = {name: [c for c, ids in enumerate(final[name]["chunks"]) if ids] for name in names}
    print(f"\n{what} replay: in doubt {[len(out['in_doubt'][n]) for n in names]}, brought back by the resumed "
          f"node {[len(back[n]) for n in names]} ({', '.join(names)}); resumed {resumed:.2f}s after the last call "
          f"it was sent ({out['since_sent_s']:.2f}s before its answer); handing them out again: claims answered "
          f"{[again[n] for n in names]}")
    for name in names:
        ran = [f"{name}-{i}" for i in range(N) if i not in delayed]
        assert sorted(out["done"][name]) == sorted(ran), f"{name}: each job ran once"
        assert out["in_doubt"][name], f"{name}: no chunk write went to the frozen node: {out['in_doubt']}"
        # Whatever was brought back, nothing ran again and no count moved.
        assert final[name]["jobs"] == [["delayed", 0] if i in delayed else ["done", 1] for i in range(N)], name
        assert final[name]["status"][:2] == [N, N - len(delayed)], (name, final[name]["status"])
        assert "ok" not in again[name], f"{name}: a job claimed again from a chunk brought back: {again[name]}"
        assert sum(again[name].values()) == sum(len(ids) for ids in final[name]["chunks"]), again[name]
    assert back[bare], f"the control: no chunk write without a deadline was replayed ({out}), so this run shows nothing"
    assert not back[guarded], f"chunks brought back by replays despite the deadline: {back[guarded]}"


def test_a_resumed_node_does_not_bring_back_a_chunk_created_again_and_popped(cluster3: Cluster) -> None:
    out, final, again, resumed = replay(cluster3, "load", prep=False)
    check(("cg", "cb"), out, final, again, resumed, "chunk create", delayed=set())


def test_a_resumed_node_does_not_bring_back_a_chunk_by_a_recoverys_due(cluster3: Cluster) -> None:
    out, final, again, resumed = replay(cluster3, "recover", prep=True)
    check(("dg", "db"), out, final, again, resumed, "recovery's due", delayed={i for i in range(N) if i % C == C - 1})
