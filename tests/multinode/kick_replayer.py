"""The client half of tests/multinode/test_kick_replay.py, inside the cluster's namespace.

    python -m tests.multinode.kick_replayer URL LIVE_URL N

Four lists of N jobs: "kg", "kb" (to be kicked), "bg", "bb" (to be buried); "*g" get
the operator's call with its deadline (`Backend.job_deadline`), "*b" without one, as
before the kick and bury had one (the control). One command per line on stdin, one
JSON answer per line on stdout:

    prep    (all nodes up) load the lists; bury every job of "kg" and "kb"
    stale   (node 0 frozen, dropped by the others) one attempt each, all at once: kick
            every job of "k*", bury every job of "b*". The tokens whose call failed (in
            doubt: their master is the frozen node), by list
    live    through a new client seeded with LIVE_URL (the live nodes: it never sends
            to the frozen one), for each of those jobs the call did not reach: the
            operator does it again (a bury, then a kick: the job runs again), then
            session B claims and completes it, result 'live'. Those, by list
    read    every job's (state, completed by B, result, att), by list
"""

from __future__ import annotations

import json
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aeroqueue import keys, transitions
from aeroqueue.backends import Backend, open_backend, retry_in_doubt
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.sessions import Session

from .stale import in_doubt, stale_backend

LISTS = ("kg", "kb", "bg", "bb")


def redo(live: Backend, b_id: str, name: str, t: int) -> bool:
    """The operator's call again, on the live nodes, where it did not land; then the
    job runs and completes under session B. False: the call had landed."""
    job = keys.job_name(name, t)
    rec = retry_in_doubt(lambda: live.get(keys.JOB_SET, job), deadline_s=30)
    if rec is None or rec.bins["state"] != ("dead" if name.startswith("k") else "queued"):
        return False  # it landed (its master lives; the frozen node held its replica)
    if name.startswith("b"):
        assert transitions.bury(live, name, t, "an operator") == "dead"
    assert transitions.kick(live, name, [t]) == 1
    rid = uuid.uuid4().hex
    got = transitions.job_udf(live, job, "claim", b_id, rid, 300_000, deadline_s=30)
    assert got["st"] == "ok", got
    st = transitions.job_udf(live, job, "complete", b_id, {t: "live"}, rid, deadline_s=30)
    assert st == "ok", st
    return True


def main(url: str, live_url: str, n: int) -> None:
    # Learns the partition map once (no tending for an hour): its calls go to the
    # frozen node, as those of a client that has not learnt yet that it is gone.
    backend = stale_backend(url)
    doubted: dict[str, list[int]] = {}
    live: Backend | None = None
    b_id = ""
    out: Any
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "prep":
            for name in LISTS:
                JobLists(backend).load(name, [JobSpec(f"{name}-{i}", i) for i in range(n)], seal=True)
                if name.startswith("k"):
                    for t in range(n):
                        assert transitions.bury(backend, name, t, "an operator") == "dead"
            out = "ok"
        elif cmd == "stale":
            def once(name: str, t: int) -> None:
                deadline = backend.job_deadline() if name.endswith("g") else None
                args = () if name.startswith("k") else ("an operator",)
                backend.apply(keys.JOB_SET, keys.job_name(name, t), keys.JOB_MOD,
                              "kick" if name.startswith("k") else "bury", *args, deadline)

            doubted = in_doubt(once, LISTS, n)
            out = doubted
        elif cmd == "live":
            live = open_backend(live_url)
            b = Session.open(live, heartbeat=False, interval_s=10, expiry_s=600)
            b_id = b.id
            calls = [(live, b_id, name, t) for name in LISTS for t in doubted[name]]
            with ThreadPoolExecutor(16) as pool:
                redone = list(pool.map(lambda c: redo(*c), calls))
            out = {name: [t for (_, _, nm, t), ok in zip(calls, redone, strict=True) if nm == name and ok] for name in LISTS}
        elif cmd == "read":
            assert live is not None
            out = {}
            for name in LISTS:
                out[name] = {}
                for t in range(n):
                    rec = retry_in_doubt(lambda name=name, t=t, live=live: live.get(keys.JOB_SET, keys.job_name(name, t)),
                                         deadline_s=30)
                    by = "B" if rec.bins.get("by") == b_id else rec.bins.get("by")
                    out[name][t] = [rec.bins["state"], by, rec.bins.get("result"), rec.bins.get("att")]
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
