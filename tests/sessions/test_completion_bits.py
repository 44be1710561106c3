"""Completion bits written in bulk (transitions.BitBuffer), on every backend.

The bits of a process's acks are written a little after the acks; a process
killed before that leaves done jobs uncounted until its session is reaped,
and the reaper counts them. Real processes and SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from aeroqueue import keys, sessions, transitions
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, reap
from tests.conftest import mark_reaping

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from aeroqueue import transitions
    from aeroqueue.backends import open_backend
    from aeroqueue.queue import Queue
    from aeroqueue.sessions import Session

    backend = open_backend(sys.argv[1])
    transitions.bit_buffer(backend).max_delay_s = 3600  # nothing is written before the kill
    queue = Queue(backend)
    session = Session.open(backend, interval_s=0.2, expiry_s=1.0, heartbeat=False)
    jobs = queue.reserve(sys.argv[2], session, 4)
    for job in jobs[:3]:
        queue.complete(job, "ok")
    print(session.id, " ".join(str(j.token) for j in jobs), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_acks_count_at_once_in_the_acking_process(lists, queue: Queue, session, list_name):
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(5)], seal=True)
    jobs = queue.reserve(list_name, session, 5)
    queue.complete_many(jobs[:2], ["a", "b"])
    queue.complete(jobs[2], "c")
    st = lists.status(list_name)  # flushes this process's pending bits first
    assert (st.done, st.in_flight) == (3, 2)
    reserved, lost = queue.complete_and_reserve([(jobs[3], "d"), (jobs[4], "e")], list_name, session, 1)
    assert (reserved, lost) == ([], [])
    st = lists.status(list_name)
    assert (st.done, st.in_flight, st.complete) == (5, 0, True)


def test_bits_a_killed_process_never_wrote_are_counted_when_it_is_reaped(registered, store_url, list_name):
    lists = JobLists(registered)
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(4)], seal=True)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", CHILD, store_url, list_name], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    session_id, *words = out.stdout.split()
    tokens = [int(t) for t in words]
    assert len(tokens) == 4
    done = [registered.get(keys.JOB_SET, keys.job_name(list_name, t)).bins["state"] for t in tokens]
    assert done == ["done", "done", "done", "claimed"], "three acks landed before the kill"
    assert lists.status(list_name).done == 0, "their bits were still in the killed process"

    give_up = time.monotonic() + 30
    # Its session expires 1 s after its last beat (a shared server may hold other
    # expired sessions too: wait for this one).
    while registered.get(keys.SESS_SET, session_id) is not None:
        assert time.monotonic() < give_up, "the killed process's session was never reaped"
        reap(registered)
        time.sleep(0.2)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.in_flight, st.retry_pending) == (3, 0, 0, 1), "counted, and the 4th came back"


def test_a_reap_does_not_offer_again_jobs_reserved_while_it_recounts(registered, lists, queue, list_name, monkeypatch):
    """The reap's recount offers again the jobs a cut-short release left in no store. It
    read the retry store only after its scan of the job set: jobs the release had
    pushed and a worker had claimed since were pushed a second time (counted retry
    pending while in flight, and a second copy to fence)."""
    lists.load(list_name, [JobSpec(f"j{i}", {"i": i}) for i in range(6)], seal=True)
    # Sessions another test left expired, as on a shared server: the reap ends them too.
    others = f"{list_name}-others"
    lists.load(others, [JobSpec(f"o{i}", {}) for i in range(8)], seal=True)
    for _ in range(8):
        left = Session.open(registered, heartbeat=False)
        assert len(queue.reserve(others, left, 1)) == 1
        mark_reaping(registered, left.id)
    dead = Session.open(registered, heartbeat=False)
    assert len(queue.reserve(list_name, dead, 3)) == 3
    mark_reaping(registered, dead.id)
    live = Session.open(registered, heartbeat=False)
    got: list = []
    scan = registered.scan
    # The recount of this test's session only: on a shared server the reap also ends
    # sessions earlier tests left expired, and the recount of one of those, if it came
    # first, reserved before this session's claims were released (tokens 3 to 5).
    recounting: list[str] = []
    recount = sessions.recount_session

    def recount_noted(backend, session_id):
        recounting.append(session_id)
        try:
            return recount(backend, session_id)
        finally:
            recounting.pop()

    monkeypatch.setattr(sessions, "recount_session", recount_noted)

    def scan_while_reserving(set_name, **kw):  # another worker takes the released jobs meanwhile
        out = list(scan(set_name, **kw))
        if set_name == keys.JOB_SET and recounting == [dead.id] and not got:
            got.extend(queue.reserve(list_name, live, 3))
        return iter(out)

    registered.scan = scan_while_reserving  # type: ignore[method-assign]
    try:
        assert reap(registered).sessions >= 9
    finally:
        registered.scan = scan  # type: ignore[method-assign]
    assert sorted(j.token for j in got) == [0, 1, 2]
    assert lists.status(others).retry_pending == 8, "the other sessions' jobs were offered again too"
    assert not registered.get(keys.LIST_SET, list_name).bins.get("retry"), "claimed jobs pushed again"
    st = lists.status(list_name)
    assert (st.retry_pending, st.in_flight, st.reservable) == (0, 3, 3), st
    live.close()


def test_clearing_a_bit_never_makes_a_bitmap_record(registered, lists, list_name):
    """A dead bit checked against its job (`transitions.check_dead_bits`: the sweep's
    check of every dead bit, a status about to mark a list complete) is cleared when
    the job is not dead, or gone: a drop deleted it, and the list's bitmaps with it.
    A clear made the chunk again (8 KiB of zeros), a record of a list that no longer
    exists, which no drop deletes (it has done its deleting)."""
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    lists.drop(list_name, grace_s=0)
    chunk = keys.chunk_name(list_name, 0)
    assert transitions.check_dead_bits(registered, list_name, [1]) == 1, "no job: its bit is cleared"
    transitions.set_bits(registered, list_name, [2, keys.BITS_PER_CHUNK + 2], "done", 0)
    assert registered.get(keys.DONE_SET, chunk) is None
    assert registered.get(keys.DONE_SET, keys.chunk_name(list_name, 1)) is None
    # A chunk that exists is cleared as before.
    transitions.set_bits(registered, list_name, [1, 2], "dead", 1)
    transitions.set_bits(registered, list_name, [2], "dead", 0)
    rec = registered.get(keys.DONE_SET, chunk)
    assert rec is not None and [keys.bit_is_set(bytes(rec.bins["dead"]), b) for b in (1, 2)] == [True, False]
