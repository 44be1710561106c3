"""The pieces under the Spark job: target URLs, the versioned schema, the one
upsert path on both dialects, and turning job records into rows or rejects."""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from aeroqueue.cli.sync_cmd import parse_duration, parse_since
from aeroqueue.config import parse_url
from aeroqueue.sync import (
    JOB_COLUMNS,
    JOB_KEY,
    JOBS_TABLE,
    REJECTS_TABLE,
    Refused,
    Sink,
    SyncError,
    Target,
    job_row,
    migrate,
    migrations,
    parse_target,
    ranges,
    redact,
    remember_demo_target,
)
from aeroqueue.sync.schema import REJECT_COLUMNS, REJECT_KEY, VERSION_TABLE, reject_row, target_id
from aeroqueue.sync.target import demo_target
from aeroqueue.sync.write import infile_dir
from tests.conftest import require

from .helpers import mysql_port_closed, mysql_query, root_connection, schema_left_at
from .servers import OwnMariaDB


def test_mysql_url_with_password_in_url_or_environment(monkeypatch):
    monkeypatch.delenv("AEROQUEUE_MYSQL_PASSWORD", raising=False)
    monkeypatch.delenv("MYSQL_PWD", raising=False)
    t = parse_target("mysql://sync%40svc:p%40ss%2Fw0rd@db.example:3307/aq")
    assert (t.dialect, t.user, t.password, t.host, t.port, t.database) == ("mysql", "sync@svc", "p@ss/w0rd", "db.example", 3307, "aq")
    assert "p@ss" not in str(t) and "p%40ss" not in str(t) and "***" in str(t)
    assert "p@ss" not in repr(t)
    no_pw = parse_target("mysql://sync@db.example/aq")
    assert no_pw.password is None and no_pw.port == 3306 and str(no_pw) == "mysql://sync@db.example:3306/aq"
    monkeypatch.setenv("MYSQL_PWD", "from-mysql-pwd")
    assert parse_target("mysql://sync@db.example/aq").password == "from-mysql-pwd"
    monkeypatch.setenv("AEROQUEUE_MYSQL_PASSWORD", "from-aeroqueue")
    assert parse_target("mysql://sync@db.example/aq").password == "from-aeroqueue"
    assert parse_target("mysql://sync:inurl@db.example/aq").password == "inurl", "the URL wins"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://u:secret@h:notaport/db", "port"),
        ("mysql://u:secret@h:3306/", "database name"),
        ("mysql://u:secret@h:3306/bad-name", "database name"),
        ("mysql://:secret@h:3306/db", "no user"),
        ("mysql://u:secret@h:3306/db?ssl=1", "not supported"),
        ("postgres://u:secret@h/db", "unknown scheme"),
        ("sqlite://relative.db", "absolute"),
        ("h:3306/db", "expected mysql://"),
    ],
)
def test_bad_target_urls_say_what_is_wrong_without_the_password(url, says):
    with pytest.raises(SyncError) as e:
        parse_target(url)
    assert says in str(e.value)
    assert "secret" not in str(e.value)


def test_marks_name_the_target_not_the_credentials():
    a = parse_target("mysql://u:pw@db.example:3306/aq")
    assert a.mark_bin == parse_target("mysql://other:x@DB.example:3306/aq").mark_bin, "same table, other user"
    others = [parse_target(u) for u in ("mysql://u@db.example:3307/aq", "mysql://u@db.example:3306/aq2",
                                         "mysql://u@db2.example:3306/aq", "sqlite:///tmp/aq.db")]
    bins = {a.mark_bin, *(t.mark_bin for t in others)}
    assert len(bins) == 5 and all(b.startswith("sync_") and len(b.encode()) <= 15 for b in bins)
    assert a.lease_name != others[0].lease_name


def test_only_the_demo_store_has_a_default_target(tmp_path):
    store = parse_url(f"embedded://{tmp_path / 'store.db'}")
    assert demo_target(store) is None
    assert demo_target(parse_url("aerospike://h:3000/test")) is None
    remember_demo_target(store, "mysql://root:hidden@127.0.0.1:3306/aq_demo")
    assert "hidden" not in (tmp_path / "store.demo.json").read_text()
    assert demo_target(store) == Target(dialect="mysql", host="127.0.0.1", user="root", database="aq_demo")
    (tmp_path / "store.demo.json").write_text("{")
    with pytest.raises(SyncError, match="give --mysql"):
        demo_target(store)


def test_redact_masks_passwords_anywhere():
    assert redact("failed for mysql://u:hunter2@h/db: hunter2!", "hunter2") == "failed for mysql://u:***@h/db: ***!"
    assert redact("pw p%40ss and p@ss", "p@ss") == "pw *** and ***"


def test_durations_since_and_ranges():
    assert parse_since("2h", now_ms=10_000_000) == 10_000_000 - 7_200_000
    assert parse_since("2026-11-01") == parse_since("2026-11-01T00:00:00+00:00") == 1793491200000
    with pytest.raises(ValueError, match="neither a duration"):
        parse_since("yesterday")
    assert [parse_duration(t) for t in ("90", "90s", "5m", "2h", "7d", "500ms", "1.5m")] == [90, 90, 300, 7200, 604800, 0.5, 90]
    with pytest.raises(ValueError):
        parse_duration("5 minutes")
    for n in (1, 7, 64, 4096):
        rs = ranges(n)
        assert len(rs) == n and rs[0][0] == 0 and sum(c for _, c in rs) == 4096
        assert all(b + c == nb for (b, c), (nb, _) in itertools.pairwise(rs)), "contiguous"
        assert max(c for _, c in rs) - min(c for _, c in rs) <= 1


def test_schema_file_parses_into_numbered_migrations():
    steps = migrations()
    assert [m.version for m in steps] == list(range(len(steps))) and len(steps) >= 2
    assert any("schema_version" in s for s in steps[0].statements)
    assert any("aq_jobs" in s for s in steps[1].statements)
    with pytest.raises(SyncError, match="numbered"):
        migrations("-- migration 0: a\nSELECT 1;\n-- migration 2: b\nSELECT 2;\n")
    with pytest.raises(SyncError, match="end with"):
        migrations("-- migration 0: a\nSELECT 1\n")


def _sqlite(tmp_path: Path) -> Target:
    return Target(dialect="sqlite", path=str(tmp_path / "copy.db"))


def _target(dialect: str, tmp_path: Path, request: pytest.FixtureRequest) -> Target:
    """A fresh target of `dialect`: a database of its own on the local MariaDB, or a SQLite file."""
    if dialect == "mysql":
        return parse_target(f"mysql://root@127.0.0.1:3306/{request.getfixturevalue('mysql_db')}")
    return _sqlite(tmp_path)


def test_migration_is_versioned_and_idempotent_on_sqlite(tmp_path):
    target = _sqlite(tmp_path)
    with Sink(target) as sink:
        newest = migrate(sink)
        assert migrate(sink) == newest, "running it again changes nothing"
        versions = sink.execute("SELECT version FROM schema_version ORDER BY version")
        assert [v for (v,) in versions] == list(range(1, newest + 1))
        sink.execute("INSERT INTO schema_version (version, description, applied_at) VALUES (?, ?, ?)", (newest + 1, "from the future", 0))
        sink.commit()
        with pytest.raises(SyncError, match="newer than this aeroqueue"):
            migrate(sink)


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_migrations_started_together_run_one_after_the_other(dialect, tmp_path, request):
    """Two syncs started at once on a new target both migrated it: both found a
    column missing, and the second ALTER failed ('Duplicate column name'), 9 times
    in 10 on MariaDB. Each round: a new target, three migrations at the same moment."""
    for rnd in range(3):
        if dialect == "mysql":
            db = request.getfixturevalue("mysql_db")
            conn = root_connection(db)
            for (table,) in mysql_query(db, "SHOW TABLES"):
                conn.cursor().execute(f"DROP TABLE `{table}`")  # names the database gave
            conn.close()
            target = parse_target(f"mysql://root@127.0.0.1:3306/{db}")
        else:
            (tmp_path / str(rnd)).mkdir()
            target = _sqlite(tmp_path / str(rnd))
        start = threading.Barrier(3)
        errors: list[BaseException] = []

        def migrate_at_once(target=target, start=start, errors=errors) -> None:
            with Sink(target) as sink:
                start.wait(60)
                try:
                    migrate(sink)
                except BaseException as e:  # the test reads it
                    errors.append(e)

        threads = [threading.Thread(target=migrate_at_once) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [], f"round {rnd}: {errors}"
        with Sink(target) as sink:
            versions = [v for (v,) in sink.execute("SELECT version FROM schema_version ORDER BY version")]
        assert versions == list(range(1, versions[-1] + 1)), "each step once"


def test_migration_on_mysql(mysql_db):
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        newest = migrate(sink)
        migrate(sink)
    tables = {t for (t,) in mysql_query(mysql_db, "SHOW TABLES")}
    assert {"schema_version", "aq_jobs", "aq_list_summary", "sync_rejects"} <= tables
    assert mysql_query(mysql_db, "SELECT MAX(version), COUNT(*) FROM schema_version") == [(newest, newest)]
    # Binary job ids: case and trailing spaces make different rows.
    ddl = mysql_query(mysql_db, "SHOW CREATE TABLE aq_jobs")[0][1]
    assert "varbinary(200)" in ddl.lower() and "InnoDB" in ddl
    # Rows go in at the end of the clustered key; (list, created, jid) is what the upsert
    # collides on: a job of one list, not of another list of the name (migration 4).
    assert "PRIMARY KEY (`id`)" in ddl and "UNIQUE KEY `aq_jobs_job` (`list`,`created`,`jid`)" in ddl


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
def test_the_migrations_log_names_the_kind_of_target(dialect, tmp_path, request, caplog):
    """Migration 3 is SQLite's alone (nothing of it runs on MySQL), and a MariaDB
    target's log said it had been "migrated to version 3 (SQLite: aq_jobs.jid holds
    job ids as text)". Each line names the target's kind and version; one that ran
    nothing there says so."""
    target = _target(dialect, tmp_path, request)
    caplog.set_level(logging.INFO, logger="aeroqueue.sync.schema")
    with Sink(target) as sink:
        newest = migrate(sink)
        kind = "MariaDB" if dialect == "mysql" and "mariadb" in str(sink.execute("SELECT VERSION()")[0][0]).lower() \
            else "MySQL" if dialect == "mysql" else "SQLite"
    said = {r.version: r.getMessage() for r in caplog.records if getattr(r, "event", "") == "schema_migrated"}
    assert sorted(said) == list(range(1, newest + 1))
    for line in said.values():
        assert line.startswith(f"schema of {target} ({kind} "), line
        if dialect == "mysql":
            assert "SQLite" not in line, line
    if dialect == "mysql":
        assert said[3].endswith(f"at version 3: nothing to change on {kind}"), said[3]
    else:
        assert "migrated to version 3 (SQLite: aq_jobs.jid holds job ids as text)" in said[3]


def _failing_once(sink: Sink, on: str, errno: int, times: int = 1) -> list[str]:
    """Make `sink` fail its next `times` statements containing `on` with the server
    error `errno`, before sending them; returns the statements it failed."""
    import mysql.connector.errors as me

    failed: list[str] = []
    execute = sink.execute

    def flaky(sql, params=()):
        if on in sql and len(failed) < times:
            failed.append(sql)
            raise me.DatabaseError(msg=f"error {errno} injected by the test", errno=errno, sqlstate="HY000")
        return execute(sql, params)

    sink.execute = flaky  # type: ignore[method-assign]
    return failed


def test_a_migration_that_fails_on_a_transient_server_error_is_run_again(mysql_db, caplog):
    """CI saw MariaDB fail a new target's migration once with 6 ('Error on delete of
    ... (Errcode: 2)'), a file operation of the server's own: the sync failed,
    though the same statements went through at once when run again."""
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        failed = _failing_once(sink, "EXECUTE aq_migrate_2", errno=6, times=2)
        newest = migrate(sink)
        # The schema's named lock was let go between the tries and after the last.
        assert sink.execute("SELECT IS_USED_LOCK(%s)", (f"aeroqueue.schema.{mysql_db}",)) == [(None,)]
    assert len(failed) == 2, "the ALTER of migration 2 failed twice, then went through"
    assert mysql_query(mysql_db, "SELECT version FROM schema_version ORDER BY version") == [
        (v,) for v in range(1, newest + 1)]
    assert "PRIMARY KEY (`id`)" in mysql_query(mysql_db, "SHOW CREATE TABLE aq_jobs")[0][1]
    retries = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert len(retries) == 2 and all("error 6 injected" in m for m in retries), retries


@pytest.mark.parametrize(("errno", "tries"), [(1142, 1), (20, 1), (6, 3)],
                         ids=["not-transient", "disk-full", "transient-every-time"])
def test_a_migration_that_keeps_failing_says_why_after_its_tries(mysql_db, errno, tries):
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        failed = _failing_once(sink, "EXECUTE aq_migrate_2", errno=errno, times=10)
        with pytest.raises(SyncError, match=f"failed while creating or migrating the schema: {errno} .*error {errno} injected"):
            migrate(sink)
    assert len(failed) == tries
    # What it did finish stays recorded: the next run starts from there.
    assert mysql_query(mysql_db, "SELECT MAX(version) FROM schema_version") == [(1,)]


def test_the_sink_connection_sends_without_nagle_delay(mysql_db):
    """LOAD DATA LOCAL stalled 40 ms per batch (Nagle against the server's delayed
    ACK) until TCP_NODELAY: small batches, and every task's last, paid it."""
    import socket

    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        sock = sink.conn._socket.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_migration_2_rebuilds_a_version_1_table_keeping_its_rows_and_can_run_again(mysql_db):
    """A table an older aeroqueue created (clustered on (list, jid)) gets the
    auto-increment key; a run that died after the ALTER, before recording the
    version, finishes the migration the next time."""
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        schema_left_at(sink, 1)
        sink.upsert(JOBS_TABLE, OLD_COLUMNS, OLD_KEY, [_old_row("a", 100), _old_row("b", 100)])
        sink.commit()
        assert "PRIMARY KEY (`list`,`jid`)" in mysql_query(mysql_db, "SHOW CREATE TABLE aq_jobs")[0][1]
        newest = migrations()[-1].version
        assert migrate(sink) == newest
        sink.execute("DELETE FROM schema_version WHERE version >= 2")  # as if it died before recording it
        sink.commit()
        assert migrate(sink) == newest
        assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("a", 200, "dead"), _row("c", 100)], newer="done_at") == []
        sink.commit()
    assert mysql_query(mysql_db, "SELECT version FROM schema_version ORDER BY version") == [
        (v,) for v in range(1, newest + 1)]
    rows = mysql_query(mysql_db, "SELECT id, jid, state, done_at FROM aq_jobs ORDER BY jid")
    assert [(bytes(j), s, d) for _, j, s, d in rows] == [(b"a", "dead", 200), (b"b", "done", 100), (b"c", "done", 100)]
    assert len({i for i, *_ in rows}) == 3


def test_migration_3_gives_sqlite_job_ids_as_text_back_and_keeps_ids_equal_as_numbers_apart(tmp_path):
    """SQLite read VARBINARY(200) as NUMERIC affinity: '0123' was stored as 123, and
    '123', '0123' and '123.0' shared one row. A version-2 file is rebuilt with jid
    TEXT, its text ids kept (one stored as a number cannot be told back: it goes, for
    a resync to copy again); a run that died mid-migration (its scratch table left
    behind) finishes the next time."""
    target = _sqlite(tmp_path)
    with Sink(target) as sink:
        schema_left_at(sink, 2)
        sink.upsert(JOBS_TABLE, OLD_COLUMNS, OLD_KEY, [_old_row("0123", 100), _old_row("abc", 100)])
        sink.commit()
        assert sink.execute("SELECT typeof(jid) FROM aq_jobs ORDER BY token, jid") == [("integer",), ("text",)], \
            "the old affinity, as found"
        sink.execute("CREATE TABLE aq_jobs_v3 (leftover INT)")  # a run that died before its commit
        sink.commit()
        newest = migrations()[-1].version
        assert migrate(sink) == newest and migrate(sink) == newest
        # The mangled row cannot be told back ('0123' or '123'?): it goes, and a resync
        # copies its job again; a row kept as text stays as it was.
        assert sink.execute("SELECT jid, typeof(jid) FROM aq_jobs") == [("abc", "text")]
        ids = ["0123", "123", "123.0", "1.23e2", "+123", "12345678901234567890", "12345678901234567891"]
        assert sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row(j, 200) for j in ids], newer="done_at") == []
        sink.commit()
        rows = sink.execute("SELECT jid, typeof(jid), done_at FROM aq_jobs")
    assert sorted(j for j, _, _ in rows) == sorted([*ids, "abc"]), "one row an id, each id as given"
    assert {t for _, t, _ in rows} == {"text"}


def _row(jid: str, done_at: int, state: str = "done", synced_at: int = 1) -> tuple:
    return job_row({"list": "L", "token": 0, "jid": jid, "state": state, "att": 1, "payload": {"a": 1},
                    "result": [1], "done_at": done_at}, synced_at)


# aq_jobs' columns and key before migration 4 (the list's stamp): rows as an older
# aeroqueue wrote them, into a table of its schema.
OLD_COLUMNS, OLD_KEY = JOB_COLUMNS[:JOB_COLUMNS.index("created")], ("list", "jid")


def _old_row(jid: str, done_at: int) -> tuple:
    return _row(jid, done_at)[:len(OLD_COLUMNS)]


@pytest.mark.parametrize(("dialect", "method"), [("sqlite", "upsert"), ("mysql", "upsert"), ("mysql", "copy")])
def test_one_upsert_path_is_idempotent_and_never_takes_a_newer_copy_back(dialect, method, tmp_path, request):
    target = _target(dialect, tmp_path, request)
    with Sink(target) as sink:
        migrate(sink)
        write = getattr(sink, method)
        for _ in range(2):  # the same rows twice: still one each
            assert write(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("a", 100), _row("A", 100), _row("a ", 100)], newer="done_at") == []
            sink.commit()
        write(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("a", 200, "dead", synced_at=2)], newer="done_at")
        write(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("a", 100, "done", synced_at=3)], newer="done_at")  # late, older
        sink.commit()
        if method == "copy":
            assert sink.loaded == 3, "the first batch went in by LOAD DATA, the rest (rows already there) by the upsert"
        rows = sink.execute(f"SELECT jid, state, done_at, synced_at FROM {JOBS_TABLE} ORDER BY jid")
    as_text = sorted((bytes(j).decode() if not isinstance(j, str) else j, s, d, at) for j, s, d, at in rows)
    assert as_text == [("A", "done", 100, 1), ("a", "dead", 200, 2), ("a ", "done", 100, 1)]


def test_values_that_are_not_json_or_not_unicode_are_refused():
    base = {"list": "L", "token": 3, "jid": "j", "state": "done", "att": 1, "payload": {"k": "v"}, "done_at": 5}
    assert job_row(base, 9)[5] == '{"k":"v"}'
    for bins, says in [
        ({**base, "result": bytearray(b"\x00\xff")}, "result cannot be stored as JSON"),
        ({**base, "payload": {"x": float("nan")}}, "payload cannot be stored as JSON"),
        ({**base, "payload": "lone \ud800"}, "surrogates"),
        ({**base, "err": "bad \udcff"}, "the error is not valid Unicode"),
        ({**base, "payload": {b"k": 1}}, "payload"),
    ]:
        with pytest.raises(Refused, match=says):
            job_row(bins, 9)


def test_cannot_connect_is_one_clear_line_without_the_password(tmp_path):
    target = Target(dialect="mysql", host="127.0.0.1", port=mysql_port_closed(), user="u", password="s3cr3t!", database="d")
    with pytest.raises(SyncError) as e:
        Sink(target)
    text = str(e.value)
    assert text.startswith("cannot connect to mysql://u:***@127.0.0.1:") and "s3cr3t" not in text
    with pytest.raises(SyncError, match="cannot connect to sqlite"):
        (tmp_path / "dir.db").mkdir()
        Sink(Target(dialect="sqlite", path=str(tmp_path / "dir.db")))


def test_sqlite_target_refuses_rows_like_mysql(tmp_path):
    with Sink(_sqlite(tmp_path)) as sink:
        migrate(sink)
        good, bad = _row("ok", 1), list(_row("bad", 1))
        bad[5] = "{not json"  # the CHECK (JSON_VALID) refuses it
        refused = sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [good, tuple(bad)])
        sink.commit()
        assert [i for i, _ in refused] == [1] and "CHECK" in refused[0][1]
        assert sink.execute(f"SELECT COUNT(*) FROM {JOBS_TABLE}") == [(1,)]
    assert sqlite3.connect(str(tmp_path / "copy.db")).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_upsert_writes_in_key_order_and_names_refused_rows_as_given(tmp_path):
    """Rows go in key order (two tasks then lock index entries in one order: in scan
    order they deadlocked on MariaDB); the refused rows keep the caller's numbering."""
    with Sink(_sqlite(tmp_path)) as sink:
        migrate(sink)
        rows = [list(_row(jid, 1)) for jid in ("z", "m", "a", "q")]
        rows[0][5] = rows[2][5] = "{not json"
        sent: list[str] = []
        sink.conn.set_trace_callback(lambda sql: sent.extend(jid for jid in "zmaq" if f"'{jid}'" in sql))
        refused = sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [tuple(r) for r in rows])
        sink.commit()
        assert list(dict.fromkeys(sent)) == ["a", "m", "q", "z"], sent
        assert [i for i, _ in refused] == [0, 2], refused
        assert sorted(r[0] for r in sink.execute(f"SELECT jid FROM {JOBS_TABLE}")) == ["m", "q"]


# Values that LOAD DATA's text format has to escape, and some it must leave alone.
_AWKWARD = ["tab\there", "new\nline", "back\\slash", "\\N", "\\", "nul\0byte", "cr\r\nlf", "quote ' \" `",
            "é ü 漢字 🎉", " trailing ", "", "\\t not a tab", "end\\"]


def _awkward_rows() -> list[tuple]:
    rows = []
    for i, text in enumerate(_AWKWARD):
        rows.append(job_row({"list": "L", "token": i, "jid": f"j{i}{text}", "state": "dead", "att": 2,
                             "payload": {"text": text}, "result": None if i % 2 else [text], "err": text,
                             "done_at": None if i == 3 else 10 + i}, 99))
    return rows


def test_copy_by_load_data_stores_exactly_what_the_upsert_stores(mysql_db):
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    rows = _awkward_rows()
    with Sink(target) as sink:
        migrate(sink)
        assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows, newer="done_at") == []
        sink.commit()
        assert sink.loaded == len(rows), "the rows went in by LOAD DATA"
        here = Path(sink._infile_dir)  # type: ignore[arg-type]
        assert not (here / sink._infile).exists(), "the batch file is gone"
        assert here.stat().st_mode & 0o077 == 0, "private to the user"
    got = mysql_query(mysql_db, f"SELECT {', '.join(JOB_COLUMNS)} FROM aq_jobs ORDER BY token")
    as_sent = [tuple(bytes(v).decode() if isinstance(v, (bytes, bytearray)) else v for v in row) for row in got]
    assert as_sent == rows


def test_copy_refuses_the_same_rows_as_the_upsert_and_cuts_nothing(mysql_db):
    """LOAD DATA LOCAL only warns where an INSERT fails (a value too long is cut,
    a CHECK skips the row): copy then takes the upsert's way, row by row."""
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    good = _row("ok", 1)
    too_long = list(_row("x" * 201, 1))  # jid is VARBINARY(200)
    not_json = list(_row("bad", 1))
    not_json[5] = "{not json"
    with Sink(target) as sink:
        migrate(sink)
        refused = sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [good, tuple(too_long), tuple(not_json)], newer="done_at")
        sink.commit()
        assert [i for i, _ in refused] == [1, 2] and sink.loaded == 0
    assert mysql_query(mysql_db, "SELECT jid FROM aq_jobs") == [(b"ok",)]


def test_copy_without_local_infile_on_the_server_writes_by_upsert(tmp_path):
    """MySQL 8 ships with local_infile off: the sync still copies, by INSERT."""
    require(OwnMariaDB.available(), "mariadbd and mariadb-install-db are not installed")
    server = OwnMariaDB(tmp_path, "--local-infile=0")
    server.install()
    server.start()
    try:
        conn = root_connection(port=server.port)
        conn.cursor().execute("CREATE DATABASE aq_noinfile")
        conn.close()
        target = parse_target(f"mysql://root@127.0.0.1:{server.port}/aq_noinfile")
        with Sink(target) as sink:
            migrate(sink)
            assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, _awkward_rows()[:4], newer="done_at") == []
            sink.commit()
            assert not sink.can_load and sink.loaded == 0
            assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, _awkward_rows()[4:], newer="done_at") == []
            sink.commit()
            assert sink.execute(f"SELECT COUNT(*) FROM {JOBS_TABLE}") == [(len(_AWKWARD),)]
    finally:
        server.stop()


def test_table_and_column_names_must_be_plain_identifiers(tmp_path):
    with Sink(_sqlite(tmp_path)) as sink:
        migrate(sink)
        for table, columns in [("aq_jobs; DROP TABLE aq_jobs", JOB_COLUMNS), (JOBS_TABLE, (*JOB_COLUMNS[:-1], "synced_at)")),
                               ("aq_jobs\n", JOB_COLUMNS)]:  # re.match's $ passed a trailing newline
            with pytest.raises(SyncError, match="not a plain SQL identifier"):
                sink.copy(table, columns, JOB_KEY, [_row("a", 1)], newer="done_at")
        assert sink.execute(f"SELECT COUNT(*) FROM {JOBS_TABLE}") == [(0,)]


def test_a_batch_file_left_by_a_killed_process_goes_with_the_next_sink(tmp_path):
    """Spark kills executors mid-task: their last batch file must not pile up."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    here, scratch = infile_dir()
    assert not scratch
    left = Path(here) / f"batch-{dead.pid}-0123abcd.txt"
    mine = Path(here) / f"batch-{os.getpid()}-0123abcd.txt"
    left.write_text("1\t2\n")
    mine.write_text("1\t2\n")
    try:
        infile_dir()
        assert not left.exists(), "the dead process's file is removed"
        assert mine.exists(), "a live process's file is left alone"
    finally:
        mine.unlink(missing_ok=True)
        left.unlink(missing_ok=True)


def _big_row(token: int, chars: int) -> tuple:
    # Four bytes a character in UTF-8, and quotes the driver doubles: a row's size
    # in a statement is far above its length in characters.
    return job_row({"list": "L", "token": token, "jid": f"big{token}", "state": "done", "att": 1,
                    "payload": "\U0001F600'" * (chars // 2), "done_at": 7}, 1)


def test_an_upsert_is_cut_into_statements_the_server_takes(mysql_db):
    """One multi-row INSERT over max_allowed_packet is refused (and the connection
    dropped): batches of large payloads go in several statements, a row too big
    even alone is refused with the reason, and the rest land."""
    target = parse_target(f"mysql://root@127.0.0.1:3306/{mysql_db}")
    with Sink(target) as sink:
        migrate(sink)
        assert sink.max_statement == mysql_query(mysql_db, "SELECT @@max_allowed_packet")[0][0]
        # Real sizes against MariaDB's own limit: 20 rows of 1 MB of UTF-8 (20 MB in
        # all, over its 16 MiB), then the same rows again (the upsert's update path).
        rows = [_big_row(t, 400_000) for t in range(20)]
        for _ in range(2):
            assert sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows, newer="done_at") == []
            sink.commit()
        assert sink.execute(f"SELECT COUNT(*), SUM(LENGTH(payload)) FROM {JOBS_TABLE}") == [(20, 20 * 1_000_002)]
        # A lower limit than the server's, to see a row too big for any statement.
        sink.max_statement = 300_000
        small = [_big_row(t, 20_000) for t in range(100, 130)]
        mixed = [*small[:10], _big_row(99, 200_000), *small[10:]]
        refused = sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, mixed, newer="done_at")
        sink.commit()
        assert [i for i, _ in refused] == [10] and "max_allowed_packet (300,000 bytes)" in refused[0][1]
        assert sink.execute(f"SELECT COUNT(*) FROM {JOBS_TABLE} WHERE token >= 100") == [(30,)]


def test_summaries_skip_a_list_dropped_during_the_run(tmp_path, backend, list_name):
    """A list named by `--list` (or listed when the run began) and dropped before the
    summaries were written had failed the run after its jobs were copied and marked."""
    from aeroqueue import udfs
    from aeroqueue.lists import JobLists
    from aeroqueue.loading import JobSpec
    from aeroqueue.sync import SyncOptions, rows_to_copy
    from aeroqueue.sync.job import write_summaries

    udfs.register(backend)
    lists = JobLists(backend)
    kept, gone = list_name, f"{list_name}-gone"
    for name in (kept, gone):
        lists.load(name, [JobSpec("a", {})])
    lists.drop(gone, grace_s=0)
    with Sink(_sqlite(tmp_path)) as sink:
        migrate(sink)
        assert write_summaries(backend, sink, 1, (kept, gone)) == 1
        assert [r[0] for r in sink.execute("SELECT list FROM aq_list_summary")] == [kept]
    options = SyncOptions(store_url=f"embedded://{tmp_path / 'unused.db'}", target=_sqlite(tmp_path), lists=(kept, gone))
    assert rows_to_copy(backend, options) == {kept: 0}  # the progress bar's count, before the run
    lists.drop(kept, grace_s=0)


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_migration_4_keeps_the_rows_of_before_under_stamp_0_and_keys_rows_on_the_lists_stamp(dialect, tmp_path, request):
    """A version-3 table's rows stay, with created 0; a row of the same list and id
    but another stamp (a list dropped and loaded again) is a row of its own, and one
    of the same stamp is the same row. On MySQL a run that died after the ALTERs,
    before recording the version, finishes the migration the next time."""
    target = _target(dialect, tmp_path, request)
    with Sink(target) as sink:
        schema_left_at(sink, 3)
        sink.upsert(JOBS_TABLE, OLD_COLUMNS, OLD_KEY, [_old_row("a", 100), _old_row("b", 100)])
        sink.execute("INSERT INTO aq_list_summary (list, mode, total, done, dead, sealed, complete, updated_at) "
                     "VALUES ('L', 'tokens', 2, 2, 0, 1, 1, 5)")
        sink.commit()
        newest = migrations()[-1].version
        assert migrate(sink) == newest
        if dialect == "mysql":
            sink.execute("DELETE FROM schema_version WHERE version >= 4")  # as if it died before recording it
            sink.commit()
            assert migrate(sink) == newest
        stamped = [job_row({"list": "L", "token": 0, "jid": "a", "state": "done", "att": 1, "payload": None,
                            "done_at": done_at, "c": 7}, 2) for done_at in (300, 400)]
        for row in stamped:  # the new list's a, copied twice: one row
            assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [row], newer="done_at") == []
        assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("b", 200)], newer="done_at") == []  # stamp 0: b's row
        sink.commit()
        rows = sink.execute("SELECT created, jid, done_at FROM aq_jobs ORDER BY created, jid")
        summary = sink.execute("SELECT list, created, total FROM aq_list_summary")
    assert [(c, bytes(j) if isinstance(j, (bytes, bytearray)) else j.encode(), d) for c, j, d in rows] == [
        (0, b"a", 100), (0, b"b", 200), (7, b"a", 400)]
    assert summary == [("L", 0, 2)]


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_migration_5_keeps_the_rejects_of_before_under_stamp_0_and_keys_rejects_on_the_lists_stamp(
    dialect, tmp_path, request
):
    """sync_rejects was keyed (list, token): a reject of a list dropped and loaded again
    took the row of the old list's. Its rows of before stay, with created 0, and a
    reject of another stamp at their token is a row of its own. On MySQL a run that
    died after the ALTER, before recording the version, finishes it the next time."""
    target = _target(dialect, tmp_path, request)
    with Sink(target) as sink:
        schema_left_at(sink, 4)
        sink.upsert(REJECTS_TABLE, REJECT_COLUMNS[:-1], ("list", "token"), [("L", 1, "a", "done", "not JSON", 10)])
        sink.commit()
        newest = migrations()[-1].version
        assert migrate(sink) == newest
        if dialect == "mysql":
            sink.execute("DELETE FROM schema_version WHERE version >= 5")  # as if it died before recording it
            sink.commit()
            assert migrate(sink) == newest
        for seen_at in (20, 30):  # the new list's reject at token 1, written twice: one row
            sink.upsert(REJECTS_TABLE, REJECT_COLUMNS, REJECT_KEY,
                        [reject_row({"list": "L", "token": 1, "jid": "a", "state": "done", "c": 7}, "bad", seen_at)])
        sink.commit()
        rows = sink.execute("SELECT created, token, reason, seen_at FROM sync_rejects ORDER BY created")
    assert rows == [(0, 1, "not JSON", 10), (7, 1, "bad", 30)]


def test_a_sqlite_target_whose_schema_version_alone_was_dropped_keeps_its_stamps(tmp_path, caplog):
    """SQLite's migrations 3 to 5 rebuild their table from the columns of before: run
    again on a file whose schema_version alone was dropped, 3 and 4 set every row's
    stamp to 0 (and two lists of one name, rows of one (list, jid), failed migration
    3's key for good), and 5 every reject's. The tables' shape tells their version."""
    target = _sqlite(tmp_path)
    with Sink(target) as sink:
        newest = migrate(sink)
        rows = [job_row({"list": "L", "token": 0, "jid": "a", "state": "done", "done_at": 5, "c": c}, 1) for c in (7, 8)]
        assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows, newer="done_at") == []
        sink.upsert(REJECTS_TABLE, REJECT_COLUMNS, REJECT_KEY,
                    [reject_row({"list": "L", "token": 1, "jid": "b", "state": "done", "c": 8}, "bad", 1)])
        sink.execute("DROP TABLE schema_version")
        sink.commit()
        with caplog.at_level(logging.WARNING, logger="aeroqueue.sync.schema"):
            assert migrate(sink) == newest
        assert sink.execute("SELECT created, jid FROM aq_jobs ORDER BY created") == [(7, "a"), (8, "a")]
        assert sink.execute("SELECT created, token FROM sync_rejects") == [(8, 1)]
        assert [v for (v,) in sink.execute("SELECT version FROM schema_version ORDER BY version")] == \
            list(range(1, newest + 1))
    assert f"{VERSION_TABLE} of {target} was empty, though its tables are at version {newest}" in caplog.text


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_a_target_made_anew_gets_an_id_of_its_own_and_one_of_before_keeps_its_marks(dialect, tmp_path, request):
    """Marks named a target by its place alone: a database dropped and made again
    there was an empty copy that the marks said held every job. A copy the sync
    makes gets an id, which its marks name with the place; a target made before ids
    keeps an empty id, so its marks stay good; one whose id went missing gets a new
    one (what it holds is not known: it is copied into in full)."""
    target = _target(dialect, tmp_path, request)
    with Sink(target) as sink:
        schema_left_at(sink, 5)
        assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("a", 100)], newer="done_at") == []
        sink.commit()
        migrate(sink)
        assert target_id(sink) == "", "upgraded: its marks name its place alone, as before"
        migrate(sink)
        assert target_id(sink) == ""

        for table in ("aq_jobs", "aq_list_summary", "sync_rejects", "sync_target", "schema_version"):
            sink.execute(f"DROP TABLE {table}")
        sink.commit()
        migrate(sink)
        made = target_id(sink)
        assert len(made) == 32, "made anew: an id of its own"
        migrate(sink)
        assert target_id(sink) == made, "kept"

        sink.execute("DROP TABLE aq_jobs")
        sink.execute("DROP TABLE schema_version")  # as the error for a missing aq_jobs says
        sink.commit()
        migrate(sink)
        again = target_id(sink)
        sink.execute("DELETE FROM sync_target")
        sink.commit()
        migrate(sink)
        lost = target_id(sink)
    assert len({"", made, again, lost}) == 4
    marks = {replace(target, target_id=i).mark_bin for i in ("", made, again, lost)}
    assert len(marks) == 4 and target.mark_bin in marks
    assert len({replace(target, target_id=i).lease_name for i in ("", made)}) == 1, "one lease per place"


_OURS = ("list VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, created BIGINT NOT NULL DEFAULT 0, "
         "{jid}, token BIGINT NOT NULL, state VARCHAR(8) NOT NULL, attempts INT NOT NULL, payload LONGTEXT, "
         "result LONGTEXT, error TEXT, done_at BIGINT, synced_at BIGINT NOT NULL")


@pytest.mark.parametrize(("columns", "keys", "said"), [
    (_OURS.format(jid="jid VARBINARY(200) NOT NULL"), "",
     r"has no unique key on \(list, created, jid\): every copy of a job would add a row"),
    # The columns of before migration 4 (no stamp), no unique key either.
    (_OURS.replace("created BIGINT NOT NULL DEFAULT 0, ", "").format(jid="jid VARBINARY(200) NOT NULL"), "",
     r"has no unique key on \(list, created, jid\)"),
    (_OURS.format(jid="jid VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"),
     ", UNIQUE KEY u (list, created, jid)", r"column\(s\) jid compare text without regard to case"),
    # Keyed as an older aeroqueue's table (list, jid), a case-insensitive id: refused
    # before the migrations drop its key and add the stamp.
    (_OURS.replace("created BIGINT NOT NULL DEFAULT 0, ", "").format(
        jid="jid VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL"),
     ", UNIQUE KEY aq_jobs_job (list, jid)", r"column\(s\) jid compare text without regard to case"),
    (_OURS.format(jid="jid VARBINARY(200) NOT NULL"), ", UNIQUE KEY u (list, created, jid), UNIQUE KEY by_jid (jid)",
     r"has a unique key on \(jid\) besides \(list, created, jid\)"),
], ids=["no-unique-key", "no-stamp-no-key", "case-insensitive-id", "old-key-case-insensitive-id", "another-unique-key"])
def test_an_aq_jobs_made_by_hand_that_the_upsert_cannot_rely_on_is_refused_as_found(mysql_db, columns, keys, said):
    """The migrations create aq_jobs only if it is not there: a table made before the
    first sync (by hand, by another tool) was taken as it was. Without the unique
    key every resync added each job again; with a case-insensitive id, jobs 'Ab' and
    'ab' shared a row and one was marked copied without being in the table. Refused
    before any migration alters it; dropped with schema_version, as the message says,
    the sync makes its own."""
    db = mysql_db
    mysql_query(db, f"CREATE TABLE aq_jobs (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                    f"{columns}{keys}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")
    found = mysql_query(db, "SHOW CREATE TABLE aq_jobs")
    target = parse_target(f"mysql://root@127.0.0.1:3306/{db}")
    with Sink(target) as sink, pytest.raises(
            SyncError, match=f"aq_jobs in mysql://root@127.0.0.1:3306/{db}:? {said}.*Rename or drop it and schema_version"):
        migrate(sink)
    assert mysql_query(db, "SHOW CREATE TABLE aq_jobs") == found, "left as it was found"
    assert mysql_query(db, "SELECT COUNT(*) FROM schema_version") == [(0,)]
    mysql_query(db, "DROP TABLE aq_jobs")
    mysql_query(db, "DROP TABLE schema_version")
    with Sink(target) as sink:
        assert migrate(sink) == migrations()[-1].version


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
def test_an_aq_jobs_dropped_or_made_again_by_hand_after_the_migrations_is_refused(dialect, tmp_path, request):
    """After the migrations (SQLite's 3 and 4 rebuild any table they find): a table
    made again by hand is refused, and one dropped says to drop schema_version too
    (its migration 1 never runs again); with both dropped, the sync makes its own."""
    target = _target(dialect, tmp_path, request)
    with Sink(target) as sink:
        newest = migrate(sink)
        sink.execute("DROP TABLE aq_jobs")
        sink.commit()
        with pytest.raises(SyncError, match=r"aq_jobs is missing from .*drop schema_version as well"):
            migrate(sink)
        ours = _OURS if dialect == "mysql" else _OURS.replace(" CHARACTER SET ascii COLLATE ascii_bin", "")
        sink.execute(f"CREATE TABLE aq_jobs ({ours.format(jid='jid VARBINARY(200) NOT NULL')})")
        sink.commit()
        with pytest.raises(SyncError, match=r"has no unique key on \(list, created, jid\)"):
            migrate(sink)
        sink.execute("DROP TABLE aq_jobs")
        sink.execute("DROP TABLE schema_version")
        sink.commit()
        assert migrate(sink) == newest
        assert sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, [_row("a", 100), _row("b", 100)], newer="done_at") == []
        sink.commit()
        assert sorted(c for (c,) in sink.execute("SELECT created FROM aq_list_summary")) == []
        assert sink.execute("SELECT COUNT(*) FROM aq_jobs") == [(2,)]


@pytest.mark.parametrize("dialect", ["sqlite", "mysql"])
@pytest.mark.parametrize(("table", "said"), [
    # An older Flyway's history table: text versions, no applied_at.
    ("CREATE TABLE schema_version (installed_rank INT NOT NULL DEFAULT 1, version VARCHAR(50), description VARCHAR(200))",
     "it has no version, description and applied_at columns"),
    ("CREATE TABLE schema_version (version VARCHAR(50) PRIMARY KEY, description VARCHAR(200), applied_at BIGINT)",
     "its latest version is '1.2.0', not a number"),
], ids=["other-columns", "text-versions"])
def test_another_tools_schema_version_table_is_refused_by_name(dialect, table, said, tmp_path, request):
    """The migration read another tool's schema_version as its own: a TypeError
    comparing its text versions with numbers, or, for a number it happened to hold,
    no aq_jobs created and every batch failing."""
    target = _target(dialect, tmp_path, request)
    with Sink(target) as sink:
        sink.execute(table)
        sink.execute("INSERT INTO schema_version (version, description) VALUES ('1.2.0', 'theirs')")
        sink.commit()
        with pytest.raises(SyncError, match=rf"table schema_version in .* is not aeroqueue's \({said}\): give the sync "
                                            "a database of its own"):
            migrate(sink)
        assert [t for (t,) in sink.execute("SELECT version FROM schema_version")] == ["1.2.0"], "theirs, untouched"


def test_a_sqlite_target_in_a_directory_that_does_not_exist_is_refused(tmp_path):
    """The directories were made: a mistyped path took the copies (and with
    --delete-after the jobs went only there). Nothing is made."""
    target = Target(dialect="sqlite", path=str(tmp_path / "typo" / "dir" / "copy.db"))
    with pytest.raises(SyncError, match=r"its directory .*/typo/dir does not exist"), Sink(target) as sink:
        migrate(sink)
    assert not (tmp_path / "typo").exists()


def test_a_sqlite_file_of_another_program_is_refused_as_a_target_and_left_as_it_was(tmp_path):
    """Another program's SQLite file (here an embedded aeroqueue store) got the sync's
    tables written into it."""
    from aeroqueue.backends import open_backend

    store = tmp_path / "store.db"
    open_backend(f"embedded://{store}").close()
    before = sqlite3.connect(store).execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    assert before
    refused = r"holds tables \(.*\), none of them a sync's: another program's file"
    with pytest.raises(SyncError, match=refused), Sink(Target(dialect="sqlite", path=str(store))) as sink:
        migrate(sink)
    assert sqlite3.connect(store).execute("SELECT name FROM sqlite_master ORDER BY name").fetchall() == before
