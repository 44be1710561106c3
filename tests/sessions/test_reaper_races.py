"""Reapers racing each other on every store: every worker runs one, and so does
`aeroqueue reap`, so two often end the same claims at once; and racing a holder
that ends its own claims as its session is reaped. Each job they give back must
wait once in the retry store (counted waiting once, and offered once), and every
job must be done exactly once in the end."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from aeroqueue import errors, keys, sessions
from aeroqueue.backends import Backend, open_backend
from aeroqueue.errors import ClaimLost
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import ReapReport, Session, expire_overdue, reap
from aeroqueue.worker import EXIT_SESSION_LOST, Worker
from tests.conftest import mark_reaping

N = 30


def _at_once(*passes: Callable[[], ReapReport]) -> list[ReapReport]:
    """Run each pass in a thread of its own, all let go at the same moment."""
    start = threading.Barrier(len(passes))
    out: list[Any] = [None] * len(passes)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = passes[i]()
        except BaseException as e:  # reported by the assertion below
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(passes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(r, ReapReport) for r in out), out
    return out


def _expiries_noted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """From now on, each `expire_overdue` call's (session, claims it ended)."""
    ended: list[tuple[str, int]] = []
    expire = sessions.expire_overdue

    def noted(backend: Backend, session_id: str, *args: Any, **kw: Any) -> int:
        n = expire(backend, session_id, *args, **kw)
        ended.append((session_id, n))
        return n

    monkeypatch.setattr(sessions, "expire_overdue", noted)
    return ended


def _states(backend: Backend, list_name: str) -> Counter[str]:
    recs = backend.batch_get(keys.JOB_SET, keys.job_names(list_name, list(range(N))))
    return Counter(r.bins["state"] for r in recs)


def _waits_once(lists: JobLists, list_name: str) -> None:
    """Every job is queued, and in the retry store exactly once; status counts each once."""
    assert _states(lists.backend, list_name) == {"queued": N}
    retry = Counter(lists.header(list_name)["retry"])
    assert sorted(retry) == list(range(N)) and set(retry.values()) == {1}, \
        f"retry store: {sorted(t for t, n in retry.items() if n > 1)} twice, {N - len(retry)} missing"
    st = lists.status(list_name)
    assert (st.retry_pending, st.in_flight, st.reservable, st.delayed) == (N, 0, 0, 0), st


def _reserve_all(queue: Queue, session: Session, list_name: str) -> list[int]:
    tokens: list[int] = []
    give_up = time.monotonic() + 30
    while len(tokens) < N and time.monotonic() < give_up:
        tokens += [j.token for j in queue.reserve(list_name, session, N - len(tokens))]
    assert sorted(tokens) == list(range(N)), "a job handed out twice, or not at all"
    return tokens


def _drain(queue: Queue, lists: JobLists, backend: Backend, list_name: str) -> None:
    """Every job handed out once more and done, once; the list complete."""
    # Claimed under the lists' short time limits, a loaded machine's 30 acks could
    # outlast them (ClaimLost): the limit under test is the races', not this drain's.
    lists.tune(list_name, timeout_s=300)
    with Session.open(backend) as worker:
        for job in queue.reserve(list_name, worker, N):
            queue.complete(job, None)
        assert queue.reserve(list_name, worker, N) == [], "a job offered again after it was done"
    st = lists.status(list_name)
    assert (st.done, st.complete, st.retry_pending, st.in_flight) == (N, True, 0, 0), st
    assert _states(backend, list_name) == {"done": N}


def test_two_reapers_ending_the_same_overdue_claims_offer_each_job_once(
    registered, lists, queue, store_url, list_name, monkeypatch,
):
    """The claims of a live session past their time limit, ended by two reapers at
    once (`expire_overdue`). Each call has the same session and error: the job UDF
    answered the second as a repeat of the first, and both pushed the job. Round
    after round the retry store held each job twice, `status` counted the copy left
    behind as waiting while the job ran again (in flight 70 of 100), and the reports
    counted every timeout twice."""
    # A time limit the reservations below outlast on a loaded machine, not only a
    # reaper's pass: every claim is in flight when the round looks.
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(N)], timeout_s=1.0, backoff_s=0, max_attempts=10,
               seal=True)
    # Another live session's overdue claims, as an earlier test may leave on a shared
    # server: the reaps end them too, so their reports count more than this list's N.
    others = f"{list_name}-others"
    lists.load(others, [JobSpec(f"o{i}", {}) for i in range(3)], timeout_s=1.0, backoff_s=0, max_attempts=10,
               seal=True)
    ended = _expiries_noted(monkeypatch)
    reapers = [open_backend(store_url) for _ in range(2)]
    holder = Session.open(registered, interval_s=0.2, expiry_s=30)  # alive all along
    other = Session.open(registered, heartbeat=False, expiry_s=60)
    try:
        for _ in range(3):
            _reserve_all(queue, holder, list_name)
            st = lists.status(list_name)
            assert (st.in_flight, st.retry_pending) == (N, 0), st
            assert len(queue.reserve(others, other, 3)) == 3
            ended.clear()
            time.sleep(1.2)  # past the time limit
            reports = _at_once(*(lambda b=b: reap(b) for b in reapers))
            # Each of the holder's timeouts counted once, by one reaper or the other.
            assert sum(n for sid, n in ended if sid == holder.id) == N, (ended, reports)
            assert sum(r.timed_out for r in reports) >= N + 3, reports
            _waits_once(lists, list_name)
    finally:
        holder.close(release=False)
        other.close(release=False)
        for b in reapers:
            b.close()
    _drain(queue, lists, registered, list_name)


def test_two_reapers_taking_up_the_same_dead_session_offer_each_job_once(registered, lists, queue, store_url, list_name):
    """A dead session already 'reaping' (a reaper took it, or died half-way) is reaped
    by every reaper that finds it so: two at once each release its claims (its leases
    turned into claims first), and each offered again every claim the other had
    released, under the same session and error."""
    reapers = [open_backend(store_url) for _ in range(2)]
    try:
        for r in range(3):
            name = f"{list_name}-{r}"
            lists.load(name, [JobSpec(f"j{i}", {}) for i in range(N)], backoff_s=0, max_attempts=10, seal=True)
            dead = Session.open(registered, heartbeat=False)
            held = queue.reserve(name, dead, N // 2) + queue.reserve(name, dead, N - N // 2, lease=True)
            assert len(held) == N and any(j.lease is not None for j in held)
            mark_reaping(registered, dead.id)
            _at_once(*(lambda b=b: reap(b) for b in reapers))
            assert registered.get(keys.SESS_SET, dead.id) is None
            _waits_once(lists, name)
            _drain(queue, lists, registered, name)
    finally:
        for b in reapers:
            b.close()


def test_a_reaper_recounting_while_another_has_yet_to_push_offers_each_job_once(
    registered, lists, queue, store_url, list_name, monkeypatch,
):
    """Reaper A released a dead session's claims and has not pushed them yet (its
    pass ends with the push) when reaper B takes up the same reap: B's release pass
    finds no claim, and its recount finds the session's jobs queued and in no store,
    so it offers them. Then A pushed them too: each job waited twice."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(N)], backoff_s=0, max_attempts=10, seal=True)
    dead = Session.open(registered, heartbeat=False)
    assert len(queue.reserve(list_name, dead, N)) == N
    mark_reaping(registered, dead.id)
    a, b = (open_backend(store_url) for _ in range(2))
    b_done = threading.Event()
    find = a.find

    def find_then_wait(set_name: str, *args: Any, **kwargs: Any) -> Any:
        yield from find(set_name, *args, **kwargs)
        if (set_name, *args[:2]) == (keys.JOB_SET, "sess", dead.id) and not b_done.is_set():
            assert b_done.wait(60), "reaper B never finished"  # A's pass is over; its push is next

    monkeypatch.setattr(a, "find", find_then_wait)

    def reap_b() -> ReapReport:
        time.sleep(0.5)  # A's release pass first: it is 30 jobs, a few ms
        try:
            return reap(b)
        finally:
            b_done.set()

    try:
        _at_once(lambda: reap(a), reap_b)
    finally:
        a.close()
        b.close()
    assert registered.get(keys.SESS_SET, dead.id) is None
    _waits_once(lists, list_name)
    _drain(queue, lists, registered, list_name)


def test_a_reaper_recounting_while_another_has_yet_to_push_an_overdue_claim_offers_it_once(
    registered, lists, queue, store_url, list_name, monkeypatch,
):
    """Reaper A ends a live session's claims past their time limit (`expire_overdue`)
    and the session dies meanwhile: reaper B reaps it, and its recount finds a job A
    ended and has yet to push, queued and in no store, so it offers it; then A pushed
    it too, and the job waited twice. A's expire offers as a release pass does:
    marked first (`off`), so that one of them offers it."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(N)], timeout_s=0.3, backoff_s=0, max_attempts=10,
               seal=True)
    holder = Session.open(registered, heartbeat=False)
    assert len(queue.reserve(list_name, holder, N)) == N
    time.sleep(0.5)  # past the time limit
    a, b = (open_backend(store_url) for _ in range(2))
    a_ended, b_done = threading.Event(), threading.Event()
    udf = a.udf

    def push_after_b(set_name: str, name: str, module: str, function: str, *args: Any, **kwargs: Any) -> Any:
        if (set_name, function) == (keys.LIST_SET, "push_retry") and not b_done.is_set():
            a_ended.set()  # a claim ended, its job not pushed yet
            assert b_done.wait(60), "reaper B never finished"
        return udf(set_name, name, module, function, *args, **kwargs)

    monkeypatch.setattr(a, "udf", push_after_b)

    def reap_b() -> ReapReport:
        try:
            assert a_ended.wait(60), "reaper A never ended a claim"
            mark_reaping(registered, holder.id)  # the session died: B takes it up
            return reap(b)
        finally:
            b_done.set()

    try:
        _at_once(lambda: ReapReport(0, 0, expire_overdue(a, holder.id)), reap_b)
    finally:
        a.close()
        b.close()
    assert registered.get(keys.SESS_SET, holder.id) is None
    _waits_once(lists, list_name)
    _drain(queue, lists, registered, list_name)


def _end(queue: Queue, job: Job, how: str) -> str:
    """The holder's own end of its claim, as a worker makes it."""
    if how == "fail":
        return queue.fail(job, "boom")
    if how == "expire":
        return queue.expire(job)
    return queue.release(job, "worker draining")


@pytest.mark.parametrize("how", ["fail", "expire", "release"])
def test_a_holder_ending_its_claim_while_its_session_is_reaped_offers_the_job_once(
    registered, lists, queue, store_url, list_name, monkeypatch, how,
):
    """A holder's own fail, expire (its handler ran past the limit) or release lands,
    and the holder stops (SIGSTOP, a GC pause) before its push, past its session's
    expiry: a reaper takes the session up, finds the job no longer claimed, and its
    recount finds it queued, ended by the session and in no store, so it offers it.
    Then the holder resumed and pushed it too: the job waited twice, and ran while
    its copy was counted waiting. Marked offered in the transition itself, it is
    left to the holder."""
    # A short limit only for the expire (past it, by design): a fail past it is 'late'
    # (refused), and a loaded machine may take 0.3 s from the reservation to it.
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(N)], timeout_s=0.3 if how == "expire" else 300,
               backoff_s=0, max_attempts=10, seal=True)
    holder_backend, reaper = open_backend(store_url), open_backend(store_url)
    holder = Session.open(holder_backend, heartbeat=False)
    mine = Queue(holder_backend)
    jobs = mine.reserve(list_name, holder, N)
    assert len(jobs) == N
    if how == "expire":
        time.sleep(0.5)  # past the time limit
    ended, reaped = threading.Event(), threading.Event()
    udf = holder_backend.udf

    def push_after_reap(set_name: str, name: str, module: str, function: str, *args: Any, **kwargs: Any) -> Any:
        if (set_name, function) == (keys.LIST_SET, "push_retry") and not reaped.is_set():
            ended.set()  # the holder's transition landed; its push is next
            assert reaped.wait(60), "the reaper never finished"
        return udf(set_name, name, module, function, *args, **kwargs)

    monkeypatch.setattr(holder_backend, "udf", push_after_reap)
    outcomes: list[str] = []

    def hold() -> ReapReport:
        for job in jobs:
            try:
                outcomes.append(_end(mine, job, how))
            except ClaimLost:
                outcomes.append("lost")
        return ReapReport(0, 0)

    def reap_it() -> ReapReport:
        try:
            assert ended.wait(60), "the holder never ended a claim"
            mark_reaping(registered, holder.id)  # past its expiry: a reaper takes it
            return reap(reaper)
        finally:
            reaped.set()

    try:
        reports = _at_once(hold, reap_it)
    finally:
        holder_backend.close()
        reaper.close()
    # The first job ended by its holder, the others released by the reaper.
    assert outcomes[0] in ("retry", "released") and set(outcomes[1:]) <= {"lost", "not held"}, outcomes
    assert reports[1].released >= N - 1, reports  # more: others' sessions left on a shared server
    assert registered.get(keys.SESS_SET, holder.id) is None
    _waits_once(lists, list_name)
    _drain(queue, lists, registered, list_name)


def test_a_holder_releasing_with_a_reapers_words_is_not_taken_for_its_repeat(registered, lists, queue, list_name):
    """A reaper released a session's claims ('session expired', the attempt kept); the
    holder, resumed, releases one the same way. The job UDF took that for a repeat of
    its own call (same session, error and claim) and answered 'released': the holder
    pushed the job the reaper had pushed already. The holder's call has an id of its
    own: only its own repeat answers so."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(N)], backoff_s=0, max_attempts=10, seal=True)
    # Sessions another test left expired, as on a shared server: the reap releases their claims too.
    others = f"{list_name}-others"
    lists.load(others, [JobSpec(f"o{i}", {}) for i in range(3)], backoff_s=0, max_attempts=10, seal=True)
    for _ in range(3):
        left = Session.open(registered, heartbeat=False)
        assert len(queue.reserve(others, left, 1)) == 1
        mark_reaping(registered, left.id)
    holder = Session.open(registered, heartbeat=False)
    jobs = queue.reserve(list_name, holder, N)
    assert len(jobs) == N
    mark_reaping(registered, holder.id)
    assert reap(registered).released >= N + 3  # every claim of the holder's (counted below) and the others'
    assert lists.status(others).retry_pending == 3
    assert {queue.release(job, "session expired", refund=False) for job in jobs} == {"not held"}
    _waits_once(lists, list_name)
    _drain(queue, lists, registered, list_name)


def test_a_worker_whose_session_is_lost_mid_acknowledgement_offers_the_job_before_it_exits(
    registered, lists, store_url, list_name, monkeypatch,
):
    """A worker's failure of a job landed, and before its push the session was reaped
    (the process was stopped past its expiry). The reaper's recount leaves the job to
    its holder (marked offered with the failure), but the worker, finding its session
    lost, exited without waiting for the thread that was acknowledging: the process
    ended before the push, and the job waited in no store, for a sweep."""
    lists.load(list_name, [JobSpec("j0", {})], backoff_s=0, max_attempts=10, seal=True)
    mine, reaper = open_backend(store_url), open_backend(store_url)

    def handler(job: Job) -> None:
        raise RuntimeError("boom")

    w = Worker(mine, handler, [list_name], interval_s=0.1, expiry_s=1.0, idle_s=0.05, reap_every_s=60,
               ack_linger_s=0)
    go = threading.Event()  # the worker waits for acknowledgements under way, or is gone
    reaped: list[ReapReport] = []
    udf = mine.udf

    def reaped_before_push(set_name: str, name: str, module: str, function: str, *args: Any, **kwargs: Any) -> Any:
        # This list's: the worker's own reaper may push others' jobs (a shared server).
        if (set_name, name, function) == (keys.LIST_SET, list_name, "push_retry") and not reaped:
            assert w.session is not None
            mark_reaping(registered, w.session.id)  # stopped past its expiry: a reaper takes it
            reaped.append(reap(reaper))
            assert go.wait(60), "the worker never stopped"
        return udf(set_name, name, module, function, *args, **kwargs)

    monkeypatch.setattr(mine, "udf", reaped_before_push)
    await_acks = getattr(w, "_await_acks", None)

    def awaiting(give_up: float) -> None:
        go.set()
        if await_acks is not None:
            await_acks(give_up)

    monkeypatch.setattr(w, "_await_acks", awaiting, raising=False)  # absent: nothing waited for
    try:
        assert w.run(install_signals=False) == EXIT_SESSION_LOST
        retry = lists.header(list_name).get("retry") or []
    finally:
        go.set()
        reaper.close()
        mine.close()
    assert reaped, "the worker's failure was never pushed"
    assert w.session is not None and registered.get(keys.SESS_SET, w.session.id) is None
    assert retry == [0], f"retry store {retry} as the worker exited"
    bins = registered.get(keys.JOB_SET, keys.job_name(list_name, 0)).bins
    assert (bins["state"], bins["att"]) == ("queued", 1), bins


def test_of_two_reapers_passing_a_dead_session_only_the_one_that_deletes_it_ended_it(registered, monkeypatch):
    """A reaper whose scan finds a session 'reaping' (another reaper's pass half done)
    runs the pass too, and both count it reaped. A worker sweeps the whole job set
    after a reap that ended a session (jobs the dead one took and never claimed), so
    only the reaper whose delete removed the record says it ended it (`ended`): one
    scan per dead session, not one per reaper that passed it."""
    first, second = Session.open(registered, heartbeat=False), Session.open(registered, heartbeat=False)
    mark_reaping(registered, first.id)  # another reaper took it up...
    real_recount = sessions.recount_session

    def other_reaper_ends_it(backend: Backend, session_id: str) -> int:
        if session_id == first.id:
            registered.remove(keys.SESS_SET, first.id)  # ...and ends its pass while ours runs
        return real_recount(backend, session_id)

    monkeypatch.setattr(sessions, "recount_session", other_reaper_ends_it)
    mark_reaping(registered, second.id)  # and one this reaper ends alone
    report = reap(registered)
    assert report.sessions >= 2  # the shared server may hold other tests' dead sessions too
    assert report.ended == report.sessions - 1, report
    assert registered.get(keys.SESS_SET, first.id) is None and registered.get(keys.SESS_SET, second.id) is None


def test_a_reap_pass_costs_the_same_whatever_the_number_of_live_sessions(
    registered, lists, queue, store_url, list_name, monkeypatch,
):
    """On every reaper's pass (every worker's, every half expiry) each live session's
    claims were read with an index query of their own, and its leases' server clock
    with a read of its record: N workers sent N x N of each a pass. Now one query of
    the claims index finds every claim past its limit, and a lease's clock is read
    only when the lease may be past its own. Those claims are still ended, each
    session's, with the index and without it (a store registered before it)."""
    fresh, short = f"{list_name}-fresh", f"{list_name}-short"
    lists.load(fresh, [JobSpec(f"f{i}", {}) for i in range(130)], timeout_s=600, seal=True)
    lists.load(short, [JobSpec(f"s{i}", {}) for i in range(12)], timeout_s=1.0, backoff_s=0, max_attempts=10,
               seal=True)
    reaper = open_backend(store_url)
    opened: list[Session] = []

    def more_sessions(n: int) -> None:
        # Live, each holding a fresh lease and a fresh claim: nothing for a reap to end.
        for _ in range(n):
            s = Session.open(registered, heartbeat=False, expiry_s=120)
            opened.append(s)
            assert len(queue.reserve(fresh, s, 20, lease=True)) == 20
            assert len(queue.reserve(fresh, s, 1)) == 1

    def pass_cost() -> int:
        # The least of two passes: a session left by an earlier test, reaped in one of
        # them, costs that pass more.
        costs = []
        for _ in range(2):
            before = reaper.round_trips
            reap(reaper)
            costs.append(reaper.round_trips - before)
        return min(costs)

    try:
        more_sessions(1)
        reap(reaper)
        one = pass_cost()
        more_sessions(5)
        six = pass_cost()
        assert six - one < 5, (one, six)  # per session it was two round trips: 10 more

        # Claims past their limit, two sessions' each, ended in one pass.
        ended = _expiries_noted(monkeypatch)
        for use_index in (True, False):
            if not use_index:
                def no_index(*_args: Any, **_kw: Any) -> Any:
                    raise errors.BackendError("AEROSPIKE_ERR_INDEX_NOT_FOUND (Aerospike code 201)", code=201)

                monkeypatch.setattr(reaper, "find_between", no_index)
            held = {s.id: [j.jid for j in queue.reserve(short, s, 3)] for s in opened[:2]}
            assert all(len(v) == 3 for v in held.values()), held
            time.sleep(1.3)
            ended.clear()
            report = reap(reaper)
            assert {sid: n for sid, n in ended if sid in held} == {sid: 3 for sid in held}, (use_index, ended)
            assert report.timed_out >= 6, report
            for jids in held.values():
                for jid in jids:
                    assert lists.find_job(short, jid)["state"] == "queued", (use_index, jid)
    finally:
        for s in opened:
            s.close()
        reaper.close()
