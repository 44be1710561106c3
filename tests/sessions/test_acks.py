"""The worker's batched acknowledgements (aeroqueue.acks) and its prefetch sized to
the handlers' pace: fewer round trips, and the same guarantees as one ack at a
time. Real worker processes and SIGKILL for the crash case; every job audited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from aeroqueue import keys
from aeroqueue.acks import AckBatcher
from aeroqueue.backends import open_backend
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from aeroqueue.worker import DEFAULT_PREFETCH, EXIT_OK, PREFETCH_MAX, Worker, prefetch_for
from tests.waiting import wait_for

N_JOBS = 300


def _worker(backend, list_name, **kw) -> Worker:
    opts = {"interval_s": 0.2, "expiry_s": 2.0, "idle_s": 0.05, "until_complete": True}
    opts.update(kw)
    return Worker(backend, lambda job: job.payload["n"] + 1, [list_name], **opts)


def _audit_done_once(lists, list_name: str, n: int, session_id: str | None = None) -> None:
    jobs = list(lists.jobs(list_name))
    assert len(jobs) == n
    for rec in jobs:
        assert rec["state"] == "done", rec
        assert rec["result"] == rec["payload"]["n"] + 1, rec
        if session_id is not None:
            assert rec["by"] == session_id, rec
    status = lists.status(list_name)
    assert (status.done, status.in_flight, status.dead) == (n, 0, 0)


@pytest.mark.parametrize("linger_s", [0.005, 0.0], ids=["batched", "one-by-one"])
def test_batched_acks_take_a_fraction_of_the_round_trips(store_url, lists, list_name, linger_s):
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(N_JOBS)], seal=True)
    backend = open_backend(store_url)  # its own counter of round trips
    try:
        # No reaping or sweeping: on a shared server they would also count the calls
        # that clean up after other tests' dead sessions. (--until-complete checks on
        # the reap cadence, so the test stops the worker itself once all is done.)
        w = _worker(backend, list_name, ack_linger_s=linger_s, reap_every_s=3600, sweep_every_s=3600,
                    until_complete=False)
        trips0 = backend.round_trips
        code: list[int] = []
        runner = threading.Thread(target=lambda: code.append(w.run(install_signals=False)))
        runner.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and w.counters.snapshot()["done"] < N_JOBS:
            time.sleep(0.05)
        w.request_stop()
        runner.join(60)
        assert code == [EXIT_OK]
        trips = backend.round_trips - trips0
    finally:
        backend.close()
    assert w.counters.snapshot()["done"] == N_JOBS
    _audit_done_once(lists, list_name, N_JOBS, w.session.id if w.session else None)
    if linger_s:
        # Acks in batches, reservations sized to the quick handler: far under one call per job.
        assert trips < N_JOBS / 3, trips
    else:
        assert trips >= N_JOBS, trips  # one ack per job, at least


def test_prefetch_follows_the_handlers_pace():
    assert prefetch_for(None) == DEFAULT_PREFETCH
    assert prefetch_for(0.0) == PREFETCH_MAX
    assert prefetch_for(0.005) == 4
    assert prefetch_for(10.0) == 1


def test_a_fixed_prefetch_is_kept(registered, list_name):
    w = _worker(registered, list_name, batch=3)
    w._pace[list_name] = 0.0
    assert w.prefetch(list_name) == 3
    w = _worker(registered, list_name)
    w._pace[list_name] = 0.0
    assert w.prefetch(list_name) == PREFETCH_MAX


def test_the_prefetch_follows_each_lists_own_pace(registered, list_name):
    """A list of long jobs, beside one of quick jobs, was reserved at the quick one's
    pace: up to PREFETCH_MAX long jobs in one thread's hands, run one after another."""
    quick, slow, new = list_name, f"{list_name}-slow", f"{list_name}-new"
    w = _worker(registered, list_name)
    w._pace.update({quick: 0.0, slow: 60.0})
    assert (w.prefetch(quick), w.prefetch(slow), w.prefetch(new)) == (PREFETCH_MAX, 1, DEFAULT_PREFETCH)
    w._following([quick])  # the others no longer followed: their pace goes with them
    assert w._pace == {quick: 0.0}


def test_an_ack_whose_claim_was_lost_is_reported_lost_and_changes_nothing(registered, lists, queue: Queue, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(4)], seal=True)
    mine = Session.open(registered, heartbeat=False)
    other = Session.open(registered, heartbeat=False)
    try:
        jobs = queue.reserve(list_name, mine, 4)
        assert len(jobs) == 4
        # Job 0's claim is given back and taken by another session before the ack goes.
        assert queue.release(jobs[0], "test") == "released"
        theirs = queue.reserve(list_name, other, 1)
        assert [j.token for j in theirs] == [jobs[0].token]
        outcomes: dict[int, str] = {}
        acks = AckBatcher(queue, lambda job, outcome, _: outcomes.__setitem__(job.token, outcome), linger_s=5.0)
        for job in jobs:
            assert acks.add(job, "mine")
        assert acks.waiting() == 4
        assert acks.close(30.0)
        assert outcomes == {jobs[0].token: "lost", **{j.token: "done" for j in jobs[1:]}}
        rec = registered.get(keys.JOB_SET, jobs[0].name).bins
        assert (rec["state"], rec["sess"]) == ("claimed", other.claim_id()), "another session's claim is untouched"
        for job in jobs[1:]:
            rec = registered.get(keys.JOB_SET, job.name).bins
            assert (rec["state"], rec["result"], rec["by"]) == ("done", "mine", mine.claim_id())
    finally:
        mine.close()
        other.close()


def test_a_flush_sends_at_once_whatever_the_linger(registered, lists, queue: Queue, list_name):
    """`flush` (and so a worker's drain) sends what is pending at once, even with a
    linger longer than the host has been up (monotonic time counts from boot: a
    fresh container's clock read 360 s while a 600 s linger made a drain wait for
    its 30 s deadline)."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(5)], seal=True)
    s = Session.open(registered, heartbeat=False)
    try:
        jobs = queue.reserve(list_name, s, 5)
        outcomes: list[str] = []
        gate = threading.Event()

        class HeldQueue(Queue):
            def complete_many(self, *args, **kwargs):
                gate.wait(30)  # the first batch is still on its way when the flush comes
                return super().complete_many(*args, **kwargs)

        acks = AckBatcher(HeldQueue(registered), lambda job, outcome, _: outcomes.append(outcome),
                          linger_s=time.monotonic() + 3600, max_jobs=2)
        for job in jobs:
            acks.add(job, 1)  # two go at once (and wait at the gate); three more wait behind them
        threading.Timer(0.3, gate.set).start()
        # More than a batch pending at the flush: the batches after the next are due at once too.
        # Behind the linger (an hour) they would still be pending when the flush gives up.
        assert acks.flush(60.0), "the pending acks were not sent"
        assert outcomes == ["done"] * 5
        assert all(registered.get(keys.JOB_SET, j.name).bins["state"] == "done" for j in jobs)
        assert acks.close(20.0)
    finally:
        s.close()


@pytest.mark.parametrize("pending_at_flush", [0, 2])
def test_acks_added_after_a_flush_go_within_their_linger(registered, lists, queue: Queue, list_name, pending_at_flush):
    """A flush marks the pending batch due at once; with nothing left, later acks wait
    their linger again. The mark had stayed when a flush found nothing pending: later
    acks then woke no one, and waited for close (past their claims' limits)."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(5)], seal=True)
    with Session.open(registered, heartbeat=False) as s:
        jobs = queue.reserve(list_name, s, 5)
        outcomes: list[str] = []
        acks = AckBatcher(queue, lambda job, outcome, _: outcomes.append(outcome), linger_s=0.05)
        for job in jobs[:pending_at_flush]:
            acks.add(job, None)
        assert acks.flush(10.0)
        time.sleep(0.2)  # the sending thread is back to waiting for acks
        for job in jobs[pending_at_flush:]:
            acks.add(job, None)
        wait_for("the acks added after the flush to be sent", lambda: len(outcomes) == 5, 5.0)
        assert outcomes == ["done"] * 5
        assert acks.close(5.0)


def test_acks_added_after_a_flush_that_timed_out_still_go(registered, lists, queue: Queue, list_name):
    """A flush that gave up while a batch was on its way leaves the next batch marked
    due at once: an ack added after it must still wake the sending thread."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(2)], seal=True)
    gate = threading.Event()

    class HeldQueue(Queue):
        def complete_many(self, *args, **kwargs):
            gate.wait(30)
            return super().complete_many(*args, **kwargs)

    with Session.open(registered, heartbeat=False) as s:
        first, second = queue.reserve(list_name, s, 2)
        outcomes: list[str] = []
        acks = AckBatcher(HeldQueue(registered), lambda job, outcome, _: outcomes.append(outcome), linger_s=0.05)
        acks.add(first, None)
        wait_for("the first batch to be on its way", lambda: acks.waiting() == 1 and not acks._pending, 5.0)
        assert not acks.flush(0.1), "the flush gives up: the batch is held"
        gate.set()
        wait_for("the first ack to be sent", lambda: outcomes == ["done"], 5.0)
        time.sleep(0.2)  # the sending thread is back to waiting for acks
        acks.add(second, None)
        wait_for("the ack added after the flush to be sent", lambda: outcomes == ["done", "done"], 5.0)
        assert acks.close(5.0)


@pytest.mark.parametrize("lease", [False, True], ids=["claimed", "leased"])
def test_a_result_too_big_in_a_batch_is_sent_alone_and_the_rest_reported_done(
    registered, lists, queue: Queue, list_name, lease
):
    """complete_many names the too-big jobs once the others are decided: only those go
    again alone (to the caller's too_big), not every ack of the batch."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(16)], seal=True)
    with Session.open(registered, heartbeat=False) as s:
        jobs = queue.reserve(list_name, s, 16, lease=lease)
        outcomes: dict[str, str] = {}
        too_big: list[str] = []
        whys: list[str] = []
        acks = AckBatcher(queue, lambda job, outcome, _: outcomes.__setitem__(job.jid, outcome),
                          linger_s=0.05, too_big=lambda job, why, _: (too_big.append(job.jid), whys.append(why)))
        completes = []
        real_complete = queue.complete
        queue.complete = lambda job, result=None: (completes.append(job.jid), real_complete(job, result))[1]
        for i, job in enumerate(jobs):
            acks.add(job, "x" * (2 << 20) if i == 3 else i)
        assert acks.flush(20.0)
        assert too_big == ["j3"] and completes == ["j3"]
        # What the worker records on the job: the sizes and what to do, not the store's code.
        size, limit = f"{(2 << 20) + 2:,}", f"{registered.max_record_size():,}"
        assert whys[0].startswith(f"the handler's result is too big to store: it is {size} bytes of JSON"), whys
        assert f"max-record-size is {limit} bytes" in whys[0] and "return a reference" in whys[0], whys
        assert outcomes == {j.jid: "done" for j in jobs if j.jid != "j3"}
        assert acks.close(5.0)


def test_a_failing_too_big_callback_holds_back_no_other_ack(registered, lists, queue: Queue, list_name):
    """The too-big callback is the caller's code: when it raises, the batch's other
    acks are still reported, and the sending thread goes on to later ones."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(5)], seal=True)
    with Session.open(registered, heartbeat=False) as s:
        jobs = queue.reserve(list_name, s, 5)
        outcomes: dict[str, str] = {}

        def broken(job, why, context):
            raise RuntimeError("a bug in the caller's callback")

        acks = AckBatcher(queue, lambda job, outcome, _: outcomes.__setitem__(job.jid, outcome),
                          linger_s=0.05, too_big=broken)
        for i, job in enumerate(jobs[:4]):
            acks.add(job, "x" * (2 << 20) if i == 0 else i)
        assert acks.flush(20.0)
        assert outcomes == {"j0": "failed", "j1": "done", "j2": "done", "j3": "done"}
        acks.add(jobs[4], None)
        assert acks.flush(10.0) and outcomes["j4"] == "done"
        assert acks.close(5.0)


def test_a_lost_session_sends_none_of_its_pending_acks(registered, lists, queue: Queue, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(3)], seal=True)
    s = Session.open(registered, heartbeat=False)
    try:
        jobs = queue.reserve(list_name, s, 3)
        outcomes: list[str] = []
        lost = [False]
        acks = AckBatcher(queue, lambda job, outcome, _: outcomes.append(outcome), linger_s=5.0, lost=lambda: lost[0])
        for job in jobs:
            acks.add(job, 1)
        lost[0] = True  # the heartbeat found the session gone while the acks waited
        assert acks.close(30.0)
        assert outcomes == ["unacked"] * 3
        assert all(registered.get(keys.JOB_SET, j.name).bins["state"] == "claimed" for j in jobs)
    finally:
        s.close()


HANDLER = """
import os
def handle(job):
    with open(os.environ["AQ_RAN"], "a") as f:
        f.write(job.jid + "\\n")
    return job.payload["n"] + 1
"""


def _start_worker(store_url: str, list_name: str, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "AQ_RAN": str(tmp_path / "ran.txt")}
    return subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler", "acks_handler:handle",
         "--list", list_name, "--heartbeat", "0.2", "--expiry", "2", "--log-format", "text", *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _every_handler_run_with_acks_pending(store_url, lists, list_name, tmp_path: Path, n: int):
    """A worker CLI process over `n` jobs with a linger of 10 minutes (and fewer jobs
    than a batch: no ack leaves), once every handler has run: (process, the file
    of the jobs run)."""
    (tmp_path / "acks_handler.py").write_text(textwrap.dedent(HANDLER))
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(n)], seal=True)
    ran = tmp_path / "ran.txt"
    proc = _start_worker(store_url, list_name, tmp_path, "--ack-linger", "600000")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not ran.exists() or len(ran.read_text().split()) < n):
        if proc.poll() is not None:
            raise AssertionError(f"the worker exited: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    if not ran.exists() or len(ran.read_text().split()) != n:
        proc.kill()
        raise AssertionError("not every handler ran once in the worker")
    return proc, ran


def test_a_worker_killed_with_acks_pending_loses_no_job(store_url, registered, lists, list_name, tmp_path: Path):
    """Acks still waiting in a worker's batcher when it is SIGKILLed were never sent:
    those jobs stay claimed by its dead session, come back when it is reaped, and
    run again; every job ends done exactly once."""
    n = 40
    first, ran = _every_handler_run_with_acks_pending(store_url, lists, list_name, tmp_path, n)
    try:
        status = lists.status(list_name)
        assert (status.done, status.in_flight) == (0, n), "its acks were all still pending"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    second = _start_worker(store_url, list_name, tmp_path, "--until-complete")
    try:
        _, err = second.communicate(timeout=120)
    finally:
        if second.poll() is None:
            second.kill()
    assert second.returncode == EXIT_OK, err[-2000:]
    _audit_done_once(lists, list_name, n)
    runs = Counter(ran.read_text().split())
    assert runs == Counter({f"j{i}": 2 for i in range(n)}), "each job ran once per worker: at least once, never lost"


def test_a_worker_stopped_with_acks_pending_sends_them_before_it_exits(store_url, registered, lists, list_name, tmp_path: Path):
    """SIGTERM drains: the acks waiting in the batcher go out before the session closes."""
    n = 30
    w, ran = _every_handler_run_with_acks_pending(store_url, lists, list_name, tmp_path, n)
    try:
        assert lists.status(list_name).done == 0, "no ack left before the stop"
        w.send_signal(signal.SIGTERM)
        _, err = w.communicate(timeout=60)
    finally:
        if w.poll() is None:
            w.kill()
    assert w.returncode == EXIT_OK, err[-2000:]
    _audit_done_once(lists, list_name, n)
    assert Counter(ran.read_text().split()) == Counter({f"j{i}": 1 for i in range(n)})


def test_a_drain_waits_out_an_ack_in_doubt_rather_than_give_back_a_job_that_succeeded(registered, lists, list_name):
    """The drain gave the acks still being sent one second past its deadline, then
    closed the session, which gave back every claim it held as never run, attempt
    refunded: a job whose handler had succeeded, its ack slow (a store in doubt, which
    an ack is sent again through for `Queue.busy_deadline_s`), went back and ran
    again, and with one attempt allowed it did so at every stop, for ever. The acks
    now get at least their time in doubt."""
    lists.load(list_name, [JobSpec("a", {})], seal=True, timeout_s=60, max_attempts=1)
    ran = threading.Event()

    def handler(job) -> str:
        ran.set()
        return "ok"

    w = Worker(registered, handler, [list_name], concurrency=1, interval_s=0.1, expiry_s=3.0, idle_s=0.05,
               drain_timeout_s=0.5, ack_linger_s=0.005)
    complete_many = w.queue.complete_many

    def slow_complete_many(jobs, results=None):
        time.sleep(2.5)  # in doubt for a while, well within the ack's time in doubt
        return complete_many(jobs, results)

    w.queue.complete_many = slow_complete_many  # type: ignore[method-assign]
    runner = threading.Thread(target=w.run, kwargs={"install_signals": False})
    runner.start()
    assert ran.wait(10)
    wait_for("the ack under way", lambda: w._acking, 10, step_s=0.01)
    w.request_stop()  # SIGTERM's doing
    runner.join(30)
    assert not runner.is_alive()
    job = registered.get(keys.JOB_SET, keys.job_name(list_name, 0)).bins
    assert (job["state"], job["att"]) == ("done", 1), job
    assert w.counters.snapshot()["done"] == 1 and w.counters.snapshot().get("released", 0) == 0, w.counters.snapshot()


def test_job_outcomes_are_counted_once_each(registered, lists, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(50)], seal=True)
    w = _worker(registered, list_name, concurrency=3)
    assert w.run(install_signals=False) == EXIT_OK
    counts = w.counters.snapshot()
    assert (counts["done"], counts["lost"], counts["unacked"]) == (50, 0, 0)
    _audit_done_once(lists, list_name, 50)


def test_an_ack_goes_before_its_claim_ends_whatever_the_linger(registered, lists, queue: Queue, list_name):
    """A linger longer than the jobs' time limit (--ack-linger 30000 --timeout 2)
    held acks past their claims' end: refused, the jobs ran again and some ended
    dead though every handler succeeded. An ack is due before its claim's deadline."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(10)], timeout_s=2.0, max_attempts=2, seal=True)
    w = Worker(registered, lambda job: job.payload["n"] + 1, [list_name], interval_s=0.1, expiry_s=2.0, idle_s=0.05,
               until_complete=True, reap_every_s=0.2, ack_linger_s=30.0, concurrency=2)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(w.run(install_signals=False)))
    t.start()
    t.join(30)
    if t.is_alive():
        w.request_stop()
        t.join(60)
    assert result == [EXIT_OK]
    snap = w.counters.snapshot()
    assert (snap["done"], snap["lost"], snap["dead"], snap["retried"]) == (10, 0, 0, 0), snap
    _audit_done_once(lists, list_name, 10)


def test_an_unexpected_store_error_fails_its_acks_and_the_sending_thread_goes_on(registered, lists, queue: Queue, list_name):
    """An error that is not an AeroqueueError out of the store (sqlite3's "database or
    disk is full" at an embedded store's COMMIT is not translated, nor is a bug in a
    client) killed the sending thread: the batch's acks were never reported, every
    later ack waited for ever, and `flush()` without a timeout hung."""
    import sqlite3

    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(4)], seal=True)
    failures = [1]

    class FaultyQueue(Queue):
        def complete_many(self, *args, **kwargs):
            if failures[0]:
                failures[0] -= 1
                raise sqlite3.OperationalError("database or disk is full")
            return super().complete_many(*args, **kwargs)

        def complete(self, job, result=None):
            if failures[0]:
                failures[0] -= 1
                raise sqlite3.OperationalError("database or disk is full")
            return super().complete(job, result)

    with Session.open(registered, heartbeat=False) as s:
        jobs = queue.reserve(list_name, s, 4)
        outcomes: dict[str, str] = {}
        acks = AckBatcher(FaultyQueue(registered), lambda job, outcome, _: outcomes.__setitem__(job.jid, outcome),
                          linger_s=0.05)
        for job in jobs[:2]:
            acks.add(job, 1)
        assert acks.flush(10.0), "the acks of the failed batch were never reported"
        assert set(outcomes) == {"j0", "j1"} and set(outcomes.values()) <= {"done", "failed"}, outcomes
        failures[0] = 1  # an ack sent alone fails the same way
        acks.add(jobs[2], 1)
        assert acks.flush(10.0), "the sending thread died"
        for job in jobs[3:]:
            acks.add(job, 1)
        assert acks.flush(10.0), "the sending thread died"
        assert outcomes["j3"] == "done"
        assert acks.close(5.0)



@pytest.mark.parametrize("mix", ["two leases", "a lease and two claims"])
def test_acks_that_landed_count_though_a_later_call_of_the_batch_failed(registered, lists, queue, list_name,
                                                                        monkeypatch, mix):
    """One `complete_many` of jobs held under two leases (or a lease and two claims)
    sends a call each. When the second failed plainly (no more connections, say) after
    the first landed, the call raised with the first's jobs done but neither counted nor
    settled: the list could not complete until a sweep recounted them, and a caller
    failing them got ClaimLost. Now those count at once; a claim's failed call goes to
    the UDF, job by job, as one in doubt does."""
    from aeroqueue import errors, hotpath

    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(6)], seal=True)
    with Session.open(registered) as s:
        first = queue.reserve(list_name, s, 2, lease=True)
        if mix == "two leases":
            second = queue.reserve(list_name, s, 2, lease=True)
        else:
            second = queue.reserve(list_name, s, 1) + queue.reserve(list_name, s, 1)
        real, sent = hotpath._send_group, []

        def send_group(*args, **kwargs):
            sent.append(args[1])
            if len(sent) == 2:
                raise errors.BackendError("no more connections (the test's)", code=-7)
            return real(*args, **kwargs)

        monkeypatch.setattr(hotpath, "_send_group", send_group)
        if mix == "two leases":
            with pytest.raises(errors.BackendError, match="the test's"):
                queue.complete_many(first + second)
            assert lists.status(list_name).done == 2, "the acks that landed count at once"
        else:
            assert queue.complete_many(first + second) == []
            assert lists.status(list_name).done == 4
        monkeypatch.undo()
        assert len(sent) == 2, sent
        # Sent again, every ack is taken once ('again' for those that landed).
        assert queue.complete_many(first + second) == []
        rest = queue.reserve(list_name, s, 10)
        assert len(rest) == 2 and queue.complete_many(rest) == []
    st = lists.status(list_name)
    assert (st.done, st.in_flight, st.complete) == (6, 0, True), st
