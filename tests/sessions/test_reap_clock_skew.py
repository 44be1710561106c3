"""The reaper's one query of the claims index (`sessions.overdue_claims`) against a
store whose clock is ahead of this host's (embedded, with an injected server clock).
Claims and leases past their time limit are judged by the server's clock only
(design.md, "Hot keys and time"): a reaper on a host whose clock is behind must
still end them, not only once its own clock has caught up with the store's."""

from __future__ import annotations

import time

import pytest

from aeroqueue import keys, udfs
from aeroqueue.backends import open_backend
from aeroqueue.backends.embedded import ManualClock
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, reap

AHEAD_MS = 10 * 60_000  # the store's clock, ten minutes ahead of this host's


@pytest.fixture
def env():
    clock = ManualClock(time.time_ns() // 1_000_000 + AHEAD_MS)
    backend = open_backend("embedded://:memory:", clock=clock)
    udfs.register(backend)
    assert keys.CLAIMS_INDEX in backend.indexes()
    lists = JobLists(backend)
    lists.load("L", [JobSpec(f"j{i}", {}) for i in range(4)], timeout_s=1.0, backoff_s=0, max_attempts=5, seal=True)
    return backend, lists, Queue(backend), clock


@pytest.mark.parametrize("lease", [False, True], ids=["claim", "lease"])
def test_a_claim_past_its_limit_by_the_stores_clock_is_ended_whatever_this_hosts_clock(env, lease):
    backend, lists, queue, clock = env
    s = Session.open(backend, interval_s=1.0, expiry_s=30.0, heartbeat=False)
    held = queue.reserve("L", s, 2, lease=lease)
    assert len(held) == 2
    clock.advance(5_000)  # 5 s by the store's clock: each job 4 s past its 1 s limit
    assert s.beat()  # the session itself lives
    report = reap(backend)
    assert report.timed_out == 2, report
    for job in held:
        assert lists.find_job("L", job.jid)["state"] == "queued", job
