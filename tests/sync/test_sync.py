"""The Spark sync against the real MariaDB: exactly once row by row, whatever fails."""

from __future__ import annotations

import time

import pytest

from aeroqueue import keys
from aeroqueue.lists import JobLists
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from aeroqueue.sync import (
    SyncError,
    SyncFaults,
    sync_once,
)

from .helpers import (
    assert_exactly_once,
    make_jobs,
    marked_anywhere,
    mysql_port_closed,
    mysql_query,
    mysql_rows,
    options,
    processed,
    root_connection,
    schema_left_at,
    synced_marks,
)


@pytest.fixture
def store(registered, spark):
    """A registered backend, once Spark is up (so a missing Java skips first)."""
    return registered


def test_every_processed_job_lands_exactly_once(store, store_url, mysql_db, mysql_url, list_name, spark):
    other = list_name + "-b"
    make_jobs(store, list_name, done=120, dead=15, queued=20)
    make_jobs(store, other, done=7, dead=0, queued=3)
    # Pages smaller than a batch, batches smaller than a range: the streamed scan's seams.
    report = sync_once(options(store_url, mysql_url, page_size=7, batch_size=11), spark, store)
    assert report.counts.tasks == 8
    assert report.counts.vanished == 0
    if store.is_embedded:  # a shared server holds other tests' rejects
        assert report.counts.rejected == 0
    assert_exactly_once(store, mysql_db, list_name)
    assert_exactly_once(store, mysql_db, other)
    assert set(synced_marks(store, list_name, mysql_url)) == set(processed(store, list_name)), "every copied job is marked"
    synced_at = {r[0] for r in mysql_query(mysql_db, "SELECT DISTINCT synced_at FROM aq_jobs WHERE list = %s", (list_name,))}
    assert synced_at == {report.started_ms}

    again = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert len(mysql_rows(mysql_db, list_name)) == 135
    if store.is_embedded:  # alone in its store: nothing is left to copy
        assert again.counts.scanned == 0 and again.counts.copied == 0

    # The rest gets processed; the next run copies only them.
    q = Queue(store)
    with Session.open(store) as s:
        jobs = q.reserve(list_name, s, 20)
        q.complete_many(jobs, [{"late": j.token} for j in jobs])
    third = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert third.counts.copied >= 20
    assert_exactly_once(store, mysql_db, list_name)
    assert len(mysql_rows(mysql_db, list_name)) == 155


def test_unreachable_mysql_fails_clearly_and_marks_nothing(store, store_url, mysql_db, list_name, spark):
    make_jobs(store, list_name, done=30)
    bad = f"mysql://root:pw-not-shown@127.0.0.1:{mysql_port_closed()}/{mysql_db}"
    with pytest.raises(SyncError) as e:
        sync_once(options(store_url, bad, lists=(list_name,)), spark, store)
    text = str(e.value)
    assert text.startswith("cannot connect to mysql://root:***@127.0.0.1:") and "pw-not-shown" not in text
    assert marked_anywhere(store, list_name) == set(), "nothing marked synced"
    # The lease was released: the next run (MySQL back) is not refused.
    sync_once(options(store_url, f"mysql://root@127.0.0.1:3306/{mysql_db}", lists=(list_name,)), spark, store)
    assert_exactly_once(store, mysql_db, list_name)


def test_mysql_killed_mid_run_then_the_next_run_completes(store, store_url, mysql_db, mysql_url, list_name, spark):
    make_jobs(store, list_name, done=300, dead=20)
    # Small batches, one task: its connection is killed after 2 batches, on every attempt.
    broken = options(store_url, mysql_url, lists=(list_name,), partitions=1, batch_size=25, faults=SyncFaults(kill_after_batches=2))
    with pytest.raises(SyncError) as e:
        sync_once(broken, spark, store)
    assert "mysql://root@127.0.0.1:3306" in str(e.value) and "failed while writing" in str(e.value)
    marked = synced_marks(store, list_name, mysql_url)
    copied = {bytes(r["jid"]).decode() for r in mysql_rows(mysql_db, list_name)}
    assert set(marked) <= copied, "nothing is marked synced that MySQL did not commit"
    if store.is_embedded:  # alone in its store, the list is all the task copies
        assert marked, "the batches committed before the kill were marked"
        assert len(copied) < 320
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert_exactly_once(store, mysql_db, list_name)
    assert set(synced_marks(store, list_name, mysql_url)) == set(processed(store, list_name))


@pytest.mark.parametrize("by_exit", [True, False], ids=["worker-crash", "task-raises"])
def test_task_dying_between_commit_and_mark_is_retried_harmlessly(
    store, store_url, mysql_db, mysql_url, list_name, spark, by_exit
):
    make_jobs(store, list_name, done=200, dead=10)
    # Every task's first attempt dies right after its first commit, before marking.
    faulty = options(store_url, mysql_url, lists=(list_name,), batch_size=10, faults=SyncFaults(die_after_commits=1, die_by_exit=by_exit))
    report = sync_once(faulty, spark, store)
    # Retried tasks copied the first batch again: more copies than jobs, one row each.
    assert report.counts.copied >= 210
    assert_exactly_once(store, mysql_db, list_name)
    assert set(synced_marks(store, list_name, mysql_url)) == set(processed(store, list_name))


def _write_unsendable(store, name: str, bins: dict) -> None:
    """Bins written into an embedded store's file as another client could have written
    them: aeroqueue's client (the real one, and so the embedded store) refuses to send
    a string that is not UTF-8."""
    from aeroqueue.backends.embedded.storage import decode, encode

    client = store.client
    ns, _, _, digest = client._key((store.namespace, keys.JOB_SET, name))
    with client._storage.write() as db:
        (blob,) = db.execute("SELECT bins FROM records WHERE ns = ? AND digest = ?", (ns, bytes(digest))).fetchone()
        db.execute("UPDATE records SET bins = ? WHERE ns = ? AND digest = ?",
                   (encode({**decode(blob), **bins}), ns, bytes(digest)))


@pytest.fixture
def dropped_after(store, list_name):
    """`list_name`, dropped after the test on the shared server: records the target
    refuses stay unsynced, and every later sync of that store copied them again (and
    took part in lock conflicts with them: the refused path writes row by row)."""
    yield list_name
    if not store.is_embedded:
        JobLists(store).drop(list_name)


def test_records_that_cannot_be_stored_go_to_rejects_and_the_run_goes_on(
    store, store_url, mysql_db, mysql_url, dropped_after, spark
):
    list_name = dropped_after
    make_jobs(store, list_name, done=40, dead=5)
    q = Queue(store)
    make_jobs(store, list_name, done=0, queued=2, start=1000)
    with Session.open(store) as s:
        blob, long_err = q.reserve(list_name, s, 2)
        q.complete(blob)
        Queue(store).fail(long_err, "boom")
    # Bytes: not JSON. aeroqueue stores no such result (ResultNotStorable); another
    # program may have.
    store.put(keys.JOB_SET, blob.name, {"result": bytearray(b"\x00\xff")})
    # More than MySQL's TEXT holds: MySQL refuses it. (aeroqueue keeps 4,000 bytes
    # of an error; an older client, or another program, may have written more.)
    store.put(keys.JOB_SET, long_err.name, {"err": "x" * 70_000})
    bad = {blob.jid: "cannot be stored as JSON", long_err.jid: "Data too long for column 'error'"}
    if store.is_embedded:
        # A record another client wrote with a string that is not Unicode.
        name = keys.job_name(list_name, 0)
        rec = store.get(keys.JOB_SET, name)
        assert rec is not None and rec.bins["state"] == "done"
        _write_unsendable(store, name, {"payload": {"text": "lone \ud800 surrogate"}})
        bad[rec.bins["jid"]] = "surrogates not allowed"

    report = sync_once(options(store_url, mysql_url, lists=(list_name,), batch_size=7), spark, store)
    # On a shared server, other tests' rejects stay unsynced and count too.
    assert report.counts.rejected == len(bad) if store.is_embedded else report.counts.rejected >= len(bad)
    rejects = {jid: reason for jid, reason in mysql_query(
        mysql_db, "SELECT jid, reason FROM sync_rejects WHERE list = %s", (list_name,))}
    assert set(rejects) == set(bad)
    for jid, says in bad.items():
        assert says in rejects[jid], rejects[jid]
    # Everything else was copied and marked; the rejects stay unsynced, to be tried again.
    copied = {bytes(r["jid"]).decode() for r in mysql_rows(mysql_db, list_name)}
    assert copied == set(processed(store, list_name)) - set(bad)
    assert set(synced_marks(store, list_name, mysql_url)) == copied
    again = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    if store.is_embedded:
        assert again.counts.rejected == len(bad), "tried again, refused again"
        assert again.counts.copied == 0
    assert len(mysql_query(mysql_db, "SELECT * FROM sync_rejects WHERE list = %s", (list_name,))) == len(bad)


def test_a_reject_that_copies_later_leaves_the_rejects_table(store, store_url, mysql_db, mysql_url, list_name, spark):
    make_jobs(store, list_name, done=3)
    name = keys.job_name(list_name, 1)
    store.put(keys.JOB_SET, name, {"result": bytearray(b"\x01")})
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert len(mysql_query(mysql_db, "SELECT * FROM sync_rejects WHERE list = %s", (list_name,))) == 1
    store.put(keys.JOB_SET, name, {"result": {"fixed": True}})  # an operator repaired the record
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert mysql_query(mysql_db, "SELECT * FROM sync_rejects WHERE list = %s", (list_name,)) == []
    assert_exactly_once(store, mysql_db, list_name)


def test_a_lists_rejects_are_its_own_not_those_of_a_list_of_the_name_dropped_before(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    """Rejects were keyed (list, token): the new list's reject at a token took the
    row of the old list's reject there, and once the new job was copied the old
    list's reject was cleared as copied, though that job never was."""
    lists = JobLists(store)
    name = keys.job_name(list_name, 1)
    make_jobs(store, list_name, done=3)
    old = lists.status(list_name).created
    store.put(keys.JOB_SET, name, {"result": bytearray(b"\x01")})
    first = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)

    lists.drop(list_name, grace_s=0)
    time.sleep(0.002)  # the new list's stamp is the next millisecond's at least
    make_jobs(store, list_name, done=3)
    assert lists.status(list_name).created != old
    store.put(keys.JOB_SET, name, {"result": bytearray(b"\x02")})
    second = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)

    def rejects() -> list[tuple]:
        return sorted(mysql_query(mysql_db, "SELECT token, seen_at FROM sync_rejects WHERE list = %s", (list_name,)))

    assert rejects() == [(1, first.started_ms), (1, second.started_ms)], "one reject of each list's job"
    store.put(keys.JOB_SET, name, {"result": {"fixed": True}})  # the new job repaired, then copied
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert rejects() == [(1, first.started_ms)], "the old list's job was never copied: its reject stays"
    assert mysql_query(mysql_db, "SELECT created FROM sync_rejects WHERE list = %s", (list_name,)) == [(old,)]
    assert_exactly_once(store, mysql_db, list_name)


def test_rejects_written_before_the_lists_stamp_was_kept_give_way_to_their_jobs(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    """A sync_rejects of schema version 4 (keyed (list, token)) migrated to 5: its rows
    hold created 0. A job of theirs refused again takes their row's place, as it took
    the row before, rather than being a second reject of one job; one copied since
    clears it, as before."""
    from aeroqueue.sync import parse_target
    from aeroqueue.sync.write import Sink

    make_jobs(store, list_name, done=3)
    store.put(keys.JOB_SET, keys.job_name(list_name, 1), {"result": bytearray(b"\x01")})
    with Sink(parse_target(mysql_url)) as sink:
        schema_left_at(sink, 4)
        sink.execute("INSERT INTO sync_rejects (list, token, jid, state, reason, seen_at) "
                     "VALUES (%s, 1, 'j1', 'done', 'old', 1), (%s, 2, 'j2', 'done', 'old', 1)", (list_name, list_name))
        sink.commit()
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    created = JobLists(store).status(list_name).created
    assert mysql_query(mysql_db, "SELECT created, token FROM sync_rejects WHERE list = %s", (list_name,)) \
        == [(created, 1)]


def test_list_summaries(store, store_url, mysql_db, mysql_url, list_name, spark):
    finished, running = list_name, list_name + "-run"
    make_jobs(store, finished, done=8, dead=2)
    JobLists(store).seal(finished)
    make_jobs(store, running, done=3, dead=1, queued=6)
    sync_once(options(store_url, mysql_url, lists=(finished, running)), spark, store)
    rows = {r[0]: r[1:] for r in mysql_query(
        mysql_db, "SELECT list, total, done, dead, sealed, complete, completed_at FROM aq_list_summary "
        "WHERE list IN (%s, %s)", (finished, running))}
    st = JobLists(store).status(finished)
    assert st.complete and st.completed_at
    assert rows[finished] == (10, 8, 2, 1, 1, st.completed_at)
    assert rows[running] == (10, 3, 1, 0, 0, None)


GRACE_S = 6.0  # test_retention's


def test_retention_deletes_only_jobs_synced_longer_ago_than_the_grace(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    make_jobs(store, list_name, done=30, dead=5)
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    old = set(synced_marks(store, list_name, mysql_url))
    assert len(old) == 35
    # The grace must outlast the second run's own marks-to-deletes gap in a task (a CI
    # run under load took over 2 s: 4 jobs it had just copied went with the old ones),
    # and the sleep the grace.
    time.sleep(GRACE_S + 0.3)
    # Since then: more processed jobs (unsynced), one that cannot be copied, and queued ones.
    make_jobs(store, list_name, done=10, queued=5, start=100)
    store.put(keys.JOB_SET, keys.job_name(list_name, 35), {"result": bytearray(b"\x01")})
    report = sync_once(options(store_url, mysql_url, delete_after_s=GRACE_S), spark, store)
    assert report.counts.deleted >= 35
    left = {j["jid"]: j for j in JobLists(store).jobs(list_name)}
    assert not old & set(left), "jobs synced before the grace period are gone from Aerospike"
    assert {j["state"] for j in left.values()} == {"done", "queued"}
    assert len(left) == 15, "just synced (10 - 1 reject), the reject, and the queued stay"
    assert not [b for b in left["j100"] if b.startswith("sync_")], "the reject was never synced, and is kept"
    assert len(mysql_rows(mysql_db, list_name)) == 44, "MySQL still holds every copied job"


def test_a_kicked_job_is_copied_again_once_it_finishes(store, store_url, mysql_db, mysql_url, list_name, spark):
    """Even done at an earlier time than it died: the server's clock an hour ahead at
    its death (set back since). The copy keeps the latest `done_at` of a job, and a
    mark is the `done_at` copied: the old row was kept, marked as copied, and
    retention deleted the only copy of the new result."""
    make_jobs(store, list_name, done=2, dead=3)
    dead = [j for j in processed(store, list_name).values() if j["state"] == "dead"]
    ahead = max(j["done_at"] for j in dead) + 3_600_000
    for j in dead[:2]:
        store.put(keys.JOB_SET, keys.job_name(list_name, j["token"]), {"done_at": ahead})
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert JobLists(store).kick(list_name) == 3
    q = Queue(store)
    with Session.open(store) as s:
        jobs = q.reserve(list_name, s, 3)
        q.complete_many(jobs, [{"second": True}] * 3)
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert_exactly_once(store, mysql_db, list_name)  # as Aerospike holds them: the second run's results
    assert [r["state"] for r in mysql_rows(mysql_db, list_name)] == ["done"] * 5
    assert set(synced_marks(store, list_name, mysql_url)) == {f"j{i}" for i in range(5)}


def _fill_to_the_limit(store, name: str) -> int:
    """The job's result grown to the largest the record takes (as a handler's result
    that just fits: `complete` stores it); its length."""
    from aeroqueue.errors import RecordTooBig

    lo, hi = 1, store.max_record_size()
    while lo < hi:
        mid = (lo + hi + 1) // 2
        try:
            store.put(keys.JOB_SET, name, {"result": "x" * mid})
            lo = mid
        except RecordTooBig:
            hi = mid - 1
    store.put(keys.JOB_SET, name, {"result": "x" * lo})
    return lo


def test_a_job_whose_record_has_no_room_for_the_mark_does_not_stop_the_others(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    make_jobs(store, list_name, done=60)
    full = keys.job_name(list_name, 7)
    _fill_to_the_limit(store, full)
    # One task, small batches: the range goes on after the batch that holds the full job.
    report = sync_once(options(store_url, mysql_url, partitions=1, batch_size=5, lists=(list_name,)), spark, store)
    assert_exactly_once(store, mysql_db, list_name)  # the full job too: its row was committed
    marks = synced_marks(store, list_name, mysql_url)
    assert set(marks) == set(processed(store, list_name)) - {"j7"}, "every job but the full one is marked"
    assert report.counts.unmarked == 1
    again = sync_once(options(store_url, mysql_url, partitions=1, batch_size=5, lists=(list_name,)), spark, store)
    assert again.counts.copied == 1 and again.counts.unmarked == 1, "copied again (harmless), never marked"
    assert_exactly_once(store, mysql_db, list_name)


def test_a_target_database_dropped_and_made_again_is_copied_into_in_full(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    """The marks named the target by its place alone: a database dropped and made
    again there (or a new server under the old name) was empty while the marks said
    it held every job, and the next runs copied only jobs processed since. The copy's
    id, kept in it, is in the mark: a database made anew has another."""
    make_jobs(store, list_name, done=5, dead=1)
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert_exactly_once(store, mysql_db, list_name)
    conn = root_connection()
    try:  # the name is the fixture's generated one: a safe identifier
        conn.cursor().execute(f"DROP DATABASE {mysql_db}")
        conn.cursor().execute(f"CREATE DATABASE {mysql_db} CHARACTER SET utf8mb4")
    finally:
        conn.close()
    again = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert again.counts.copied == 6
    assert_exactly_once(store, mysql_db, list_name)
    assert set(synced_marks(store, list_name, mysql_url)) == set(processed(store, list_name))


def test_a_list_dropped_and_loaded_again_keeps_each_lists_rows_apart(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    """Invariant 5 across a drop and a load of the same name: rows were keyed on
    (list, jid), so the new list's j0 took the old j0's row (a processed job gone
    from the copy), and the old j1..j3 stayed beside the new list's rows, counted as
    its. Each row names its list's stamp now: the old list's rows stay as copied,
    the new list's processed jobs land once each, and the summary names the list it
    counts."""
    lists = JobLists(store)
    make_jobs(store, list_name, done=4)
    old = lists.status(list_name).created
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    copied = sorted((bytes(r["jid"]), r["done_at"]) for r in mysql_rows(mysql_db, list_name, created=old))
    assert [j for j, _ in copied] == [b"j0", b"j1", b"j2", b"j3"]

    lists.drop(list_name, grace_s=0)
    time.sleep(0.002)  # the new list's stamp is the next millisecond's at least
    make_jobs(store, list_name, done=1, queued=2)
    new = lists.status(list_name).created
    assert new != old
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)

    assert sorted((bytes(r["jid"]), r["done_at"]) for r in mysql_rows(mysql_db, list_name, created=old)) == copied, \
        "the old list's rows stay as they were copied"
    assert_exactly_once(store, mysql_db, list_name)  # the new list's: j0 alone
    assert len(mysql_rows(mysql_db, list_name)) == 5
    assert mysql_query(mysql_db, "SELECT created, total, done FROM aq_list_summary WHERE list = %s", (list_name,)) \
        == [(new, 3, 1)]


def test_rows_copied_before_the_lists_stamp_was_kept_give_way_to_their_jobs_copied_since(
    store, store_url, mysql_db, mysql_url, list_name, spark
):
    """A table of schema version 3 (rows keyed on (list, jid)) migrated to 4: its rows
    hold created 0. A job of theirs copied since (processed again, a resync) got a
    second row beside its first; now it takes that row's place, as a copy took the
    row of its (list, jid) before, and rows no job copies again stay."""
    from aeroqueue.sync import parse_target
    from aeroqueue.sync.write import Sink

    make_jobs(store, list_name, done=3)
    with Sink(parse_target(mysql_url)) as sink:
        schema_left_at(sink, 3)
        for jid in ("j0", "j1", "old-x"):
            sink.execute("INSERT INTO aq_jobs (list, jid, token, state, attempts, synced_at) "
                         "VALUES (%s, %s, 0, 'done', 1, 1)", (list_name, jid))
        sink.commit()
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    created = JobLists(store).status(list_name).created
    rows = sorted((r["created"], bytes(r["jid"]).decode()) for r in mysql_rows(mysql_db, list_name))
    assert rows == sorted([(0, "old-x"), (created, "j0"), (created, "j1"), (created, "j2")])
    assert_exactly_once(store, mysql_db, list_name)
