"""Answers lost when a cluster node dies mid-call: steps that are safe to repeat are
repeated, and a claim nobody works on is given back (embedded fault injection; the
same on a real cluster in tests/multinode)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aeroqueue import errors, keys, udfs
from aeroqueue.backends import IN_DOUBT, open_backend, wrap
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, reap
from aeroqueue.worker import EXIT_OK, Worker
from tests.conftest import mark_reaping


class _Coded(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code, self.msg = code, f"code {code}"


@pytest.mark.parametrize(
    ("code", "cls"),
    [(-15, errors.NodeUnreachable), (-10, errors.NodeUnreachable), (9, errors.BackendTimeout),
     (-8, errors.ClusterChanging), (7, errors.ClusterChanging), (11, errors.ClusterChanging)],
)
def test_a_lost_node_or_a_changing_cluster_is_in_doubt(code, cls):
    err = wrap(_Coded(code), "apply", "aq_job/L/0")
    assert type(err) is cls and isinstance(err, IN_DOUBT)
    assert isinstance(errors.NodeUnreachable(), errors.BackendTimeout), "the outcome is unknown, as for a timeout"


@pytest.fixture
def backend(tmp_path):
    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(b)
    return b


def test_a_session_whose_open_answer_was_lost_opens(backend):
    backend.client.faults.add(op="apply", function="open", error="TimeoutError", when="after")
    session = Session.open(backend, heartbeat=False)
    assert backend.get(keys.SESS_SET, session.id) is not None and backend.client.faults.fired == 1
    session.close()


def test_a_release_whose_answer_was_lost_is_repeated(backend):
    JobLists(backend).load("L", [JobSpec("a", {})])
    queue = Queue(backend, busy_deadline_s=1.0)
    with Session.open(backend, heartbeat=False) as s:
        [job] = queue.reserve("L", s)
        backend.client.faults.add(op="apply", function="release", error="TimeoutError", when="after")
        backend.client.faults.add(op="apply", function="push_retry", error="TimeoutError", when="after")
        assert queue.release(job) == "released"
        [again] = queue.reserve("L", s)
    assert again.token == job.token


def test_a_worker_gives_back_a_claim_of_its_session_that_no_thread_holds(backend):
    """A claim whose answer was lost past every retry stays claimed by the live session:
    no reaper touches it. The worker finds it and gives it back."""
    lists = JobLists(backend)
    lists.load("L", [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    lists.pause("L")
    ran: list[str] = []
    w = Worker(backend, lambda job: ran.append(job.jid), ["L"], interval_s=0.1, expiry_s=1.0, idle_s=0.05,
               reap_every_s=0.2, until_complete=True)
    exit_codes: list[int] = []
    t = threading.Thread(target=lambda: exit_codes.append(w.run(install_signals=False)), daemon=True)
    t.start()
    give_up = time.monotonic() + 5
    while w.session is None and time.monotonic() < give_up:
        time.sleep(0.01)
    assert w.session is not None
    # The lost claim: job 0 claimed under the worker's session, returned to none of its threads.
    got = backend.udf(keys.JOB_SET, keys.job_name("L", 0), keys.JOB_MOD, "claim", w.session.id, "lost-request")
    assert got["st"] == "ok"
    lists.pause("L", False)
    t.join(15)
    assert not t.is_alive(), "the orphaned claim was never given back: the list cannot complete"
    assert exit_codes == [EXIT_OK] and sorted(ran) == ["j0", "j1", "j2"]
    job = backend.get(keys.JOB_SET, keys.job_name("L", 0)).bins
    assert job["state"] == "done" and job["att"] == 2, "released with its attempt counted, then run once"


def test_a_session_that_cannot_give_back_its_claims_at_close_is_left_to_the_reaper(backend):
    """While partitions migrate the query for a session's claims can fail for many
    seconds: closing then must not crash the worker, nor strand its claims."""
    JobLists(backend).load("L", [JobSpec("a", {})])
    queue = Queue(backend, busy_deadline_s=0.2)
    s = Session.open(backend, heartbeat=False, interval_s=0.1, expiry_s=0.5)
    [job] = queue.reserve("L", s)
    backend.client.faults.add(op="apply", function="release", error="TimeoutError", times=-1)
    assert s.close() == 0  # no exception
    assert backend.get(keys.SESS_SET, s.id) is not None, "left to expire, not deleted with its claims"
    backend.client.faults.clear()
    time.sleep(0.6)
    report = reap(backend)
    assert (report.sessions, report.released) == (1, 1)
    with Session.open(backend, heartbeat=False) as other:
        [again] = queue.reserve("L", other)
    assert again.token == job.token


def _states(backend, name: str, n: int) -> list[str]:
    return [r.bins["state"] for r in backend.batch_get(keys.JOB_SET, [keys.job_name(name, t) for t in range(n)])]


def test_a_reap_cut_short_by_a_lost_answer_is_resumed_with_every_job_offered_again(backend):
    """design.md: a reap that dies half-way is resumed by the next one. The released
    jobs were pushed to the retry store only after the whole pass: a release in doubt
    ended it first, and the next pass no longer found them (their claim was gone)."""
    lists, queue = JobLists(backend), Queue(backend)
    lists.load("L", [JobSpec(f"j{i}", {"i": i}) for i in range(4)], seal=True)
    dead = Session.open(backend, heartbeat=False)
    assert len(queue.reserve("L", dead, 3)) == 3
    mark_reaping(backend, dead.id)
    backend.client.faults.add(op="apply", function="release", error="TimeoutError", skip=2, times=1)
    with pytest.raises(errors.AeroqueueError):
        reap(backend)
    assert reap(backend).sessions == 1 and backend.get(keys.SESS_SET, dead.id) is None
    assert _states(backend, "L", 4) == ["queued"] * 4
    st = lists.status("L")
    assert (st.retry_pending, st.reservable, st.in_flight) == (3, 1, 0), st
    with Session.open(backend) as s:
        assert sorted(j.jid for j in queue.reserve("L", s, 4)) == ["j0", "j1", "j2", "j3"]


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_close_whose_release_pass_is_repeated_offers_every_job_again(backend, when):
    """A release of the close's pass times out ("after": it landed, its answer lost):
    the repeated pass no longer finds a claim that landed, and with the session record
    deleted no reap's recount offered that job: it waited in no store for the regular
    sweep, minutes later, and a worker waiting for the list to complete with it."""
    lists, queue = JobLists(backend), Queue(backend)
    lists.load("L", [JobSpec(f"j{i}", {"i": i}) for i in range(4)], seal=True)
    s = Session.open(backend, heartbeat=False)
    assert len(queue.reserve("L", s, 3)) == 3
    backend.client.faults.add(op="apply", function="release", error="TimeoutError", skip=2, times=1, when=when)
    released = s.close()
    # Every pass's releases count: before, the second pass released the third; after,
    # the first pass released all three, the third's answer lost with it.
    assert released == (3 if when == "before" else 2)
    st = lists.status("L")
    assert (st.retry_pending, st.reservable, st.in_flight) == (3, 1, 0), st
    with Session.open(backend) as s2:
        assert sorted(j.jid for j in queue.reserve("L", s2, 4)) == ["j0", "j1", "j2", "j3"]


def test_a_reaper_killed_mid_reap_leaves_no_job_for_the_sweep(tmp_path):
    """A real SIGKILL: `aeroqueue reap` dies after releasing two of three claims, before
    it pushed them; the next `aeroqueue reap` resumes it and offers every job again
    (through its recount of the session's jobs)."""
    url = f"embedded://{tmp_path / 'k.db'}"
    backend = open_backend(url)
    udfs.register(backend)
    lists, queue = JobLists(backend), Queue(backend)
    lists.load("L", [JobSpec(f"j{i}", {"i": i}) for i in range(4)], seal=True)
    dead = Session.open(backend, heartbeat=False)
    assert len(queue.reserve("L", dead, 3)) == 3
    mark_reaping(backend, dead.id)
    root = Path(__file__).resolve().parents[2]
    crash = json.dumps([{"op": "apply", "function": "release", "crash": True, "skip": 2}])
    cmd = [sys.executable, "-m", "aeroqueue", "--url", url, "reap"]
    first = subprocess.run(cmd, env={**os.environ, "AEROQUEUE_EMBEDDED_FAULTS": crash}, cwd=root, capture_output=True)
    assert first.returncode == -signal.SIGKILL, first
    env = {k: v for k, v in os.environ.items() if k != "AEROQUEUE_EMBEDDED_FAULTS"}
    second = subprocess.run([*cmd, "--json"], env=env, cwd=root, capture_output=True, text=True)
    assert second.returncode == 0 and json.loads(second.stdout)["sessions"] == 1, second
    st = lists.status("L")
    assert (st.retry_pending, st.reservable, st.in_flight) == (3, 1, 0), st
    with Session.open(backend) as s:
        assert sorted(j.jid for j in queue.reserve("L", s, 4)) == ["j0", "j1", "j2", "j3"]


def test_a_close_given_up_counts_what_its_passes_released(backend):
    """The store stops answering after the close released one job: the close gives up
    (the record left to expire), and returned 0 where its by-list tally said 1."""
    lists, queue = JobLists(backend), Queue(backend)
    lists.load("L", [JobSpec(f"j{i}", {"i": i}) for i in range(3)], seal=True)
    s = Session.open(backend, heartbeat=False, interval_s=0.2, expiry_s=0.5)
    assert len(queue.reserve("L", s, 3)) == 3
    backend.client.faults.add(op="apply", function="release", error="TimeoutError", skip=1, times=10_000)
    released = s.close()
    assert released == sum(s.released_at_close.values()) == 1, (released, s.released_at_close)
    assert len(s.ended_at_close) == 1
