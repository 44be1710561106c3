"""Fault injection on the embedded backend: errors before and after a write, and crashes."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal

import pytest

from aeroqueue import errors
from aeroqueue.backends import open_backend, retry_busy
from aeroqueue.backends.embedded.faults import ENV_FAULTS


def test_error_before_leaves_nothing_written(tmp_path):
    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    b.client.faults.add(op="put", error="TimeoutError")
    with pytest.raises(errors.BackendTimeout):
        b.put("s", "k", {"a": 1})
    assert b.get("s", "k") is None
    b.put("s", "k", {"a": 1})  # fired once only
    assert b.get("s", "k").bins == {"a": 1}


def test_error_after_commit_is_in_doubt_but_written(tmp_path):
    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    b.client.faults.add(op="put", error="TimeoutError", when="after")
    with pytest.raises(errors.BackendTimeout) as e:
        b.put("s", "k", {"a": 1})
    assert e.value.__cause__.in_doubt is True
    assert b.get("s", "k").bins == {"a": 1}


def test_record_busy_is_retried_until_it_clears(tmp_path):
    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    b.put("s", "k", {"a": 1})
    b.client.faults.add(op="get", error="RecordBusy", times=3)
    assert retry_busy(lambda: b.get("s", "k")).bins == {"a": 1}
    assert b.client.faults.fired == 3
    b.client.faults.add(op="get", error="RecordBusy", times=-1)
    with pytest.raises(errors.RecordBusy):
        retry_busy(lambda: b.get("s", "k"), deadline_s=0.05)


def test_fault_matches_key_and_skips(tmp_path):
    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    b.client.faults.add(op="put", key="victim", error="RecordBusy", skip=1)
    b.put("s", "victim", {"a": 1})  # skipped once
    b.put("s", "other", {"a": 1})  # another key
    with pytest.raises(errors.RecordBusy):
        b.put("s", "victim", {"a": 2})


def _crash_mid_put(path: str) -> None:
    os.environ[ENV_FAULTS] = json.dumps([{"op": "put", "key": "k2", "crash": True}])
    b = open_backend(f"embedded://{path}")
    b.put("s", "k1", {"a": 1})
    b.put("s", "k2", {"a": 2})  # dies here, before writing
    b.put("s", "k3", {"a": 3})


def test_process_killed_mid_operation_leaves_store_consistent(tmp_path):
    path = str(tmp_path / "s.db")
    p = mp.get_context("spawn").Process(target=_crash_mid_put, args=(path,))
    p.start()
    p.join(60)
    assert p.exitcode == -signal.SIGKILL
    b = open_backend(f"embedded://{path}")
    assert b.get("s", "k1").bins == {"a": 1}
    assert b.get("s", "k2") is None and b.get("s", "k3") is None
    b.put("s", "k2", {"a": 2})  # the store is still writable
    assert b.get("s", "k2").bins == {"a": 2}


def test_bad_fault_spec_is_refused():
    from aeroqueue.backends.embedded import Faults

    with pytest.raises(ValueError, match="NoSuchError"):
        Faults().add(op="put", error="NoSuchError")
    with pytest.raises(ValueError, match="when"):
        Faults().add(op="put", error="RecordBusy", when="during")


def test_batch_fault_after_commit_leaves_the_record_written_but_in_doubt(tmp_path):
    from aeroqueue import udfs
    from aeroqueue.keys import JOB_MOD, JOB_SET

    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(b)
    for name in ("L/0", "L/1"):
        b.put(JOB_SET, name, {"state": "queued", "token": int(name[-1]), "att": 0})
    b.client.faults.add(op="batch_apply", function="claim", key="L/1", error="TimeoutError", when="after")
    keys = [b.key(JOB_SET, "L/0"), b.key(JOB_SET, "L/1")]
    out = b.client.batch_apply(keys, JOB_MOD, "claim", ["s1"])
    assert [(r.result, r.in_doubt) for r in out.batch_records] == [(0, False), (9, True)]
    assert out.result == -16
    assert b.get(JOB_SET, "L/1").bins["state"] == "claimed", "it happened; only the answer was lost"


def test_a_load_whose_alloc_answer_was_lost_goes_on_without_a_second_range(tmp_path):
    """An alloc that took effect but whose answer was lost (a timeout, a node lost) is
    repeated under the range's id and answers the same range: the load goes on, and
    no orphan range is left pending (one would hold back every later range's
    publication until its lease ran out and a recovery voided it)."""
    from aeroqueue import udfs
    from aeroqueue.lists import JobLists
    from aeroqueue.loading import JobSpec

    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(b)
    lists = JobLists(b)
    b.client.faults.add(op="apply", function="alloc", error="TimeoutError", when="after", skip=1)
    report = lists.load("l", [JobSpec(f"j{i}", {"i": i}) for i in range(30)], seal=True, chunk_size=10)
    assert b.client.faults.fired == 1, "the second range's alloc answer was lost"
    assert (report.loaded, report.skipped) == (30, 0)
    head = lists.header("l")
    assert (head["alloc"], head["tail"], head["seq"], head["pubs"]) == (30, 30, 3, 3)
    assert not head.get("pend")
    st = lists.status("l")
    assert (st.total, st.reservable, st.pending_ranges) == (30, 30, 0)


def test_a_store_locked_by_a_stopped_process_is_a_clear_timeout_when_opened(tmp_path, monkeypatch):
    """A store whose write lock a stopped process holds: opening it (which writes
    the schema on a new file) times out as any write does, with aeroqueue's
    BackendTimeout naming the store; the CLI said "internal error ... please report
    it" after 60 s."""
    import fcntl

    from aeroqueue.backends.embedded import storage

    path = tmp_path / "s.db"
    monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 0.3)
    holder = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # what a writer stopped mid-write holds
        with pytest.raises(errors.BackendTimeout, match=r"open on embedded://.*s\.db failed: .*locked for 0 s"):
            open_backend(f"embedded://{path}")
    finally:
        os.close(holder)
    b = open_backend(f"embedded://{path}")  # free again: it opens
    b.put("s", "k", {"a": 1})
    assert b.get("s", "k").bins == {"a": 1}


def test_a_load_whose_id_chunk_answer_was_lost_goes_on(tmp_path):
    """ID mode: the put of a range's ID-store chunk took effect but its answer was lost
    (a timeout, a node lost; a loader stopped past the client's time limit saw one on a
    server). It is create-only, so it is safe to repeat (the repeat answers
    RecordExists): the load goes on, as it does after every other step of a range.
    It failed the whole load, its range left for a later load to recover."""
    from aeroqueue import udfs
    from aeroqueue.lists import JobLists
    from aeroqueue.loading import JobSpec
    from aeroqueue.queue import Queue
    from aeroqueue.sessions import Session

    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(b)
    lists = JobLists(b)
    b.client.faults.add(op="put", key="l/1", error="TimeoutError", when="after")
    report = lists.load("l", [JobSpec(f"j{i}", {"i": i}) for i in range(30)], mode="ids", seal=True, chunk_size=10)
    assert b.client.faults.fired == 1, "the second chunk's answer was lost"
    assert (report.loaded, report.skipped) == (30, 0)
    st = lists.status("l")
    assert (st.total, st.reservable, st.pending_ranges) == (30, 30, 0)
    with Session.open(b, heartbeat=False) as s:
        assert sorted(j.jid for j in Queue(b).reserve("l", s, 40)) == sorted(f"j{i}" for i in range(30))
