"""Two sync tasks writing to one MySQL table at once: the lock conflicts between them
are retried, as the server reports them (MariaDB's own error numbers, from real
conflicts between real connections)."""

from __future__ import annotations

import threading
import time
from typing import Any

import mysql.connector
import pytest

from aeroqueue.sync import (
    JOB_COLUMNS,
    JOB_KEY,
    JOBS_TABLE,
    Sink,
    SyncOptions,
    job_row,
    migrate,
    parse_target,
)
from aeroqueue.sync.scan import Batch
from aeroqueue.sync.task import RangeSync
from aeroqueue.sync.write import MySQLDialect

from .helpers import mysql_query, root_connection

LIST = "L"
SYNCED_AT = 77


def _bins(jid: str, token: int, done_at: int, **more: Any) -> dict[str, Any]:
    return {"list": LIST, "jid": jid, "token": token, "state": "done", "att": 1,
            "payload": {"n": token}, "result": {"ok": token}, "done_at": done_at, **more}


def _batch(bins: list[dict[str, Any]]) -> Batch:
    batch = Batch()
    for i, b in enumerate(bins):
        batch.add(f"{LIST}/{b['token']}", b, SYNCED_AT)
        assert len(batch.rows) == i + 1, "every row reaches the database (none refused by the scan)"
    return batch


def _wait_until_waiting_for_a_lock(connection_id: int, what: str) -> None:
    """Until InnoDB says the connection's transaction waits for a lock (a real wait,
    seen by the server: no sleep standing in for it)."""
    spy = root_connection()
    try:
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            # InnoDB refreshes what innodb_trx shows only when nobody has read it for
            # 0.1 s: polled faster, it shows the same moment for ever.
            time.sleep(0.15)
            cur = spy.cursor()
            cur.execute("SELECT trx_state FROM information_schema.innodb_trx WHERE trx_mysql_thread_id = %s",
                        (connection_id,))
            state = cur.fetchall()
            cur.close()
            if state and state[0][0] == "LOCK WAIT":
                return
        pytest.fail(f"{what} never waited for a lock")
    finally:
        spy.close()


class _Watched(MySQLDialect):
    """The sink's own dialect, noting the errors its retry loop is asked about, and
    calling `on_refused` the first time a value is refused (the multi-row upsert
    failed, the row-by-row one is next): the moment the test lets the other task in."""

    def __init__(self, on_refused: Any) -> None:
        self.asked: list[BaseException] = []
        self._on_refused = on_refused

    def transient(self, error: BaseException) -> bool:
        self.asked.append(error)
        return super().transient(error)

    def refused(self, error: BaseException) -> bool:
        refused = super().refused(error)
        if refused and self._on_refused is not None:
            on_refused, self._on_refused = self._on_refused, None
            on_refused()
        return refused


def test_a_deadlock_over_the_auto_increment_lock_is_retried_like_any_deadlock(mysql_db):
    """MariaDB with innodb_autoinc_lock_mode=1 (its default): LOAD DATA holds the
    table's AUTO-INC lock for the whole statement. Task A's batch holds a value the
    database refuses (an error longer than TEXT holds, as another program may write):
    its multi-row upsert fails, keeping the next-key lock it took on a row the table
    had ("e0": a failed statement keeps its row locks), and A goes row by row. Task
    B's load, holding the AUTO-INC lock, waits for that lock, and A's next statement
    waits for B's AUTO-INC lock: a deadlock. The victim, A, is told 1467 "Failed to
    read auto-increment value from storage engine", not 1213, its whole transaction
    rolled back all the same. A's write is tried again and lands; B's load too."""
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    copied = [_bins(f"e{i}", 100 + i, done_at=1) for i in range(5)]
    with Sink(target) as sink:
        migrate(sink)
        # "c" ends the gap below "e0": B's first rows (a...) go in without waiting.
        first = [job_row(b, 1) for b in [_bins("c", 99, done_at=1), *copied]]
        sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, first, newer="done_at")
        sink.commit()

    # A: the copied jobs, done again since (newer done_at), and one the database refuses.
    again = [_bins(b["jid"], b["token"], done_at=2) for b in copied]
    too_long = _bins("e0-bad", 200, done_at=2, err="x" * 70_000)
    batch_a = _batch([again[0], too_long, *again[1:]])
    # B: new jobs; its load (in key order) first puts in 2,000 rows (a transaction
    # heavier than A's, so A is the deadlock's victim), then "d", in the gap A locks.
    rows_b = [job_row(_bins(f"a{i:05d}", 1000 + i, done_at=2), SYNCED_AT) for i in range(2000)]
    rows_b.append(job_row(_bins("d", 5000, done_at=2), SYNCED_AT))

    b_done: dict[str, Any] = {}
    b_started = threading.Event()
    with Sink(target) as sink_b, Sink(target) as sink_a:

        def task_b() -> None:
            b_started.wait(30)
            try:
                b_done["refused"] = sink_b.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows_b, newer="done_at")
                sink_b.commit()
                b_done["loaded"] = sink_b.loaded
            except Exception as e:  # the test's assertions say what went wrong
                b_done["error"] = e

        def let_b_in() -> None:
            # A holds the lock on "e0" and is between two statements.
            b_started.set()
            _wait_until_waiting_for_a_lock(sink_b.conn.connection_id, "B's LOAD DATA")

        sink_a.dialect = watched = _Watched(let_b_in)
        opts = SyncOptions(store_url="embedded:///nowhere/store.db", target=target)
        b = threading.Thread(target=task_b)
        b.start()
        try:
            refused = RangeSync(opts, None, sink_a, SYNCED_AT)._write(batch_a)  # type: ignore[arg-type]
        finally:
            b_started.set()
            b.join(60)

    assert [getattr(e, "errno", None) for e in watched.asked] == [1467], watched.asked
    # The server's own error object, as the first attempt got it.
    assert MySQLDialect().transient(watched.asked[0])
    assert [i for i, _ in refused] == [1] and "Data too long for column 'error'" in refused[0][1]
    assert "error" not in b_done, b_done.get("error")
    assert b_done == {"refused": [], "loaded": len(rows_b)}
    held = [(bytes(jid).decode(), done) for jid, done in mysql_query(mysql_db, "SELECT jid, done_at FROM aq_jobs")]
    assert sorted(row for row in held if row[0].startswith("e")) == [(f"e{i}", 2) for i in range(5)], (
        "A's copy landed, every row, once")
    assert len(held) == 1 + 5 + len(rows_b)
    assert mysql_query(mysql_db, "SELECT jid FROM sync_rejects") == [("e0-bad",)]


def test_a_lock_wait_timeout_on_the_auto_increment_lock_is_retried(mysql_db, tmp_path):
    """A wait for the AUTO-INC lock that outlasts innodb_lock_wait_timeout is 1467
    too, not 1205. Here a load holds the AUTO-INC lock while it waits for a row
    another transaction holds; the task's load waits for the AUTO-INC lock, with a
    timeout of 1 s (its session's: 50 s by default), and gives up. The row holder
    lets go then; the task's next attempt lands."""
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        migrate(sink)
    holder = root_connection(mysql_db)
    loader = mysql.connector.connect(host="127.0.0.1", port=3306, user="root", database=mysql_db,
                                     allow_local_infile=True, autocommit=False)
    released = threading.Event()

    def let_go() -> None:
        if not released.is_set():
            released.set()
            holder.rollback()

    try:
        hold = holder.cursor()
        hold.execute("INSERT INTO aq_jobs (list, jid, token, state, attempts, synced_at) VALUES ('L', 'k', 1, 'done', 1, 1)")
        # The other load: its rows go in under the AUTO-INC lock, until "k", the holder's.
        path = tmp_path / "other.txt"
        path.write_text("L\ta\t2\tdone\t1\t1\nL\tk\t3\tdone\t1\t1\n")
        load_error: list[BaseException] = []

        def load() -> None:
            try:
                cur = loader.cursor()
                cur.execute("LOAD DATA LOCAL INFILE %s IGNORE INTO TABLE aq_jobs "
                            "(list, jid, token, state, attempts, synced_at)", (str(path),))
                loader.commit()
            except Exception as e:
                load_error.append(e)

        other_load = threading.Thread(target=load)
        other_load.start()
        _wait_until_waiting_for_a_lock(loader.connection_id, "the other load")

        with Sink(target) as sink:
            sink.execute("SET SESSION innodb_lock_wait_timeout = 1")
            sink.dialect = watched = _Watched(None)
            real_rollback = sink.rollback

            def rollback() -> None:  # the task's first attempt failed: the holder lets go
                real_rollback()
                let_go()

            sink.rollback = rollback  # type: ignore[method-assign]
            opts = SyncOptions(store_url="embedded:///nowhere/store.db", target=target)
            batch = _batch([_bins(f"j{i}", i + 10, done_at=5) for i in range(50)])
            refused = RangeSync(opts, None, sink, SYNCED_AT)._write(batch)  # type: ignore[arg-type]
        other_load.join(30)
    finally:
        let_go()
        holder.close()
        loader.close()

    assert [getattr(e, "errno", None) for e in watched.asked] == [1467], watched.asked
    assert refused == [] and not load_error
    assert mysql_query(mysql_db, "SELECT COUNT(*) FROM aq_jobs WHERE jid LIKE 'j%'") == [(50,)]
