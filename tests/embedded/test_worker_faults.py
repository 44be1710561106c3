"""Worker behaviour under store faults (embedded fault injection)."""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Iterator

import pytest

from aeroqueue import keys, udfs
from aeroqueue import worker as worker_module
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.worker import EXIT_OK, Worker
from tests.waiting import wait_for


def _fail_acks_of(backend, key: str) -> None:
    # Every answer to an ack of the job at `key` is lost until the deadline (one lost
    # answer is retried): its native form (hotpath.py) and the UDF alike.
    backend.client.faults.add(op="*", writes="state=done", key=key, error="TimeoutError", times=-1)
    backend.client.faults.add(op="*", function="complete", key=key, error="TimeoutError", times=-1)


def test_a_failed_ack_gives_the_job_back_instead_of_holding_it(tmp_path):
    """Acknowledged one at a time (ack_linger_s=0), by the thread that ran it."""
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    JobLists(backend).load("L", [JobSpec("a", {}), JobSpec("b", {})], seal=True)
    runs: list[str] = []

    def handler(job):
        runs.append(job.jid)
        if job.jid == "a" and runs.count("a") == 1:
            _fail_acks_of(backend, "L/0")
        else:
            backend.client.faults.clear()

    w = Worker(backend, handler, ["L"], ack_linger_s=0, interval_s=0.1, expiry_s=1.0, idle_s=0.05, until_complete=True)
    w.queue.busy_deadline_s = 0.3
    assert w.run(install_signals=False) == EXIT_OK
    assert sorted(runs) == ["a", "a", "b"], "the job whose ack failed ran again"
    job = backend.get(keys.JOB_SET, "L/0").bins
    assert job["state"] == "done" and job["att"] == 2, "its first attempt counted"


def test_a_failed_batched_ack_gives_the_job_back_instead_of_holding_it(tmp_path):
    """Acknowledged in batches by the worker's ack thread (the default): the batch
    fails, each ack is retried alone and fails too, and the job is given back."""
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    JobLists(backend).load("L", [JobSpec("a", {})], seal=True)
    runs: list[str] = []

    def handler(job):
        runs.append(job.jid)
        if len(runs) == 1:
            _fail_acks_of(backend, "L/0")
        else:
            backend.client.faults.clear()

    w = Worker(backend, handler, ["L"], interval_s=0.1, expiry_s=1.0, idle_s=0.05, until_complete=True)
    assert w.acks is None and w.ack_linger_s > 0, "batched acks are the default"
    w.queue.busy_deadline_s = 0.3
    assert w.run(install_signals=False) == EXIT_OK
    assert runs == ["a", "a"], "the job whose batched ack failed ran again"
    job = backend.get(keys.JOB_SET, "L/0").bins
    assert job["state"] == "done" and job["att"] == 2, "its first attempt counted"
    assert w.counters.snapshot()["done"] == 1


def test_a_missing_list_is_reported_once_not_every_poll(tmp_path, caplog):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    JobLists(backend).load("real", [JobSpec("a", {})], seal=True)
    w = Worker(backend, lambda job: None, ["real", "nope"], concurrency=2, interval_s=0.1, expiry_s=1.0,
               idle_s=0.01, until_complete=False)
    with caplog.at_level(logging.WARNING, logger="aeroqueue.worker"):
        import threading

        t = threading.Thread(target=w.run, kwargs={"install_signals": False})
        t.start()
        import time

        time.sleep(1.0)
        w.request_stop()
        t.join(10)
    missing = [r for r in caplog.records if getattr(r, "event", "") == "list_missing"]
    assert len(missing) == 1 and "nope" in missing[0].error
    assert w.counters.snapshot()["done"] == 1, "the other list was served"


def test_a_list_still_missing_is_reported_again_after_a_while(tmp_path, caplog, monkeypatch):
    """Said once only, a mistyped --list left a worker idle for ever after one line."""
    monkeypatch.setattr(worker_module, "MISSING_AGAIN_S", 0.4)
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    w = Worker(backend, lambda job: None, ["nope"], interval_s=0.1, expiry_s=1.0, idle_s=0.01, until_complete=True)
    with caplog.at_level(logging.WARNING, logger="aeroqueue.worker"), _running(w):
        wait_for("the third warning", lambda: len(_missing(caplog)) >= 3, 30)
    # Again and again, each at least 0.4 s after the last (it polls every 0.01 s).
    said = [r.created for r in _missing(caplog)]
    assert all(b - a >= 0.39 for a, b in itertools.pairwise(said)), said


def _missing(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "event", "") == "list_missing"]


@contextlib.contextmanager
def _running(w: Worker) -> Iterator[threading.Thread]:
    """The worker running on a thread of its own, stopped (and joined) on the way out."""
    t = threading.Thread(target=w.run, kwargs={"install_signals": False})
    t.start()
    try:
        yield t
    finally:
        w.request_stop()
        t.join(10)


@pytest.mark.parametrize("back", ["with-a-job", "empty"])
def test_a_list_missing_again_after_it_came_back_is_reported_again(tmp_path, caplog, back):
    """Once per absence, not once per name ever: dropped, made again and dropped again,
    the list's second absence is said too; also when it came back with no job to
    take (created empty, or emptied by other workers): it was there all the same."""
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    lists = JobLists(backend)
    ran: list[str] = []
    w = Worker(backend, lambda job: ran.append(job.jid), ["later"], concurrency=1, interval_s=0.1, expiry_s=1.0,
               idle_s=0.01, until_complete=False, idle_max_s=0.05)
    answered: list[int] = []  # jobs of each reservation the list answered
    reserve = w._reserve

    def counted(session, name):
        jobs = reserve(session, name)
        answered.append(len(jobs))
        return jobs

    w._reserve = counted  # type: ignore[method-assign]

    with caplog.at_level(logging.WARNING, logger="aeroqueue.worker"), _running(w) as t:
        wait_for("the first absence said", lambda: len(_missing(caplog)) == 1, 10)
        if back == "empty":
            lists.create("later")
            wait_for("the empty list polled", lambda: answered.count(0) >= 1, 10)
        else:
            lists.load("later", [JobSpec("a", {})], seal=True)
            wait_for("the job run", lambda: ran == ["a"], 10)
            wait_for("its ack", lambda: w.counters.snapshot()["done"] == 1, 10)
        lists.drop("later", grace_s=0)
        wait_for("the second absence said", lambda: len(_missing(caplog)) == 2, 10)
    assert not t.is_alive()
    assert all("later" in r.error for r in _missing(caplog))
