"""The worker loop and the API-handler path, on every backend."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aeroqueue import errors, keys
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import Session
from aeroqueue.worker import EXIT_OK, EXIT_SESSION_LOST, Worker, load_handler, process_one, run_job
from tests.conftest import mark_reaping
from tests.sessions import signal_tripwire
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def fast_worker(backend, handler, list_name, **kw) -> Worker:
    opts = {"interval_s": 0.1, "expiry_s": 1.0, "idle_s": 0.05, "until_complete": True}
    opts.update(kw)
    return Worker(backend, handler, [list_name], **opts)


def test_worker_runs_every_job_and_stores_results(registered, lists, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(40)], seal=True)
    w = fast_worker(registered, lambda job: job.payload["n"] * 2, list_name, concurrency=3, batch=4)
    assert w.run(install_signals=False) == EXIT_OK
    assert w.counters.snapshot()["done"] == 40
    for t in range(40):
        assert registered.get(keys.JOB_SET, keys.job_name(list_name, t)).bins["result"] == t * 2
    assert registered.get(keys.SESS_SET, w.session.id) is None, "the session is closed"


def test_handler_exception_fails_the_job_with_traceback_then_dead(registered, lists, list_name):
    lists.load(list_name, [JobSpec("ok", {}), JobSpec("bad", {})], max_attempts=3, seal=True)

    def handler(job: Job) -> str:
        if job.jid == "bad":
            raise ValueError(f"cannot handle {job.jid} (attempt {job.attempt})")
        return "fine"

    w = fast_worker(registered, handler, list_name)
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert (snap["done"], snap["retried"], snap["dead"]) == (1, 2, 1)
    bad = registered.get(keys.JOB_SET, keys.job_name(list_name, 1)).bins
    assert bad["state"] == "dead" and bad["att"] == 3
    assert bad["err"].startswith("ValueError: cannot handle bad (attempt 3)") and "Traceback" in bad["err"]
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (1, 1, True)


def test_drain_finishes_in_flight_and_releases_the_rest(registered, lists, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(20)], seal=True)
    started = threading.Event()
    ran: list[str] = []

    def slow(job: Job) -> None:
        started.set()
        time.sleep(0.3)
        ran.append(job.jid)

    w = fast_worker(registered, slow, list_name, batch=5, until_complete=False)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    assert started.wait(10)
    w.request_stop()
    t.join(30)
    assert not t.is_alive()
    snap = w.counters.snapshot()
    assert snap["done"] == len(ran) >= 1, "the job in flight was finished and acknowledged"
    assert snap["released"] == snap["reserved"] - snap["done"] >= 1, "reserved but unstarted jobs were given back"
    st = lists.status(list_name)
    assert (st.done, st.in_flight, st.reservable + st.retry_pending) == (len(ran), 0, 20 - len(ran))


def test_a_lost_session_stops_work_acks_nothing_and_exits_non_zero(registered, lists, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(5)], seal=True)
    holding = threading.Event()
    go_on = threading.Event()

    def handler(job: Job) -> str:
        holding.set()
        go_on.wait(10)
        return "late"

    # Jobs prefetched behind the running one (the default takes one until the pace is known).
    w = fast_worker(registered, handler, list_name, until_complete=False, batch=4)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    assert holding.wait(10)
    # A reaper took the session away (as after a long pause): mark it reaping.
    mark_reaping(registered, w.session.id)
    deadline = time.monotonic() + 5
    while not w.session.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    go_on.set()
    t.join(30)
    assert w.session.lost
    # run() returns without waiting for a lost session's handlers; the one woken
    # above returns meanwhile. Every job it reserved is counted once: the running one
    # unacked; those prefetched behind it, never started, released with their
    # attempts refunded (given back by the close, each was charged one: with one
    # attempt allowed, dead unrun).
    for thread in w._threads:
        thread.join(10)
    # (Released, or lost if a reaper, this worker's own taking up the half-done reap,
    # gave them back first, their attempts counted.)
    snap = w.counters.snapshot()
    assert snap["reserved"] > 1, snap
    assert (snap["done"], snap["unacked"]) == (0, 1), snap
    assert snap["released"] + snap["lost"] == snap["reserved"] - 1, snap
    held = registered.get(keys.JOB_SET, keys.job_name(list_name, 0)).bins
    # Nothing acknowledged: the job is given back (its attempt counted), not done.
    assert held["state"] == "queued" and "result" not in held and held["att"] == 1
    prefetched = [registered.get(keys.JOB_SET, keys.job_name(list_name, t)).bins for t in range(1, snap["reserved"])]
    assert all(b["state"] == "queued" for b in prefetched), prefetched
    assert [b["att"] for b in prefetched].count(0) == snap["released"], "each released one refunded"
    assert lists.status(list_name).done == 0


def test_worker_exit_code_on_lost_session(registered, lists, list_name):
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    w = fast_worker(registered, lambda job: time.sleep(0.5), list_name, until_complete=False)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(w.run(install_signals=False)))
    t.start()
    while w.session is None:
        time.sleep(0.01)
    registered.remove(keys.SESS_SET, w.session.id)  # reaped and deleted
    t.join(30)
    assert result == [EXIT_SESSION_LOST]


def test_api_handler_path_one_job_per_request(registered, lists, list_name):
    """A web handler: a shared per-process session, one job per request."""
    lists.load(list_name, [JobSpec(f"r{i}", {"i": i}) for i in range(3)], seal=True)
    queue = Queue(registered)
    with Session.open(registered, interval_s=0.2, expiry_s=1.0) as session:
        outcomes = [process_one(queue, list_name, session, lambda job: {"served": job.jid}) for _ in range(4)]
    assert outcomes == ["done", "done", "done", None]
    assert lists.status(list_name).complete


def test_run_job_reports_a_lost_claim(registered, lists, list_name):
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    queue = Queue(registered)
    with Session.open(registered, heartbeat=False) as a, Session.open(registered, heartbeat=False) as b:
        [job] = queue.reserve(list_name, a)

        def handler(j: Job) -> str:
            queue.release(j)  # meanwhile the job was given back and taken by b
            queue.reserve(list_name, b)
            return "too late"

        assert run_job(queue, job, handler, a) == "lost"


def test_load_handler_errors():
    assert load_handler("json:dumps") is __import__("json").dumps
    for bad in ("json", "json:", ":dumps", "no_such_module_x:f", "json:no_such_function"):
        with pytest.raises(errors.ConfigError):
            load_handler(bad)


@pytest.mark.parametrize(("attr", "what"), [
    ("dumps", None),
    ("decoder", "a module (<module 'json.decoder'"),
    ("__all__", "a list (['dump', 'dumps', 'load', 'loads', 'JSONDecoder', 'JSONDe...)"),  # cut short
    ("__builtins__", "a dict ("),
])
def test_a_handler_that_exists_but_is_not_a_function_is_said_to_be_what_it_is(attr, what):
    """It said "json has no function 'decoder'": the name is there, only not callable."""
    if what is None:
        assert load_handler(f"json:{attr}") is __import__("json").dumps
        return
    with pytest.raises(errors.ConfigError) as got:
        load_handler(f"json:{attr}")
    assert str(got.value).startswith(f"handler 'json:{attr}': json.{attr} is not a function: it is {what}"), got.value
    assert "has no function" not in str(got.value)
    with pytest.raises(errors.ConfigError) as missing:
        load_handler("json:no_such_function")
    assert str(missing.value) == "handler 'json:no_such_function': json has no function 'no_such_function'"


@pytest.mark.parametrize(("source", "line", "what"), [
    ('import os\nTOKEN = os.environ["AQ_TEST_UNSET_VAR"]\ndef h(job):\n    return 1\n', 2, "KeyError"),
    ("def h(job):\n    return 1\nLIMIT = 1 / 0\n", 3, "ZeroDivisionError"),
])
def test_a_handler_module_that_fails_to_import_is_named_with_its_file_and_line(tmp_path, monkeypatch, source, line,
                                                                                 what):
    """Its error, not aeroqueue's: it was reported as an internal error to report."""
    module = f"aq_handler_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.ConfigError) as got:
        load_handler(f"{module}:h")
    assert str(got.value) == f"handler '{module}:h': importing '{module}' raised {what}: " + (
        "'AQ_TEST_UNSET_VAR'" if what == "KeyError" else "division by zero") + f" ({module}.py, line {line})"


def test_a_handler_module_not_found_says_where_it_was_looked_for_and_one_it_imports_does_not(tmp_path, monkeypatch):
    """A handler module not found said only "No module named 'myapp'": the worker
    imports it from the current directory and PYTHONPATH, which a user started
    elsewhere did not know. A module the handler's own module imports is its error."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.ConfigError) as got:
        load_handler("aq_no_such_pkg.jobs:send")
    assert str(got.value) == ("handler 'aq_no_such_pkg.jobs:send': cannot import 'aq_no_such_pkg.jobs' (No module "
                              f"named 'aq_no_such_pkg'); looked in the current directory ({tmp_path}) and PYTHONPATH")
    module = f"aq_handler_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("import aq_missing_dependency\ndef h(job):\n    return 1\n")
    with pytest.raises(errors.ConfigError) as dependency:
        load_handler(f"{module}:h")
    assert "No module named 'aq_missing_dependency'" in str(dependency.value)
    assert "looked in" not in str(dependency.value)


def test_an_until_complete_worker_finishes_a_dead_loaders_range_rather_than_wait_for_a_sweep(
    registered, lists, list_name, caplog
):
    """A loader SIGKILLed mid-range leaves the range pending: every published job done
    and the list sealed, it is not complete until the range is finished. A worker
    --until-complete waited for a sweep (every 300 s) with no word; it finishes the
    range itself once the loader's lease has run out, and runs its jobs."""
    lists.load(list_name, [JobSpec(f"j{i}", {"n": i}) for i in range(4)])
    # A loader allocates tokens 4..9 (a lease already run out), writes three of its six
    # jobs, and dies.
    got = registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "alloc", 6, 0)
    assert got["st"] == "ok" and got["start"] == 4
    for i, t in enumerate(range(4, 7)):
        registered.put(keys.JOB_SET, keys.job_name(list_name, t), {
            "list": list_name, "token": t, "jid": f"dead-{i}", "payload": {"n": t}, "state": "queued", "att": 0,
            "max_att": 5, "c": lists.status(list_name).created,
        })
        registered.put(keys.JIDX_SET, keys.jidx_name(list_name, f"dead-{i}"), {"tok": t})
    lists.seal(list_name)
    assert lists.status(list_name).pending_ranges == 1
    ran: list[str] = []
    w = fast_worker(registered, lambda job: ran.append(job.jid), list_name, sweep_every_s=3600)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(w.run(install_signals=False)))
    with caplog.at_level(logging.INFO, logger="aeroqueue"):
        thread.start()
        thread.join(30)
        if thread.is_alive():
            w.request_stop()
            thread.join(30)
    assert codes == [EXIT_OK] and not thread.is_alive()
    assert sorted(ran) == sorted([f"j{i}" for i in range(4)] + [f"dead-{i}" for i in range(3)])
    st = lists.status(list_name)
    assert (st.total, st.done, st.pending_ranges, st.complete) == (7, 7, 0, True)
    assert any(getattr(r, "event", None) == "load_recovered" for r in caplog.records)


def test_worker_needs_a_list(registered):
    with pytest.raises(errors.ConfigError):
        Worker(registered, lambda j: None, [])


def test_a_timed_out_threads_prefetched_jobs_go_back_without_taking_another_threads_hold(registered, lists, list_name):
    """The watchdog gives a stuck thread's prefetched jobs back one release at a time.
    One released early may be reserved at once by another thread: the releases must
    not then end that thread's hold on it, or the orphan check gives its live claim
    away and the job runs twice. (A slow release widens the window, as a slow store
    or a long prefetch would.)"""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True, timeout_s=2, backoff_s=0)
    runs: dict[str, int] = {}
    stuck: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> str:
        # One reservation took all three (batch=3): the first to run holds the other
        # two back, whichever order they came in.
        with lock:
            runs[job.jid] = runs.get(job.jid, 0) + 1
            first = not stuck
            if first:
                stuck.append(job.jid)
        if first:
            time.sleep(4.5)  # past its 2 s limit: the watchdog retires this thread
            return "late"
        job.touch(30)
        time.sleep(1.5)  # long enough for several orphan checks (0.2 s apart)
        return "ok"

    w = fast_worker(registered, handler, list_name, concurrency=2, batch=3, reap_every_s=0.2, expiry_s=3.0)
    release = w.queue.release

    def slow_release(job: Job, *args, **kw) -> str:
        out = release(job, *args, **kw)
        time.sleep(0.3)
        return out

    w.queue.release = slow_release  # type: ignore[method-assign]
    assert w.run(install_signals=False) == EXIT_OK
    assert runs == {jid: 2 if jid in stuck else 1 for jid in ("j0", "j1", "j2")}, runs
    given_back = []
    for token in range(3):
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, token)).bins
        assert rec["state"] == "done", rec
        if rec["jid"] not in stuck:
            given_back += [e["err"] for e in rec.get("errs", [])]
    # Given back unstarted, they say why (a loaded machine's reaper may end the stuck
    # claim first, and a thread start the others before the watchdog's turn).
    assert all(e == f"not started: job {stuck[0]!r} ahead of it ran past its time limit" for e in given_back), given_back


def test_a_job_failed_and_reserved_again_by_another_thread_keeps_that_threads_hold(
    registered, lists, list_name, caplog
):
    """A job failed with attempts left and no backoff is back in the retry store at
    once, and another thread of the same worker may reserve it (behind a job of its
    own) before the failing thread is done with its copy. That thread, forgetting the
    job by its name, ended the other's hold and claim time: the orphan check then gave
    the live claim away (an attempt spent, the job not run), and the job ran twice. A
    slow `fail` widens the window, as a loaded host would. Three threads, two jobs
    each: A fails its first and sleeps on its second; C fails its first once A's is
    back, and dawdles after the push; B reserves C's failed job again behind A's."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(6)], seal=True, timeout_s=30, backoff_s=0,
               max_attempts=5)
    a_pushed, c_pushed = threading.Event(), threading.Event()
    runs: list[tuple[str, int, str]] = []
    lock = threading.Lock()
    roles: dict[str, str] = {}
    seen: dict[str, int] = {}
    firsts: dict[str, str] = {}
    barrier = threading.Barrier(3)
    failed_first: dict[str, str] = {}  # role -> the job it failed

    def handler(job: Job) -> str:
        me = threading.current_thread().name
        with lock:
            runs.append((job.jid, job.attempt, me))
            n = seen[me] = seen.get(me, 0) + 1
            if n == 1:
                firsts[me] = job.jid
        if n == 1:
            barrier.wait(10)  # every thread holds its first reservation (two jobs each)
            with lock:
                if not roles:  # by the jobs they hold: A the first two, C the next, B the last
                    for role, t in zip("ACB", sorted(firsts, key=lambda t: int(firsts[t][1:])), strict=True):
                        roles[t] = role
        role = roles[me]
        if job.attempt > 1:
            if job.jid == failed_first.get("A"):  # ahead of C's job in B's reservation
                time.sleep(3.0)
            return "ok"
        if role in "AC" and n == 1:
            failed_first[role] = job.jid
            if role == "C":
                a_pushed.wait(10)
            raise RuntimeError("first attempt fails")
        if role in "AC":
            time.sleep(8)
        else:  # B: done with both its jobs once C's failed job is back in the retry store
            c_pushed.wait(10)
        return "ok"

    w = Worker(registered, handler, [list_name], concurrency=3, batch=2, interval_s=0.1, expiry_s=3.0,
               reap_every_s=0.2, idle_s=0.05, until_complete=True)
    fail = w.queue.fail

    def slow_fail(job: Job, error: str) -> str:
        st = fail(job, error)  # back in the retry store now
        if job.jid == failed_first.get("A"):
            a_pushed.set()
        if job.jid == failed_first.get("C"):
            c_pushed.set()
            time.sleep(1.0)  # before the failing thread is done with its copy
        return st

    w.queue.fail = slow_fail  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="aeroqueue"):
        assert w.run(install_signals=False) == EXIT_OK
    events = [(getattr(r, "event", None), getattr(r, "jid", None)) for r in caplog.records]
    c = failed_first["C"]
    assert ("orphan_released", c) not in events, "a live prefetched claim was given away by the orphan check"
    assert [a for jid, a, _ in runs if jid == c] == [1, 2], f"{c} ran again more than once after its failure: {runs}"
    assert sorted(jid for jid, _, _ in runs if jid != c) == sorted(
        [f"j{i}" for i in range(6) if f"j{i}" != c] + [failed_first["A"]]), runs
    for i in range(6):
        bins = registered.get(keys.JOB_SET, keys.job_name(list_name, i)).bins
        failed = bins["jid"] in failed_first.values()
        assert (bins["state"], bins["att"]) == ("done", 2 if failed else 1), bins


def test_a_worker_that_cannot_open_its_session_gives_the_signal_handlers_back(registered, list_name, monkeypatch):
    """`run` installs its SIGTERM/SIGINT handlers, then opens its session: when the open
    failed (the store down at start), the handlers stayed the dead worker's. A host
    program that goes on (or retries) then ignored SIGTERM and Ctrl-C for ever: each
    only set that worker's stop flag."""
    import signal

    def refuse(*args, **kwargs):
        raise errors.BackendTimeout("the store did not answer")

    monkeypatch.setattr(Session, "open", refuse)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    w = fast_worker(registered, lambda job: None, list_name)
    with pytest.raises(errors.BackendTimeout):
        w.run()
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.parametrize("how", ["cli", "api"])
def test_sigterm_while_the_main_thread_holds_the_stop_events_lock_drains(registered, lists, list_name, store_url, how):
    """Python runs a signal handler on the main thread between two of its bytecodes:
    inside `Event.set()` or `.wait()` on the worker's stop Event, that thread holds
    the Event's lock, which is not reentrant. A handler that set the Event there
    waited for that lock for ever: the chaos test's worker that began its drain on
    its own (`_stopping.set()`) as the test's SIGTERM came never exited. Here the
    signal is raised at that moment on purpose (tests/sessions/signal_tripwire.py)."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(5)], seal=True)
    done = signal_tripwire.run(how, store_url, list_name, what=f"the worker ({how})")
    assert done.returncode == EXIT_OK, done.stderr[-2000:]
    err = done.stderr
    if how == "cli":
        events = [json.loads(line).get("event") for line in err.splitlines() if line.startswith("{")]
        assert "draining" in events and events[-1] == "stopped", events


@contextmanager
def running(w: Worker) -> Iterator[None]:
    """`w` runs in a thread for the block; then it is asked to stop, and has stopped."""
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        yield
    finally:
        w.request_stop()
        t.join(30)
    assert not t.is_alive(), "the worker did not stop"


def test_a_sweep_that_fails_runs_again_a_reap_interval_later_not_at_every_tick(registered, lists, list_name,
                                                                                monkeypatch):
    """A sweep that raises (a scan refused while partitions migrate) is tried again
    after a reap interval. Retried at the maintenance loop's next tick (0.2 s), every
    worker scanned the job set five times a second for as long as the store failed;
    and a node's failure sets reaps off, and with them sweeps, in many workers at once."""
    from aeroqueue import worker as worker_module

    calls: list[float] = []

    def failing_sweep(*_: object, **__: object) -> None:
        calls.append(time.monotonic())
        raise errors.BackendError("partition unavailable (a test's sweep)")

    monkeypatch.setattr(worker_module, "sweep", failing_sweep)
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    # A sweep due within a second, and reaps every second: the retry's interval.
    w = fast_worker(registered, lambda job: None, list_name, expiry_s=2.0, interval_s=0.2, reap_every_s=1.0,
                    sweep_every_s=1.0, until_complete=False)
    with running(w):
        wait_for("three sweeps", lambda: len(calls) >= 3)  # two or three seconds
    assert len(calls) >= 3, calls
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # At least 0.8 s (a reap interval, less its 20% jitter); at every tick they were 0.2 s.
    assert min(gaps) >= 0.75, gaps


def test_a_long_sweep_does_not_hold_back_the_reaps_and_renewals(registered, lists, list_name, monkeypatch):
    """A sweep scans the job set of every unfinished list: seconds on a big store. Run
    in the maintenance thread, it held back the reaps, the renewals of prefetched jobs'
    time limits and the handlers' watchdog meanwhile (seen in a one-server test run:
    a worker's prefetched jobs timed out behind a sweep). The sweep runs in a thread of
    its own; when the worker stops, a sweep under way is told to stop, and waited for."""
    from aeroqueue import worker as worker_module

    sweeping = threading.Event()
    stopped_early = threading.Event()
    reaps: list[float] = []

    def slow_sweep(_backend, *, grace_ms: int, stop) -> None:
        sweeping.set()
        give_up = time.monotonic() + 20
        while time.monotonic() < give_up:  # as a scan asks `stop` every 256 records
            if stop():
                stopped_early.set()
                return
            time.sleep(0.05)

    real_reap = worker_module.reap

    def counted_reap(*args, **kw):
        if sweeping.is_set():
            reaps.append(time.monotonic())
        return real_reap(*args, **kw)

    monkeypatch.setattr(worker_module, "sweep", slow_sweep)
    monkeypatch.setattr(worker_module, "reap", counted_reap)
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    w = fast_worker(registered, lambda job: None, list_name, expiry_s=2.0, interval_s=0.2, reap_every_s=0.3,
                    sweep_every_s=0.5, until_complete=False)
    with running(w):
        assert sweeping.wait(30), "no sweep began"
        wait_for(f"three reaps while the sweep runs (so far {reaps})", lambda: len(reaps) >= 3, 15)
    assert stopped_early.is_set(), "the sweep under way was told to stop when the worker stopped"


def test_a_long_reap_does_not_hold_back_the_watchdog_and_renewals(registered, lists, list_name, monkeypatch):
    """A reap scans the job set for each session it ends (`recount_session`) and gives
    back that session's claims: seconds on a big store. Run in the maintenance thread,
    it held back the handlers' watchdog and the renewals of prefetched jobs' time
    limits meanwhile, as a sweep did. The reap runs in a thread of its own; when the
    worker stops, a reap under way is told to stop, and waited for."""
    from aeroqueue import worker as worker_module
    from aeroqueue.sessions import ReapReport

    reaping = threading.Event()
    stopped_early = threading.Event()
    reap_returned: list[float] = []

    def slow_reap(_backend, *, stop) -> ReapReport:
        reaping.set()
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:  # as a reap asks `stop` between sessions
            if stop():
                stopped_early.set()
                time.sleep(0.5)  # the session it was on: finished before it returns
                break
            time.sleep(0.05)
        reap_returned.append(time.monotonic())
        return ReapReport(0, 0)

    monkeypatch.setattr(worker_module, "reap", slow_reap)
    # j0 touches itself for a while (j1, prefetched behind it, needs the maintenance
    # thread's renewal at half its limit), then hangs (the watchdog's to time out).
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(2)], timeout_s=1.0, backoff_s=0, max_attempts=1,
               seal=True)
    hang = threading.Event()

    def handler(job: Job) -> None:
        if job.jid != "j0":
            return
        assert reaping.wait(30)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            job.touch()
            time.sleep(0.2)
        hang.wait(30)

    w = fast_worker(registered, handler, list_name, expiry_s=2.0, interval_s=0.2, reap_every_s=0.3,
                    until_complete=False, concurrency=1, batch=2)
    renewed: list[str] = []  # jobs the maintenance thread touched while the reap lasted
    real_touch = w.queue.touch

    def touch(job: Job, seconds: float | None = None) -> float:
        if threading.current_thread() is maintenance and reaping.is_set() and not reap_returned:
            renewed.append(job.jid)
        return real_touch(job, seconds)

    w.queue.touch = touch  # type: ignore[method-assign]
    maintenance = threading.Thread(target=w.run, kwargs={"install_signals": False})
    maintenance.start()
    try:
        assert reaping.wait(30), "no reap began"
        wait_for(f"j1's renewal while the reap lasts (renewed: {renewed})", lambda: "j1" in renewed, 10)
        wait_for(f"j0 timed out (its one attempt: dead) while the reap lasts ({w.counters.snapshot()})",
                 lambda: w.counters.snapshot()["dead"] == 1, 10)
        assert not reap_returned, "the reap was still under way"
    finally:
        hang.set()
        w.request_stop()
        maintenance.join(30)
    assert not maintenance.is_alive(), "the worker did not stop"
    assert stopped_early.is_set(), "the reap under way was told to stop when the worker stopped"
    assert reap_returned, "the worker waited for the reap under way"


def test_a_job_that_goes_dead_is_logged_as_a_warning_and_a_retry_as_info(registered, lists, list_name, caplog):
    """A dead job needs someone to look: it was logged at info, which a terminal (warnings
    and up) never showed, while a timeout was a warning."""
    lists.load(list_name, [JobSpec("j0", {})], max_attempts=2, backoff_s=0, seal=True)

    def handler(job: Job) -> None:
        raise RuntimeError(f"broken at attempt {job.attempt}")

    with caplog.at_level(logging.INFO, logger="aeroqueue"):
        assert fast_worker(registered, handler, list_name).run(install_signals=False) == EXIT_OK
    failed = [(r.levelno, getattr(r, "outcome", None)) for r in caplog.records if r.getMessage() == "job failed"]
    assert failed == [(logging.INFO, "retry"), (logging.WARNING, "dead")], failed


def test_a_claim_whose_reservation_is_still_returning_is_not_an_orphan(registered, lists, list_name, caplog):
    """A reservation can take seconds after its first claim lands (a busy list record
    retried for up to 5 s, single claims retried in doubt), and its jobs are the
    worker's threads' only once it returns. The orphan check (two checks a reap
    interval apart) took such a claim for one no thread held and released it, its
    attempt counted: the job then ran all the same, its ack was refused, and with one
    attempt allowed it ended dead though its handler succeeded (a helper's chaos run).
    Here every claim's reservation dawdles 1.5 s, several checks' worth, before it
    returns."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True, max_attempts=1)
    runs: list[str] = []
    w = fast_worker(registered, lambda job: runs.append(job.jid) or "ok", list_name, concurrency=1, batch=2, lease=False,
                    reap_every_s=0.2, expiry_s=3.0)
    claim = w.queue._claim
    slowed: list[int] = []

    def slow_claim(*args, **kw):
        out = claim(*args, **kw)  # landed: the session holds these claims now
        if out:
            slowed.append(len(out))
            time.sleep(1.5)
        return out

    w.queue._claim = slow_claim  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="aeroqueue"):
        assert w.run(install_signals=False) == EXIT_OK
    assert sorted(runs) == ["j0", "j1", "j2"] and sum(slowed) == 3, (runs, slowed)
    released = [r.jid for r in caplog.records if getattr(r, "event", None) == "orphan_released"]
    assert released == [], f"live claims released as orphans: {released}"
    for token in range(3):
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, token)).bins
        assert (rec["state"], rec["att"], rec.get("result")) == ("done", 1, "ok"), rec


def _outcomes(snap: dict[str, int]) -> int:
    return sum(snap[k] for k in ("done", "retried", "dead", "snoozed", "timed_out", "lost", "unacked", "released"))


def _prefetched(w: Worker) -> list[Job]:
    with w._in_flight_lock:
        return [j for jobs in w._prefetched.values() for j in jobs]


@contextmanager
def drained_with_a_job_running(registered, list_name: str, batch: int) -> Iterator[Worker]:
    """A worker running its first job, whose handler waits, the rest of its batch
    prefetched behind it: the block runs then. At its end the worker is asked to stop,
    its drain gives the prefetched jobs back, the handler returns, and it has stopped."""
    started, go_on = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        go_on.wait(10)
        return "ok"

    w = fast_worker(registered, handler, list_name, until_complete=False, batch=batch)
    with running(w):
        try:
            assert started.wait(10)
            yield w
            w.request_stop()
            wait_for("the drain to give back the prefetched jobs", lambda: not _prefetched(w), 10)
        finally:
            go_on.set()


def test_a_prefetched_job_buried_before_the_drain_is_counted_lost_once(registered, lists, list_name):
    """An operator buries a job a worker prefetched; the worker drains. Its release is
    refused ('not held'): that job was counted nowhere, the counts one short."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    with drained_with_a_job_running(registered, list_name, 3) as w:
        assert lists.bury(list_name, "j1", "buried while prefetched") == "dead"
    snap = w.counters.snapshot()
    assert (snap["reserved"], snap["done"], snap["lost"], snap["released"]) == (3, 1, 1, 1), snap
    assert _outcomes(snap) == snap["reserved"], snap
    assert registered.get(keys.JOB_SET, keys.job_name(list_name, 1)).bins["state"] == "dead"
    assert registered.get(keys.JOB_SET, keys.job_name(list_name, 2)).bins["att"] == 0, "refunded"


def test_a_failed_ack_whose_release_fails_too_is_counted_once(registered, lists, list_name, monkeypatch):
    """The store fails a job's acknowledgement and then its release: it was counted
    unacked there, and released again by the orphan check (or the close) that gave
    it back: one job, two outcomes."""
    from aeroqueue.errors import BackendTimeout

    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], max_attempts=2, seal=True)
    failing = {"complete": 1, "release": 1}
    real_complete, real_release = Queue.complete, Queue.release

    def complete(self, job, *a, **kw):
        if job.jid == "j1" and failing["complete"]:
            failing["complete"] -= 1
            raise BackendTimeout("the store did not answer (test)")
        return real_complete(self, job, *a, **kw)

    def release(self, job, *a, **kw):
        if job.jid == "j1" and failing["release"]:
            failing["release"] -= 1
            raise BackendTimeout("the store did not answer (test)")
        return real_release(self, job, *a, **kw)

    monkeypatch.setattr(Queue, "complete", complete)
    monkeypatch.setattr(Queue, "release", release)
    w = fast_worker(registered, lambda job: "ok", list_name, batch=1, ack_linger_s=0, reap_every_s=0.2)
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert failing == {"complete": 0, "release": 0}, "the test's failures happened"
    assert _outcomes(snap) == snap["reserved"], snap
    assert registered.get(keys.JOB_SET, keys.job_name(list_name, 1)).bins["state"] == "done"


def test_what_the_close_gives_back_reaches_the_observer_by_list(registered, lists, list_name):
    """The claims the session's close gives back at the end of a drain (one whose
    answer was lost, say: no thread of the worker knew of it) were counted released
    in the worker's counters and not in its metrics."""
    from collections import Counter

    from aeroqueue.observe import WorkerObserver

    other = list_name + "-x"
    lists.load(other, [JobSpec("x", {})], seal=True)
    lists.create(list_name)
    told: Counter[str] = Counter()

    class Told(WorkerObserver):
        def released(self, name: str, n: int = 1) -> None:
            told[name] += n

    w = fast_worker(registered, lambda job: "ok", list_name, until_complete=False, observer=Told(), reap_every_s=60)
    with running(w):
        wait_for("the worker's session", lambda: w.session is not None, 10)
        assert len(Queue(registered).reserve(other, w.session.id, 1)) == 1  # a claim no thread of it knows
    assert w.counters.snapshot()["released"] == 1
    assert told == {other: 1}, told
    assert registered.get(keys.JOB_SET, keys.job_name(other, 0)).bins["state"] == "queued"


def test_a_short_list_of_long_jobs_runs_on_every_thread_at_once(registered, lists, list_name, store_url, tmp_path):
    """N long jobs, N threads: the default prefetch (4 until a handler had run) let
    the first thread reserve them all and run them one after another while the
    others idled (4 jobs of a minute took 4 minutes, not 1). A real worker process;
    the handler records when each job ran, and the runs must overlap."""
    n, out = 3, tmp_path / "runs.jsonl"
    lists.load(list_name, [JobSpec(f"long-{i}", {"s": 2, "out": str(out)}) for i in range(n)], seal=True)
    proc = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler",
         "tests.lifecycle.handlers:record_run", "--list", list_name, "--concurrency", str(n), "--until-complete",
         "--log-format", "json"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == EXIT_OK, proc.stderr[-3000:]
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["jid"] for r in runs) == [f"long-{i}" for i in range(n)], runs
    # Every run started before any ended: all N at once, each on a thread of its own.
    assert max(r["start"] for r in runs) < min(r["end"] for r in runs), runs
    assert len({r["thread"] for r in runs}) == n, runs
