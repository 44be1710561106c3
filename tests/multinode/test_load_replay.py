"""A frozen node that resumes must not undo jobs loaded, run and acknowledged meanwhile.

A loader's job records are create-only batch writes (`_write_range`). One sent to
a node that is frozen (SIGSTOP past the heartbeat timeout) waits in its socket;
the loader repeats it on the live nodes once its client learns the new partition
map, indexes and publishes the range, and workers claim and acknowledge the jobs.
When the node resumes it runs the waiting create on its own copy, where the
record does not exist, so the create succeeds, and its replica write, the newest
by last-update time, replaces the acknowledged job on the live node (README: "A
frozen node replays the calls it was sent"): the job is `queued` again, with no
attempt, its acknowledgement lost, and a sweep offers it to run again. So job
writes carry the loader's deadline (`Backend.job_deadline`), as job transitions
do: run later, they create nothing.

The control: create-only writes without a deadline, sent to the frozen node in the
same batch, then made and changed on the live nodes. If none of them was undone,
nothing was replayed and the run shows nothing.
"""

from __future__ import annotations

import time

import pytest

from tests.cluster import Cluster

from .replaying import Replayer, node_frozen, past_deadline

N = 60  # jobs: about a third have the frozen node as their master

pytestmark = pytest.mark.timeout(180)


def test_a_resumed_node_does_not_undo_a_loaded_and_acknowledged_job(cluster3: Cluster) -> None:
    cluster3.wait_stable(migrations=True, timeout_s=60)  # the stale client's map: the settled one
    client = Replayer(cluster3, "load_replayer", str(N))
    try:
        assert client.answer() == "ready"  # its map names node 0, which is up
        sent = time.monotonic()
        with node_frozen(cluster3):
            loaded = client.ask("load")
            sent = time.monotonic() - loaded["since_sent_s"]
            worked = client.ask("work")
            past_deadline(sent)  # of the writes the frozen node holds
            resumed = time.monotonic() - sent
        final = client.ask("read")
    finally:
        client.close()

    undone = [job for job in final["jobs"] if job[2:4] != ["done", 1]]
    reverted = [key for key, v in final["control"].items() if v != "live"]
    print(f"\nload replay: writes in doubt (jobs, control) {loaded['in_doubt']}; control undone by the resumed "
          f"node {len(reverted)}; resumed {resumed:.2f}s after the batch (load took {loaded['since_sent_s']:.2f}s); "
          f"acknowledged jobs undone {len(undone)} of {N}")
    assert loaded["report"] == [N, 0, 0], loaded
    assert sorted(worked["done"]) == sorted(f"{loaded['list']}-j{i}" for i in range(N)), "each job ran once"
    assert loaded["in_doubt"][0], f"no job write went to the frozen node: {loaded}"
    assert reverted, "the control: no replayed write without a deadline was undone, so this run shows nothing"
    assert not undone, f"acknowledged jobs put back by replayed job writes (token, jid, state, att, result): {undone}"
    assert final["status"] == {"total": N, "done": N, "complete": True}, final["status"]
