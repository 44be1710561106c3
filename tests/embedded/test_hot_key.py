"""RecordBusy on the hot list record: retried with backoff, surfaced only after the deadline."""

from __future__ import annotations

import time

import pytest

from aeroqueue import errors, udfs
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session


@pytest.fixture
def env(tmp_path):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    JobLists(backend).load("hot", [JobSpec(f"j{i}", {}) for i in range(10)])
    return backend, Session.open(backend, heartbeat=False)


@pytest.mark.parametrize("count", [1, 2], ids=["one-job", "batch"])
def test_busy_list_record_is_retried_and_never_reaches_the_caller(env, count):
    """One job (`Queue._reserve_one`, no retry loop around its first take) and a batch alike."""
    backend, session = env
    backend.client.faults.add(op="apply", function="take", error="RecordBusy", times=6)
    jobs = Queue(backend).reserve("hot", session, count)
    assert [j.token for j in jobs] == list(range(count))
    assert backend.client.faults.fired == 6


def test_busy_past_the_deadline_reaches_the_caller(env):
    backend, session = env
    backend.client.faults.add(op="apply", function="take", error="RecordBusy", times=-1)
    started = time.monotonic()
    with pytest.raises(errors.RecordBusy) as e:
        Queue(backend, busy_deadline_s=0.2).reserve("hot", session)
    assert 0.2 <= time.monotonic() - started < 2.0
    assert "aq_list/hot" in str(e.value) and "take" in str(e.value)


def test_busy_job_in_a_batch_claim_is_claimed_alone(env):
    backend, session = env
    backend.client.faults.add(op="batch_apply", function="claim", key="hot/3", error="RecordBusy", times=1)
    jobs = Queue(backend).reserve("hot", session, 5)
    assert sorted(j.token for j in jobs) == [0, 1, 2, 3, 4], "the busy job was retried on its own"


def test_timeout_after_commit_on_complete_is_retried_harmlessly(env):
    """In doubt: the complete happened but the client heard a timeout; the retry answers 'again'."""
    backend, session = env
    queue = Queue(backend, busy_deadline_s=0.3)
    [job] = queue.reserve("hot", session)
    fault = backend.client.faults.add(op="apply", function="complete", error="TimeoutError", when="after")
    queue.complete(job, "r")  # one lost answer: complete repeats itself, and the repeat answers 'again'
    assert fault.times == 0 and JobLists(backend).status("hot").done == 1
    [job] = queue.reserve("hot", session)
    backend.client.faults.add(op="apply", function="complete", error="TimeoutError", when="after", times=-1)
    with pytest.raises(errors.BackendTimeout):  # still in doubt at the deadline: the caller hears it
        queue.complete(job, "r")
    backend.client.faults.clear()
    queue.complete(job, "r")  # the caller retries: harmless, and the bit gets set
    st = JobLists(backend).status("hot")
    assert st.done == 2
