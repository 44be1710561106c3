"""A process that forks with aeroqueue in use (a pre-fork web server: gunicorn
--preload, `multiprocessing` on Linux). On every backend.

Found by an audit of the API path under pre-fork servers: a session opened
before the fork and closed by one child gave back the jobs another child held
(they ran twice); a child's completion counts were never written (its bit
writer was the parent's thread, not there); a child sharing the parent's
aerospike client got answers meant for another process; a job could not be
pickled to hand it to another process."""

from __future__ import annotations

import copy
import os
import pickle
import signal
import time
from collections.abc import Callable

import pytest

from aeroqueue import keys, udfs
from aeroqueue.backends import Backend, open_backend
from aeroqueue.errors import SessionForked, StoreForked
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session


def _in_child(body: Callable[[], bool], timeout_s: float = 20) -> None:
    """Run `body` in a forked child; the test fails unless it returns True there."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            signal.alarm(int(timeout_s))  # a hang ends the child, and the test fails
            code = 0 if body() else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child said no (status {status})"


def test_a_session_from_before_a_fork_takes_no_work_and_its_close_gives_back_nothing(
    registered: Backend, lists: JobLists, list_name: str,
) -> None:
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(4)], seal=True)
    queue = Queue(registered)
    session = Session.open(registered, heartbeat=False)
    try:
        held = queue.reserve(list_name, session, 2)
        assert len(held) == 2

        def child() -> bool:
            try:
                queue.reserve(list_name, session, 1)
            except SessionForked as e:
                said = "before a fork: open a session in each process after it forks" in str(e)
            else:
                return False
            return said and session.close() == 0 and session.closed

        _in_child(child)
        for job in held:  # the parent's claims are its own still
            assert registered.get(keys.JOB_SET, job.name).bins["state"] == "claimed"
        assert queue.complete_many(held) == []
    finally:
        session.close()


def test_a_job_pickles_and_its_copy_acknowledges(registered: Backend, lists: JobLists, list_name: str) -> None:
    """Pickled (for another process) or deep-copied, a job leaves its queue's touch
    behind: it dragged the store's client along ("cannot pickle 'aerospike.Client'")."""
    lists.load(list_name, [JobSpec("a", {"n": 1}), JobSpec("b", {"n": 2})], seal=True)
    queue = Queue(registered)
    with Session.open(registered, heartbeat=False) as session:
        first, second = queue.reserve(list_name, session, 2)
        sent = pickle.loads(pickle.dumps(first))
        assert sent == first and sent.toucher is None and sent.payload == {"n": 1}
        assert copy.deepcopy(second) == second
        queue.complete(sent, "from elsewhere")
        queue.complete(copy.deepcopy(second), "copied")
    assert registered.get(keys.JOB_SET, first.name).bins["result"] == "from elsewhere"
    assert lists.status(list_name).done == 2


def test_a_forked_child_writes_the_completion_counts_of_its_acks(tmp_path, list_name: str) -> None:
    """The parent had acknowledged a job (its bit writer thread started); a child
    forked then, acknowledging through the store it inherited (the embedded store
    is made for that), had its bits wait for 512 of them, a flush or its exit: a
    pre-fork server's worker never had its jobs counted done while it lived."""
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    lists, queue = JobLists(backend), Queue(backend)
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(6)], seal=True)
    with Session.open(backend, heartbeat=False) as session:
        queue.complete(queue.reserve(list_name, session, 1)[0])
    acked_r, acked_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: acknowledges, says so, and lives on without a flush or an exit
        try:
            signal.alarm(30)
            session = Session.open(backend, heartbeat=False)
            assert queue.complete_many(queue.reserve(list_name, session, 5)) == []
            os.write(acked_w, b"1")
            time.sleep(30)
        finally:
            os._exit(0)
    os.close(acked_w)  # a child that fails before it says so closes the pipe: the read ends
    try:
        assert os.read(acked_r, 1) == b"1", "the child acknowledged"
        give_up = time.monotonic() + 10
        while lists.status(list_name).done != 6:  # read here: written by the child's writer, or never
            assert time.monotonic() < give_up, f"the child's acks are not counted: {lists.status(list_name)}"
            time.sleep(0.02)
        assert lists.status(list_name).complete
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(acked_r)


def test_a_store_connection_from_before_a_fork_refuses_to_serve_the_child(registered: Backend) -> None:
    """The aerospike client's sockets, shared by parent and child, carried both
    processes' calls: answers crossed (a session 'already exists', another call's
    reply). The child is refused, saying what to do; the parent's connection is
    untouched. The embedded store's connection serves both."""
    key = f"fork-{os.getpid()}"
    registered.put("aq_test", key, {"v": 1})

    def child() -> bool:
        if registered.is_embedded:
            return registered.get("aq_test", key) is not None
        with pytest.raises(StoreForked, match="Connect in each process after it forks"):
            registered.get("aq_test", key)
        registered.close()  # the parent's client: nothing of it is closed from here
        return True

    _in_child(child)
    assert registered.get("aq_test", key).bins == {"v": 1}
    registered.remove("aq_test", key)
