"""A worker's releases under failure: each reserved job counted once, refunded when
it never started, and offered again. On every backend.

From a second read of the change that made a lost session give back the jobs it
never started: each test forces one interleaving (a hook or a held-up call) and
audits the counters and the job records."""

from __future__ import annotations

import threading
import time

from aeroqueue import keys
from aeroqueue.errors import BackendTimeout
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.worker import Worker
from tests.conftest import mark_reaping
from tests.sessions.test_worker import _outcomes, drained_with_a_job_running, fast_worker


def _lost_while(registered, w: Worker, reached: threading.Event, held: threading.Event, *,
                let_go_after_s: float | None = None) -> dict[str, int]:
    """Run `w` until `reached` (a hook in a chosen spot); then its session is lost (a
    reaper marked it) and the worker exits; `held` lets the hook go (after
    `let_go_after_s`, if given, else once the worker ran): its counters, threads ended."""
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        assert reached.wait(10)
        mark_reaping(registered, w.session.id)
        if let_go_after_s is not None:
            threading.Timer(let_go_after_s, held.set).start()
        t.join(30)
    finally:
        held.set()
    for th in w._threads:
        th.join(10)
    return w.counters.snapshot()


def test_a_lost_session_with_its_store_down_tries_one_release_not_one_per_job(registered, lists, list_name, monkeypatch):
    """Store down (each release waits out its deadline, 5 s; here 0.5 s), session lost:
    the drain tried every prefetched job's release again at the end, each in a call of
    its own, a deadline each (with 100 prefetched, minutes). One failure stops them
    (and its repeat at the end): the rest are counted unacked, for the close or a
    reaper to give back."""
    n = 12
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(n)], seal=True)
    started, go_on = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        go_on.wait(30)
        return "ok"

    calls = []

    def release(self, job, *a, **kw):
        calls.append(time.monotonic())
        time.sleep(0.5)
        raise BackendTimeout("store down (test)")

    monkeypatch.setattr(Queue, "release", release)  # nothing is released before the session is lost
    w = fast_worker(registered, handler, list_name, until_complete=False, batch=n)
    snap = _lost_while(registered, w, started, go_on)
    assert len(calls) == 2, f"{len(calls)} releases tried"  # the first, and its repeat at the end
    assert _outcomes(snap) == snap["reserved"], snap


def test_a_release_of_a_newer_claim_leaves_the_older_failed_one_to_be_counted(registered, lists, list_name, monkeypatch):
    """Claim 1's release lands but its answer is lost; the job comes back to this worker
    (claim 2), whose release succeeded and, the failed ones kept by job name, took
    claim 1's entry with it: claim 1 was counted nowhere. They are kept by claim."""
    lists.load(list_name, [JobSpec("j0", {})], max_attempts=5, seal=True)
    fails = {"complete": 2, "release": 1}
    real_complete, real_release = Queue.complete, Queue.release

    def complete(self, job, *a, **kw):
        if fails["complete"]:
            fails["complete"] -= 1
            raise BackendTimeout("ack lost (test)")
        return real_complete(self, job, *a, **kw)

    def release(self, job, *a, **kw):
        st = real_release(self, job, *a, **kw)
        if fails["release"]:
            fails["release"] -= 1
            raise BackendTimeout("answer lost after the release landed (test)")
        return st

    monkeypatch.setattr(Queue, "complete", complete)
    monkeypatch.setattr(Queue, "release", release)
    w = fast_worker(registered, lambda job: "ok", list_name, batch=1, ack_linger_s=0, reap_every_s=0.2)
    w.run(install_signals=False)
    snap = w.counters.snapshot()
    assert registered.get(keys.JOB_SET, keys.job_name(list_name, 0)).bins["state"] == "done"
    assert _outcomes(snap) == snap["reserved"], snap


def test_a_renewal_failing_as_a_lost_sessions_drain_counts_its_job_counts_it_once(
        registered, lists, list_name, monkeypatch):
    """A thread renews a prefetched job's claim (touch) as the session is lost: the
    drain counts it unacked; the touch then fails with a store error, and the release
    that follows counted it again."""
    lists.load(list_name, [JobSpec("j0", {}), JobSpec("j1", {})], timeout_s=2.0, seal=True)
    in_touch, go = threading.Event(), threading.Event()
    real_touch = Queue.touch

    def touch(self, job, *a, **kw):
        if job.jid == "j1":
            in_touch.set()
            go.wait(20)
            raise BackendTimeout("touch timed out (test)")
        return real_touch(self, job, *a, **kw)

    def handler(job: Job) -> str:
        if job.jid == "j0":
            time.sleep(0.8)  # j1 waits in the prefetch past a quarter of its limit
        return "ok"

    monkeypatch.setattr(Queue, "touch", touch)
    w = fast_worker(registered, handler, list_name, until_complete=False, batch=2, ack_linger_s=0)
    real_stop_runners = w._stop_runners

    def stop_runners():  # called right after the drain counted `running` unacked
        go.set()
        time.sleep(1.0)  # the thread's release runs now, before the close
        real_stop_runners()

    w._stop_runners = stop_runners
    snap = _lost_while(registered, w, in_touch, go)
    assert _outcomes(snap) == snap["reserved"], snap


def test_a_reservation_returning_as_a_lost_session_drains_is_refunded_and_counted(
        registered, lists, list_name, monkeypatch):
    """A reservation that had left `claiming` but not reached its thread's loop was
    not waited for by the lost session's drain: the close gave its jobs back charged
    (with one attempt: dead, never run), and the thread's own release, finding the
    session closed, counted them nowhere. Held up a moment (a descheduled thread),
    they are refunded and counted."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], max_attempts=1, seal=True)
    in_reserve, go = threading.Event(), threading.Event()
    real_reserve = Worker._reserve

    def slow_return(self, session, name):
        got = real_reserve(self, session, name)
        if got:
            in_reserve.set()
            go.wait(20)  # descheduled between the claim and the loop's top
        return got

    monkeypatch.setattr(Worker, "_reserve", slow_return)
    w = fast_worker(registered, lambda job: "ok", list_name, until_complete=False, batch=3)
    snap = _lost_while(registered, w, in_reserve, go, let_go_after_s=1.5)
    states = [registered.get(keys.JOB_SET, keys.job_name(list_name, i)).bins for i in range(3)]
    assert _outcomes(snap) == snap["reserved"], snap
    assert all(b["state"] == "queued" for b in states), states


def test_a_release_repeated_at_the_end_is_known_as_a_repeat_and_its_job_offered(
        registered, lists, list_name, monkeypatch):
    """The drain's release of a prefetched job lands and its follow-up (the push onto
    the retry store) fails. Repeated at the end under another reason, the UDF did not
    take it for a repeat ('not held'): the push was never redone, the job queued and
    offered to nobody until a sweep, and counted lost though it was released."""
    from aeroqueue import transitions

    lists.load(list_name, [JobSpec("j0", {}), JobSpec("j1", {})], seal=True)
    real_after = transitions.after_fail
    fail = {"n": 1}

    def after_fail(backend, list_name_, token, outcome, *a, **kw):
        if token == 1 and outcome == "released" and fail["n"]:
            fail["n"] -= 1
            raise BackendTimeout("push_retry in doubt (test)")
        return real_after(backend, list_name_, token, outcome, *a, **kw)

    with drained_with_a_job_running(registered, list_name, 2) as w:
        monkeypatch.setattr(transitions, "after_fail", after_fail)
    snap = w.counters.snapshot()
    st = lists.status(list_name)
    j1 = registered.get(keys.JOB_SET, keys.job_name(list_name, 1)).bins
    assert (j1["state"], j1["att"]) == ("queued", 0), j1
    assert snap["released"] == 1 and snap["lost"] == 0, snap
    assert st.reservable + st.retry_pending == 1, "j1 offered again"


def test_a_lost_session_whose_store_fails_once_still_refunds_every_job_it_never_started(
        registered, lists, list_name, monkeypatch):
    """One failed release stopped the others; the end tried none again, and the close
    gave them all back charged: with one attempt allowed, dead, never run."""
    n = 6
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(n)], max_attempts=1, seal=True)
    started, go_on = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        go_on.wait(30)
        return "ok"

    real_release, failed = Queue.release, []

    def release(self, job, *a, **kw):
        if not failed:
            failed.append(job.jid)
            raise BackendTimeout("a blip (test)")
        return real_release(self, job, *a, **kw)

    monkeypatch.setattr(Queue, "release", release)
    w = fast_worker(registered, handler, list_name, until_complete=False, batch=n)
    snap = _lost_while(registered, w, started, go_on)
    assert failed, "the test's failure happened"
    assert _outcomes(snap) == snap["reserved"], snap
    never_ran = [registered.get(keys.JOB_SET, keys.job_name(list_name, t)).bins for t in range(1, n)]
    assert [(b["state"], b["att"]) for b in never_ran] == [("queued", 0)] * (n - 1), never_ran


def test_a_live_drain_whose_releases_fail_counts_each_job_once(registered, lists, list_name, monkeypatch):
    """The drain's releases of the prefetched jobs fail, and their repeat at the end too:
    they were counted unacked there, then released by the close and counted again."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(4)], seal=True)
    real_release, fails = Queue.release, {"n": 4}  # the drain's three, and the end's first repeat

    def release(self, job, *a, **kw):
        if fails["n"]:
            fails["n"] -= 1
            raise BackendTimeout("a blip (test)")
        return real_release(self, job, *a, **kw)

    with drained_with_a_job_running(registered, list_name, 4) as w:
        monkeypatch.setattr(Queue, "release", release)
    snap = w.counters.snapshot()
    assert fails["n"] == 0, "the test's failures happened"
    assert _outcomes(snap) == snap["reserved"] == 4, snap
    assert (snap["done"], snap["released"]) == (1, 3), snap
