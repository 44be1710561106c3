"""Dropping a list (`JobLists.drop`, `aeroqueue drop`), on every backend: nothing of it
is left in any set, its neighbours are untouched, a missing list is a clear error, a
load in progress is refused, an interrupted drop finishes when run again, and a
worker holding claims on it carries on."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from aerospike_helpers.operations import operations as op
from click.testing import CliRunner

from aeroqueue import errors, keys, sessions, transitions
from aeroqueue.backends import Backend
from aeroqueue.backends.base import N_PARTITIONS
from aeroqueue.cli import main
from aeroqueue.lists import JobLists
from aeroqueue.loading import Checked, JobSpec
from aeroqueue.queue import REPLACED_RETAKES, Job, Queue
from aeroqueue.sessions import Session
from aeroqueue.worker import EXIT_OK, Worker
from tests.conftest import mark_reaping

SETS = (keys.LIST_SET, keys.JOB_SET, keys.JIDX_SET, keys.IDS_SET, keys.DONE_SET, keys.BLOCK_SET)


def specs(n: int, prefix: str = "job-") -> list[JobSpec]:
    return [JobSpec(f"{prefix}{i}", {"n": i}) for i in range(n)]


def leftovers(backend, name: str) -> dict[str, list[str]]:
    """Every record of any aeroqueue set that belongs to list `name`, by scanning the sets:
    by record name, and job records by their `list` bin. The drop's tombstone (its list
    record, a missing list to every reader) is not one."""
    found: dict[str, list[str]] = {}
    for set_name in SETS:
        for rec_name, rec in backend.scan(set_name):
            if set_name == keys.LIST_SET and rec.bins.get("dropped") is not None:
                continue
            if rec_name == name or str(rec_name).startswith(name + "/") or rec.bins.get("list") == name:
                found.setdefault(set_name, []).append(rec_name)
    return found


def busy_list(queue: Queue, lists: JobLists, session, name: str, mode: str = "tokens") -> None:
    """A list with every kind of record: done, dead, retried and claimed jobs, bitmaps."""
    lists.load(name, specs(30), mode=mode, max_attempts=1, seal=True)
    jobs = queue.reserve(name, session, 12)
    for j in jobs[:5]:
        queue.complete(j, {"ok": True})
    for j in jobs[5:8]:
        queue.fail(j, "boom")  # max_attempts=1: dead, with its dead bit
    queue.release(jobs[8], refund=True)  # onto the retry store
    queue.flush()
    st = lists.status(name)
    assert (st.done, st.dead, st.retry_pending) == (5, 3, 1)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_drop_leaves_nothing_of_the_list_and_spares_its_neighbours(registered, queue, lists, list_name, session, mode):
    neighbour = f"{list_name}-2"  # a name that starts with the dropped one
    busy_list(queue, lists, session, list_name, mode)
    lists.load(neighbour, specs(7), mode=mode, seal=True)
    before = leftovers(registered, list_name)
    assert set(before) >= {keys.LIST_SET, keys.JOB_SET, keys.JIDX_SET, keys.DONE_SET}
    assert (keys.BLOCK_SET in before) == (mode == "tokens")
    report = lists.drop(list_name, grace_s=0.1)
    assert (report.jobs, report.index, report.bitmaps) == (30, 30, 1)
    assert report.id_chunks == (1 if mode == "ids" else 0)
    assert leftovers(registered, list_name) == {}
    # The list record is a tombstone: what finds the list's records again, nothing else.
    assert set(registered.get(keys.LIST_SET, list_name).bins) == {"dropped", "alloc", "seq"}
    assert list_name not in lists.names()
    st = lists.status(neighbour)
    assert (st.total, st.reservable) == (7, 7)
    assert len(queue.reserve(neighbour, session, 10)) == 7


def test_drop_of_a_missing_list_is_a_clear_error(lists, list_name):
    lists.load(list_name, specs(3), seal=True)
    lists.drop(list_name, grace_s=0)
    with pytest.raises(errors.ListNotFound, match=f"no job list named '{list_name}'"):
        lists.drop(list_name)
    with pytest.raises(errors.ListNotFound):
        lists.drop("never-there-" + list_name)


def test_a_load_in_progress_is_refused_and_nothing_changes(lists, list_name):
    lists.load(list_name, specs(3))
    lists._list_udf(list_name, "alloc", 10, 60_000)  # a loader's range, lease running
    with pytest.raises(errors.ListError, match="load in progress"):
        lists.drop(list_name, grace_s=0)
    st = lists.status(list_name)
    assert (st.sealed, st.paused, st.total) == (False, False, 3)


def test_an_interrupted_drop_finishes_when_run_again(registered, store_url, queue, lists, list_name, session,
                                                    monkeypatch):
    busy_list(queue, lists, session, list_name)
    real = JobLists._delete_all
    calls = []

    def dies_on_the_second(self, set_name, names, **kw):
        calls.append(set_name)
        if len(calls) == 2:
            raise errors.BackendTimeout("the store stopped answering")
        return real(self, set_name, names, **kw)

    monkeypatch.setattr(JobLists, "_delete_all", dies_on_the_second)
    with pytest.raises(errors.BackendTimeout):
        lists.drop(list_name, grace_s=0)
    monkeypatch.setattr(JobLists, "_delete_all", real)
    st = lists.status(list_name)  # still there, sealed and paused: nobody takes from it
    assert st.paused and st.sealed and st.dropping
    assert queue.reserve(list_name, session, 5) == []
    # Not resumed half-deleted: its jobs' records are gone, it could never complete.
    with pytest.raises(errors.ListError, match=r"is being dropped .* run the drop again"):
        lists.pause(list_name, False)
    out = CliRunner().invoke(main, ["--url", store_url, "pause", "--resume", list_name])
    assert out.exit_code == 1 and "run the drop again" in out.output, out.output
    assert "a drop did not finish" in CliRunner().invoke(main, ["--url", store_url, "status", list_name]).output
    as_json = CliRunner().invoke(main, ["--url", store_url, "status", list_name, "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["dropping"] is True, as_json.output
    listed = json.loads(CliRunner().invoke(main, ["--url", store_url, "lists", "--json"]).output)
    assert [row["dropping"] for row in listed if row["name"] == list_name] == [True]
    assert lists.status(list_name).paused and queue.reserve(list_name, session, 5) == []
    lists.drop(list_name, grace_s=0.1)
    assert leftovers(registered, list_name) == {}


def _leases_still_held(self: JobLists, name: str, wait_s: float, given_up: Any = None) -> None:
    """`JobLists._await_leases` as when a lease is still held at its deadline: the drop
    fails before it deletes anything."""
    raise errors.ListError(f"list {name!r}: sessions still hold leases on 1 of its jobs")


def test_an_unsealed_list_whose_jobs_are_all_done_never_looks_complete_while_it_is_dropped(
        queue, lists, list_name, session, monkeypatch):
    """The drop seals the list: with every job done, the list would be complete from the
    seal until its bitmaps go, and a worker --until-complete following it would exit on
    a list being dropped. Looked at in the middle of the drop, after its seal."""
    lists.load(list_name, specs(2))  # not sealed
    for job in queue.reserve(list_name, session, 2):
        queue.complete(job)
    assert not lists.status(list_name).complete, "not sealed: more may be loaded"
    seen = []
    real = JobLists._await_leases

    def looks_first(self, name, wait_s, given_up=None):
        st = lists.status(list_name)
        seen.append((st.sealed, st.complete, lists.header(list_name).get("done_at")))
        return real(self, name, wait_s, given_up)

    monkeypatch.setattr(JobLists, "_await_leases", looks_first)
    lists.drop(list_name, grace_s=0)
    assert seen and all(sealed and not complete and done_at is None for sealed, complete, done_at in seen), seen


def test_a_drop_given_up_before_anything_went_leaves_a_list_that_resumes_and_completes(
        queue, lists, list_name, session, monkeypatch):
    """A drop that fails before it deletes anything (a lease still held at its deadline)
    leaves the list sealed and paused, not marked dropping: resumed, it is worked on and
    completes like any sealed list."""
    lists.load(list_name, specs(2))
    first, second = queue.reserve(list_name, session, 2)
    queue.complete(first)

    monkeypatch.setattr(JobLists, "_await_leases", _leases_still_held)
    with pytest.raises(errors.ListError, match="still hold leases"):
        lists.drop(list_name, grace_s=0)
    monkeypatch.undo()
    st = lists.status(list_name)
    assert (st.sealed, st.paused, st.dropping, st.complete) == (True, True, False, False), st
    lists.pause(list_name, False)
    queue.complete(second)
    st = lists.status(list_name)
    assert (st.paused, st.done, st.complete) == (False, 2, True), st


def test_a_drop_run_again_over_one_that_stopped_half_way_keeps_the_list_unresumable(
        registered, queue, lists, list_name, session, monkeypatch):
    """A second drop marks the list as begun again: that mark must not lower the mark
    of records already gone, or a resume in between would bring back a half-deleted list."""
    busy_list(queue, lists, session, list_name)
    real = JobLists._delete_all
    monkeypatch.setattr(JobLists, "_delete_all", lambda *a, **kw: (_ for _ in ()).throw(
        errors.BackendTimeout("the store stopped answering")))
    with pytest.raises(errors.BackendTimeout):
        lists.drop(list_name, grace_s=0)  # stopped half-way: records went
    monkeypatch.setattr(JobLists, "_delete_all", real)

    monkeypatch.setattr(JobLists, "_await_leases", _leases_still_held)
    with pytest.raises(errors.ListError, match="still hold leases"):
        lists.drop(list_name, grace_s=0)  # run again, given up before it deleted anything
    monkeypatch.undo()
    assert lists.status(list_name).dropping
    with pytest.raises(errors.ListError, match="is being dropped"):
        lists.pause(list_name, False)
    lists.drop(list_name, grace_s=0)
    assert leftovers(registered, list_name) == {}


def drop_missing_half(lists: JobLists, name: str, monkeypatch) -> None:
    """A drop that misses half of the list's records, as one that ran while a node was
    cut off (frozen, partitioned) misses the copies that node brings back when it
    rejoins: Community Edition's deletes leave nothing behind to stop them. Those
    records are older than the drop, as the rejoining node's copies are."""
    real = JobLists._delete_all

    def misses_half(self, set_name, names, **kw):
        return real(self, set_name, names[::2], **kw)

    with monkeypatch.context() as m:
        m.setattr(JobLists, "_delete_all", misses_half)
        lists.drop(name, grace_s=0)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_dropped_list_whose_records_came_back_stays_dropped_and_its_name_loads_clean(
    registered, queue, lists, list_name, session, mode, monkeypatch
):
    """What a node that missed the drop brings back (job records, index entries, done
    and dead bits, ID chunks) is no list: every reader takes the tombstone for a
    missing list, and a load of the name first deletes those records, so the new
    list is its jobs only. Before the tombstone the list record came back with them:
    the list reappeared with part of its jobs, and a new load of its name ran into
    the old job records (create-only) and index entries (its jobs voided)."""
    busy_list(queue, lists, session, list_name, mode)
    drop_missing_half(lists, list_name, monkeypatch)
    back = leftovers(registered, list_name)
    assert set(back) >= {keys.JOB_SET, keys.JIDX_SET}, back
    with pytest.raises(errors.ListNotFound):
        lists.status(list_name)
    with pytest.raises(errors.ListNotFound):
        lists.header(list_name)
    assert list_name not in lists.names()
    with pytest.raises(errors.ListNotFound):
        queue.reserve(list_name, session, 5)
    with pytest.raises(errors.ListNotFound):
        lists.pause(list_name, False)

    # Ids the dropped list had too, and new ones.
    report = lists.load(list_name, specs(20, prefix="job-"), mode=mode, seal=True)
    assert (report.loaded, report.skipped, report.voided) == (20, 0, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.done, st.dead, st.retry_pending, st.in_flight) == (20, 20, 0, 0, 0, 0)
    left = leftovers(registered, list_name)
    assert sorted(left[keys.JOB_SET]) == sorted(keys.job_name(list_name, t) for t in range(20))
    assert len(left[keys.JIDX_SET]) == 20
    assert set(left) <= {keys.LIST_SET, keys.JOB_SET, keys.JIDX_SET, keys.IDS_SET, keys.BLOCK_SET}
    created = lists.header(list_name)["created"]
    for blk in left.get(keys.BLOCK_SET, []):  # the new list's blocks only
        assert registered.get(keys.BLOCK_SET, blk).bins["c"] == created
    got = queue.reserve(list_name, session, 30)
    assert sorted(j.jid for j in got) == sorted(f"job-{i}" for i in range(20))
    assert all(j.attempt == 1 for j in got)
    assert queue.complete_many(got) == []
    assert lists.status(list_name).complete


def test_dropping_a_dropped_list_again_deletes_what_came_back(registered, queue, lists, list_name, session,
                                                             monkeypatch):
    busy_list(queue, lists, session, list_name)
    drop_missing_half(lists, list_name, monkeypatch)
    assert leftovers(registered, list_name)
    with pytest.raises(errors.ListNotFound, match=f"no job list named '{list_name}' .*deleted now"):
        lists.drop(list_name, grace_s=0)
    assert leftovers(registered, list_name) == {}
    with pytest.raises(errors.ListNotFound, match=f"^no job list named '{list_name}'$"):
        lists.drop(list_name, grace_s=0)


def test_a_create_beside_a_tombstones_cleaning_keeps_its_records(registered, queue, lists, list_name, session,
                                                                monkeypatch):
    """Two loads of a dropped list's name at once: one may still be deleting what the
    tombstone names while the other has created the list and loaded it. Only records
    written before the drop go (the tombstone's time): the new list's stay."""
    busy_list(queue, lists, session, list_name)
    drop_missing_half(lists, list_name, monkeypatch)
    tomb = registered.get(keys.LIST_SET, list_name).bins
    lists.load(list_name, specs(20), seal=True)
    late = lists._clear_tombstone(list_name, tomb)  # the slower loader's cleaning, from the tombstone it read
    assert (late.jobs, late.index, late.id_chunks, late.bitmaps) == (0, 0, 0, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable) == (20, 20)
    assert len(queue.reserve(list_name, session, 30)) == 20


def test_a_reserver_holding_a_dropped_lists_cursor_skips_no_chunk_of_the_list_loaded_again(
    registered, queue, lists, list_name, session
):
    """A reserver read the ID-mode cursor (chunk 2) and stalled; meanwhile the list was
    dropped and loaded again (cursor 0). Finding chunk 2 of the new list short, it asked
    to move the cursor past it: that jumped the new list's cursor to 3, and its chunks
    0 and 1 were never popped (their jobs waited for a sweep)."""
    ids = {"mode": "ids", "chunk_size": 2, "seal": True}
    lists.load(list_name, [JobSpec(f"a{i}", {"i": i}) for i in range(6)], **ids)
    assert len(queue.reserve(list_name, session, 5)) == 5  # chunks 0 and 1 drained, 2 popped
    stale = lists.header(list_name)["cursor"]
    assert stale == 2
    lists.drop(list_name, grace_s=0)
    lists.load(list_name, [JobSpec(f"b{i}", {"i": i}) for i in range(6)], **ids)
    assert lists.header(list_name)["cursor"] == 0
    # The stalled reserver's advance past the chunk it saw.
    assert registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "advance", stale) == 0
    assert lists.header(list_name)["cursor"] == 0
    got = queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in got) == [f"b{i}" for i in range(6)]
    assert queue.complete_many(got) == [] and lists.status(list_name).complete


def test_a_loader_of_a_dropped_list_never_replaces_a_chunk_of_the_list_loaded_again(
    registered, queue, lists, list_name, session
):
    """A loader stopped inside its range's commit while its list was dropped and loaded
    again resumes at the range's ID-store chunk: it finds the chunk stamped by another
    list and took it for a leftover of a dropped one, deleting the new list's chunk
    (its jobs then waited for a sweep). It must stop instead, the new chunk kept."""
    from aeroqueue import load

    ids = {"mode": "ids", "chunk_size": 2}
    lists.load(list_name, [JobSpec(f"a{i}", {}) for i in range(4)], **ids)
    old = lists.header(list_name)["created"]
    lists.drop(list_name, grace_s=0)
    lists.load(list_name, [JobSpec(f"b{i}", {}) for i in range(4)], seal=True, **ids)
    before = registered.get(keys.IDS_SET, keys.chunk_name(list_name, 1))
    assert before is not None
    with pytest.raises(errors.LoadAbandoned):
        load.finish_range(lists, list_name, "ids", 1, [2, 3], created=old)  # the stale loader's range 1
    after = registered.get(keys.IDS_SET, keys.chunk_name(list_name, 1))
    assert after is not None and after.bins == before.bins, "the new list's chunk was replaced"
    got = queue.reserve(list_name, session, 10)
    assert sorted(j.jid for j in got) == [f"b{i}" for i in range(4)]


def test_a_worker_holding_claims_on_a_dropped_list_carries_on(registered, lists, list_name):
    other = f"{list_name}-other"
    lists.load(list_name, specs(20), seal=True)
    lists.load(other, specs(10, "o-"), seal=True)
    holding = threading.Event()
    go = threading.Event()

    def handler(job):
        if job.list == list_name:
            holding.set()
            go.wait(30)
        return "ok"

    w = Worker(registered, handler, [list_name, other], concurrency=2, batch=2, interval_s=0.1, expiry_s=2.0,
               idle_s=0.05, idle_max_s=0.2)
    t = threading.Thread(target=lambda: setattr(w, "code", w.run(install_signals=False)), daemon=True)
    t.start()
    try:
        assert holding.wait(30)
        lists.drop(list_name, grace_s=0.3)
        go.set()
        deadline = time.monotonic() + 30
        while lists.status(other).done < 10:
            assert time.monotonic() < deadline, "the worker stopped working on the other list"
            time.sleep(0.05)
        time.sleep(0.5)  # the late acks and their bits, had any been written
    finally:
        go.set()
        w.request_stop()
        t.join(30)
    assert not t.is_alive() and w.code == EXIT_OK
    snap = w.counters.snapshot()
    # The jobs it held on the dropped list: their acks refused ('lost'), not a crash or
    # an unacknowledged failure; every other job done.
    assert snap["lost"] >= 1 and snap["unacked"] == 0, snap
    assert snap["done"] == 10 and snap["done"] + snap["lost"] + snap["released"] == snap["reserved"], snap
    assert leftovers(registered, list_name) == {}


def cli(url: str, *args: str, input: str | None = None):
    return CliRunner().invoke(main, ["--url", url, *args], input=input)


def test_cli_asks_first_and_exits_1_for_a_missing_list(store_url, queue, lists, list_name, session):
    lists.load(list_name, specs(4), seal=True)
    first, second = queue.reserve(list_name, session, 2)
    queue.fail(first, "again")  # waits out its backoff: the question counts it waiting
    queue.complete(second)
    out = cli(store_url, "drop", list_name, input="n\n")
    assert out.exit_code == 1 and "not dropped" in out.output
    out = cli(store_url, "drop", list_name, input="")
    assert out.exit_code == 1 and "pass --yes" in out.output
    assert lists.status(list_name).total == 4, "nothing changed"
    out = cli(store_url, "drop", list_name, input="y\n")
    assert out.exit_code == 0, out.output
    assert "4 job(s), 3 waiting, 0 in flight, 1 done, 0 dead?" in out.output and "cannot be undone" in out.output
    assert "not yet copied by `aeroqueue sync` are lost" in out.output, "one job done: the sync's copy is named"
    out = cli(store_url, "drop", list_name, "--yes")
    assert out.exit_code == 1 and f"no job list named '{list_name}'" in out.output
    lists.load(list_name, specs(2), seal=True)
    out = cli(store_url, "drop", list_name, input="n\n")
    assert "0 done, 0 dead?" in out.output and "aeroqueue sync" not in out.output, "nothing processed: nothing to lose"
    out = cli(store_url, "drop", list_name, "--yes", "--json")
    assert out.exit_code == 0
    assert json.loads(out.output) == {"name": list_name, "jobs": 2, "index": 2, "id_chunks": 0, "bitmaps": 0}


def _retain_all(backend, queue: Queue, jobs) -> None:
    """What the sync's retention does to processed jobs a target holds: the mark of
    their version, then the job records deleted (their index entries are kept)."""
    from aeroqueue.sync.mark import mark, retain

    names = [j.name for j in jobs]
    queue.flush()
    mark_bin = f"r{uuid.uuid4().hex[:8]}"  # this test's own target: retention spares every other job
    versions = [backend.get(keys.JOB_SET, n).bins["done_at"] for n in names]
    assert mark(backend, mark_bin, names, versions) == (len(names), 0)
    assert retain(backend, mark_bin, 0, N_PARTITIONS, 0) == len(names)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_list_loaded_under_a_dropped_lists_name_after_retention_keeps_every_job(
    registered, queue, lists, list_name, session, mode
):
    """Retention deletes job records and keeps their job-id index entries (a load
    repeated later still adds nothing twice); a drop finds entries through the job
    records, so these outlived it. A new list of the same name took them for its own:
    its job 'b' was voided as a duplicate, and `find_job` answered with another job."""
    lists.load(list_name, [JobSpec("a", {"v": 1}), JobSpec("b", {"v": 2})], mode=mode)
    jobs = queue.reserve(list_name, session, 2)
    assert queue.complete_many(jobs) == []
    _retain_all(registered, queue, jobs)
    again = lists.load(list_name, [JobSpec("a", {"v": 1}), JobSpec("b", {"v": 2})])
    assert (again.loaded, again.skipped) == (0, 2), "retained jobs are still loaded: a repeat adds nothing"
    lists.drop(list_name, grace_s=0)

    report = lists.load(list_name, [JobSpec("b", {"v": 4}), JobSpec("c", {"v": 3})], mode=mode, seal=True)
    assert (report.loaded, report.voided) == (2, 0)
    assert lists.status(list_name).total == 2
    assert lists.find_job(list_name, "b")["payload"] == {"v": 4}
    with pytest.raises(errors.JobNotFound):
        lists.find_job(list_name, "a")  # the dropped list's
    got = queue.reserve(list_name, session, 5)
    assert sorted((j.jid, j.payload["v"]) for j in got) == [("b", 4), ("c", 3)]
    assert queue.complete_many(got) == []
    assert lists.status(list_name).complete
    # The same file again, into the sealed list: nothing new.
    assert lists.load(list_name, [JobSpec("b", {"v": 4}), JobSpec("c", {"v": 3})]).already_sealed


PAST = 1  # Unix ms: a deadline long gone by any clock


def test_a_drops_delete_past_its_deadline_deletes_nothing_and_is_sent_again(
    registered, queue, lists, list_name, session, monkeypatch
):
    """A drop's delete that a node frozen past the heartbeat timeout runs once it
    resumes, after the list was made again under its name and loaded, finds on its
    stale copy the old list's record (its stamp, its update time: every filter
    passes), and its replica delete deletes the new list's record on the live nodes
    (README: a frozen node replays the calls it was sent). Past its deadline it
    deletes nothing, and is not taken for a record the filter keeps: the drop sends
    it again, with a fresh deadline, and fails if it never gets through."""
    from aeroqueue.hotpath import stamped

    if registered.is_embedded:
        pytest.skip("the embedded store has no replicas and no deadline (nor the expressions of one)")
    busy_list(queue, lists, session, list_name)
    jobs = [keys.job_name(list_name, t) for t in range(30)]
    created = lists.header(list_name)["created"]
    lists.write_retry_s = 0.3
    monkeypatch.setattr(registered, "job_deadline", lambda: PAST)
    for only in (None, stamped(created)):
        with pytest.raises(errors.ListError, match=r"Aerospike codes \[26\]"):
            lists._delete_all(keys.JOB_SET, jobs, only=only)
    assert all(registered.get(keys.JOB_SET, n) is not None for n in jobs), "a delete past its deadline deleted"
    # Refused the first time (and one of the drop's own writes in time): sent again.
    given: list[int] = []
    monkeypatch.setattr(registered, "job_deadline", lambda: given.append(PAST if len(given) < 3 else 2**53) or given[-1])
    lists.drop(list_name, grace_s=0)
    assert PAST in given
    assert leftovers(registered, list_name) == {}


@pytest.mark.parametrize("how", ["holder's fail", "holder's release", "reaper's release", "CLI's fail"])
def test_a_push_paused_across_a_drop_and_a_load_again_offers_no_job_of_the_new_list(
    registered, store_url, queue, lists, list_name, how, monkeypatch
):
    """A job's claim ends (its holder's fail or release, or a reaper's release of a dead
    session's claims) and its process stops (SIGSTOP, a long pause) before the follow-up
    that pushes the token back onto the retry store. The list is dropped and loaded
    again under its name meanwhile, and a worker leases the new list's jobs: their
    records stay queued while they run. The resumed push put the token on the new
    list's retry store, and another worker claimed that job too: it ran twice. The
    push now carries the list's stamp as the claim read it, and a list made again
    takes none."""
    a, b = Session.open(registered), Session.open(registered)
    leased: list[Job] = []
    try:
        lists.load(list_name, specs(4), seal=True, backoff_s=0)
        [job] = queue.reserve(list_name, a, 1)
        push = transitions.push_retry

        def paused_push(backend, name, tokens, *created):
            if not leased:  # the pause: the list goes and comes back, and b leases its jobs
                lists.drop(name, grace_s=0.1)
                lists.load(name, specs(4, "new-"), seal=True)
                leased.extend(queue.reserve(name, b, 4, lease=True))
                assert [j.lease is not None for j in leased] == [True] * 4
            return push(backend, name, tokens, *created)

        monkeypatch.setattr(transitions, "push_retry", paused_push)
        monkeypatch.setattr(sessions, "push_retry", paused_push)
        if how == "holder's fail":
            assert queue.fail(job, "boom") == "retry"
        elif how == "holder's release":
            assert queue.release(job, "given back") == "released"
        elif how == "CLI's fail":
            out = CliRunner().invoke(main, ["--url", store_url, "fail", list_name, str(job.token), "--session", a.id,
                                            "--error", "boom"])
            assert out.exit_code == 0, out.output
        else:
            mark_reaping(registered, a.id)
            sessions.release_claims(registered, a.id, refund=False, why="session expired")
        assert leased, "the push ran"
        again = queue.reserve(list_name, Session.open(registered), 4)
        twice = {j.token for j in again} & {j.token for j in leased}
        assert not twice, f"token(s) {twice} of the new list handed out twice (leased by one worker, claimed by another)"
        for j in leased:
            assert registered.get(keys.JOB_SET, j.name).bins.get("off") is None, "a new job marked offered by the old pass"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("how", ["claimed", "leased"])
def test_completion_bits_pending_across_a_drop_and_a_load_again_count_nothing_in_the_new_list(
    registered, queue, lists, list_name, session, how
):
    """A process acknowledges a job and is paused (SIGSTOP, a long pause) before its
    pending completion bit is written; the list is dropped and loaded again under its
    name meanwhile. The resumed write set the bit in the new list's bitmap: the new
    job of that token counted as done, never run, and the list could complete without
    it. Bits are now written only to the list the jobs were acknowledged in."""
    lists.load(list_name, specs(3), seal=True)
    paused = transitions.BitBuffer(registered, max_delay_s=3600)  # the writer, stopped
    queue.bits = paused
    first = queue.reserve(list_name, session, 3, lease=how == "leased")
    assert [j.lease is not None for j in first] == [how == "leased"] * 3
    assert queue.complete_many(first, ["old"] * 3) == []  # landed: done on the server; their bits pending
    lists.drop(list_name, grace_s=0.2)
    lists.load(list_name, specs(3, "new-"), seal=True)
    paused.flush()  # the process resumes
    queue.bits = transitions.bit_buffer(registered)
    jobs = queue.reserve(list_name, session, 3)
    assert sorted(j.jid for j in jobs) == ["new-0", "new-1", "new-2"]
    queue.complete_many([j for j in jobs if j.token != 0], ["new", "new"])
    queue.flush()
    status = lists.status(list_name)
    assert (status.done, status.complete) == (2, False), f"done={status.done} complete={status.complete}"


def _drop_and_load_again(lists: JobLists, name: str, n: int) -> None:
    """What happens while a process is stopped: the list is dropped and loaded again."""
    lists.drop(name, grace_s=0, lease_wait_s=0.5)
    lists.load(name, specs(n, "new-"), seal=True)


def _the_new_list_runs_whole(queue: Queue, lists: JobLists, name: str, n: int) -> None:
    with Session.open(queue.backend) as s:
        got = queue.reserve(name, s, n + 1)
        assert sorted(j.jid for j in got) == sorted(f"new-{i}" for i in range(n)), "the new list lost jobs"
        assert queue.complete_many(got) == []
    st = lists.status(name)
    assert (st.done, st.complete) == (n, True), st


@pytest.mark.parametrize("paused", ["before its reads", "after its check"])
def test_a_recovery_paused_across_a_drop_and_a_load_again_leaves_the_new_list_whole(
    registered, queue, lists, list_name, paused, monkeypatch
):
    """A recovery (a load's, a sweep's) finishes a dead loader's range and deletes the
    records another list of the name left in it. Stopped while the list was dropped
    and loaded again, it took the new list's jobs for such leftovers: deleted them,
    voided their tokens, and the new list never completed. It checks first that the
    list is still the one it read, and deletes a leftover only while it holds the
    stamp read."""
    from aeroqueue import load

    n = 5
    lists.create(list_name)
    created = lists.header(list_name)["created"]
    # A loader that allocated a range and died (a lease of 0: expired at once) ...
    got = lists._list_udf(list_name, "alloc", n, 0, uuid.uuid4().hex, created)
    assert got["st"] == "ok" and got["start"] == 0
    if paused == "after its check":
        # ... into which a fenced loader of a dropped list of the name left its records.
        for t in range(n):
            registered.put(keys.JOB_SET, keys.job_name(list_name, t),
                           {"token": t, "jid": f"old-{t}", "state": "queued", "c": created - 1000})
        check = load._check_same_list

        def paused_check(lists_, name, created_):
            check(lists_, name, created_)  # the list is still the one read ...
            monkeypatch.setattr(load, "_check_same_list", check)
            _drop_and_load_again(lists, name, n)  # ... and the process stops here

        monkeypatch.setattr(load, "_check_same_list", paused_check)
    else:
        read = registered.batch_get

        def paused_read(set_name, names, *args, **kwargs):
            if set_name == keys.JOB_SET:
                monkeypatch.setattr(registered, "batch_get", read)
                _drop_and_load_again(lists, list_name, n)
            return read(set_name, names, *args, **kwargs)

        monkeypatch.setattr(registered, "batch_get", paused_read)
    with contextlib.suppress(errors.LoadAbandoned):  # or it leaves the range to a later recovery
        load.recover(lists, list_name)
    monkeypatch.undo()
    assert lists.header(list_name)["created"] != created, "the pause happened"
    for t in range(n):
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, t))
        assert rec is not None and rec.bins["jid"].startswith("new-") and rec.bins["state"] == "queued", (t, rec)
    _the_new_list_runs_whole(queue, lists, list_name, n)


def test_a_loader_paused_before_it_voids_a_duplicate_leaves_the_new_list_whole(
    registered, queue, lists, list_name, monkeypatch
):
    """A loader voids the token of a job id it found indexed already (a duplicate in its
    input, or a concurrent load's). Stopped just before, past its lease, while the
    list was dropped and loaded again, its void landed on the new list's job of that
    token: lost, and the new list never completed. The void is now only of a record
    stamped by the loader's list."""
    n = 3
    send = lists._batch_write

    def paused_send(writes, what, stamp=None):
        if what == "void duplicate jobs":
            monkeypatch.setattr(lists, "_batch_write", send)
            _drop_and_load_again(lists, list_name, n)
        return send(writes, what, stamp)

    monkeypatch.setattr(lists, "_batch_write", paused_send)
    with pytest.raises(errors.LoadAbandoned, match="dropped"):
        # A duplicate in the input, as a concurrent load's would be (`Checked`: past the
        # input check). A lease of 0: past it at once, and nothing renews it (a lease of
        # 1 ms, renewed every 10 ms meanwhile, made the drop see a load in progress).
        lists.load(list_name, Checked([JobSpec("b", {}), JobSpec("a", {}), JobSpec("a", {})]), lease_ms=0, workers=1)
    monkeypatch.undo()
    assert lists.status(list_name).total == n, "the pause happened"
    _the_new_list_runs_whole(queue, lists, list_name, n)


@pytest.mark.parametrize("lands", ["before the new list's bits", "after them"])
def test_bits_of_a_list_dropped_and_loaded_again_never_count_in_the_new_one(registered, queue, lists, list_name, lands):
    """A process paused with done and dead bits pending (a bit flush, a reaper's
    recount past its checks) while the list was dropped and loaded again wrote them
    into the new list's bitmap when it resumed: the new list counted jobs never run as
    finished, and called itself complete with all of them still to run. Bitmap chunks
    now carry their list's stamp: such bits land in a chunk of their own list, which
    the new list neither counts nor keeps (its first bit replaces it), or nowhere."""
    n = 4
    lists.load(list_name, specs(n, "old-"), seal=True)
    old = lists.header(list_name)["created"]
    _drop_and_load_again(lists, list_name, n)
    assert lists.header(list_name)["created"] != old
    with Session.open(registered) as s:
        first = queue.reserve(list_name, s, 1)
        if lands == "after them":
            assert queue.complete_many(first) == []
            transitions.flush_bits(registered)
        # What the paused process sends when it resumes: the old list's bits, its stamp.
        transitions.set_bits(registered, list_name, range(n), "done", 1, old)
        transitions.set_bits(registered, list_name, [n - 1], "dead", 1, old)
        st = lists.status(list_name)
        done = 1 if lands == "after them" else 0
        assert (st.done, st.dead, st.complete) == (done, 0, False), st
        if lands == "before the new list's bits":
            assert queue.complete_many(first) == []
        rest = queue.reserve(list_name, s, n)
        assert sorted(j.jid for j in first + rest) == sorted(f"new-{i}" for i in range(n)), "the new list lost jobs"
        assert lists.status(list_name).done == 1, "the new list's first bit replaced the old list's chunk"
        assert queue.complete_many(rest) == []
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (n, 0, True), st
    # And the other way: the new list's own bits are never the old writer's to clear.
    transitions.set_bits(registered, list_name, range(n), "done", 0, old)
    assert lists.status(list_name).done == n


def _old_chunk_in_the_way(registered, lists: JobLists, name: str, n: int) -> tuple[int, int]:
    """A list dropped and loaded again, and the old list's chunk in the new one's way (a
    late bit of a process paused past the drop). Returns the (old, new) stamps."""
    lists.load(name, specs(n, "old-"), seal=True)
    old = lists.header(name)["created"]
    _drop_and_load_again(lists, name, n)
    transitions.set_bits(registered, name, [n - 1], "done", 1, old)
    return old, lists.header(name)["created"]


def test_two_writers_meeting_an_old_chunk_keep_both_their_bits(registered, lists, list_name, monkeypatch):
    """Both find the old list's chunk in the way; one deletes it and writes its bit in a
    chunk of its own; the other, deleting by the generation it read (a chunk made again
    starts at the same one), deleted that new chunk, and the first bit with it. It now
    deletes only a chunk that still holds the old stamp."""
    _, new = _old_chunk_in_the_way(registered, lists, list_name, 4)
    real_get, b_read, a_done = registered.get, threading.Event(), threading.Event()

    def get(set_name, name, **kwargs):
        rec = real_get(set_name, name, **kwargs)
        if set_name == keys.DONE_SET and threading.current_thread().name == "B" and not b_read.is_set():
            b_read.set()  # B has read the old chunk; A goes first from here
            assert a_done.wait(30)
        return rec

    monkeypatch.setattr(registered, "get", get)
    b = threading.Thread(target=transitions.set_bits, args=(registered, list_name, [1], "done", 1, new), name="B")
    b.start()
    assert b_read.wait(30)
    transitions.set_bits(registered, list_name, [0], "done", 1, new)
    a_done.set()
    b.join(30)
    assert not b.is_alive()
    assert lists.status(list_name).done == 2, "a writer deleted the other's chunk"


def test_a_job_buried_by_hand_counts_dead_in_its_own_list(registered, lists, list_name):
    """`bury` wrote its dead bit without the list's stamp: into the old list's chunk in
    the way, which no reader counts, so the new list said no job was dead."""
    _old_chunk_in_the_way(registered, lists, list_name, 4)
    assert lists.bury(list_name, "new-0", "buried by the test") == "dead"
    st = lists.status(list_name)
    assert (st.dead, st.done, st.reservable) == (1, 0, 3), st


def test_a_sweep_counts_no_job_record_of_a_list_dropped_before(registered, lists, list_name):
    """A node that missed a drop brings back the old list's job records when it rejoins.
    The sweep recounts the bits of finished jobs by the list's name: it set theirs in the
    new list's bitmap, stamped as the new list's, and the new list counted them."""
    n = 3
    lists.load(list_name, specs(n, "old-"), seal=True)
    old = lists.header(list_name)["created"]
    _drop_and_load_again(lists, list_name, n)
    # One the rejoin brought back, past the new list's tokens, finished in the old list.
    registered.put(keys.JOB_SET, keys.job_name(list_name, n + 2), {
        "list": list_name, "token": n + 2, "jid": "old-gone", "state": "done", "att": 1, "c": old})
    sessions.sweep(registered, grace_ms=0)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (0, 0, False), st


def _dropped_and_loaded_at(
    registered: Backend, monkeypatch: pytest.MonkeyPatch, lists: JobLists, name: str, function: str, mode: str,
    then: Callable[[], object] | None = None,
) -> list[str]:
    """From now on, the first UDF call of `function` (on any record of list `name`) runs
    after the list is dropped and loaded again with jobs b0..b9 (a caller paused just
    before it: SIGSTOP, a slow call), and after `then()`, if given. The list returned
    says whether it happened."""
    paused: list[str] = []

    def wrapped(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(set_name: str, key: str, module: str, fn: str, *args: Any, **kw: Any) -> Any:
            if fn == function and key.split("/")[0] == name and not paused:
                paused.append(fn)
                lists.drop(name, grace_s=0)
                lists.load(name, [JobSpec(f"b{i}", {"i": i}) for i in range(10)], mode=mode, seal=True)
                if then is not None:
                    then()
            return real(set_name, key, module, fn, *args, **kw)
        return call

    monkeypatch.setattr(registered, "udf", wrapped(registered.udf))
    return paused


def _each_new_job_once(
    queue: Queue, lists: JobLists, name: str, session: Session, dead: frozenset[str] = frozenset()
) -> None:
    handed = []
    while batch := queue.reserve(name, session, 10, lease=True):
        handed += batch
    assert sorted(j.jid for j in handed) == sorted(f"b{i}" for i in range(10) if f"b{i}" not in dead)
    assert queue.complete_many(handed) == []
    queue.flush()
    st = lists.status(name)
    assert (st.done, st.dead, st.complete) == (10 - len(dead), len(dead), True)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_an_operators_bury_paused_across_a_drop_and_a_load_leaves_the_new_list_alone(
    registered, queue, lists, list_name, session, monkeypatch, mode
):
    """`job bury L a3` paused between finding a3 and burying it, while the list was
    dropped and loaded again: it buried b3, which nobody named, and its stale block
    entry still handed b3 out. The bury carries the stamp of the job it found."""
    lists.load(list_name, [JobSpec(f"a{i}", {"i": i}) for i in range(10)], mode=mode, seal=True)
    paused = _dropped_and_loaded_at(registered, monkeypatch, lists, list_name, "bury", mode)
    with pytest.raises(errors.JobNotFound, match="dropped and loaded again"):
        lists.bury(list_name, "a3", "the operator's")
    assert paused
    _each_new_job_once(queue, lists, list_name, session)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_an_operators_kick_paused_across_a_drop_and_a_load_leaves_the_new_list_alone(
    registered, queue, lists, list_name, session, monkeypatch, mode
):
    """`job kick L a3` paused before its kick, while the list was dropped and loaded
    again and the new list's b3 buried: it brought b3 back, queued but in no store (left
    to a sweep), a job an operator had buried. The kick carries the list's stamp."""
    lists.load(list_name, [JobSpec(f"a{i}", {"i": i}) for i in range(10)], mode=mode, seal=True)
    lists.bury(list_name, "a3", "the first list's")
    paused = _dropped_and_loaded_at(
        registered, monkeypatch, lists, list_name, "kick", mode,
        then=lambda: lists.bury(list_name, "b3", "the operator's"),
    )
    assert lists.kick_job(list_name, "a3") is False
    assert paused
    _each_new_job_once(queue, lists, list_name, session, dead=frozenset({"b3"}))


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_kick_of_every_dead_job_paused_after_its_kicks_leaves_the_new_list_alone(
    registered, queue, lists, list_name, session, monkeypatch, mode
):
    """`aeroqueue kick L` paused between kicking the old a3 and the steps that follow
    (the push, unschedule, the ID store's remove, reopen), while the list was dropped
    and loaded again: those steps took token 3 out of the new list's token store or
    chunk, so b3 waited for a sweep. They carry the kicked jobs' stamp now."""
    lists.load(list_name, [JobSpec(f"a{i}", {"i": i}) for i in range(10)], mode=mode, seal=True)
    lists.bury(list_name, "a3", "the first list's")
    paused = _dropped_and_loaded_at(registered, monkeypatch, lists, list_name, "push_retry", mode)
    assert lists.kick(list_name) == 1
    assert paused
    assert lists.status(list_name).reservable == 10
    _each_new_job_once(queue, lists, list_name, session)


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_kicks_follow_up_steps_leave_another_list_of_the_name_alone(registered, lists, list_name, mode) -> None:
    """The steps after a kick's own (the schedule's `unschedule`, the ID store's `remove`,
    `reopen`), sent with the stamp of the list whose jobs were kicked, change nothing in
    another list of the name: each checks the stamp itself (the Python before them reads
    the list record first, which a drop and a load may follow)."""
    lists.load(list_name, [JobSpec(f"b{i}", {"i": i}) for i in range(10)], mode=mode, seal=True)
    head = registered.get(keys.LIST_SET, list_name).bins
    stale = head["created"] - 1
    chunk = keys.chunk_name(list_name, 0)
    chunk_before = registered.get(keys.IDS_SET, chunk)
    assert transitions.list_write(registered, list_name, "unschedule", [3], after=(stale,)) == 0
    assert transitions.list_write(registered, list_name, "reopen", after=(stale,)) == "missing"
    if mode == "ids":
        assert transitions.ids_once(registered, chunk, "remove", [3], extra=(stale,)) == 0
        assert registered.get(keys.IDS_SET, chunk).bins["ids"] == chunk_before.bins["ids"]
    after = registered.get(keys.LIST_SET, list_name).bins
    assert (after.get("timed"), after.get("reopens")) == (head.get("timed"), head.get("reopens"))
    # With the list's own stamp they do their work.
    assert transitions.list_write(registered, list_name, "reopen", after=(head["created"],)) == "ok"
    if mode == "ids":
        assert transitions.ids_once(registered, chunk, "remove", [3], extra=(head["created"],)) == 1


def test_a_chunk_that_stays_another_lists_ends_the_reservation_without_looping(
    registered, queue, lists, list_name, session
) -> None:
    """An ID-mode take whose chunk is another list's takes again (the name's list since
    the take is the new one). A chunk that stayed another list's (none should: a loader
    replaces one before it publishes) must not make a reservation loop for ever."""
    lists.load(list_name, [JobSpec(f"j{i}", {"i": i}) for i in range(5)], mode="ids", seal=True)
    chunk = keys.chunk_name(list_name, 0)
    created = registered.get(keys.LIST_SET, list_name).bins["created"]
    registered.operate(keys.IDS_SET, chunk, [op.write("c", created + 1)], update_only=True)
    takes = []
    real_udf = registered.udf

    def counted(set_name, key, module, fn, *args, **kw):
        takes.append(fn) if fn == "take" else None
        return real_udf(set_name, key, module, fn, *args, **kw)

    registered.udf = counted
    got: list[list[Job]] = []
    try:
        # In a thread: a reservation that loops for ever fails the test instead of hanging it.
        t = threading.Thread(target=lambda: got.append(queue.reserve(list_name, session, 5)), daemon=True)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the reservation kept taking"
    finally:
        registered.udf = real_udf
    assert got == [[]]
    assert len(takes) == 1 + REPLACED_RETAKES, takes  # the first take, then the bounded retakes
    assert registered.get(keys.IDS_SET, chunk).bins["ids"] == [0, 1, 2, 3, 4]  # nothing popped


def test_a_list_loaded_again_during_a_drops_grace_keeps_its_completion_bits(
    registered, lists, list_name, monkeypatch,
):
    """The drop's last step, after its grace, deleted the bitmap chunks of the list's
    name without looking whose they were: a list loaded again meanwhile lost the bits
    of the jobs it had completed (status said in flight, export said done)."""
    lists.load(list_name, [JobSpec(f"o{i}", {}) for i in range(10)], seal=True)
    in_grace, go_on = threading.Event(), threading.Event()
    real_flush = transitions.flush_bits

    def held_in_grace(backend):  # the drop's flush after its grace: held until the new list is done
        if threading.current_thread() is dropper:
            in_grace.set()
            assert go_on.wait(30)
        return real_flush(backend)

    dropped: list[Any] = []
    dropper = threading.Thread(target=lambda: dropped.append(lists.drop(list_name, grace_s=0.01)))
    monkeypatch.setattr(transitions, "flush_bits", held_in_grace)
    dropper.start()
    try:
        assert in_grace.wait(30), "the drop never got to its grace"
        lists.load(list_name, [JobSpec(f"n{i}", {}) for i in range(10)], seal=True)
        queue, session = Queue(registered), Session.open(registered, heartbeat=False)
        try:
            assert queue.complete_many(queue.reserve(list_name, session, 4)) == []
            queue.flush()
        finally:
            session.close()
    finally:
        go_on.set()
        dropper.join(30)
    assert dropped and dropped[0].jobs == 10
    st = lists.status(list_name)
    assert (st.done, st.in_flight, st.total) == (4, 0, 10), st


@pytest.mark.parametrize("acked", [True, False], ids=["leases-acked", "leases-held"])
def test_a_resume_while_a_drop_waits_for_leases_gives_the_drop_up(queue, lists, list_name, session, acked):
    """A resume during a drop's wait for leases was accepted (the list worked on
    again), and then the drop deleted every job under its workers, their acks refused;
    or, with the leases still held, failed saying the list was 'sealed and paused'. The
    drop is given up: it says so and deletes nothing."""
    lists.load(list_name, specs(40))
    leased = queue.reserve(list_name, session, 20, lease=True)
    assert leased and leased[0].lease is not None, "the test needs a lease"
    failed: list[BaseException] = []

    def drop() -> None:
        try:
            lists.drop(list_name, grace_s=0, lease_wait_s=20)
        except errors.ListError as e:
            failed.append(e)

    t = threading.Thread(target=drop)
    t.start()
    try:
        give_up = time.monotonic() + 20
        while not (lists.header(list_name).get("paused") == 1 and lists.header(list_name).get("dropping") == 2):
            assert time.monotonic() < give_up, "the drop never began waiting"
            time.sleep(0.01)
        lists.pause(list_name, False)
        if acked:
            assert queue.complete_many(leased) == []
    finally:
        t.join(30)
    assert not t.is_alive()
    assert failed and "the drop was given up: the list was resumed" in str(failed[0]), failed
    st = lists.status(list_name)
    assert (st.total, st.paused, st.dropping) == (40, False, False), st
    rest = queue.reserve(list_name, session, 40)
    assert len(rest) == 20, "the jobs not leased are still there, reservable"
    assert queue.complete_many(rest + ([] if acked else leased)) == []


def test_a_resume_just_before_the_drop_starts_deleting_gives_the_drop_up(queue, lists, list_name, session, monkeypatch):
    """The resume lands after the drop's last look at the list, before it marks the
    list as being deleted: the store refuses that mark (aq_list_v1.set_flag, 'given
    up'), and nothing is deleted."""
    lists.load(list_name, specs(5))
    real = JobLists._await_leases

    def then_resumed(self, name, wait_s, given_up=None):
        real(self, name, wait_s, given_up)
        lists.pause(list_name, False)  # an operator's resume, just after the wait saw none

    monkeypatch.setattr(JobLists, "_await_leases", then_resumed)
    with pytest.raises(errors.ListError, match="the drop was given up: the list was resumed"):
        lists.drop(list_name, grace_s=0)
    monkeypatch.undo()
    st = lists.status(list_name)
    assert (st.total, st.paused, st.dropping) == (5, False, False), st
    assert queue.complete_many(queue.reserve(list_name, session, 5)) == []
