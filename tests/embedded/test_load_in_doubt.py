"""Loads whose batch writes are answered in doubt (a cluster node dying, migrations):
a lost answer is not a clash with a recovery, and a real clash or a lasting failure
says what happened. The same paths run on a real cluster in tests/multinode."""

from __future__ import annotations

import pytest

from aeroqueue import errors, udfs
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session

N = 6


@pytest.fixture
def env(tmp_path):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    return backend, JobLists(backend)


def items(n: int = N) -> list[tuple[str, dict]]:
    return [(f"j{i}", {"i": i}) for i in range(n)]


def every_job_once(backend, lists: JobLists, name: str = "L", n: int = N) -> None:
    """Every job loaded exactly once and reservable; nothing left pending."""
    st = lists.status(name)
    assert (st.total, st.pending_ranges) == (n, 0), st
    with Session.open(backend, heartbeat=False) as s:
        got = Queue(backend).reserve(name, s, 10 * n)
    assert sorted(j.jid for j in got) == sorted(f"j{i}" for i in range(n))


def test_job_writes_whose_answers_were_lost_are_the_loads_own(env):
    """The writes landed but their answers were lost: the repeat answers RecordExists,
    which the record itself shows to be this load's job, not a recovery's void."""
    backend, lists = env
    backend.client.faults.add(op="batch_write", key="L/", error="TimeoutError", when="after", times=3)
    report = lists.load("L", items(), seal=True)
    assert (report.loaded, report.skipped, report.voided) == (N, 0, 0)
    assert backend.client.faults.fired == 3
    every_job_once(backend, lists)


def test_writes_refused_for_now_are_repeated(env):
    backend, lists = env
    # Nothing landed (a busy key, an overloaded node), for the jobs and for the index.
    backend.client.faults.add(op="batch_write", key="L/", error="RecordBusy", times=4)
    backend.client.faults.add(op="batch_write", key="L/j", error="DeviceOverload", times=2)
    assert lists.load("L", items(), seal=True).loaded == N
    every_job_once(backend, lists)


def test_index_writes_whose_answers_were_lost_leave_no_void(env):
    backend, lists = env
    backend.client.faults.add(op="batch_write", key="L/j", error="TimeoutError", when="after", times=N)
    assert lists.load("L", items(), seal=True).voided == 0
    every_job_once(backend, lists)


def test_a_failure_that_lasts_is_reported_with_its_code_and_the_rerun_completes(env):
    backend, lists = env
    lists.write_retry_s = 0.3
    backend.client.faults.add(op="batch_write", key="L/1", error="TimeoutError", times=-1)
    with pytest.raises(errors.LoadAbandoned) as e:
        lists.load("L", items(), lease_ms=0)
    text = str(e.value)
    assert "writing the jobs of load range 0 failed (1 record: Aerospike code 9 (timeout))" in text, text
    assert "run the load again" in text and "recovered by another process" not in text
    backend.client.faults.clear()
    report = lists.load("L", items(), seal=True, lease_ms=0)  # recovers range 0 first
    assert report.loaded + report.skipped == N
    every_job_once(backend, lists)


def test_a_range_recovered_before_its_jobs_were_written_is_a_real_clash(env, monkeypatch):
    """The loader stalled past its lease and a recovery voided its range: that, and
    only that, is reported as a clash."""
    backend, lists = env
    real = JobLists._batch_write
    stalled = []

    def stall_then_write(self, writes, what, stamp=None):
        if what == "write jobs" and not stalled:
            stalled.append(True)
            JobLists(backend).recover("L")  # another process, after the lease ran out
        return real(self, writes, what, stamp)

    monkeypatch.setattr(JobLists, "_batch_write", stall_then_write)
    with pytest.raises(errors.LoadAbandoned, match=r"load range 0 outlived its lease \(0 s\) and was finished by a recovery"):
        lists.load("L", items(), lease_ms=0)
    monkeypatch.setattr(JobLists, "_batch_write", real)
    assert lists.load("L", items(), seal=True).loaded == N
    every_job_once(backend, lists)  # the recovered range's tokens are void; each job is loaded once
