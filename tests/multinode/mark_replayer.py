"""The client half of tests/multinode/test_mark_replay.py, inside the cluster's namespace.

    python -m tests.multinode.mark_replayer URL LIVE_URL N

Two lists of N jobs, "mguard" and "mbare". One command per line on stdin, one JSON
answer per line on stdout:

    dead    (all nodes up) load both lists (one attempt a job), claim every job under
            session A and fail it: dead, as a sync then reads it
    stale   (node 0 frozen, dropped by the others) the sync's exact marks
            (`aeroqueue.sync.mark.mark`, with its retries), one job a call, all at
            once: "mguard" with the deadline, "mbare" without one (the control: as
            marks were sent before). The tokens whose mark failed (in doubt), by list
    live    through a new client seeded with LIVE_URL (never the frozen node): each
            of those jobs kicked by an operator, claimed under B and completed, result 'live'
    read    every job's (state, failed or completed by A or B, result), by list
"""

from __future__ import annotations

import json
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aeroqueue import keys, transitions
from aeroqueue.backends import Backend, open_backend, retry_in_doubt
from aeroqueue.config import parse_url
from aeroqueue.errors import AeroqueueError
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import Session
from aeroqueue.sync.mark import mark

from .stale import stale_backend

LISTS = ("mguard", "mbare")
MARK = "sync_t_replay"


def main(url: str, live_url: str, n: int) -> None:
    # As tests/multinode/replayer.py: this client never learns that the node froze.
    backend = stale_backend(url)
    # The control: the same client, its marks without a deadline.
    bare = Backend(backend.client, parse_url(url))
    bare.job_deadline = lambda: None  # type: ignore[method-assign]
    a = Session.open(backend, heartbeat=False, interval_s=10, expiry_s=600)
    jobs: dict[str, dict[int, Job]] = {name: {} for name in LISTS}
    versions: dict[str, int] = {}
    in_doubt: dict[str, list[int]] = {}
    live: Backend | None = None
    b_id = ""
    out: Any
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "dead":
            queue = Queue(backend, busy_deadline_s=30)
            for name in LISTS:
                JobLists(backend).load(name, [JobSpec(f"{name}{i}", i) for i in range(n)], max_attempts=1, seal=True)
                while len(jobs[name]) < n:
                    jobs[name].update((job.token, job) for job in queue.reserve(name, a, n - len(jobs[name])))
                for job in jobs[name].values():
                    queue.fail(job, "first")
                    versions[job.name] = backend.get(keys.JOB_SET, job.name).bins["done_at"]  # type: ignore[union-attr]
            out = "ok"
        elif cmd == "stale":
            def marked(job: Job) -> bool:
                try:
                    mark(backend if job.list == "mguard" else bare, MARK, [job.name], [versions[job.name]])
                    return True
                except AeroqueueError:
                    return False

            every = [job for name in LISTS for job in jobs[name].values()]
            with ThreadPoolExecutor(len(every)) as pool:
                landed = list(pool.map(marked, every))
            in_doubt = {name: [] for name in LISTS}
            for job, ok in zip(every, landed, strict=True):
                if not ok:
                    in_doubt[job.list].append(job.token)
            out = in_doubt
        elif cmd == "live":
            live = open_backend(live_url)
            b = Session.open(live, heartbeat=False, interval_s=10, expiry_s=600)
            moved: dict[str, list[int]] = {name: [] for name in LISTS}
            for name in LISTS:
                for token in in_doubt[name]:
                    job = jobs[name][token]
                    assert retry_in_doubt(lambda name=name, token=token, live=live: JobLists(live).kick(name, [token]),
                                          deadline_s=30) == 1
                    rid = uuid.uuid4().hex
                    got = transitions.job_udf(live, job.name, "claim", b.id, rid, 300_000, deadline_s=30)
                    assert got["st"] == "ok", got
                    st = transitions.job_udf(live, job.name, "complete", b.id, {token: "live"}, rid, deadline_s=30)
                    assert st == "ok", st
                    moved[name].append(token)
            b_id = b.id
            out = {"moved": moved}
        elif cmd == "read":
            assert live is not None
            out = {}
            for name in LISTS:
                out[name] = {}
                for token, job in jobs[name].items():
                    rec = retry_in_doubt(lambda job=job, live=live: live.get(keys.JOB_SET, job.name), deadline_s=30)
                    by = {a.id: "A", b_id: "B"}.get(rec.bins.get("by"), rec.bins.get("by"))
                    out[name][token] = [rec.bins["state"], by, rec.bins.get("result")]
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
