"""Loading jobs into a list (design.md, flows "load"; invariant 4).

A load goes range by range (`chunk_size` jobs each):

1. skip jobs whose id is already indexed (a re-run of the same load; only
   when the list existed before this load);
2. ``alloc``: the list record hands out a token range and a sequence number;
3. write the job records, create-only (a failure means a recovery already
   finished this range: the load is told to run again);
4. write the job-id index, create-only: the index entry is the commit point
   of a job. A job whose id another loader indexed first becomes ``void``;
5. ID mode: write the range's chunk of the ID store;
6. ``publish``: ranges become reservable strictly in sequence order.

Several ranges are in flight at once (`workers` threads, 8 by default; the aerospike client
releases the GIL while it waits on the network), each doing 2-6 on its own
records, so a load runs at the batch-write rate of the store rather than at
its round-trip latency. Order between ranges does not matter for safety: the
list record publishes ranges in sequence order, so `tail` only ever covers
ranges whose every step is done.

A loader that dies between 2 and 6 leaves a pending range; once its lease
has run out, `recover` finishes it with the same rules (index first wins,
unwritten tokens become void), so loads are resumable and never expose an
unwritten token. A live loader renews the leases of its ranges in flight, so a
lease is short (`DEFAULT_LEASE_MS`): a load run again after its loader was
killed waits for that loader's ranges only until their lease runs out, finishes
them, and returns with its own jobs reservable. Ranges of a load still running
elsewhere are not waited for: the jobs behind them are reported as waiting. A
loader whose range fails (an error, not a kill) cuts that range's lease short
(`_RangeLoader._release`): the same load run again finishes it at once.
"""

from __future__ import annotations

import array
import collections
import contextlib
import functools
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aerospike
from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import map_operations as mo
from aerospike_helpers.operations import operations as op

from . import blocks, keys, transitions
from .backends import IN_DOUBT, Backend, Record, retry_in_doubt, wrap
from .backends.sizes import record_size
from .config import MAX_SECONDS, MIN_RECORD_SIZE_LIMIT, flag, seconds, whole
from .errors import (
    AeroqueueError,
    BackendError,
    ConfigError,
    GenerationConflict,
    ListNotFound,
    ListSealed,
    LoadAbandoned,
    LoadError,
    RecordExists,
    RecordNotFound,
)
from .hotpath import ours, stamped, until
from .loading import RECORD_OVERHEAD, Checked, JobSpec, from_iterable

if TYPE_CHECKING:
    from .lists import JobLists

log = logging.getLogger("aeroqueue.load")

DEFAULT_CHUNK = 1000
# The embedded store's ranges are bigger: records are keyed by digest, so a range's
# writes land on pages all over the file, and a page written once per 10,000 jobs
# instead of once per 1,000 took about a quarter of the CPU per job off (300,000 jobs
# in bare SQLite, 55 against 74 µs per job). It costs about 40 MB more of peak RSS.
# Lists in ID mode keep 1,000: a range is also one ID-store chunk, which every
# reservation pops from by rewriting it whole.
EMBEDDED_CHUNK = 10_000
# A range's lease, renewed every quarter of it while its loader lives: a killed loader's
# ranges go to recovery within this, a live one is never cut off by a slow store.
DEFAULT_LEASE_MS = 15_000
RECORD_EXISTS = 5  # Aerospike's code for a create-only write on an existing record
RECORD_TOO_BIG = 13  # and for a record over max-record-size
PAST_DEADLINE = 26  # and for a job write run past its deadline (`_Stamp`): nothing written
NOT_FOUND = 2  # and for a write with no record to update (a batch delete: already gone)
FILTERED_OUT = 27  # and for a write its filter refused
# Per-record codes of a batch write that did not land, or may have: repeated.
IN_DOUBT_CODES = frozenset({-15, -10, -8, 7, 9, 11, 14, 18})
SEALED_CHECK_BATCH = 5000  # index entries read per batch when a sealed list is loaded again
# create-only, and store the key (scans and the sync read record names back)
_CREATE = {"exists": aerospike.POLICY_EXISTS_CREATE, "key": aerospike.POLICY_KEY_SEND}
_SEND_KEY = {"key": aerospike.POLICY_KEY_SEND}
_NEW_ENTRIES = {"map_write_flags": aerospike.MAP_WRITE_FLAGS_CREATE_ONLY | aerospike.MAP_WRITE_FLAGS_NO_FAIL
                | aerospike.MAP_WRITE_FLAGS_PARTIAL}
_WRITE = aerospike.OPERATOR_WRITE  # what `op.write(bin, value)` puts in its dict


@dataclass(frozen=True)
class LoadReport:
    loaded: int  # new jobs that became reservable
    skipped: int  # already loaded (same job id)
    voided: int  # tokens left void (another loader indexed the id first)
    already_sealed: bool = False  # the list was sealed and already held every job: nothing to do
    # This load's jobs (loaded, or skipped as written by another loader) committed but
    # not reservable yet: in or after a range of another load, whose loader renews its
    # lease (still running) or whose lease runs longer than this load waited.
    waiting: int = 0
    # A load asked to seal that was stopped (`stop`) while its jobs waited: not sealed,
    # so that the same load run again (which seals) is still the way to finish it.
    seal_skipped: bool = False


def max_payload(backend: Backend) -> int:
    """The largest payload a job record can hold on this store. A namespace whose records
    are too small for aeroqueue (`MIN_RECORD_SIZE_LIMIT`) is refused here, before a list
    is loaded into it: `ConfigError`, naming its size. (Not where an ack reads the size
    to say why a result is too big: that job is failed with that reason.)"""
    size = backend.max_record_size()
    if size < MIN_RECORD_SIZE_LIMIT:
        raise ConfigError(
            f"namespace {backend.namespace!r}: its max-record-size is {size:,} bytes; aeroqueue needs at least "
            f"{MIN_RECORD_SIZE_LIMIT:,} (a job's failures beside its payload, the completion bitmaps)"
        )
    return size - RECORD_OVERHEAD


def default_chunk(backend: Backend, mode: str) -> int:
    return EMBEDDED_CHUNK if backend.is_embedded and mode != "ids" else DEFAULT_CHUNK


# The widest token (5 bytes packed: a list's tokens stay below 2**32) and server ms
# (9 bytes) a chunk's size is judged with.
_WIDEST_TOKEN, _WIDEST_MS = 2**32 - 1, 2**41


def _chunk_size_bytes(name: str, n: int) -> int:
    """The bytes of an ID-store chunk of `n` jobs at most: its tokens, each job's own
    run_at (`due`), the list's stamp, and its key."""
    bins = {"ids": [_WIDEST_TOKEN] * n, "due": {_WIDEST_TOKEN - i: _WIDEST_MS for i in range(n)}, "c": _WIDEST_MS}
    return record_size(keys.IDS_SET, bins, keys.chunk_name(name, _WIDEST_TOKEN))


def _check_chunk(lists: JobLists, name: str, mode: str | None, chunk_size: int) -> None:
    """In ID mode a load range is also one ID-store chunk record. One too big for the
    store would never be written, so its range would never publish, and every later
    range of the list (and every later load of it) would wait behind it: refused before
    anything is written, with the largest size that fits."""
    if mode is None:
        try:
            mode = lists.header(name)["mode"]
        except ListNotFound:
            return  # a new list, in token mode
    limit = lists.backend.max_record_size()
    if mode != "ids" or _chunk_size_bytes(name, chunk_size) <= limit:
        return
    low, high = 0, chunk_size  # the largest that fits is in [low, high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _chunk_size_bytes(name, mid) <= limit else (low, mid)
    raise LoadError(
        f"chunk size {chunk_size:,} is too big for list {name!r} in ID mode on this store: a chunk record of that many "
        f"jobs, each with its own run_at, can take {_chunk_size_bytes(name, chunk_size):,} bytes, over the store's "
        f"max record size of {limit:,}; use a chunk size of {low:,} or less"
    )


def default_workers(backend: Backend) -> int:
    # The embedded store has one writer per process: threads would only queue on it.
    # On a server, ranges in flight hide round trips (and a busy machine's scheduling
    # delays); 8 did best on the 2-core test machine, and costs a few MB.
    return 1 if backend.is_embedded else 8


def load(
    lists: JobLists,
    name: str,
    jobs: Iterable[Any],
    *,
    mode: str | None,
    seal: bool,
    chunk_size: int | None,
    lease_ms: int,
    max_attempts: int,
    progress: Callable[[int], None] | None = None,
    workers: int | None = None,
    timeout_s: float | None = None,
    backoff_s: float | None = None,
    backoff_max_s: float | None = None,
    delay_s: float = 0.0,
    stop: Callable[[], bool] | None = None,
    on_range: Callable[[LoadReport], None] | None = None,
) -> LoadReport:
    """See `JobLists.load`."""
    # Checked before anything is written: a chunk size of 2.5 failed once the list was made.
    seal, lease_ms, delay_s = flag("seal", seal), whole("lease_ms", lease_ms), seconds("delay_s", delay_s)
    chunk_size = None if chunk_size is None else whole("chunk_size", chunk_size)
    workers = None if workers is None else whole("workers", workers)
    if not 0 <= delay_s <= MAX_SECONDS:  # NaN fails too
        raise LoadError(f"delay must be from 0 to {MAX_SECONDS:,} seconds, not {delay_s}")
    backend = lists.backend
    if chunk_size is not None and chunk_size < 1:
        raise LoadError(f"chunk size must be at least 1, not {chunk_size}")
    if chunk_size is not None:
        _check_chunk(lists, name, mode, chunk_size)
    it = iter(_specs(jobs, max_payload(backend)))
    first = next(it, None)
    if first is None:
        raise LoadError(f"no jobs to load into {name!r}: nothing was created")
    specs = itertools.chain([first], it)
    created = lists.create(
        name, mode=mode, max_attempts=max_attempts, timeout_s=timeout_s, backoff_s=backoff_s, backoff_max_s=backoff_max_s
    )
    head = lists.header(name)
    if head["sealed"] == 1:
        return _sealed_again(backend, name, head["created"], specs, progress, on_range)
    if chunk_size is None:
        chunk_size = default_chunk(backend, head["mode"])
    recover(lists, name)
    n_workers = workers if workers is not None else default_workers(backend)
    # A list this load created has no index entries but those of concurrent loaders,
    # which the create-only index resolves: no need to read it first.
    loader = _RangeLoader(lists, name, head, lease_ms, check_index=not created, delay_ms=round(delay_s * 1000))
    totals = [0, 0, 0]

    def add(result: tuple[int, int, int], size: int) -> None:
        for i, v in enumerate(result):
            totals[i] += v
        if on_range:
            on_range(LoadReport(*result))
        if progress:
            progress(size)

    ranges = _chunks(specs, chunk_size)
    renewer = _Renewer(loader)
    renewer.start()
    try:
        if n_workers <= 1:
            for i, batch in enumerate(ranges):
                add(loader.load_range(i, batch), len(batch))
        else:
            _run_concurrently(loader, ranges, n_workers, add)
    finally:
        renewer.stop()
    waiting = _await_earlier(lists, name, loader.published, lease_ms, stop, skipped=loader.skipped_tokens)
    seal_skipped = seal and waiting > 0 and stop is not None and stop()
    if seal and not seal_skipped:
        lists.seal(name)
    return LoadReport(loaded=totals[0], skipped=totals[1], voided=totals[2], waiting=waiting, seal_skipped=seal_skipped)


class _Renewer:
    """Renews the leases of a loader's ranges in flight every quarter lease
    (aq_list_v1.renew), so that a lease can be short. A renewal that fails is
    tried again at the next turn; the lease left to run covers three of them."""

    def __init__(self, loader: _RangeLoader) -> None:
        self.loader = loader
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aeroqueue-load-renew", daemon=True)

    def start(self) -> None:
        if self.loader.lease_ms > 0:  # a lease of 0 (tests: recovery at once) has nothing to renew
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        loader = self.loader
        while not self._stop.wait(max(loader.lease_ms / 4000, 0.01)):
            with loader.renewing:
                seqs = loader.in_flight()
                if not seqs:
                    continue
                try:
                    loader.lists._list_udf(loader.name, "renew", seqs, loader.lease_ms, loader.created)
                except Exception as e:  # the next turn tries again; the thread must live
                    log.warning("load lease not renewed", extra={"event": "load_renew_failed", "list": loader.name,
                                                                 "ranges": len(seqs), "error": str(e)})


# How often a load whose ranges wait behind another loader's looks again.
AWAIT_STEP_S = 0.25


def _await_earlier(
    lists: JobLists, name: str, ours: dict[int, int], lease_ms: int, stop: Callable[[], bool] | None = None,
    *, skipped: Sequence[int] = (),
) -> int:
    """Our ranges are published, but the list publishes in sequence order: one of
    another loader before them, unwritten, holds them back. A killed loader's (the
    load run again after it) runs out of lease and is recovered here; a live one
    renews it, which shows within a quarter lease, and is not waited for. `stop()`
    true ends the wait: our jobs are written, and a sweep or the next load finishes
    the other range (a first Ctrl-C waited out the lease). The same for the jobs
    `skipped` (their tokens) as indexed by an earlier loader: a load run again
    after two killed ones found every job indexed, and returned (sealing the list)
    while a third of them were in ranges not published. Returns how many of our
    jobs still wait (`LoadReport.waiting`)."""
    top = max(skipped, default=-1)
    if not ours and top < 0:
        return 0
    last = max(ours, default=-1)
    give_up = time.monotonic() + lease_ms / 1000 + 2 * AWAIT_STEP_S
    seen: dict[int, int] = {}

    def still_waiting(head: dict[str, Any]) -> int:
        pubs, tail = head["pubs"], head["tail"]
        return sum(n for seq, n in ours.items() if seq >= pubs) + (
            sum(1 for t in skipped if t >= tail) if top >= tail else 0)

    while True:
        head = lists.header(name)
        if head["pubs"] > last and head["tail"] > top:
            return 0
        # A lease moved by an embedded store's hold credit (aq_list_v1 `credit`) is no
        # sign of life: only what the loader renewed counts.
        blockers = {seq: r["exp"] - r.get("cr", 0) for seq, r in (head.get("pend") or {}).items()
                    if (seq < last or r["start"] <= top) and r.get("real") is None}
        renewed = any(seq in seen and exp != seen[seq] for seq, exp in blockers.items())
        if renewed or time.monotonic() > give_up or (stop is not None and stop()):
            return still_waiting(head)
        seen = blockers
        try:
            if recover(lists, name):
                continue  # a recovery published ranges: look again at once
        except AeroqueueError as e:
            # Our own ranges are written and published: the load did its part. The
            # recovery is the next load's or sweep's to finish.
            log.warning("load: recovering an earlier range failed", extra={
                "event": "load_recover_failed", "list": name, "error": str(e)})
            return still_waiting(head)
        time.sleep(AWAIT_STEP_S)


def _run_concurrently(
    loader: _RangeLoader, ranges: Iterator[list[JobSpec]], n_workers: int,
    add: Callable[[tuple[int, int, int], int], None],
) -> None:
    """Ranges on `n_workers` threads, and one more queued (bounded memory).
    The first failure (of a range, or of `ranges` itself) stops new ranges; those in
    flight finish (or stay pending for recovery, as a killed loader's would) before it
    is raised."""
    pending: dict[Future[tuple[int, int, int]], int] = {}
    error: BaseException | None = None

    def collect(done: set[Future[tuple[int, int, int]]]) -> None:
        nonlocal error
        for f in done:
            size = pending.pop(f)
            if f.exception() is not None:
                error = error or f.exception()
            else:
                add(f.result(), size)

    with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="aeroqueue-load") as pool:
        try:
            for i, batch in enumerate(ranges):
                if error is not None:
                    break
                pending[pool.submit(loader.load_range, i, batch)] = len(batch)
                if len(pending) > n_workers:
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    collect(done)
        finally:
            # Also when the input stops the load (the CLI's SIGTERM): the ranges in
            # flight finish all the same, and are counted, so that what it reports
            # loaded is what the list holds.
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                collect(done)
    if error is not None:
        raise error


class _RangeLoader:
    """Steps 1-6 of the module docstring for one range; safe to call from several threads.

    Ranges allocate their tokens in input order (range i waits for range i-1's
    alloc, one short round trip), so tokens follow the file whatever the
    threads: the list is served in the order it was loaded."""

    def __init__(
        self, lists: JobLists, name: str, head: dict[str, Any], lease_ms: int, check_index: bool, delay_ms: int = 0
    ) -> None:
        self.lists = lists
        self.delay_ms = delay_ms
        self.b = lists.backend
        self.name = name
        self.created = head["created"]  # the stamp of its job-id index entries
        self.mode = head["mode"]
        self.max_att = head["max_att"]
        self.lease_ms = lease_ms
        self.check_index = check_index
        self._turn = 0  # the next range (by input order) allowed to allocate
        self._turns = threading.Condition()
        self._flying: set[int] = set()  # ranges allocated and not yet published or given up
        # Held around a renewal of the ranges in flight and a failed range's release, so
        # that a renewal of a range read in flight before it failed never lands after its
        # release and gives it the full lease again.
        self.renewing = threading.Lock()
        self.published: dict[int, int] = {}  # range -> its real jobs, once this loader published it
        # Tokens of the jobs skipped as indexed already: an earlier loader's, which may
        # not be published yet (it was killed, or runs still): `_await_earlier`.
        self.skipped_tokens = array.array("q")

    def in_flight(self) -> list[int]:
        with self._turns:
            return sorted(self._flying)

    def load_range(self, i: int, batch: list[JobSpec]) -> tuple[int, int, int]:
        b, name = self.b, self.name
        try:
            if self.check_index:
                new, indexed = _split_indexed(b, name, self.created, batch)
                with self._turns:
                    self.skipped_tokens.extend(indexed)
            else:
                new = batch
            with self._turns:
                self._turns.wait_for(lambda: self._turn == i)
                if not new:
                    return 0, len(batch), 0
                got = self.lists._list_udf(name, "alloc", len(new), self.lease_ms, uuid.uuid4().hex, self.created)
        finally:
            # Whatever happened to this range, the next one may allocate now (range i
            # only ever waits for ranges before it, which started first: no deadlock).
            with self._turns:
                self._turn = max(self._turn, i + 1)
                self._turns.notify_all()
        if got["st"] == "sealed":
            # Another loader of the same jobs may have sealed the list after this one
            # read its header: a batch that list already holds is loaded, not refused.
            missing = len(_not_indexed(b, name, self.created, batch))
            if not missing:
                return 0, len(batch), 0
            raise ListSealed(
                f"list {name!r} was sealed during the load: {missing:,} of the {len(batch):,} jobs of load range "
                f"{i + 1} are not in it and cannot be added"
            )
        if got["st"] != "ok":
            raise ListNotFound(f"no job list named {name!r}: it was dropped during the load")
        seq = got["seq"]
        with self._turns:
            self._flying.add(seq)
        try:
            try:
                real, skipped = self._write_range(batch, new, got)
            except (LoadAbandoned, ListNotFound) as e:
                # Whatever failed, a list dropped (or dropped and made again) under the
                # load is the cause to report, and what this range wrote is taken back
                # (unless a check of `_fence` failed it: then it is taken back already).
                if not getattr(e, "_fenced", False):
                    self._fence(got, new, cause=e)
                raise
        except Exception:
            self._release(seq)
            raise
        finally:
            with self._turns:
                self._flying.discard(seq)
        with self._turns:
            self.published[seq] = real
        return real, skipped, len(new) - real

    def _release(self, seq: int) -> None:
        """Range `seq` failed: this loader writes no more of it. Its lease is cut short,
        so that the same load run again (or a sweep) finishes it at once instead of
        after the full lease. Not at once on a server: a write of the range given up in
        doubt may still land until its deadline (`Backend.job_deadline`), and the lease
        runs that long; past it the server refuses it (a job create, a chunk), or it
        repeats what a recovery writes (an index entry, sent only once every job of the
        range was written). The embedded store's writes land before they return. Not
        after a second Ctrl-C (a BaseException): that one stops at once, and the range
        waits out its lease. A release that fails leaves the lease as it was."""
        with self._turns:
            self._flying.discard(seq)  # not renewed again: `_Renewer` holds `renewing` while it renews
        deadline = self.b.job_deadline()
        left_ms = 0 if deadline is None else max(0, deadline - int(time.time() * 1000))
        try:
            with self.renewing:
                self.lists._list_udf(self.name, "renew", [seq], left_ms, self.created)
        except Exception as e:  # the failure being raised is the one to report
            log.warning("failed load range's lease not cut short: it runs out as a killed loader's would",
                        extra={"event": "load_release_failed", "list": self.name, "range": seq, "error": str(e)})

    def _gone(self) -> str | None:
        """Why this load may write no more into its list (None: it may). A loader
        stopped past its lease (SIGSTOP, a long pause) is not waited for by a drop:
        its list may be dropped, or being dropped, or dropped and made again under
        its name, by the time it writes."""
        # Repeated while in doubt: three checks a range, one timeout (a cluster changing)
        # would fail the load, the last check's after its range was published.
        rec = retry_in_doubt(lambda: self.b.get(keys.LIST_SET, self.name, bins=["created", "dropping"]))
        now = rec.bins.get("created") if rec is not None else None  # a tombstone has none
        if now != self.created:
            return "was dropped during the load" + (" and made again" if now is not None else "")
        if rec is not None and rec.bins.get("dropping") == 1:
            return "is being dropped"
        return None

    def _fence(self, got: dict[str, Any], new: list[JobSpec], cause: BaseException | None = None) -> None:
        """Raise `LoadAbandoned` if the list is no longer this load's, after deleting
        whatever this range may have written: its job records, index entries and
        ID-store chunk, stamped with the list's `created` (bin "c"), so that a list made since under
        the name, whose records carry its own stamp, loses nothing."""
        why = self._gone()
        if why is None:
            return
        name, seq, start = self.name, got["seq"], got["start"]
        mine = stamped(self.created)
        self.lists._delete_all(keys.JOB_SET, [keys.job_name(name, t) for t in range(start, start + len(new))], only=mine)
        self.lists._delete_all(keys.JIDX_SET, [keys.jidx_name(name, s.jid) for s in new], only=mine)
        self.lists._delete_all(keys.BLOCK_SET, blocks.names_between(name, start, start + len(new)), only=mine)
        if self.mode == "ids":
            self.lists._delete_all(keys.IDS_SET, [keys.chunk_name(name, seq)], only=mine)
        fenced = LoadAbandoned(
            f"list {name!r} {why}: this load stops, and what it wrote of load range {seq} "
            f"({len(new):,} jobs) is deleted; run it again to load the list anew"
        )
        fenced._fenced = True  # type: ignore[attr-defined]  # load_range: taken back already
        raise fenced from cause

    def _still_pending(self, seq: int) -> bool:
        """Whether range `seq` is still this loader's and unpublished, its lease renewed
        (a full lease from now, which no recovery takes from it, outlasts the block
        writes): one stopped past its lease may find a recovery published it, and its
        jobs handed out and done since; entries written for them then would only
        outlive them (blocks.py)."""
        return self.lists._list_udf(self.name, "renew", [seq], self.lease_ms, self.created) == 1

    def _own_writes(self, start: int, exists: list[int], new: list[JobSpec], codes: list[int]) -> dict[int, int]:
        """Of the range's job writes `exists` (positions in `new`) answered
        RecordExists (the range starts at token `start`), mark those that hold our job as written (code 0): our own
        write, repeated after a lost answer. Returns those written by another list
        of this name: position -> the stamp (its `created`) read."""
        if not exists:
            return {}
        b, name = self.b, self.name
        recs = retry_in_doubt(lambda: b.batch_get(keys.JOB_SET, [keys.job_name(name, start + i) for i in exists]))
        foreign = {}
        for i, rec in zip(exists, recs, strict=True):
            if rec is not None and not keys.indexed_here(rec.bins, self.created):
                foreign[i] = rec.bins["c"]
            elif rec is not None and rec.bins.get("state") != "void" and rec.bins.get("jid") == new[i].jid:
                codes[i] = 0
        return foreign

    def _write_range(self, batch: list[JobSpec], new: list[JobSpec], got: dict[str, Any]) -> tuple[int, int]:
        """Steps 3-6 for the range `alloc` answered (`got`): its real jobs, and the
        batch's jobs skipped as already loaded."""
        b, name = self.b, self.name
        seq, start = got["seq"], got["start"]
        ns = b.namespace
        self._fence(got, new)
        # Delays count from the server's clock (alloc's `now`), never the loader's.
        now_ms = got.get("now", 0)
        gate = now_ms + self.delay_ms if self.delay_ms > 0 else 0
        # The bins every job of the range shares: one operation dict each, reused
        # (the client only reads them).
        # "c": the list's `created`, as on its index entries: which list of the name wrote
        # the record (a fenced loader deletes its own, a later list replaces them).
        stamp = _Stamp(b, self.created)
        same = [op.write("list", name), op.write("att", 0), op.write("max_att", self.max_att), stamp.op]
        queued = [op.write("state", "queued")]
        timed: dict[int, int] = {}  # token -> due, for jobs with a run_at of their own
        later: set[int] = set()  # tokens written delayed

        def state_of(t: int, s: JobSpec) -> list[Any]:
            own = round(s.run_at * 1000) if s.run_at is not None else 0
            due = max(gate, own)
            if due <= now_ms:
                return queued
            if own > gate:
                timed[t] = own
            later.add(t)
            return [op.write("state", "delayed"), op.write("due", due)]

        # 3. job records, create-only: tokens are fresh, so a conflict means a
        # recovery voided this range after our lease ran out. The operations are the
        # dicts `op.write` returns, built inline: a function call per bin was a
        # measurable part of the client's CPU per job.
        job_set = keys.JOB_SET
        job_writes = [
            Write(
                (ns, job_set, f"{name}/{t}"),
                [{"op": _WRITE, "bin": "token", "val": t}, {"op": _WRITE, "bin": "jid", "val": s.jid},
                 {"op": _WRITE, "bin": "payload", "val": s.payload}, *same, *state_of(t, s)],
                policy=_CREATE,
            )
            for t, s in zip(range(start, start + len(new)), new, strict=True)
        ]
        tokens = range(start, start + len(new))
        codes = self.lists._batch_write(job_writes, "write jobs", stamp)
        # RecordExists is this load's own write when it was repeated after a lost
        # answer (by the client, or by batch_write): the record then holds our job.
        exists = [i for i, code in enumerate(codes) if code == RECORD_EXISTS]
        stamps = self._own_writes(start, exists, new, codes)
        foreign = list(stamps)
        if foreign:
            # Left by a loader of a dropped list of this name (fenced out, and killed
            # before it took its writes back): not ours, unless ours is the list that
            # was dropped (then `_fence` raises). Replaced, once.
            self._fence(got, new)
            _delete_left_by_another(self.lists, keys.JOB_SET, [(keys.job_name(name, tokens[i]), c)
                                                               for i, c in stamps.items()])
            for i, code in zip(foreign, self.lists._batch_write([job_writes[i] for i in foreign], "write jobs", stamp),
                               strict=True):
                codes[i] = code
            self._own_writes(start, [i for i in foreign if codes[i] == RECORD_EXISTS], new, codes)
        if RECORD_EXISTS in codes:
            raise LoadAbandoned(
                f"list {name!r}: load range {seq} outlived its lease ({self.lease_ms / 1000:g} s) and was finished "
                "by a recovery before its jobs were written; run the load again"
            )
        big = [i for i, code in enumerate(codes) if code == RECORD_TOO_BIG]
        if big:
            # Not a passing trouble of the cluster: this job can never be stored as it is.
            spec = new[big[0]]
            where = f" (line {spec.line})" if spec.line is not None else ""
            raise LoadAbandoned(
                f"list {name!r}: the record of job {spec.jid!r}{where} is over the store's max-record-size "
                f"({len(big)} such job{'s' if len(big) > 1 else ''} in load range {seq}); shrink its payload and run "
                "the load again (it finishes the range left pending, or `aeroqueue sweep` does)"
            )
        if any(codes):
            raise LoadAbandoned(
                f"list {name!r}: writing the jobs of load range {seq} failed ({_describe(codes)}); "
                "run the load again once the cluster is healthy (it finishes the range left pending, or "
                "`aeroqueue sweep` does)"
            )
        # 4. the index: the commit point of each job. Not into a list dropped meanwhile.
        self._fence(got, new)
        real = commit_index(self.lists, name, self.created, list(zip(tokens, [s.jid for s in new], strict=True)))
        real_set = set(real)
        if self.mode == "tokens" and self._still_pending(seq):
            # 5. the block records of its queued jobs, before they can be taken (blocks.py).
            write_blocks(self.lists, name, self.created,
                         [(t, new[t - start]) for t in real if t not in later])
        finish_range(self.lists, name, self.mode, seq, real, gate=gate,
                     timed={t: due for t, due in timed.items() if t in real_set}, created=self.created)
        # A drop that started while this loader was stopped past its lease deleted the
        # list's records before these landed: published or not, they go with it.
        self._fence(got, new)
        return len(real), len(batch) - len(new)


def _chunks(specs: Iterable[JobSpec], size: int) -> Iterator[list[JobSpec]]:
    it = iter(specs)
    while batch := list(itertools.islice(it, size)):
        yield batch


class _Stamp:
    """Bin "c" of a range's job records: the list's `created`, one operation that all
    of them share. With a deadline (`Backend.job_deadline`; the embedded store has
    none) the server writes it only until then, and past it refuses the whole record
    (PAST_DEADLINE, nothing created): a create sent to a node that froze and resumed
    later, once the load repeated it elsewhere and workers acknowledged the job, would
    otherwise replace the acknowledged record on the live nodes with a new, queued
    one (README: a frozen node replays the calls it was sent). One expression per
    record, set again before each attempt (`refresh`), so that a retry is not refused
    for the deadline of the first."""

    def __init__(self, b: Backend, created: int) -> None:
        self.b, self.created = b, created
        self.op: dict[str, Any] = ({"op": _WRITE, "bin": "c", "val": created} if b.job_deadline() is None
                                   else eo.expression_write("c", []))

    def refresh(self) -> None:
        deadline = self.b.job_deadline()
        if deadline is not None:
            self.op["expr"] = until(deadline, self.created)


class InTime:
    """A read that all of a batch's deletes share, ahead of the delete: past a deadline
    (`Backend.job_deadline`, set again before each attempt: `refresh`) the server
    refuses the record (PAST_DEADLINE, nothing deleted). A drop's delete that a frozen
    node runs once resumed, after the list was made again under its name and loaded,
    passes any filter on its stale copy (the old list's record, old stamp and all), and
    its replica delete deletes the new list's record on the live nodes (README: a
    frozen node replays the calls it was sent). A read, not the batch's filter: a
    filter's refusal (27) also means "not this list's record", a delete to skip; past
    the deadline is one to repeat. `of` is None without a deadline (the embedded store)."""

    def __init__(self, b: Backend) -> None:
        self.b = b
        self.op: dict[str, Any] = eo.expression_read("in_time", [])

    @classmethod
    def of(cls, b: Backend) -> InTime | None:
        return None if b.job_deadline() is None else cls(b)

    def refresh(self) -> None:
        deadline = self.b.job_deadline()
        if deadline is not None:
            self.op["expr"] = until(deadline, 1)


def batch_write(
    b: Backend, writes: list[Write], what: str, retry_s: float, stamp: _Stamp | InTime | None = None
) -> list[int]:
    """Each write's result code (0: written). Writes whose answer was lost or that the
    cluster could not serve just now (a node died, migrations: `IN_DOUBT_CODES`) are
    repeated for `retry_s`; every write here is create-only or idempotent, and a
    create-only repeat of a write that did land answers RecordExists, which the callers
    check. `stamp`, an operation of the writes: given a fresh deadline before each
    attempt; a write refused past its deadline was not made, and is repeated too."""
    codes = [-1] * len(writes)
    todo = list(range(len(writes)))
    give_up = time.monotonic() + retry_s
    again = IN_DOUBT_CODES | {PAST_DEADLINE} if stamp is not None else IN_DOUBT_CODES
    while True:
        if stamp is not None:
            stamp.refresh()
        b.round_trips += 1
        try:
            out = b.client.batch_write(BatchRecords([writes[i] for i in todo] if len(todo) < len(writes) else writes))
            for i, br in zip(todo, out.batch_records, strict=True):
                codes[i] = br.result
        except aerospike.exception.AerospikeError as e:
            err = wrap(e, f"batch_write ({what})", f"[{len(todo)} records]")
            if not isinstance(err, IN_DOUBT) or time.monotonic() >= give_up:
                raise err from e
            for i in todo:
                codes[i] = err.code if isinstance(err.code, int) else -1
        todo = [i for i in todo if codes[i] in again]
        if not todo or time.monotonic() >= give_up:
            return codes
        time.sleep(0.1)


def write_blocks(lists: JobLists, name: str, created: int, jobs: list[tuple[int, JobSpec]]) -> None:
    """Put committed queued jobs (token, spec) of the list made at `created` into their
    block records (blocks.py), create-only (a bury's mark stays), before their range
    is published (the caller renewed the range's lease first: `_still_pending`). A
    block another list of the name left (a loader of a dropped list, killed before it
    took its writes back) is replaced, while this list is still the one loading.
    Blocks only save reads: a job whose entry is bigger than its share of a block
    (`blocks.entry_room`) is left out, and so is a block that cannot be written (the
    store in trouble): a reservation reads those jobs' records. A write still in doubt is
    waited out (its deadline), so that it cannot land after the range is published."""
    if not jobs:
        return
    b = lists.backend
    stamp = _Stamp(b, created)
    policy = {**_SEND_KEY, "expressions": stamped(created)}
    entries: dict[int, dict[int, list[Any]]] = collections.defaultdict(dict)
    room, fits, too_big = blocks.entry_room(name, b.max_record_size()), blocks.entry_fits, 0
    for t, s in jobs:
        entry = [s.jid, s.payload]
        # A block none of whose entries fit is still written (its stamp alone): one
        # another list of the name left is replaced, not kept until a drop.
        kept = entries[blocks.block_of(t)]
        if fits(t, entry, room):
            kept[t] = entry
        else:
            too_big += 1
    if too_big:
        log.debug("jobs too big for a block: reservations read their records", extra={
            "event": "blocks_left_out", "list": name, "jobs": too_big})
    order = list(entries)

    def writes(which: list[int]) -> list[Write]:
        # Create-only entries: a bury's marker made first stays (blocks.forget).
        return [Write(b.key(keys.BLOCK_SET, blocks.name(name, blk)),
                      [stamp.op, *([mo.map_put_items("j", entries[blk], map_policy=_NEW_ENTRIES)] if entries[blk] else [])],
                      policy=policy) for blk in which]

    codes: dict[int, int] = {}
    doubt = False
    try:
        codes.update(zip(order, lists._batch_write(writes(order), "write blocks", stamp), strict=True))
        doubt = any(code in IN_DOUBT_CODES for code in codes.values())
        foreign = [blk for blk, code in codes.items() if code == FILTERED_OUT]
        if foreign:
            recs = b.batch_get(keys.BLOCK_SET, [blocks.name(name, blk) for blk in foreign], bins=["c"])
            left = [(blocks.name(name, blk), r.bins["c"]) for blk, r in zip(foreign, recs, strict=True)
                    if r is not None and r.bins.get("c") not in (None, created)]
            if left:
                _check_same_list(lists, name, created)
                _delete_left_by_another(lists, keys.BLOCK_SET, left)
            codes.update(zip(foreign, lists._batch_write(writes(foreign), "write blocks", stamp), strict=True))
            doubt = doubt or any(codes[blk] in IN_DOUBT_CODES for blk in foreign)
        failed = [code for code in codes.values() if code != 0]
    except LoadAbandoned:
        raise
    except AeroqueueError as e:
        code = getattr(e, "code", None)
        failed, doubt = [code if isinstance(code, int) else -1], doubt or isinstance(e, IN_DOUBT)
    if doubt:
        deadline = b.job_deadline()  # past the deadline of the last attempt
        if deadline is not None:
            time.sleep(max(0.0, deadline / 1000 - time.time()))
    if failed:
        log.warning("block records not written: reservations read those jobs' records", extra={
            "event": "blocks_not_written", "list": name, "codes": sorted(set(failed))})


def _describe(codes: list[int]) -> str:
    """'3 records: Aerospike code 9 (timeout)' for the codes that are not 0."""
    counts = collections.Counter(code for code in codes if code != 0)
    return ", ".join(
        f"{n} record{'s' if n > 1 else ''}: Aerospike code {code}{f' ({_CODE_NAMES[code]})' if code in _CODE_NAMES else ''}"
        for code, n in sorted(counts.items())
    )


_CODE_NAMES = {
    -15: "no response from the node", -10: "node unreachable", -8: "no node for the partition",
    7: "cluster changing", 9: "timeout", 11: "partition unavailable", 13: "record too big",
    14: "key busy", 18: "device overload", 22: "forbidden", 26: "past its deadline",
}


def commit_index(lists: JobLists, name: str, created: int, pairs: list[tuple[int, str]]) -> list[int]:
    """Index each (token, jid) create-only; the tokens whose index is theirs are real,
    the others are made void. Returns the real tokens, in order. An entry carries the
    list's `created` stamp: one left by a dropped list of the same name (`stale_index`)
    is replaced, never taken for this list's."""
    b = lists.backend
    ns = b.namespace
    jidx_set = keys.JIDX_SET
    writes = [Write((ns, jidx_set, f"{name}/{jid}"),
                    [{"op": _WRITE, "bin": "tok", "val": t}, {"op": _WRITE, "bin": "c", "val": created},
                     {"op": _WRITE, "bin": "l", "val": name}], policy=_CREATE)
              for t, jid in pairs]
    codes = lists._batch_write(writes, "index job ids")
    if any(code not in (0, RECORD_EXISTS) for code in codes):
        # Not a clash but a failure: leave the range pending, so that a re-run or a
        # recovery decides these tokens from the index alone, never by guess.
        raise LoadAbandoned(f"list {name!r}: indexing job ids failed (codes {sorted(set(codes))}); run the load again")
    clashes = [(t, jid) for (t, jid), code in zip(pairs, codes, strict=True) if code == RECORD_EXISTS]
    if not clashes:
        return [t for t, _ in pairs]
    recs = b.batch_get(keys.JIDX_SET, [keys.jidx_name(name, jid) for _, jid in clashes])
    if any(r is not None and not keys.indexed_here(r.bins, created) for r in recs):
        _check_same_list(lists, name, created)
    owners = {}
    for (t, jid), r in zip(clashes, recs, strict=True):
        if r is None:
            raise LoadAbandoned(f"list {name!r}: a job id index vanished while loading; run the load again")
        owners[jid] = r.bins["tok"] if keys.indexed_here(r.bins, created) else stale_index(lists, name, created, t, jid, r)
    voids = [t for t, jid in clashes if owners[jid] != t]
    if voids:
        # Unpublished tokens of this list: nobody can hold them, so overwriting is safe,
        # while they are this list's. A loader stopped here past its lease while the
        # list was dropped and loaded again would otherwise void the new list's job of
        # the same token (and set its void bit): lost, and the list never complete.
        # Hence the stamp filter, and the deadline of every load write (`InTime`).
        _check_same_list(lists, name, created)
        in_time = InTime.of(b)
        ops = [op.write("state", "void")] if in_time is None else [in_time.op, op.write("state", "void")]
        policy = {**_SEND_KEY, "exists": aerospike.POLICY_EXISTS_UPDATE, "expressions": ours(created)}
        void_writes = [Write(b.key(keys.JOB_SET, keys.job_name(name, t)), ops, policy=policy) for t in voids]
        codes = lists._batch_write(void_writes, "void duplicate jobs", in_time)
        if FILTERED_OUT in codes or NOT_FOUND in codes:
            raise LoadAbandoned(f"list {name!r} was dropped during the load: nothing more of this load is written "
                                "into it")
        if any(code != 0 for code in codes):
            raise LoadAbandoned(f"list {name!r}: voiding duplicate jobs failed ({_describe(codes)}); run the load again")
        void_bits(lists, name, voids, created)
    void_set = set(voids)
    return [t for t, _ in pairs if t not in void_set]


def _check_same_list(lists: JobLists, name: str, created: int) -> None:
    """Before an index entry of another list of this name is replaced (`stale_index`):
    the list is still the one this load (or recovery) read. A loader stopped past its
    lease while its list was dropped and made again would otherwise take the new
    list's entries for a dropped list's, and replace them with its own."""
    rec = lists.backend.get(keys.LIST_SET, name, bins=["created"])
    now = rec.bins.get("created") if rec is not None else None  # a dropped list's tombstone has none
    if now != created:
        raise LoadAbandoned(f"list {name!r} was dropped during the load{' and made again' if now else ''}: "
                            "nothing more of this load is written into it")


def stale_index(lists: JobLists, name: str, created: int, token: int, jid: str, rec: Record) -> int:
    """The token that owns `jid` once an index entry of another list of the same name
    is replaced by ours (a compare-and-set: a concurrent loader or recovery that
    replaced it first owns it). Retention deletes job records and keeps their
    entries, so that a load repeated later adds nothing twice; entries written
    before they carried their list's name (bin "l") cannot be found by a drop once
    their job records are gone, so these outlive it."""
    key = keys.jidx_name(name, jid)
    for _ in range(3):
        try:
            # In doubt, sent again: one that landed meets its own generation, below.
            retry_in_doubt(functools.partial(lists.backend.put, keys.JIDX_SET, key, {"tok": token, "c": created, "l": name},
                                             gen=rec.gen))
            return token
        except GenerationConflict:
            again = lists.backend.get(keys.JIDX_SET, key)
            if again is None:
                break
            if keys.indexed_here(again.bins, created):
                return int(again.bins["tok"])
            rec = again
    raise LoadAbandoned(f"list {name!r}: the job id index of {jid!r} kept changing while loading; run the load again")


def void_bits(lists: JobLists, name: str, tokens: list[int], created: int) -> None:
    """Mark void tokens in the void bitmap of the list made at `created`, before their
    range is published: the token store hands them out like any token (the claim
    refuses them), so `status` needs them to count what is reservable. Idempotent."""
    if tokens:
        transitions.set_bits(lists.backend, name, tokens, "void", 1, created)


def finish_range(
    lists: JobLists, name: str, mode: str, seq: int, real: list[int], *, gate: int = 0, timed: dict[int, int] | None = None,
    recovered: bool = False, created: int | None = None,
) -> None:
    """Publish a written range. `gate` (server ms) holds the whole range back until
    then; `timed` holds single jobs back (token -> server ms). A recovered range
    has no gate: each of its delayed jobs is timed by the due its record holds
    (the job record is what decides; its claim refuses it until then). `created`:
    the list the range was allocated in; range `seq` of another list of this name
    (made since a drop) is refused."""
    if mode == "ids":
        # `due`: its jobs' own run_at, for status only (the claim decides when they run).
        chunk: dict[str, Any] = {"ids": real, "due": timed} if timed else {"ids": real}
        if created is not None:
            chunk["c"] = created  # which list of the name wrote it, as on its job records
        create = functools.partial(_write_chunk, lists, name, seq, chunk, create=True)
        try:
            # Create-only: repeated after a lost answer, a create that landed answers RecordExists.
            try:
                create()
            except RecordExists:
                old = lists.backend.get(keys.IDS_SET, keys.chunk_name(name, seq), bins=["c"])
                if created is None or old is None or keys.indexed_here(old.bins, created):
                    raise
                # Left by a loader of a dropped list of this name, fenced out and killed
                # before it took it back: replaced. Unless this loader is the stale one (its
                # list dropped and made again while it was stopped): the chunk is then the
                # new list's.
                _check_same_list(lists, name, created)
                _delete_left_by_another(lists, keys.IDS_SET, [(keys.chunk_name(name, seq), old.bins["c"])])
                create()
        except RecordExists:
            # The same chunk, written by the loader (it died before publishing, or
            # this is its repeated call) or by a recovery. A recovery's `due` holds
            # every delayed job, by the due its record says; the loader's only those
            # with a run_at past the load's delay (its gate holds the rest, and a
            # recovery publishes no gate): the recovery's is the one to keep.
            if recovered and timed:
                # Gone since (the list dropped): the publish below says so.
                with contextlib.suppress(RecordNotFound):
                    _write_chunk(lists, name, seq, {"due": timed}, create=False)
    out = lists._list_udf(name, "publish", seq, len(real), gate, timed or {}, transitions.SCHED_CAP, created)
    if out["st"] != "ok":
        raise LoadAbandoned(f"list {name!r}: range {seq} is unknown to the list record (was the list dropped?)")


def _write_chunk(lists: JobLists, name: str, seq: int, bins: dict[str, Any], *, create: bool) -> None:
    """Write `bins` into the ID-store chunk of range `seq` (`create`: create-only, so
    RecordExists if it exists; else update-only, RecordNotFound if it is gone: a `due`
    written after a drop would leave a chunk of nothing else), repeated while in doubt. With a deadline (`InTime`;
    the embedded store has none, and writes as it always did) the server writes only
    until then, and past it refuses the whole record (PAST_DEADLINE, nothing written):
    a write sent to a node that froze and resumed later would otherwise replace the
    chunk on the live nodes with the result on the node's stale copy, the whole record
    (README: a frozen node replays the calls it was sent). A create would bring the
    chunk back full after the loader made it again elsewhere and workers popped it
    (its IDs handed out again), a recovery's `due` the dead loader's `ids`
    (tests/multinode/test_chunk_replay.py). A read, not a filter: a filter stops no
    create. Each attempt gets a fresh deadline; one refused past it was not made, and
    is repeated for `write_retry_s`."""
    b, chunk = lists.backend, keys.chunk_name(name, seq)
    in_time = InTime.of(b)
    writes = [op.write(k, v) for k, v in bins.items()]
    if in_time is None:
        retry_in_doubt(functools.partial(b.put, keys.IDS_SET, chunk, bins, create_only=True) if create else
                       functools.partial(b.operate, keys.IDS_SET, chunk, writes, update_only=True))
        return
    ops = [in_time.op, *writes]

    def attempt() -> None:
        in_time.refresh()  # a repeat after a lost answer too: the first deadline may have passed
        b.operate(keys.IDS_SET, chunk, ops, create_only=create, update_only=not create)

    give_up = time.monotonic() + lists.write_retry_s
    while True:
        try:
            retry_in_doubt(attempt)
            return
        except BackendError as e:
            if e.code != PAST_DEADLINE:
                raise
            if time.monotonic() >= give_up:
                raise LoadAbandoned(
                    f"list {name!r}: the ID-store chunk of load range {seq} was refused as past its deadline for "
                    f"{lists.write_retry_s:g} s (is the store's clock ahead of this host's?); the range stays pending: "
                    "a later load or `aeroqueue sweep` finishes it"
                ) from e
        time.sleep(0.1)


def recover(lists: JobLists, name: str) -> int:
    """Finish load ranges whose loader missed its lease (it died). Returns how many."""
    b = lists.backend
    head = lists.header(name)
    ranges = lists._list_udf(name, "expired")
    for r in ranges:
        tokens = list(range(r["start"], r["start"] + r["n"]))
        recs = b.batch_get(keys.JOB_SET, [keys.job_name(name, t) for t in tokens])
        foreign = [t for t, rec in zip(tokens, recs, strict=True) if rec is not None
                   and not keys.indexed_here(rec.bins, head["created"])]
        foreign_set = set(foreign)
        if foreign:
            # Left by a loader of a dropped list of this name (fenced out, killed before it
            # took them back): never this list's jobs. Deleted, then voided like unwritten ones.
            # Only while the list is still the one read: a recovery stopped before this point
            # while the list was dropped and loaded again would take the new list's jobs
            # for leftovers (`_delete_left_by_another`).
            _check_same_list(lists, name, head["created"])
            _delete_left_by_another(lists, keys.JOB_SET, [
                (keys.job_name(name, t), rec.bins["c"])
                for t, rec in zip(tokens, recs, strict=True) if rec is not None and t in foreign_set
            ])
            recs = [None if t in foreign_set else rec for t, rec in zip(tokens, recs, strict=True)]
        missing = [t for t, rec in zip(tokens, recs, strict=True) if rec is None]
        if missing:
            # Stamped as the loader's creates are, deadline included: a void create run
            # late by a resumed node would replace the job the loader (not dead after
            # all) wrote meanwhile, and the job would be lost.
            stamp = _Stamp(b, head["created"])
            writes = [Write(b.key(keys.JOB_SET, keys.job_name(name, t)), [op.write("state", "void"), stamp.op],
                            policy=_CREATE) for t in missing]
            if any(code != 0 for code in lists._batch_write(writes, "void unwritten tokens", stamp)):
                # The loader is alive after all and wrote some: start over next time.
                continue
        present = [
            (t, rec.bins["jid"]) for t, rec in zip(tokens, recs, strict=True)
            if rec is not None and rec.bins.get("state") != "void"
        ]
        void_bits(lists, name, [t for t, rec in zip(tokens, recs, strict=True)
                                if rec is None or rec.bins.get("state") == "void"], head["created"])
        real = commit_index(lists, name, head["created"], present)
        real_set = set(real)
        # Held back as the dead loader's publish would have (a gate or their own
        # run_at): not counted reservable, nor handed out only to be refused.
        timed = {t: rec.bins["due"] for t, rec in zip(tokens, recs, strict=True)
                 if t in real_set and rec is not None and rec.bins.get("state") == "delayed" and rec.bins.get("due")}
        finish_range(lists, name, head["mode"], r["seq"], real, timed=timed, recovered=True, created=head["created"])
    return len(ranges)


def _sealed_again(
    b: Backend, name: str, created: int, specs: Iterable[JobSpec], progress: Callable[[int], None] | None,
    on_range: Callable[[LoadReport], None] | None = None,
) -> LoadReport:
    """A sealed list takes no new job; loading what it already holds is a no-op."""
    n = new = 0
    first: JobSpec | None = None
    for batch in _chunks(specs, SEALED_CHECK_BATCH):
        n += len(batch)
        missing = _not_indexed(b, name, created, batch)
        new += len(missing)
        first = first or next(iter(missing), None)
        if on_range:
            on_range(LoadReport(loaded=0, skipped=len(batch) - len(missing), voided=0))
        if progress:
            progress(len(batch))
    if first is not None:
        # Which one, not only how many: the first found, by id and line.
        where = f" (line {first.line})" if first.line else ""
        raise ListSealed(f"list {name!r} is sealed: {new:,} of these {n:,} jobs are not in it and cannot be added, "
                         f"the first job {first.jid!r}{where}")
    return LoadReport(loaded=0, skipped=n, voided=0, already_sealed=True)


def _delete_left_by_another(lists: JobLists, set_name: str, left: Iterable[tuple[str, int]]) -> None:
    """Delete records (name, stamp read) that another list of the name wrote: a loader
    of a dropped list, fenced out and killed before it took its writes back. Each only
    while it holds the very stamp read (bin "c"): the callers check first that their
    list is still the one they read, and a caller stopped between that check and this
    delete, while its list was dropped and made again, would otherwise delete the new
    list's records (stamped by it, so "not ours" to a filter on the caller's stamp).
    One record: `transitions.delete_left_by`."""
    by_stamp: dict[int, list[str]] = collections.defaultdict(list)
    for name, stamp in left:
        by_stamp[stamp].append(name)
    for stamp, names in by_stamp.items():
        lists._delete_all(set_name, names, only=stamped(stamp))


def _not_indexed(b: Backend, name: str, created: int, batch: list[JobSpec]) -> list[JobSpec]:
    """The jobs of `batch` the list made at `created` does not hold (by its job-id index)."""
    return _split_indexed(b, name, created, batch)[0]


def _split_indexed(b: Backend, name: str, created: int, batch: list[JobSpec]) -> tuple[list[JobSpec], list[int]]:
    """`_not_indexed`, and the tokens of the others (as their index entries say)."""
    recs = b.batch_get(keys.JIDX_SET, [keys.jidx_name(name, s.jid) for s in batch], bins=keys.INDEX_BINS)
    new, tokens = [], []
    for s, r in zip(batch, recs, strict=True):
        if r is None or not keys.indexed_here(r.bins, created):
            new.append(s)
        elif type(tok := r.bins.get("tok")) is int:
            tokens.append(tok)
    return new, tokens


def _specs(jobs: Iterable[Any], limit: int) -> Iterable[JobSpec]:
    """Jobs checked whole already (`Checked`: the CLI's file) pass through lazily; any
    other input, JobSpecs too, is checked whole first (`from_iterable`): a bad item
    found once the first ranges were written would leave the load half done."""
    if isinstance(jobs, Checked):
        return jobs
    return from_iterable(jobs, max_payload=limit)
