"""The client half of tests/multinode/test_replay.py, inside the cluster's namespace.

    python -m tests.multinode.replayer URL LIVE_URL N

Three lists of N jobs, "guarded", "native" and "bare", loaded by the test. One command per
line on stdin, one JSON answer per line on stdout:

    claim   (all nodes up) claim every job of both lists under session A; load the
            take lists (TAKE_LISTS: 4 jobs each, none taken)
    stale   (node 0 frozen, dropped by the others) one attempt each, all at once:
            complete every job under A, result 'stale';
            "guarded" through the UDF with its deadline (`Backend.job_deadline`),
            "native" as the native operation (hotpath) with its deadline, "bare"
            through the UDF without one, as before deadlines existed. The tokens whose call failed (in doubt: their
            master is the frozen node), by list. Also one `take` of 1 on each take list,
            "tg*" with its deadline, "tb*" without: under "takes", the lists whose take failed
    live    through a new client seeded with LIVE_URL (the live nodes: it never sends
            to the frozen one), for each of those jobs still claimed by A: release it
            (A gave up), claim it under B, complete it under B, result 'live'; on each
            take list whose take failed, take 2 (its head, as the live nodes left it)
    read    every job's (state, completed by A or B, result, generation), by list;
            under "heads", each take list's head
"""

from __future__ import annotations

import json
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aeroqueue import hotpath, keys, transitions
from aeroqueue.backends import Backend, open_backend, retry_in_doubt
from aeroqueue.errors import AeroqueueError
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import Session

from .stale import stale_backend

LISTS = ("guarded", "native", "bare")
# One list record each, a third of them with the frozen node as their master.
TAKE_LISTS = [f"tg{i}" for i in range(15)] + [f"tb{i}" for i in range(15)]


def main(url: str, live_url: str, n: int) -> None:
    # This client learns the partition map once, when it connects, and never again
    # (no tending for an hour): its calls go to the frozen node whenever the test
    # sends them, as those of a client that has not learnt yet that the node is gone
    # (3 to 5 s after the freeze in the failover runs; sooner or later by chance).
    backend = stale_backend(url)
    a = Session.open(backend, heartbeat=False, interval_s=10, expiry_s=600)
    jobs: dict[str, dict[int, Job]] = {name: {} for name in LISTS}
    in_doubt: dict[str, list[int]] = {}
    live: Backend | None = None
    b_id = ""
    out: Any
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "claim":
            queue = Queue(backend, busy_deadline_s=30)
            for name in LISTS:
                while len(jobs[name]) < n:
                    jobs[name].update((job.token, job) for job in queue.reserve(name, a, n - len(jobs[name])))
            for name in TAKE_LISTS:
                JobLists(backend).load(name, [JobSpec(f"{name}-{i}", i) for i in range(4)], seal=True)
            out = "ok"
        elif cmd == "stale":
            def complete(job: Job) -> bool:
                try:
                    if job.list == "native":
                        hotpath.complete(backend, job.name, a.id, job.rid, "stale", backend.job_deadline())
                        return True
                    deadline = backend.job_deadline() if job.list == "guarded" else None
                    backend.apply(keys.JOB_SET, job.name, keys.JOB_MOD, "complete", a.id, {job.token: "stale"}, job.rid,
                                  deadline)
                    return True
                except AeroqueueError:
                    return False

            def take(name: str) -> bool:
                try:
                    deadline = backend.job_deadline() if name.startswith("tg") else None
                    backend.apply(keys.LIST_SET, name, keys.LIST_MOD, "take", 1, deadline)
                    return True
                except AeroqueueError:
                    return False

            every = [job for name in LISTS for job in jobs[name].values()]
            with ThreadPoolExecutor(len(every) + len(TAKE_LISTS)) as pool:
                took = pool.map(take, TAKE_LISTS)
                landed = list(pool.map(complete, every))
                took_ok = list(took)
            in_doubt = {name: [] for name in LISTS}
            for job, ok in zip(every, landed, strict=True):
                if not ok:
                    in_doubt[job.list].append(job.token)
            takes = [name for name, ok in zip(TAKE_LISTS, took_ok, strict=True) if not ok]
            out = {**in_doubt, "takes": takes}
        elif cmd == "live":
            live = open_backend(live_url)
            queue = Queue(live, busy_deadline_s=30)
            b = Session.open(live, heartbeat=False, interval_s=10, expiry_s=600)
            moved: dict[str, list[int]] = {name: [] for name in LISTS}
            for name in LISTS:
                for token in in_doubt[name]:
                    job = jobs[name][token]
                    rec = retry_in_doubt(lambda job=job, live=live: live.get(keys.JOB_SET, job.name), deadline_s=30)
                    if rec is None or rec.bins.get("state") != "claimed" or rec.bins.get("sess") != a.id:
                        continue  # its complete landed (its master lives; the frozen node held its replica)
                    assert queue.release(job, "gave up", refund=False) == "released"
                    rid = uuid.uuid4().hex
                    got = transitions.job_udf(live, job.name, "claim", b.id, rid, 300_000, deadline_s=30)
                    assert got["st"] == "ok", got
                    st = transitions.job_udf(live, job.name, "complete", b.id, {token: "live"}, rid, deadline_s=30)
                    assert st == "ok", st
                    moved[name].append(token)
            b_id = b.id
            heads = {}
            for name in takes:
                got = retry_in_doubt(lambda name=name, live=live: live.apply(
                    keys.LIST_SET, name, keys.LIST_MOD, "take", 2, live.job_deadline()), deadline_s=30)
                assert got["st"] == "ok", got
                heads[name] = got["start"] + got["n"]
            out = {"moved": moved, "heads": heads}
        elif cmd == "read":
            assert live is not None
            out = {}
            for name in LISTS:
                out[name] = {}
                for token, job in jobs[name].items():
                    rec = retry_in_doubt(lambda job=job, live=live: live.get(keys.JOB_SET, job.name), deadline_s=30)
                    by = {a.id: "A", b_id: "B"}.get(rec.bins.get("by"), rec.bins.get("by"))
                    out[name][token] = [rec.bins["state"], by, rec.bins.get("result"), rec.gen]
            out["heads"] = {name: retry_in_doubt(lambda name=name, live=live: live.get(keys.LIST_SET, name),
                                                 deadline_s=30).bins["head"] for name in TAKE_LISTS}
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
