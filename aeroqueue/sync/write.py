"""Writing to the target: one upsert code path, two databases (MySQL and SQLite).

`Sink` is one connection with the upsert every table goes through: a batch
is one multi-row ``INSERT ... ON DUPLICATE KEY UPDATE`` (``ON CONFLICT`` on
SQLite); if the database refuses a value, the batch is tried row by row to
find the rows at fault, which the caller turns into rejects. SQL is always
parameterised; the MySQL driver's parameter conversion is the hot spot of a
sync, so the session runs with ``NO_BACKSLASH_ESCAPES`` (only a quote needs
doubling) and a converter with fast paths for the few types a row holds.

`Sink.copy` puts the sync's rows in on MySQL by ``LOAD DATA LOCAL INFILE ...
IGNORE`` from a file of the batch in a private directory: about a third of
the server's CPU per row of the multi-row upsert, and no per-value
conversion in the driver. It only ever inserts rows the table does not hold:
if any row was skipped (already there) or warned about (a value refused or
cut, which LOAD DATA LOCAL only warns about), the load is rolled back to a
savepoint and the batch goes through the upsert, so the table ends exactly
as the upsert alone would leave it.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import random
import re
import shutil
import sqlite3
import stat
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import SyncError
from .target import Target

log = logging.getLogger(__name__)

# Strict, whatever the server's default: a value that does not fit is an error
# (and a reject), never silently truncated. With NO_BACKSLASH_ESCAPES a string
# literal only needs its quotes doubled: the driver escapes accordingly.
MYSQL_SQL_MODE = "TRADITIONAL,NO_BACKSLASH_ESCAPES"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def identifiers(*names: str) -> None:
    """Table and column names go into SQL text (they cannot be parameters): plain names only."""
    for name in names:
        if not _IDENTIFIER.fullmatch(name):
            raise SyncError(f"{name!r} is not a plain SQL identifier")



def no_delay(conn: Any) -> bool:
    """Turn Nagle's algorithm off on a mysql-connector connection's TCP socket; True
    if it is off. LOAD DATA LOCAL sends the file and then an empty packet in small
    writes: with Nagle on, the second waits for the server's delayed ACK, about 40
    ms per load whatever its size (measured here: 42 ms for an 11-row batch, 1 ms
    with TCP_NODELAY). The pure-Python driver has no option for it, so it is set
    on the driver's socket (`_socket.sock`) when there is one: a Unix socket, or a
    driver that moved it, keeps the default, only slower for small batches."""
    import socket

    sock = getattr(getattr(conn, "_socket", None), "sock", None)
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    except OSError:
        return False

_ONLY_SQLITE = re.compile(r"/\*sqlite\s(.*)\*/", re.S)


class Dialect:
    """What differs between MySQL and SQLite: connecting, placeholders, the upsert
    clause, and which errors mean "this row's values were refused"."""

    name = ""
    placeholder = ""

    def connect(self, target: Target, infile_dir: str | None = None) -> Any:
        raise NotImplementedError

    def conflict_clause(self, table: str, key: Sequence[str], update: Sequence[str], newer: str | None) -> str:
        raise NotImplementedError

    def refused(self, error: BaseException) -> bool:
        """The database refused a value in the row (too long, not valid, ...): reject the row."""
        raise NotImplementedError

    def transient(self, error: BaseException) -> bool:
        """A deadlock or lock timeout: the batch can be tried again as it is."""
        return False

    def transient_ddl(self, error: BaseException) -> bool:
        """A failure of a schema change that running it again can get past."""
        return self.transient(error)

    def is_error(self, error: BaseException) -> bool:
        raise NotImplementedError

    def max_statement(self, conn: Any) -> int | None:
        """The largest statement, in bytes, the server takes on `conn`; None: no limit that matters."""
        return None

    def server(self, sink: Sink) -> str:
        """What the target is, for people: the database and its version ("MariaDB 10.11.6")."""
        raise NotImplementedError

    # Whether schema changes commit on their own (MySQL's DDL does): if not, a
    # migration runs as one transaction, which `schema_lock` opens.
    ddl_commits = True

    @contextlib.contextmanager
    def schema_lock(self, sink: Sink) -> Iterator[None]:
        """Held while a migration reads the schema's version and brings it up to
        date: two syncs started together on a new target both found a column
        missing, and the second ALTER failed ('Duplicate column name')."""
        yield

    def ddl(self, statement: str) -> str | None:
        """A statement of schema.sql as this database runs it, or None to skip it: one
        wrapped in /*sqlite ... */ is SQLite's alone (MySQL would take it for an
        empty query). Text in /*! ... */ is MySQL's, a comment to SQLite."""
        only_sqlite = _ONLY_SQLITE.fullmatch(statement.strip())
        if only_sqlite is None:
            return statement
        return only_sqlite.group(1) if self.name == "sqlite" else None

    def upsert_sql(self, table: str, columns: Sequence[str], key: Sequence[str], newer: str | None = None) -> str:
        """INSERT of `columns`, updating the non-key columns of an existing row.

        With `newer` (a column), an existing row is only overwritten by a row
        whose `newer` is at least its own: a late writer holding an older
        version of a job never takes a newer copy back.
        """
        identifiers(table, *columns, *key, *([newer] if newer else []))
        values = ", ".join([self.placeholder] * len(columns))
        update = [c for c in columns if c not in key]
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values}) "
            + self.conflict_clause(table, key, update, newer)
        )


def _fast_converter() -> type:
    """mysql-connector's converter with fast paths for str, int and None (what a
    row holds); anything else goes the driver's own way. The escaping rules are
    the driver's: under NO_BACKSLASH_ESCAPES it only doubles quotes."""
    from mysql.connector.conversion import MySQLConverter

    class FastConverter(MySQLConverter):
        def to_mysql(self, value: Any) -> Any:
            kind = type(value)
            if kind is str:
                return value.encode("utf-8")
            if kind is int or value is None:
                return value
            return super().to_mysql(value)

        @staticmethod
        def escape(value: Any, sql_mode: Any = None) -> Any:
            if type(value) is bytes and sql_mode == MYSQL_SQL_MODE:
                return value.replace(b"'", b"''")
            return MySQLConverter.escape(value, sql_mode)

        @staticmethod
        def quote(buf: Any) -> Any:
            kind = type(buf)
            if kind is bytes:
                return b"'" + buf + b"'"
            if kind is int:
                return str(buf).encode("ascii")
            if buf is None:
                return b"NULL"
            return MySQLConverter.quote(buf)

    return FastConverter


class MySQLDialect(Dialect):
    name = "mysql"
    placeholder = "%s"
    # Values refused: data too long, out of range, bad string, constraint check
    # (MariaDB 4025, MySQL 3819), invalid JSON, NULL in a NOT NULL column.
    _REFUSED = frozenset({1048, 1264, 1292, 1366, 1406, 3140, 3819, 4025})
    # Lock wait timeout, deadlock, and 1467 ("Failed to read auto-increment value
    # from storage engine"): what InnoDB says when the wait for a table's AUTO-INC
    # lock ends in a deadlock or a timeout (seen on MariaDB 10.11, every kind of
    # INSERT and LOAD DATA). With innodb_autoinc_lock_mode=1, MariaDB's default,
    # a LOAD DATA holds that lock for its whole statement: another task's load
    # waiting for a row this task's upsert locked, while this task waits for the
    # lock, is a deadlock, and this task, the victim, got 1467, its transaction
    # rolled back as for 1213 (tests/sync/test_write.py). Any other cause of 1467
    # (a counter that cannot be read at all) fails again, after the few retries.
    _TRANSIENT = frozenset({1205, 1213, 1467})
    # A schema change that failed on a file of the server's own, as a race over its
    # name would: error on delete (6), on rename (7), file not found (29). Not the
    # other errors below 1000 (disk full, out of memory, permissions): a second try
    # fails the same, after a table copy done again for nothing.
    _TRANSIENT_DDL = frozenset({6, 7, 29})

    # LOAD DATA LOCAL refused by the server or the client: local_infile off
    # (MySQL 8's default), or not allowed for this user.
    _NO_LOCAL_INFILE = frozenset({1148, 2068, 3948, 4166})

    # How long a migration waits for another process's to finish.
    SCHEMA_LOCK_S = 120

    @contextlib.contextmanager
    def schema_lock(self, sink: Sink) -> Iterator[None]:
        # A named lock of the server's, scoped to the database and held by this
        # connection: DDL commits at once, so no transaction can hold it.
        name = f"aeroqueue.schema.{sink.target.database}"[:64]
        got = sink.execute("SELECT GET_LOCK(%s, %s)", (name, self.SCHEMA_LOCK_S))
        if not got or got[0][0] != 1:
            raise SyncError(
                f"another process has been migrating the schema of {sink.target} for {self.SCHEMA_LOCK_S} s; "
                "run the sync again once it is done"
            )
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # a dropped connection released it already
                sink.execute("SELECT RELEASE_LOCK(%s)", (name,))

    def connect(self, target: Target, infile_dir: str | None = None) -> Any:
        import mysql.connector

        conn = mysql.connector.connect(
            host=target.host,
            port=target.port,
            user=target.user,
            password=target.password or "",
            database=target.database,
            charset="utf8mb4",
            collation="utf8mb4_bin",
            autocommit=False,
            connection_timeout=10,
            converter_class=_fast_converter(),
            # LOAD DATA LOCAL reads files from this directory only (the user's
            # private one): a server asking for any other file is refused.
            **({"allow_local_infile_in_path": infile_dir} if infile_dir else {}),
        )
        # Through the driver's property, so that its escaping knows the mode.
        conn.sql_mode = MYSQL_SQL_MODE  # type: ignore[union-attr]
        no_delay(conn)
        return conn

    def conflict_clause(self, table: str, key: Sequence[str], update: Sequence[str], newer: str | None) -> str:
        if newer is None:
            return "ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in update)
        # MySQL assigns left to right, each assignment seeing the ones before
        # it: the guard column must be assigned last.
        ordered = [c for c in update if c != newer] + [newer]
        guard = f"COALESCE(VALUES({newer}) >= {newer}, TRUE)"
        return "ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = IF({guard}, VALUES({c}), {c})" for c in ordered)

    def refused(self, error: BaseException) -> bool:
        import mysql.connector.errors as me

        if isinstance(error, (me.DataError, me.IntegrityError)):
            return True
        return isinstance(error, me.DatabaseError) and getattr(error, "errno", None) in self._REFUSED

    def transient(self, error: BaseException) -> bool:
        return getattr(error, "errno", None) in self._TRANSIENT

    def transient_ddl(self, error: BaseException) -> bool:
        # CI saw MariaDB 10.11 fail a new target's migration once with 6, "Error on
        # delete of ... (Errcode: 2)": a file of the server's own, already gone when
        # it came to delete it; the same statements went through on the next try.
        return self.transient(error) or getattr(error, "errno", None) in self._TRANSIENT_DDL

    def is_error(self, error: BaseException) -> bool:
        import mysql.connector.errors as me

        return isinstance(error, me.Error)

    def server(self, sink: Sink) -> str:
        # MariaDB says so in its version ("10.11.6-MariaDB-0+deb12u1"); MySQL does not ("8.0.36").
        value = sink.execute("SELECT VERSION()")[0][0]
        version = bytes(value).decode() if isinstance(value, (bytes, bytearray)) else str(value)
        number = version.split("-", 1)[0]
        return f"MariaDB {number}" if "mariadb" in version.lower() else f"MySQL {number}"

    def max_statement(self, conn: Any) -> int | None:
        cur = conn.cursor()
        try:
            cur.execute("SELECT @@max_allowed_packet")
            (value,) = cur.fetchone()
        finally:
            cur.close()
        return int(value)

    def no_local_infile(self, error: BaseException) -> bool:
        if getattr(error, "errno", None) in self._NO_LOCAL_INFILE:
            return True
        # The driver's own refusal carries no error number.
        return "LOAD DATA LOCAL INFILE" in str(error) and "rejected" in str(error)


SQLITE_BUSY_S = 120.0  # Spark tasks write to one SQLite file at once: each waits for the lock


class SQLiteDialect(Dialect):
    name = "sqlite"
    placeholder = "?"
    ddl_commits = False  # SQLite's DDL is transactional

    @contextlib.contextmanager
    def schema_lock(self, sink: Sink) -> Iterator[None]:
        # The file's write lock, taken now (waiting up to the connection's timeout)
        # and held until the migration commits or rolls back.
        sink.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            sink.rollback()
            raise

    def connect(self, target: Target, infile_dir: str | None = None) -> Any:
        # Not made: a mistyped path took the copies (and, with --delete-after, the jobs
        # were then deleted from the store, having gone only to that file).
        if not Path(target.path).parent.is_dir():
            raise SyncError(f"SQLite target {target.path}: its directory {Path(target.path).parent} does not exist")
        # Spark tasks write to the one file concurrently: wait for the lock.
        conn = sqlite3.connect(target.path, timeout=SQLITE_BUSY_S)
        # Two connections turning a new file to WAL at once can each hold the lock the
        # other waits for: one waited out the whole busy timeout ("database is
        # locked"). Asked with a short wait and again, one of them gets through.
        conn.execute("PRAGMA busy_timeout = 50")
        give_up = time.monotonic() + SQLITE_BUSY_S
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > give_up:
                    conn.close()
                    raise
                time.sleep(random.uniform(0.005, 0.05))
        conn.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_S * 1000)}")
        return conn

    def conflict_clause(self, table: str, key: Sequence[str], update: Sequence[str], newer: str | None) -> str:
        clause = f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in update)
        if newer is not None:
            clause += f" WHERE excluded.{newer} >= {table}.{newer} OR {table}.{newer} IS NULL OR excluded.{newer} IS NULL"
        return clause

    def refused(self, error: BaseException) -> bool:
        return isinstance(error, (sqlite3.IntegrityError, sqlite3.DataError))

    def is_error(self, error: BaseException) -> bool:
        return isinstance(error, sqlite3.Error)

    def server(self, sink: Sink) -> str:
        return f"SQLite {sqlite3.sqlite_version}"


DIALECTS: dict[str, Dialect] = {"mysql": MySQLDialect(), "sqlite": SQLiteDialect()}

# LOAD DATA's text format, spelt in hex so that no sql_mode (NO_BACKSLASH_ESCAPES
# among them) changes what the escape character is.
LOAD_FORMAT = "FIELDS TERMINATED BY X'09' ESCAPED BY X'5C' LINES TERMINATED BY X'0A'"


def load_line(row: Sequence[Any]) -> str:
    """A row as one line of LOAD DATA text: NULL as \\N, tab-separated, with the
    backslash, tab, newline and NUL of a value escaped (read back as they were)."""
    fields = []
    for v in row:
        if v is None:
            fields.append("\\N")
        elif type(v) is int:
            fields.append(str(v))
        elif type(v) is str:
            if "\\" in v or "\t" in v or "\n" in v or "\0" in v:
                v = v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\0", "\\0")
            fields.append(v)
        else:
            raise TypeError(f"a row value of type {type(v).__name__} has no LOAD DATA form")
    return "\t".join(fields)


_BATCH_FILE = re.compile(r"^batch-(\d+)-[0-9a-f]+\.txt$")


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def infile_dir() -> tuple[str, bool]:
    """Where LOAD DATA LOCAL batch files are written: one directory per user,
    private to them (0700), and whether it is a scratch one to remove on close.

    One directory for every sink of the user, not one per sink: an executor
    killed mid-task (as Spark does) then leaves at most its last batch file,
    which the next sink removes, instead of a directory per task. A directory
    of that name that is not the user's own, or is open to others, is not used
    (job data would be readable, or the files replaceable): a scratch one is.
    """
    path = os.path.join(tempfile.gettempdir(), f"aeroqueue-sync-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return tempfile.mkdtemp(prefix="aeroqueue-sync-"), True
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return tempfile.mkdtemp(prefix="aeroqueue-sync-"), True
    for name in os.listdir(path):
        found = _BATCH_FILE.match(name)
        if found and not pid_alive(int(found.group(1))):
            with contextlib.suppress(FileNotFoundError):  # another sink removed it first
                os.unlink(os.path.join(path, name))
    return path, False


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8 (what a batch and a statement are sized by)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _escaped_len(row: Sequence[Any]) -> int:
    """A row's bytes in an INSERT as the driver writes it under MYSQL_SQL_MODE
    (NO_BACKSLASH_ESCAPES: quotes doubled, nothing else escaped)."""
    return 64 + sum(utf8_len(v) + v.count("'") + 4 for v in row if type(v) is str) + 24 * len(row)


class Sink:
    """One connection to the target, with the upsert every table goes through."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.dialect = DIALECTS[target.dialect]
        # Where `copy` writes its batch for LOAD DATA LOCAL: the user's private directory.
        self._infile_dir: str | None = None
        self._scratch_dir = False
        if target.dialect == "mysql":
            self._infile_dir, self._scratch_dir = infile_dir()
        self._infile = f"batch-{os.getpid()}-{uuid.uuid4().hex[:12]}.txt"
        self.can_load = self._infile_dir is not None
        self.loaded = 0  # rows `copy` put in by LOAD DATA
        conn = None
        try:
            conn = self.dialect.connect(target, self._infile_dir)
            # The largest statement the server takes (None: no such limit).
            self.max_statement: int | None = self.dialect.max_statement(conn)
            self.conn = conn
        except Exception as e:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            self._remove_infile_dir()
            if not self.dialect.is_error(e) and not isinstance(e, OSError):
                raise
            raise SyncError(f"cannot connect to {target}: {target.redact(str(e))}") from None

    def _remove_infile_dir(self) -> None:
        if self._infile_dir is not None and self._scratch_dir:
            shutil.rmtree(self._infile_dir, ignore_errors=True)

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # closing a connection the server already dropped
            log.debug("closing %s failed", self.target, exc_info=True, extra={"event": "sink_close_failed"})
        finally:
            self._remove_infile_dir()

    def fail(self, error: BaseException, doing: str) -> SyncError:
        return SyncError(
            f"{self.target} failed while {doing}: {self.target.redact(str(error))}; "
            "nothing it had not committed was marked synced, the next run copies the rest"
        )

    def execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        cur = self.conn.cursor()
        try:
            cur.execute(sql, tuple(params))
            return list(cur.fetchall()) if cur.description else []
        finally:
            cur.close()

    def upsert(
        self, table: str, columns: Sequence[str], key: Sequence[str], rows: Sequence[Sequence[Any]], *, newer: str | None = None
    ) -> list[tuple[int, str]]:
        """Upsert rows in one statement; if the database refuses a value, row by
        row, returning (row index in `rows`, reason) for each row it refused. Does not commit."""
        if not rows:
            return []
        sql = self.dialect.upsert_sql(table, columns, key, newer)
        # In key order, as `_load_new` writes: two tasks that upsert rows of the same
        # lists lock their index entries in one order, not the scan's, which deadlocked
        # them (seen on MariaDB: 1213 in two of five runs of two syncs into one table).
        by_key = operator.itemgetter(*[columns.index(c) for c in key])
        try:
            order = sorted(range(len(rows)), key=lambda i: by_key(rows[i]))
        except TypeError:  # a None in the key: the database refuses that row anyway
            order = list(range(len(rows)))
        rows = [rows[i] for i in order]
        refused: list[tuple[int, str]] = []
        cur = self.conn.cursor()
        try:
            for first, group in self._statements(rows):
                if group is None:  # one row, bigger than any statement the server takes
                    refused.append((first, f"the row is larger than {self.dialect.name}'s max_allowed_packet "
                                           f"({self.max_statement:,} bytes) allows in one statement"))
                    continue
                try:
                    cur.executemany(sql, group)
                    continue
                except Exception as e:
                    if not self.dialect.refused(e):
                        raise
                # A statement that fails is undone whole (MySQL), so the group is
                # tried row by row to find the rows at fault; upserts make the
                # rows that did land (SQLite) harmless to write again.
                for i, row in enumerate(group, first):
                    try:
                        cur.execute(sql, tuple(row))
                    except Exception as e:
                        if not self.dialect.refused(e):
                            raise
                        refused.append((i, f"{self.dialect.name} refused the row: {self.target.redact(str(e))}"))
            return sorted((order[i], why) for i, why in refused)  # as the caller numbered them
        finally:
            cur.close()

    def _statements(self, rows: Sequence[Sequence[Any]]) -> Iterator[tuple[int, Sequence[Sequence[Any]] | None]]:
        """`rows` as (index of the first, rows) groups that each fit one statement:
        `executemany` makes one multi-row INSERT of them, and MySQL refuses (and
        drops the connection on) a statement over its max_allowed_packet, 16 MiB on
        MariaDB, which a batch of large payloads can pass. A row too large even
        alone comes as (index, None). Sized at twice their UTF-8 bytes: quoting
        doubles at most every byte."""
        limit = self.max_statement
        if not limit:
            yield 0, rows
            return
        start, size = 0, 0
        for i, row in enumerate(rows):
            need = 64 + sum(2 * utf8_len(v) + 4 for v in row if type(v) is str)
            if need + 1024 > limit:
                if i > start:
                    yield start, rows[start:i]
                yield i, (rows[i:i + 1] if _escaped_len(row) + 1024 <= limit else None)
                start, size = i + 1, 0
                continue
            if size + need > limit and i > start:
                yield start, rows[start:i]
                start, size = i, 0
            size += need
        if start < len(rows):
            yield start, rows[start:]

    def copy(
        self, table: str, columns: Sequence[str], key: Sequence[str], rows: Sequence[Sequence[Any]], *, newer: str | None = None
    ) -> list[tuple[int, str]]:
        """What `upsert` does, faster for rows the table does not hold yet (on MySQL,
        by LOAD DATA LOCAL). Same result, same refused rows. Does not commit."""
        if rows and self.can_load and self._load_new(table, columns, key, rows):
            return []
        return self.upsert(table, columns, key, rows, newer=newer)

    def _load_new(self, table: str, columns: Sequence[str], key: Sequence[str], rows: Sequence[Sequence[Any]]) -> bool:
        """Insert all of `rows` by LOAD DATA LOCAL ... IGNORE, or leave the
        transaction as it was and return False: when a row was skipped (its key
        is already there: the upsert decides which copy wins) or any value drew
        a warning (LOAD DATA LOCAL warns where an INSERT would fail), or when
        the server does not allow LOAD DATA LOCAL (then never again on this sink)."""
        assert self._infile_dir is not None
        identifiers(table, *columns)
        path = os.path.join(self._infile_dir, self._infile)
        # In key order: the batch's entries then land together in the unique
        # index's pages (1.6x on 1M rows into MariaDB). Python orders str by code
        # point, which is the byte order of their UTF-8 (VARBINARY's order).
        by_key = operator.itemgetter(*[columns.index(c) for c in key])
        try:
            ordered = sorted(rows, key=by_key)
        except TypeError:  # a None in the key: the upsert refuses that row anyway
            ordered = list(rows)
        try:
            data = ("\n".join(map(load_line, ordered)) + "\n").encode("utf-8")
        except (TypeError, UnicodeEncodeError):
            return False  # a value the upsert will refuse or convert: its path
        with open(path, "wb") as f:
            f.write(data)
        cur = self.conn.cursor()
        try:
            cur.execute("SAVEPOINT aq_load")
            try:
                # Identifiers are the module's constants; the file name is a parameter.
                cur.execute(
                    f"LOAD DATA LOCAL INFILE %s IGNORE INTO TABLE {table} CHARACTER SET utf8mb4 "
                    f"{LOAD_FORMAT} ({', '.join(columns)})",
                    (path,),
                )
            except Exception as e:
                if self.dialect.refused(e):  # as an INSERT would be: the upsert finds the rows
                    cur.execute("ROLLBACK TO SAVEPOINT aq_load")
                    return False
                if not self.dialect.no_local_infile(e):  # type: ignore[attr-defined]
                    raise
                log.warning("%s does not allow LOAD DATA LOCAL (local_infile): the sync writes by multi-row INSERT, "
                            "slower (the upsert costs MariaDB about 30 percent more CPU per row)", self.target,
                            extra={"event": "local_infile_off"})
                self.can_load = False
                cur.execute("ROLLBACK TO SAVEPOINT aq_load")
                return False
            if cur.rowcount == len(rows) and not cur.warning_count:
                self.loaded += len(rows)
                return True
            cur.execute("ROLLBACK TO SAVEPOINT aq_load")
            return False
        finally:
            cur.close()
            os.unlink(path)

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        try:
            self.conn.rollback()
        except Exception:
            log.debug("rollback on %s failed", self.target, exc_info=True, extra={"event": "sink_rollback_failed"})

    def kill(self) -> None:
        """Fault injection: drop this connection the way a server restart would."""
        if self.dialect.name == "mysql":
            victim = self.conn.connection_id
            with Sink(self.target) as other:
                other.execute("KILL %s", (victim,))
        else:
            self.conn.close()


