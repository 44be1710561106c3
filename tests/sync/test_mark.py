"""Marks written the fast way (one batch of the same expression write, for records
unchanged since a clock taken before the scan) name exactly the version the
scan read, as the exact way does; a record changed since takes the exact way.
No Spark, no MySQL: the marking alone, on both backends."""

from __future__ import annotations

import importlib
import time
import uuid

import pytest

from aeroqueue import keys
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from aeroqueue.sync.mark import mark_unchanged, server_clock

from .helpers import make_jobs

MARK = "sync_t_mark"
marking = importlib.import_module("aeroqueue.sync.mark")  # the package exports a function named `mark`


@pytest.fixture
def exact_calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The names each call of the exact path was given."""
    calls: list[list[str]] = []
    exact = marking.mark

    def spy(backend, mark_bin, names, versions):  # type: ignore[no-untyped-def]
        calls.append(list(names))
        return exact(backend, mark_bin, names, versions)

    monkeypatch.setattr(marking, "mark", spy)
    return calls


def _scanned(store, list_name: str) -> tuple[list[str], list[int]]:
    jobs = sorted(JobLists(store).jobs(list_name), key=lambda j: j["token"])
    return [keys.job_name(list_name, j["token"]) for j in jobs], [j["done_at"] for j in jobs]


def test_unchanged_jobs_are_marked_with_the_version_read_without_the_exact_path(registered, list_name, exact_calls):
    make_jobs(registered, list_name, done=12, dead=3)
    time.sleep(0.005)  # the clock's millisecond is after the jobs' last writes
    clock = server_clock(registered)
    names, versions = _scanned(registered, list_name)
    assert mark_unchanged(registered, MARK, names, versions, clock) == (15, 0)
    assert exact_calls == []
    assert {j["jid"]: j[MARK] for j in JobLists(registered).jobs(list_name)} == {
        j["jid"]: j["done_at"] for j in JobLists(registered).jobs(list_name)
    }


def test_a_job_changed_after_the_clock_is_marked_with_the_version_read_or_not_at_all(
    registered, list_name, exact_calls
):
    make_jobs(registered, list_name, done=5, dead=1)
    time.sleep(0.005)
    clock = server_clock(registered)
    names, versions = _scanned(registered, list_name)  # what the scan read
    # After the scan: the dead job is kicked and processed again (a new done_at),
    # one done job is deleted (retention elsewhere), and an unrelated bin is written to another.
    dead = next(j for j in JobLists(registered).jobs(list_name) if j["state"] == "dead")
    dead_name = keys.job_name(list_name, dead["token"])
    JobLists(registered).kick(list_name)
    time.sleep(0.002)
    q = Queue(registered)
    with Session.open(registered) as s:
        (again,) = q.reserve(list_name, s, 1)
        q.complete(again, {"second": True})
    assert again.name == dead_name
    gone = names[0]
    registered.remove(keys.JOB_SET, gone)
    touched = names[1]
    registered.put(keys.JOB_SET, touched, {"other": 1})
    marked, vanished = mark_unchanged(registered, MARK, names, versions, clock)
    assert (marked, vanished) == (5, 1)
    assert sorted(exact_calls[0]) == sorted([dead_name, touched]), "changed since the clock: the exact path"
    jobs = {keys.job_name(list_name, j["token"]): j for j in JobLists(registered).jobs(list_name)}
    assert jobs[dead_name][MARK] == versions[names.index(dead_name)] != jobs[dead_name]["done_at"], (
        "the mark names the version read: the new one still reads as unsynced"
    )
    assert jobs[touched][MARK] == jobs[touched]["done_at"]
    assert gone not in jobs, "update-only: a deleted job is not brought back"


def test_a_list_dropped_after_retention_leaves_no_job_id_index_behind(registered, list_name, monkeypatch):
    """Retention deletes a job's record; `drop` found a list's job-id index entries
    (aq_jidx) only through its job records: those of the jobs retention took were
    left behind for good, one record per job ever processed. A list whose name
    starts the same keeps its own. (Pages of 3: the deletes interleave with the scan
    that finds the entries.)"""
    from aeroqueue import lists as lists_module
    from aeroqueue.sync.mark import mark, retain

    monkeypatch.setattr(lists_module, "PAGE", 3)

    make_jobs(registered, list_name, done=6, dead=2, queued=2)
    make_jobs(registered, f"{list_name}-b", done=1, queued=1)
    processed = [j for j in JobLists(registered).jobs(list_name) if "done_at" in j]
    names, versions = [keys.job_name(list_name, j["token"]) for j in processed], [j["done_at"] for j in processed]
    assert mark(registered, MARK, names, versions) == (8, 0)
    assert sum(retain(registered, MARK, begin, 1024, 0) for begin in range(0, 4096, 1024)) >= 8
    assert sorted(j["jid"] for j in JobLists(registered).jobs(list_name)) == ["j8", "j9"]
    report = JobLists(registered).drop(list_name, grace_s=0)
    assert (report.jobs, report.index) == (2, 10), report
    left = [j for j in (f"j{i}" for i in range(10)) if registered.get(keys.JIDX_SET, keys.jidx_name(list_name, j))]
    assert left == [], "the dropped list's job-id index entries are gone"
    assert all(registered.get(keys.JIDX_SET, keys.jidx_name(f"{list_name}-b", j)) for j in ("j0", "j1"))
    JobLists(registered).drop(f"{list_name}-b", grace_s=0)


def test_the_records_a_killed_sync_would_leave_behind_expire(registered, list_name, monkeypatch):
    """The clock record (removed right after its read) and a task's progress record
    (removed by the driver when the run ends) outlive a process killed in between:
    both carry a time to live, so they do not stay for ever."""
    removed: list[str] = []
    monkeypatch.setattr(registered, "remove", lambda set_name, name, **kw: removed.append(name))  # killed before it
    server_clock(registered)
    assert len(removed) == 1 and removed[0].startswith("clock/")
    progress = _report_progress(registered, list_name, 3)
    for name in (removed[0], progress):
        rec = registered.get(keys.SYNC_SET, name)
        assert rec is not None and rec.ttl is not None and 0 < rec.ttl <= keys.SYNC_TTL_S, (name, rec)
    monkeypatch.undo()
    for name in (removed[0], progress):
        registered.remove(keys.SYNC_SET, name)


def test_a_namespace_that_refuses_ttls_still_syncs(registered, list_name, monkeypatch):
    """A namespace without `nsup-period` (Aerospike's default: 0) refuses any write with
    a time to live (FORBIDDEN, code 22), which the sync's own records carry. Seen on
    the real server set so (`set-config ... nsup-period=0`, `allow-ttl-without-nsup=
    false`): every sync task failed at its clock. Written without one there, as before
    the time to live: the sync needs no nsup-period, only retention is said to."""
    from aeroqueue.errors import BackendError

    put = registered.put

    def refuses_ttls(set_name, name, bins, **kw):  # type: ignore[no-untyped-def]
        if kw.get("ttl"):  # as the server answers (`backends.wrap`)
            raise BackendError(f"put on {set_name}/{name} failed: AEROSPIKE_ERR_FAIL_FORBIDDEN (Aerospike code 22)",
                               operation="put", key=f"{set_name}/{name}", code=22)
        return put(set_name, name, bins, **kw)

    monkeypatch.setattr(registered, "put", refuses_ttls)
    assert server_clock(registered).ns > 0
    progress = _report_progress(registered, list_name, 3)
    rec = registered.get(keys.SYNC_SET, progress)
    assert rec is not None and rec.bins["lists"] == {list_name: 3}, "the progress report was dropped"
    registered.remove(keys.SYNC_SET, progress)


def _report_progress(backend, list_name: str, copied: int) -> str:  # type: ignore[no-untyped-def]
    """A sync task's progress report (its first), as a task of a run of its own makes
    it; the name of the record it wrote."""
    from aeroqueue.sync import SyncOptions, parse_target
    from aeroqueue.sync.task import RangeSync, progress_name

    run = f"t{uuid.uuid4().hex[:12]}"
    task = RangeSync(
        SyncOptions(store_url="embedded:///unused.db", target=parse_target("mysql://root@127.0.0.1:3306/test"), run_id=run),
        backend, sink=None, synced_at=0,  # type: ignore[arg-type]  # the report needs no sink
    )
    task._report_as = progress_name(run, 0)
    task.per_list[list_name] = copied
    task._report()
    return task._report_as


def test_retention_never_deletes_a_job_of_the_list_loaded_again_under_the_name(registered, list_name, monkeypatch):
    """Retention's delete was fenced only by the generation its scan read. A list
    dropped and loaded again under its name recreates job records under the same
    names, their generations starting again at 1: a new job that had reached the
    generation the scan read (load, claim, touch, acknowledgement: four writes, as
    the old job's load, claim, acknowledgement and mark) was deleted unsynced, lost
    to MySQL and to the store. Here the drop and the new job's life happen between
    retention's scan and its delete, as they can while a sync task is paused there."""
    from aeroqueue.sync.mark import mark, retain

    make_jobs(registered, list_name, done=1)
    name = keys.job_name(list_name, 0)
    old = registered.get(keys.JOB_SET, name)
    assert mark(registered, MARK, [name], [old.bins["done_at"]]) == (1, 0)
    read_gen = registered.get(keys.JOB_SET, name).gen
    scan = registered.scan
    reloaded: list[int] = []

    def scan_then_reload(*args, **kw):  # type: ignore[no-untyped-def]
        found = list(scan(*args, **kw))
        if not reloaded and any(n == name for n, _ in found):
            lists = JobLists(registered)
            lists.drop(list_name, grace_s=0)
            lists.load(list_name, [JobSpec("j0", {"again": True})], max_attempts=1)
            q = Queue(registered)
            with Session.open(registered) as s:
                (job,) = q.reserve(list_name, s, 1)
                q.touch(job)
                q.complete(job, {"new": True})
            reloaded.append(registered.get(keys.JOB_SET, name).gen)
        return iter(found)

    monkeypatch.setattr(registered, "scan", scan_then_reload)
    for begin in range(0, 4096, 1024):
        retain(registered, MARK, begin, 1024, 0)
    assert reloaded == [read_gen], "the new job had the generation the scan read"
    new = registered.get(keys.JOB_SET, name)
    assert new is not None, "the new list's job, never copied, is still in the store"
    assert (new.bins["state"], new.bins["result"], MARK in new.bins) == ("done", {"new": True}, False)
    JobLists(registered).drop(list_name, grace_s=0)


PAST = 1  # Unix ms: a deadline long gone by any clock
FUTURE = 2**53


def _deadlines(backend, monkeypatch: pytest.MonkeyPatch, *given: int) -> list[int]:
    """Make `backend.job_deadline` answer `given` in turn, then FUTURE; the answers
    handed out so far. The embedded store has no deadline of its own: given one, it
    filters as a server does."""
    out: list[int] = []
    monkeypatch.setattr(backend, "job_deadline", lambda: out.append(given[len(out)] if len(out) < len(given) else FUTURE) or out[-1])
    return out


def _bins(store, names: list[str]) -> list[tuple[int, dict]]:
    return [(r.gen, r.bins) for r in (store.get(keys.JOB_SET, n) for n in names)]


def test_a_mark_run_past_its_deadline_changes_nothing_and_is_sent_again(registered, list_name, monkeypatch):
    """A mark that a node frozen past the heartbeat timeout runs once it resumes
    passes any other filter on its stale copy (the old done job), and its replica
    write replaces the job an operator kicked and a worker completed again meanwhile
    (README: a frozen node replays the calls it was sent). Past its deadline it
    writes nothing; the exact path sends it again with a fresh one."""
    from aeroqueue.errors import SyncError
    from aeroqueue.sync.mark import mark

    make_jobs(registered, list_name, done=3)
    time.sleep(0.005)
    clock = server_clock(registered)
    names, versions = _scanned(registered, list_name)
    before = _bins(registered, names)
    monkeypatch.setattr(marking, "time", type("T", (), {"sleep": staticmethod(lambda s: None)}))
    given = _deadlines(registered, monkeypatch, *[PAST] * 10)
    with pytest.raises(SyncError, match="past its deadline"):
        mark_unchanged(registered, MARK, names, versions, clock)
    assert _bins(registered, names) == before, "a mark past its deadline wrote"
    with pytest.raises(SyncError, match="past its deadline"):
        mark(registered, MARK, names, versions)
    assert _bins(registered, names) == before
    assert len(given) == 1 + 2 * marking.MARK_RETRIES, "a deadline of its own for each attempt"
    # Refused by the fast path and the exact path's first attempt, marked by its second.
    monkeypatch.undo()
    given = _deadlines(registered, monkeypatch, PAST, PAST)
    assert mark_unchanged(registered, MARK, names, versions, clock) == (3, 0)
    assert len(given) == 3
    assert [b[MARK] for _, b in _bins(registered, names)] == versions


def test_a_retention_delete_past_its_deadline_keeps_the_job(registered, list_name, monkeypatch):
    """Retention's delete, run late on a frozen node's stale copy, passes its checks
    there (the generation and filter its scan read) and its replica delete deletes
    the job re-run since. Past its deadline it deletes nothing; the next run does."""
    from aeroqueue.sync.mark import mark, retain

    own = f"m{uuid.uuid4().hex[:8]}"  # on a shared server, no other test's jobs carry it
    make_jobs(registered, list_name, done=2)
    names, versions = _scanned(registered, list_name)
    assert mark(registered, own, names, versions) == (2, 0)
    before = _bins(registered, names)
    monkeypatch.setattr(registered, "job_deadline", lambda: PAST)
    assert retain(registered, own, 0, 4096, 0) == 0
    assert _bins(registered, names) == before
    monkeypatch.undo()
    assert retain(registered, own, 0, 4096, 0) == 2, "in time, as ever"
    assert all(registered.get(keys.JOB_SET, n) is None for n in names)
