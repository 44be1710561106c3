"""A Spark task's work: scan a range of partitions, upsert, commit, then mark.

Why nothing is lost and nothing is doubled: a record is marked only after
the commit that holds its row, so a crash anywhere leaves it unmarked and
the next scan copies it again; copying again is an upsert of the same key,
so the row is there once. A record whose payload or result cannot be stored
goes to ``sync_rejects`` with the reason and stays unmarked, so retention
never deletes it and every run tries it again.

Only counts leave a task; while it runs it reports rows copied per list in
a record of its own (set ``aq_sync``) for the driver's progress bar.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from ..backends import Backend, open_backend
from ..errors import BackendError, SyncError
from .mark import Clock, mark_unchanged, put_sync_record, retain, server_clock
from .options import Counts, SyncFaults, SyncOptions
from .scan import Batch, batches
from .schema import (
    JOB_COLUMNS,
    JOB_KEY,
    JOBS_TABLE,
    REJECT_COLUMNS,
    REJECT_KEY,
    REJECTS_TABLE,
    reject_row,
)
from .write import Sink

log = logging.getLogger(__name__)

# Tries of a batch's transaction that ends in a deadlock or a lock wait timeout, and
# the pause before the second (doubling after).
DEADLOCK_RETRIES = 5
DEADLOCK_PAUSE_S = 0.1
PAUSE_LIMIT_S = 60.0

T = TypeVar("T")


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


def read_ahead(source: Iterator[T], depth: int = 1) -> Iterator[T]:
    """The items of `source`, read by a thread of its own at most `depth` items
    ahead of the consumer.

    A task's scan of the store then overlaps its upsert and commit: both mostly
    wait on another process (the store, the database), so the two halves of a
    task run side by side even under the GIL. Memory stays bounded: the batch
    being written, `depth` waiting, one being read. An error in `source` is
    raised to the consumer where the item would have been.
    """
    handoff: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in source:
                if not put(item):
                    return
            put(_END)
        except BaseException as e:  # handed to the consumer, raised there
            put(_Failed(e))

    reader = threading.Thread(target=pump, name="sync-scan", daemon=True)
    reader.start()
    try:
        while True:
            item = handoff.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        # The consumer is done or failed: the reader stops at its next handoff
        # (a scan page at most), and the scan is closed in this thread.
        stop.set()
        reader.join()
        close = getattr(source, "close", None)
        if close is not None:
            close()


def progress_name(run_id: str, begin: int) -> str:
    """The record a task reports its progress in: one per task, under the run."""
    return f"{run_id}/{begin}"


# (list, jid) pairs a statement of `_replace_legacy_rows`: well inside any server's limits.
LEGACY_DELETE_ROWS = 500


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
        self.mark_bin = options.target.mark_bin
        self.per_list: Counter[str] = Counter()
        self._commits = 0
        self._legacy: dict[str, bool] = {}  # list -> the table holds rows of it copied before migration 4
        self._report_as = ""
        self._clock: Clock | None = None

    def run(self, begin: int, count: int) -> Counts:
        self._report_as = progress_name(self.options.run_id, begin) if self.options.run_id else ""
        # Before the scan's first page: a record not updated since is exactly as the scan reads it.
        self._clock = server_clock(self.backend)
        for batch in read_ahead(batches(self.backend, self.options, begin, count, self.synced_at)):
            self.counts.scanned += batch.scanned
            self.counts.scan_s += batch.scan_s
            self._flush(batch)
        if self.options.delete_after_s is not None:
            t0 = time.perf_counter()
            self.counts.deleted += retain(self.backend, self.mark_bin, begin, count, int(self.options.delete_after_s * 1000))
            self.counts.retain_s += time.perf_counter() - t0
        return self.counts

    def _flush(self, batch: Batch) -> None:
        if not len(batch):
            return
        t0 = time.perf_counter()
        refused = self._write(batch)
        self.counts.write_s += time.perf_counter() - t0
        self.counts.batches += 1
        self._commits += 1
        self.counts.rejected += len(batch.rejects) + len(refused)
        self.counts.copied += len(batch.rows) - len(refused)
        self._fault_after_commit()
        t0 = time.perf_counter()
        refused_at = {i for i, _ in refused}
        keep = [i for i in range(len(batch.rows)) if i not in refused_at]
        assert self._clock is not None
        if refused_at:
            names, versions = [batch.names[i] for i in keep], [batch.versions[i] for i in keep]
        else:
            names, versions = batch.names, batch.versions
        marks = mark_unchanged(self.backend, self.mark_bin, names, versions, self._clock)
        self.counts.marked += marks[0]
        self.counts.vanished += marks[1]
        if marks.too_big:
            self.counts.unmarked += len(marks.too_big)
            log.warning("%d copied job(s) could not be marked: their records are at the namespace's max-record-size "
                        "(e.g. %s); every run copies them again", len(marks.too_big), marks.too_big[0],
                        extra={"event": "marks_too_big", "jobs": len(marks.too_big)})
        self.counts.mark_s += time.perf_counter() - t0
        self.per_list.update(batch.rows[i][0] for i in keep)
        self._report()
        f = self.faults
        if f.kill_after_batches and self.counts.batches == f.kill_after_batches:
            self.sink.kill()

    def _fault_after_commit(self) -> None:
        f = self.faults
        if self.attempt != 0:
            return
        if f.die_after_commits and self._commits == f.die_after_commits:
            if f.die_by_exit:
                os._exit(17)
            raise SyncError("fault injection: the task died after its commit, before marking")
        if f.pause_after_commits and self._commits == f.pause_after_commits and f.pause_dir:
            here = Path(f.pause_dir)
            (here / f"paused-{os.getpid()}").touch()
            give_up = time.monotonic() + PAUSE_LIMIT_S
            mine = here / f"go-{os.getpid()}"  # lets this task go alone
            while not ((here / "go").exists() or mine.exists()) and time.monotonic() < give_up:
                time.sleep(0.05)

    def _replace_legacy_rows(self, batch: Batch) -> None:
        """Rows copied before migration 4 hold created 0 (their list's stamp unknown):
        the batch's jobs take the place of such rows of their (list, jid), in the
        batch's transaction, as a copy took the row of its (list, jid) before the
        migration; else a job copied again since (a kick, a resync) would get a second
        row. Asked once a task for each list whether the table holds any: one probe of
        the unique key's (list, created) prefix (a table made since holds none)."""
        sink = self.sink
        ph = sink.dialect.placeholder
        for name in {row[0] for row in batch.rows} - self._legacy.keys():
            self._legacy[name] = bool(sink.execute(
                f"SELECT 1 FROM {JOBS_TABLE} WHERE list = {ph} AND created = 0 LIMIT 1", (name,)))
        # list, jid; created is last (JOB_COLUMNS)
        pairs = [(row[0], row[1]) for row in batch.rows if row[-1] != 0 and self._legacy[row[0]]]
        for at in range(0, len(pairs), LEGACY_DELETE_ROWS):
            part = pairs[at:at + LEGACY_DELETE_ROWS]
            # The whole unique key, row by row: each row found by the index.
            sink.execute(f"DELETE FROM {JOBS_TABLE} WHERE (list, created, jid) IN "
                         f"({', '.join([f'({ph}, 0, {ph})'] * len(part))})", [v for pair in part for v in pair])

    def _replace_legacy_rejects(self, rejects: list[tuple[Any, ...]]) -> None:
        """Rejects written before migration 5 hold created 0 (their list's stamp
        unknown): a reject of their (list, token) takes their place, as it took their
        row before, rather than stand beside them as a second reject of one job.
        Rejects are few: no probe first."""
        pairs = [(r[0], r[1]) for r in rejects if r[-1] != 0]  # list, token; created is last (REJECT_COLUMNS)
        ph = self.sink.dialect.placeholder
        for at in range(0, len(pairs), LEGACY_DELETE_ROWS):
            part = pairs[at:at + LEGACY_DELETE_ROWS]
            self.sink.execute(f"DELETE FROM {REJECTS_TABLE} WHERE (list, created, token) IN "
                              f"({', '.join([f'({ph}, 0, {ph})'] * len(part))})", [v for pair in part for v in pair])

    def _write(self, batch: Batch) -> list[tuple[int, str]]:
        """Upsert a batch and its rejects in one transaction; retried on a deadlock."""
        sink = self.sink
        for attempt in range(DEADLOCK_RETRIES):
            try:
                self._replace_legacy_rows(batch)
                refused = sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, batch.rows, newer="done_at")
                rejects = batch.rejects + [
                    reject_row(batch.bins[i], reason, self.synced_at) for i, reason in refused
                ]
                self._replace_legacy_rejects(rejects)
                sink.upsert(REJECTS_TABLE, REJECT_COLUMNS, REJECT_KEY, rejects)
                sink.commit()
                return refused
            except Exception as e:
                if not sink.dialect.is_error(e):
                    raise
                sink.rollback()
                if sink.dialect.transient(e) and attempt + 1 < DEADLOCK_RETRIES:
                    # Doubling, and spread: two tasks that deadlocked, retried after the
                    # same pause, met again (50 and 100 ms were shorter than one batch's load).
                    time.sleep(DEADLOCK_PAUSE_S * 2 ** attempt * random.uniform(0.5, 1.5))
                    continue
                raise sink.fail(e, f"writing a batch of {len(batch)} row(s)") from None
        raise AssertionError("unreachable")

    def _report(self) -> None:
        """Rows copied so far per list, for the driver's progress bar (best effort)."""
        if not self._report_as:
            return
        # Progress is a courtesy: never fail a task for it.
        with contextlib.suppress(BackendError):
            put_sync_record(self.backend, self._report_as, {"lists": dict(self.per_list), "attempt": self.attempt})


def _task_attempt() -> int:
    try:
        from pyspark import TaskContext
    except ImportError:
        return 0
    ctx = TaskContext.get()
    return int(ctx.attemptNumber()) if ctx is not None else 0


# One backend per store URL per Python worker: Spark reuses its Python workers
# across tasks, and connecting to a cluster costs more than a small task.
_BACKENDS: dict[str, Backend] = {}


def _backend(url: str) -> Backend:
    backend = _BACKENDS.get(url)
    if backend is None:
        # Never create a store: an executor that sees another filesystem must fail, not copy nothing.
        backend = _BACKENDS[url] = open_backend(url, create=False)
    return backend


def sync_ranges(options: SyncOptions, synced_at: int, parts: Iterable[tuple[int, int]]) -> Iterator[dict[str, Any]]:
    """A Spark task: sync its ranges of partitions; yields one dict of counts.

    Uses its worker's backend for the store (opened from the URL string:
    nothing but plain values crosses to an executor) and its own connection
    to the target.
    """
    parts = list(parts)
    counts = Counts(tasks=1)
    try:
        backend = _backend(options.store_url)
        with Sink(options.target) as sink:
            worker = RangeSync(options, backend, sink, synced_at, _task_attempt())
            for begin, count in parts:
                worker.run(begin, count)
            counts.add(worker.counts)
    except BackendError as e:
        raise SyncError(f"the store failed during the sync: {options.target.redact(str(e))}") from None
    yield asdict(counts)
