"""Leases (`Queue.reserve(..., lease=True)`, the worker's batches): jobs read, not
claimed, listed on the session record, acknowledged exactly once while still as the
lease read them, and recovered as claims are when their session dies, closes or
runs past the limit. Every test runs on both backends and audits job by job."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from typing import Any

import pytest
from click.testing import CliRunner

from aeroqueue import errors, hotpath, keys, sessions, transitions, udfs
from aeroqueue.backends import Backend, open_backend
from aeroqueue.cli import main
from aeroqueue.cli.job_cmd import job_view
from aeroqueue.config import CLOCK_MARGIN_MS
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import (
    LEASE_SETTLE_S,
    Session,
    SweepReport,
    claim_leases,
    reap,
    sweep,
)
from aeroqueue.transitions import push_retry


def load(lists: JobLists, name: str, n: int, **kw: Any) -> None:
    lists.load(name, [JobSpec(f"j{i}", {"i": i}, None, None) for i in range(n)], **kw)


def record(backend: Backend, job: Job) -> dict[str, Any]:
    rec = backend.get(keys.JOB_SET, job.name)
    assert rec is not None
    return dict(rec.bins)


def leases_of(backend: Backend, session: Session) -> dict[str, Any]:
    rec = backend.get(keys.SESS_SET, session.id)
    assert rec is not None
    return dict(rec.bins.get("leases") or {})


def test_a_leased_batch_runs_unclaimed_and_is_acknowledged_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 30)
    jobs = queue.reserve(list_name, session, 20, lease=True)
    assert [j.jid for j in jobs] == [f"j{i}" for i in range(20)]
    assert [j.payload for j in jobs] == [{"i": i} for i in range(20)]
    assert all(j.lease is not None and j.attempt == 1 and j.session == session.id for j in jobs)
    for job in jobs:  # read, not written: no claim on the record
        rec = record(registered, job)
        assert rec["state"] == "queued" and "sess" not in rec and rec["att"] == 0
    [(lid, (name, until, groups))] = leases_of(registered, session).items()
    assert lid == jobs[0].rid and name == list_name and until == jobs[0].lease[2]
    assert sorted(t for _, _, toks, _ in groups for t in toks) == list(range(20))

    assert queue.complete_many(jobs[:15], [{"n": j.token} for j in jobs[:15]]) == []
    queue.complete(jobs[15], "one")
    assert queue.complete_many(jobs[16:]) == []
    # Repeated acks are recognised (the UDF answers 'again'), not counted twice.
    assert queue.complete_many(jobs[:3]) == []
    queue.complete(jobs[15], "one")
    queue.flush()
    for job in jobs:
        rec = record(registered, job)
        assert rec["state"] == "done" and rec["by"] == session.id and rec["att"] == 1, job
    assert record(registered, jobs[4])["result"] == {"n": 4} and record(registered, jobs[15])["result"] == "one"
    st = lists.status(list_name)
    assert (st.done, st.reservable, st.in_flight, st.retry_pending) == (20, 10, 0, 0)

    # Every job of the lease is settled: the next lease write forgets it.
    more = queue.reserve(list_name, session, 10, lease=True)
    assert list(leases_of(registered, session)) == [more[0].rid]


def test_a_batch_of_one_lease_with_a_job_claimed_since_is_acknowledged_whole(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    # One lease's batch with one result, one job of it touched since: that job is a
    # claim now, refused as leased and completed by the UDF; the others are done by
    # the batch write, and every job is counted.
    load(lists, list_name, 6)
    jobs = queue.reserve(list_name, session, 6, lease=True)
    assert len(jobs) == 6 and len({j.lease for j in jobs}) == 1
    jobs[2].touch(60)
    assert record(registered, jobs[2])["state"] == "claimed"
    result = {"ok": True}
    with pytest.raises(ValueError, match="6 jobs but 1 results"):
        queue.complete_many(jobs, [result])  # refused before anything is written
    assert [record(registered, j)["state"] for j in jobs] == ["queued", "queued", "claimed", "queued", "queued", "queued"]
    assert queue.complete_many(jobs, [result] * 6) == []
    queue.flush()
    for job in jobs:
        rec = record(registered, job)
        assert rec["state"] == "done" and rec["result"] == result and rec["by"] == session.id, job
    assert lists.status(list_name).done == 6
    # Every job acknowledged: the lease is settled, and the next lease write forgets it.
    more_jobs = 2
    load(lists, list_name + "-b", more_jobs)
    more = queue.reserve(list_name + "-b", session, more_jobs, lease=True)
    assert list(leases_of(registered, session)) == [more[0].rid]
    assert queue.complete_many(jobs) == [], "repeated: recognised, not lost"


@pytest.mark.parametrize(("results", "n_leases"), [("shared", 3), ("each", 3), ("mixed", 3), ("each", 9)])
def test_acks_of_several_leases_go_in_one_call_per_lease(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, results: str, n_leases: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker's ack batch mixes the leases of its threads. Each lease's acks share
    # their filter and go in a call of their own: of the same operations with one
    # result object, else of each job's own result (a filter per record cost the client
    # four times as much). Past hotpath.GROUPS_MAX leases, one call carries each
    # record's own operations and filter.
    per = 4
    load(lists, list_name, per * n_leases)
    leases = [queue.reserve(list_name, session, per, lease=True) for _ in range(n_leases)]
    assert len({job.rid for jobs in leases for job in jobs}) == n_leases
    mixed = [job for row in zip(*leases, strict=True) for job in row]  # interleaved
    shared = "ok"
    want = {
        "shared": [shared] * len(mixed),
        "each": [{"t": job.token} for job in mixed],
        "mixed": [None if i % 2 else {"t": job.token} for i, job in enumerate(mixed)],  # in every lease
    }[results]
    calls: list[str] = []  # counted here, not by round_trips: a heartbeat may land meanwhile

    def counting(method: str) -> Any:
        real = getattr(registered, method)

        def counted(*args: Any, **kw: Any) -> Any:
            calls.append(method)
            return real(*args, **kw)

        return counted

    for method in ("batch_same_codes", "batch_write_codes", "batch_each"):
        monkeypatch.setattr(registered, method, counting(method))
    assert queue.complete_many(mixed, want) == []
    if n_leases > hotpath.GROUPS_MAX:
        assert calls == ["batch_each"]
    else:
        assert calls == ["batch_same_codes" if results == "shared" else "batch_write_codes"] * n_leases
    monkeypatch.undo()
    queue.flush()
    for job, result in zip(mixed, want, strict=True):
        rec = record(registered, job)
        assert rec["state"] == "done" and rec.get("result") == result and rec["by"] == session.id, job
        assert rec["att"] == 1 and rec["rid"] == job.rid, job
    assert lists.status(list_name).done == len(mixed)
    assert queue.complete_many(mixed, want) == [], "repeated: recognised, not lost"


@pytest.mark.parametrize("per_job", [False, True], ids=["shared-result", "result-each"])
def test_a_group_of_acks_in_doubt_is_sent_again_alone(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, per_job: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Three leases' acks, three calls; the second times out before it is sent. Only its
    # jobs are sent again: the others' answers came back, and sending them again would
    # find them done, refused, and cost each a call of the UDF.
    load(lists, list_name, 30)
    leases = [queue.reserve(list_name, session, 10, lease=True) for _ in range(3)]
    mixed = [job for trio in zip(*leases, strict=True) for job in trio]
    results = [{"t": job.token} for job in mixed] if per_job else [None] * 30
    method = "batch_write_codes" if per_job else "batch_same_codes"
    sent: list[list[str]] = []
    real = getattr(registered, method)

    def flaky(set_name: str, names: list[Any], *args: Any, **kw: Any) -> Any:
        sent.append([n[0] for n in names] if per_job else list(names))  # (name, ops) with a result each
        if len(sent) == 2:
            raise errors.BackendTimeout("injected: the call never left")
        return real(set_name, names, *args, **kw)

    monkeypatch.setattr(registered, method, flaky)
    assert queue.complete_many(mixed, results) == []
    monkeypatch.undo()
    times = {name: sum(name in call for call in sent) for name in (job.name for job in mixed)}
    assert sorted(times.values()) == [1] * 20 + [2] * 10, times
    assert {name for name, n in times.items() if n == 2} == set(sent[1])
    queue.flush()
    for job, result in zip(mixed, results, strict=True):
        rec = record(registered, job)
        assert rec["state"] == "done" and rec.get("result") == result, job
    assert lists.status(list_name).done == 30


def test_an_ack_is_refused_once_the_reaper_took_the_lease_back(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    load(lists, list_name, 12)
    dead = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)
    held = queue.reserve(list_name, dead, 8, lease=True)
    assert len(held) == 8
    queue.complete(held[0], "before")  # acked in time: the reaper leaves it alone
    time.sleep(0.8)
    report = reap(registered)  # (on a shared server, other tests' dead sessions count too)
    assert report.sessions >= 1 and report.released >= 7
    assert registered.get(keys.SESS_SET, dead.id) is None
    for job in held[1:]:  # claimed for the dead session, released with the attempt counted
        rec = record(registered, job)
        assert rec["state"] == "queued" and rec["att"] == 1 and "sess" not in rec, rec
    # The dead session's late acks are refused, one by one and as a batch.
    with pytest.raises(errors.ClaimLost):
        queue.complete(held[1], "late")
    assert queue.complete_many(held[2:]) == held[2:]

    with Session.open(registered, heartbeat=False) as alive:
        again = queue.reserve(list_name, alive, 20, lease=True)
        assert sorted(j.token for j in again) == [*range(1, 12)]
        assert {j.attempt for j in again if j.token < 8} == {2}
        assert queue.complete_many(again) == []
    queue.flush()
    for token in range(12):
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, token))
        assert rec is not None and rec.bins["state"] == "done"
        assert rec.bins.get("result") == ("before" if token == 0 else None)
        assert rec.bins["by"] == (dead.id if token == 0 else alive.id)
    assert lists.status(list_name).done == 12


def test_fail_snooze_release_and_touch_claim_a_leased_job_first(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 6, backoff_s=0)
    jobs = queue.reserve(list_name, session, 6, lease=True)
    failed, snoozed, released, touched, done, lost = jobs

    assert queue.fail(failed, "boom") == "retry"
    rec = record(registered, failed)
    assert rec["state"] == "queued" and rec["att"] == 1 and rec["err"] == "boom"
    assert queue.snooze(snoozed, 30) == "delayed"
    rec = record(registered, snoozed)
    assert rec["state"] == "delayed" and rec["att"] == 0
    assert queue.release(released, "not now") == "released"
    assert record(registered, released)["att"] == 0, "a graceful release gives the attempt back"

    assert queue.touch(touched, 120) == 120
    rec = record(registered, touched)
    assert rec["state"] == "claimed" and rec["sess"] == session.id and rec["rid"] == touched.rid
    assert rec["tl"] == 120_000 and rec["att"] == 1
    queue.complete(touched, "after touch")  # now a claim: acknowledged as one
    rec = record(registered, touched)
    assert rec["state"] == "done" and rec["result"] == "after touch" and rec["att"] == 1

    queue.complete(done, "ok")
    with pytest.raises(errors.ClaimLost):  # failed already: not as leased, not held
        queue.complete(failed, "late")
    registered.udf(keys.JOB_SET, lost.name, keys.JOB_MOD, "bury", "an operator")
    assert queue.complete_many([lost]) == [lost]
    assert record(registered, lost)["state"] == "dead"


def test_a_lease_past_its_limit_ends_as_timed_out(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 4, timeout_s=0.3, backoff_s=0)
    late, early = queue.reserve(list_name, session, 4, lease=True)[:2]
    queue.complete(early, "in time")
    reap(registered)
    assert record(registered, late)["state"] == "queued" and leases_of(registered, session), "not past its limit yet"
    time.sleep(0.3 + CLOCK_MARGIN_MS / 1000 + 0.2)
    # The server's clock: past the lease's limit; said as a claim's is ('lost' named an expiry or a bury).
    with pytest.raises(errors.ClaimLost, match="ran past its time limit"):
        queue.complete(late, "too late")
    assert reap(registered).timed_out >= 3
    rec = record(registered, late)
    assert rec["state"] == "queued" and rec["att"] == 1 and "timed out" in rec["err"]
    assert record(registered, early)["state"] == "done"
    assert leases_of(registered, session) == {}, "an ended lease is forgotten"
    st = lists.status(list_name)
    assert (st.done, st.retry_pending) == (1, 3)


def test_the_sweeper_leaves_leased_jobs_alone(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 6)
    jobs = queue.reserve(list_name, session, 4, lease=True)
    # Two more taken by a reserver that died before it claimed or leased them.
    out = registered.udf(keys.LIST_SET, list_name, keys.LIST_MOD, "take", 2)
    assert (out["start"], out["n"]) == (4, 2)
    sweep(registered, grace_ms=0)  # (on a shared server it also sweeps other tests' lists)
    assert sorted(lists.header(list_name)["retry"]) == [4, 5], "the lost two are offered again, the leased four not"
    assert queue.complete_many(jobs) == []


def test_a_lease_that_lands_after_its_window_holds_nothing(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reserver frozen after it sent its lease in time (its process stopped, a node
    holding the write): a sweep meanwhile offers the taken jobs again and another
    session claims them. The lease, landing late, must not hand them out a second
    time: the server refuses it past its window, and the reserver's claims are fenced."""
    load(lists, list_name, 6)
    frozen, go = threading.Event(), threading.Event()
    real = registered.udf

    def udf(set_name: str, name: str, module: str, function: str, *args: Any, **kw: Any) -> Any:
        if function == "lease":
            frozen.set()
            go.wait(120)  # past the sweep, however slow a shared server makes it
        return real(set_name, name, module, function, *args, **kw)

    monkeypatch.setattr(registered, "udf", udf)
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(jobs=queue.reserve(list_name, session, 6, lease=True)))
    t.start()
    assert frozen.wait(10), "the reservation took its jobs and sent its lease"
    sweep(registered, grace_ms=0)  # waits LEASE_SETTLE_S after the heads: no lease by then
    assert sorted(lists.header(list_name)["retry"]) == list(range(6)), "the taken jobs are offered again"
    other = Session.open(registered, heartbeat=False)
    try:
        theirs = Queue(registered).reserve(list_name, other, 6)
        assert sorted(j.token for j in theirs) == list(range(6))
        go.set()
        t.join(30)
        assert not t.is_alive() and "jobs" in got
        assert got["jobs"] == [], "nothing handed out twice"
        assert leases_of(registered, session) == {}, "no lease recorded"
        assert all(record(registered, j)["sess"] == other.id for j in theirs), "the other session holds them all"
    finally:
        go.set()
        other.close()


@pytest.mark.parametrize("kind", ["taken", "delayed"])
def test_two_sweepers_at_once_offer_a_job_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session,
    monkeypatch: pytest.MonkeyPatch, kind: str,
) -> None:
    """Two sweepers that scan at the same moment find the same jobs (taken by a
    reserver that died, or delayed past their time): one offers them again, the other
    finds them changed since its scan. A token pushed twice is claimed once on one
    consistent master, but while a node rejoins two masters may each admit a claim
    (test_failover saw one job run and acknowledged twice that way). The second sweep
    runs inside the first, between its scan and its push."""
    load(lists, list_name, 5, backoff_s=0.01, seal=True)
    if kind == "taken":
        out = registered.udf(keys.LIST_SET, list_name, keys.LIST_MOD, "take", 3)
        assert (out["start"], out["n"]) == (0, 3)
    else:
        # Failed by a process that died before the follow-up put them on the list's
        # schedule: delayed in their records only (one on the schedule is not lost).
        jobs = queue.reserve(list_name, session, 3)
        assert [registered.udf(keys.JOB_SET, j.name, keys.JOB_MOD, "fail", j.session, "boom", 10)
                for j in jobs] == ["delayed"] * 3
        time.sleep(0.3)  # past due
    inner: list[SweepReport] = []
    leased_tokens = sessions.leased_tokens

    def leased_then_another_sweep(backend: Backend) -> set[tuple[str, int]]:
        if not inner:
            inner.append(SweepReport(0, 0, 0, 0))  # first: the inner sweep calls this too
            inner[0] = sweep(registered, grace_ms=0)
        return leased_tokens(backend)

    monkeypatch.setattr(sessions, "leased_tokens", leased_then_another_sweep)
    if registered.is_embedded:  # this test's own store: no lease is being recorded in it
        monkeypatch.setattr(sessions, "LEASE_SETTLE_S", 0.1)
    sweep(registered, grace_ms=0)  # (on a shared server it also sweeps other tests' lists)
    assert inner and inner[0].requeued >= 3, "the inner sweep offered them"
    assert sorted(lists.header(list_name).get("retry") or []) == [0, 1, 2], "each job offered once"
    for token in range(3):
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, token))
        assert rec is not None, token
        swept = datetime.fromisoformat(job_view(rec.bins)["swept_at"])  # as `aeroqueue job show` says it
        assert abs(swept.timestamp() - time.time()) < 30, f"token {token}: the fence's write, by the server's clock"

    with Session.open(registered, heartbeat=False) as other:
        jobs = queue.reserve(list_name, session, 5, lease=True) + queue.reserve(list_name, other, 5, lease=True)
        assert sorted(j.token for j in jobs) == [0, 1, 2, 3, 4]
        assert queue.complete_many(jobs) == []
    queue.flush()
    st = lists.status(list_name)
    assert (st.done, st.complete) == (5, True)



@pytest.mark.parametrize("how", ["buried", "delayed"])
def test_a_kicked_job_not_yet_handed_out_is_held_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, how: str
) -> None:
    """A job buried, or held back by a delayed load, before anyone reserved it, then
    kicked: it is on the retry store, and the token store (or the load's range) skips
    its old place, so it is handed out once. Reserved from the retry store, it is
    claimed, not leased: a claim fences any copy a store still held (ID mode)."""
    if how == "buried":
        load(lists, list_name, 20, seal=True)
        assert lists.bury(list_name, "j0") == "dead"
    else:
        load(lists, list_name, 20, seal=True, delay_s=1)
    assert lists.kick_job(list_name, "j0")
    if how == "delayed":
        time.sleep(1.3)  # the load's time comes: the token store hands out its tokens
    first = queue.reserve(list_name, session, 20, lease=True)
    assert sorted(j.token for j in first) == list(range(20))
    [j0] = [j for j in first if j.token == 0]
    assert j0.lease is None, "claimed, not leased"
    assert queue.reserve(list_name, session, 20, lease=True) == [], "no second copy of the kicked job"
    assert queue.complete_many(first) == []
    queue.flush()
    st = lists.status(list_name)
    assert (st.done, st.complete) == (20, True)
    for job in first:
        rec = record(registered, job)
        assert rec["state"] == "done" and rec["by"] == session.id and rec["att"] == 1, job.token


def test_a_leased_job_buried_and_kicked_refuses_the_leases_ack(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """Bury refuses the holder's ack; a kick after it puts the job back queued with fresh
    attempts, as the lease read it: the lease's ack must still be refused."""
    load(lists, list_name, 3, seal=True)
    jobs = queue.reserve(list_name, session, 3, lease=True)
    assert all(j.lease is not None for j in jobs)
    assert lists.bury(list_name, "j1") == "dead" and lists.kick_job(list_name, "j1")
    assert queue.complete_many(jobs) == [jobs[1]], "the buried and kicked job's ack refused, the others done"
    again = queue.reserve(list_name, session, 3)
    assert [j.token for j in again] == [1] and queue.complete_many(again) == []
    queue.flush()
    assert (lists.status(list_name).done, record(registered, again[0])["att"]) == (3, 1)

def test_closing_gives_leased_jobs_back_with_their_attempt(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    load(lists, list_name, 5)
    closing = Session.open(registered, heartbeat=False)
    jobs = queue.reserve(list_name, closing, 5, lease=True)
    queue.complete(jobs[0], "done first")
    assert closing.close() == 4
    for job in jobs[1:]:
        rec = record(registered, job)
        assert rec["state"] == "queued" and rec["att"] == 0, "never ran: the attempt is given back"
    assert sorted(lists.header(list_name)["retry"]) == [1, 2, 3, 4]
    # The attempt count is as the lease read it, but the claim made at close moved the
    # record's claim time: the closed lease's ack is still refused.
    assert queue.complete_many(jobs[1:]) == jobs[1:]


def test_a_close_that_outwaits_a_reservation_leaves_the_session_to_expire(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() waits for reservations under way up to the expiry. One still under way
    past it (its lease held up) could record its lease after close read the leases
    and before it deleted the record, which took the lease along: its jobs, handed
    out, were held by no one (a sweep offers them to others while they run). The
    record is left to expire instead, and the reaper gives the jobs back."""
    load(lists, list_name, 4)
    closing = Session.open(registered, interval_s=0.1, expiry_s=0.3, heartbeat=False)
    sent, go = threading.Event(), threading.Event()
    real_udf, real_remove = registered.udf, registered.remove

    def udf(set_name: str, name: str, module: str, function: str, *args: Any, **kw: Any) -> Any:
        if function == "lease":
            sent.set()
            go.wait(30)
        return real_udf(set_name, name, module, function, *args, **kw)

    def remove(set_name: str, name: str, **kw: Any) -> bool:
        if set_name == keys.SESS_SET and name == closing.id:  # the lease lands just before
            go.set()
            t.join(30)
        return real_remove(set_name, name, **kw)

    monkeypatch.setattr(registered, "udf", udf)
    monkeypatch.setattr(registered, "remove", remove)
    got: dict[str, Any] = {}
    t = threading.Thread(target=lambda: got.update(jobs=queue.reserve(list_name, closing, 4, lease=True)))
    t.start()
    assert sent.wait(10)
    closing.close()
    go.set()
    t.join(30)
    monkeypatch.undo()
    assert len(got.get("jobs", [])) == 4, "the reservation got its jobs, leased"
    assert registered.get(keys.SESS_SET, closing.id) is not None, "left to expire, not deleted"
    assert leases_of(registered, closing), "with the lease that landed late"
    time.sleep(0.5)
    reap(registered)  # (on a shared server, other tests' dead sessions too)
    assert registered.get(keys.SESS_SET, closing.id) is None
    for job in got["jobs"]:
        assert record(registered, job)["att"] == 1, "given back by the reaper, its attempt counted"
    assert sorted(lists.header(list_name)["retry"]) == [0, 1, 2, 3]


def test_claiming_a_lease_twice_claims_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """A reaper that died half-way repeats the step: the second pass changes nothing."""
    load(lists, list_name, 3)
    jobs = queue.reserve(list_name, session, 3, lease=True)
    leases = leases_of(registered, session)
    assert claim_leases(registered, session.id, leases) == 3
    assert claim_leases(registered, session.id, leases) == 0
    assert {record(registered, j)["att"] for j in jobs} == {1}


def test_a_lease_ack_whose_answer_was_lost_is_recognised(tmp_path) -> None:
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    lists, queue = JobLists(backend), Queue(backend)
    load(lists, "L", 5)
    with Session.open(backend, heartbeat=False) as s:
        jobs = queue.reserve("L", s, 5, lease=True)
        # The native ack of job 2 lands, but its answer is lost (a node died mid-call).
        backend.client.faults.add(op="batch_operate", key="L/2", writes="state=done", error="TimeoutError", when="after")
        assert queue.complete_many(jobs) == []
        assert backend.client.faults.fired == 1
    queue.flush()
    assert lists.status("L").done == 5
    rec = backend.get(keys.JOB_SET, keys.job_name("L", 2))
    assert rec is not None and rec.bins["state"] == "done" and rec.bins["att"] == 1


def test_a_token_twice_in_the_retry_store_runs_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """The retry store may hold a token twice (two reapers of one session both push it
    back): what it hands out is claimed, not leased, so the second copy is refused
    instead of running the job a second time beside the first."""
    load(lists, list_name, 4)
    with Session.open(registered, heartbeat=False) as first:
        queue.complete_many(queue.reserve(list_name, first, 4, lease=True)[2:])  # 0 and 1 stay out
    push_retry(registered, list_name, [0, 1])
    push_retry(registered, list_name, [0, 1])
    with Session.open(registered, heartbeat=False) as a, Session.open(registered, heartbeat=False) as b:
        got_a = queue.reserve(list_name, a, 2, lease=True)
        got_b = queue.reserve(list_name, b, 2, lease=True)
        assert sorted(j.token for j in got_a) == [0, 1] and got_b == [], "each job is handed out once"
        assert all(j.lease is None for j in got_a), "claimed: the retry store's tokens are fenced"
        assert queue.complete_many(got_a) == []


def test_a_retry_token_in_place_of_a_fresh_one_is_claimed_not_leased(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """`_lease` told the fresh tokens from the others by count alone: a pass holding a
    retry-store token where a fresh one had been (seen before, under one request id)
    has as many tokens as the fresh run, and the retry token was leased, unfenced."""
    load(lists, list_name, 6)
    with Session.open(registered, heartbeat=False) as s:
        # Tokens 4 and 5 are the "fresh run"; 5 was seen, token 0 came from the retry store.
        jobs = queue._lease(list_name, s, "rid-x", 60_000, int(time.time() * 1000), [0, 4], range(4, 6),
                            time.monotonic())
        by_token = {j.token: j for j in jobs}
        assert sorted(by_token) == [0, 4]
        assert by_token[0].lease is None, "the retry store's token is claimed, so the claim fences it"
        assert by_token[4].lease is not None
        assert lists.find_job(list_name, by_token[0].jid)["state"] == "claimed"
        assert queue.complete_many(jobs) == []


def test_a_refused_late_ack_leaves_the_job_to_the_reaper(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """An ack refused because the lease ran out leaves the job as it was: queued and
    never claimed. The lease must stay on the session record until the reaper ends
    the job as timed out (its attempt counted); forgotten, the job would look taken
    and abandoned, and the sweeper would offer it again as if it had never run."""
    load(lists, list_name, 6, timeout_s=0.3, backoff_s=0)
    late, in_time = queue.reserve(list_name, session, 2, lease=True)
    queue.complete(in_time, "in time")
    time.sleep(0.5)
    with pytest.raises(errors.ClaimLost):
        queue.complete(late, "too late")
    queue.reserve(list_name, session, 2, lease=True)  # a new lease: the settled ones are forgotten with it
    assert late.rid in leases_of(registered, session), "the late job's lease is kept"
    sweep(registered, grace_ms=0)
    assert late.token not in (lists.header(list_name).get("retry") or []), "not offered again as never run"
    time.sleep(CLOCK_MARGIN_MS / 1000)
    reap(registered)
    rec = record(registered, late)
    assert rec["att"] == 1 and "timed out" in rec["err"] and rec["state"] == "queued"
    assert late.rid not in leases_of(registered, session)


def test_touch_fail_and_snooze_past_the_lease_end_are_refused_as_for_a_late_claim(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """A claim past its time limit refuses touch, fail and snooze ('late'); so does a
    lease past its end. Adopted as a fresh claim instead, a touch would have revived a
    job the reaper is about to end as timed out. The job stays leased, for the reaper."""
    load(lists, list_name, 4, timeout_s=0.3, backoff_s=0)
    touched, failed, snoozed, in_time = queue.reserve(list_name, session, 4, lease=True)
    time.sleep(0.3 + 0.2)
    with pytest.raises(errors.ClaimLost):
        queue.touch(touched, 60)
    with pytest.raises(errors.ClaimLost):
        queue.fail(failed, "boom")
    with pytest.raises(errors.ClaimLost):
        queue.snooze(snoozed, 30)
    for job in (touched, failed, snoozed):
        rec = record(registered, job)
        assert rec["state"] == "queued" and rec["att"] == 0 and "sess" not in rec, rec
    assert touched.rid in leases_of(registered, session), "the lease is kept for the reaper"
    time.sleep(CLOCK_MARGIN_MS / 1000)
    reap(registered)
    for job in (touched, failed, snoozed):
        rec = record(registered, job)
        assert rec["state"] == "queued" and rec["att"] == 1 and "timed out" in rec["err"], rec
    assert record(registered, in_time)["att"] == 1


def test_a_reaper_ending_overdue_leases_does_not_keep_a_dead_session_alive(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """Ending a live session's overdue leases writes its session record (unlease).
    Judged by the record's last update, a session that died just before would look
    alive for one more expiry, and its jobs come back that much later; judged by its
    last heartbeat (`beat`, the server's clock), it is reaped on time."""
    load(lists, list_name, 4, timeout_s=0.3, backoff_s=0)
    # Another live session's overdue claims, as an earlier test may leave on a shared
    # server: the reap ends them too.
    others = f"{list_name}-others"
    load(lists, others, 2, timeout_s=0.3, backoff_s=0)
    other = Session.open(registered, heartbeat=False, expiry_s=60)
    assert len(queue.reserve(others, other, 2)) == 2
    dead = Session.open(registered, interval_s=0.5, expiry_s=2.0, heartbeat=False)  # never beats again
    opened = time.monotonic()
    held = queue.reserve(list_name, dead, 4, lease=True)
    assert len(held) == 4  # the lease write is its last heartbeat
    time.sleep(0.3 + CLOCK_MARGIN_MS / 1000 + 0.2)
    assert reap(registered).timed_out >= 4 + 2
    for job in held:  # the overdue leases ended, the session record written
        rec = record(registered, job)
        assert rec["state"] == "queued" and rec["att"] == 1 and "timed out" in rec["err"], rec
    assert leases_of(registered, dead) == {}
    assert registered.get(keys.SESS_SET, dead.id) is not None, "not expired yet"
    time.sleep(max(0.0, opened + 2.0 + 0.3 - time.monotonic()))
    assert reap(registered).sessions >= 1
    assert registered.get(keys.SESS_SET, dead.id) is None, "reaped one expiry after its last heartbeat"
    other.close()


def test_a_lease_recorded_while_the_sweeper_scans_is_seen(
    registered: Backend, lists: JobLists, list_name: str, session: Session
) -> None:
    """A reservation takes its jobs, then records its lease a moment later: a sweep
    that read the heads between the two must still see the lease, not offer the jobs
    again (they would run twice)."""
    load(lists, list_name, 4)
    out = registered.udf(keys.LIST_SET, list_name, keys.LIST_MOD, "take", 3)
    tokens = list(range(out["start"], out["start"] + out["n"]))
    entry = [list_name, out["now"] + 300_000, [[0, None, tokens]]]
    late = threading.Timer(LEASE_SETTLE_S / 3, session.lease, args=("lease-1", entry))
    late.start()
    try:
        sweep(registered, grace_ms=0)
    finally:
        late.join()
    assert not set(tokens) & set(lists.header(list_name).get("retry") or []), "leased, not lost"


@pytest.fixture
def faulty(tmp_path) -> Backend:
    """An embedded store with fault injection (client.faults)."""
    backend = open_backend(f"embedded://{tmp_path / 'f.db'}")
    udfs.register(backend)
    return backend


def test_a_lease_ack_that_did_not_land_is_sent_again_not_reported_lost(faulty: Backend) -> None:
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 5)
    with Session.open(faulty, heartbeat=False) as s:
        jobs = queue.reserve("L", s, 5, lease=True)
        # Two records time out before the write: not done, and the UDF cannot complete a
        # job that is only leased, so taking them for refused would strand them.
        faulty.client.faults.add(op="batch_operate", writes="state=done", error="TimeoutError", times=2)
        assert queue.complete_many(jobs) == []
        assert faulty.client.faults.fired == 2
    queue.flush()
    assert lists.status("L").done == 5


@pytest.mark.parametrize("lost", ["each record's answer", "the whole call's answer"])
def test_a_sweep_whose_fence_is_in_doubt_offers_nothing_and_a_later_one_does(
    faulty: Backend, monkeypatch: pytest.MonkeyPatch, lost: str
) -> None:
    """The fence write lands but its answer is lost: this sweep cannot tell its write
    from another sweep's, so it offers nothing; a later sweep (here at once: grace 0)
    reads the job as it is now and offers it."""
    monkeypatch.setattr(sessions, "LEASE_SETTLE_S", 0.1)  # this test's own store: no lease is being recorded
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 3, seal=True)
    assert faulty.udf(keys.LIST_SET, "L", keys.LIST_MOD, "take", 2)["n"] == 2  # and the reserver died
    if lost == "each record's answer":
        faulty.client.faults.add(op="batch_write", error="TimeoutError", when="after", times=-1)
        assert sweep(faulty, grace_ms=0).requeued == 0
        assert faulty.client.faults.fired == 2
        faulty.client.faults.clear()
    else:
        write = Backend.batch_if_unchanged

        def landed_then_timed_out(self: Backend, *args: Any, **kw: Any) -> list[int]:
            write(self, *args, **kw)
            raise errors.BackendTimeout("batch_write: timed out")

        with monkeypatch.context() as patched:
            patched.setattr(Backend, "batch_if_unchanged", landed_then_timed_out)
            assert sweep(faulty, grace_ms=0).requeued == 0
    assert not lists.header("L").get("retry")
    for token in (0, 1):
        rec = faulty.get(keys.JOB_SET, keys.job_name("L", token))
        assert rec is not None and rec.bins.get("swept"), f"token {token}: the write landed"
    assert sweep(faulty, grace_ms=0).requeued == 2
    assert sorted(lists.header("L")["retry"]) == [0, 1]
    with Session.open(faulty, heartbeat=False) as s:
        assert queue.complete_many(queue.reserve("L", s, 5, lease=True)) == []
    queue.flush()
    assert lists.status("L").done == 3



def test_a_sweep_fences_only_what_the_retry_store_has_room_for(faulty: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fence write is a write: it restarts the job's grace period. Jobs the retry
    store has no room for are left unwritten, so the next sweep offers them as soon as
    there is room, not a grace period later."""
    monkeypatch.setattr(sessions, "LEASE_SETTLE_S", 0.1)  # this test's own store: no lease is being recorded
    monkeypatch.setattr(transitions, "RETRY_CAP", 2)
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 5, seal=True)
    assert faulty.udf(keys.LIST_SET, "L", keys.LIST_MOD, "take", 4)["n"] == 4  # 0-3 taken, the reserver died
    assert push_retry(faulty, "L", [3]) == 1  # 3 given back (one place of two taken); 0-2 lost
    assert sweep(faulty, grace_ms=0).requeued == 1
    [offered] = lists.header("L")["retry"][1:]
    recs = faulty.batch_get(keys.JOB_SET, keys.job_names("L", [0, 1, 2]))
    swept = {t for t, rec in enumerate(recs) if rec is not None and rec.bins.get("swept")}
    assert swept == {offered}, "only the job that had a place was written"
    with Session.open(faulty, heartbeat=False) as s:
        done = queue.reserve("L", s, 2)
        assert sorted(j.token for j in done) == sorted([3, offered])
        assert queue.complete_many(done) == []
        assert sweep(faulty, grace_ms=0).requeued == 2
        assert queue.complete_many(queue.reserve("L", s, 5)) == []
    queue.flush()
    assert lists.status("L").done == 5

def test_claiming_a_leased_job_retries_a_busy_record(faulty: Backend) -> None:
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 3, backoff_s=0)
    with Session.open(faulty, heartbeat=False) as s:
        jobs = queue.reserve("L", s, 3, lease=True)
        faulty.client.faults.add(op="batch_operate", writes="state=claimed", error="RecordBusy", times=1)
        assert queue.fail(jobs[0], "boom") == "retry"
        assert faulty.client.faults.fired == 1
        rec = faulty.get(keys.JOB_SET, jobs[0].name)
        assert rec is not None and rec.bins["err"] == "boom" and rec.bins["att"] == 1


def test_complete_and_reserve_acks_leased_jobs(faulty: Backend) -> None:
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 6)
    with Session.open(faulty, heartbeat=False) as s:
        jobs = queue.reserve("L", s, 3, lease=True)
        got, lost = queue.complete_and_reserve([(j, "ok") for j in jobs], "L", s, 3)
        assert lost == [] and sorted(j.token for j in got) == [3, 4, 5]
        assert queue.complete_many(got) == []
    queue.flush()
    assert lists.status("L").done == 6


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_lease_not_recorded_in_time_claims_the_jobs_instead(faulty: Backend, when: str) -> None:
    """The lease write times out (before it landed, or after): the reservation claims
    the jobs, which fences them whether or not a sweep missed the lease."""
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 4)
    with Session.open(faulty, heartbeat=False) as s:
        faulty.client.faults.add(op="apply", function="lease", error="TimeoutError", when=when, times=-1)
        jobs = queue.reserve("L", s, 4, lease=True)
        faulty.client.faults.clear()
        assert sorted(j.token for j in jobs) == [0, 1, 2, 3] and all(j.lease is None for j in jobs)
        for job in jobs:
            rec = record(faulty, job)
            assert rec["state"] == "claimed" and rec["sess"] == s.id and rec["att"] == 1
        assert queue.complete_many(jobs) == []
        queue.reserve("L", s, 4, lease=True)  # nothing left; a landed lease is forgotten with the next write
    queue.flush()
    assert lists.status("L").done == 4


def test_a_claim_of_a_leased_job_run_past_its_deadline_changes_nothing(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """A request the server runs after its sender gave up on it (a frozen node that
    resumes) must not claim: the reaper's and the holder's claims carry a deadline."""
    load(lists, list_name, 2)
    job = queue.reserve(list_name, session, 2, lease=True)[0]
    assert job.lease is not None
    att, claimed, _, created = job.lease
    past = int(time.time() * 1000) - 60_000
    assert hotpath.claim_leased(
        registered, [job.name], session.id, job.rid, 1000, att, claimed, past, created=created
    ) == [27]
    assert record(registered, job)["state"] == "queued"
    queue.complete(job, "still leased")
    assert record(registered, job)["state"] == "done"


@pytest.mark.parametrize("read_back", ["answered", "timed out"])
def test_a_reaper_whose_claims_all_land_past_their_deadline_keeps_the_lease(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, read_back: str,
) -> None:
    """The reaper's claim of a leased job refused twice as past its deadline (a store
    whose clock is ahead, requests held up) was taken for a job that left the lease,
    and the lease forgotten: the job, still queued as leased, was held by no one, and
    its frozen holder's late ack was taken. The lease stays until a pass claims it."""
    load(lists, list_name, 3)
    dead = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)
    held = queue.reserve(list_name, dead, 3, lease=True)
    assert len(held) == 3 and all(j.lease is not None for j in held)
    queue.complete(held[0], "acked in time")  # refused by the reaper's filter as well: left
    queue.flush()
    time.sleep(0.8)
    real = hotpath.claim_leased

    def held_up(backend: Backend, names: list[str], sess: str, rid: str, tlim: int, att: int, claimed: Any,
                deadline: Any = None, **kw: Any) -> list[int]:
        return real(backend, names, sess, rid, tlim, att, claimed, int(time.time() * 1000) - 60_000, **kw)

    monkeypatch.setattr(hotpath, "claim_leased", held_up)
    if read_back == "timed out":  # the records read back after the refusal do not answer: kept too
        real_bins = registered.batch_bins
        monkeypatch.setattr(registered, "batch_bins", lambda set_name, names, bins: (
            [(9, None)] * len(names) if set_name == keys.JOB_SET else real_bins(set_name, names, bins)))
    other = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)  # dead too, no lease
    time.sleep(0.8)
    with caplog.at_level(logging.WARNING, logger="aeroqueue.sessions"):
        reap(registered)  # goes on past the session it cannot finish
    assert any("still leased" in r.getMessage() for r in caplog.records), "said why"
    assert leases_of(registered, dead), "the lease is kept for a later pass"
    assert registered.get(keys.SESS_SET, other.id) is None, "the other dead sessions are reaped all the same"
    assert all(record(registered, j)["state"] == "queued" for j in held[1:])
    monkeypatch.undo()
    reap(registered)
    assert registered.get(keys.SESS_SET, dead.id) is None
    with pytest.raises(errors.ClaimLost):
        queue.complete(held[1], "late")  # the frozen holder's ack, refused
    for job in held[1:]:
        rec = record(registered, job)
        assert rec["state"] == "queued" and rec["att"] == 1 and "sess" not in rec, rec
    assert record(registered, held[0])["result"] == "acked in time"


@pytest.mark.parametrize("lease", [False, True], ids=["claimed", "leased"])
def test_reserved_jobs_are_plain_jobs(queue: Queue, lists: JobLists, list_name: str, session: Session, lease: bool) -> None:
    """`Queue._jobs` fills each Job's dict directly, not through the frozen dataclass's
    __init__: the jobs must be indistinguishable from ones built by it."""
    import dataclasses
    import pickle

    load(lists, list_name, 20)
    jobs = queue.reserve(list_name, session, 20, lease=lease)
    assert len(jobs) == 20
    names = {f.name for f in dataclasses.fields(Job)}
    for job in jobs:
        assert set(vars(job)) == names, job  # every field set, nothing else
        rebuilt = Job(**{n: getattr(job, n) for n in names})
        assert job == rebuilt and repr(job) == repr(rebuilt)
        assert pickle.loads(pickle.dumps(dataclasses.replace(job, toucher=None))) == job
        with pytest.raises(dataclasses.FrozenInstanceError):
            job.attempt = 9  # type: ignore[misc]
    assert [j.lease is not None for j in jobs] == [lease] * 20
    assert queue.complete_many(jobs) == []


def test_a_heartbeat_forgets_settled_leases(registered: Backend, queue: Queue, lists: JobLists, list_name: str) -> None:
    """A session that stops leasing (an API process between requests) must not keep
    listing acknowledged jobs as leased until it closes: the heartbeat forgets them,
    and only them."""
    load(lists, list_name, 30)
    session = Session.open(registered, heartbeat=False)
    try:
        first = queue.reserve(list_name, session, 10, lease=True)
        second = queue.reserve(list_name, session, 10, lease=True)
        assert len(first) == len(second) == 10 and first[0].rid != second[0].rid
        assert queue.complete_many(first) == []  # the first lease settles; the second holds on
        assert queue.complete_many(second[:9]) == []
        assert set(leases_of(registered, session)) == {first[0].rid, second[0].rid}
        assert session.beat()
        [(lid, (_, _, groups))] = leases_of(registered, session).items()
        assert lid == second[0].rid and sorted(t for _, _, toks, _ in groups for t in toks) == [j.token for j in second]
        assert session.beat()  # nothing settled since: a plain heartbeat
        assert list(leases_of(registered, session)) == [second[0].rid]
        queue.complete(second[9], "last")
        assert session.beat()
        assert leases_of(registered, session) == {}
    finally:
        session.close()
    queue.flush()
    assert lists.status(list_name).done == 20


def test_leased_jobs_are_handed_out_when_claiming_the_rest_of_the_take_fails(faulty: Backend) -> None:
    """A take that brings a retry-store token with fresh ones: the fresh ones are leased,
    the other is claimed. A claim failing (not in doubt) had raised from `reserve`,
    dropping the leased jobs that the live session's lease then held until its limit."""
    lists, queue = JobLists(faulty), Queue(faulty)
    load(lists, "L", 40)
    with Session.open(faulty, heartbeat=False) as s:
        [first] = queue.reserve("L", s, 1)
        assert queue.release(first) == "released"  # token 0 waits in the retry store
        faulty.client.faults.add(op="apply", function="claim", error="ServerError", times=-1)
        jobs = queue.reserve("L", s, 20, lease=True)
        assert sorted(j.token for j in jobs) == list(range(1, 20)) and all(j.lease for j in jobs)
        faulty.client.faults.clear()
        assert queue.complete_many(jobs) == []
        # Token 0, and token 20 of the take that followed, are held by no one: the sweeper's.
        assert lists.status("L").in_flight == 2
        sweep(faulty, grace_ms=0)
        rest = queue.reserve("L", s, 40)
        assert sorted(j.token for j in rest) == [0, *range(20, 40)]
        assert queue.complete_many(rest) == []
    status = lists.status("L")
    assert (status.done, status.in_flight, status.complete) == (40, 0, False)


@pytest.mark.parametrize("lease", [True, False], ids=["leased", "claimed"])
def test_a_result_too_big_fails_its_own_ack_and_the_rest_are_counted(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, lease: bool
) -> None:
    """One result in a batch would make its record too big: the others are done, and
    counted (bits, lease settled) before RecordTooBig names that job. The leased ones
    had been done on the server with no bit and their lease left unsettled."""
    load(lists, list_name, 40)
    jobs = queue.reserve(list_name, session, 16, lease=lease)
    assert len(jobs) == 16 and all((j.lease is not None) is lease for j in jobs)
    results: list[Any] = [{"n": i} for i in range(16)]
    results[7] = "x" * (2 << 20)
    with pytest.raises(errors.RecordTooBig) as caught:
        queue.complete_many(jobs, results)
    assert caught.value.too_big == [jobs[7]] and caught.value.lost == []  # type: ignore[attr-defined]
    states = [record(registered, j)["state"] for j in jobs]
    assert states == ["done"] * 7 + [("queued" if lease else "claimed")] + ["done"] * 8
    queue.flush()
    assert lists.status(list_name).done == 15
    queue.complete(jobs[7], "small")
    queue.flush()
    assert lists.status(list_name).done == 16 and lists.status(list_name).in_flight == 0
    if lease:
        assert session.beat()
        assert leases_of(registered, session) == {}


@pytest.mark.parametrize("lease", [True, False], ids=["leased", "claimed"])
def test_a_result_too_big_says_its_size_the_limit_and_what_to_do(
    queue: Queue, lists: JobLists, list_name: str, session: Session, lease: bool
) -> None:
    """It said "aq_job_v1.complete on aq_job/L/0 failed: ... AEROSPIKE_ERR_RECORD_TOO_BIG
    (Aerospike code 13)" (one job), or only that records "would exceed the namespace's
    max-record-size" (a batch): neither how big the result was, nor the limit, nor what
    to do about it."""
    load(lists, list_name, 4)
    jobs = queue.reserve(list_name, session, 4, lease=lease)
    limit = f"max-record-size is {queue.backend.max_record_size():,} bytes"
    advice = "store big results elsewhere (a file, an object store) and return a reference to them"
    with pytest.raises(errors.RecordTooBig) as caught:
        queue.complete(jobs[0], {"text": "x" * 2_000_000})
    assert str(caught.value) == (
        f"acknowledging job {jobs[0].jid!r}: the result is too big to store: it is 2,000,011 bytes of JSON, more "
        f"than its job's record can hold (the store's {limit}, for the whole record); {advice}")
    # As complete_many's (README): the job to fail, nothing refused. They were missing.
    assert (caught.value.too_big, caught.value.lost) == ([jobs[0]], [])  # type: ignore[attr-defined]
    with pytest.raises(errors.RecordTooBig) as caught:
        queue.complete_many(jobs[1:], ["x" * 3_000_000, 1, "é" * 1_600_000])
    message = str(caught.value)
    assert message.startswith("acknowledging 2 of 3 jobs: the largest result is too big to store: it is "
                              "3,200,002 bytes of JSON"), message  # UTF-8 bytes, not characters
    assert limit in message and message.endswith(f"{advice}; the others were acknowledged"), message


def test_complete_and_reserve_with_results_too_big_acknowledges_and_reserves_the_rest(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """Too-big results among leased and claimed acks: every other ack is done and
    counted, the new jobs are reserved, and one RecordTooBig names the too-big jobs.
    The leased one had stopped the call before the claimed acks were sent, and a
    claimed one had stopped the acks after it."""
    load(lists, list_name, 60)
    claimed = queue.reserve(list_name, session, 3)
    leased = queue.reserve(list_name, session, 16, lease=True)
    assert all(j.lease is None for j in claimed) and all(j.lease is not None for j in leased)
    big = "x" * (2 << 20)
    done = [(claimed[0], big), (claimed[1], 1), (claimed[2], 2), (leased[0], big)] + [(j, 3) for j in leased[1:]]
    with pytest.raises(errors.RecordTooBig) as caught:
        queue.complete_and_reserve(done, list_name, session, 2)
    e = caught.value
    assert {j.jid for j in e.too_big} == {claimed[0].jid, leased[0].jid}  # type: ignore[attr-defined]
    assert e.lost == [] and len(e.reserved) == 2  # type: ignore[attr-defined]
    for job, _ in done:
        want = "done" if job not in (claimed[0], leased[0]) else ("claimed" if job is claimed[0] else "queued")
        assert record(registered, job)["state"] == want, job.jid
    queue.flush()
    assert lists.status(list_name).done == 17
    queue.complete_many([claimed[0], leased[0], *e.reserved])  # type: ignore[attr-defined]
    queue.flush()
    status = lists.status(list_name)
    assert (status.done, status.in_flight) == (21, 0)


@pytest.mark.parametrize("raised", ["too big", "timeout"])
def test_complete_and_reserve_accounts_for_leased_acks_when_the_rest_raises(
    queue: Queue, lists: JobLists, list_name: str, session: Session, monkeypatch: pytest.MonkeyPatch, raised: str
) -> None:
    """The leased acks go first; when the claimed ones (with the reservation) then
    raise, the error carries the leased acks' account too: a lost one had been
    reported nowhere."""
    load(lists, list_name, 40)
    [claimed] = queue.reserve(list_name, session, 1)
    leased = queue.reserve(list_name, session, 16, lease=True)
    monkeypatch.setattr(queue, "complete_many", lambda jobs, results=None: [jobs[0]])  # its claim was lost

    def failing(*args: Any, **kwargs: Any) -> Any:
        if raised == "timeout":
            raise errors.BackendTimeout("injected")
        e = errors.RecordTooBig("injected", code=13)
        e.too_big, e.lost, e.reserved = [claimed], [], []  # type: ignore[attr-defined]
        raise e

    monkeypatch.setattr(queue, "_reserve", failing)
    with pytest.raises(errors.BackendError) as caught:
        queue.complete_and_reserve([(claimed, 1), *[(j, 2) for j in leased]], list_name, session, 2)
    assert caught.value.lost == [leased[0]]  # type: ignore[attr-defined]
    assert caught.value.too_big == ([claimed] if raised == "too big" else [])  # type: ignore[attr-defined]


def test_acks_that_landed_are_counted_when_another_ack_of_the_call_fails(faulty: Backend) -> None:
    """complete_and_reserve stopped deciding its acks at the first that failed: those
    after it landed, done in their records, and were never counted (no bits), and a
    session that closes is never reaped to recount them."""
    lists, queue = JobLists(faulty), Queue(faulty, busy_deadline_s=0.5)
    lists.load("L", [JobSpec(f"j{i}", {"i": i}) for i in range(6)], seal=True)
    with Session.open(faulty) as s:
        jobs = queue.reserve("L", s, 3)
        assert [j.token for j in jobs] == [0, 1, 2]
        # Job 0's ack times out, in the batch and alone (a node down); jobs 1 and 2's land.
        faulty.client.faults.add(op="batch_apply", key="L/0", function="complete", error="TimeoutError")
        faulty.client.faults.add(op="apply", key="L/0", function="complete", error="TimeoutError", times=-1)
        with pytest.raises(errors.BackendTimeout) as raised:
            queue.complete_and_reserve([(j, {"ok": True}) for j in jobs], "L", s, 2)
        assert len(raised.value.reserved) == 2  # type: ignore[attr-defined]
        assert (raised.value.too_big, raised.value.lost) == ([], [])  # type: ignore[attr-defined]
        states = [r.bins["state"] for r in faulty.batch_get(keys.JOB_SET, [j.name for j in jobs])]
        assert states == ["claimed", "done", "done"]
        faulty.client.faults.clear()
    assert JobLists(faulty).status("L").done == 2


def _drop_and_load_again(lists: JobLists, list_name: str, n: int) -> tuple[threading.Thread, list[BaseException]]:
    """An operator drops the list and loads it again under the same name (other jobs,
    same tokens), in a thread of its own."""
    errors_seen: list[BaseException] = []

    def run() -> None:
        try:
            lists.drop(list_name, grace_s=0)
            lists.load(list_name, [JobSpec(f"new{i}", {"new": i}, None, None) for i in range(n)])
        except BaseException as e:  # reported by the test
            errors_seen.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors_seen


def _untouched(registered: Backend, list_name: str, n: int) -> list[dict[str, Any]]:
    recs = [registered.get(keys.JOB_SET, keys.job_name(list_name, t)) for t in range(n)]
    return [dict(r.bins) for r in recs if r is not None]


def _new_jobs_untouched(registered: Backend, lists: JobLists, list_name: str, why: str) -> None:
    """The 4 jobs of the list loaded again are as loaded: queued, attempt 0, with no
    result and no error, and all reservable."""
    new = _untouched(registered, list_name, 4)
    assert [(b["jid"], b["state"], b["att"], b.get("result"), b.get("err")) for b in new] == [
        (f"new{i}", "queued", 0, None, None) for i in range(4)
    ], why
    st = lists.status(list_name)
    assert (st.done, st.reservable) == (0, 4), why


def test_a_lease_on_a_dropped_list_never_acknowledges_the_list_loaded_again(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """A lease's ack is fenced by the job record as the lease read it (queued, never
    claimed, attempt 0): a list dropped and loaded again under the same name makes
    records just like that. A handler that finishes after the drop must not mark the
    new list's job of the same token done: that job would never run."""
    load(lists, list_name, 4)
    old = queue.reserve(list_name, session, 4, lease=True)
    assert all(j.lease is not None for j in old)
    thread, failed = _drop_and_load_again(lists, list_name, 4)
    time.sleep(1.5)  # the handlers were slow: the drop (and the new load) went on meanwhile
    queue.complete_many(old, ["old result"] * 4)
    queue.flush()
    thread.join(30)
    assert not thread.is_alive() and not failed, failed
    _new_jobs_untouched(registered, lists, list_name, "the new list's jobs were acknowledged by the dropped list's lease")


def test_a_dead_sessions_lease_on_a_dropped_list_never_claims_the_list_loaded_again(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """The reaper turns a dead session's leases into claims, fenced by the records as
    the lease read them: on a list dropped and loaded again it must not claim (and
    count an attempt of, and offer twice) the new list's jobs."""
    load(lists, list_name, 4)
    dead = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)
    assert len(queue.reserve(list_name, dead, 4, lease=True)) == 4
    thread, failed = _drop_and_load_again(lists, list_name, 4)
    time.sleep(1.5)
    reap(registered)  # (on a shared server, other tests' dead sessions too)
    thread.join(30)
    assert not thread.is_alive() and not failed, failed
    _new_jobs_untouched(registered, lists, list_name, "the reaper claimed the new list's jobs for the dropped list's lease")
    assert not lists.header(list_name).get("retry"), "the new jobs are in the token store: offered twice"


def _reaped_then_loaded_again(registered: Backend, lists: JobLists, list_name: str, holder: Session) -> None:
    """`holder` (a session without heartbeats) runs past its expiry and is reaped, its
    leases ended; then the list is dropped and loaded again with 4 new jobs."""
    time.sleep(0.5 + CLOCK_MARGIN_MS / 1000 + 0.3)
    reap(registered)
    assert registered.get(keys.SESS_SET, holder.id) is None, "the paused holder's session was not reaped"
    lists.drop(list_name, grace_s=0, lease_wait_s=5)
    lists.load(list_name, [JobSpec(f"new{i}", {"new": i}, None, None) for i in range(4)])


def test_a_holder_paused_past_its_reap_never_acknowledges_the_list_loaded_again(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """A holder paused (SIGSTOP, a long GC) past its session's end is reaped: its leases
    end, and a drop no longer waits for them. Resumed after the list was dropped and
    loaded again, its ack finds records just as its lease read them (queued, attempt
    0, never claimed) but of the new list: the list's stamp in the fence refuses it."""
    load(lists, list_name, 4)
    paused = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)
    old = queue.reserve(list_name, paused, 4, lease=True)
    assert all(j.lease is not None for j in old)
    _reaped_then_loaded_again(registered, lists, list_name, paused)
    assert sorted(j.token for j in queue.complete_many(old, ["old result"] * 4)) == [0, 1, 2, 3]
    queue.flush()
    _new_jobs_untouched(registered, lists, list_name, "the dropped list's lease acknowledged the new list's jobs")


def test_a_stalled_reaper_never_claims_the_list_loaded_again_for_the_leases_it_read(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """A reaper read a dead session's leases and stalled; another reaper ended them,
    and the list was dropped and loaded again. The stalled one's claims of those leases
    must not claim (count an attempt of, and offer twice) the new list's jobs."""
    load(lists, list_name, 4)
    dead = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)
    assert len(queue.reserve(list_name, dead, 4, lease=True)) == 4
    read_by_stalled = leases_of(registered, dead)
    _reaped_then_loaded_again(registered, lists, list_name, dead)
    assert claim_leases(registered, dead.id, read_by_stalled) == 0
    _new_jobs_untouched(registered, lists, list_name, "the stalled reaper claimed the new list's jobs")
    assert not lists.header(list_name).get("retry"), "the new jobs are in the token store: offered twice"


def test_a_reaper_whose_clock_runs_ahead_leaves_a_live_lease_to_its_end(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lease's end is the server's clock: a reaper (or a dropper) whose own clock runs
    ahead by more than the margin must not take a live lease for past its limit. Ended
    early, its holder's acks, in time by the server, came back lost and the jobs ran
    again as timed out."""
    load(lists, list_name, 4, timeout_s=5)
    jobs = queue.reserve(list_name, session, 4, lease=True)
    assert all(j.lease is not None for j in jobs)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 5 + 2 * CLOCK_MARGIN_MS / 1000)  # this host's clock only
    reap(registered)
    assert list(leases_of(registered, session)) == [jobs[0].rid], "a live lease was ended before its time limit"
    monkeypatch.setattr(time, "time", real)
    assert queue.complete_many(jobs, ["r"] * 4) == []
    for job in jobs:
        rec = record(registered, job)
        assert (rec["state"], rec["att"], rec.get("err")) == ("done", 1, None), job


def test_a_drop_forgets_leases_past_their_limit_and_waits_for_no_other(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 3, timeout_s=0.2)
    assert len(queue.reserve(list_name, session, 3, lease=True)) == 3
    time.sleep(0.2 + CLOCK_MARGIN_MS / 1000 + 0.1)  # no ack of the lease is admitted any more
    # Nothing else ends those leases: a drop that waited for them would give up after
    # `lease_wait_s`, raising, not return late (no bound on how long it took).
    assert lists.drop(list_name, grace_s=0, lease_wait_s=5).jobs == 3
    assert leases_of(registered, session) == {}


@pytest.mark.parametrize("per_job", [False, True], ids=["shared-result", "result-each"])
def test_leased_acks_that_landed_are_counted_when_another_stays_in_doubt(faulty: Backend, per_job: bool) -> None:
    """A batch of leased acks one of which stays in doubt raises `BackendTimeout`; the
    others landed, done in their records, and must be counted (their bits) and their
    lease settled: a session that closes is never reaped to recount them, and until a
    rare sweep the list showed them in flight, not done."""
    lists, queue = JobLists(faulty), Queue(faulty, busy_deadline_s=0.5)
    load(lists, "L", 5, seal=True)
    with Session.open(faulty) as s:
        jobs = queue.reserve("L", s, 5, lease=True)
        assert all(j.lease is not None for j in jobs)
        results = [{"ok": i} for i in range(5)] if per_job else [{"ok": True}] * 5
        # Job 0's ack times out every time (a node down), in the batch and sent again
        # alone (one result: the same operations); the other four land.
        for op in ("batch_write", "batch_operate"):
            faulty.client.faults.add(op=op, key="L/0", error="TimeoutError", times=-1)
        with pytest.raises(errors.BackendTimeout):
            queue.complete_many(jobs, results)
        assert faulty.client.faults.fired >= 1
        states = [r.bins["state"] for r in faulty.batch_get(keys.JOB_SET, [j.name for j in jobs])]
        assert states == ["queued", "done", "done", "done", "done"]
        faulty.client.faults.clear()
    st = JobLists(faulty).status("L")
    assert (st.done, st.in_flight) == (4, 0), st


def test_a_drop_with_no_reaper_running_ends_a_dead_sessions_lease(
    registered: Backend, store_url: str, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """Every worker died (nobody reaps), and the operator drops the list: the dead
    session's lease held the drop until the lease's time limit (5 minutes by default),
    then failed it. `JobLists.drop` says how to end it; the CLI's drop reaps first."""
    load(lists, list_name, 4)
    dead = Session.open(registered, interval_s=0.2, expiry_s=0.5, heartbeat=False)
    assert len(queue.reserve(list_name, dead, 4, lease=True)) == 4
    time.sleep(1.0)  # the session is expired: any reaper would end it
    with pytest.raises(errors.ListError, match=r"sessions still hold leases on 4 .* `aeroqueue reap` ends"):
        lists.drop(list_name, grace_s=0, lease_wait_s=0.5)
    out = CliRunner().invoke(main, ["--url", store_url, "drop", "--yes", "--json", list_name])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["jobs"] == 4
    assert registered.get(keys.SESS_SET, dead.id) is None, "reaped"


def test_a_reaper_running_while_a_session_closes_does_not_expire_its_leased_jobs(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, monkeypatch
) -> None:
    """A closing session turns its leases into claims, then releases them (the attempt
    refunded). The claims were made already past their limit, as a reaper makes them:
    a reaper running between the two expired them as overdue, an attempt counted, so
    that with one attempt allowed they died without ever running."""
    load(lists, list_name, 10, max_attempts=1)
    session = Session.open(registered)
    jobs = queue.reserve(list_name, session, 10, lease=True)
    assert len(jobs) == 10 and all(j.lease is not None for j in jobs)
    real_release = sessions.release_claims

    def reaper_first(*args: Any, **kwargs: Any) -> int:
        reap(registered)  # another worker's reaper, in the gap
        return real_release(*args, **kwargs)

    monkeypatch.setattr(sessions, "release_claims", reaper_first)
    session.close()
    recs = [record(registered, j) for j in jobs]
    assert [(r["state"], r["att"]) for r in recs] == [("queued", 0)] * 10, recs
    st = lists.status(list_name)
    assert (st.dead, st.retry_pending) == (0, 10)
    again = Session.open(registered)
    try:
        assert sorted(j.jid for j in queue.reserve(list_name, again, 10, lease=True)) == sorted(j.jid for j in jobs)
    finally:
        again.close()


def test_a_release_past_the_time_limit_counts_the_attempt_as_a_time_out(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """A release gives the attempt back only within the claim's (or lease's) time limit.
    Past it the attempt timed out, as the reaper would have ended it (beanstalkd and SQS:
    the job went back at the limit, counted); a release refunding it let a job that
    hangs its handler past the limit every time loop forever. Leased, the job was
    claimed afresh by the release and refunded; claimed, the release never looked at
    the limit. Whoever ends it, the timed-out attempt counts once: dead on the last."""
    load(lists, list_name, 26, timeout_s=0.5, backoff_s=0)
    last = f"{list_name}-1"
    load(lists, last, 4, timeout_s=0.5, backoff_s=0, max_attempts=1)
    holder = Session.open(registered)
    leased = queue.reserve(list_name, holder, 20, lease=True)
    claimed = queue.reserve(list_name, holder, 4)
    last_leased = queue.reserve(last, holder, 2, lease=True)
    last_claimed = queue.reserve(last, holder, 2)
    assert all(j.lease is not None for j in leased + last_leased) and all(j.lease is None for j in claimed + last_claimed)
    # In time: the attempt given back.
    assert queue.release(leased[0]) == queue.release(claimed[0]) == "released"
    assert queue.release(last_leased[0]) == queue.release(last_claimed[0]) == "released"
    time.sleep(0.5 + 0.3)
    late = [leased[1], claimed[1]]
    assert [queue.release(j, "given back late") for j in late] == ["released", "released"]
    assert [queue.release(j) for j in (last_leased[1], last_claimed[1])] == ["dead", "dead"]
    assert [queue.release(j, "given back late") for j in late] == ["released", "released"], "a repeat answers the same"
    for job in late:
        with pytest.raises(errors.ClaimLost):
            queue.complete(job, "too late")
    # The rest of the lease, given back by a close past its end: timed out too.
    assert holder.close() == 19 - 1 + 2
    expected = {j.name: 0 for j in (leased[0], claimed[0], last_leased[0], last_claimed[0])}
    expected |= {j.name: 1 for j in [*leased[1:], *claimed[1:], last_leased[1], last_claimed[1]]}
    for job in [*leased, *claimed, *last_leased, *last_claimed]:
        rec = record(registered, job)
        dead = job in (last_leased[1], last_claimed[1])
        assert (rec["state"], rec["att"]) == ("dead" if dead else "queued", expected[job.name]), (job, rec)
        assert "sess" not in rec and "result" not in rec, rec
    assert record(registered, leased[1])["err"] == "given back late"
    queue.flush()
    st, st_last = lists.status(list_name), lists.status(last)
    assert (st.done, st.dead, st.retry_pending + st.reservable, st.in_flight) == (0, 0, 26, 0)
    assert (st_last.dead, st_last.retry_pending + st_last.reservable, st_last.in_flight) == (2, 2, 0)
    # Nothing lost, each done once, the attempts as counted above plus this one.
    with Session.open(registered) as again:
        jobs = queue.reserve(list_name, again, 26)
        assert sorted(j.token for j in jobs) == list(range(26))
        assert queue.complete_many(jobs) == []
    queue.flush()
    for job in jobs:
        rec = record(registered, job)
        assert (rec["state"], rec["att"]) == ("done", expected.get(job.name, 0) + 1), (job, rec)
    assert lists.status(list_name).done == 26


@pytest.mark.parametrize("lease", [True, False])
def test_a_release_racing_the_reaper_past_the_limit_counts_the_attempt_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, lease: bool
) -> None:
    """Threads releasing jobs past their time limit while reapers end the same jobs as
    timed out: whichever wins, each job has its attempt counted once (neither refunded
    by the release nor counted twice), is offered again once, and runs to done once."""
    n = 40
    load(lists, list_name, n, timeout_s=0.5, backoff_s=0)
    holder = Session.open(registered)
    jobs = queue.reserve(list_name, holder, n, lease=lease)
    assert len(jobs) == n and all((j.lease is not None) == lease for j in jobs)
    time.sleep(0.5 + CLOCK_MARGIN_MS / 1000 + 0.2)
    outcomes: dict[str, str] = {}
    errs: list[BaseException] = []
    start = threading.Barrier(4)

    def releaser(part: list[Job]) -> None:
        try:
            start.wait()
            for job in part:
                outcomes[job.name] = queue.release(job)
        except BaseException as e:  # reported below
            errs.append(e)

    def reaper() -> None:
        try:
            start.wait()
            for _ in range(3):
                reap(registered)
        except BaseException as e:  # reported below
            errs.append(e)

    threads = [threading.Thread(target=releaser, args=(jobs[i::2],)) for i in range(2)]
    threads += [threading.Thread(target=reaper) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errs, errs
    assert set(outcomes.values()) <= {"released", "not held"}, outcomes
    for job in jobs:
        rec = record(registered, job)
        assert (rec["state"], rec["att"]) == ("queued", 1), (job, rec, outcomes[job.name])
        assert "sess" not in rec, rec
    retry = lists.header(list_name).get("retry") or []
    assert sorted(retry) == list(range(n)), "each offered again once"
    holder.close()
    with Session.open(registered) as again:
        redo = queue.reserve(list_name, again, n)
        assert sorted(j.token for j in redo) == list(range(n))
        assert queue.complete_many(redo) == []
    queue.flush()
    for job in jobs:
        rec = record(registered, job)
        assert (rec["state"], rec["att"]) == ("done", 2), (job, rec)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.in_flight, st.retry_pending) == (n, 0, 0, 0)
