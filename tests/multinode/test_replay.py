"""A frozen node that resumes must not undo what the rest of the cluster acknowledged.

Found by the failover test (3 nodes, node 0 frozen; issue 20): jobs acknowledged
once came back claimed by the session that had completed them, ran again and
were acknowledged twice. The mechanism, on the server in ../shared/aerospike
(Community Edition 8.1, AP mode):

1. A client whose partition map still names a frozen node (SIGSTOP here; in life
   a paused VM or a long stall) sends it calls, which wait in its sockets. The
   other nodes drop it after the heartbeat timeout (1.5 s here), but clients
   learned that only 3 to 5 s after the freeze in these runs. Each call times out
   and is repeated, on the new master once the client knows it.
2. When the node resumes it runs the waiting calls on its own, stale, copy of
   the record, as the master it still believes it is, and sends the result to
   its replica, as every write does.
3. In CE a node accepts a replica write from any node (as_partition_check_source
   does nothing there) and keeps the newer of the two copies by last-update time
   (repl_write_conflict_resolution_policy), not by the namespace's
   conflict-resolution-policy (generation): the replayed write is the newest, so
   it replaces what the cluster wrote meanwhile, whatever its generation. An
   acknowledged write is lost; for aeroqueue, an acknowledged transition.

Here, list "bare" gets the replay with no deadline (as before job transitions had
one): a completion by session A, sent to the frozen node, undoes the completion by
B made and acknowledged on the live nodes. List "guarded" gets the same through
the UDF with the deadline (`Backend.job_deadline`: the client's timeout plus a
margin for clock skew, after which the UDF changes nothing), list "native" as the
native operation with the deadline in its filter (aeroqueue/hotpath.py): nothing
is undone. The "bare" list is the control: if nothing there was undone, nothing
was replayed, and the others prove nothing.

The same for the list record: a `take` sent to the frozen node, then takes made
on the live nodes; replayed, the take puts the list record back as the frozen
node had it, `head` included, and the token store hands out again what it handed
out (a leased job, whose record stays queued while it runs, then runs twice).
Takes with the deadline ("tg*" lists) roll nothing back; those without ("tb*",
the control) do.

The deadline covers calls older than the timeout plus the margin when the node
resumes; so the test resumes the node that long after the last call it got.
Calls sent to the frozen node were not replayed at all (in these runs) when it
resumed more than about 3 s after they were sent, so the test does not wait
longer than it needs to.
"""

from __future__ import annotations

import pytest

from tests.cluster import Cluster

from .conftest import aq
from .replaying import replay_round

LISTS = ("guarded", "native", "bare")
N = 30  # jobs per list: about a third have the frozen node as their master

pytestmark = pytest.mark.timeout(180)


def test_a_resumed_node_does_not_undo_an_acknowledged_completion(cluster3: Cluster, tmp_path) -> None:
    for name in LISTS:
        jobs = tmp_path / f"{name}.csv"
        jobs.write_text("id,n\n" + "".join(f"{name}{i},{i}\n" for i in range(N)))
        out = aq(cluster3, "load", name, str(jobs), "--seal")
        assert out.returncode == 0, out.stderr
    in_doubt, live, final = replay_round(cluster3, "replayer", str(N), prep="claim")
    moved, took = live["moved"], live["heads"]

    undone = {
        name: {t: final[name][str(t)] for t in moved[name] if final[name][str(t)][:3] != ["done", "B", "live"]}
        for name in LISTS
    }
    print(f"\nreplay: completions in doubt {[len(in_doubt[n]) for n in LISTS]}, completed again "
          f"elsewhere {[len(moved[n]) for n in LISTS]}, undone by the resumed node "
          f"{[len(undone[n]) for n in LISTS]} ({', '.join(LISTS)})")
    # The list record: a take sent to the frozen node, the live nodes' takes after it;
    # replayed, the take would put the record back as the frozen node had it, `head`
    # included, and the token store would hand out again what it handed out.
    heads = final["heads"]
    rolled_back = {kind: [name for name in in_doubt["takes"] if name.startswith(kind) and heads[name] < took[name]]
                   for kind in ("tg", "tb")}
    print(f"list records: takes in doubt {len(in_doubt['takes'])}, rolled back by the resumed node: "
          f"{len(rolled_back['tg'])} with a deadline, {len(rolled_back['tb'])} without")
    assert rolled_back["tb"], "the control: no replayed take without a deadline rolled a list record back"
    assert not rolled_back["tg"], f"list records rolled back despite the take's deadline: {rolled_back['tg']}"
    assert all(moved[n] for n in LISTS), f"no completion went to the frozen node: {in_doubt}"
    assert undone["bare"], "the control: no replay undid a completion without a deadline, so this run shows nothing"
    assert not undone["guarded"] and not undone["native"], (
        f"completions undone by replays despite their deadline (state, by, result, gen): {undone}"
    )
