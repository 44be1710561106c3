"""The job lifecycle (issue 15): time limits, backoff, snooze, delayed jobs, one-job
operations. Every test runs on both backends (the store fixtures)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from aeroqueue import errors, keys, sessions, transitions
from aeroqueue.backends import base
from aeroqueue.cli import main
from aeroqueue.loading import JobSpec
from aeroqueue.sessions import reap, sweep
from aeroqueue.transitions import backoff_ms
from tests.lists.test_drop import leftovers
from tests.waiting import wait_for


def specs(n: int, start: int = 0, run_at: float | None = None) -> list[JobSpec]:
    return [JobSpec(f"job-{i}", {"n": i}, None, run_at) for i in range(start, start + n)]


@pytest.fixture
def cli(store_url):
    def run(*args: str, code: int = 0) -> str:
        out = CliRunner().invoke(main, ["--url", store_url, *args])
        assert out.exit_code == code, (out.exit_code, out.output)
        return out.output

    return run


# -- time limits -------------------------------------------------------------------


def test_a_claim_past_its_limit_is_ended_by_the_reaper_while_its_session_lives(queue, lists, list_name, session):
    # 2.5 s: a reap scans the server's session set, which takes up to a second on a
    # loaded machine, and must not outlast the limit here.
    lists.load(list_name, specs(2), timeout_s=2.5, backoff_s=0)
    a, b = queue.reserve(list_name, session, 2)
    assert a.timeout_s == 2.5
    queue.complete(b, "in time")
    reap(queue.backend)
    assert lists.find_job(list_name, "job-0")["state"] == "claimed"  # not yet past the limit
    time.sleep(2.8)
    assert not session.lost  # heartbeats go on: only the limit ends the claim
    # (>=: a shared server may hold other tests' overdue claims too)
    assert reap(queue.backend).timed_out >= 1
    job = lists.find_job(list_name, "job-0")
    assert job["state"] == "queued" and job["att"] == 1
    assert "timed out" in job["err"] and "2.5 s" in job["err"]
    with pytest.raises(errors.ClaimLost):  # the late result is refused
        queue.complete(a, "too late")
    again = queue.reserve(list_name, session, 1)
    assert [j.jid for j in again] == ["job-0"] and again[0].attempt == 2


def test_a_late_ack_is_refused_even_before_the_reaper_runs(queue, lists, list_name, session):
    lists.load(list_name, specs(1), timeout_s=0.3, backoff_s=0)
    (a,) = queue.reserve(list_name, session, 1)
    time.sleep(0.5)
    with pytest.raises(errors.ClaimLost, match="time limit"):
        queue.complete(a, "late")
    with pytest.raises(errors.ClaimLost, match="time limit"):
        queue.fail(a, "late failure")
    assert lists.find_job(list_name, "job-0")["state"] == "claimed"  # the reaper ends it, as timed out
    assert queue.expire(a) == "retry"


def test_an_ack_of_an_older_claim_of_the_same_session_is_refused(queue, lists, list_name, session):
    # The session's first claim timed out, the job came back, and the same session
    # claimed it again: the first handler's late result must not complete the job
    # (the handler would count as run once, and the second run would be refused).
    lists.load(list_name, specs(1), timeout_s=0.3, backoff_s=0)
    (old,) = queue.reserve(list_name, session, 1)
    time.sleep(0.5)
    assert reap(queue.backend).timed_out >= 1
    (new,) = queue.reserve(list_name, session, 1)
    assert (new.jid, new.session, new.attempt) == (old.jid, old.session, 2) and new.rid != old.rid
    new.touch(30)  # the checks below must not outlast the new claim's 0.3 s on a loaded machine
    for ack in (lambda: queue.complete(old, "stale"), lambda: queue.fail(old, "stale"), old.touch,
                lambda: queue.snooze(old, 1)):
        with pytest.raises(errors.ClaimLost):
            ack()
    assert queue.complete_many([old], ["stale"]) == [old]
    assert queue.release(old, "stale") == "not held"
    queue.complete(new, "fresh")
    queue.complete(new, "fresh")  # a repeat of the same claim's ack is harmless
    with pytest.raises(errors.ClaimLost):  # ...but not the older claim's
        queue.complete(old, "stale")
    assert lists.find_job(list_name, "job-0")["result"] == "fresh"


def test_touch_extends_the_limit(queue, lists, list_name, session):
    # Limits of seconds, not tenths: the reap below may take a second on a loaded machine.
    lists.load(list_name, specs(1), timeout_s=2.0, backoff_s=0)
    (a,) = queue.reserve(list_name, session, 1)
    for _ in range(4):  # 2.6 s in all, past the limit
        time.sleep(0.65)
        a.touch()
    reap(queue.backend)
    queue.complete(a, "touched")
    assert lists.find_job(list_name, "job-0")["state"] == "done"
    time.sleep(0.1)
    with pytest.raises(errors.ClaimLost):  # done: no claim to touch
        a.touch()


def test_a_touch_tells_its_listeners_the_time_left_from_when_it_was_sent(queue, lists, list_name, session, monkeypatch):
    """The worker's watchdog and its acks' deadlines follow touches (`Queue.on_touch`):
    told the seconds granted once the answer came back, they counted the new limit from
    the answer, after the server's, by the touch's round trip."""
    lists.load(list_name, specs(1), timeout_s=30)
    (a,) = queue.reserve(list_name, session, 1)
    heard: list[float] = []
    queue.on_touch(lambda job, left: heard.append(left))
    udf = queue.backend.udf

    def slow_udf(*args, **kw):
        out = udf(*args, **kw)
        time.sleep(0.3)  # the answer on its way back
        return out

    monkeypatch.setattr(queue.backend, "udf", slow_udf)
    assert queue.touch(a, 10.0) == 10.0
    assert len(heard) == 1 and heard[0] <= 10.0 - 0.3, heard


def test_expire_is_refused_before_the_limit(queue, lists, list_name, session):
    lists.load(list_name, specs(1), timeout_s=30)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.expire(a) == "early"
    queue.complete(a)


def test_tune_changes_the_limit_of_later_claims(queue, lists, list_name, session):
    lists.load(list_name, specs(2))
    assert lists.status(list_name).timeout_s == 300
    lists.tune(list_name, timeout_s=7, backoff_s=0.5, backoff_max_s=4)
    st = lists.status(list_name)
    assert (st.timeout_s, st.backoff_s, st.backoff_max_s) == (7, 0.5, 4)
    assert queue.reserve(list_name, session, 1)[0].timeout_s == 7
    with pytest.raises(errors.ConfigError, match="cap"):
        lists.tune(list_name, backoff_max_s=0.1)
    with pytest.raises(errors.ConfigError, match="positive"):
        lists.tune(list_name, timeout_s=0)


# -- backoff and snooze --------------------------------------------------------------


def test_backoff_bounds():
    for attempt in range(1, 12):
        full = min(3_600_000, 1000 * 2 ** (attempt - 1))
        for _ in range(50):
            assert full / 2 <= backoff_ms(attempt, 1000, 3_600_000) <= full
    assert backoff_ms(30, 1000, 5000) <= 5000
    assert backoff_ms(3, 0, 5000) == 0


def test_a_failed_job_is_not_reservable_before_its_backoff(queue, lists, list_name, session):
    lists.load(list_name, specs(1), backoff_s=0.8, backoff_max_s=60, max_attempts=3)
    (a,) = queue.reserve(list_name, session, 1)
    failed_at = time.monotonic()
    assert queue.fail(a, "downstream is down") == "delayed"
    st = lists.status(list_name)
    assert (st.delayed, st.reservable, st.in_flight) == (1, 0, 0)
    got = []
    while not got:
        got = queue.reserve(list_name, session, 1)
        if not got:
            time.sleep(0.02)
        assert time.monotonic() - failed_at < 5
    waited = time.monotonic() - failed_at
    assert waited >= 0.4 - 0.05  # at least half of base * 2^0, by the server's clock
    (b,) = got
    assert b.attempt == 2
    assert queue.fail(b, "still down") == "delayed"  # attempt 2: 0.8..1.6 s
    job = lists.find_job(list_name, "job-0")
    assert job["state"] == "delayed" and [e["err"] for e in job["errs"]] == ["downstream is down", "still down"]
    assert queue.reserve(list_name, session, 1) == []


def test_the_last_attempt_goes_dead_without_backoff(queue, lists, list_name, session):
    lists.load(list_name, specs(1), backoff_s=5, max_attempts=1)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.fail(a, "boom") == "dead"
    assert lists.status(list_name).dead == 1


def test_snooze_gives_the_attempt_back(queue, lists, list_name, session):
    lists.load(list_name, specs(1), max_attempts=1)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.snooze(a, 0.4) == "delayed"
    assert queue.reserve(list_name, session, 1) == []
    job = lists.find_job(list_name, "job-0")
    assert job["state"] == "delayed" and job["att"] == 0 and not job.get("errs")
    (b,) = wait_for("the snoozed job due", lambda: queue.reserve(list_name, session, 1), 5)
    assert b.attempt == 1  # max_attempts 1, and still not dead: a snooze is no failure
    queue.complete(b)


def test_a_snooze_after_a_fail_is_refused_and_a_repeated_snooze_is_recognised(queue, lists, list_name, session):
    """A fail with a backoff leaves the job delayed, by the same session, under the same
    request id, as a snooze does: the snooze's check for its own repeat (an answer lost)
    took a snooze after a fail for one, answered 'delayed' and scheduled the job again."""
    lists.load(list_name, specs(2), backoff_s=60, seal=True)
    a, b = queue.reserve(list_name, session, 2)
    assert queue.fail(a, "boom") == "delayed"
    with pytest.raises(errors.ClaimLost):
        queue.snooze(a, 5)
    assert lists.status(list_name).delayed == 1, "scheduled once"
    assert queue.snooze(b, 5) == "delayed"
    again = queue.backend.udf(keys.JOB_SET, b.name, keys.JOB_MOD, "snooze", session.id, 5000, b.rid, None)
    assert again == "delayed", "the same snooze repeated: recognised, and the caller redoes its follow-up"
    assert lists.find_job(list_name, "job-1")["att"] == 0


def each_count(lists, name):
    st = lists.status(name)
    return {"reservable": st.reservable, "delayed": st.delayed, "in_flight": st.in_flight,
            "retry_pending": st.retry_pending, "done": st.done, "dead": st.dead}


def test_kicked_and_buried_jobs_are_counted_once(queue, lists, list_name, session):
    """A kick puts a job on the retry store and leaves it where it waited (the schedule,
    or ahead in the token store); a bury leaves it there too, dead. Each job is still
    counted in one place, and the counts add up to the total."""
    lists.load(list_name, specs(6), backoff_s=600, seal=True)
    a, b, c = queue.reserve(list_name, session, 3)
    assert queue.fail(a, "x") == "delayed" and queue.fail(b, "y") == "delayed"
    assert each_count(lists, list_name) == {"reservable": 3, "delayed": 2, "in_flight": 1, "retry_pending": 0, "done": 0, "dead": 0}
    assert lists.kick_job(list_name, "job-0")  # scheduled, and now on the retry store too
    assert lists.bury(list_name, "job-1") == "dead"  # scheduled, and dead
    assert lists.bury(list_name, "job-5") == "dead"  # ahead in the token store, and dead
    assert lists.kick_job(list_name, "job-5")  # ... and now on the retry store too
    assert lists.bury(list_name, "job-4") == "dead"  # ahead in the token store, and dead
    assert each_count(lists, list_name) == {"reservable": 1, "delayed": 0, "in_flight": 1, "retry_pending": 2, "done": 0, "dead": 2}
    got = queue.reserve(list_name, session, 6)
    assert sorted(j.jid for j in got) == ["job-0", "job-3", "job-5"]
    # The kicked job left the schedule: claimed, it is in flight, not delayed.
    assert each_count(lists, list_name) == {"reservable": 0, "delayed": 0, "in_flight": 4, "retry_pending": 0, "done": 0, "dead": 2}
    queue.complete_many([c, *got])
    assert each_count(lists, list_name) == {"reservable": 0, "delayed": 0, "in_flight": 0, "retry_pending": 0, "done": 4, "dead": 2}
    assert lists.status(list_name).complete


def test_a_fail_repeated_after_its_job_went_dead_and_was_kicked_is_no_repeat(queue, lists, list_name, session):
    """A holder's fail lands (the job goes dead) and its answer is lost; an operator
    kicks the job; the fail is sent again. It was taken for its own repeat ('retry',
    from the job now queued) and the holder pushed the job onto the retry store a
    second time. A kick ends what an earlier call may repeat: it answers 'lost'."""
    lists.load(list_name, specs(1), max_attempts=1, seal=True)
    [job] = queue.reserve(list_name, session, 1)
    send = functools.partial(transitions.fail, queue.backend, list_name, job.token, session.id, "boom", rid=job.rid,
                             holder=True, created=job.created)
    assert send() == "dead"  # its answer lost, as the holder sees it
    assert lists.kick(list_name) == 1
    assert lists.status(list_name).retry_pending == 1
    assert send() == "lost"
    assert lists.status(list_name).retry_pending == 1, "offered once"
    [again] = queue.reserve(list_name, session, 2)
    queue.complete(again)
    assert lists.status(list_name).complete


def test_a_reapers_offer_paused_across_a_death_and_a_kick_offers_nothing(registered, lists, list_name):
    """A reaper releases a job and stops before its offer mark; the job is claimed
    again, released dead by another reaper, and kicked (onto the retry store). The
    first reaper's mark, once it resumes, is no longer its own: the job is not offered
    a second time. (A kick that cleared the call id let it: no id reads as a record
    written before ids were.)"""
    lists.load(list_name, specs(1), max_attempts=1, seal=True)
    name = keys.job_name(list_name, 0)
    udf = functools.partial(transitions.job_udf, registered, name)
    assert udf("claim", "A", "rid-a", 60_000)["st"] == "ok"
    assert udf("release", "A", 1, "session expired", "", tx="T1") == "released"  # refunded; its mark waits
    assert udf("claim", "B", "rid-b", 60_000)["st"] == "ok"
    assert udf("release", "B", 0, "session expired", "", tx="T2") == "dead"
    assert lists.kick(list_name) == 1
    assert sessions._offer(registered, list_name, [0], "T1") == []
    assert lists.status(list_name).retry_pending == 1


def test_each_end_of_a_job_is_later_than_the_one_before_whatever_the_clock(queue, lists, list_name, session):
    """The sync keeps the copy with the latest `done_at` and marks a job copied by the
    `done_at` it read: a job kicked and ended again at an earlier time (the server's
    clock set back since it died, or the record moved to a node whose clock is
    behind) would keep its old copy, be marked as copied, and be deleted. So each end
    is later than the one before, by whichever path it ends: a worker's acks (the
    native write, which leaves a kicked job to the UDF), one ack (the UDF), a failure
    past its attempts, a bury."""
    lists.load(list_name, specs(4), max_attempts=1, seal=True)
    first = queue.reserve(list_name, session, 4)
    assert [queue.fail(j, "x") for j in first] == ["dead"] * 4
    # As if the clock had been an hour ahead at their deaths, and set right since.
    ahead = max(lists.find_job(list_name, j.jid)["done_at"] for j in first) + 3_600_000
    for j in first:
        queue.backend.put(keys.JOB_SET, j.name, {"done_at": ahead})
    assert lists.kick(list_name) == 4
    again = {j.jid: j for j in queue.reserve(list_name, session, 4)}
    assert sorted(again) == [f"job-{i}" for i in range(4)]
    assert queue.complete_many([again["job-0"], again["job-1"]], ["second"] * 2) == []
    queue.complete(again["job-2"], "second")
    assert queue.fail(again["job-3"], "z") == "dead"
    ended = {jid: lists.find_job(list_name, jid) for jid in again}
    assert [ended[f"job-{i}"]["state"] for i in range(4)] == ["done", "done", "done", "dead"]
    for jid, job in ended.items():
        assert job["done_at"] > job["kicked"] > ahead, (jid, job["done_at"], job["kicked"], ahead)
    # Dead again, kicked again, buried: later again.
    before = ended["job-3"]["done_at"]
    assert lists.kick_job(list_name, "job-3")
    assert lists.bury(list_name, "job-3") == "dead"
    assert lists.find_job(list_name, "job-3")["done_at"] > before


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_kicked_delayed_job_is_offered_once_and_counted_where_it_is(queue, lists, list_name, session, mode):
    """Kicked while it waits out a backoff, a job moves from the schedule to the retry
    store: not counted delayed once claimed, and not offered again when its old time
    comes (nor counted delayed, then, while it runs)."""
    lists.load(list_name, specs(2), mode=mode, backoff_s=0.5, seal=True)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.fail(a, "x") == "delayed"
    assert lists.kick_job(list_name, a.jid)
    assert each_count(lists, list_name) == {"reservable": 1, "delayed": 0, "in_flight": 0, "retry_pending": 1, "done": 0, "dead": 0}
    (again,) = queue.reserve(list_name, session, 1)
    assert again.jid == a.jid
    assert each_count(lists, list_name) == {"reservable": 1, "delayed": 0, "in_flight": 1, "retry_pending": 0, "done": 0, "dead": 0}
    time.sleep(1.1)  # past its old time: nothing comes back from the schedule
    (other,) = queue.reserve(list_name, session, 5)
    assert other.jid != a.jid
    assert each_count(lists, list_name) == {"reservable": 0, "delayed": 0, "in_flight": 2, "retry_pending": 0, "done": 0, "dead": 0}
    queue.complete_many([again, other])
    assert lists.status(list_name).complete


def assert_counts_are_the_records(lists, name) -> None:
    """status against the job records themselves: queued ones are reservable or pending
    in the retry store, claimed ones in flight."""
    states = Counter(j["state"] for j in lists.jobs(name))
    st = lists.status(name)
    got = {"queued": st.reservable + st.retry_pending, "delayed": st.delayed, "claimed": st.in_flight,
           "done": st.done, "dead": st.dead}
    assert got == {k: states.get(k, 0) for k in got}, (dict(states), st)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_kicked_job_of_a_delayed_load_is_counted_once_gated_scheduled_or_ready(queue, lists, list_name, session, mode):
    """A kick takes a job of a delayed load out of its range (gated, stepped over into
    the schedule, or due and ready) as it enters the retry store: counted once, in
    flight once claimed, and not reservable again when its range comes due."""
    lists.load(list_name, specs(1), mode=mode)
    lists.load(list_name, specs(4, start=1), mode=mode, delay_s=1.5)
    assert lists.kick_job(list_name, "job-2")  # gated
    assert_counts_are_the_records(lists, list_name)
    first = queue.reserve(list_name, session, 10)  # the take steps over the range
    assert sorted(j.jid for j in first) == ["job-0", "job-2"]
    assert_counts_are_the_records(lists, list_name)
    assert lists.kick_job(list_name, "job-3")  # stepped over, in the schedule
    assert_counts_are_the_records(lists, list_name)
    (third,) = queue.reserve(list_name, session, 10)
    assert third.jid == "job-3"
    assert_counts_are_the_records(lists, list_name)
    queue.complete_many([*first, third])
    later: list = []
    wait_for("the range due", lambda: later.extend(queue.reserve(list_name, session, 10)) or len(later) >= 2, 10)
    assert sorted(j.jid for j in later) == ["job-1", "job-4"]
    assert_counts_are_the_records(lists, list_name)
    queue.complete_many(later)
    lists.seal(list_name)
    st = lists.status(list_name)
    assert (st.done, st.reservable, st.delayed, st.in_flight, st.complete) == (5, 0, 0, 0, True)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_job_buried_before_it_was_handed_out_then_kicked_is_counted_once(queue, lists, list_name, session, mode):
    """Its token still lies ahead in the token store (or in an unpopped chunk of the ID
    store): the store skips it now, or the kick took it out of its chunk (its retry
    store copy serves it), so it is in flight once claimed, not reservable too."""
    lists.load(list_name, specs(4), mode=mode)
    assert lists.bury(list_name, "job-3") == "dead"
    assert lists.kick_job(list_name, "job-3")
    (kicked,) = queue.reserve(list_name, session, 1)
    assert kicked.jid == "job-3"
    assert_counts_are_the_records(lists, list_name)
    rest = queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in rest) == ["job-0", "job-1", "job-2"], "the store skips it"
    assert_counts_are_the_records(lists, list_name)
    queue.complete_many([kicked, *rest])
    assert_counts_are_the_records(lists, list_name)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_job_with_its_own_later_run_at_kicked_runs_now_and_is_counted_once(queue, lists, list_name, session, mode):
    """Kicked before its own run_at while its token (or chunk) is not reached yet: it
    is on the retry store, claimed from there it is in flight (not delayed, not
    reservable), and the store does not hand it out a second time."""
    lists.load(list_name, specs(2, run_at=time.time() + 3600) + specs(1, start=2), mode=mode, seal=True)
    assert_counts_are_the_records(lists, list_name)
    assert lists.kick_job(list_name, "job-1")
    (kicked,) = queue.reserve(list_name, session, 1)
    assert kicked.jid == "job-1"
    assert_counts_are_the_records(lists, list_name)
    rest = queue.reserve(list_name, session, 10)
    assert [j.jid for j in rest] == ["job-2"]
    assert_counts_are_the_records(lists, list_name)
    assert queue.complete_many([kicked, *rest]) == []
    st = lists.status(list_name)
    assert (st.done, st.delayed, st.reservable, st.in_flight) == (2, 1, 0, 0)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_kicked_job_of_a_delayed_load_due_before_its_chunk_is_reached_is_counted_once(
        queue, lists, list_name, session, mode):
    """The load's time comes before any take reaches its range: the gate is dropped and
    its tokens (its chunk) are served in place, without the gate's skip. The job kicked
    from it earlier must not be there any more."""
    lists.load(list_name, specs(3), mode=mode, delay_s=0.5)
    assert lists.kick_job(list_name, "job-1")
    time.sleep(0.7)
    (kicked,) = queue.reserve(list_name, session, 1)
    assert kicked.jid == "job-1"
    # Due, the other two are reservable; their records say delayed until claimed.
    st = lists.status(list_name)
    assert (st.in_flight, st.reservable + st.delayed, st.retry_pending) == (1, 2, 0), st
    rest = queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in rest) == ["job-0", "job-2"]
    assert_counts_are_the_records(lists, list_name)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_job_held_back_by_a_delayed_load_and_buried_or_kicked_is_not_subtracted_twice(lists, list_name, mode):
    """A delayed load's gate holds its tokens back from the store: one of them buried or
    kicked must not be taken off the store's reservable count a second time."""
    lists.load(list_name, specs(5), mode=mode, delay_s=3600, seal=True)
    assert lists.bury(list_name, "job-0") == "dead"
    st = lists.status(list_name)
    assert (st.reservable, st.in_flight, st.dead) == (0, 0, 1)
    assert lists.kick_job(list_name, "job-0") and lists.kick_job(list_name, "job-1")
    st = lists.status(list_name)
    assert (st.reservable, st.in_flight, st.retry_pending, st.dead) == (0, 0, 2, 0)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_kick_cut_short_in_a_delayed_range_is_counted_once(registered, lists, list_name, mode):
    """A kick pushes its job to the retry store, then takes it out of the delayed load's
    range (`unschedule`): between the two, and for good if the kick dies there, status
    counted it twice, pending and delayed (11 jobs of 10)."""
    lists.load(list_name, [JobSpec(f"j{i}", {"i": i}) for i in range(10)], mode=mode, delay_s=60, seal=True)
    token = int(lists.find_job(list_name, "j3")["token"])
    # transitions.kick, cut short after its push (before `unschedule`)
    transitions.set_bits(registered, list_name, [token], "dead", 0)
    assert registered.udf(keys.JOB_SET, keys.job_name(list_name, token), keys.JOB_MOD, "kick") == "ok"
    transitions.push_retry(registered, list_name, [token])
    st = lists.status(list_name)
    assert (st.retry_pending, st.delayed, st.reservable, st.in_flight) == (1, 9, 0, 0), st


@pytest.mark.parametrize("cut_short", [True, False])
def test_a_kick_in_a_due_id_mode_range_of_a_job_with_a_later_run_at_is_counted_once(
        registered, queue, lists, list_name, session, cut_short):
    """A stepped-over range being served in ID mode; its job with a later run_at of its
    own kicked (the kick cut short or not): counted pending, not also delayed."""
    jobs = [JobSpec("a", 0), JobSpec("b", 1, None, time.time() + 30), JobSpec("c", 2), JobSpec("d", 3)]
    lists.load(list_name, jobs, mode="ids", delay_s=0.5, seal=True)
    assert queue.reserve(list_name, session, 5) == []  # steps over the range
    time.sleep(0.7)
    (a,) = queue.reserve(list_name, session, 1)  # the range is served: now in `ready`
    assert a.jid == "a"
    token = int(lists.find_job(list_name, "b")["token"])
    if cut_short:  # transitions.kick, cut short after its push (before `unschedule`)
        transitions.set_bits(registered, list_name, [token], "dead", 0)
        assert registered.udf(keys.JOB_SET, keys.job_name(list_name, token), keys.JOB_MOD, "kick") == "ok"
        transitions.push_retry(registered, list_name, [token])
    else:
        assert lists.kick(list_name, [token]) == 1
    st = lists.status(list_name)
    assert (st.retry_pending, st.reservable, st.delayed, st.in_flight) == (1, 2, 0, 1), st


@pytest.mark.parametrize("action", ["kick", "bury"])
def test_a_kick_or_bury_run_past_its_deadline_changes_nothing_and_is_sent_again(
        registered, lists, list_name, monkeypatch, action):
    """An operator's kick or bury carries a deadline as the transitions do: a frozen
    node that resumes would otherwise run it on its stale copy, and its replica write
    would undo what the cluster did since (a kicked job re-run and completed back to
    queued). Refused ('stale': nothing done), the client sends it again with a fresh
    deadline; refused to the end, the caller hears `StaleRequest`."""
    lists.load(list_name, specs(2), seal=True)
    if action == "kick":
        assert lists.bury(list_name, "job-0") == "dead"
    name = keys.job_name(list_name, int(lists.find_job(list_name, "job-0")["token"]))
    before = registered.get(keys.JOB_SET, name)
    args = () if action == "kick" else ("an operator",)
    assert registered.apply(keys.JOB_SET, name, keys.JOB_MOD, action, *args, 1) == "stale"  # 1: Unix ms, long gone
    after = registered.get(keys.JOB_SET, name)
    assert (after.gen, after.bins) == (before.gen, before.bins), "refused, and nothing written"

    def act():
        return lists.kick_job(list_name, "job-0") if action == "kick" else lists.bury(list_name, "job-0", "no")

    real = registered.job_deadline
    monkeypatch.setattr(registered, "job_deadline", lambda: 1)
    fast = type("FastClock", (), {"t": 0.0})  # the retries' 5 s pass at once
    clock = types.SimpleNamespace(time=time.time, sleep=lambda s: None,
                                  monotonic=lambda: setattr(fast, "t", fast.t + 1) or fast.t)
    monkeypatch.setattr(transitions, "time", clock)
    monkeypatch.setattr(base, "time", clock)
    with pytest.raises(errors.StaleRequest, match=f"{action} on aq_job/{name}: the server ran it after the deadline"):
        act()
    assert registered.get(keys.JOB_SET, name).gen == before.gen, "refused to the end: nothing done"
    monkeypatch.undo()
    given: list[int | None] = []
    monkeypatch.setattr(registered, "job_deadline", lambda: given.append(1 if len(given) < 2 else real()) or given[-1])
    assert act() == (True if action == "kick" else "dead")
    assert given[:2] == [1, 1] and given[2] != 1, "sent again, with a fresh deadline"  # (a kick's list calls follow)
    job = lists.find_job(list_name, "job-0")
    assert job["state"] == ("queued" if action == "kick" else "dead")
    st = lists.status(list_name)
    assert (st.dead, st.retry_pending) == ((0, 1) if action == "kick" else (1, 0)), st


@pytest.mark.parametrize("late", ["fail", "bury"])
def test_a_dead_bit_written_after_a_kick_does_not_count_the_kicked_job_dead(
        queue, lists, list_name, session, monkeypatch, late):
    """A job's dead bit is written after its transition to dead: a kick may run in
    between (clearing the bit, dead -> queued). The late bit must not stay: the
    kicked job would count as dead while it runs and done too once it is, and the
    list would never be complete (or be complete early)."""
    lists.load(list_name, [JobSpec("a", {}), JobSpec("b", {})], max_attempts=1, backoff_s=0, seal=True)
    real_set_bits = transitions.set_bits
    kicked = threading.Event()

    def late_dead_bits(backend, name, tokens, bitmap, value, created=None):
        if bitmap == "dead" and value == 1 and threading.current_thread().name == "late":
            kicked.wait(30)  # a GC pause, a slow network: the follow-up lands after the kick
        return real_set_bits(backend, name, tokens, bitmap, value, created)

    monkeypatch.setattr(transitions, "set_bits", late_dead_bits)
    (job,) = queue.reserve(list_name, session, 1)
    if late == "fail":
        act = lambda: queue.fail(job, "boom")  # noqa: E731 (its last attempt: dead)
    else:
        act = lambda: lists.bury(list_name, job.jid)  # noqa: E731
    t = threading.Thread(target=act, name="late")
    t.start()
    wait_for("the job dead", lambda: lists.find_job(list_name, job.jid)["state"] == "dead")
    assert lists.kick(list_name) == 1
    kicked.set()
    t.join()
    done = 0
    while jobs := queue.reserve(list_name, session, 10):
        for j in jobs:
            queue.complete(j, "ok")
            done += 1
    assert done == 2
    assert [j["state"] for j in lists.jobs(list_name)] == ["done", "done"]
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (2, 0, True)


def test_error_history_keeps_the_last_ten(queue, lists, list_name, session):
    lists.load(list_name, specs(1), backoff_s=0, max_attempts=20)
    for i in range(12):
        (a,) = queue.reserve(list_name, session, 1)
        assert queue.fail(a, f"error {i}\nTraceback ...") == "retry"
    errs = lists.find_job(list_name, "job-0")["errs"]
    assert [e["err"].split("\n")[0] for e in errs] == [f"error {i}" for i in range(2, 12)]
    assert all(isinstance(e["at"], int) for e in errs)


# -- delayed jobs ----------------------------------------------------------------------


def test_a_delayed_load_is_held_back_then_served_in_order(queue, lists, list_name, session):
    lists.load(list_name, specs(3), delay_s=0.8, chunk_size=2)
    lists.load(list_name, specs(2, start=3))  # loaded after, not delayed: served at once
    st = lists.status(list_name)
    assert (st.delayed, st.reservable) == (3, 2)
    first = queue.reserve(list_name, session, 5)
    assert [j.jid for j in first] == ["job-3", "job-4"]
    assert queue.reserve(list_name, session, 5) == []
    assert lists.status(list_name).delayed == 3
    # Each range's delay runs from its own allocation: on a loaded machine the second
    # range may come due a moment after the first.
    later: list = []
    wait_for("the delayed jobs due", lambda: later.extend(queue.reserve(list_name, session, 5)) or len(later) >= 3, 5)
    assert sorted(j.jid for j in later) == ["job-0", "job-1", "job-2"]
    for j in first + later:
        queue.complete(j)
    lists.seal(list_name)
    st = lists.status(list_name)
    assert (st.done, st.delayed, st.complete) == (5, 0, True)


def test_a_delayed_range_not_yet_reached_is_served_when_due(queue, lists, list_name, session):
    lists.load(list_name, specs(2), delay_s=0.5)
    time.sleep(0.7)  # due before any take reached it: no detour through the schedule
    got = queue.reserve(list_name, session, 5)
    assert sorted(j.jid for j in got) == ["job-0", "job-1"]


COUNTS = ("total", "reservable", "delayed", "in_flight", "retry_pending", "done", "dead", "complete")


def counts(lists, name: str) -> tuple:
    """A list's counts, in the order of COUNTS."""
    st = lists.status(name)
    return tuple(getattr(st, c) for c in COUNTS)


def test_a_delayed_load_in_id_mode_counts_each_job_once(queue, lists, list_name, session):
    # Two plain jobs, then a delayed load of three in chunks of two: the cursor pops
    # the plain chunk and must step over both gated chunks (advance, then take).
    lists.load(list_name, specs(2), mode="ids")
    # Delayed by 3 s: the asserts up to the first reserve must fit inside it (CI's loaded
    # machine once outlasted 0.8 s, and the delayed jobs came out with the first).
    lists.load(list_name, specs(3, start=2), mode="ids", delay_s=3, chunk_size=2, seal=True)
    assert counts(lists, list_name) == (5, 2, 3, 0, 0, 0, 0, False)
    first = queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in first) == ["job-0", "job-1"]  # the delayed ones are not popped early
    assert counts(lists, list_name) == (5, 0, 3, 2, 0, 0, 0, False)  # nor scheduled twice
    # Each chunk's gate is due by the clock of its own publish, milliseconds apart: a
    # take between the two gets the first chunk alone (seen on a loaded machine).
    later: list = []
    wait_for("the delayed jobs due", lambda: later.extend(queue.reserve(list_name, session, 10)) or len(later) >= 3, 10)
    assert sorted(j.jid for j in later) == ["job-2", "job-3", "job-4"]
    assert counts(lists, list_name) == (5, 0, 0, 5, 0, 0, 0, False)  # claimed: in flight
    for j in first + later:
        queue.complete(j)
    queue.flush()
    assert counts(lists, list_name) == (5, 0, 0, 0, 0, 5, 0, True)
    assert not lists.header(list_name).get("gates")  # no gate left behind


def test_a_delayed_load_in_id_mode_due_before_the_cursor_reaches_it(queue, lists, list_name, session):
    lists.load(list_name, specs(2), mode="ids", delay_s=0.5, seal=True)
    assert counts(lists, list_name) == (2, 0, 2, 0, 0, 0, 0, False)
    time.sleep(0.7)
    got = queue.reserve(list_name, session, 5)
    assert sorted(j.jid for j in got) == ["job-0", "job-1"]
    assert counts(lists, list_name) == (2, 0, 0, 2, 0, 0, 0, False)


def test_a_job_of_a_delayed_load_with_a_later_run_at_of_its_own(queue, lists, list_name, session):
    # The gate is stepped over (an early take) into the schedule; the job with its own
    # later run_at is on the schedule already: served once, when it is due, and left
    # behind nowhere (no phantom job in flight, nothing held back for good).
    later = time.time() + 1.6
    jobs = [JobSpec("a", 0), JobSpec("b", 1, None, later), JobSpec("c", 2)]
    lists.load(list_name, jobs, delay_s=0.6, seal=True)
    assert counts(lists, list_name) == (3, 0, 3, 0, 0, 0, 0, False)
    assert queue.reserve(list_name, session, 5) == []
    assert counts(lists, list_name) == (3, 0, 3, 0, 0, 0, 0, False)
    first = wait_for("the gate due", lambda: queue.reserve(list_name, session, 5), 5)
    assert sorted(j.jid for j in first) == ["a", "c"]
    assert counts(lists, list_name) == (3, 0, 1, 2, 0, 0, 0, False)
    (b,) = wait_for("the job's own run_at", lambda: queue.reserve(list_name, session, 5), 5)
    assert b.jid == "b" and b.attempt == 1 and time.time() >= later - 0.2  # clocks of one machine
    assert counts(lists, list_name) == (3, 0, 0, 3, 0, 0, 0, False)
    assert queue.reserve(list_name, session, 5) == []  # handed out once
    for j in [*first, b]:
        queue.complete(j)
    queue.flush()
    assert counts(lists, list_name) == (3, 0, 0, 0, 0, 3, 0, True)
    head = lists.header(list_name)
    assert not head.get("timed") and not head.get("gates") and not head.get("nsch")


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_stepped_over_range_due_counts_its_later_run_at_delayed(queue, lists, list_name, session, mode):
    """A take stepped over the delayed load's range; once the range is due, its job with
    a later run_at of its own still waits: ID mode's ranges carry no skip (the claim
    refuses the job), and status counted it reservable, one more than a take gives."""
    later = time.time() + 4.0
    jobs = [JobSpec("a", 0), JobSpec("b", 1, None, later), JobSpec("c", 2), JobSpec("d", 3)]
    lists.load(list_name, jobs, mode=mode, delay_s=0.5, seal=True)
    assert queue.reserve(list_name, session, 5) == []  # steps over the range, not due yet
    assert counts(lists, list_name) == (4, 0, 4, 0, 0, 0, 0, False)
    time.sleep(0.7)
    assert counts(lists, list_name) == (4, 3, 1, 0, 0, 0, 0, False)  # due, as the next take leaves it
    (a,) = queue.reserve(list_name, session, 1)
    assert a.jid == "a"
    assert counts(lists, list_name) == (4, 2, 1, 1, 0, 0, 0, False)  # the rest of the range, served
    rest = queue.reserve(list_name, session, 5)
    assert sorted(j.jid for j in rest) == ["c", "d"] and time.time() < later
    assert counts(lists, list_name) == (4, 0, 1, 3, 0, 0, 0, False)


def test_a_gate_due_before_the_token_store_reaches_it_still_skips_a_later_run_at(queue, lists, list_name, session):
    later = time.time() + 1.4
    lists.load(list_name, [JobSpec("a", 0), JobSpec("b", 1, None, later)], delay_s=0.4, seal=True)
    time.sleep(0.6)  # the gate is due: the token store walks through its range
    (a,) = queue.reserve(list_name, session, 5)
    assert a.jid == "a"
    assert counts(lists, list_name) == (2, 0, 1, 1, 0, 0, 0, False)
    (b,) = wait_for("the job's own run_at", lambda: queue.reserve(list_name, session, 5), 5)
    assert b.jid == "b" and b.attempt == 1
    for j in (a, b):
        queue.complete(j)
    queue.flush()
    assert counts(lists, list_name) == (2, 0, 0, 0, 0, 2, 0, True)
    assert not lists.header(list_name).get("timed")  # the fast path is back


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_run_at_per_job(queue, lists, list_name, session, mode):
    """In ID mode such a job waits in its chunk, where status counted it reservable."""
    # Far enough ahead that a loaded machine (a CI run, 0.8 s was too little once)
    # loads, counts and reserves before it.
    soon = time.time() + 3
    jobs = [JobSpec("now", 1), JobSpec("later", 2, None, soon), JobSpec("past", 3, None, time.time() - 60)]
    lists.load(list_name, jobs, mode=mode)
    st = lists.status(list_name)
    assert (st.delayed, st.reservable, st.in_flight) == (1, 2, 0)
    first = queue.reserve(list_name, session, 5)
    assert sorted(j.jid for j in first) == ["now", "past"]
    st = lists.status(list_name)
    assert (st.delayed, st.reservable, st.in_flight) == (1, 0, 2)
    (later,) = wait_for("the later job due", lambda: queue.reserve(list_name, session, 5), 10)
    assert later.jid == "later" and time.time() >= soon - 0.2  # clocks of one machine


def test_a_delayed_job_reached_early_is_refused_and_rescheduled(queue, lists, list_name, session):
    # A recovered load range carries no gate: its delayed jobs reach the claim early,
    # which refuses them by the record's own time and puts them on the schedule.
    lists.load(list_name, specs(1), delay_s=0.6)
    backend = queue.backend
    backend.udf(keys.LIST_SET, list_name, keys.LIST_MOD, "push_retry", [0], 100)
    assert queue.reserve(list_name, session, 1) == []
    assert lists.find_job(list_name, "job-0")["state"] == "delayed"
    (j,) = wait_for("the job due", lambda: queue.reserve(list_name, session, 1), 5)
    assert j.jid == "job-0"


def test_the_sweeper_offers_delayed_jobs_long_past_due(queue, lists, list_name, session):
    lists.load(list_name, specs(1), backoff_s=0.2, backoff_max_s=0.2)
    (a,) = queue.reserve(list_name, session, 1)
    # A worker died between the failure and its follow-up: the job is delayed in its
    # record but on no schedule.
    assert queue.backend.udf(keys.JOB_SET, a.name, keys.JOB_MOD, "fail", a.session, "boom", 200) == "delayed"
    time.sleep(0.5)
    assert queue.reserve(list_name, session, 1) == []
    assert sweep(queue.backend, grace_ms=100).requeued >= 1  # the shared server may hold other tests' lists
    (b,) = queue.reserve(list_name, session, 1)
    assert b.jid == "job-0"


@pytest.mark.parametrize("when", ["recover", "status", "header"])
def test_a_list_dropped_while_the_sweeper_runs_leaves_the_others_swept(
    queue, lists, list_name, session, monkeypatch, when
):
    """Lists are dropped while a sweep runs (seen in a run of the real-server tests:
    a drop between the sweep's list of lists and its read of one). The dropped list is
    left out and the others are swept; a ListNotFound failed the whole sweep."""
    from aeroqueue.lists import JobLists

    gone, kept = f"{list_name}-gone", f"{list_name}-kept"
    for name in (gone, kept):
        lists.load(name, specs(2))
        # A reserver took a job and died before its claim: the sweep's to find.
        assert queue.backend.apply(keys.LIST_SET, name, keys.LIST_MOD, "take", 1)["n"] == 1
    real = getattr(JobLists, when)
    dropped: list[str] = []

    def dropped_first(self, name, *args, **kw):
        if name == gone and not dropped:
            dropped.append(name)
            lists.drop(gone, grace_s=0)
        return real(self, name, *args, **kw)

    monkeypatch.setattr(JobLists, when, dropped_first)
    try:
        assert sweep(queue.backend, grace_ms=0).requeued >= 1  # kept's; the shared server may hold others
    finally:
        monkeypatch.undo()
    assert dropped == [gone]
    with pytest.raises(errors.ListNotFound):
        lists.header(gone)
    got = queue.reserve(kept, session, 2)
    assert sorted(j.jid for j in got) == ["job-0", "job-1"], got


def test_a_list_whose_load_ranges_cannot_be_recovered_leaves_the_others_swept(
    queue, lists, list_name, session, monkeypatch, caplog
):
    """A list whose dead loader's range cannot be finished (its ID-store chunk refused
    as too big, a store refusing the write) failed the whole sweep, every run: the lost
    jobs of every other list stayed lost. It is named in a warning, and the rest swept."""
    from aeroqueue.lists import JobLists

    broken, kept = f"{list_name}-broken", f"{list_name}-kept"
    for name in (broken, kept):
        lists.load(name, specs(2))
        # A reserver took a job and died before its claim: the sweep's to find.
        assert queue.backend.apply(keys.LIST_SET, name, keys.LIST_MOD, "take", 1)["n"] == 1
    real = JobLists.recover

    def refused(self, name):
        if name == broken:
            raise errors.RecordTooBig(f"aq_ids/{broken}/0: record too big")
        return real(self, name)

    monkeypatch.setattr(JobLists, "recover", refused)
    with caplog.at_level("WARNING", logger="aeroqueue.sessions"):
        sweep(queue.backend, grace_ms=0)
    monkeypatch.undo()
    assert any(getattr(r, "event", None) == "recover_failed" and r.list == broken for r in caplog.records), caplog.text
    for name in (broken, kept):  # the broken list's published jobs are swept all the same
        assert sorted(j.jid for j in queue.reserve(name, session, 2)) == ["job-0", "job-1"], name


@pytest.mark.parametrize("again", [False, True], ids=["dropped", "made-again"])
@pytest.mark.parametrize("bitmap", ["done", "dead"])
@pytest.mark.parametrize("by", ["sweep", "reap"])
def test_a_recount_on_a_list_dropped_since_its_scan_writes_no_bits_of_it(
    registered, queue, lists, list_name, session, monkeypatch, by, bitmap, again
):
    """A sweep's (or a reap's) recount finds a finished job whose bit is missing, and
    the list is dropped before it writes the bit: the drop deleted the bitmap, so the
    bit reads missing and, written, it made the bitmap record again. Stray, as the drop
    and its grace were over; and, written after the drop, not one a create of the name
    deletes (`_clear_tombstone` takes records from before the drop): a list made again
    under the name, then or since, started with the job's bit set, counted done before
    it ran (and complete, never swept, with that job still to run)."""
    lists.load(list_name, specs(3), max_attempts=1, seal=True)
    (job,) = queue.reserve(list_name, session, 1)
    if bitmap == "done":
        queue.complete(job, "ok")
    else:
        queue.fail(job, "boom")  # max_attempts=1: dead
    queue.flush()
    # A process killed before its bit was written: the recount's to write.
    transitions.set_bits(registered, list_name, [job.token], bitmap, 0)
    real = sessions._bits
    dropped: list[str] = []

    def dropped_first(backend, name, *args):
        if name == list_name and not dropped:
            dropped.append(name)
            lists.drop(name)  # with its grace: over before the recount writes
            if again:
                lists.load(name, specs(3), seal=True)
        return real(backend, name, *args)

    monkeypatch.setattr(sessions, "_bits", dropped_first)
    if by == "sweep":
        sweep(registered)
    else:
        sessions.recount_session(registered, session.id)
    monkeypatch.undo()
    assert dropped == [list_name]
    if not again:
        assert leftovers(registered, list_name) == {}
        lists.load(list_name, specs(3), seal=True)
    st = lists.status(list_name)
    assert (st.total, st.done, st.dead, st.reservable) == (3, 0, 0, 3)
    assert registered.get(keys.DONE_SET, keys.chunk_name(list_name, 0)) is None, "the new list has no bit yet"


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_the_sweeper_leaves_alone_delayed_jobs_the_list_still_holds(queue, lists, list_name, session, mode):
    """A delayed load nobody reserved from since it came due: its jobs wait in their
    gate (token mode) or their unpopped chunk (ID mode). The sweep offered them
    again, and status counted each job twice (retry 10 and delayed 10 of 10)."""
    lists.load(list_name, specs(10), seal=True, delay_s=0.3, mode=mode)
    time.sleep(0.8)
    sweep(queue.backend, grace_ms=200)  # (on a shared server it also sweeps other tests' lists)
    assert lists.header(list_name).get("retry") in (None, []), "nothing offered twice"
    st = lists.status(list_name)
    assert st.retry_pending == 0 and st.reservable + st.delayed == 10
    got = queue.reserve(list_name, session, 4)
    st = lists.status(list_name)
    assert (st.in_flight, st.reservable + st.delayed + st.retry_pending) == (4, 6)
    got += queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in got) == sorted(s.jid for s in specs(10))
    queue.complete_many(got)
    assert lists.status(list_name).complete


def test_the_sweeper_leaves_alone_a_failed_job_waiting_on_a_paused_lists_schedule(queue, lists, list_name, session):
    lists.load(list_name, specs(1), backoff_s=0.2, backoff_max_s=0.2)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.fail(a, "boom") == "delayed"  # on the list's schedule
    lists.pause(list_name)
    time.sleep(0.5)
    sweep(queue.backend, grace_ms=100)
    lists.pause(list_name, paused=False)
    (b,) = wait_for("the job due", lambda: queue.reserve(list_name, session, 1), 5)
    st = lists.status(list_name)
    assert (st.in_flight, st.retry_pending) == (1, 0), "one copy of the job: the one held"
    queue.complete(b)
    assert queue.reserve(list_name, session, 1) == []


# -- one job -------------------------------------------------------------------------


def test_bury_and_kick_one_job(queue, lists, list_name, session):
    lists.load(list_name, specs(3), seal=True, backoff_s=0)
    a, b, c = queue.reserve(list_name, session, 3)
    assert lists.bury(list_name, "job-1", "bad data") == "dead"
    with pytest.raises(errors.ClaimLost):  # its holder's ack is refused
        queue.complete(b)
    queue.complete(a)
    queue.complete(c)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (2, 1, True)
    assert st.completed_at is not None
    job = lists.find_job(list_name, "job-1")
    assert job["state"] == "dead" and job["errs"][-1]["err"] == "bad data"
    assert lists.bury(list_name, "job-0") == "done"  # a done job is left alone
    assert lists.kick_job(list_name, "job-1")
    st = lists.status(list_name)
    assert (st.dead, st.complete, st.completed_at) == (0, False, None)  # kick clears the completion time
    (again,) = queue.reserve(list_name, session, 1)
    assert again.jid == "job-1" and again.attempt == 1
    queue.complete(again)
    assert lists.status(list_name).complete
    assert not lists.kick_job(list_name, "job-1")  # done: not kickable
    with pytest.raises(errors.JobNotFound, match="no-such-id"):
        lists.find_job(list_name, "no-such-id")


def test_kick_a_delayed_job_now(queue, lists, list_name, session):
    lists.load(list_name, specs(1), delay_s=3600)
    assert queue.reserve(list_name, session, 1) == []
    assert lists.kick_job(list_name, "job-0")
    (j,) = queue.reserve(list_name, session, 1)
    assert j.jid == "job-0"


@pytest.mark.parametrize("count", [1, 5], ids=["one-job", "batch"])
def test_bury_a_queued_job(queue, lists, list_name, session, count):
    """One job: the token taken first is refused by its claim, and the reservation
    goes on to the next (`Queue._reserve_one` handing over to the general loop)."""
    lists.load(list_name, specs(2))
    assert lists.bury(list_name, "job-0") == "dead"
    got = queue.reserve(list_name, session, count)
    assert [j.jid for j in got] == ["job-1"]  # the dead one is never handed out


def test_cli_job_show_kick_bury(store_url, lists, list_name, cli):
    lists.load(list_name, specs(2), timeout_s=42)
    out = cli("job", "show", list_name, "job-1", "--json")
    view = json.loads(out)
    assert (view["id"], view["state"], view["attempts"], view["errors"]) == ("job-1", "queued", 0, [])
    for blank in ("", "  "):
        said = cli("job", "bury", list_name, "job-1", "--reason", blank, code=2)
        assert "--reason" in said and "reason for a bury is empty" in said
    with pytest.raises(errors.ConfigError, match="reason for a bury is empty"):
        lists.bury(list_name, "job-1", " ")
    assert json.loads(cli("job", "show", list_name, "job-1", "--json"))["state"] == "queued", "nothing buried"
    cli("job", "bury", list_name, "job-1", "--reason", "operator says no")
    view = json.loads(cli("job", "show", list_name, "job-1", "--json"))
    assert view["state"] == "dead" and view["errors"][0]["error"] == "operator says no"
    assert datetime.fromisoformat(view["errors"][0]["at"]).tzinfo == UTC
    table = cli("job", "show", list_name, "job-1")
    assert "operator says no" in table and "dead" in table
    cli("job", "kick", list_name, "job-1")
    assert json.loads(cli("job", "show", list_name, "job-1", "--json"))["state"] == "queued"
    bad = cli("job", "kick", list_name, "job-1", code=1)
    assert "queued" in bad and "only a dead or delayed job" in bad
    missing = cli("job", "show", list_name, "nope", code=1)
    assert "'nope'" in missing
    st = json.loads(cli("status", list_name, "--json"))
    assert st["timeout_s"] == 42 and st["delayed"] == 0


def test_cli_job_show_and_bury_name_the_session_that_leased_a_queued_job(queue, lists, list_name, session, cli):
    """A worker's batch is leased: its jobs' records stay queued, naming no session.
    `job show` said such a job was queued, held by nobody, and `job bury` said "dead"
    while the worker ran it anyway (only its acknowledgement refused)."""
    lists.load(list_name, specs(3), backoff_s=0)
    leased = queue.reserve(list_name, session, 2, lease=True)
    assert [j.lease is not None for j in leased] == [True, True]
    view = json.loads(cli("job", "show", list_name, leased[0].jid, "--json"))
    assert (view["state"], view["session"], view["leased_by"]) == ("queued", None, session.id)
    assert session.id in cli("job", "show", list_name, leased[0].jid)
    free = ({"job-0", "job-1", "job-2"} - {j.jid for j in leased}).pop()
    assert json.loads(cli("job", "show", list_name, free, "--json"))["leased_by"] is None
    said = cli("job", "bury", list_name, leased[1].jid)
    assert said.strip() == (f"{list_name}/{leased[1].jid}: dead (leased by session {session.id}: its worker may be "
                            "running it still; its acknowledgement is refused)")
    assert cli("job", "bury", list_name, free).strip() == f"{list_name}/{free}: dead"
    assert json.loads(cli("job", "show", list_name, leased[1].jid, "--json"))["leased_by"] is None, "dead: not leased"
    # Failed and queued again (attempt 1): the lease's entry stays until settled, but
    # the job is no longer as it read it: not held by it.
    queue.fail(leased[0], "again")
    view = json.loads(cli("job", "show", list_name, leased[0].jid, "--json"))
    assert (view["state"], view["attempts"], view["leased_by"]) == ("queued", 1, None), view


def test_cli_job_show_prints_ids_and_payloads_that_look_like_markup_as_they_are(lists, list_name, cli):
    """rich reads "[...]" as markup: an id "a[/]b" raised MarkupError, and a payload
    "[bold]x[/]" lost its brackets. Both are data, shown verbatim."""
    lists.load(list_name, [JobSpec("a[/]b", "see [/red] here"), JobSpec("j2", "[bold]hi[/] [link=x]y[/link]")])
    first = cli("job", "show", list_name, "a[/]b")
    assert "a[/]b" in first and "see [/red] here" in first, first
    second = cli("job", "show", list_name, "j2")
    assert "[bold]hi[/] [link=x]y[/link]" in second, second


def test_queue_rejects_bad_policy(lists, list_name):
    with pytest.raises(errors.ConfigError, match="positive"):
        lists.create(list_name, timeout_s=-1)
    with pytest.raises(errors.ConfigError, match="cap"):
        lists.create(list_name, backoff_s=10, backoff_max_s=1)
    with pytest.raises(errors.LoadError, match="delay"):
        lists.load(list_name, specs(1), delay_s=-5)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_job_buried_in_a_delayed_load_counts_dead_and_nowhere_else(queue, lists, list_name, session, mode):
    """A delayed load's range counts its jobs delayed while gated or scheduled, and
    reservable once due; a job buried meanwhile is dead, and counted nowhere else:
    the parts add up to the total at every step (they came to 12 of 10)."""
    lists.load(list_name, specs(10), mode=mode, delay_s=1.5, backoff_s=0, seal=True)

    def parts() -> dict[str, int]:
        st = lists.status(list_name)
        got = {c: getattr(st, c) for c in ("reservable", "delayed", "in_flight", "retry_pending", "done", "dead")}
        assert sum(got.values()) == st.total == 10, got
        return got

    assert lists.bury(list_name, "job-1") == "dead" and lists.bury(list_name, "job-2") == "dead"
    assert parts() == {"reservable": 0, "delayed": 8, "in_flight": 0, "retry_pending": 0, "done": 0, "dead": 2}
    assert queue.reserve(list_name, session, 5) == []  # steps over the gate: the range waits in the schedule
    assert lists.bury(list_name, "job-3") == "dead"
    assert parts()["delayed"] == 7
    first = wait_for("the range due", lambda: queue.reserve(list_name, session, 1), 30, step_s=0.1)
    queue.complete_many(first)
    assert lists.bury(list_name, "job-8") == "dead"  # due now: counted reservable until buried
    got = parts()
    assert (got["delayed"], got["done"], got["dead"], got["in_flight"]) == (0, 1, 4, 0), got
    rest = queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in [*first, *rest]) == [f"job-{i}" for i in (0, 4, 5, 6, 7, 9)]
    queue.complete_many(rest)
    assert parts() == {"reservable": 0, "delayed": 0, "in_flight": 0, "retry_pending": 0, "done": 6, "dead": 4}
    assert lists.status(list_name).complete


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_jobs_that_came_due_together_are_handed_out_earliest_first(queue, lists, list_name, session, mode):
    """Jobs with their own run_at, due by the time of one reservation, come out in the
    order they came due, on both stores (the server walks the schedule map in hash
    order, the embedded store in insertion order: they answered differently)."""
    now = time.time()
    # Loaded out of order; buckets of 10 ms at most apart. The first is due well after
    # the load: a job already due when its load publishes is an ordinary one, served
    # from the token store after what came due on the schedule (CI's loaded machine
    # once took 0.7 s to load these, and 'a' came out after 'b').
    due = {"d": 2.4, "b": 1.8, "c": 2.1, "a": 1.5}
    lists.load(list_name, [JobSpec(jid, {}, None, now + s) for jid, s in due.items()], mode=mode, seal=True)
    early = queue.reserve(list_name, session, 10)  # ID mode: the claims refuse them and schedule them
    assert all(due[j.jid] <= time.time() - now for j in early), [j.jid for j in early]  # none before it is due
    time.sleep(max(0.0, now + 2.8 - time.time()))
    got = early + queue.reserve(list_name, session, 10)
    assert [j.jid for j in got] == ["a", "b", "c", "d"]
    queue.complete_many(got)
    assert lists.status(list_name).complete


# -- results ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["complete", "complete_many", "complete_and_reserve"])
@pytest.mark.parametrize("lease", [False, True], ids=["claimed", "leased"])
def test_an_api_result_json_cannot_hold_is_refused_before_anything_is_sent(
    queue, lists, list_name, session, registered, how, lease
):
    """The API handler's own results are checked as the worker's are: a set (which
    the real client refuses, leaving its heap corrupt) raises ResultNotStorable with
    nothing written, and a tuple is stored as the list JSON makes of it."""
    lists.load(list_name, specs(40))
    jobs = queue.reserve(list_name, session, 20 if lease else 2, lease=lease)[:2]
    assert (jobs[0].lease is not None) is lease

    def ack(results):
        if how == "complete":
            for job, result in zip(jobs, results, strict=True):
                queue.complete(job, result)
            return []
        if how == "complete_many":
            return queue.complete_many(jobs, results)
        return queue.complete_and_reserve(list(zip(jobs, results, strict=True)), list_name, session)[1]

    def states():
        return [registered.get(keys.JOB_SET, job.name).bins.get("state") for job in jobs]

    before = states()
    with pytest.raises(errors.ResultNotStorable, match="cannot be stored as JSON"):
        ack([{"seen": {1, 2}}, {"ok": 1}])
    assert states() == before == ["queued" if lease else "claimed"] * 2
    assert lists.status(list_name).done == 0
    assert ack([(1, 2), {"t": (3, {"u": (4,)})}]) == []  # lost: none
    assert states() == ["done", "done"]
    assert [registered.get(keys.JOB_SET, job.name).bins["result"] for job in jobs] == [[1, 2], {"t": [3, {"u": [4]}]}]
    assert queue.complete_many(jobs, [None, None]) == []  # the process and its client are sound: 'again'


def test_acks_whose_batch_is_refused_whole_are_sent_alone_not_dropped(queue, lists, list_name, session, monkeypatch):
    """`complete_and_reserve` sends its acks in the batch that claims the next jobs. A
    batch refused whole (not in doubt: nothing happened) had returned as if the acks
    went through, leaving the jobs claimed until reaped; they are now sent alone."""
    lists.load(list_name, specs(10))
    jobs = queue.reserve(list_name, session, 3)
    assert len(jobs) == 3 and all(j.lease is None for j in jobs)

    def refused(*args, **kwargs):
        raise errors.BackendError("the batch was refused whole (injected)")

    monkeypatch.setattr(queue, "_batch", refused)
    got, lost = queue.complete_and_reserve([(j, {"n": j.token}) for j in jobs], list_name, session, 2)
    assert (got, lost) == ([], [])  # the reservation failed; the acks did not
    for job in jobs:
        assert queue.backend.get(keys.JOB_SET, job.name).bins["state"] == "done", job.jid
    assert lists.status(list_name).done == 3


def test_a_job_of_the_largest_payload_records_every_failure(queue, lists, list_name, session, registered):
    """The loader leaves room beside the payload for the job's failures: the last
    error and its history of ten, each cut to ERROR_BYTES. It had left 4 KiB, and a
    job of the largest payload could not record one failure (RecordTooBig: the job
    stayed claimed)."""
    from aeroqueue.lists import max_payload
    from aeroqueue.loading import payload_size

    limit = max_payload(registered)
    payload = "x" * (limit - payload_size(""))
    assert payload_size(payload) == limit
    lists.load(list_name, [JobSpec("big", payload)], max_attempts=12)
    error = "é" * 10_000 + "\U0001F600" * 3000  # cut to ERROR_BYTES of UTF-8, multi-byte to the end
    for attempt in range(1, 13):
        [job] = queue.reserve(list_name, session, 1)
        assert job.attempt == attempt
        outcome = queue.fail(job, f"attempt {attempt}: {error}")
        assert outcome == "dead" if attempt == 12 else outcome == "delayed"
        if attempt < 12:
            assert lists.kick(list_name, [job.token]) == 1  # no backoff wait
    bins = registered.get(keys.JOB_SET, job.name).bins
    assert bins["state"] == "dead" and len(bins["errs"]) == 10
    assert len(bins["err"].encode()) <= transitions.ERROR_BYTES and bins["err"].startswith("attempt 12: é")


def test_results_from_a_generator_stay_with_their_own_jobs(queue, lists, list_name, session, registered):
    """complete_many converts each result once per object; objects made one by one
    (a generator's) may share an id once freed, and must not share a result."""
    lists.load(list_name, specs(6))
    jobs = queue.reserve(list_name, session, 6)
    assert queue.complete_many(jobs, ((j.token, j.token) for j in jobs)) == []
    assert [registered.get(keys.JOB_SET, j.name).bins["result"] for j in jobs] == [[j.token, j.token] for j in jobs]


@pytest.mark.parametrize("mode", ["tokens", "ids"])
@pytest.mark.parametrize("how", ["run_at", "delay", "backoff"])
def test_status_counts_delayed_jobs_whose_time_has_come_as_a_take_will(queue, lists, list_name, session, mode, how):
    """Due jobs wait on the list record until a take releases them. Status counted them
    delayed (and not reservable) until someone reserved, except a chunk's own run_at in
    ID mode: now every kind is counted as the next take will leave it."""
    run_at = time.time() + 1.0 if how == "run_at" else None
    lists.load(list_name, specs(5, run_at=run_at), mode=mode, delay_s=1.0 if how == "delay" else 0.0,
               backoff_s=0.5, backoff_max_s=0.5)
    if how == "backoff":
        jobs = queue.reserve(list_name, session, 5)
        assert [queue.fail(j, "again later") for j in jobs] == ["delayed"] * 5
    before = lists.status(list_name)
    assert (before.delayed, before.reservable, before.in_flight) == (5, 0, 0)
    time.sleep(1.2)
    due = lists.status(list_name)
    assert (due.delayed, due.reservable + due.retry_pending, due.in_flight) == (0, 5, 0), due
    assert len(queue.reserve(list_name, session, 10)) == 5
    after = lists.status(list_name)
    assert (after.delayed, after.reservable, after.retry_pending, after.in_flight) == (0, 0, 0, 5), after


# -- completion bits against the job records ---------------------------------------


class _Killed(BaseException):
    """The process stops here: nothing after this step runs (a SIGKILL)."""


def _killed_after_a_kicked_dead_bit(monkeypatch, lists, list_name: str, jid: str) -> None:
    """The next dead bit written: the job went dead and, before its worker writes the
    bit, an operator kicks it; the worker sets the bit and is killed before the
    read-back (`_Killed` out of the fail)."""
    real_set_bits = transitions.set_bits

    def kicked_then_killed(backend, name, tokens, bitmap, value, created=None):
        if bitmap == "dead" and value == 1:
            monkeypatch.setattr(transitions, "set_bits", real_set_bits)
            assert lists.kick_job(list_name, jid)
            real_set_bits(backend, name, tokens, bitmap, value, created)
            raise _Killed
        return real_set_bits(backend, name, tokens, bitmap, value, created)

    monkeypatch.setattr(transitions, "set_bits", kicked_then_killed)


def test_a_dead_bit_left_by_a_process_killed_after_a_kick_never_completes_the_list_early(
    queue, lists, list_name, session, monkeypatch
):
    """`set_dead_bits` sets the bit, then reads the job back and clears the bit if the
    job is not dead any more (kicked meanwhile). A process killed between the two
    steps, after an operator's kick landed between the fail and the bit, leaves a dead
    bit on a queued job: the list said complete while that job still waited (and a
    complete list is never swept, so nothing repaired it), and once the job was done
    it counted twice (done + dead > total)."""
    lists.load(list_name, specs(2), max_attempts=1, seal=True)
    a, b = queue.reserve(list_name, session, 2)
    _killed_after_a_kicked_dead_bit(monkeypatch, lists, list_name, a.jid)
    with pytest.raises(_Killed):
        queue.fail(a, "boom")
    assert lists.find_job(list_name, a.jid)["state"] == "queued"
    queue.complete(b)
    st = lists.status(list_name)
    assert not st.complete, f"complete while {a.jid} waits in the queue: {st}"
    assert (st.done, st.dead) == (1, 0)
    (again,) = queue.reserve(list_name, session, 1)
    assert again.jid == a.jid
    queue.complete(again)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (2, 0, True), st


def test_a_dead_bit_left_on_a_kicked_job_is_cleared_by_the_sweep(queue, lists, list_name, session, monkeypatch):
    """The same wrong dead bit in a list that is not complete yet: status counted the
    kicked job dead (not pending in the retry store, where it waits), and the sweep,
    which recounts missing bits, never cleared a wrong one."""
    lists.load(list_name, specs(3), max_attempts=1, seal=True)
    a, b = queue.reserve(list_name, session, 2)
    _killed_after_a_kicked_dead_bit(monkeypatch, lists, list_name, a.jid)
    with pytest.raises(_Killed):
        queue.fail(a, "boom")
    queue.complete(b)
    sweep(queue.backend, grace_ms=60_000)
    assert_counts_are_the_records(lists, list_name)


def test_a_job_kicked_while_it_waits_in_the_retry_store_is_counted_once_when_claimed(queue, lists, list_name, session):
    """A kick pushes its job onto the retry store. One that waits there already (buried
    there after a failure; or delayed, its time come, released there by a take) was
    then in it twice: claimed from one copy, the other still counted it as waiting in
    the retry store while it ran (and not in flight)."""
    lists.load(list_name, specs(2), backoff_s=0, seal=True)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.fail(a, "x") == "retry"  # onto the retry store
    assert lists.bury(list_name, a.jid) == "dead"  # and dead there
    assert lists.kick_job(list_name, a.jid)
    assert_counts_are_the_records(lists, list_name)
    (again,) = queue.reserve(list_name, session, 1)
    assert again.jid == a.jid
    assert_counts_are_the_records(lists, list_name)
    queue.complete(again)
    assert_counts_are_the_records(lists, list_name)


ROOT = Path(__file__).resolve().parents[2]
_FAIL_THEN_DIE = """
import os, signal, sys
from aeroqueue import transitions
from aeroqueue.backends import open_backend

url, name, token, sess, rid = sys.argv[1:6]
real_set_bits = transitions.set_bits

def set_bits(backend, list_name, tokens, bitmap, value, created=None):
    if bitmap == "dead" and value == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # the job is dead, its bit not written yet
        real_set_bits(backend, list_name, tokens, bitmap, value, created)
        os.kill(os.getpid(), signal.SIGKILL)  # before the read-back
    return real_set_bits(backend, list_name, tokens, bitmap, value, created)

transitions.set_bits = set_bits
transitions.fail(open_backend(url), name, int(token), sess, "boom", rid=rid)
"""


def test_a_worker_killed_in_set_dead_bits_after_a_kick_leaves_the_list_incomplete(
    store_url, queue, lists, list_name, session
):
    """The same, with a real process: stopped (SIGSTOP) after its fail made the job
    dead, the job kicked meanwhile, then killed (SIGKILL) right after it set the bit."""
    lists.load(list_name, specs(2), max_attempts=1, seal=True)
    a, b = queue.reserve(list_name, session, 2)
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAIL_THEN_DIE, store_url, list_name, str(a.token), a.session, a.rid],
        cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True,
    )
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), (status, proc.stderr.read() if proc.stderr else "")
        assert lists.find_job(list_name, a.jid)["state"] == "dead"
        assert lists.kick_job(list_name, a.jid)
        os.kill(proc.pid, signal.SIGCONT)
        _, status = os.waitpid(proc.pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    finally:
        if proc.poll() is None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                proc.kill()
                os.waitpid(proc.pid, 0)
    queue.complete(b)
    st = lists.status(list_name)
    assert not st.complete and (st.done, st.dead, st.retry_pending) == (1, 0, 1), st
    (again,) = queue.reserve(list_name, session, 1)
    queue.complete(again)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (2, 0, True), st


def test_a_kick_while_status_marks_the_list_complete_leaves_no_completion_time(queue, lists, list_name, session, monkeypatch):
    """status reads the bits, finds the list complete and marks it so (its completion
    time) when it has none. A kick landing between the two (bits cleared, job queued,
    completion time cleared: `reopen`) was followed by the mark: the list record kept
    a completion time while a job waited, shown by status, and kept as the time the
    list completed once it really did (and copied to MySQL by the sync)."""
    lists.load(list_name, specs(1), max_attempts=1, seal=True)
    (a,) = queue.reserve(list_name, session, 1)
    assert queue.fail(a, "boom") == "dead"
    real_udf = lists._list_udf

    def kick_first(name, function, *args):
        if function == "mark_complete":
            monkeypatch.setattr(lists, "_list_udf", real_udf)
            assert lists.kick_job(list_name, a.jid)  # an operator's kick, just now
        return real_udf(name, function, *args)

    monkeypatch.setattr(lists, "_list_udf", kick_first)
    lists.status(list_name)  # saw it complete, before the kick
    st = lists.status(list_name)
    assert not st.complete
    assert st.completed_at is None, f"incomplete, yet completed at {st.completed_at}"
    (again,) = queue.reserve(list_name, session, 1)
    time.sleep(0.01)
    before = lists.find_job(list_name, a.jid)["claimed"]
    queue.complete(again)
    st = lists.status(list_name)
    assert st.complete and st.completed_at >= before, (st.completed_at, before)
