"""The target's tables: the versioned schema (sync/schema.sql) and job records as rows.

A job record becomes one ``aq_jobs`` row, or, when a value cannot be stored
(not JSON, not Unicode), a ``sync_rejects`` row with the reason: `Refused`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SyncError
from .target import JOBS_TABLE
from .write import Sink

log = logging.getLogger(__name__)

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "sync" / "schema.sql"
ENV_SCHEMA = "AEROQUEUE_SYNC_SCHEMA"

SUMMARY_TABLE = "aq_list_summary"
REJECTS_TABLE = "sync_rejects"
VERSION_TABLE = "schema_version"
# `created`: the list's stamp (its records' `c`): a list dropped and loaded again under
# its name is another list, whose rows are not the old one's (schema.sql, migration 4).
JOB_COLUMNS = (
    "list", "jid", "token", "state", "attempts", "payload", "result", "error", "done_at", "synced_at", "created",
)
JOB_KEY = ("list", "created", "jid")
SUMMARY_COLUMNS = (
    "list", "mode", "total", "done", "dead", "sealed", "complete", "completed_at", "updated_at", "created",
)
# A reject names its list's stamp too (migration 5): a new list of the name is another list.
REJECT_COLUMNS = ("list", "token", "jid", "state", "reason", "seen_at", "created")
REJECT_KEY = ("list", "created", "token")
# One row: the id of this copy, which the marks name with the target's place (migration 6).
TARGET_TABLE = "sync_target"
TARGET_ID_VERSION = 6
MAX_REASON = 2000

__all__ = [
    "JOBS_TABLE", "REJECT_KEY", "Migration", "Refused", "job_row", "migrate", "migrations", "reject_row", "target_id",
]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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


# Tries of a migration that failed on a transient error (Dialect.transient_ddl),
# and the pause before the second (doubling after).
MIGRATE_TRIES = 3
MIGRATE_PAUSE_S = 0.2


def migrate(sink: Sink, *, at_ms: int | None = None) -> int:
    """Bring the target's schema to the newest version; returns that version.

    A try that fails on a transient error (a deadlock, a failed file operation
    of the server's own) is run again from the version the target holds: MySQL's
    statements are safe to run twice (schema.sql's rules), so a second try
    finishes what the first began. (SQLite's migration is one transaction, rolled
    back whole, and none of its errors is taken for transient.)
    """
    steps = migrations()
    for attempt in range(MIGRATE_TRIES):
        try:
            newest = _migrate_once(sink, steps, at_ms)
            check_jobs_table(sink)
            return newest
        except SyncError:
            raise
        except Exception as e:
            if not sink.dialect.is_error(e):
                raise
            sink.rollback()
            if not sink.dialect.transient_ddl(e) or attempt + 1 == MIGRATE_TRIES:
                raise sink.fail(e, "creating or migrating the schema") from None
            log.warning("migrating the schema of %s failed (%s); trying again", sink.target,
                        sink.target.redact(str(e)), extra={"event": "schema_migrate_failed"})
            time.sleep(MIGRATE_PAUSE_S * 2 ** attempt)
    raise AssertionError("unreachable")


# MySQL's types that compare bytes, whatever the collation.
_BINARY_TYPES = {"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"}


def check_jobs_table(sink: Sink, *, before: bool = False) -> None:
    """Refuse an aq_jobs the upsert cannot rely on: one made by someone else before the
    first sync (the migrations create it only if it is not there). Without a unique
    key on exactly JOB_KEY every copy of a job adds a row; with a job id or list
    name compared without regard to case or trailing spaces, two jobs share a row
    and one of them is marked copied without being in the table; another unique key
    lets a copy take another job's row.

    `before`: run before the migrations alter a table that is there (an older
    aeroqueue's, keyed on (list, jid), passes), so that a refused table is left as
    it was found. After them, a missing table is refused too: it was dropped while
    schema_version still records the versions that made it."""
    if sink.dialect.name == "mysql":
        columns = sink.execute(
            "SELECT column_name, data_type, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = %s", (JOBS_TABLE,))
        found = sink.execute(
            "SELECT index_name, column_name FROM information_schema.statistics WHERE table_schema = DATABASE() "
            "AND table_name = %s AND non_unique = 0 ORDER BY index_name, seq_in_index", (JOBS_TABLE,))
    else:
        columns = [(name, kind, None) for (_, name, kind, *_) in sink.execute(f"PRAGMA table_info({JOBS_TABLE})")]
        # An index's name comes from SQLite's own list (the primary key's is sqlite_autoindex_...).
        found = [(index, column) for (_, index, unique, *_) in sink.execute(f"PRAGMA index_list({JOBS_TABLE})")
                 if unique for (_, _, column) in sink.execute(f'PRAGMA index_info("{index}")')]
    if not columns:
        if before:
            return  # the migrations create it
        raise SyncError(f"{JOBS_TABLE} is missing from {sink.target}, though {VERSION_TABLE} records the versions "
                        f"that made it: drop {VERSION_TABLE} as well, and the sync creates its tables anew")
    made_by_hand = (f"Was the table made by hand, or by another tool? Rename or drop it and {VERSION_TABLE} (or give "
                    "the sync a database of its own), and the sync creates its own (sync/schema.sql)")
    if sink.dialect.name == "mysql":
        loose = sorted(_name(name) for name, kind, collation in columns
                       if _name(name).lower() in ("list", "jid") and _name(kind).lower() not in _BINARY_TYPES
                       and not _name(collation).lower().endswith("_bin"))
        if loose:
            raise SyncError(
                f"{JOBS_TABLE} in {sink.target}: column(s) {', '.join(loose)} compare text without regard to case "
                f"or trailing spaces (not binary, no _bin collation): two jobs would share one row. {made_by_hand}")
    unique: dict[str, list[str]] = {}
    for index, column in found:
        unique.setdefault(_name(index), []).append(_name(column).lower())
    keys = list(unique.values())
    allowed = [list(JOB_KEY), *([["list", "jid"]] if before else [])]  # (list, jid): before migration 4
    if not any(k in keys for k in allowed):
        raise SyncError(f"{JOBS_TABLE} in {sink.target} has no unique key on ({', '.join(JOB_KEY)}): every copy of "
                        f"a job would add a row. {made_by_hand}")
    # An upsert updates the row it collides with on any unique key: one of other
    # columns (a job id alone, say) would make one job's row another's.
    others = [k for k in keys if k not in [*allowed, ["id"]]]
    if others:
        raise SyncError(f"{JOBS_TABLE} in {sink.target} has a unique key on ({', '.join(others[0])}) besides "
                        f"({', '.join(JOB_KEY)}): a copied job colliding on it would take another job's row. "
                        f"{made_by_hand}")


def _name(value: Any) -> str:
    """A name or type read from information_schema: text, whichever the driver hands
    over (MySQL 8's connector may give some of its columns as bytes)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return "" if value is None else str(value)


_OWN_DATABASE = "give the sync a database of its own (another tool's tables share the names)"


def _check_version_table(sink: Sink) -> None:
    """A `schema_version` of another tool's (an older Flyway's has no applied_at)
    made the migration compare its text versions with numbers (TypeError), or skip
    creating aq_jobs for a version number it happened to hold."""
    try:
        sink.execute(f"SELECT version, description, applied_at FROM {VERSION_TABLE} WHERE 1 = 0")
    except Exception as e:
        if not sink.dialect.is_error(e):
            raise
        raise SyncError(f"table {VERSION_TABLE} in {sink.target} is not aeroqueue's (it has no version, description "
                        f"and applied_at columns): {_OWN_DATABASE}") from None


def _own_tables(steps: list[Migration]) -> set[str]:
    """The tables the migrations create."""
    return {name.lower() for step in steps for stmt in step.statements
            for name in re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", stmt, re.I)}


def _sqlite_version(sink: Sink) -> int:
    """The version a SQLite target's tables are at, read from their shape: the
    highest version whose change, and every one before it, is there. The
    rebuilds matter (3: jid TEXT; 4: the stamps; 5: the rejects' stamps): each
    copies its table from the columns of before, so run again it takes away what
    it added. A migration that rebuilds a SQLite table must be added here."""
    def columns(table: str) -> dict[str, str]:
        return {name.lower(): str(kind).upper() for (_, name, kind, *_) in sink.execute(f"PRAGMA table_info({table})")}

    jobs, summary, rejects = columns(JOBS_TABLE), columns(SUMMARY_TABLE), columns(REJECTS_TABLE)
    shapes = (
        (1, bool(jobs and summary and rejects)),
        (2, True),  # MySQL's alone
        (3, jobs.get("jid") == "TEXT"),
        (4, "created" in jobs and "created" in summary),
        (5, "created" in rejects),
        (6, bool(columns(TARGET_TABLE))),
    )
    version = 0
    for step, there in shapes:
        if not there:
            break
        version = step
    return version


def _record_sqlite_version(sink: Sink, steps: list[Migration], at_ms: int | None) -> int:
    """A SQLite target whose schema_version is empty though its tables are there
    (dropped alone, by hand): the versions its tables show are recorded again, so
    that only the migrations after them run (SQLite's rebuilds cannot run twice
    without taking the stamps away). Returns the version recorded (0: none)."""
    found = min(_sqlite_version(sink), steps[-1].version)
    if found:
        log.warning("%s of %s was empty, though its tables are at version %d: recorded again", VERSION_TABLE,
                    sink.target, found, extra={"event": "schema_version_recorded", "version": found})
        sink.upsert(VERSION_TABLE, ("version", "description", "applied_at"), ("version",),
                    [(step.version, step.description, at_ms or now_ms()) for step in steps[1:found + 1]])
    return found


def _migrate_once(sink: Sink, steps: list[Migration], at_ms: int | None) -> int:
    newest = steps[-1].version

    def run(stmt: str) -> None:
        stmt_here = sink.dialect.ddl(stmt)
        if stmt_here is not None:
            sink.execute(stmt_here)

    # One migration of a target at a time: two that read the same version both
    # run its next step (see Dialect.schema_lock).
    with sink.dialect.schema_lock(sink):
        if sink.dialect.name == "sqlite":
            # A file of its own: a mistyped path to another program's database got the
            # sync's tables written into it (a MySQL database may be shared). One with any
            # table of the sync's is its own (schema_version dropped, as an error advises).
            tables = sorted(r[0] for r in sink.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
            if tables and not {t.lower() for t in tables} & _own_tables(steps):
                shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
                raise SyncError(f"SQLite target {sink.target} holds tables ({shown}), none of them a sync's: "
                                "another program's file? Name a new file, or one an earlier sync made")
        made_anew = not _has_table(sink, JOBS_TABLE)  # the copy is empty: it gets a new id
        for stmt in steps[0].statements:
            run(stmt)
        _check_version_table(sink)
        rows = sink.execute(f"SELECT MAX(version) FROM {VERSION_TABLE}")
        current = rows[0][0] if rows and rows[0][0] is not None else 0
        if not isinstance(current, int):
            raise SyncError(f"table {VERSION_TABLE} in {sink.target} is not aeroqueue's (its latest version is "
                            f"{current!r}, not a number): {_OWN_DATABASE}")
        if current == 0 and sink.dialect.name == "sqlite":
            current = _record_sqlite_version(sink, steps, at_ms)
        if current < newest:
            check_jobs_table(sink, before=True)  # a table found there is not altered unless it passes
        if current > newest:
            raise SyncError(
                f"the schema of {sink.target} is at version {current}, newer than this aeroqueue's "
                f"{newest}: upgrade aeroqueue before syncing into it"
            )
        server = sink.dialect.server(sink) if current < newest else ""
        for step in steps[current + 1:]:
            for stmt in step.statements:
                run(stmt)
            sink.upsert(
                VERSION_TABLE, ("version", "description", "applied_at"), ("version",),
                [(step.version, step.description, at_ms or now_ms())],
            )
            if sink.dialect.ddl_commits:  # else the whole migration is one transaction
                sink.commit()
            if any(sink.dialect.ddl(stmt) is not None for stmt in step.statements):
                log.info("schema of %s (%s) migrated to version %d (%s)", sink.target, server, step.version,
                         step.description, extra={"event": "schema_migrated", "version": step.version})
            else:
                # Another kind of target's alone (migration 3 is SQLite's): its description,
                # logged as what was done, named the wrong database.
                log.info("schema of %s (%s) at version %d: nothing to change on %s", sink.target, server,
                         step.version, server.split()[0], extra={"event": "schema_migrated", "version": step.version})
        _keep_target_id(sink, steps, run, made_anew=made_anew, started=current, at_ms=at_ms)
        sink.commit()
    return newest


def _has_table(sink: Sink, table: str) -> bool:
    ph = sink.dialect.placeholder
    if sink.dialect.name == "mysql":
        sql = f"SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = {ph}"
    else:
        sql = f"SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = {ph}"
    return bool(sink.execute(sql, (table,))[0][0])


def _keep_target_id(sink: Sink, steps: list[Migration], run: Callable[[str], None], *, made_anew: bool,
                    started: int, at_ms: int | None) -> None:
    """Give the copy an id if it has none (`Target.mark_bin` hashes it with the place).

    A new id where this migration made aq_jobs (a new database, or one dropped and
    made again: empty, whatever the marks say), and where the id went missing from a
    target that had one (what the copy holds is not known: it is copied into in
    full, an upsert). An empty id for a target upgraded from before ids: its marks
    name its place alone, as they did, and stay good."""
    for stmt in steps[TARGET_ID_VERSION].statements:  # the table made again if it was dropped alone
        run(stmt)
    ids = sink.execute(f"SELECT id FROM {TARGET_TABLE}")
    if len(ids) == 1 and not made_anew:
        return
    new = uuid.uuid4().hex if made_anew or ids or started >= TARGET_ID_VERSION else ""
    sink.execute(f"DELETE FROM {TARGET_TABLE}")
    ph = sink.dialect.placeholder
    sink.execute(f"INSERT INTO {TARGET_TABLE} (id, made_at) VALUES ({ph}, {ph})", (new, at_ms or now_ms()))
    if new:
        log.info("%s has a new id (%s): every processed job is copied into it", sink.target, new,
                 extra={"event": "target_id_made", "target_id": new})


def target_id(sink: Sink) -> str:
    """The copy's id (`migrate` gives it one; empty for a target made before ids)."""
    rows = sink.execute(f"SELECT id FROM {TARGET_TABLE}")
    if len(rows) != 1:
        raise SyncError(f"table {TARGET_TABLE} of {sink.target} holds {len(rows)} rows, not the one "
                        "the sync wrote: run the sync again (it writes a new id, and copies every job once more)")
    return _name(rows[0][0])


# -- one job record -> one row ------------------------------------------------------


class Refused(Exception):
    """A record's value cannot be stored: the reason, for sync_rejects."""


# Built once: json.dumps with options builds a new encoder at every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _c_encoder() -> Any:
    """The C encoder behind `_ENCODER`, made once: `JSONEncoder.encode` builds one at
    every call, which cost more than encoding a job's small payload (4.3 against
    1.7 us a value, measured). No check for circular values: a record's bins
    cannot hold any (a too deep value still raises RecursionError)."""
    from json import encoder as je

    make, strings = getattr(je, "c_make_encoder", None), getattr(je, "c_encode_basestring", None)
    if make is None or strings is None:
        return None
    return make(None, _ENCODER.default, strings, None, ":", ",", False, False, False)


_C_ENCODE = _c_encoder()


def _json(value: Any, what: str) -> str | None:
    if value is None:
        return None
    try:
        text = "".join(_C_ENCODE(value, 0)) if _C_ENCODE is not None else _ENCODER.encode(value)
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
        bins.get("c") or 0,  # a record without a stamp (none since lists have one): 0, as rows of before
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
    return (bins["list"], bins["token"], shown, bins.get("state") or "", reason, seen_at, bins.get("c") or 0)


def _row_bytes(row: Sequence[Any]) -> int:
    return sum(len(v) if isinstance(v, str) else 8 for v in row)

