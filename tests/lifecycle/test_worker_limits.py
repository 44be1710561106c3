"""The worker and the lifecycle: a handler past its time limit (thread and process
pools), touch, Retry(after=...), draining without refunds. Both backends."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aeroqueue import errors, keys, udfs
from aeroqueue import worker as worker_module
from aeroqueue.backends import open_backend
from aeroqueue.errors import ConfigError
from aeroqueue.lists import JobLists
from aeroqueue.loading import Checked, JobSpec
from aeroqueue.observe import WorkerObserver
from aeroqueue.queue import Job, Queue, Retry
from aeroqueue.sessions import Session
from aeroqueue.worker import EXIT_OK, EXIT_THREADS_DIED, Worker
from tests.conftest import mark_reaping
from tests.lifecycle.handlers import hang_or_double, misbehave
from tests.waiting import wait_for


def fast_worker(backend, handler, list_name, **kw) -> Worker:
    opts = {"interval_s": 0.1, "expiry_s": 1.0, "idle_s": 0.05, "until_complete": True, "reap_every_s": 0.2}
    opts.update(kw)
    return Worker(backend, handler, [list_name], **opts)


def job_bins(backend, list_name: str, token: int) -> dict:
    return backend.get(keys.JOB_SET, keys.job_name(list_name, token)).bins


def test_thread_pool_abandons_a_hung_handler_and_keeps_its_concurrency(registered, lists, list_name):
    lists.load(list_name, [JobSpec("hang", {}), *(JobSpec(f"j{i}", {"n": i}) for i in range(10))],
               timeout_s=0.5, backoff_s=0, max_attempts=2, seal=True)
    release = threading.Event()
    runs: list[tuple[str, int]] = []

    def handler(job: Job) -> str:
        runs.append((job.jid, job.attempt))
        if job.jid == "hang":
            release.wait(30)
            return "late"
        return "ok"

    seen: list[str] = []

    class Observer(WorkerObserver):
        def outcome(self, list_name: str, outcome: str) -> None:
            seen.append(outcome)
            super().outcome(list_name, outcome)

    # One thread: if the hung handler held it, nothing else would ever run.
    w = fast_worker(registered, handler, list_name, concurrency=1, batch=2, observer=Observer())
    try:
        assert w.run(install_signals=False) == EXIT_OK
    finally:
        release.set()
    snap = w.counters.snapshot()
    # Timed out twice: put back after the first, dead after the second (its last attempt):
    # an alert on dead jobs missed every job its time limit killed.
    assert (snap["done"], snap["timed_out"], snap["dead"]) == (10, 1, 1)
    assert sorted(seen) == sorted(["done"] * 10 + ["timed_out", "dead"]), seen
    hang = job_bins(registered, list_name, 0)
    assert hang["state"] == "dead" and hang["att"] == 2
    assert [e["err"].startswith("timed out") for e in hang["errs"]] == [True, True]
    assert sorted(a for j, a in runs if j == "hang") == [1, 2]
    time.sleep(0.3)  # the abandoned handlers return now: their results are discarded
    assert job_bins(registered, list_name, 0)["state"] == "dead"
    assert "result" not in job_bins(registered, list_name, 0)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (10, 1, True)


def test_a_handler_that_returned_in_time_is_not_timed_out_while_its_ack_is_on_its_way(registered, lists, list_name):
    """The watchdog checked only that the handler's job was still in flight: a slow ack
    past the limit had it time the job out too, and the job ended twice in the counts
    (timed out, and lost or done), the log saying its result was discarded."""
    lists.load(list_name, [JobSpec("a", {})], timeout_s=1, backoff_s=0, seal=True)
    w = fast_worker(registered, lambda job: "ok", list_name, concurrency=1, batch=1, ack_linger_s=0, lease=False)
    complete, slow = w.queue.complete, []

    def slow_complete(job, result=None):  # a store slow to answer the first ack, past the limit
        if not slow:
            slow.append(job.jid)
            time.sleep(1.6)
        return complete(job, result)

    w.queue.complete = slow_complete  # type: ignore[method-assign]
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    ended = sum(snap.get(k, 0) for k in ("done", "lost", "timed_out", "retried", "dead", "unacked"))
    assert slow and ended == snap["reserved"], snap
    assert snap["timed_out"] == 0 and job_bins(registered, list_name, 0)["state"] == "done", snap


def test_process_pool_kills_the_overdue_handler(registered, lists, list_name):
    jobs = [JobSpec("hang", {"hang": True, "n": 0}), *(JobSpec(f"j{i}", {"n": i}) for i in range(1, 6))]
    lists.load(list_name, jobs, timeout_s=1.5, backoff_s=0, max_attempts=1, seal=True)
    w = fast_worker(registered, hang_or_double, list_name, concurrency=2, pool="process")
    started = time.monotonic()
    assert w.run(install_signals=False) == EXIT_OK
    assert time.monotonic() - started < 30  # not the handler's 60 s
    snap = w.counters.snapshot()
    assert (snap["done"], snap["timed_out"], snap["dead"]) == (5, 0, 1)  # its one attempt timed out: dead
    hang = job_bins(registered, list_name, 0)
    assert hang["state"] == "dead" and "timed out" in hang["err"]
    results = [job_bins(registered, list_name, t)["result"] for t in range(1, 6)]
    assert [r["double"] for r in results] == [2 * n for n in range(1, 6)]
    assert all(r["pid"] != os.getpid() for r in results)  # ran in child processes
    assert not [p for p in multiprocessing.active_children() if p.name == "aeroqueue-handler"]


def test_touch_from_a_child_process(registered, lists, list_name):
    # 2 s of work past a 1.5 s limit, touched every 0.5 s: a touch may come a second
    # late (a loaded machine: it goes through the parent) and still be in time.
    lists.load(list_name, [JobSpec("t", {"touch": True, "n": 4})], timeout_s=1.5, backoff_s=0, seal=True)
    w = fast_worker(registered, hang_or_double, list_name, pool="process")
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert (snap["done"], snap["timed_out"]) == (1, 0)
    assert job_bins(registered, list_name, 0)["result"]["double"] == 8


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_handler_that_misbehaves_fails_its_job_alone_in_either_pool(registered, lists, list_name, pool):
    """A bad touch argument, sys.exit() and KeyboardInterrupt fail the job with what
    the handler did, in a handler process too (not 'the handler's process died', not
    a dead worker thread and exit status 4)."""
    jobs = [JobSpec("touch", {"how": "bad-touch"}), JobSpec("exit", {"how": "exit"}),
            JobSpec("interrupt", {"how": "interrupt"}), *(JobSpec(f"ok{i}", {}) for i in range(3))]
    lists.load(list_name, jobs, max_attempts=1, backoff_s=0, seal=True)
    w = fast_worker(registered, misbehave, list_name, concurrency=1, batch=1, pool=pool)
    assert w.run(install_signals=False) == EXIT_OK
    errors = {b["jid"]: b["err"] for b in (job_bins(registered, list_name, t) for t in range(6)) if b["state"] == "dead"}
    assert set(errors) == {"touch", "exit", "interrupt"}, errors
    assert errors["touch"].startswith("ValueError: touch takes seconds more than 0 up to"), errors["touch"]
    assert "sys.exit(3)" in errors["exit"] and "KeyboardInterrupt" in errors["interrupt"], errors
    assert lists.status(list_name).done == 3


def test_a_handler_process_dying_during_a_touch_fails_its_job_alone(registered, lists, list_name, monkeypatch):
    """The handler process dies while the parent renews its claim: the answer found no
    pipe (BrokenPipeError), which killed the worker thread, and with it the rest of
    its jobs. That job fails as a handler process dying at any other moment does."""
    lists.load(list_name, [JobSpec("die", {"how": "die-mid-touch"}), *(JobSpec(f"j{i}", {}) for i in range(3))],
               backoff_s=0, max_attempts=1, seal=True)
    touch = Queue.touch

    def slow_touch(self, job, seconds=None):
        time.sleep(1.0)  # a loaded store: the child is gone before the answer
        return touch(self, job, seconds)

    monkeypatch.setattr(Queue, "touch", slow_touch)
    w = fast_worker(registered, misbehave, list_name, concurrency=1, batch=1, pool="process")
    assert w.run(install_signals=False) == EXIT_OK
    assert (w.counters.snapshot()["done"], w.counters.snapshot()["dead"]) == (3, 1)
    bins = job_bins(registered, list_name, 0)
    assert bins["state"] == "dead" and "the handler's process died (exit code 9)" in bins["err"], bins


def test_a_handler_process_that_cannot_start_is_a_logged_error_not_a_traceback(registered, lists, list_name, caplog,
                                                                                capfd, monkeypatch):
    """A handler process that dies as it starts (an import only the parent can do, a
    native library failing in a child): its thread ended with a traceback on stderr,
    outside the worker's log."""
    def dies_at_start(self, timeout_s: float = 120.0) -> None:
        raise worker_module._StartFailed("a handler process died while starting (exit code 3)")

    monkeypatch.setattr(worker_module._ChildRunner, "start", dies_at_start)
    lists.load(list_name, [JobSpec("a", {})], seal=True)
    w = fast_worker(registered, misbehave, list_name, concurrency=1, pool="process")
    assert w.run(install_signals=False) == EXIT_THREADS_DIED
    assert "Traceback" not in capfd.readouterr().err
    (failed,) = [r for r in caplog.records if getattr(r, "event", None) == "handler_start_failed"]
    assert failed.error == "a handler process died while starting (exit code 3)"
    assert job_bins(registered, list_name, 0)["state"] == "queued"  # it starts before any claim


def test_a_handler_process_that_cannot_restart_charges_no_job(registered, lists, list_name, tmp_path, monkeypatch):
    """A deploy breaks the handler's module while the worker runs: the next handler
    process dies as it imports it. Taken for a failed acknowledgement, that failed
    every job in turn, an attempt each, until the list was dead. The jobs go back
    with their attempt, and the thread ends."""
    monkeypatch.setenv("AQ_TEST_BROKEN_MARK", str(tmp_path / "broken"))
    from tests.lifecycle.handlers_deploy import crash_then_break

    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(5)], backoff_s=0, max_attempts=2, seal=True)
    w = fast_worker(registered, crash_then_break, list_name, concurrency=1, batch=1, pool="process")
    assert w.run(install_signals=False) == EXIT_THREADS_DIED
    bins = [job_bins(registered, list_name, t) for t in range(5)]
    assert [b["state"] for b in bins] == ["queued"] * 5, bins
    assert [b.get("att", 0) for b in bins].count(1) == 1, bins  # only the job whose process died
    st = lists.status(list_name)
    assert (st.dead, st.done, st.in_flight) == (0, 0, 0), st


def test_a_handler_process_killed_while_starting_is_started_again(registered, lists, list_name, store_url, tmp_path):
    """The OOM killer (or an operator's kill -9) ends a handler process while it starts
    (imports: most of a second). Its worker thread ended for good, as for a module that
    no longer imports: the worker lost that much of its concurrency, and one of a single
    thread exited 4 ("a bug in aeroqueue") with its jobs undone. The process is started
    again (twice in a row here), and every job is done, once."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(5)], seal=True)
    gate = tmp_path / "gate"
    gate.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler",
         "tests.lifecycle.handlers_slow_start:quick", "--list", list_name, "--pool", "process", "-c", "1",
         "--until-complete", "--log-format", "json"],
        cwd=str(Path(__file__).resolve().parents[2]), env={**os.environ, "AQ_TEST_START_GATE": str(gate)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    killed: list[int] = []

    def starting() -> int | None:
        assert proc.poll() is None, f"the worker exited {proc.returncode}: {proc.communicate()[1]}"
        pids = [int(f.name.split("-")[1]) for f in gate.glob("starting-*")]
        return next((p for p in pids if p not in killed), None)

    try:
        for _ in range(worker_module.START_TRIES - 1):
            pid = wait_for("a handler process starting", starting)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        wait_for("a handler process started again", starting)
        (gate / "go").touch()
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_OK, err
    assert err.count('"handler_start_retried"') == len(killed), err
    for token in range(5):
        bins = job_bins(registered, list_name, token)
        assert (bins["state"], bins["att"]) == ("done", 1), bins  # none failed, none ran twice


def _handler_processes(parent: int) -> list[int]:
    kids = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in kids if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _cli_worker(url: str, list_name: str, *extra: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", url, "worker", "--handler", "tests.lifecycle.handlers:misbehave",
         "--list", list_name, "--pool", "process", *extra],
        cwd=str(Path(__file__).resolve().parents[2]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        **popen,
    )


def _signal_group(proc: subprocess.Popen, sig: int, when: Callable[[], Any]) -> str:
    """Once `when()` returns, `sig` to the worker's whole process group (a terminal's
    Ctrl-C, systemd's stop); its stderr once it exited. Killed if it does not."""
    try:
        when()
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return err


# The two tests below are about processes, not the store: on an embedded file of their own.
@pytest.mark.parametrize("how", ["slow", "regex"])
def test_handler_processes_do_not_outlive_a_killed_worker(tmp_path, how):
    """SIGKILLed (the OOM killer), the worker's session expires and its job runs again
    elsewhere: its handler process went on running the old attempt beside it, for
    ever if it hung (nobody is left to kill it at its time limit), and a handler
    holding the GIL (`regex`) keeps a polling thread from running."""
    url = f"embedded://{tmp_path / 'store.db'}"
    lists = JobLists(open_backend(url))
    udfs.register(lists.backend)
    lists.load("L", [JobSpec("long", {"how": how, "s": 60})], seal=True)
    proc = _cli_worker(url, "L")
    kids: list[int] = []
    try:
        wait_for("the job running", lambda: job_bins(lists.backend, "L", 0)["state"] == "claimed")
        kids = _handler_processes(proc.pid)
        assert kids
        proc.kill()
        proc.wait()  # not its stderr's end: a handler process left running holds that open
        wait_for("the handler processes gone", lambda: not any(_running(k) for k in kids), 5)
    finally:
        for k in kids:
            if _running(k):
                os.kill(k, signal.SIGKILL)
        proc.kill()
        proc.communicate()


def test_ctrl_c_while_handler_processes_start_is_a_clean_drain(tmp_path):
    """A Ctrl-C reaches the whole foreground group: a handler process still starting
    (imports, most of a second) died of it with a traceback, and its worker thread
    with an EOFError."""
    url = f"embedded://{tmp_path / 'store.db'}"
    lists = JobLists(open_backend(url))
    udfs.register(lists.backend)
    lists.create("L")
    proc = _cli_worker(url, "L", "-c", "2", "--log-format", "text", start_new_session=True)
    err = _signal_group(proc, signal.SIGINT, lambda: wait_for(
        "handler processes starting", lambda: _handler_processes(proc.pid), 30, step_s=0.01))
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Fatal Python error" not in err, err


def test_sigterm_to_the_process_group_drains_a_process_pool(registered, lists, list_name, store_url):
    """systemd (KillMode=control-group), `kill -- -PGID` and supervisord's stopasgroup
    signal every process of the worker: the handler processes ignore it, and the
    worker drains as it does on its own SIGTERM, its running jobs finishing."""
    lists.load(list_name, [JobSpec(f"s{i}", {"how": "slow", "s": 2}) for i in range(2)], seal=True)

    def claimed() -> list[dict]:
        return [b for b in (job_bins(registered, list_name, t) for t in range(2)) if b["state"] == "claimed"]

    proc = _cli_worker(store_url, list_name, "-c", "2", "--batch", "1", "--drain-timeout", "30", start_new_session=True)
    running: list[dict] = []
    err = _signal_group(proc, signal.SIGTERM, lambda: running.extend(wait_for("a job running", claimed)))
    assert proc.returncode == 0, err
    for token in range(2):
        bins = job_bins(registered, list_name, token)
        seen = (bins["state"], bins["att"], bins.get("err"))
        if any(r["token"] == token for r in running):
            assert seen == ("done", 1, None), seen  # it finished: nothing was killed
        else:
            # Not running at the signal: done all the same, or never reserved, or
            # reserved by a call on its way when the signal came and given back
            # unstarted, its attempt refunded.
            assert seen in (("done", 1, None), ("queued", 0, None), ("queued", 0, "worker draining")), seen


def test_a_process_pool_worker_exits_at_its_drain_deadline_not_when_its_handler_ends(registered, lists, list_name,
                                                                                       store_url):
    """Handler processes ignore SIGTERM (the group's signal is the parent's to act on),
    which is how Python ends daemonic children at exit: past the drain deadline the
    worker kills them itself rather than wait out a handler of 60 s."""
    lists.load(list_name, [JobSpec("long", {"how": "slow", "s": 60})], seal=True, backoff_s=0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler", "tests.lifecycle.handlers:misbehave",
         "--list", list_name, "--pool", "process", "--drain-timeout", "1"],
        cwd=str(Path(__file__).resolve().parents[2]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_for("the job running", lambda: job_bins(registered, list_name, 0)["state"] == "claimed")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    bins = job_bins(registered, list_name, 0)
    assert bins["state"] == "queued" and bins["att"] == 1, bins  # given back, its attempt counted
    assert "drain deadline passed" in bins["err"], bins["err"]


def test_touch_in_a_thread(registered, lists, list_name):
    # 2 s of work under a 1.2 s limit, touched every 0.4 s: 0.8 s of slack for a
    # loaded machine (0.25 s was not enough in CI).
    lists.load(list_name, [JobSpec("t", {})], timeout_s=1.2, backoff_s=0, seal=True)

    def handler(job: Job) -> str:
        for _ in range(5):
            time.sleep(0.4)
            job.touch()
        return "ok"

    w = fast_worker(registered, handler, list_name)
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert (snap["done"], snap["timed_out"]) == (1, 0)


@pytest.mark.parametrize("after", [0.5, datetime.timedelta(milliseconds=500)], ids=["seconds", "timedelta"])
def test_retry_after_snoozes_without_counting_a_failure(registered, lists, list_name, after):
    lists.load(list_name, [JobSpec("s", {})], max_attempts=1, seal=True)
    calls: list[float] = []

    def handler(job: Job) -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise Retry(after=after)
        return "ok"

    w = fast_worker(registered, handler, list_name)
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert (snap["done"], snap["snoozed"], snap["dead"], snap["retried"]) == (1, 1, 0, 0)
    assert calls[1] - calls[0] >= 0.45
    rec = job_bins(registered, list_name, 0)
    assert rec["att"] == 1 and rec["state"] == "done" and not rec.get("errs")


def test_draining_does_not_refund_a_job_running_at_the_deadline(registered, lists, list_name):
    lists.load(list_name, [JobSpec("slow", {})], seal=True)
    started = threading.Event()
    release = threading.Event()

    def handler(job: Job) -> str:
        started.set()
        release.wait(20)
        return "late"

    w = fast_worker(registered, handler, list_name, until_complete=False, drain_timeout_s=0.3)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        assert started.wait(10)
        w.request_stop()
        t.join(20)
        assert not t.is_alive()
    finally:
        trips = registered.round_trips
        release.set()
    # The handler returns after the worker stopped, when its caller may be closing
    # the store connection (closing the client under a call in flight crashed the
    # process): its session is closed and its claim given back, so it sends nothing.
    for thread in w._threads:
        thread.join(10)
        assert not thread.is_alive()
    assert registered.round_trips == trips
    _assert_counted_once_as_released(w)
    rec = job_bins(registered, list_name, 0)
    assert rec["state"] == "queued" and rec["att"] == 1  # the attempt counts: a job that always hangs ends


_OUTCOMES = ("done", "retried", "dead", "snoozed", "timed_out", "lost", "unacked", "released")


def _assert_counted_once_as_released(w: Worker) -> None:
    """The one job reserved was given back at the drain deadline: that is its outcome,
    and its only one (it was also counted unacked, or lost, when its handler ended)."""
    snap = w.counters.snapshot()
    counted = {k: snap[k] for k in _OUTCOMES if snap[k]}
    assert sum(counted.values()) == snap["reserved"] == 1, f"one job, counted as {counted}"
    assert snap["released"] == 1, f"one job, counted as {counted}"


def test_a_process_pool_job_given_back_at_the_drain_deadline_ends_once(registered, lists, list_name):
    """Past the drain deadline the worker gives the job back (counted released) and
    kills its handler process; the thread that ran it then failed the job as 'the
    handler's process died': a store call for a claim given back already, refused,
    and the job counted lost as well (or unacked, had the session closed first)."""
    lists.load(list_name, [JobSpec("long", {"how": "slow", "s": 60})], seal=True, backoff_s=0)
    w = fast_worker(registered, misbehave, list_name, until_complete=False, pool="process", drain_timeout_s=0.5)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        wait_for("the handler running", lambda: job_bins(registered, list_name, 0)["state"] == "claimed", 60)
        time.sleep(0.5)  # a child process is given the job after its claim
    finally:
        w.request_stop()
        t.join(30)
    assert not t.is_alive()
    for thread in w._threads:
        thread.join(10)
        assert not thread.is_alive()
    _assert_counted_once_as_released(w)
    rec = job_bins(registered, list_name, 0)
    assert (rec["state"], rec["att"]) == ("queued", 1), rec
    assert "drain deadline passed" in rec["err"] and "process died" not in rec["err"], rec["err"]
    assert not [p for p in multiprocessing.active_children() if p.name == "aeroqueue-handler"]


def test_failures_back_off_in_the_worker(registered, lists, list_name):
    lists.load(list_name, [JobSpec("f", {})], backoff_s=0.3, backoff_max_s=10, max_attempts=3, seal=True)
    calls: list[float] = []

    def handler(job: Job) -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise RuntimeError("downstream down")
        return "ok"

    w = fast_worker(registered, handler, list_name)
    assert w.run(install_signals=False) == EXIT_OK
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.15 - 0.02  # attempt 1: 0.15..0.3 s
    assert calls[2] - calls[1] >= 0.3 - 0.02  # attempt 2: 0.3..0.6 s
    assert job_bins(registered, list_name, 0)["state"] == "done"


def test_a_prefetched_job_given_out_again_runs_once(registered, lists, list_name):
    """A job waiting in one thread's prefetch whose claim ends (here given back; on a
    cluster, undone by a node lost before it replicated) and is reserved again by
    another thread: the first thread drops its stale copy instead of running it."""
    lists.load(list_name, [JobSpec(j, {}) for j in "abcd"], seal=True)
    runs: list[str] = []
    first = threading.Lock()  # only the first handler gives a job back
    w: Worker

    def handler(job: Job) -> None:
        runs.append(job.jid)
        if not first.acquire(blocking=False):
            return
        mine = w._prefetched[threading.current_thread()]  # this thread's jobs, not started yet
        assert mine, "each thread reserved two jobs"
        other = mine[0]
        assert w.queue.release(other) == "released"
        deadline = time.monotonic() + 20
        while other.jid not in runs and time.monotonic() < deadline:
            time.sleep(0.02)  # until the other thread has reserved and run it
        assert other.jid in runs, "the job given back was reserved by the other thread"

    w = fast_worker(registered, handler, list_name, concurrency=2, batch=2, ack_linger_s=0)
    assert w.run(install_signals=False) == EXIT_OK
    assert sorted(runs) == ["a", "b", "c", "d"], f"every handler ran once: {runs}"
    assert w.counters.snapshot()["done"] == 4
    for token in range(4):
        bins = job_bins(registered, list_name, token)
        assert bins["state"] == "done" and bins["att"] == 1, bins


@pytest.mark.parametrize("after", [float("inf"), 1e17, float("-inf"), float("nan")])
def test_a_retry_with_a_delay_out_of_range_fails_that_job_and_nothing_else(registered, lists, list_name, after):
    """`Retry(after=inf)` or a delay past ten years is the handler's error: that job
    fails (its attempt counted, the error named) and the worker goes on. It used to
    escape the worker, leaving the job claimed; on the real server the aerospike
    client, handed an integer past 64 bits, later aborted the process."""
    lists.load(list_name, [JobSpec("bad", {}), JobSpec("good", {})], max_attempts=1, seal=True)

    def handler(job: Job) -> str:
        if job.jid == "bad":
            raise Retry(after=after)
        return "ok"

    w = fast_worker(registered, handler, list_name)
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert (snap["done"], snap["dead"], snap["snoozed"]) == (1, 1, 0)
    bad = job_bins(registered, list_name, 0)
    assert bad["state"] == "dead" and bad["att"] == 1
    assert "Retry(after=...) takes seconds from 0 up to" in bad["errs"][-1]["err"], bad["errs"]
    assert job_bins(registered, list_name, 1)["state"] == "done"


def test_touch_and_snooze_out_of_range_are_refused_before_the_store(registered, lists, queue, list_name):
    lists.load(list_name, [JobSpec("a", {})], timeout_s=30, seal=True)
    s = Session.open(registered, heartbeat=False)
    try:
        (job,) = queue.reserve(list_name, s, 1)
        before = job_bins(registered, list_name, 0)
        for bad in (float("inf"), 1e17, 0, -5, float("nan")):
            with pytest.raises(ValueError, match=r"touch takes seconds more than 0 up to 315,360,000"):
                job.touch(bad)
        for bad in (float("inf"), 1e17, float("-inf")):
            with pytest.raises(ValueError, match=r"Retry\(after=\.\.\.\) takes seconds from 0"):
                queue.snooze(job, bad)
        granted = queue.touch(job, datetime.timedelta(minutes=2))
        assert 119 < granted <= 120, granted
        assert job_bins(registered, list_name, 0)["tl"] == 120_000
        before = job_bins(registered, list_name, 0)
        for bad in ("soon", None, True):
            with pytest.raises(TypeError, match="takes seconds \\(a number or a timedelta\\)"):
                queue.snooze(job, bad)
        assert job_bins(registered, list_name, 0) == before, "nothing was written"
        job.touch(315_360_000)  # ten years: the most a time limit may be
        assert job_bins(registered, list_name, 0)["tl"] == 315_360_000_000
        queue.complete(job, "ok")  # the claim is still ours
        assert job_bins(registered, list_name, 0)["state"] == "done"
    finally:
        s.close()


def test_a_draining_worker_gives_back_its_prefetched_jobs_at_once(registered, lists, list_name):
    """Jobs prefetched behind a running handler go back when the drain starts, not
    when that handler ends (up to the drain deadline): another worker takes them."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(4)], seal=True)
    started, release = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        if job.jid == "j0":
            started.set()
            release.wait(30)
        return "ok"

    w = fast_worker(registered, handler, list_name, until_complete=False, concurrency=1, batch=4, drain_timeout_s=30)
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        assert started.wait(10)
        assert [job_bins(registered, list_name, i)["state"] for i in range(4)] == ["claimed"] * 4, "j1-j3 prefetched"
        w.request_stop()
        wait_for("the prefetched jobs given back",
                 lambda: [job_bins(registered, list_name, i)["state"] for i in range(1, 4)] == ["queued"] * 3, 10)
        assert job_bins(registered, list_name, 0)["state"] == "claimed", "the running one finishes its drain"
        assert [job_bins(registered, list_name, i)["att"] for i in range(1, 4)] == [0] * 3, "attempts refunded"
    finally:
        release.set()
        t.join(30)
    assert not t.is_alive()
    assert job_bins(registered, list_name, 0)["state"] == "done"


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_worker_whose_session_is_lost_stops_without_waiting_for_its_handlers(registered, lists, list_name, pool):
    """A lost session's handlers are not waited for (their acks would be refused, and
    the reaper has given their jobs to others): the worker exits 3 at once. With
    --pool process it waited for ever: its hung handler process ignores SIGTERM,
    which is how Python ends daemonic children at exit; now it is killed. Its jobs
    are counted as it stops, each once: the running one unacked (it was counted only
    when its handler came back, after the worker's last count, or never: the process
    gone), and the ones prefetched behind it (once counted nowhere) released, their
    attempts refunded."""
    lists.load(list_name, [JobSpec(f"hang{i}", {"how": "slow", "s": 60}) for i in range(3)], seal=True)
    w = fast_worker(registered, misbehave, list_name, until_complete=False, pool=pool, drain_timeout_s=30, batch=3)
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(w.run(install_signals=False)))
    t.start()
    try:
        wait_for("the handler running", lambda: job_bins(registered, list_name, 0)["state"] == "claimed", 60)
        time.sleep(0.5)  # a child process is given the job after its claim
        # What a reaper does first: the session is its, and lost to its owner.
        mark_reaping(registered, w.session.id)
        stopped = time.monotonic()
        t.join(20)
        assert not t.is_alive(), "the worker waited for a handler whose session was lost"
        assert time.monotonic() - stopped < 15
    finally:
        if t.is_alive():
            w.request_stop()
    assert result == [3]
    snap = w.counters.snapshot()
    assert (snap["reserved"], snap["unacked"]) == (3, 1), snap
    wait_for("no handler process left", lambda: not multiprocessing.active_children(), 10)
    if pool == "process":  # its thread ends once its handler process is killed: it counts nothing more
        for thread in w._threads:
            thread.join(10)
    counted = {k: v for k, v in w.counters.snapshot().items() if v and k in _OUTCOMES}
    # The prefetched ones: released, or lost if a reaper (this worker's own, which
    # takes up the half-done reap) gave them back first, their attempts counted.
    assert counted.pop("unacked") == 1 and sum(counted.values()) == 2, f"three jobs, counted as {counted}"
    assert set(counted) <= {"released", "lost"}, counted
    refunded = [job_bins(registered, list_name, t)["att"] for t in (1, 2)].count(0)
    assert refunded == counted.get("released", 0), "each released one refunded"


def test_until_complete_stops_soon_after_the_last_job_whatever_the_expiry(registered, lists, list_name):
    """--until-complete looked for completion once a reap interval (half the expiry):
    with --expiry 60, 30 s idle after the last job."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(20)], seal=True)
    handled: list[float] = []

    def handle(job: Job) -> None:
        time.sleep(0.05)
        handled.append(time.monotonic())

    # About a second of work: not complete at the first look.
    w = fast_worker(registered, handle, list_name, concurrency=1, interval_s=5.0, expiry_s=60.0, reap_every_s=30.0)
    assert w.run(install_signals=False) == EXIT_OK
    # Counted from the last job, not from the start: a loaded machine slows the work,
    # which is not under test. The next reap interval was 30 s away.
    assert time.monotonic() - handled[-1] < 10
    assert len(handled) == 20 and lists.status(list_name).complete


def test_a_process_pool_refuses_a_handler_it_cannot_send_to_a_process(registered, list_name):
    """A lambda cannot reach a spawned process: one clear error up front, not a
    PicklingError traceback in every thread and exit 4 ('a bug in aeroqueue')."""
    with pytest.raises(ConfigError, match="pool 'process' needs a handler importable by name"):
        Worker(registered, lambda job: "ok", [list_name], pool="process")
    Worker(registered, misbehave, [list_name], pool="process")  # a module-level function is fine
    # So is one holding a multiprocessing Queue: it pickles only while spawning (and then does).
    import functools
    Worker(registered, functools.partial(misbehave, multiprocessing.get_context("spawn").Queue()), [list_name],
           pool="process")


def test_a_retry_already_due_runs_again_at_once():
    """A computed delay a little in the past (next_slot - time.time()) is zero: the
    job runs again at once, as a failure it is not."""
    assert Retry(after=-0.25).after == 0.0
    assert Retry(after="1.5").after == 1.5  # as float() reads it, as before


@pytest.mark.parametrize("linger", [0.0, 0.005], ids=["at-once", "batched"])
def test_a_failed_ack_that_ends_a_job_dead_counts_it_dead(registered, lists, list_name, monkeypatch, linger):
    """The store fails every acknowledgement; the worker gives each job back with its
    attempt counted, and with one attempt allowed the release ends it dead. That was
    counted 'unacked' (its claim lost), which it was not."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], max_attempts=1, seal=True)

    def fails(*_: Any, **__: Any) -> Any:
        raise errors.BackendTimeout("the store stopped answering")

    monkeypatch.setattr(Queue, "complete", fails)
    monkeypatch.setattr(Queue, "complete_many", fails)
    w = fast_worker(registered, misbehave, list_name, concurrency=1, batch=1, ack_linger_s=linger)
    assert w.run(install_signals=False) == EXIT_OK
    snap = w.counters.snapshot()
    assert (snap.get("dead", 0), snap.get("unacked", 0), snap.get("done", 0)) == (3, 0, 0), snap
    assert [job_bins(registered, list_name, t)["state"] for t in range(3)] == ["dead"] * 3
    assert lists.status(list_name).dead == 3


def test_jobs_reserved_as_the_drain_starts_are_given_back_not_started(registered, lists, list_name):
    """A reservation on its way when the stop comes (SIGTERM mid round trip) returns
    after the drain gave back the prefetched jobs: its jobs never started, and must go
    back as those do, attempts refunded. The thread started the first of them anyway,
    after the stop: the drain waited on it, and at the deadline gave it back as a job
    that ran past it (its attempt counted: with max_attempts 1, dead)."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    started: list[str] = []
    release = threading.Event()

    def handler(job: Job) -> str:
        started.append(job.jid)
        release.wait(20)
        return "ok"

    w = fast_worker(registered, handler, list_name, until_complete=False, concurrency=1, batch=3, drain_timeout_s=0.5)
    real_reserve = w.queue.reserve
    asked = threading.Event()

    def reserve(*args, **kwargs):
        asked.set()
        w._stopping.wait(20)  # the stop comes while the reservation is on its way
        return real_reserve(*args, **kwargs)

    w.queue.reserve = reserve
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(w.run(install_signals=False)))
    t.start()
    try:
        assert asked.wait(10)
        w.request_stop()
        t.join(20)
        assert not t.is_alive()
    finally:
        release.set()
    assert result == [EXIT_OK]
    assert started == [], "a handler started after the stop"
    assert [(job_bins(registered, list_name, i)["state"], job_bins(registered, list_name, i)["att"]) for i in range(3)] \
        == [("queued", 0)] * 3, "unstarted jobs go back with their attempts refunded"


def test_a_failure_the_job_record_has_no_room_for_fails_that_job_not_the_worker(registered, lists, list_name):
    """A handler's error goes into the job's record (`errs`): for a job whose record is
    near the store's max-record-size, recording it is refused as too big. That was
    taken for a result too big, and the job failed again with that message, refused
    again, and so on: about a thousand round trips, then a RecursionError that killed
    the worker's only thread (the worker exited 4, and the next worker met the same job)."""
    # Past the load's own limit (which leaves a failure room): `Checked` takes it unchecked.
    lists.load(list_name, Checked([JobSpec("big", {"s": "x" * 1048076})]), max_attempts=2, seal=True)

    def handler(job: Job) -> None:
        raise ValueError("boom " * 400)

    w = fast_worker(registered, handler, list_name, ack_linger_s=0)
    fails: list[str] = []
    real_fail = w.queue.fail
    w.queue.fail = lambda job, error: (fails.append(error), real_fail(job, error))[1]
    result: list[int] = []
    t = threading.Thread(target=lambda: result.append(w.run(install_signals=False)))
    t.start()
    t.join(60)
    if t.is_alive():
        w.request_stop()
        t.join(60)
    assert result == [EXIT_OK], "the worker's thread died"
    assert len(fails) <= 2 * 2, f"{len(fails)} attempts to record the failure"
    assert all("result is too big" not in f for f in fails), "the handler returned no result: it raised"
    assert job_bins(registered, list_name, 0)["state"] == "dead"


@pytest.mark.parametrize("release_fails", [False, True], ids=["released", "release-fails-too"])
def test_a_prefetched_job_whose_renewal_fails_is_given_back_uncharged(registered, lists, list_name, release_fails):
    """A prefetched job that waited a quarter of its limit is renewed (a touch) before
    it starts. A store error on that touch (a timeout) was taken for a failed
    acknowledgement: the job went back with its attempt counted, though its handler
    never ran, and with one attempt allowed it ended dead without ever running. When
    the store fails the refunded release too (it is down), the orphan check gave the
    job back later with its attempt counted: dead without running all the same."""
    # A limit roomy enough for a loaded machine: j1's claim must not run out (and be
    # charged by the reaper) while the refused renewal and release play out.
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(2)], timeout_s=6.0, max_attempts=1, seal=True)
    ran: list[str] = []

    def handler(job: Job) -> str:
        ran.append(job.jid)
        if job.jid == "j0":
            time.sleep(2.0)  # j1 waits behind it for more than a quarter of its limit
        return "ok"

    w = fast_worker(registered, handler, list_name, until_complete=False, concurrency=1, batch=2)
    real_touch, real_release = w.queue.touch, w.queue.release
    refused, release_refused = [1], [1 if release_fails else 0]

    def touch(job: Job, seconds: float | None = None) -> float:
        if refused[0]:
            refused[0] -= 1
            raise errors.BackendTimeout("the store did not answer in time")
        return real_touch(job, seconds)

    def release(job: Job, why: str = "released", *, refund: bool = True) -> str:
        if release_refused[0]:
            release_refused[0] -= 1
            raise errors.BackendTimeout("the store did not answer in time")
        return real_release(job, why, refund=refund)

    w.queue.touch, w.queue.release = touch, release  # type: ignore[method-assign]
    # The maintenance thread's own renewal of waiting jobs (at half their limit) would
    # take the refused touch on a slow machine: the renewal under test is the thread's.
    w._renew_prefetched = lambda: None  # type: ignore[method-assign]
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        wait_for("both jobs ended",
                 lambda: all(job_bins(registered, list_name, i)["state"] in ("done", "dead") for i in range(2)), 20)
    finally:
        w.request_stop()
        t.join(30)
    assert refused == [0] and release_refused == [0], "the renewal (and its release) refused as asked"
    states = [job_bins(registered, list_name, i)["state"] for i in range(2)]
    assert states == ["done", "done"], (states, ran, w.counters.snapshot())
    assert sorted(ran) == ["j0", "j1"]


def test_a_job_reserved_again_while_its_first_run_hangs_leaves_the_first_to_the_watchdog(
    registered, lists, list_name, monkeypatch,
):
    """A reaper ended the claim of a handler hung past its limit before this worker's
    watchdog came round; another thread of the worker reserved the job again. The
    worker filed running jobs by name: the second copy hid the first from the watchdog
    and, done, wiped its entry, so the hung thread was never retired and the job it had
    prefetched ("y") waited behind it, renewed, until the handler returned (a read of
    the worker's threads). Both copies are kept apart now (name and request id)."""
    lists.load(list_name, [JobSpec("x", {}), JobSpec("y", {})], timeout_s=1, backoff_s=0, max_attempts=3, seal=True)
    hung, runs = threading.Event(), []

    def handler(job: Job) -> str:
        runs.append(job.jid)
        if job.jid == "x" and runs.count("x") == 1:
            hung.wait(30)  # the first run hangs
        return "ok"

    held_back = threading.Event()  # the watchdog's rounds are skipped until set
    real_watch = Worker._watch

    def late_watch(self: Worker, session: Session) -> None:
        if held_back.is_set():
            real_watch(self, session)

    monkeypatch.setattr(Worker, "_watch", late_watch)
    w = fast_worker(registered, handler, list_name, concurrency=2, batch=2, reap_every_s=0.3, drain_timeout_s=5)
    exit_code: list[int] = []
    runner = threading.Thread(target=lambda: exit_code.append(w.run(install_signals=False)))
    runner.start()
    try:
        # The reaper ends x's claim (past its 1 s limit) and the other thread runs it again.
        wait_for("x run again by the other thread", lambda: runs.count("x") == 2, 20)
        assert "y" not in runs, "y waits behind the hung x, prefetched by its thread"
        held_back.set()
        # The watchdog retires the hung thread and gives y back: run at once, not when x's
        # first handler returns (30 s).
        wait_for("y done", lambda: lists.status(list_name).done == 2, 10)
        assert w.counters.snapshot().get("timed_out") == 1, w.counters.snapshot()
    finally:
        hung.set()
        runner.join(60)
    assert exit_code == [EXIT_OK] and sorted(runs) == ["x", "x", "y"], (exit_code, runs)
