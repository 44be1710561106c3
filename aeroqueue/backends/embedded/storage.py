"""Records in one SQLite file, shared by every process and thread on the machine.

Why SQLite: several processes (CLI commands, workers, Spark tasks, a test that
SIGKILLs a worker) must see one store, and a process killed mid-write must
leave nothing half-written. SQLite's WAL journal gives both: a write
transaction either commits whole or is invisible.

Every single-record operation runs as one ``BEGIN IMMEDIATE`` transaction
(read, compute, write), which makes it atomic and serialises it with every
other write: stronger than Aerospike's per-record lock, never weaker. Nothing
above this layer may rely on that extra strength; the contract tests also run
against a real server.

One difference cannot be hidden: the write lock is held by the client process
during its transaction, where Aerospike holds its locks in the server. A
client process frozen inside a write (SIGSTOP, a debugger) therefore stalls
every writer of the store until it continues; a writer that waits longer than
the busy timeout gets Aerospike's TimeoutError (code 9). Heartbeats queue too,
so a hold that long would make live sessions look dead to a reaper whose write
waits behind it: a transaction held for ``LONG_HOLD_MS`` or more calls
``on_long_hold(ms)`` before it commits, and aeroqueue credits every live
session with that time (``backends.holds``).

Writers queue on a kernel lock (``flock`` on ``<store>.lock``), not in
SQLite's busy handler: SQLite's waiters poll with sleeps of up to 100 ms, so
under contention a write could wait far longer than the writes ahead of it
took (batch p99 of seconds with 4 processes). A blocked ``flock`` wakes as
soon as the holder lets go. SQLite's own lock still guards the file; with the
kernel lock held, ``BEGIN IMMEDIATE`` finds it free.

A store stays usable in a child forked while it is open (``multiprocessing``'s
default on Linux): a fork waits for the writes under way in its other threads,
and the child opens a connection and a lock file of its own and drops what it
inherited (``_before_fork``, ``Storage._forked``).
"""

from __future__ import annotations

import fcntl
import logging
import marshal
import os
import shlex
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...errors import NotAStore, StoreNotFound
from ..sizes import record_size

log = logging.getLogger(__name__)

FORMAT_VERSION = "1"  # bump when the table layout or the bin encoding changes
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for the store's lock before TimeoutError
# A hold this long is reported to `on_long_hold`: far above a normal write's (a batch
# of 100 takes a few ms), and below what a heartbeat can be late without harm (expiry
# minus interval: 4 s by default).
LONG_HOLD_MS = 250

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    ns       TEXT    NOT NULL,
    digest   BLOB    NOT NULL,
    set_name TEXT    NOT NULL,
    part     INTEGER NOT NULL,   -- partition id, 0..4095
    ukey     BLOB,               -- marshalled user key, only with POLICY_KEY_SEND
    bins     BLOB    NOT NULL,   -- marshalled dict of bins
    gen      INTEGER NOT NULL,
    void_ms  INTEGER NOT NULL,   -- unix ms of expiry, 0 = never
    lut_ms   INTEGER NOT NULL,   -- last-update time, unix ms
    PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_by_partition ON records (ns, set_name, part);
CREATE TABLE IF NOT EXISTS sindexes (
    ns       TEXT NOT NULL,
    name     TEXT NOT NULL,
    set_name TEXT NOT NULL,
    bin      TEXT NOT NULL,
    type     TEXT NOT NULL,      -- 'string' or 'numeric'
    PRIMARY KEY (ns, name)
);
CREATE TABLE IF NOT EXISTS sindex_entries (
    ns     TEXT NOT NULL,
    name   TEXT NOT NULL,
    value  NOT NULL,
    digest BLOB NOT NULL,
    PRIMARY KEY (ns, name, value, digest)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sindex_entries_by_digest ON sindex_entries (ns, digest);
CREATE TABLE IF NOT EXISTS udfs (
    name    TEXT PRIMARY KEY,
    content TEXT NOT NULL,
    hash    TEXT NOT NULL,
    type    INTEGER NOT NULL
);
"""


@dataclass
class Row:
    """One stored record, decoded."""

    set_name: str
    part: int
    user_key: Any
    bins: dict[str, Any]
    gen: int
    void_ms: int
    lut_ms: int


# The server's size of a record: aeroqueue/backends/sizes.py.
# Python's encoding of a record's bins is never much smaller than the server's: a
# record whose encoding is this far under the limit is within it, and only one
# near the limit is sized exactly (a walk of every value: 16 us for a job record,
# where the encoding takes 3).
_SURELY_WITHIN = 8192


def too_big(set_name: str, bins: dict[str, Any], user_key: Any, encoded: bytes, limit: int) -> bool:
    """Whether the server would refuse this record as over `limit` bytes."""
    if len(encoded) + 8 * len(bins) + len(set_name) + _SURELY_WITHIN <= limit:
        return False
    return record_size(set_name, bins, user_key) > limit


# marshal's version 2, the last without back-references: from version 3 on, an object
# met a second time (the same string or dict in many places of a payload) is written
# as a 5-byte reference, so the encoding of `[s] * n` is n times smaller than what the
# server stores, and `too_big` took a 2 MB record for one far under 1 MiB.
_MARSHAL_VERSION = 2


def encode(value: Any) -> bytes:
    # marshal: fast, keeps int/float/str/bool/bytes/list/dict apart, and
    # unlike pickle never runs code when loading a file someone else wrote.
    return marshal.dumps(value, _MARSHAL_VERSION)


def decode(blob: bytes) -> Any:
    return marshal.loads(blob)


def _check_path(path: Path, create: bool) -> None:
    if path.is_dir():
        raise NotAStore(f"embedded store {path}: is a directory, not a store file")
    if not path.parent.is_dir():
        err = StoreNotFound(f"embedded store {path}: directory {path.parent} does not exist")
        # Not StoreNotFound's "create it with `aeroqueue init`": init and --create make the
        # file, never its directory, so `init` would answer its own error with "run init".
        err.hint = f"check the path for a typo, or make the directory first: mkdir -p {shlex.quote(str(path.parent))}"
        raise err
    if not path.exists():
        if not create:
            raise StoreNotFound(f"embedded store {path} does not exist")
        return
    if path.stat().st_size == 0:
        if not create:
            # A store emptied by accident (truncated, replaced) would have been made
            # again, empty, without a word: made only when asked, as a missing one is.
            raise StoreNotFound(f"embedded store {path} is an empty file, not a store yet")
        return  # an empty file: a new store (mktemp's, or a first open cut short)
    # Look before touching: switching a file to WAL mode, or adding our tables,
    # would change someone else's database.
    try:
        probe = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            journal = probe.execute("PRAGMA journal_mode").fetchone()[0]
        finally:
            probe.close()
    except sqlite3.DatabaseError as e:
        if not os.access(path.parent, os.W_OK) or not os.access(path, os.W_OK) \
                or _primary_code(e) in (_SQLITE_READONLY, _SQLITE_CANTOPEN):
            # A WAL store read on a read-only mount (or an immutable directory) cannot
            # make its shared-memory file: "not an aeroqueue store" invited making it again.
            refused = NotAStore(f"embedded store {path} cannot be opened by this process ({e}): the file or its "
                                "directory is read-only to it")
            refused.hint = "check the file's, its directory's and the mount's permissions"
            raise refused from None
        raise NotAStore(f"embedded store {path}: not an aeroqueue store ({e})") from None
    if not tables and journal == "wal":
        return  # what a new store's first open leaves if it stops before its tables (WAL is set first)
    if "meta" not in tables or "records" not in tables:
        raise NotAStore(
            f"embedded store {path}: a SQLite database, but not an aeroqueue store "
            f"(its tables: {', '.join(sorted(tables)[:5]) or 'none'})"
        )


class _Connection(sqlite3.Connection):
    """A connection that can carry the write transaction's cache of index definitions."""

    index_defs: dict[tuple[str, str], list[tuple[str, str, str]]] | None = None


def _indexed(kind: str, value: Any) -> Any:
    """The value a secondary index of `kind` holds for a bin, or None: Aerospike
    indexes a bin only when its value has the index's type."""
    if (kind == "string" and isinstance(value, str)) or (
        kind == "numeric" and isinstance(value, int) and not isinstance(value, bool)
    ):
        return value
    return None


# SQLite's primary result codes for a write the file system refused.
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 8, 10, 13, 14


def _primary_code(e: sqlite3.Error) -> int | None:
    """SQLite's primary result code of an error (its extended code's low byte)."""
    code = getattr(e, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _lock_holders(lock_path: str) -> list[int]:
    """The processes that hold the kernel lock on `lock_path`, as /proc/locks
    (Linux) lists them; none where it cannot say."""
    try:
        st = os.stat(lock_path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    # "3: FLOCK  ADVISORY  WRITE 1234 fe:00:2212577 0 EOF"; a waiter's line has "->" after the number.
    return [
        int(parts[4]) for parts in map(str.split, lines)
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == inode and parts[4].isdigit()
    ]


_OPEN: weakref.WeakSet[Storage] = weakref.WeakSet()
_HELD_AT_FORK: list[Storage] = []


def _before_fork() -> None:
    # A fork waits for the writes under way in other threads: SQLite keeps the
    # locks of a process's connections in process-wide state, which a child copies;
    # a connection in the middle of a write at the fork would hold the store's
    # write lock there for ever (every write of the child timing out), and the Lua
    # state its UDF call left halfway would be unusable.
    _HELD_AT_FORK[:] = list(_OPEN)
    for storage in _HELD_AT_FORK:
        storage._write_lock.acquire()


def _after_fork_in_parent() -> None:
    for storage in _HELD_AT_FORK:
        storage._write_lock.release()
    _HELD_AT_FORK.clear()


def _after_fork_in_child() -> None:
    _HELD_AT_FORK.clear()
    for storage in list(_OPEN):
        storage._forked()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class _LockWaiter:
    """A helper thread that waits in flock(LOCK_EX) on a lock file's descriptor, and
    hands the lock to the writer that claims it, or lets it go if none does: the
    writer that started it may have timed out, and so may the next ones."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._cond = threading.Condition()
        self._wanted = False  # a writer waits in claim()
        self._granted = False  # the lock is that writer's
        self._done = False  # the flock returned (or failed): granted, or let go
        self._owns_fd = False  # the store closed: the descriptor is this waiter's to close
        threading.Thread(target=self._wait, name="aeroqueue-store-lock", daemon=True).start()

    def _wait(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except OSError:
            with self._cond:
                self._done = True
                self._cond.notify_all()
                self._close_if_owned()
            return
        with self._cond:
            self._done = True
            if self._wanted:
                self._granted = True
                self._cond.notify_all()
            elif self._owns_fd:
                self._close_if_owned()  # closing the last descriptor lets the lock go
            else:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _close_if_owned(self) -> None:
        if self._owns_fd:
            with suppress(OSError):
                os.close(self._fd)

    def take_fd(self) -> bool:
        """The store closes: True if this waiter still waits in flock and will close the
        descriptor itself once that returns. Closed now, its number could be given to
        another file meanwhile, which the waiter's unlock would then act on."""
        with self._cond:
            if self._done:
                return False
            self._owns_fd = True
            return True

    def claim(self, timeout_s: float) -> bool | None:
        """True: the lock is the caller's. False: not granted within `timeout_s` (the
        flock stays queued, for a next claim). None: this waiter is over without
        the lock; flock anew."""
        with self._cond:
            self._wanted = True
            self._cond.wait_for(lambda: self._done, timeout_s)
            self._wanted = False
            if self._granted:
                return True
            return None if self._done else False


class Storage:
    """The SQLite file (or a private in-memory database) behind an EmbeddedClient."""

    def __init__(self, path: str, *, create: bool = True, now_ms: Callable[[], int] | None = None) -> None:
        """Open the store at `path`; a missing file is created only with `create`.
        A missing directory is always an error: it is a typo far more often than
        a wish, and creating it would hide the typo behind an empty store.
        `now_ms`: the store's clock, in which long holds are measured."""
        self.path = path
        self.now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        # Told, inside the transaction, how long a write held the store's lock past
        # LONG_HOLD_MS: every other writer waited that long (module docstring).
        self.on_long_hold: Callable[[int], object] | None = None
        self.memory = path == ":memory:"
        self._local = threading.local()
        # One writer per process at a time: threads queue on this lock instead of
        # spinning in SQLite's busy handler; processes queue on the lock file (_lock_file).
        self._write_lock = threading.RLock()
        self._shared: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._lock_pid: int | None = None
        # The helper thread waiting in flock on _lock_fd, if any (_lock_file); read
        # and set only under the thread lock.
        self._lock_waiter: _LockWaiter | None = None
        _OPEN.add(self)
        if self.memory:
            self._shared = self._connect()
        else:
            _check_path(Path(path), create)
        try:
            self._init_schema()
        except sqlite3.DatabaseError as e:
            # /etc/passwd, a directory, an unreadable file: one clear error, not a traceback.
            raise NotAStore(f"embedded store {path}: cannot open it as a store ({e})") from None

    # -- connections -------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path,
            factory=_Connection,
            timeout=BUSY_TIMEOUT_S,
            isolation_level=None,  # we issue BEGIN IMMEDIATE / COMMIT ourselves
            check_same_thread=not self.memory,
            cached_statements=256,
        )
        if not self.memory:
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode survives any process crash (only a power loss
            # can drop the last commits): the failure model this store serves.
            db.execute("PRAGMA synchronous=NORMAL")
            # Record keys are digests, so a batch of writes lands on pages all over
            # the file: a 32 MiB page cache (default 2 MiB) keeps them from being
            # read back from disk at every batch, and checkpointing every 80 MiB of
            # WAL (default 4 MiB) keeps a load from paying an fsync per batch.
            db.execute("PRAGMA cache_size=-32768")
            db.execute("PRAGMA wal_autocheckpoint=20000")
        return db

    def conn(self) -> sqlite3.Connection:
        if self._shared is not None:
            return self._shared
        local = self._local
        # A connection must not cross fork(): a child gets its own.
        if getattr(local, "pid", None) != os.getpid():
            local.db = self._connect()
            local.pid = os.getpid()
        db: sqlite3.Connection = local.db
        return db

    def _init_schema(self) -> None:
        with self.write() as db:
            for stmt in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                db.execute(stmt)
            row = db.execute("SELECT v FROM meta WHERE k = 'format'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta (k, v) VALUES ('format', ?)", (FORMAT_VERSION,))
            elif row[0] != FORMAT_VERSION:
                raise NotAStore(
                    f"embedded store {self.path} has format {row[0]}, this aeroqueue reads format "
                    f"{FORMAT_VERSION}; move the file aside or use a matching aeroqueue version"
                )

    @contextmanager
    def write(self, *, savepoint: bool = True) -> Iterator[sqlite3.Connection]:
        """One atomic write transaction; rolled back if the block raises.

        Nested use (a batch running its records in one transaction) turns the
        inner blocks into savepoints: each record still succeeds or fails alone.
        A block that writes only in its last statement leaves nothing to roll
        back when it fails, and may do without (`savepoint=False`): two
        statements less per record of a batch.

        A writer gives up after BUSY_TIMEOUT_S in all, its wait behind other threads of
        this process included: each thread queued on the thread lock first and then
        waited its own full time for the store's lock, so the k-th timed out after k
        times that (a heartbeat behind 8 request threads: 9 minutes, not 1).
        """
        give_up = time.monotonic() + BUSY_TIMEOUT_S
        with self._thread_lock(give_up):
            db = self.conn()
            depth = getattr(self._local, "depth", 0)
            self._local.depth = depth + 1
            try:
                if depth and not savepoint:
                    yield db
                    return
                if depth:
                    db.execute("SAVEPOINT rec")
                    try:
                        yield db
                    except BaseException:
                        db.execute("ROLLBACK TO rec")
                        db.execute("RELEASE rec")
                        raise
                    db.execute("RELEASE rec")
                    return
                locked = self._lock_file(give_up)
                try:
                    db.execute("BEGIN IMMEDIATE")
                except sqlite3.OperationalError as e:
                    self._unlock_file(locked)
                    # The store stayed locked past the busy timeout: to the caller
                    # this is a server that did not answer in time.
                    from .operations import server_error

                    raise server_error("TimeoutError", 9, f"AEROSPIKE_ERR_TIMEOUT (embedded store locked: {e})") from None
                db.index_defs = {}  # type: ignore[attr-defined]  # no other writer can change them now
                since = self.now_ms()
                try:
                    yield db
                    self._report_hold(since)
                except BaseException as e:
                    with suppress(sqlite3.Error):  # SQLite may have rolled back itself (a full disk)
                        db.execute("ROLLBACK")
                    if isinstance(e, sqlite3.Error) and (refused := self._refused(e)) is not None:
                        raise refused from None
                    if isinstance(e, Exception):
                        self._credit_refused(db, since)
                    raise
                else:
                    try:
                        db.execute("COMMIT")
                    except sqlite3.Error as e:
                        with suppress(sqlite3.Error):
                            db.execute("ROLLBACK")
                        if (refused := self._refused(e)) is not None:
                            raise refused from None
                        raise
                finally:
                    db.index_defs = None  # type: ignore[attr-defined]  # only valid under the lock
                    self._unlock_file(locked)
            finally:
                self._local.depth = depth

    def _credit_refused(self, db: sqlite3.Connection, since: int) -> None:
        """A write refused after a long hold (a create-only put on a record that
        exists, a generation or a filter that does not match: the product's gates and
        compare-and-sets; a process stopped inside it) held every other writer back as
        long as one that commits: its hold is credited in a transaction of its own,
        the lock still held. Rolled back with the write, it was not: a reaper queued
        behind it reaped live sessions whose heartbeats had queued too."""
        if self.on_long_hold is None or self.now_ms() - since < LONG_HOLD_MS:
            return
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error:
            return
        try:
            self._report_hold(since)
            db.execute("COMMIT")
        except sqlite3.Error as e:  # the refusal is what the caller must hear, not this
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            log.warning("long hold not credited", extra={"event": "hold_not_credited", "error": str(e)})
        except BaseException:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def _report_hold(self, since: int) -> None:
        held = self.now_ms() - since
        hook = self.on_long_hold
        if hook is None or held < LONG_HOLD_MS:
            return
        try:
            hook(held)  # its writes are savepoints of this transaction
        except Exception as e:  # the write that held the lock must still commit
            log.warning(
                "long hold not credited", extra={"event": "hold_not_credited", "held_ms": held, "error": str(e)}
            )

    def _forked(self) -> None:
        """In a forked child, which has only the thread that forked."""
        # The parent's thread lock, held for the fork (_before_fork), by a thread the
        # child does not have.
        self._write_lock = threading.RLock()
        self._lock_waiter = None  # its thread, and the flock it waits in, stayed in the parent
        if self._lock_fd is not None:
            # The inherited descriptor shares the parent's lock: left open here, it
            # would keep the store locked after the parent died inside a write (a
            # SIGKILL), for as long as this child lives. Closing this copy leaves a
            # lock the parent holds alone.
            with suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None

    def _lock_fd_here(self) -> int:
        # An open file description must not cross fork(): a child opens its own.
        if self._lock_fd is None or self._lock_pid != os.getpid():
            self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
            self._lock_pid = os.getpid()
        return self._lock_fd

    @contextmanager
    def _thread_lock(self, give_up: float) -> Iterator[None]:
        """This process's write lock (re-entrant: a batch's records are nested writes),
        waited for until `give_up` (monotonic), then TimeoutError (9)."""
        if not self._write_lock.acquire(timeout=max(0.0, give_up - time.monotonic())):
            from .operations import server_error

            raise server_error("TimeoutError", 9, f"AEROSPIKE_ERR_TIMEOUT ({self._locked_for_too_long()})")
        try:
            yield
        finally:
            self._write_lock.release()

    def _lock_file(self, give_up: float) -> bool:
        """Take the store's kernel write lock (the caller holds the thread lock), by
        `give_up` (monotonic). False for an in-memory store, which has no file and one
        process."""
        if self.memory:
            return False
        fd = self._lock_fd_here()
        while True:
            waiter = self._lock_waiter
            if waiter is None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    pass
                # Wait in the kernel's queue, in a helper thread, so the wait can time
                # out (a process stopped inside a write must not hang every writer forever).
                waiter = self._lock_waiter = _LockWaiter(fd)
            # else the flock of a write that timed out is still queued: flock locks
            # belong to the open file description, which every thread here shares, so
            # a flock of ours would be granted as soon as that one is, and that one
            # lets the lock go with nobody to take it, in the middle of our write.
            # Its grant is ours instead.
            got = waiter.claim(max(0.0, give_up - time.monotonic()))
            if got is None:  # it got the lock and let it go before we asked: ask again
                self._lock_waiter = None
                continue
            if got:
                self._lock_waiter = None
                return True
            from .operations import server_error

            raise server_error("TimeoutError", 9, f"AEROSPIKE_ERR_TIMEOUT ({self._locked_for_too_long()})")

    def _full(self, e: sqlite3.Error) -> Exception:
        """A write the file system refused (no space, a file size limit, an I/O
        error): nothing of it was written. Raised as a server out of space answers
        (ServerFull, code 8: stop-writes), naming the store and what to do."""
        from .operations import server_error

        return server_error(
            "ServerFull", 8,
            f"AEROSPIKE_ERR_SERVER_FULL (embedded store {self.path}: the file system refused the write ({e}); "
            "nothing of it was written)",
        )

    def _refused(self, e: sqlite3.Error) -> Exception | None:
        """A write the file system refused, as a server refusing it answers (`_full`,
        `_read_only`); None for any other error."""
        code = _primary_code(e)
        if code in (_SQLITE_IOERR, _SQLITE_FULL):
            return self._full(e)
        if code == _SQLITE_READONLY:
            return self._read_only(e)
        return None

    def _read_only(self, e: sqlite3.Error) -> Exception:
        """A write to a store file (or directory) this process may not write: a read-only
        mount, its permissions, an immutable file. It reached the user as "internal
        error, OperationalError: attempt to write a readonly database". Raised as a
        server refusing the write (code 22, forbidden), naming the store."""
        from .operations import server_error

        return server_error(
            "ForbiddenError", 22,
            f"AEROSPIKE_ERR_FAIL_FORBIDDEN (embedded store {self.path} is read-only to this process: the file "
            f"system refused the write ({e}); nothing of it was written: check the file's, its directory's and "
            "the mount's permissions)",
        )

    def _locked_for_too_long(self) -> str:
        """Why a write timed out, and what to do: the error reaches a user whose
        commands and workers all stall, and names neither the store nor the process."""
        holders = _lock_holders(self.path + ".lock")
        by = f" by process {', '.join(map(str, holders))}" if holders else ""
        return (
            f"embedded store {self.path} locked for {BUSY_TIMEOUT_S:.0f} s{by}: a process stopped or stuck "
            "inside a write holds it (Ctrl-Z, SIGSTOP, a debugger); continue it (fg, kill -CONT) or end it"
        )

    def _unlock_file(self, locked: bool) -> None:
        if locked and self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A connection for reads (each statement sees one committed state)."""
        if self._shared is not None:
            with self._write_lock:
                yield self._shared
        else:
            yield self.conn()

    def close(self) -> None:
        if self._lock_fd is not None and self._lock_pid == os.getpid():
            waiter, self._lock_waiter = self._lock_waiter, None
            if waiter is None or not waiter.take_fd():
                os.close(self._lock_fd)
            self._lock_fd = None
        db = getattr(self._local, "db", None)
        if db is not None and getattr(self._local, "pid", None) == os.getpid():
            db.close()
            self._local.db = None
            self._local.pid = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    # -- records -----------------------------------------------------------

    @staticmethod
    def load(db: sqlite3.Connection, ns: str, digest: bytes) -> Row | None:
        r = db.execute(
            "SELECT set_name, part, ukey, bins, gen, void_ms, lut_ms FROM records WHERE ns = ? AND digest = ?",
            (ns, digest),
        ).fetchone()
        if r is None:
            return None
        return Row(r[0], r[1], decode(r[2]) if r[2] is not None else None, decode(r[3]), r[4], r[5], r[6])

    @staticmethod
    def _index_defs(db: sqlite3.Connection, ns: str, set_name: str) -> list[tuple[str, str, str]]:
        """The set's secondary indexes, read once per write transaction (which no
        other writer can change while it holds the lock)."""
        cache = getattr(db, "index_defs", None)  # None: a connection made elsewhere, or outside a transaction
        defs = cache.get((ns, set_name)) if cache is not None else None
        if defs is None:
            defs = db.execute("SELECT name, bin, type FROM sindexes WHERE ns = ? AND set_name = ?", (ns, set_name)).fetchall()
            if cache is not None:
                cache[(ns, set_name)] = defs
        return defs

    @staticmethod
    def _reindex(
        db: sqlite3.Connection, ns: str, digest: bytes, set_name: str, bins: dict[str, Any] | None,
        old: dict[str, Any] | None = None,
    ) -> None:
        """Keep the secondary indexes of the record's set in step with its bins (same
        transaction). `old`: the live record's bins before, whose entries are left
        alone when they would not change; None when not known (no live record: an
        expired row keeps its entries until written over), and all are rewritten."""
        defs = Storage._index_defs(db, ns, set_name)
        if not defs:
            return
        new = [(name, _indexed(kind, (bins or {}).get(bin_name))) for name, bin_name, kind in defs]
        if old is not None:
            before = [_indexed(kind, old.get(bin_name)) for _, bin_name, kind in defs]
            if before == [value for _, value in new]:
                return
            if any(value is not None for value in before):
                db.execute("DELETE FROM sindex_entries WHERE ns = ? AND digest = ?", (ns, digest))
        else:
            db.execute("DELETE FROM sindex_entries WHERE ns = ? AND digest = ?", (ns, digest))
        for name, value in new:
            if value is not None:
                db.execute("INSERT INTO sindex_entries (ns, name, value, digest) VALUES (?, ?, ?, ?)", (ns, name, value, digest))

    @staticmethod
    def index_new(db: sqlite3.Connection, ns: str, set_name: str, records: list[tuple[bytes, dict[str, Any]]]) -> None:
        """Secondary-index entries of records just created (none to delete first)."""
        defs = Storage._index_defs(db, ns, set_name)
        for name, bin_name, kind in defs:
            entries = []
            for digest, bins in records:
                value = _indexed(kind, bins.get(bin_name))
                if value is not None:
                    entries.append((ns, name, value, digest))
            db.executemany("INSERT INTO sindex_entries (ns, name, value, digest) VALUES (?, ?, ?, ?)", entries)

    @staticmethod
    def store(
        db: sqlite3.Connection, ns: str, digest: bytes, row: Row, bins_blob: bytes, old: Row | None = None
    ) -> None:
        """Write a record. `old`: the live record it replaces, if known (its index
        entries are left alone when they do not change). Without it, an expired
        record's rows may linger, so the entries are rewritten."""
        db.execute(
            "INSERT OR REPLACE INTO records (ns, digest, set_name, part, ukey, bins, gen, void_ms, lut_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                ns,
                digest,
                row.set_name,
                row.part,
                encode(row.user_key) if row.user_key is not None else None,
                bins_blob,
                row.gen,
                row.void_ms,
                row.lut_ms,
            ),
        )
        Storage._reindex(db, ns, digest, row.set_name, row.bins, old.bins if old is not None else None)

    @staticmethod
    def delete(db: sqlite3.Connection, ns: str, digest: bytes) -> None:
        db.execute("DELETE FROM records WHERE ns = ? AND digest = ?", (ns, digest))
        db.execute("DELETE FROM sindex_entries WHERE ns = ? AND digest = ?", (ns, digest))
