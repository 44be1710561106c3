"""Copy processed jobs to MySQL with PySpark (design.md, flow "sync"; invariant 5).

A run:

1. The driver takes the store's sync lease (set ``aq_lock``, see `Lease`),
   connects to the target and creates or migrates its schema
   (``sync/schema.sql``, versioned in ``schema_version``).
2. Spark tasks each take a range of Aerospike's 4096 partitions and scan it,
   a few partitions at a time, with an expression filter for processed jobs
   (state ``done`` or ``dead``) that carry no ``synced`` bin. Each task
   upserts its rows in batches (``INSERT ... ON DUPLICATE KEY UPDATE`` keyed
   by list and job id, one ``executemany`` per batch), commits, and only
   then marks those records synced with the ``aq_job_v1.synced`` UDF, which
   refuses a job that moved on since it was read (kicked, and maybe
   processed again). Only counts come back to the driver.
3. The driver writes the list summaries, drops rejects that have since been
   copied, and releases the lease.

Why nothing is lost and nothing is doubled: a record is marked only after
the commit that holds its row, so a crash anywhere leaves it unmarked and
the next scan copies it again; copying again is an upsert of the same key,
so the row is there once. A record whose payload or result cannot be stored
goes to ``sync_rejects`` with the reason and stays unmarked, so retention
never deletes it and every run tries it again.

The target is MySQL (``mysql://user[:password]@host:3306/db``), or with no
MySQL URL a SQLite file beside the embedded store: both go through the same
upsert code, parameterised by a `Dialect`. Passwords come from the URL or
``AEROQUEUE_MYSQL_PASSWORD`` / ``MYSQL_PWD`` and never reach a message or a
log: every text this module emits passes through `Target.redact`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import signal
import socket
import sqlite3
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import click
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import operations as op

from . import keys
from .backends import Backend, open_backend
from .backends.base import N_PARTITIONS
from .config import ENV_URL, MEMORY, StoreURL, default_store_path, parse_url
from .errors import (
    AeroqueueError,
    BackendError,
    FilteredOut,
    GenerationConflict,
    RecordExists,
    RecordNotFound,
    SyncError,
)
from .lists import JobLists

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from .cli.context import Context

log = logging.getLogger(__name__)

ENV_PASSWORD = "AEROQUEUE_MYSQL_PASSWORD"
ENV_MYSQL_PWD = "MYSQL_PWD"  # what the mysql command-line tools read
DEFAULT_PORT = 3306
DEFAULT_PARTITIONS = 64
DEFAULT_BATCH = 1000
# A batch also ends at this many bytes of row data, well under MySQL's
# max_allowed_packet (16 MiB on MariaDB, 64 MiB on MySQL 8): one executemany
# becomes one multi-row INSERT statement.
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
# Partitions per scan call: a scan holds its records in memory, so a task
# scans its range in small steps instead of all at once.
DEFAULT_SCAN_STEP = 4
DEFAULT_LEASE_S = 60.0
# Marks per batch_apply on a server. The expected states travel as one map
# argument that every record's UDF call receives whole, so the cost per
# record grows with the chunk: small chunks, many fewer round trips.
SERVER_MARK_CHUNK = 32
DEADLOCK_RETRIES = 3

SYNC_LOCK = "sync"

SCHEMA_FILE = Path(__file__).resolve().parent.parent / "sync" / "schema.sql"
ENV_SCHEMA = "AEROQUEUE_SYNC_SCHEMA"

JOBS_TABLE = "aq_jobs"
SUMMARY_TABLE = "aq_list_summary"
REJECTS_TABLE = "sync_rejects"
VERSION_TABLE = "schema_version"
JOB_COLUMNS = ("list", "jid", "token", "state", "attempts", "payload", "result", "error", "done_at", "synced_at")
JOB_KEY = ("list", "jid")
SUMMARY_COLUMNS = ("list", "mode", "total", "done", "dead", "sealed", "complete", "completed_at", "updated_at")
REJECT_COLUMNS = ("list", "token", "jid", "state", "reason", "seen_at")
SCAN_BINS = ["list", "token", "jid", "state", "att", "payload", "result", "err", "done_at"]
MAX_REASON = 2000

PROCESSED = exp.Or(exp.Eq(exp.StrBin("state"), "done"), exp.Eq(exp.StrBin("state"), "dead"))
UNSYNCED = exp.And(PROCESSED, exp.Not(exp.BinExists("synced"))).compile()


# -- the target ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where the copy goes: a MySQL database, or a SQLite file. ``str()`` never shows the password."""

    dialect: str  # "mysql" or "sqlite"
    host: str = ""
    port: int = DEFAULT_PORT
    user: str = ""
    password: str | None = field(default=None, repr=False)
    database: str = ""
    path: str = ""  # sqlite

    def __str__(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite://{self.path}"
        who = f"{self.user}:***@" if self.password else (f"{self.user}@" if self.user else "")
        return f"mysql://{who}{self.host}:{self.port}/{self.database}"

    def redact(self, text: str) -> str:
        """`text` with this target's password masked, wherever it appears."""
        return redact(text, self.password)


def redact(text: str, *secrets: str | None) -> str:
    """Mask secrets in text meant for people: the password as given and
    percent-encoded (as it would appear in a URL), and any user:password@ in URLs."""
    text = re.sub(r"(://[^:/@\s]*:)[^@/\s]*@", r"\1***@", text)
    for secret in secrets:
        if secret:
            from urllib.parse import quote

            for form in {secret, quote(secret, safe="")}:
                text = text.replace(form, "***")
    return text


_DB_NAME = re.compile(r"^[A-Za-z0-9_$]{1,64}$")


def parse_target(text: str | None, store: StoreURL) -> Target:
    """The target a sync writes to: ``mysql://user[:password]@host[:port]/db``,
    ``sqlite:///abs/path.db``, or with no URL a SQLite file beside the embedded store."""
    if not text:
        return default_target(store)
    scheme, sep, _ = text.partition("://")
    if not sep:
        raise SyncError(f"target URL {redact(text)!r}: expected mysql://user@host:3306/db or sqlite:///path/sync.db")
    if scheme == "sqlite":
        path = text[len("sqlite://"):]
        if not path.startswith("/") or path.endswith("/"):
            raise SyncError(f"target URL {redact(text)!r}: a SQLite target needs an absolute file path (sqlite:///abs/path.db)")
        return Target(dialect="sqlite", path=path)
    if scheme != "mysql":
        raise SyncError(f"target URL {redact(text)!r}: unknown scheme {scheme!r}; expected 'mysql' or 'sqlite'")
    try:
        parts = urlsplit(text)
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise SyncError(f"target URL {redact(text)!r}: the port is not a number from 1 to 65535") from None
    if parts.query or parts.fragment:
        raise SyncError(f"target URL {redact(text)!r}: options after '?' or '#' are not supported")
    if not parts.hostname:
        raise SyncError(f"target URL {redact(text)!r}: no host; expected mysql://user@host:3306/db")
    if not parts.username:
        raise SyncError(f"target URL {redact(text)!r}: no user; expected mysql://user@host:3306/db")
    database = parts.path.lstrip("/")
    if not _DB_NAME.match(database):
        raise SyncError(
            f"target URL {redact(text)!r}: database name {database!r} must be 1 to 64 letters, digits, '_' or '$'"
        )
    password = unquote(parts.password) if parts.password is not None else None
    if password is None:
        password = os.environ.get(ENV_PASSWORD) or os.environ.get(ENV_MYSQL_PWD)
    return Target(
        dialect="mysql",
        host=parts.hostname,
        port=port,
        user=unquote(parts.username),
        password=password,
        database=database,
    )


def default_target(store: StoreURL) -> Target:
    """The SQLite file beside an embedded store: ``store.db`` -> ``store.sync.db``.

    One file per store, so that two stores in one directory never mix their
    lists in one copy.
    """
    if not store.is_embedded:
        raise SyncError(
            f"the store {store} is an Aerospike server: give the MySQL database with --mysql "
            "(or AEROQUEUE_MYSQL); the SQLite file target is for the embedded store"
        )
    if store.path in (None, MEMORY):
        raise SyncError("the in-memory embedded store has no directory to put the copy in: give --mysql")
    path = Path(store.path)
    return Target(dialect="sqlite", path=str(path.with_name(path.stem + ".sync.db")))


# -- dialects: one upsert code path, two databases ----------------------------------


class Dialect:
    """What differs between MySQL and SQLite: connecting, placeholders, the upsert
    clause, and which errors mean "this row's values were refused"."""

    name = ""
    placeholder = ""

    def connect(self, target: Target) -> Any:
        raise NotImplementedError

    def conflict_clause(self, table: str, key: Sequence[str], update: Sequence[str], newer: str | None) -> str:
        raise NotImplementedError

    def refused(self, error: BaseException) -> bool:
        """The database refused a value in the row (too long, not valid, ...): reject the row."""
        raise NotImplementedError

    def transient(self, error: BaseException) -> bool:
        """A deadlock or lock timeout: the batch can be tried again as it is."""
        return False

    def is_error(self, error: BaseException) -> bool:
        raise NotImplementedError

    def upsert_sql(self, table: str, columns: Sequence[str], key: Sequence[str], newer: str | None = None) -> str:
        """INSERT of `columns`, updating the non-key columns of an existing row.

        With `newer` (a column), an existing row is only overwritten by a row
        whose `newer` is at least its own: a late writer holding an older
        version of a job never takes a newer copy back.
        """
        values = ", ".join([self.placeholder] * len(columns))
        update = [c for c in columns if c not in key]
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({values}) "
            + self.conflict_clause(table, key, update, newer)
        )


class MySQLDialect(Dialect):
    name = "mysql"
    placeholder = "%s"
    # Values refused: data too long, out of range, bad string, constraint check
    # (MariaDB 4025, MySQL 3819), invalid JSON, NULL in a NOT NULL column.
    _REFUSED = frozenset({1048, 1264, 1292, 1366, 1406, 3140, 3819, 4025})
    _TRANSIENT = frozenset({1205, 1213})  # lock wait timeout, deadlock

    def connect(self, target: Target) -> Any:
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
        )
        cur = conn.cursor()
        # Strict, whatever the server's default: a value that does not fit is
        # an error (and a reject), never silently truncated.
        cur.execute("SET SESSION sql_mode = 'TRADITIONAL'")
        cur.close()
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

    def is_error(self, error: BaseException) -> bool:
        import mysql.connector.errors as me

        return isinstance(error, me.Error)


class SQLiteDialect(Dialect):
    name = "sqlite"
    placeholder = "?"

    def connect(self, target: Target) -> Any:
        Path(target.path).parent.mkdir(parents=True, exist_ok=True)
        # Spark tasks write to the one file concurrently: wait for the lock.
        conn = sqlite3.connect(target.path, timeout=120.0)
        conn.execute("PRAGMA journal_mode=WAL")
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


DIALECTS: dict[str, Dialect] = {"mysql": MySQLDialect(), "sqlite": SQLiteDialect()}


class Sink:
    """One connection to the target, with the upsert every table goes through."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.dialect = DIALECTS[target.dialect]
        try:
            self.conn = self.dialect.connect(target)
        except Exception as e:
            if not self.dialect.is_error(e) and not isinstance(e, OSError):
                raise
            raise SyncError(f"cannot connect to {target}: {target.redact(str(e))}") from None

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:  # closing a connection the server already dropped
            log.debug("closing %s failed", self.target, exc_info=True)

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
        row, returning (row index, reason) for each row it refused. Does not commit."""
        if not rows:
            return []
        sql = self.dialect.upsert_sql(table, columns, key, newer)
        cur = self.conn.cursor()
        try:
            try:
                cur.executemany(sql, rows)
                return []
            except Exception as e:
                if not self.dialect.refused(e):
                    raise
            # A statement that fails is undone whole (MySQL), so the batch is
            # tried row by row to find the rows at fault; upserts make the
            # rows that did land (SQLite) harmless to write again.
            refused: list[tuple[int, str]] = []
            for i, row in enumerate(rows):
                try:
                    cur.execute(sql, tuple(row))
                except Exception as e:
                    if not self.dialect.refused(e):
                        raise
                    refused.append((i, f"{self.dialect.name} refused the row: {self.target.redact(str(e))}"))
            return refused
        finally:
            cur.close()

    def commit(self) -> None:
        self.conn.commit()

    def rollback(self) -> None:
        try:
            self.conn.rollback()
        except Exception:
            log.debug("rollback on %s failed", self.target, exc_info=True)

    def kill(self) -> None:
        """Fault injection: drop this connection the way a server restart would."""
        if self.dialect.name == "mysql":
            victim = self.conn.connection_id
            with Sink(self.target) as other:
                other.execute("KILL %s", (victim,))
        else:
            self.conn.close()


# -- the schema -------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


_MIGRATION = re.compile(r"^--\s*migration\s+(\d+):\s*(.+?)\s*$")


def schema_text() -> str:
    """sync/schema.sql (or the file ``AEROQUEUE_SYNC_SCHEMA`` names)."""
    override = os.environ.get(ENV_SCHEMA)
    candidates = [Path(override)] if override else []
    try:
        from importlib import resources

        # Installed from a wheel that ships sync/ as package data.
        candidates.append(Path(str(resources.files("aeroqueue.sync_schema").joinpath("schema.sql"))))
    except (ModuleNotFoundError, TypeError):
        pass
    candidates.append(SCHEMA_FILE)
    for path in candidates:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise SyncError(f"the sync schema is missing (looked for {', '.join(map(str, candidates))}); set {ENV_SCHEMA}")


def migrations(text: str | None = None) -> list[Migration]:
    """The migrations in schema.sql, in version order."""
    text = schema_text() if text is None else text
    found: list[Migration] = []
    version, description, statements, current = None, "", [], []  # type: ignore[var-annotated]

    def close() -> None:
        if version is not None:
            found.append(Migration(version, description, tuple(statements)))

    for line in text.splitlines():
        head = _MIGRATION.match(line)
        if head:
            if current:
                raise SyncError(f"schema.sql: a statement before migration {head.group(1)} does not end with ';'")
            close()
            version, description, statements = int(head.group(1)), head.group(2), []
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        if version is None:
            raise SyncError("schema.sql: a statement comes before the first '-- migration N:' line")
        current.append(line)
        if stripped.endswith(";"):
            statements.append("\n".join(current).rstrip().rstrip(";"))
            current = []
    if current:
        raise SyncError("schema.sql: the last statement does not end with ';'")
    close()
    versions = [m.version for m in found]
    if versions != list(range(len(found))):
        raise SyncError(f"schema.sql: migrations must be numbered 0, 1, 2, ... in order, not {versions}")
    return found


def migrate(sink: Sink, *, now_ms: int | None = None) -> int:
    """Bring the target's schema to the newest version; returns that version."""
    steps = migrations()
    newest = steps[-1].version
    try:
        for stmt in steps[0].statements:
            sink.execute(stmt)
        rows = sink.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}")
        current = rows[0][0] if rows and rows[0][0] is not None else 0
        if current > newest:
            raise SyncError(
                f"the schema of {sink.target} is at version {current}, newer than this aeroqueue's "
                f"{newest}: upgrade aeroqueue before syncing into it"
            )
        for step in steps[current + 1:]:
            for stmt in step.statements:
                sink.execute(stmt)
            sink.upsert(
                VERSION_TABLE, ("version", "description", "applied_at"), ("version",),
                [(step.version, step.description, now_ms or _now_ms())],
            )
            sink.commit()
            log.info("schema of %s migrated to version %d (%s)", sink.target, step.version, step.description)
        sink.commit()
        return newest
    except SyncError:
        raise
    except Exception as e:
        if not sink.dialect.is_error(e):
            raise
        raise sink.fail(e, "creating or migrating the schema") from None


# -- one job record -> one row ------------------------------------------------------


class Refused(Exception):
    """A record's value cannot be stored: the reason, for sync_rejects."""


def _json(value: Any, what: str) -> str | None:
    if value is None:
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        # A lone surrogate passes json.dumps but is not Unicode a database can hold.
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:
        raise Refused(f"{what} cannot be stored as JSON: {e}") from None
    return text


def _text(value: Any, what: str) -> str | None:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise Refused(f"{what} is not valid Unicode: {e}") from None
    return text


def job_row(bins: dict[str, Any], synced_at: int) -> tuple[Any, ...]:
    """The aq_jobs row for a job record's bins (in JOB_COLUMNS order), or `Refused`."""
    return (
        bins["list"],
        _text(bins.get("jid"), "the job id"),
        bins["token"],
        bins["state"],
        bins.get("att") or 0,
        _json(bins.get("payload"), "the payload"),
        _json(bins.get("result"), "the result"),
        _text(bins.get("err"), "the error"),
        bins.get("done_at"),
        synced_at,
    )


def reject_row(bins: dict[str, Any], reason: str, seen_at: int) -> tuple[Any, ...]:
    jid = bins.get("jid")
    shown = "" if jid is None else ascii(jid)
    if isinstance(jid, str):
        try:
            jid.encode("utf-8")
            shown = jid
        except UnicodeEncodeError:
            pass  # shown escaped: the table holds Unicode only
    reason = reason.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 3] + "..."
    return (bins["list"], bins["token"], shown, bins.get("state") or "", reason, seen_at)


def _row_bytes(row: Sequence[Any]) -> int:
    return sum(len(v) if isinstance(v, str) else 8 for v in row)


# -- options, faults, counts -----------------------------------------------------------


@dataclass(frozen=True)
class SyncFaults:
    """Fault injection, for tests: where a run is made to fail."""

    # The first attempt of every task dies right after its Nth commit, before marking.
    die_after_commits: int = 0
    # ... by os._exit (the Python worker crashes) rather than by raising.
    die_by_exit: bool = False
    # After N batches, each attempt's database connection is killed.
    kill_after_batches: int = 0


@dataclass(frozen=True)
class SyncOptions:
    """What a run needs, shipped to every Spark task (so: plain values only)."""

    store_url: str = field(repr=False)  # may hold credentials
    target: Target
    partitions: int = DEFAULT_PARTITIONS
    batch_size: int = DEFAULT_BATCH
    batch_bytes: int = DEFAULT_BATCH_BYTES
    scan_step: int = DEFAULT_SCAN_STEP
    mark_chunk: int | None = None  # None: 1 on the embedded store, SERVER_MARK_CHUNK on a server
    delete_after_s: float | None = None  # retention: delete jobs synced longer ago than this
    faults: SyncFaults | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= N_PARTITIONS:
            raise SyncError(f"partitions must be from 1 to {N_PARTITIONS}, not {self.partitions}")
        if self.batch_size < 1 or self.batch_bytes < 1 or self.scan_step < 1:
            raise SyncError("batch size, batch bytes and scan step must be at least 1")
        if self.delete_after_s is not None and self.delete_after_s < 0:
            raise SyncError("the retention grace period cannot be negative")
        store = parse_url(self.store_url)
        if store.is_embedded and store.path == MEMORY:
            raise SyncError(
                "the in-memory embedded store is private to one process, Spark tasks cannot read it: "
                "use embedded:///path/store.db"
            )


@dataclass
class Counts:
    """What tasks did; summed on the driver. Only these numbers leave a task."""

    scanned: int = 0  # unsynced processed jobs read
    copied: int = 0  # rows committed to the target
    marked: int = 0  # records marked synced
    changed: int = 0  # copied, then found moved on (kicked): not marked, copied again next run
    rejected: int = 0  # not copyable: in sync_rejects, left unsynced
    deleted: int = 0  # retention
    batches: int = 0
    tasks: int = 0
    scan_s: float = 0.0
    write_s: float = 0.0
    mark_s: float = 0.0
    retain_s: float = 0.0

    def add(self, other: Counts | dict[str, Any]) -> None:
        values = other if isinstance(other, dict) else asdict(other)
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + values[f.name])


@dataclass
class SyncReport:
    """A run, as the CLI prints it."""

    target: str
    counts: Counts
    lists: int
    seconds: float
    started_ms: int

    @property
    def rows_per_s(self) -> float:
        return self.counts.copied / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "lists": self.lists, "seconds": round(self.seconds, 3),
                "started_ms": self.started_ms, **asdict(self.counts)}

    def __str__(self) -> str:
        c = self.counts
        text = (
            f"synced {c.copied:,} job(s) to {self.target} in {self.seconds:.1f}s "
            f"({c.marked:,} marked, {c.rejected:,} rejected, {c.changed:,} changed since read; "
            f"{self.lists:,} list summaries)"
        )
        if c.deleted:
            text += f"; deleted {c.deleted:,} synced job(s) past the grace period"
        return text


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def ranges(partitions: int) -> list[tuple[int, int]]:
    """4096 partitions cut into `partitions` contiguous (begin, count) ranges of near-equal size."""
    base, extra = divmod(N_PARTITIONS, partitions)
    out, begin = [], 0
    for i in range(partitions):
        count = base + (1 if i < extra else 0)
        out.append((begin, count))
        begin += count
    return out


# -- the task: one range of partitions ---------------------------------------------------


class _Batch:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.bins: list[dict[str, Any]] = []
        self.rows: list[tuple[Any, ...]] = []
        self.rejects: list[tuple[Any, ...]] = []
        self.bytes = 0

    def __len__(self) -> int:
        return len(self.rows) + len(self.rejects)


class RangeSync:
    """Syncs ranges of partitions from one backend into one sink (a task's work)."""

    def __init__(self, options: SyncOptions, backend: Backend, sink: Sink, synced_at: int, attempt: int = 0) -> None:
        self.options = options
        self.backend = backend
        self.sink = sink
        self.synced_at = synced_at
        self.attempt = attempt
        self.counts = Counts()
        self.faults = options.faults or SyncFaults()
        self.mark_chunk = options.mark_chunk or (1 if backend.is_embedded else SERVER_MARK_CHUNK)
        self._commits = 0

    def run(self, begin: int, count: int) -> Counts:
        batch = _Batch()
        o = self.options
        for lo in range(begin, begin + count, o.scan_step):
            t0 = time.perf_counter()
            found = list(self.backend.scan(
                keys.JOB_SET, begin=lo, count=min(o.scan_step, begin + count - lo), expression=UNSYNCED, bins=SCAN_BINS,
            ))
            self.counts.scan_s += time.perf_counter() - t0
            for name, rec in found:
                self.counts.scanned += 1
                self._add(batch, name, rec.bins)
                if len(batch) >= o.batch_size or batch.bytes >= o.batch_bytes:
                    self._flush(batch)
                    batch = _Batch()
        self._flush(batch)
        if o.delete_after_s is not None:
            self.retain(begin, count)
        return self.counts

    def _add(self, batch: _Batch, name: str, bins: dict[str, Any]) -> None:
        try:
            row = job_row(bins, self.synced_at)
        except Refused as e:
            batch.rejects.append(reject_row(bins, str(e), self.synced_at))
            return
        batch.names.append(name)
        batch.bins.append(bins)
        batch.rows.append(row)
        batch.bytes += _row_bytes(row)

    def _flush(self, batch: _Batch) -> None:
        if not len(batch):
            return
        t0 = time.perf_counter()
        refused = self._write(batch)
        self.counts.write_s += time.perf_counter() - t0
        self.counts.batches += 1
        self._commits += 1
        self.counts.rejected += len(batch.rejects) + len(refused)
        self.counts.copied += len(batch.rows) - len(refused)
        f = self.faults
        if f.die_after_commits and self.attempt == 0 and self._commits == f.die_after_commits:
            if f.die_by_exit:
                os._exit(17)
            raise SyncError("fault injection: the task died after its commit, before marking")
        t0 = time.perf_counter()
        refused_at = {i for i, _ in refused}
        self._mark([(n, b) for i, (n, b) in enumerate(zip(batch.names, batch.bins, strict=True)) if i not in refused_at])
        self.counts.mark_s += time.perf_counter() - t0
        if f.kill_after_batches and self.counts.batches == f.kill_after_batches:
            self.sink.kill()

    def _write(self, batch: _Batch) -> list[tuple[int, str]]:
        """Upsert a batch and its rejects in one transaction; retried on a deadlock."""
        sink = self.sink
        for attempt in range(DEADLOCK_RETRIES):
            try:
                refused = sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, batch.rows, newer="done_at")
                rejects = batch.rejects + [
                    reject_row(batch.bins[i], reason, self.synced_at) for i, reason in refused
                ]
                sink.upsert(REJECTS_TABLE, REJECT_COLUMNS, ("list", "token"), rejects)
                sink.commit()
                return refused
            except Exception as e:
                if not sink.dialect.is_error(e):
                    raise
                sink.rollback()
                if sink.dialect.transient(e) and attempt + 1 < DEADLOCK_RETRIES:
                    time.sleep(0.05 * (attempt + 1))
                    continue
                raise sink.fail(e, f"writing a batch of {len(batch)} row(s)") from None
        raise AssertionError("unreachable")

    def _mark(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """Mark committed records synced: only if each is still as it was read."""
        by_list: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        for name, bins in records:
            by_list[bins["list"]].append((name, bins))
        b = self.backend
        outcomes: list[Any] = []
        for group in by_list.values():
            for i in range(0, len(group), self.mark_chunk):
                chunk = group[i:i + self.mark_chunk]
                if len(chunk) == 1:
                    name, bins = chunk[0]
                    outcomes.append(b.udf(keys.JOB_SET, name, keys.JOB_MOD, "synced",
                                          bins["state"], bins.get("done_at"), self.synced_at))
                    continue
                results = b.batch_apply(
                    keys.JOB_SET, [n for n, _ in chunk], keys.JOB_MOD, "synced",
                    {bins["token"]: bins["state"] for _, bins in chunk},
                    {bins["token"]: bins.get("done_at") for _, bins in chunk},
                    self.synced_at,
                )
                for (name, bins), r in zip(chunk, results, strict=True):
                    if r.ok:
                        outcomes.append(r.value)
                    else:
                        # A busy key, or a UDF error whose text a batch loses:
                        # alone, with backoff, a real error says what it is.
                        outcomes.append(b.udf(keys.JOB_SET, name, keys.JOB_MOD, "synced",
                                              bins["state"], bins.get("done_at"), self.synced_at))
        for st in outcomes:
            if st == "ok":
                self.counts.marked += 1
            else:  # 'changed', or 'missing': the job moved on; its next version gets copied
                self.counts.changed += 1

    def retain(self, begin: int, count: int) -> None:
        """Delete jobs synced at least the grace period ago (by the server's clock).

        The scan's filter says synced and old enough; the delete is checked
        against the generation the scan read, so a job changed in between
        (kicked: no longer synced) is never deleted.
        """
        assert self.options.delete_after_s is not None
        grace_ms = int(self.options.delete_after_s * 1000)
        old = exp.And(PROCESSED, exp.BinExists("synced"), exp.GE(exp.SinceUpdateTime(), grace_ms)).compile()
        t0 = time.perf_counter()
        step = self.options.scan_step
        for lo in range(begin, begin + count, step):
            found = list(self.backend.scan(keys.JOB_SET, begin=lo, count=min(step, begin + count - lo),
                                           expression=old, bins=["state"]))
            for name, rec in found:
                try:
                    if self.backend.remove(keys.JOB_SET, name, gen=rec.gen):
                        self.counts.deleted += 1
                except GenerationConflict:
                    pass  # changed since the scan: keep it
        self.counts.retain_s += time.perf_counter() - t0


def _task_attempt() -> int:
    try:
        from pyspark import TaskContext
    except ImportError:
        return 0
    ctx = TaskContext.get()
    return int(ctx.attemptNumber()) if ctx is not None else 0


def sync_ranges(options: SyncOptions, synced_at: int, parts: Iterable[tuple[int, int]]) -> Iterator[dict[str, Any]]:
    """A Spark task: sync its ranges of partitions; yields one dict of counts.

    Opens its own backend (from the URL string: nothing but plain values
    crosses to an executor) and its own connection to the target.
    """
    parts = list(parts)
    counts = Counts(tasks=1)
    backend = open_backend(options.store_url)
    try:
        with Sink(options.target) as sink:
            worker = RangeSync(options, backend, sink, synced_at, _task_attempt())
            for begin, count in parts:
                worker.run(begin, count)
            counts.add(worker.counts)
    except BackendError as e:
        raise SyncError(f"the store failed during the sync: {options.target.redact(str(e))}") from None
    finally:
        backend.close()
    yield asdict(counts)


# -- the driver ---------------------------------------------------------------------


def spark_session(master: str | None = None, app_name: str = "aeroqueue-sync") -> tuple[SparkSession, bool]:
    """The active SparkSession, or a new one; and whether this call created it.

    With no master: the one spark-submit was given, else ``local[*]``. In
    local mode the Python workers run this interpreter, so they import the
    same aeroqueue and its dependencies.
    """
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise SyncError("PySpark is not installed: pip install 'aeroqueue[spark]' (and Java 17 for Spark)") from None

    created = SparkContext._active_spark_context is None
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or (None if under_submit else "local[*]")
    if chosen:
        builder = builder.master(chosen)
    if created and chosen and chosen.startswith("local"):
        # Read once, when the context starts: without it the workers run
        # whatever `python3` is on the PATH, likely without aeroqueue.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = builder.getOrCreate()
    if created:
        spark.sparkContext.setLogLevel("WARN")
    return spark, created


_TASK_ERROR = re.compile(r"SyncError: ([^\n]+)")
_PY_ERROR = re.compile(r"^\s*((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$", re.M)
_JVM_PREFIXES = ("org.", "java.", "scala.", "py4j.")


def _spark_failure(e: Exception, target: Target) -> SyncError:
    """A clear one-line error from a failed Spark job. Spark wraps a task's
    Python traceback in a Java stack trace: the task's own SyncError message
    if there is one, else the last Python exception line, else Spark's."""
    text = str(e)
    found = _TASK_ERROR.findall(text)
    if found:
        return SyncError(target.redact(found[-1].strip()))
    python = [f"{name}: {msg}" for name, msg in _PY_ERROR.findall(text) if not name.startswith(_JVM_PREFIXES)]
    if python:
        why = python[-1]
    elif "worker exited unexpectedly" in text or "crashed" in text:
        why = "a task's Python worker crashed"
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        why = next((line for line in lines if "Job aborted" in line), lines[0] if lines else repr(e))
    return SyncError(
        f"the Spark job failed: {target.redact(why)[:500]}; rows committed so far are marked synced, "
        "the next run copies the rest"
    )


def run_sync(options: SyncOptions, spark: SparkSession, backend: Backend) -> SyncReport:
    """One sync run on `spark`. The caller holds the lease (see `sync_once`)."""
    started = time.monotonic()
    synced_at = _now_ms()
    target = options.target
    with Sink(target) as sink:
        migrate(sink)
    sc = spark.sparkContext
    parts = ranges(options.partitions)
    task = functools.partial(sync_ranges, options, synced_at)
    try:
        per_task = sc.parallelize(parts, len(parts)).mapPartitions(task).collect()
    except Exception as e:
        if isinstance(e, AeroqueueError):
            raise
        raise _spark_failure(e, target) from None
    counts = Counts()
    for c in per_task:
        counts.add(c)
    with Sink(target) as sink:
        n_lists = write_summaries(backend, sink, synced_at)
        forget_copied_rejects(sink)
    report = SyncReport(str(target), counts, n_lists, time.monotonic() - started, synced_at)
    log.debug("%s", report)
    return report


def write_summaries(backend: Backend, sink: Sink, now_ms: int) -> int:
    """One aq_list_summary row per job list (read from the list records, not the jobs)."""
    lists = JobLists(backend)
    rows = []
    for name in lists.names():
        st = lists.status(name)
        rows.append((name, st.mode, st.total, st.done, st.dead, int(st.sealed), int(st.complete), st.completed_at, now_ms))
    try:
        sink.upsert(SUMMARY_TABLE, SUMMARY_COLUMNS, ("list",), rows)
        sink.commit()
    except Exception as e:
        if not sink.dialect.is_error(e):
            raise
        raise sink.fail(e, "writing the list summaries") from None
    return len(rows)


def forget_copied_rejects(sink: Sink) -> None:
    """Drop sync_rejects rows whose job has been copied since it was refused."""
    try:
        sink.execute(
            f"DELETE FROM {REJECTS_TABLE} WHERE EXISTS (SELECT 1 FROM {JOBS_TABLE} j "
            f"WHERE j.list = {REJECTS_TABLE}.list AND j.token = {REJECTS_TABLE}.token "
            f"AND j.synced_at >= {REJECTS_TABLE}.seen_at)"
        )
        sink.commit()
    except Exception as e:
        if not sink.dialect.is_error(e):
            raise
        raise sink.fail(e, "clearing copied rejects") from None


# -- the lease: two syncs never run at once -------------------------------------------
#
# Why a lease record in Aerospike rather than MySQL's GET_LOCK: what two syncs
# would fight over is the store's `synced` marks, so the lock lives with the
# store, and guards it whatever the target (a SQLite file has no GET_LOCK; two
# schedulers pointed at two databases must not split one store's jobs between
# them). It is built like every other cross-process step here: a create-only
# write, generation checks, and liveness by the server's clock (the record's
# last-update time), never by comparing client clocks. Losing the lease in the
# middle of a run (a stalled driver) is harmless for the data: upserts are
# idempotent, marking is checked by the UDF, and an older copy of a job never
# overwrites a newer one (the done_at guard in the upsert).


class Lease:
    """A named lease in set aq_lock: held while its owner renews it within its TTL."""

    def __init__(self, backend: Backend, name: str = SYNC_LOCK, ttl_s: float = DEFAULT_LEASE_S) -> None:
        if ttl_s <= 0:
            raise SyncError(f"the lease must last more than 0 seconds, not {ttl_s}")
        self.backend = backend
        self.name = name
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.owner = f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.gen: int | None = None
        self.holder: dict[str, Any] | None = None  # the other owner, when acquiring failed

    @property
    def held(self) -> bool:
        return self.gen is not None

    def _bins(self) -> dict[str, Any]:
        return {"owner": self.owner, "host": socket.gethostname()[:200], "pid": os.getpid(), "ttl_ms": self.ttl_ms}

    def acquire(self) -> bool:
        """Take the lease if it is free or its holder stopped renewing it; False if it is held."""
        b = self.backend
        for _ in range(5):
            with contextlib.suppress(RecordExists):
                b.put(keys.LOCK_SET, self.name, self._bins(), create_only=True)
            rec = b.get(keys.LOCK_SET, self.name)
            if rec is None:
                continue  # released in between: try to create it again
            if rec.bins.get("owner") == self.owner:
                self.gen, self.holder = rec.gen, None
                return True
            # Expired by the holder's own TTL, measured on the server's clock.
            expired = exp.GE(exp.SinceUpdateTime(), exp.IntBin("ttl_ms")).compile()
            try:
                got = b.operate(keys.LOCK_SET, self.name, [op.write(k, v) for k, v in self._bins().items()],
                                gen=rec.gen, expression=expired)
            except FilteredOut:
                self.holder = rec.bins
                return False
            except (GenerationConflict, RecordNotFound):
                continue  # someone else moved first: look again
            self.gen, self.holder = got.gen, None
            return True
        return False

    def renew(self) -> bool:
        """Extend the lease; False if it was lost (taken over after it expired)."""
        if self.gen is None:
            return False
        try:
            got = self.backend.operate(keys.LOCK_SET, self.name, [op.write("owner", self.owner)], gen=self.gen)
        except (GenerationConflict, RecordNotFound):
            # A renewal that timed out may still have landed: only the owner
            # writes its own name, so the record says whether it is still ours.
            rec = self.backend.get(keys.LOCK_SET, self.name)
            if rec is None or rec.bins.get("owner") != self.owner:
                self.gen = None
                return False
            self.gen = rec.gen
            return True
        self.gen = got.gen
        return True

    def release(self) -> None:
        if self.gen is None:
            return
        self.gen = None
        try:
            rec = self.backend.get(keys.LOCK_SET, self.name)
            if rec is not None and rec.bins.get("owner") == self.owner:
                self.backend.remove(keys.LOCK_SET, self.name, gen=rec.gen)
        except (GenerationConflict, BackendError):
            # Taken over or unreachable: it expires on its own.
            log.debug("releasing the %s lease failed", self.name, exc_info=True)

    def describe_holder(self) -> str:
        h = self.holder or {}
        return f"host {h.get('host', '?')} pid {h.get('pid', '?')}"


class LeaseKeeper:
    """Renews a held lease from a background thread, every third of its TTL."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"aeroqueue-lease-{lease.name}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        every = self.lease.ttl_ms / 3000
        while not self._stop.wait(every):
            try:
                ok = self.lease.renew()
            except BackendError as e:
                log.warning("renewing the %s lease failed: %s", self.lease.name, e)
                continue
            if not ok:
                log.warning("the %s lease was lost (another process took it over)", self.lease.name)
                self.lost.set()
                return


def sync_once(
    options: SyncOptions, spark: SparkSession, backend: Backend, *, lease_s: float = DEFAULT_LEASE_S,
    lock: str = SYNC_LOCK,
) -> SyncReport:
    """One run under the store's sync lease; refused if another sync holds it."""
    lease = Lease(backend, lock, ttl_s=lease_s)
    if not lease.acquire():
        ttl_ms = (lease.holder or {}).get("ttl_ms")
        expiry = f"{ttl_ms / 1000:g}s" if isinstance(ttl_ms, int) else "its TTL"
        raise SyncError(
            f"another sync is running on {backend.url} ({lease.describe_holder()}); "
            f"its lease runs out {expiry} after its holder stops renewing it"
        )
    try:
        with LeaseKeeper(lease):
            return run_sync(options, spark, backend)
    finally:
        lease.release()


class Scheduler:
    """Runs a sync every `every_s` seconds while it holds the store's sync lease.

    It keeps the lease between runs, so a second scheduler waits on standby
    and takes over only once the first stops (or dies and its lease expires).
    A failed run is logged and the next one tries again.
    """

    def __init__(
        self,
        backend: Backend,
        every_s: float,
        run: Callable[[], Any],
        *,
        lease_s: float = DEFAULT_LEASE_S,
        on_error: Callable[[Exception], None] | None = None,
        lock: str = SYNC_LOCK,
    ) -> None:
        if every_s <= 0:
            raise SyncError(f"the schedule interval must be more than 0 seconds, not {every_s}")
        self.backend = backend
        self.every_s = every_s
        self.run_once = run
        self.lease = Lease(backend, lock, ttl_s=lease_s)
        self.stop = threading.Event()
        self.on_error = on_error or (lambda e: log.error("sync run failed: %s", e))
        self.runs = 0

    def run(self, max_runs: int | None = None) -> int:
        """Run until `stop` is set (or `max_runs` runs); returns how many ran."""
        standby_said = False
        try:
            while not self.stop.is_set():
                if not self.lease.held and not self.lease.acquire():
                    if not standby_said:
                        log.info("another sync scheduler holds the lease (%s): standing by", self.lease.describe_holder())
                        standby_said = True
                    self.stop.wait(min(self.every_s, self.lease.ttl_ms / 3000))
                    continue
                standby_said = False
                with LeaseKeeper(self.lease) as keeper:
                    while not self.stop.is_set() and not keeper.lost.is_set():
                        started = time.monotonic()
                        try:
                            self.run_once()
                        except AeroqueueError as e:
                            self.on_error(e)
                        self.runs += 1
                        if max_runs is not None and self.runs >= max_runs:
                            return self.runs
                        self.stop.wait(max(0.0, self.every_s - (time.monotonic() - started)))
                if keeper.lost.is_set():
                    self.lease.gen = None
            return self.runs
        finally:
            self.lease.release()


# -- the command line -------------------------------------------------------------


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '2h', '7d', '500ms' -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration: use a number with ms, s, m, h or d (e.g. 5m)")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = Duration()


def store_url_text(url: str | None) -> str:
    """The store URL as given (credentials included: the executors need them),
    or the default embedded store's."""
    return url or os.environ.get(ENV_URL) or f"embedded://{default_store_path()}"


def _log_to_stderr() -> None:
    # Only when nothing else configured logging (a test runner, an embedding app).
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


@click.command("sync")
@click.option(
    "--mysql", "target_url", envvar="AEROQUEUE_MYSQL", show_envvar=True, metavar="URL", default=None,
    help=(
        "Where processed jobs are copied: mysql://user[:password]@host:3306/db (the password may instead come "
        f"from {ENV_PASSWORD} or {ENV_MYSQL_PWD}), or sqlite:///path/sync.db. "
        "Default: a SQLite file beside the embedded store (store.db -> store.sync.db)."
    ),
)
@click.option(
    "--master", envvar="AEROQUEUE_SPARK_MASTER", show_envvar=True, default=None, metavar="MASTER",
    help="Spark master, e.g. local[*] or spark://host:7077. Default: spark-submit's, else local[*].",
)
@click.option(
    "--every", type=DURATION, envvar="AEROQUEUE_SYNC_EVERY", show_envvar=True, default=None,
    help="Run on a schedule (e.g. 5m) instead of once; one scheduler at a time holds the store's sync lease, others stand by.",
)
@click.option(
    "--partitions", type=click.IntRange(1, N_PARTITIONS), default=DEFAULT_PARTITIONS,
    envvar="AEROQUEUE_SYNC_PARTITIONS", show_envvar=True,
    help="Spark tasks; each scans an equal share of Aerospike's 4096 partitions.",
)
@click.option(
    "--batch-size", type=click.IntRange(1, 100_000), default=DEFAULT_BATCH,
    envvar="AEROQUEUE_SYNC_BATCH_SIZE", show_envvar=True, help="Rows per upsert and commit.",
)
@click.option(
    "--delete-after", type=DURATION, default=None, envvar="AEROQUEUE_SYNC_DELETE_AFTER", show_envvar=True,
    help="Retention: delete jobs from Aerospike once synced this long ago (e.g. 7d). Unsynced jobs are never deleted. Default: keep.",
)
@click.option(
    "--lease", "lease_s", type=DURATION, default=f"{DEFAULT_LEASE_S:.0f}s", envvar="AEROQUEUE_SYNC_LEASE", show_envvar=True,
    help="How long the sync lease outlives a scheduler that stopped renewing it.",
)
@click.option("--json", "as_json", is_flag=True, envvar="AEROQUEUE_JSON", show_envvar=True, help="Print each run's counts as JSON.")
@click.pass_obj
def sync_command(
    obj: Context, target_url: str | None, master: str | None, every: float | None, partitions: int,
    batch_size: int, delete_after: float | None, lease_s: float, as_json: bool,
) -> None:
    """Copy processed jobs (done or dead) to MySQL with Spark, once or on a schedule.

    Each job lands once (an upsert keyed by list and job id) and is marked
    synced in Aerospike only after its row is committed, so a crash re-copies
    some rows and loses none. Records that cannot be stored go to the
    sync_rejects table with the reason.
    """
    text = store_url_text(obj.url)
    options = SyncOptions(
        store_url=text, target=parse_target(target_url, parse_url(text)), partitions=partitions,
        batch_size=batch_size, delete_after_s=delete_after,
    )
    backend = obj.backend()
    _log_to_stderr()
    if every is None:
        # Fail fast, before a JVM starts, when the target is unreachable.
        with Sink(options.target) as sink:
            migrate(sink)

    def report(r: SyncReport) -> None:
        click.echo(json.dumps(r.as_dict()) if as_json else str(r))

    spark, created = spark_session(master)
    try:
        if every is None:
            report(sync_once(options, spark, backend, lease_s=lease_s))
            return
        scheduler = Scheduler(backend, every, lambda: report(run_sync(options, spark, backend)), lease_s=lease_s)
        previous = signal.signal(signal.SIGTERM, lambda *_: scheduler.stop.set())
        try:
            scheduler.run()
        except KeyboardInterrupt:
            scheduler.stop.set()
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        if created:
            spark.stop()


def spark_submit_main(argv: list[str] | None = None) -> None:
    """The aeroqueue command line, for ``spark-submit sync/aeroqueue_sync.py ...``."""
    from .cli import main

    if "sync" not in main.commands:
        main.add_command(sync_command)
    main(args=argv, prog_name="aeroqueue_sync.py")


__all__ = [
    "Counts", "Lease", "LeaseKeeper", "Scheduler", "Sink", "SyncError", "SyncFaults", "SyncOptions", "SyncReport",
    "Target", "migrate", "parse_duration", "parse_target", "ranges", "run_sync", "spark_session",
    "sync_command", "sync_once", "sync_ranges",
]
