"""The narrow contract between aeroqueue's logic and Aerospike.

`Backend` wraps a client object that offers the `aerospike.Client` calls the
project uses: the real client (``aerospike://``) or `EmbeddedClient`
(``embedded://``). Everything above this module speaks in sets and record
names, never in raw key tuples, and never sees an `aerospike.exception`: they
are turned here into `aeroqueue.errors` classes whose message names the
operation and the key.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import aerospike
from aerospike import exception as aex
from aerospike import predicates
from aerospike_helpers import expressions as xp
from aerospike_helpers.batch.records import Apply, BatchRecords, Write

from .. import errors
from ..config import StoreURL
from ..keys import INT64, check_text
from .guard import ClientGuard

log = logging.getLogger("aeroqueue.backends")

N_PARTITIONS = 4096
# Records per page of a streamed scan.
SCAN_PAGE = 1000
DEFAULT_MAX_RECORD_SIZE = 1024 * 1024  # Aerospike's default max-record-size (1 MiB)
# One policy object shared by a batch's update-only writes: the client reads it, and a
# dict per record cost more than the record's share of the call.
_UPDATE_ONLY = {"exists": aerospike.POLICY_EXISTS_UPDATE}
_UNCHANGED = {"exists": aerospike.POLICY_EXISTS_UPDATE, "gen": aerospike.POLICY_GEN_EQ}
# What a query through an index that is not there (201), or still being built (203), answers.
NO_INDEX = (201, 203)
# The client's default total timeout of one command (write, apply, batch), ms.
CLIENT_TIMEOUT_MS = 1000
# The client's default socket timeout (an attempt idle on its socket), ms: what limits
# a command whose URL sets total_timeout=0 alone ("Client timeout: socket=30000 total=0").
CLIENT_SOCKET_TIMEOUT_MS = 30_000
# What `Backend.bounded_reads` allows a scan page or an index query. A scan of a small
# set (the lists, the sessions) walks the whole namespace's index on each node (no
# set index by default): 0.19 s over 2M records on one node, so this allows some 50M
# records a node; a frozen node answers a page never (30 s: the client's default
# socket timeout, when no total timeout is set, as for scans).
BOUNDED_SCAN_MS = 5000
# For those who only look (the dashboard's views, the metrics scrape), once a read of
# theirs did not answer in time: each further record read gets AFTER_TIMEOUT_MS
# (healthy nodes answer in milliseconds, but on a loaded host a read of one took over
# 100 ms: a healthy list shown as not read), and what is left once AFTER_TIMEOUT_BUDGET_S
# is spent is not read (the lists of a frozen node would each wait out the limit).
AFTER_TIMEOUT_MS = 250
AFTER_TIMEOUT_BUDGET_S = 2.0


class UnansweredLast:
    """The order a looker (a dashboard, a scrape) reads its lists in: those whose read
    did not answer last time go last. A frozen node's lists each wait out
    AFTER_TIMEOUT_MS; read first, they spent the budget before the healthy ones were
    tried, and a loaded host's page then showed no list at all. Thread-safe: views
    and scrapes run side by side."""

    def __init__(self) -> None:
        self._late: set[str] = set()
        self._lock = threading.Lock()

    def order(self, names: Iterable[str]) -> list[str]:
        """`names` in their order, those that did not answer last time moved last. A name
        not among them (a list dropped since) is forgotten."""
        names = list(names)
        with self._lock:
            self._late &= set(names)
            late = set(self._late)
        return sorted(names, key=lambda name: name in late)  # stable: the order kept within each part

    def note(self, name: str, answered: bool) -> None:
        """Whether `name`'s read answered (a read not tried keeps its last word)."""
        with self._lock:
            if answered:
                self._late.discard(name)
            else:
                self._late.add(name)


# Allowance for the clocks of client and server disagreeing (NTP keeps them within
# milliseconds), added to a job transition's deadline (`Backend.job_deadline`).
CLOCK_MARGIN_MS = 500

_BY_CODE: dict[int, type[errors.BackendError]] = {
    # A node of a cluster died or is frozen: the command may have landed (in doubt).
    -15: errors.NodeUnreachable,  # no response
    -10: errors.NodeUnreachable,  # connection refused, reset or closed
    # The client's partition map names no live node yet, or the cluster is reforming.
    -8: errors.ClusterChanging,  # invalid node
    7: errors.ClusterChanging,  # cluster key mismatch
    11: errors.ClusterChanging,  # partition unavailable
    2: errors.RecordNotFound,
    3: errors.GenerationConflict,
    5: errors.RecordExists,
    8: errors.StoreFull,
    9: errors.BackendTimeout,
    13: errors.RecordTooBig,
    14: errors.RecordBusy,
    20: errors.NamespaceNotFound,
    27: errors.FilteredOut,
    100: errors.UDFError,
}

T = TypeVar("T")


@dataclass(frozen=True)
class Record:
    """One record read back: its generation, remaining TTL (None: never expires) and bins."""

    gen: int
    ttl: int | None
    bins: dict[str, Any]


@dataclass(frozen=True)
class BatchResult:
    """One key's answer in a batch UDF call: `ok` and the UDF's return value, or the error code."""

    name: str
    ok: bool
    value: Any
    code: int


@dataclass(frozen=True)
class _ReadBounds:
    record_ms: int  # a single or batch read (its total_timeout)
    scan_ms: int  # a scan page or an index query


class _FreshDeadline:
    """Stands, among `Backend.udf`'s arguments, for `Backend.job_deadline()` taken at each attempt."""

    def __repr__(self) -> str:
        return "FRESH_DEADLINE"


FRESH_DEADLINE = _FreshDeadline()


# Set by `Backend.bounded_reads` for the reads of its block, in this thread (context).
_READ_BOUNDS: ContextVar[_ReadBounds | None] = ContextVar("aeroqueue_read_bounds", default=None)


def _check_names(set_name: str, names: list[str]) -> None:
    """`Backend.key`'s test, for the batch paths that build their keys inline: one
    `isascii` of all the names at once (a batch's are ASCII, but for a user's typo)."""
    try:
        ascii_only = "".join(names).isascii()
    except TypeError:
        return  # not all text: the client says what is wrong with them
    if not ascii_only:
        for name in names:
            check_text(name, f"the name of a record of {set_name}")


def _record(meta: dict | None, bins: dict | None) -> Record:
    meta = meta or {}
    ttl = meta.get("ttl")
    return Record(gen=meta.get("gen", 0), ttl=None if ttl in (None, 0xFFFFFFFF) else ttl, bins=bins or {})


# The aerospike client refuses a UDF argument outside the integers a record holds
# (keys.INT64) with "integer value exceeds sys.maxsize", and corrupts its own heap
# doing so: the process aborted later ("malloc(): unaligned tcache chunk detected"; a
# dashboard form's stamp of 19 nines took the dashboard down). Refused here, before it.
_I64_MIN, _I64_MAX = INT64


def _ints_fit(args: Iterable[Any], call: str) -> None:
    """Refuse (`IntegerTooBig`) an integer outside 64 bits among a UDF's arguments, or
    the keys and values of a map or list among them ({token: result}: an ack's). Not
    deeper: a result or payload is checked whole where it is made (results.py, loading)."""
    for a in args:
        kind = a.__class__
        if kind is int:
            if not _I64_MIN <= a <= _I64_MAX:
                _too_big_int(a, call)
        elif kind is dict:
            for k, v in a.items():
                for x in (k, v):
                    if x.__class__ is int and not _I64_MIN <= x <= _I64_MAX:
                        _too_big_int(x, call)
        elif kind is list or kind is tuple:
            for x in a:
                if x.__class__ is int and not _I64_MIN <= x <= _I64_MAX:
                    _too_big_int(x, call)


def _too_big_int(value: int, call: str) -> None:
    raise errors.IntegerTooBig(f"{call}: the integer {value} is outside the 64 bits a record holds; nothing was sent")


class Backend:
    """Aerospike records for aeroqueue, in one namespace."""

    def __init__(self, client: Any, url: StoreURL) -> None:
        # Every call counted while in flight, so that `close` can wait for them.
        # The aerospike client is one process's; the embedded one is made for forks
        # (README, "The embedded store").
        self.client = ClientGuard(client, fork_safe=url.is_embedded)
        self.url = url
        self.namespace = url.namespace
        # Calls that reach the server: the benchmark reports them per job.
        self.round_trips = 0
        self._on_close: list[Callable[[], None]] = []
        self._max_record_size: int | None = None
        self._guard_ms: int | None = None  # what `job_deadline` adds to now; 0: no deadline
        self._read_ms: int | None = None  # a record read's limit in `bounded_reads`

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run `fn` before the connection closes (writes a layer above still owes)."""
        self._on_close.append(fn)

    @property
    def is_embedded(self) -> bool:
        return self.url.is_embedded

    def max_record_size(self) -> int:
        """The namespace's max-record-size in bytes, as the nodes report it (info
        ``namespace/<ns>``; the smallest, should nodes differ); 1 MiB, Aerospike's
        default, when the store does not say."""
        if self._max_record_size is None:
            sizes = []
            try:
                answers = self.client.info_all(f"namespace/{self.namespace}")
            except (aex.AerospikeError, NotImplementedError):
                answers = {}
            for answer in (answers or {}).values():
                text = answer[1] if isinstance(answer, tuple) else answer
                for item in str(text or "").strip().split(";"):
                    name, _, value = item.partition("=")
                    if name.strip() == "max-record-size" and value.strip().isdigit() and int(value) > 0:
                        sizes.append(int(value))
            self._max_record_size = min(sizes) if sizes else DEFAULT_MAX_RECORD_SIZE
        return self._max_record_size

    def job_deadline(self) -> int | None:
        """The deadline (Unix ms) of a job transition sent now: past it the UDF refuses
        to act ('stale'). By then this client has given the call up as in doubt (its
        timeout) and repeats it, maybe on another node; only a node that was frozen
        (SIGSTOP, a VM paused) and resumed runs it that late, on its stale copy, and
        Aerospike CE lets the replica write of that stale result replace the newer
        record the rest of the cluster made meanwhile (aq_job_v1.lua, `stale`). None
        (no limit) for the embedded store, which has no replicas, and when the URL
        sets no time limit (total_timeout=0 and socket_timeout=0)."""
        if self._guard_ms is None:
            timeout = 0
            if not self.is_embedded:
                options = self.url.client_options()
                # total_timeout=0 alone still leaves the client's socket timeout: the call is
                # given up after it, and a late run of it needs its deadline all the same.
                timeout = (options.get("total_timeout", CLIENT_TIMEOUT_MS)
                           or options.get("socket_timeout", CLIENT_SOCKET_TIMEOUT_MS))
            self._guard_ms = timeout + CLOCK_MARGIN_MS if timeout else 0
        return int(time.time() * 1000) + self._guard_ms if self._guard_ms else None

    def key(self, set_name: str, name: str) -> tuple[str, str, str]:
        if isinstance(name, str) and not name.isascii():  # the hot path's names are ASCII: one cheap test
            check_text(name, f"the name of a record of {set_name}")
        return (self.namespace, set_name, name)

    @contextmanager
    def bounded_reads(self, *, scan_ms: int = BOUNDED_SCAN_MS, record_ms: int | None = None) -> Iterator[None]:
        """Within the block (this thread only), reads give up after a time limit, and
        `retry_in_doubt` does not repeat a step past it: for those who only look (the
        dashboard, the metrics exporter), whose caller is waiting and who read again
        soon. A frozen or unreachable node otherwise holds a scan for the client's
        socket timeout (30 s) and a step retried in doubt for 5 s more.

        A record or batch read gets the URL's total_timeout (the client's default,
        1 s, when it sets none or 0: no limit); a scan page or an index query
        `scan_ms`, as a total_timeout only: a short socket_timeout would fail a
        healthy scan, whose socket stays silent while the server walks a big
        namespace for the few records of a small set. Writes keep their policies
        (a write's in-doubt repeats inside the block stop at the read limit too),
        and other threads' reads theirs (the sync's scans are never bounded). The
        embedded store accepts the policies and has nothing to wait for on a read.
        `record_ms` sets a record read's limit instead of the URL's."""
        if self._read_ms is None:
            # The embedded store's URL takes none of the client's options (and waits on no read).
            options = {} if self.is_embedded else self.url.client_options()
            self._read_ms = int(options.get("total_timeout") or CLIENT_TIMEOUT_MS)
        read_ms = self._read_ms if record_ms is None else record_ms
        token = _READ_BOUNDS.set(_ReadBounds(read_ms, max(scan_ms, read_ms)))
        try:
            yield
        finally:
            _READ_BOUNDS.reset(token)

    @staticmethod
    def reads_bounded() -> bool:
        """Whether this thread's reads are inside a `bounded_reads` block (whose limits
        a nested reader keeps rather than replacing them with its own)."""
        return _READ_BOUNDS.get() is not None

    def _call(self, operation: str, set_name: str, name: str, fn: Callable[[], T]) -> T:
        self.round_trips += 1
        try:
            return fn()
        except aex.AerospikeError as e:
            raise wrap(e, operation, f"{set_name}/{name}") from e

    # -- single records ------------------------------------------------------

    def get(self, set_name: str, name: str, *, bins: list[str] | None = None) -> Record | None:
        """The record, or None if it does not exist."""
        key = self.key(set_name, name)

        def read() -> Record | None:
            bounds = _READ_BOUNDS.get()
            policy = {"total_timeout": bounds.record_ms} if bounds is not None else None
            try:
                if bins is None:
                    _, meta, got = self.client.get(key, policy)
                else:
                    _, meta, got = self.client.select(key, bins, policy)
            except aex.RecordNotFound:
                return None
            return _record(meta, got)

        return self._call("get", set_name, name, read)

    def put(
        self,
        set_name: str,
        name: str,
        bins: dict[str, Any],
        *,
        gen: int | None = None,
        create_only: bool = False,
        ttl: int | None = None,
    ) -> None:
        """Write bins; `gen` makes it a compare-and-set, `create_only` refuses an existing record."""
        policy: dict[str, Any] = {"key": aerospike.POLICY_KEY_SEND}
        meta: dict[str, Any] = {}
        if gen is not None:
            policy["gen"] = aerospike.POLICY_GEN_EQ
            meta["gen"] = gen
        if create_only:
            policy["exists"] = aerospike.POLICY_EXISTS_CREATE
        if ttl is not None:
            policy["ttl"] = ttl  # in the policy: client 19 deprecates meta["ttl"], the next major drops it
        key = self.key(set_name, name)
        self._call("put", set_name, name, lambda: self.client.put(key, bins, meta=meta or None, policy=policy))

    def remove(self, set_name: str, name: str, *, gen: int | None = None) -> bool:
        """Delete a record; False if it was already gone."""
        key = self.key(set_name, name)
        policy: dict[str, Any] = {}
        if gen is not None:
            # The remove policy's own field: client 19 deprecates remove's meta parameter.
            policy["gen"] = aerospike.POLICY_GEN_EQ
            policy["generation"] = gen

        def delete() -> bool:
            try:
                self.client.remove(key, policy=policy or None)
            except aex.RecordNotFound:
                return False
            return True

        return self._call("remove", set_name, name, delete)

    def operate(
        self,
        set_name: str,
        name: str,
        ops: list[dict],
        *,
        gen: int | None = None,
        expression: Any = None,
        ttl: int | None = None,
        update_only: bool = False,
        create_only: bool = False,
    ) -> Record:
        """Several operations on one record, atomically (aerospike_helpers operations).
        `update_only`: never create it (a filter expression is not applied to a
        missing record, so a filtered write would create one); `create_only`:
        refuse an existing record (RecordExists), as `put`'s."""
        key = self.key(set_name, name)
        policy: dict[str, Any] = {"key": aerospike.POLICY_KEY_SEND}
        if update_only:
            policy["exists"] = aerospike.POLICY_EXISTS_UPDATE
        if create_only:
            policy["exists"] = aerospike.POLICY_EXISTS_CREATE
        meta: dict[str, Any] = {}
        if gen is not None:
            policy["gen"] = aerospike.POLICY_GEN_EQ
            meta["gen"] = gen
        if expression is not None:
            policy["expressions"] = expression
        if ttl is not None:
            policy["ttl"] = ttl  # as in `put`

        def run() -> Record:
            # meta only for a generation check: without one, the call is the plainer form
            if meta:
                _, m, bins = self.client.operate(key, ops, meta=meta, policy=policy)
            else:
                _, m, bins = self.client.operate(key, ops, policy=policy)
            return _record(m, bins)

        return self._call("operate", set_name, name, run)

    def apply(self, set_name: str, name: str, module: str, function: str, *args: Any) -> Any:
        """Run one UDF on one record (the record lock is held for the whole run).

        The hot path's every call: no wrapper and no per-call policy (the client's
        configured apply policy sends the key, `_base_policies`); a policy dict
        converted per call and the layers of closures cost the API path about a
        third of its client CPU over the bare client (issue 14)."""
        _ints_fit(args, f"{module}.{function}")
        self.round_trips += 1
        try:
            return self.client.apply(self.key(set_name, name), module, function, list(args))
        except aex.AerospikeError as e:
            raise wrap(e, f"{module}.{function}", f"{set_name}/{name}") from e

    def udf(self, set_name: str, name: str, module: str, function: str, *args: Any, deadline_s: float = 5.0) -> Any:
        """`apply`, retrying RecordBusy (a hot key) with jittered backoff until `deadline_s`.
        `FRESH_DEADLINE` among the arguments is `job_deadline()`, taken at each attempt:
        one taken once would run out while the retries go on, and each later be refused."""
        if any(a is FRESH_DEADLINE for a in args):
            def attempt() -> Any:
                deadline = self.job_deadline()
                return self.apply(set_name, name, module, function, *(deadline if a is FRESH_DEADLINE else a for a in args))

            return retry_busy(attempt, deadline_s=deadline_s)
        return retry_busy(lambda: self.apply(set_name, name, module, function, *args), deadline_s=deadline_s)

    # -- batches ---------------------------------------------------------------

    def batch_apply(
        self, set_name: str, names: list[str], module: str, function: str, *args: Any
    ) -> list[BatchResult]:
        """One UDF on many records in one round trip; never raises for a single record."""
        if not names:
            return []
        _ints_fit(args, f"batch {module}.{function}")
        keys = [self.key(set_name, n) for n in names]
        self.round_trips += 1
        try:
            out = self.client.batch_apply(keys, module, function, list(args), None, {"key": aerospike.POLICY_KEY_SEND})
        except aex.AerospikeError as e:
            raise wrap(e, f"batch {module}.{function}", f"{set_name}/[{len(names)} keys]") from e
        results = []
        for name, br in zip(names, out.batch_records, strict=True):
            value = br.record[2].get("SUCCESS") if br.record is not None else None
            results.append(BatchResult(name=name, ok=br.result == 0, value=value, code=br.result))
        return results

    def batch_udf(self, set_name: str, calls: list[tuple[str, list[Any]]], module: str, function: str) -> list[BatchResult]:
        """One UDF on many records, each with its own arguments, in one round trip
        (batch_write with Apply records); never raises for a single record."""
        return self.batch_udfs(set_name, [(n, function, args) for n, args in calls], module)

    def batch_udfs(self, set_name: str, calls: list[tuple[str, str, list[Any]]], module: str) -> list[BatchResult]:
        """`batch_udf` where each record names its own function: (name, function, args)."""
        if not calls:
            return []
        for _, f, args in calls:
            _ints_fit(args, f"batch {module}.{f}")
        policy = {"key": aerospike.POLICY_KEY_SEND}
        batch = BatchRecords([Apply(self.key(set_name, n), module, f, args, policy=policy) for n, f, args in calls])
        self.round_trips += 1
        try:
            out = self.client.batch_write(batch)
        except aex.AerospikeError as e:
            functions = ", ".join(sorted({f for _, f, _ in calls}))
            raise wrap(e, f"batch {module}.{functions}", f"{set_name}/[{len(calls)} keys]") from e
        return [
            BatchResult(name=n, ok=br.result == 0, value=br.record[2].get("SUCCESS") if br.record else None, code=br.result)
            for (n, _, _), br in zip(calls, out.batch_records, strict=True)
        ]

    def batch_get(self, set_name: str, names: list[str], bins: list[str] | None = None) -> list[Record | None]:
        """Many records in one round trip; None where a record does not exist."""
        if not names:
            return []
        records: list[Record | None] = []
        for name, br in zip(names, self._batch_read(set_name, names, bins), strict=True):
            if br.result == 0 and br.record:
                records.append(_record(br.record[1], br.record[2]))
            elif br.result == 2:  # not found: the only answer that means "no record"
                records.append(None)
            else:
                # Any other per-key error (a timeout...) says nothing about the record;
                # taking it for "missing" would, say, make a live session look gone.
                raise wrap(_KeyError(br.result), "batch_read", f"{set_name}/{name}")
        return records

    def batch_bins(self, set_name: str, names: list[str], bins: list[str]) -> list[tuple[int, dict[str, Any] | None]]:
        """`batch_get` as (code, bins) pairs (0 with the bins; 2, no record; any other
        code, unknown): on the lease path an object per record cost the client more
        than the read's own share of the call (`batch_same`)."""
        return [
            (br.result, br.record[2] if br.result == 0 and br.record else None)
            for br in self._batch_read(set_name, names, bins)
        ]

    def _batch_read(self, set_name: str, names: list[str], bins: list[str] | None) -> list[Any]:
        """One `batch_read` of `names` (`bins`, or all of them): its batch records."""
        if not names:
            return []
        ns = self.namespace  # `key`, inline: once a record on the batch path
        _check_names(set_name, names)
        bounds = _READ_BOUNDS.get()
        self.round_trips += 1
        try:
            out = self.client.batch_read(
                [(ns, set_name, n) for n in names], bins, {"total_timeout": bounds.record_ms} if bounds is not None else None)
        except aex.AerospikeError as e:
            raise wrap(e, "batch_read", f"{set_name}/[{len(names)} keys]") from e
        return out.batch_records

    # -- scans ---------------------------------------------------------------

    def scan(
        self,
        set_name: str,
        *,
        begin: int = 0,
        count: int = N_PARTITIONS,
        expression: Any = None,
        bins: list[str] | None = None,
        page_size: int = SCAN_PAGE,
    ) -> Iterator[tuple[str, Record]]:
        """(record name, record) for every record of a set in partitions [begin, begin+count).

        See `scan_pages`, which this reads page by page.
        """
        for page in self.scan_pages(set_name, begin=begin, count=count, expression=expression, bins=bins,
                                    page_size=page_size):
            for key, meta, bins_ in page:
                yield key[2], _record(meta, bins_)

    def scan_pages(
        self,
        set_name: str,
        *,
        begin: int = 0,
        count: int = N_PARTITIONS,
        expression: Any = None,
        bins: list[str] | None = None,
        page_size: int = SCAN_PAGE,
    ) -> Iterator[list[tuple[Any, Any, dict[str, Any]]]]:
        """The records of a set in partitions [begin, begin+count), a page at a time, as
        the client hands them over: (key, meta, bins) with the name in ``key[2]``. For
        a consumer of many records (the sync), which builds no object per record.

        Streams: a paginated query (`max_records` per page, the client keeping
        each partition's resume point), so at most `page_size` records are
        held whatever the size of the partitions, and a consumer that stalls
        holds no scan open on the server. A page that partitions in migration
        refuse ("partition unavailable", now and then while a cluster
        rebalances), or whose answer is lost, is asked for again by a new query
        that resumes after the last page handed over: no record is skipped or
        repeated. Records are stored with their key (POLICY_KEY_SEND), so the
        name comes back.
        """
        where = f"{set_name}/partitions {begin}..{begin + count - 1}"
        policy: dict[str, Any] = {"partition_filter": {"begin": begin, "count": count}}
        if bins and expression is None:
            # The server leaves out a record that has none of the selected bins, yet
            # counts it towards the page: the client takes such a short page for the
            # scan's end, and the records after it were never read (a scan for the
            # sessions holding leases found 14 of 30 among 3,000). Filtered out by an
            # expression, a record does not count. With an expression of its own, the
            # caller's records must each have one of `bins` (tests/contract).
            has = [xp.BinExists(b) for b in bins]
            expression = (has[0] if len(has) == 1 else xp.Or(*has)).compile()
        if expression is not None:
            policy["expressions"] = expression
        query = self._paged_query(set_name, bins, page_size)
        handed: dict | None = None  # the partitions' resume points after the last page handed over

        def page() -> list[tuple]:
            nonlocal query
            bounds = _READ_BOUNDS.get()
            if bounds is not None:
                policy["total_timeout"] = bounds.scan_ms
            else:
                policy.pop("total_timeout", None)
            self.round_trips += 1
            try:
                return list(query.results(policy))
            except aex.AerospikeError as e:
                # The failed call may have moved the query's resume points past
                # records it never returned: start again from the last whole page.
                query = self._paged_query(set_name, bins, page_size)
                policy["partition_filter"] = {"begin": begin, "count": count}
                if handed is not None:
                    policy["partition_filter"]["partition_status"] = handed
                raise wrap(e, "scan", where) from e

        while True:
            got = retry_in_doubt(page)
            handed = query.get_partitions_status()
            yield got
            if query.is_done():
                return

    def scan_answered(
        self, set_name: str, *, bins: list[str] | None = None
    ) -> tuple[list[tuple[str, Record]], errors.BackendError | None]:
        """(record name, record) for the records of a small set that the nodes handed
        over, and the error if one did not answer: the other nodes' records, not
        nothing, for a reader who shows what it can while a node is frozen (each
        node's part of a scan answers on its own; `scan` hands over nothing until a
        whole page has). Not paginated: every record is held, and a record that
        migrates meanwhile may come twice or not at all."""
        got: list[tuple[str, Record]] = []
        bounds = _READ_BOUNDS.get()
        policy: dict[str, Any] = {"total_timeout": bounds.scan_ms} if bounds is not None else {}
        query = self.client.query(self.namespace, set_name)
        if bins:
            query.select(*bins)

        def take(rec: tuple[Any, Any, dict[str, Any]]) -> None:
            key, meta, bins_ = rec
            got.append((key[2], _record(meta, bins_)))

        self.round_trips += 1
        try:
            query.foreach(take, policy)
        except aex.AerospikeError as e:
            return got, wrap(e, "scan", set_name)
        return got, None

    def _paged_query(self, set_name: str, bins: list[str] | None, page_size: int) -> Any:
        query = self.client.query(self.namespace, set_name)
        if bins:
            query.select(*bins)
        query.max_records = page_size
        query.paginate()
        return query

    def batch_operate(
        self, set_name: str, items: list[tuple[str, list[dict]]], *, update_only: bool = False
    ) -> list[int]:
        """Operations on many records in one round trip (batch_write of Write records);
        each record's result code (0: done; 2: missing, with `update_only`). Never
        raises for a single record."""
        if not items:
            return []
        policy: dict[str, Any] = {"key": aerospike.POLICY_KEY_SEND}
        if update_only:
            policy["exists"] = aerospike.POLICY_EXISTS_UPDATE
        batch = BatchRecords([Write(self.key(set_name, n), ops, policy=policy) for n, ops in items])
        return [br.result for br in self._batch_write(set_name, batch)]

    def batch_same(
        self, set_name: str, names: list[str], ops: list[dict], *, expression: Any = None
    ) -> list[tuple[int, dict[str, Any] | None]]:
        """The same operations on existing records, in one round trip; each record's
        (code, bins read): 0 with the bins, or its code (2: missing; 27: the filter
        `expression` is false for it) and None. Never raises for a single record.
        Pairs, not a `BatchResult` each: on the batch path's claims, an object per
        record cost the client more than the operation's own share of the call."""
        return [
            (br.result, br.record[2] if br.record else None)
            for br in self._batch_operate(set_name, names, ops, expression)
        ]

    def batch_same_codes(self, set_name: str, names: list[str], ops: list[dict], *, expression: Any = None) -> list[int]:
        """`batch_same` for writes whose answers are not needed: each record's code only
        (0: done; 2: missing; 27: filtered out). No object per record: for the sync's
        marks, tens of thousands a second (a `BatchResult` each cost more than the
        write's own share of the client)."""
        return [br.result for br in self._batch_operate(set_name, names, ops, expression)]

    def _batch_operate(self, set_name: str, names: list[str], ops: list[dict], expression: Any) -> list[Any]:
        """One `batch_operate` of the same update-only `ops` on `names`: its batch records."""
        if not names:
            return []
        ns = self.namespace  # `key`, inline, as in `_batch_read`
        _check_names(set_name, names)
        self.round_trips += 1
        try:
            out = self.client.batch_operate(
                [(ns, set_name, n) for n in names], ops,
                {"expressions": expression} if expression is not None else None,
                {"exists": aerospike.POLICY_EXISTS_UPDATE},
            )
        except aex.AerospikeError as e:
            raise wrap(e, "batch_operate", f"{set_name}/[{len(names)} keys]") from e
        return out.batch_records

    def batch_write_codes(self, set_name: str, items: list[tuple[str, list[dict]]], *, expression: Any = None) -> list[int]:
        """Existing records, each with its own operations (name, ops), under one filter
        `expression` for all; each record's code only (0: done; 2: missing; 27: filtered
        out). The filter is the batch's, sent and parsed once, not each record's: per
        record it cost the client more than the record's own operations (the acks of
        jobs with a result each, benchmarks/RESULTS.md, 2026-11-27)."""
        if not items:
            return []
        ns = self.namespace
        _check_names(set_name, [n for n, _ in items])
        batch = BatchRecords([Write((ns, set_name, n), ops, policy=_UPDATE_ONLY) for n, ops in items])
        return [br.result for br in self._batch_write(set_name, batch, expression)]

    def batch_if_unchanged(
        self, set_name: str, items: list[tuple[str, int]], ops: list[dict], *, expression: Any = None
    ) -> list[int]:
        """The same operations on existing records (name, generation), each only while
        still at the generation given: a compare-and-set per record, in one round trip.
        Each record's code (0: written; 3: written by someone else since; 2: missing;
        27: the batch's filter `expression` is false for it)."""
        if not items:
            return []
        ns = self.namespace
        _check_names(set_name, [n for n, _ in items])
        batch = BatchRecords([Write((ns, set_name, n), ops, meta={"gen": gen}, policy=_UNCHANGED) for n, gen in items])
        return [br.result for br in self._batch_write(set_name, batch, expression)]

    def batch_each(self, set_name: str, items: list[tuple[str, list[dict], Any]]) -> list[BatchResult]:
        """`batch_same` where each existing record has its own operations and filter
        expression: (name, ops, expression or None)."""
        if not items:
            return []
        batch = BatchRecords([
            Write(self.key(set_name, n), ops,
                  policy={"exists": aerospike.POLICY_EXISTS_UPDATE, **({"expressions": e} if e is not None else {})})
            for n, ops, e in items
        ])
        return [
            BatchResult(name=n, ok=br.result == 0, value=br.record[2] if br.record else None, code=br.result)
            for (n, _, _), br in zip(items, self._batch_write(set_name, batch), strict=True)
        ]

    def _batch_write(self, set_name: str, batch: BatchRecords, expression: Any = None) -> list[Any]:
        """One `batch_write` (a round trip), under the batch filter `expression` if any:
        its batch records. Never raises for a single record."""
        self.round_trips += 1
        try:
            out = self.client.batch_write(batch, {"expressions": expression} if expression is not None else None)
        except aex.AerospikeError as e:
            raise wrap(e, "batch_write", f"{set_name}/[{len(batch.batch_records)} keys]") from e
        return out.batch_records

    def indexes(self) -> dict[str, tuple[str, str, str]]:
        """The namespace's secondary indexes: name -> (set, bin, type)."""
        def once() -> Any:
            self.round_trips += 1
            try:
                return self.client.info_all(f"sindex-list:ns={self.namespace}")
            except aex.AerospikeError as e:
                raise wrap(e, "sindex-list", self.namespace) from e

        # A read: repeated when it times out (seen from a loaded machine: code 9, once,
        # failing a worker's start, which registers the modules and reads this first).
        answers = retry_in_doubt(once)
        out: dict[str, tuple[str, str, str]] = {}
        for err, text in answers.values():
            if err is not None or not text:
                continue
            for entry in text.strip().split(";"):
                fields = dict(part.split("=", 1) for part in entry.split(":") if "=" in part)
                if "indexname" in fields:
                    kind = "set" if fields.get("indextype") == "set" else fields.get("type", "")
                    out[fields["indexname"]] = (fields.get("set", ""), fields.get("bin", ""), kind)
        return out

    def create_index(self, set_name: str, bin_name: str, index_name: str, kind: str = "string") -> bool:
        """A secondary index on a bin, of its string or (`kind` "numeric") integer
        values, or (`kind` "set", no bin) a set index; False (and no call that blocks)
        if it is already there. The server answers OK to an identical create, so
        whether it existed is read from the index list first."""
        if kind == "set":
            return self._create_set_index(set_name, index_name)
        datatype = {"string": aerospike.INDEX_STRING, "numeric": aerospike.INDEX_NUMERIC}[kind]
        if self.indexes().get(index_name) == (set_name, bin_name, kind):
            return False
        self.round_trips += 1
        try:
            self.client.index_single_value_create(self.namespace, set_name, bin_name, datatype, index_name)
        except aex.AerospikeError as e:
            raise wrap(e, "index_single_value_create", f"{set_name}.{bin_name} as {index_name}") from e
        return True

    def _create_set_index(self, set_name: str, index_name: str) -> bool:
        """A set index (`create_index`): a scan of a small set then reads that set's
        records, not the whole namespace's primary index on each node. An info command
        (Aerospike 8.1.2 and later: `sindex-create` with `indextype=set`, kept by the
        cluster as a secondary index is); a server that refuses it has the set's
        `enable-index` turned on node by node instead (not kept across a node's
        restart: the README's configuration sets it). Only an optimisation: a server
        that refuses both is said in the log, and everything works without it. The
        embedded store's records are indexed by set already: nothing to do."""
        if self.is_embedded or self.indexes().get(index_name) == (set_name, "", "set"):
            return False

        def refused(command: str) -> list[str]:
            self.round_trips += 1
            try:
                answers = self.client.info_all(command)
            except aex.AerospikeError as e:
                raise wrap(e, "info", command.partition(":")[0]) from e
            return [f"{node}: {err or (text or '').strip() or 'no answer'}" for node, (err, text) in answers.items()
                    if err is not None or (text or "").strip().lower() != "ok"]

        ns = self.namespace
        bad = refused(f"sindex-create:namespace={ns};set={set_name};indexname={index_name};indextype=set")
        if not bad:
            return True
        fallback = refused(f"set-config:context=namespace;id={ns};set={set_name};enable-index=true")
        log.warning("no set index on %s: the server refused it (%s)%s", set_name, "; ".join(bad)[:300],
                    "; enable-index turned on node by node instead" if not fallback else
                    f", and enable-index too ({'; '.join(fallback)[:300]}): scans of the set walk the namespace",
                    extra={"event": "set_index_refused", "set": set_name})
        return False

    def find(
        self, set_name: str, bin_name: str, value: str, *, expression: Any = None, bins: list[str] | None = None
    ) -> list[tuple[str, Record]]:
        """Records whose `bin_name` equals `value`, through its secondary index: the
        cost follows the matches, not the size of the set. Repeated, like `scan`,
        while partitions in migration refuse it."""
        return self._find(set_name, predicates.equals(bin_name, value), f"{bin_name} = {value!r}", expression, bins)

    def find_between(
        self, set_name: str, bin_name: str, low: int, high: int, *, expression: Any = None,
        bins: list[str] | None = None,
    ) -> list[tuple[str, Record]]:
        """Records whose integer `bin_name` is within [low, high], through its numeric
        secondary index (`IndexNotFound`-coded `BackendError`, 201, without one): one
        query, whose cost follows the matches, as `find`'s does."""
        return self._find(set_name, predicates.between(bin_name, low, high), f"{bin_name} in [{low}, {high}]",
                          expression, bins)

    def _find(
        self, set_name: str, predicate: Any, what: str, expression: Any, bins: list[str] | None
    ) -> list[tuple[str, Record]]:
        policy: dict[str, Any] = {"expressions": expression} if expression is not None else {}

        def once() -> list[tuple[str, Record]]:
            bounds = _READ_BOUNDS.get()
            if bounds is not None:
                policy["total_timeout"] = bounds.scan_ms
            else:
                policy.pop("total_timeout", None)
            query = self.client.query(self.namespace, set_name)
            if bins:
                query.select(*bins)
            query.where(predicate)
            self.round_trips += 1
            try:
                found = query.results(policy)
            except aex.AerospikeError as e:
                raise wrap(e, "query", f"{set_name} where {what}") from e
            return [(key[2], _record(meta, got)) for key, meta, got in found]

        return retry_in_doubt(once)

    def truncate(self, set_name: str) -> None:
        self._call("truncate", set_name, "*", lambda: self.client.truncate(self.namespace, set_name, 0))

    def close(self) -> None:
        """Run the close hooks, then close the connection once the calls other threads
        have in flight on it are over (`guard`); a call after close raises
        `StoreClosed`. Calls still running after `close_wait_s()` leave the connection
        open, with a warning: closing it under them would crash the process."""
        hooks, self._on_close = self._on_close, []
        try:
            for fn in hooks:
                fn()
        finally:
            wait_s = self.close_wait_s()
            if not self.client.close(wait_s):
                log.warning(
                    "store connection left open: calls still in flight", extra={
                        "event": "close_in_flight", "calls": self.client.in_flight(), "waited_s": wait_s})

    def close_wait_s(self) -> float:
        """How long `close` waits for calls in flight: past the client's own time limit
        a call has failed, so twice that, and at least 5 s (a scan page, a cluster
        that is changing)."""
        timeout_ms = 0 if self.is_embedded else self.url.client_options().get("total_timeout", CLIENT_TIMEOUT_MS)
        return max(5.0, 2 * timeout_ms / 1000)


class _KeyError(Exception):
    """One key's error code inside a batch, for `wrap`."""

    def __init__(self, code: int) -> None:
        super().__init__(f"per-key result {code}")
        self.code = code
        self.msg = f"per-key result {code}"


def wrap(e: Exception, operation: str, where: str) -> errors.BackendError:
    """An aeroqueue error for a client exception, naming the operation and the key."""
    code = getattr(e, "code", None)
    msg = getattr(e, "msg", None) or type(e).__name__
    cls = _BY_CODE.get(code if isinstance(code, int) else -999, errors.BackendError)
    if code == -2 and "Partition query not supported" in str(msg):
        # What the client says of a scan once it has lost every node (seen with the
        # server stopped under a connected client): not a server too old for scans.
        msg = f"no server node is connected (the server is down or unreachable: {msg})"
    elif code == -8:
        msg = f"{msg}; the cluster is changing, or every node is down"
    return cls(f"{operation} on {where} failed: {msg} (Aerospike code {code})", operation=operation, key=where, code=code)


# Errors after which an idempotent step is simply repeated: its outcome is unknown
# (a timeout, a node that died mid-command), or nothing was done (a busy key, a
# cluster that is changing).
IN_DOUBT = (errors.BackendTimeout, errors.ClusterChanging, errors.RecordBusy)


def retry_in_doubt(fn: Callable[[], T], *, deadline_s: float = 5.0, pause_s: float = 0.05) -> T:
    """Run `fn`, an idempotent step (repeated after it took effect, it answers as the
    first time did), again while it fails with an `IN_DOUBT` error, until `deadline_s`
    has passed; then the last error reaches the caller. A node that dies takes the
    cluster about 1.5 s to drop and the client about 1 s more to learn: the default
    deadline outlasts both. Inside `Backend.bounded_reads`, no longer than a read's
    time limit: a step that timed out is not repeated there."""
    bounds = _READ_BOUNDS.get()
    if bounds is not None:
        deadline_s = min(deadline_s, bounds.record_ms / 1000)
    give_up = time.monotonic() + deadline_s
    attempt = 0
    while True:
        try:
            return fn()
        except IN_DOUBT:
            attempt += 1
            now = time.monotonic()
            if now >= give_up:
                raise
            time.sleep(min(random.uniform(0.5, 1.0) * pause_s * min(attempt, 10), max(0.0, give_up - now)))


# RecordBusy answers retried in this process (a hot key's queue was full): what a
# benchmark reports, since callers never see them.
busy_retries = 0


def retry_busy(fn: Callable[[], T], *, deadline_s: float = 5.0, base_s: float = 0.001, cap_s: float = 0.05) -> T:
    """Run `fn`, retrying RecordBusy (a hot key) with full-jitter exponential backoff
    until `deadline_s` has passed; then the last RecordBusy reaches the caller."""
    global busy_retries
    give_up = time.monotonic() + deadline_s
    attempt = 0
    while True:
        try:
            return fn()
        except errors.RecordBusy:
            busy_retries += 1
            attempt += 1
            now = time.monotonic()
            if now >= give_up:
                raise
            # Full jitter spreads the retries of many clients hitting one key.
            pause = random.uniform(0, min(cap_s, base_s * 2**attempt))
            time.sleep(min(pause, max(0.0, give_up - now)))
