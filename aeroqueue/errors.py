"""One exception hierarchy, rooted in `AeroqueueError`.

Each class's docstring is its default message, so `raise ListSealed()` reads
well and a caller can still pass a precise message. Errors from the Aerospike
client never leave `aeroqueue.backends`: they are wrapped at the boundary
into `BackendError` subclasses that name the operation and the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sessions import ReapReport


class AeroqueueError(Exception):
    """An aeroqueue operation failed."""

    #: What to do next, shown by the CLI after the message.
    hint: str | None = None

    #: `Queue.complete_and_reserve` only: the jobs the same call claimed before its
    #: ack failed. They are the caller's to run or release.
    reserved: list[Any] = []  # noqa: RUF012 (replaced per instance, never mutated)

    #: `sessions.reap` only: what the reap did before the error (a `ReapReport`),
    #: for the sweep after the sessions it ended.
    reaped: ReapReport | None = None

    def __init__(self, message: str | None = None, **context: Any) -> None:
        self.message = message or (type(self).__doc__ or "").strip().splitlines()[0]
        self.context = context
        super().__init__(self.message)


# -- configuration ---------------------------------------------------------


class ConfigError(AeroqueueError):
    """The configuration is invalid."""


class InvalidURL(ConfigError):
    """The store URL is malformed."""

    hint = "fix --url or AEROQUEUE_URL"


class StoreNotFound(ConfigError):
    """The embedded store named by the URL does not exist."""

    hint = "check the path for a typo, or create the store with `aeroqueue init` (or --create)"


class NotAStore(ConfigError):
    """The file named by the URL is not an aeroqueue embedded store."""

    hint = "check the path in --url or AEROQUEUE_URL"


# -- backend boundary ------------------------------------------------------


class BackendError(AeroqueueError):
    """The Aerospike backend refused or failed an operation."""

    def __init__(
        self,
        message: str | None = None,
        *,
        operation: str = "",
        key: str = "",
        code: int | None = None,
        **context: Any,
    ) -> None:
        self.operation = operation
        self.key = key
        self.code = code
        super().__init__(message, operation=operation, key=key, code=code, **context)


class StoreUnreachable(BackendError):
    """No node of the store answered the connection: the server is down or unreachable."""


class RecordNotFound(BackendError):
    """The record does not exist."""


class GenerationConflict(BackendError):
    """The record changed since it was read (generation check failed)."""


class RecordExists(BackendError):
    """The record already exists (create-only write)."""


class RecordTooBig(BackendError):
    """The record would exceed the namespace's max-record-size."""


class StoreFull(BackendError):
    """The store is out of space and refused the write (Aerospike code 8: a node at
    stop-writes; the embedded store: its disk full); nothing of it was written."""

    hint = "make room (drop lists no longer needed; for the embedded store, free disk space), then repeat: aeroqueue's operations are safe to repeat"


class RecordBusy(BackendError):
    """Too many operations are queued on one hot key (Aerospike code 14); retry with backoff."""


class BackendTimeout(BackendError):
    """The backend did not answer in time; the operation may or may not have happened."""

    hint = "retry: aeroqueue's operations are safe to repeat"


class StaleRequest(BackendTimeout):
    """The server ran a job transition after the deadline its sender gave it, and so
    refused it: nothing was done. A replay of a call the client had given up on never
    answers (nobody waits for it); an answer that does arrive means the call waited
    long in a queue, or the server's clock is ahead of the client's."""

    hint = "if it persists, check that the clocks of clients and servers agree (NTP)"


class NodeUnreachable(BackendTimeout):
    """The node holding the record could not be reached (connection refused or reset, no answer); the operation may or may not have happened."""


class ClusterChanging(BackendError):
    """The cluster is changing (a node left or joined) and could not serve the record just now; nothing was done."""

    hint = "retry in a moment: aeroqueue's operations are safe to repeat"


class NamespaceNotFound(BackendError):
    """The cluster has no namespace by the name the store URL gives (Aerospike code 20)."""

    hint = "check the namespace, the last part of aerospike://host:3000/NAMESPACE, in --url or AEROQUEUE_URL"


class FilteredOut(BackendError):
    """The record did not match the operation's expression filter."""


class UDFError(BackendError):
    """A Lua UDF raised an error."""


class StoreClosed(BackendError):
    """The store connection is closed: nothing was sent."""


class StoreForked(StoreClosed):
    """This store connection was opened in another process, before a fork: the aerospike
    client cannot be shared across one (its sockets would carry both processes' calls,
    and answers cross). Connect in each process after it forks (gunicorn: without
    --preload, or in a post_fork hook). Nothing was sent."""


class Unsupported(BackendError):
    """The embedded backend does not implement this client call or option."""


class UDFModulesError(AeroqueueError):
    """The cluster's UDF modules are missing or differ from this client's: run `aeroqueue udf register`."""


# -- job lists ---------------------------------------------------------------


class ListError(AeroqueueError):
    """The job list operation failed."""


class ListNotFound(ListError):
    """No job list by that name exists."""

    hint = "`aeroqueue lists` shows the lists; `aeroqueue load LIST FILE` creates one"


class ListReplaced(ListError):
    """The list was dropped and loaded again under its name since it was read: nothing changed."""


class ListSealed(ListError):
    """The job list is sealed: loading is finished, nothing more can be added."""

    hint = "load into a new list"


class ListModeMismatch(ListError):
    """The job list exists with another reservation mode."""


class LoadError(ListError):
    """The input could not be loaded; nothing from it became reservable."""

    hint = "nothing was loaded: fix the input and run the same load again"

    def __init__(
        self,
        message: str | None = None,
        *,
        source: str = "",
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.source = source
        self.line = line
        self.field = field
        where = source
        if line is not None:
            where += f", line {line}"
        if field is not None:
            where += f", field {field!r}"
        text = message or (type(self).__doc__ or "").strip()
        self.reason = text  # the message without where
        super().__init__(f"{where}: {text}" if where else text)


class InputChanged(LoadError):
    """The input changed while it was loaded."""

    hint = ("the jobs written before it stay, and a list it was to seal is not sealed: run the same load again once "
            "the file is complete (it adds nothing twice)")


class LoadAbandoned(ListError):
    """This load's range outlived its lease and was finished by a recovery; run the same load again (it is idempotent)."""


class IntegerTooBig(AeroqueueError, ValueError):
    """An integer is outside the 64 bits a record holds; nothing was sent."""


class InvalidText(AeroqueueError):
    """Text the store keeps (a record's name, a bin) must be valid UTF-8."""


class ClaimLost(AeroqueueError):
    """The job's claim is no longer this session's (it expired or was reaped); the acknowledgement was refused."""

    hint = "another session holds the job now: drop this result"


class JobNotFound(AeroqueueError):
    """The job does not exist."""


class ResultNotStorable(AeroqueueError):
    """The job's result cannot be stored: it must be JSON (what the sync copies to MySQL)."""


class SessionLost(AeroqueueError):
    """The session is gone or no longer alive: stop taking work and do not acknowledge what it held."""


class SessionClosed(SessionLost):
    """The session was closed (or is closing): it takes no more work; open another."""


class SessionForked(SessionClosed):
    """The session was opened in another process, before a fork: it is that process's
    (its heartbeat thread does not cross a fork, and a close here would give back that
    process's jobs). Open a session in each process after it forks."""


class SyncError(AeroqueueError):
    """The sync to MySQL failed; rows it had committed are marked synced, the next run copies the rest."""


class SparkDriverLost(SyncError):
    """The Spark driver's JVM ended under the sync (killed, or out of memory); rows committed so far are marked synced, the next run copies the rest."""

    hint = "see why it ended: the JVM's output above, or the kernel's log if its OOM killer took it; then run the sync again"


class Terminated(AeroqueueError):
    """Stopped by SIGTERM before it finished."""


class Interrupted(AeroqueueError):
    """Stopped by Ctrl-C (SIGINT) before it finished."""
