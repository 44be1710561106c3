"""Calls whose answer is lost (timeouts after the write), and interrupted operator
commands: no job may be stranded, duplicated or lost (invariant 3)."""

from __future__ import annotations

import pytest

from aeroqueue import errors, keys, udfs
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, sweep


@pytest.fixture
def env(tmp_path):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    return backend, JobLists(backend), Queue(backend, busy_deadline_s=0.3), Session.open(backend, heartbeat=False)


def specs(n: int) -> list[JobSpec]:
    return [JobSpec(f"j{i}", {"i": i}) for i in range(n)]


def test_a_claim_whose_answer_was_lost_is_retried_not_stranded(env):
    backend, lists, queue, session = env
    lists.load("L", specs(2))
    # One claim is a UDF call (a batch's are native operations: the next test).
    fault = backend.client.faults.add(op="apply", function="claim", error="TimeoutError", when="after")
    [job] = queue.reserve("L", session)
    assert fault.times == 0, "the fault fired"
    assert job.token == 0 and job.attempt == 1, "the repeated claim answered 'ok' for the claim that happened"


def test_a_batch_claim_whose_answer_was_lost_returns_every_job(env):
    backend, lists, queue, session = env
    lists.load("L", specs(3))
    fault = backend.client.faults.add(op="batch_operate", key="L/1", error="TimeoutError", when="after")
    jobs = queue.reserve("L", session, 3)
    assert fault.times == 0, "the fault fired"
    assert sorted(j.token for j in jobs) == [0, 1, 2]
    assert [j.attempt for j in jobs] == [1, 1, 1], "the claim that happened was recognised, not made again"


def test_reserve_keeps_what_it_claimed_when_a_later_step_fails(env):
    backend, lists, queue, session = env
    lists.load("L", specs(4))
    backend.put(keys.JOB_SET, keys.job_name("L", 1), {"state": "void"})  # makes reserve take again
    backend.client.faults.add(op="apply", function="take", error="RecordBusy", skip=1, times=-1)
    jobs = queue.reserve("L", session, 2)
    assert [j.token for j in jobs] == [0], "the claimed job is returned, not dropped"


def test_a_fail_whose_answer_was_lost_still_requeues_the_job(env):
    backend, lists, queue, session = env
    lists.load("L", specs(1), backoff_s=0)  # retried at once: the retry store, not the schedule
    [job] = queue.reserve("L", session)
    backend.client.faults.add(op="apply", function="fail", error="TimeoutError", when="after", times=-1)
    with pytest.raises(errors.BackendTimeout):  # in doubt until the deadline: the caller hears it
        queue.fail(job, "boom")
    backend.client.faults.clear()
    assert queue.fail(job, "boom") == "retry", "the repeated fail answers as the first"
    [again] = queue.reserve("L", session)
    assert again.token == job.token and again.attempt == 2


def test_an_interrupted_kick_is_finished_by_the_sweeper(env):
    backend, lists, queue, session = env
    lists.load("L", specs(3), max_attempts=1, seal=True)
    a, b, c = queue.reserve("L", session, 3)
    queue.complete(a)
    assert queue.fail(b, "boom") == "dead" and queue.fail(c, "boom") == "dead"
    assert lists.status("L").complete
    # The operator's kick dies after kicking the first dead job.
    backend.client.faults.add(op="apply", function="kick", error="TimeoutError", skip=1, times=-1)
    with pytest.raises(errors.BackendTimeout):
        lists.kick("L")
    backend.client.faults.clear()
    assert not lists.status("L").complete, "a list with a kicked job waiting must not look complete"
    report = sweep(backend, grace_ms=0)
    assert (report.requeued, report.recounted) == (1, 1), "one requeued, the one still dead counted again"
    [kicked] = queue.reserve("L", session)
    assert kicked.token == b.token
    st = lists.status("L")
    assert (st.dead, st.reservable, st.retry_pending) == (1, 0, 0)


def test_a_failed_index_write_leaves_the_range_for_recovery_not_a_lost_job(env):
    backend, lists, queue, session = env
    backend.client.faults.add(op="batch_write", key="L/j1", error="TimeoutError", times=-1)
    lists.write_retry_s = 0.2  # the load repeats the write this long, then gives up
    with pytest.raises(errors.LoadAbandoned, match="indexing job ids failed"):
        lists.load("L", specs(3), lease_ms=0)
    backend.client.faults.clear()
    lists.load("L", specs(3), lease_ms=0)  # the re-run recovers the range first
    got = queue.reserve("L", session, 10)
    assert sorted(j.jid for j in got) == ["j0", "j1", "j2"], "every job once, none voided by guess"
    assert lists.status("L").total == 3


def test_complete_many_reports_a_claim_lost_in_its_fallback_and_counts_the_rest(env):
    backend, lists, queue, session = env
    lists.load("L", specs(3))
    jobs = queue.reserve("L", session, 3)
    queue.release(jobs[1])  # the second job's claim is gone
    # Acks of one claim without results go as one batch_operate (hotpath.py).
    fault = backend.client.faults.add(op="batch_operate", key="L/1", error="RecordBusy")
    lost = queue.complete_many(jobs)
    assert fault.times == 0, "the fault fired"
    assert [j.token for j in lost] == [1]
    assert lists.status("L").done == 2, "the completed ones are counted"


def test_a_batch_whose_lone_claim_fails_hands_out_what_it_claimed(env):
    """One token of a batch left to the UDF (here a buried job) whose claim fails outright
    (not in doubt): the jobs the batch did claim are handed out, not dropped and held by
    this live session until their time limit."""
    from aeroqueue import transitions

    backend, lists, queue, session = env
    lists.load("L", specs(5))
    assert transitions.bury(backend, "L", 2, "operator") == "dead"
    backend.client.faults.add(op="apply", function="claim", error="ServerError")
    got = queue.reserve("L", session, 5)
    assert sorted(j.token for j in got) == [0, 1, 3, 4]
    for job in got:
        queue.complete(job, "ok")
    assert lists.status("L").done == 4
    # With nothing claimed, the failure reaches the caller.
    lists.load("M", specs(1))
    assert transitions.bury(backend, "M", 0, "operator") == "dead"
    backend.client.faults.add(op="apply", function="claim", error="ServerError")
    with pytest.raises(errors.BackendError):
        queue.reserve("M", session, 5)
