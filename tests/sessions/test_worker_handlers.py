"""A worker survives any handler: whatever one does fails that job, with an error
that says what happened, and the worker goes on. Its exit status says why it stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from aeroqueue import keys
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job
from aeroqueue.worker import EXIT_OK, EXIT_THREADS_DIED, Worker, run_job


def _misbehave(job: Job) -> object:
    kind = job.jid
    if kind == "exit":
        sys.exit(3)
    if kind == "interrupt":
        raise KeyboardInterrupt
    return {
        "ok": {"sent": True},
        "tuple": (1, 2),
        "set": {1, 2},
        "object": object(),
        "nan": float("nan"),
        "huge-int": 2**70,
        "nul": {"text": "cut\x00here"},
    }[kind]


EXPECTED_ERROR = {
    "exit": "the handler called sys.exit(3)",
    "interrupt": "the handler raised KeyboardInterrupt",
    "set": "cannot be stored as JSON: Object of type set is not JSON serializable",
    "object": "cannot be stored as JSON: Object of type object is not JSON serializable",
    "nan": "cannot be stored as JSON: Out of range float values are not JSON compliant",
    "huge-int": "does not fit in 64 bits",
    "nul": "NUL character",  # the client would store "cut"
}


def test_one_thread_survives_every_kind_of_bad_handler(registered, lists, list_name):
    kinds = ["exit", "ok", "interrupt", "set", "object", "tuple", "nan", "huge-int", "nul"]
    lists.load(list_name, [JobSpec(k, {}) for k in kinds], max_attempts=1, seal=True)
    # One thread: if any of these killed it, the list would never complete and the
    # worker would stop with EXIT_THREADS_DIED instead.
    w = Worker(registered, _misbehave, [list_name], concurrency=1, interval_s=0.1, expiry_s=1.0, idle_s=0.05,
               until_complete=True)
    assert w.run(install_signals=False) == EXIT_OK
    assert w.counters.snapshot()["done"] == 2 and w.counters.snapshot()["dead"] == len(EXPECTED_ERROR)
    jobs = {r["jid"]: r for r in lists.jobs(list_name)}
    assert jobs["ok"]["state"] == "done" and jobs["ok"]["result"] == {"sent": True}
    assert jobs["tuple"]["state"] == "done" and jobs["tuple"]["result"] == [1, 2]
    for kind, text in EXPECTED_ERROR.items():
        assert jobs[kind]["state"] == "dead", kind
        assert text in jobs[kind]["err"].splitlines()[0], (kind, jobs[kind]["err"][:200])
        assert "result" not in jobs[kind] or jobs[kind]["result"] is None
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (2, len(EXPECTED_ERROR), True)


def test_an_error_with_a_nul_is_kept_whole(queue, lists, list_name, session):
    """The client ends a string at a NUL: an exception's message holding one would be
    kept cut short, its traceback lost. It is kept with the NUL shown as \\x00."""
    lists.load(list_name, [JobSpec("e", {})], max_attempts=3, backoff_s=0)
    [job] = queue.reserve(list_name, session, 1)

    def handler(job):
        raise ValueError("bad byte \x00 in the input")

    assert run_job(queue, job, handler, session) == "retry"
    err = queue.backend.get(keys.JOB_SET, job.name).bins["err"]
    assert "ValueError: bad byte \\x00 in the input" in err, err


def test_a_result_over_the_record_size_fails_the_job_with_a_true_error(queue, lists, list_name, session):
    lists.load(list_name, [JobSpec("big", {})], max_attempts=3, backoff_s=0)
    [job] = queue.reserve(list_name, session, 1)
    # Over the 1 MiB record limit of both backends: retrying cannot help.
    assert run_job(queue, job, lambda job: "x" * 2_000_000, session) == "retry"
    rec = queue.backend.get(keys.JOB_SET, job.name).bins
    assert rec["state"] == "queued" and rec["err"].startswith(
        "the handler's result is too big to store: it is 2,000,002 bytes of JSON, more than its job's record can "
        f"hold (the store's max-record-size is {queue.backend.max_record_size():,} bytes"), rec["err"]
    assert "store big results elsewhere" in rec["err"] and "AEROSPIKE_ERR" not in rec["err"], rec["err"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_every_thread_dying_is_exit_status_4(registered, lists, list_name, monkeypatch):
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    w = Worker(registered, lambda job: None, [list_name], concurrency=2, interval_s=0.1, expiry_s=1.0, idle_s=0.05)

    def broken(_session: object) -> list[Job]:
        raise RuntimeError("a bug in the worker loop")

    monkeypatch.setattr(w, "_reserve", broken)
    assert w.run(install_signals=False) == EXIT_THREADS_DIED
    assert registered.get(keys.SESS_SET, w.session.id) is None, "the session is closed all the same"


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_on_the_main_thread_ctrl_c_fails_the_job_and_still_stops_the_program(queue, lists, list_name, session, raised):
    lists.load(list_name, [JobSpec("a", {}), JobSpec("b", {})], backoff_s=0)

    def handler(job: Job) -> None:
        raise raised

    [job] = queue.reserve(list_name, session, 1)
    with pytest.raises(raised):
        run_job(queue, job, handler, session)
    rec = queue.backend.get(keys.JOB_SET, job.name).bins
    assert rec["state"] == "queued" and rec["err"].startswith("the handler "), "failed, not left claimed"
    # Off the main thread (a worker's, a web server's) the same handler only fails its job.
    [job] = queue.reserve(list_name, session, 1)
    outcome: list[str] = []
    t = threading.Thread(target=lambda: outcome.append(run_job(queue, job, handler, session)))
    t.start()
    t.join(30)
    assert outcome == ["retry"]


def test_worker_process_exit_status_after_a_handler_calls_sys_exit(store_url, registered, lists, list_name, tmp_path: Path):
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(6)], max_attempts=1, seal=True)
    (tmp_path / "exiting.py").write_text(textwrap.dedent("""
        import sys
        def handle(job):
            if job.jid in ("j1", "j4"):
                sys.exit(7)
            return job.jid
    """))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler", "exiting:handle", "--list", list_name,
         "--heartbeat", "0.1", "--expiry", "1", "--until-complete", "--log-format", "text"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == EXIT_OK, out.stderr[-2000:]
    jobs = {r["jid"]: r for r in lists.jobs(list_name)}
    assert sorted(j for j, r in jobs.items() if r["state"] == "dead") == ["j1", "j4"]
    assert all(jobs[j]["err"].startswith("the handler called sys.exit(7)") for j in ("j1", "j4"))
    assert all(r["result"] == j for j, r in jobs.items() if r["state"] == "done")
