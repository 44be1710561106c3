"""A list dropped while a node is cut off stays dropped when the node comes back.

Community Edition deletes leave no tombstone (`durable_delete` is Enterprise only):
a node frozen (SIGSTOP) past the heartbeat timeout misses the drop, which the two
other nodes of a 3-node cluster (replication factor 2) carry out on their own, and
when it resumes, migrations merge its copies of the list's records back into the
cluster. A deleted record is no record on the others, so every copy the frozen node
held comes back: a run before the fix saw the list record return as it was before
the drop (sealed, not paused, 300 reservable) with 192 of its 300 job records and
188 of its index entries, a list that never completes, and a load of the same name
afterwards ran into the old job records and index entries.

The test freezes a node that holds a copy of both the list record and the list's
bitmap record (two of the three nodes hold each record: some node holds both), so
that the list record and its done bits come back every run, not two runs of three.
"""

from __future__ import annotations

import base64
import signal
from typing import Any

import aerospike
import pytest

from aeroqueue import keys
from tests.cluster import Cluster

from .conftest import agent, aq

N = 300  # jobs in the list dropped
DONE = 40  # of them completed before the drop (bits in its bitmap record)
AGAIN = 100  # jobs of the list loaded again under the same name: ids j0..j99, the old list's first ids

pytestmark = pytest.mark.timeout(240)


def holders(cluster: Cluster, set_name: str, key: str) -> set[int]:
    """The nodes holding a copy (master or replica) of a record, by its partition
    (the low 12 bits of the digest's first two bytes, little-endian) in each node's
    `replicas` bitmaps."""
    digest = aerospike.calc_digest("test", set_name, key)
    pid = int.from_bytes(digest[:2], "little") & 4095
    held = set()
    for node in cluster.nodes:
        for ns in cluster.info(node.index, "replicas").split(";"):
            name, _, fields = ns.partition(":")
            if name != "test":
                continue
            maps = [base64.b64decode(m) for m in fields.split(",")[2:]]
            if any(m[pid >> 3] & (0x80 >> (pid & 7)) for m in maps):
                held.add(node.index)
    return held


def test_a_list_dropped_while_a_node_was_frozen_stays_dropped(cluster3: Cluster) -> None:
    name = "gone"
    assert agent(cluster3, "load", cluster3.url(), name, str(N)) == {"loaded": N, "skipped": 0, "voided": 0}
    assert agent(cluster3, "work", cluster3.url(), name, str(DONE)) == {"done": DONE}
    both = holders(cluster3, keys.LIST_SET, name) & holders(cluster3, keys.DONE_SET, keys.chunk_name(name, 0))
    frozen = min(both)
    live = [i for i in range(3) if i != frozen]
    cluster3.signal(frozen, signal.SIGSTOP)
    try:
        cluster3.wait_stable(live, timeout_s=30)  # the others dropped it (min-cluster-size 2: a cluster of two)
        cluster3.wait_stable(live, migrations=True, timeout_s=60)  # and made their second copies
        dropped = aq(cluster3, "drop", name, "--yes", "--json", url=cluster3.url(live))
        assert dropped.returncode == 0, dropped.stderr
    finally:
        cluster3.signal(frozen, signal.SIGCONT)
    cluster3.wait_stable(timeout_s=30)
    cluster3.wait_stable(migrations=True, timeout_s=60)  # the resumed node's copies merged

    got: dict[str, Any] = agent(cluster3, "gone", cluster3.url(), name, str(N))
    print(f"\nnode {frozen} frozen through the drop ({dropped.stdout.strip()}); after it rejoined: "
          f"{got['job_records']} job records, {got['index_entries']} index entries, {got['bitmaps']} bitmap "
          f"records left; status {got['status'] if got['status'] == 'ListNotFound' else 'found'}")
    assert got["status"] == "ListNotFound", f"the dropped list came back: {got['status']}"
    assert got["header"] == "ListNotFound", got["header"]
    assert not got["listed"]
    assert got["reserved"] == "ListNotFound", f"a reservation from the dropped list: {got['reserved']}"

    # Loaded again under the same name (ids the old list had too): a new list with its
    # own jobs only, none of the old records in its way or in its counts.
    assert agent(cluster3, "load", cluster3.url(), name, str(AGAIN)) == {"loaded": AGAIN, "skipped": 0, "voided": 0}
    audit = agent(cluster3, "audit", cluster3.url(), name, str(N))
    st = audit["status"]
    counts = {k: st[k] for k in ("total", "reservable", "in_flight", "retry_pending", "done", "dead", "complete")}
    assert counts == {"total": AGAIN, "reservable": AGAIN, "in_flight": 0, "retry_pending": 0, "done": 0, "dead": 0,
                      "complete": False}, st
    jobs = [j for j in audit["jobs"] if j is not None]
    assert sorted(j["jid"] for j in jobs) == sorted(f"j{i}" for i in range(AGAIN)), "exactly the new jobs"
    assert all(j["state"] == "queued" and j["att"] == 0 for j in jobs), [j for j in jobs if j["state"] != "queued"]
