"""The client half of tests/multinode/test_sess_replay.py, inside the cluster's namespace.

    python -m tests.multinode.sess_replayer URL LIVE_URL K

2K sessions: "g" ones get their heartbeat with its deadline (`transitions.sess_once`),
"b" ones without one, as before beats had one (the control). One command per line on
stdin, one JSON answer per line on stdout:

    prep    (all nodes up) open the sessions; load list "q" (2 TRIES jobs per session)
    stale   (node 0 frozen, dropped by the others) one heartbeat each, all at once. The
            sessions whose beat failed (in doubt: their master is the frozen node), by group
    live    through a new client seeded with LIVE_URL (the live nodes: it never sends to
            the frozen one), each of those sessions leases two jobs (their records stay
            queued while it runs). The sessions that did, by group
    read    the sessions of each group whose lease is gone from their record
"""

from __future__ import annotations

import json
import sys
from typing import Any

from aeroqueue import keys, transitions
from aeroqueue.backends import Backend, open_backend, retry_in_doubt
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session

from .stale import in_doubt, stale_backend

GROUPS = ("g", "b")
LIST = "q"
EXPIRY_S = 600.0  # no reaper runs here; nothing expires within the test
TRIES = 10  # reservations a session makes until one is a lease


def main(url: str, live_url: str, k: int) -> None:
    backend = stale_backend(url)
    ids: dict[str, list[str]] = {}
    doubted: dict[str, list[int]] = {}
    leased: dict[str, list[int]] = {}
    live: Backend | None = None
    out: Any
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "prep":
            ids = {g: [Session.open(backend, heartbeat=False, expiry_s=EXPIRY_S).id for _ in range(k)] for g in GROUPS}
            JobLists(backend).load(LIST, [JobSpec(f"j{i}", i) for i in range(2 * k * TRIES * 2)], seal=True)
            out = "ok"
        elif cmd == "stale":
            def once(group: str, i: int, ids: dict[str, list[str]] = ids) -> None:
                if group == "g":
                    assert transitions.sess_once(backend, ids[group][i], "beat", None) == "ok"
                else:
                    assert backend.apply(keys.SESS_SET, ids[group][i], keys.SESS_MOD, "beat", None) == "ok"

            doubted = in_doubt(once, GROUPS, k)
            out = doubted
        elif cmd == "live":
            live = open_backend(live_url)
            queue = Queue(live)
            leased = {g: [] for g in GROUPS}
            claims = 0
            for g in GROUPS:
                for i in doubted[g]:
                    session = Session(live, ids[g][i], interval_s=EXPIRY_S / 3, expiry_s=EXPIRY_S)
                    # A lease not recorded in its window (the cluster still settling after
                    # the node left) is taken as a claim instead: then again, on the next job.
                    for _ in range(TRIES):
                        # Two: one job is always claimed (`Queue.reserve`).
                        got = retry_in_doubt(lambda s=session, q=queue: q.reserve(LIST, s, 2, lease=True), deadline_s=30)
                        assert len(got) == 2, got
                        if got[0].lease is not None:
                            leased[g].append(i)
                            break
                        claims += 1
            print(f"leases taken as claims: {claims}", file=sys.stderr)
            out = leased
        elif cmd == "read":
            assert live is not None
            out = {}
            for g in GROUPS:
                gone = []
                for i in leased[g]:
                    rec = retry_in_doubt(lambda s=ids[g][i], live=live: live.get(keys.SESS_SET, s), deadline_s=30)
                    if rec is None or not rec.bins.get("leases"):
                        gone.append(i)
                out[g] = gone
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
