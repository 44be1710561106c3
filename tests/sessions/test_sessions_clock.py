"""Sessions driven by an injected server clock (embedded backend): expiry without sleeping.

These are unit tests of the reap/heartbeat logic; the same behaviours run in
real time against every backend in test_sessions.py and the chaos test.
"""

from __future__ import annotations

import logging
import re

import pytest

from aeroqueue import errors, keys, udfs
from aeroqueue.backends import open_backend
from aeroqueue.backends.embedded import ManualClock
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, check_timing, reap, sweep
from tests.conftest import mark_reaping

EXPIRY_S = 5.0


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def env(clock):
    backend = open_backend("embedded://:memory:", clock=clock)
    udfs.register(backend)
    JobLists(backend).load("L", [JobSpec(f"j{i}", {"i": i}) for i in range(10)], seal=True)
    return backend, Queue(backend)


def open_session(backend) -> Session:
    return Session.open(backend, interval_s=1.0, expiry_s=EXPIRY_S, heartbeat=False)


def test_expiry_must_exceed_twice_the_interval():
    check_timing(1.0, 2.5)
    with pytest.raises(errors.ConfigError, match="more than twice"):
        check_timing(1.0, 2.0)


@pytest.mark.parametrize("interval_s, expiry_s, says", [
    (float("nan"), 30.0, "heartbeat interval must be positive seconds"),
    (float("inf"), 30.0, "heartbeat interval must be positive seconds"),
    (0.0, 30.0, "heartbeat interval must be positive seconds"),
    (1.0, float("inf"), "session expiry must be seconds up to 315,360,000"),
    (1.0, 1e17, "session expiry must be seconds up to 315,360,000"),
    (1.0, float("nan"), "session expiry must be seconds up to"),
])
def test_timing_out_of_range_is_refused_before_the_store(tmp_path, interval_s, expiry_s, says):
    """An infinite, huge or NaN expiry never reaches the store (an integer past 64 bits
    is one the aerospike client mishandles; NaN raised ValueError from int())."""
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    with pytest.raises(errors.ConfigError, match=re.escape(says)):
        Session.open(backend, interval_s=interval_s, expiry_s=expiry_s, heartbeat=False)
    assert list(backend.scan(keys.SESS_SET)) == [], "no session was written"


def test_a_live_session_is_not_reaped(env, clock):
    backend, queue = env
    s = open_session(backend)
    queue.reserve("L", s, 3)
    for _ in range(10):  # heartbeats keep it alive however long it runs
        clock.advance(int(EXPIRY_S * 1000) - 1)
        assert s.beat()
        assert reap(backend).sessions == 0
    assert len(s.held()) == 3


def test_an_expired_session_is_reaped_and_its_jobs_come_back(env, clock):
    backend, queue = env
    dead = open_session(backend)
    held = queue.reserve("L", dead, 3)
    clock.advance(int(EXPIRY_S * 1000))
    report = reap(backend)
    assert (report.sessions, report.released) == (1, 3)
    assert backend.get(keys.SESS_SET, dead.id) is None
    # The dead session's heartbeat now finds it gone: it is lost and takes no work.
    assert dead.beat() is False and dead.lost
    with pytest.raises(errors.SessionLost):
        queue.reserve("L", dead)
    # Another session gets the same jobs first (retry store), with the attempt counted.
    alive = open_session(backend)
    again = queue.reserve("L", alive, 3)
    assert sorted(j.token for j in again) == sorted(j.token for j in held)
    assert all(j.attempt == 2 for j in again)
    # The dead session's acknowledgement is refused; the new one counts once.
    with pytest.raises(errors.ClaimLost):
        queue.complete(held[0], "late")
    queue.complete(again[0], "on time")
    assert backend.get(keys.JOB_SET, again[0].name).bins["result"] == "on time"


def test_heartbeat_after_expiry_but_before_reap_keeps_the_session(env, clock):
    backend, queue = env
    s = open_session(backend)
    queue.reserve("L", s, 2)
    clock.advance(int(EXPIRY_S * 1000) + 500)
    assert s.beat()  # late, but nobody reaped it yet: still alive
    assert reap(backend).sessions == 0
    assert len(s.held()) == 2


def test_a_half_done_reap_is_finished_by_the_next(env, clock):
    backend, queue = env
    s = open_session(backend)
    queue.reserve("L", s, 2)
    clock.advance(int(EXPIRY_S * 1000))
    # A reaper marked it reaping, then died before releasing anything.
    mark_reaping(backend, s.id)
    assert s.beat() is False, "a reaping session is lost to its owner"
    report = reap(backend)  # no further expiry needed: 'reaping' is picked up at once
    assert (report.sessions, report.released) == (1, 2)
    assert reap(backend).sessions == 0


def test_a_job_that_keeps_killing_its_worker_ends_dead(env, clock):
    backend, queue = env
    lists = JobLists(backend)
    lists.load("poison", [JobSpec("p", {})], max_attempts=2, seal=True)
    for _ in range(2):
        s = open_session(backend)
        assert [j.jid for j in queue.reserve("poison", s)] == ["p"]
        clock.advance(int(EXPIRY_S * 1000))
        reap(backend)
    st = lists.status("poison")
    assert (st.dead, st.reservable, st.complete) == (1, 0, True)


def test_graceful_close_gives_jobs_back_at_once_without_using_an_attempt(env, clock):
    backend, queue = env
    s = open_session(backend)
    held = queue.reserve("L", s, 4)
    assert s.close() == 4
    other = open_session(backend)
    again = queue.reserve("L", other, 4)
    assert sorted(j.token for j in again) == sorted(j.token for j in held)
    assert all(j.attempt == 1 for j in again), "a graceful release refunds the attempt"


def test_sweeper_finds_taken_but_never_claimed_and_orphaned_claims(env, clock, caplog):
    backend, queue = env
    # A reserver takes two tokens and dies before claiming them.
    took = backend.apply(keys.LIST_SET, "L", keys.LIST_MOD, "take", 2)
    assert took["n"] == 2
    # A session claims a job and vanishes without being reaped (its record deleted).
    s = open_session(backend)
    [orphan] = queue.reserve("L", s)
    backend.remove(keys.SESS_SET, s.id)
    with caplog.at_level(logging.INFO, logger="aeroqueue"):
        assert sweep(backend, grace_ms=60_000).requeued == 0, "inside the grace period nothing moves"
        assert not [r for r in caplog.records if getattr(r, "event", None) == "swept"], "a sweep that found nothing is quiet"
        clock.advance(61_000)
        report = sweep(backend, grace_ms=60_000)
    # The two never claimed are requeued; the orphan is released straight onto the retry store.
    assert (report.requeued, report.orphans) == (2, 1)
    # And said, for the operator who wonders why a job waited.
    [said] = [r for r in caplog.records if getattr(r, "event", None) == "swept"]
    assert (said.requeued, said.orphans) == (2, 1)  # type: ignore[attr-defined]
    other = open_session(backend)
    got = queue.reserve("L", other, 3)
    assert sorted(j.token for j in got) == sorted([took["start"], took["start"] + 1, orphan.token])
    assert sweep(backend, grace_ms=60_000).requeued == 0, "nothing left to sweep"


def test_sweeper_counts_an_ack_whose_bit_was_never_written(env, clock):
    """A worker killed between the complete UDF and the bitmap write."""
    backend, queue = env
    s = open_session(backend)
    jobs = queue.reserve("L", s, 10)
    for job in jobs[1:]:
        queue.complete(job)
    st = backend.apply(keys.JOB_SET, jobs[0].name, keys.JOB_MOD, "complete", s.id, {jobs[0].token: "x"})
    assert st == "ok"  # ...and the process dies before setting the bit
    lists = JobLists(backend)
    assert (lists.status("L").done, lists.status("L").complete) == (9, False)
    report = sweep(backend, grace_ms=60_000)  # no grace needed: a finished job is final
    assert report.recounted == 1
    assert (lists.status("L").done, lists.status("L").complete) == (10, True)
    assert sweep(backend).recounted == 0, "a complete list costs the sweeper nothing"
