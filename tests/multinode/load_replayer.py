"""The client half of tests/multinode/test_load_replay.py, inside the cluster's namespace.

    python -m tests.multinode.load_replayer URL LIVE_URL N

Prints "ready" once its stale client is connected (all nodes up), then answers one
command per line on stdin with one JSON line on stdout:

    load    (node 0 frozen, dropped by the others) load N jobs, sealed, into list
            "lr" through a client whose first batch write (the load's job records,
            as `_write_range` builds them) goes through the stale client, which
            sends the jobs mastered by the frozen node there, where they wait; the
            load then repeats them through the live client, as a client that has
            caught up does. The control: one create-only write without a deadline
            per job, to a side set, in that same first batch, then made and changed
            on the live nodes. Answers the list, the load's report and the seconds
            since that first batch was sent
    work    through the live client: reserve every job, complete it
    read    every job record's (token, jid, state, att, result), the control
            records' values, the list's status
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import aerospike
from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.operations import operations as op

from aeroqueue import keys
from aeroqueue.backends import Backend, open_backend, retry_in_doubt
from aeroqueue.config import parse_url
from aeroqueue.lists import JobLists
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session

from .stale import stale_client

CONTROL_SET = "aq_replay_ctl"


class _Learning:
    """A client whose first batch write goes through `stale` (the partition map of
    before the freeze) with the control's writes (`extra`) added, so that both take the
    same way at the same moment; every other call goes through `live`."""

    def __init__(self, stale: Any, live: Any, extra: list[Write]) -> None:
        self.stale, self.live, self.extra = stale, live, extra
        self.sent_at: float | None = None
        self.codes: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.live, name)

    def batch_write(self, batch: BatchRecords, *args: Any, **kw: Any) -> BatchRecords:
        if self.sent_at is not None:
            return self.live.batch_write(batch, *args, **kw)
        ours = batch.batch_records
        assert ours[0].key[1] == keys.JOB_SET, f"the load's first batch write is not its job records: {ours[0].key}"
        self.sent_at = time.monotonic()
        got = self.stale.batch_write(BatchRecords(ours + self.extra), *args, **kw)
        self.codes = [br.result for br in got.batch_records]
        return BatchRecords(got.batch_records[:len(ours)])


def main(url: str, live_url: str, n: int) -> None:
    # As a client that has not learnt yet that node 0 is gone: it learns the map once,
    # here, before the freeze, and never tends again (an hour).
    stale = stale_client(url)
    print(json.dumps("ready"), flush=True)
    live: Backend | None = None
    name = "lr"
    control = [f"{name}-c{i}" for i in range(n)]
    for line in sys.stdin:
        cmd = line.strip()
        out: Any
        if cmd == "load":
            # Seeded with the live nodes only, after the freeze: its map never names the frozen node.
            live = open_backend(live_url)
            writes = [Write((live.namespace, CONTROL_SET, key), [op.write("v", "first")],
                            policy={"exists": aerospike.POLICY_EXISTS_CREATE, "key": aerospike.POLICY_KEY_SEND})
                      for key in control]
            learning = _Learning(stale, live.client.raw, writes)
            report = JobLists(Backend(learning, parse_url(url))).load(
                name, [(f"{name}-j{i}", {"i": i}) for i in range(n)], seal=True, workers=1)
            assert learning.sent_at is not None
            codes = learning.codes
            for key in control:
                retry_in_doubt(lambda key=key, live=live: live.put(CONTROL_SET, key, {"v": "live"}), deadline_s=30)
            out = {"list": name, "report": [report.loaded, report.skipped, report.voided],
                   "in_doubt": [sum(1 for c in codes[:n] if c != 0), sum(1 for c in codes[n:] if c != 0)],
                   "since_sent_s": time.monotonic() - learning.sent_at}
        elif cmd == "work":
            assert live is not None
            queue = Queue(live, busy_deadline_s=30)
            sess = Session.open(live, heartbeat=False, interval_s=10, expiry_s=600)
            done = []
            while jobs := queue.reserve(name, sess, 100):
                for job in jobs:
                    queue.complete(job, "ok")
                    done.append(job.jid)
            out = {"done": done}
        elif cmd == "read":
            assert live is not None
            head = retry_in_doubt(lambda live=live: live.get(keys.LIST_SET, name), deadline_s=30).bins
            jobs = []
            for t in range(head["alloc"]):
                rec = retry_in_doubt(lambda t=t, live=live: live.get(keys.JOB_SET, keys.job_name(name, t)), deadline_s=30)
                b = rec.bins if rec is not None else {}
                jobs.append([t, b.get("jid"), b.get("state"), b.get("att"), b.get("result")])
            marks = {key: retry_in_doubt(lambda key=key, live=live: live.get(CONTROL_SET, key), deadline_s=30).bins.get("v")
                     for key in control}
            st = JobLists(live).status(name)
            out = {"jobs": jobs, "control": marks,
                   "status": {"total": st.total, "done": st.done, "complete": st.complete}}
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
