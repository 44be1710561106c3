"""What a run is asked to do (`SyncOptions`), the faults tests inject, and what it did (`Counts`, `SyncReport`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..backends.base import N_PARTITIONS
from ..config import MEMORY, parse_url
from ..errors import SyncError
from .schema import REJECTS_TABLE
from .target import Target

DEFAULT_PARTITIONS = 64
# Rows per load (or upsert) and commit. 10,000 rather than 1,000: a tenth of
# the commits (each a redo log flush) and round trips, 1.4x to 1.85x faster
# into MariaDB (benchmarks/RESULTS.md), for a larger re-copy after a crash (one
# batch per task at most) and a coarser progress bar.
DEFAULT_BATCH = 10_000
# A batch also ends at this many bytes of row data (UTF-8), what a task holds
# and writes at once. Its upsert is cut into statements under the server's
# max_allowed_packet (16 MiB on MariaDB) by the sink (write.Sink._statements).
DEFAULT_BATCH_BYTES = 4 * 1024 * 1024
# Records per page of a task's scan: what a task holds at most, whatever the
# size of its partitions. 10,000 (a batch's worth, a few MiB) rather than 2,000:
# a fifth of the page requests, each of which the server answers by walking its
# partitions' resume points (Aerospike's CPU per row 13.4 against 15.8 us in the
# 1M-job benchmark, benchmarks/RESULTS.md).
DEFAULT_PAGE = 10000


@dataclass(frozen=True)
class SyncFaults:
    """Fault injection, for tests: where a run is made to fail or wait."""

    # The first attempt of every task dies right after its Nth commit, before marking.
    die_after_commits: int = 0
    # ... by os._exit (the Python worker crashes) rather than by raising.
    die_by_exit: bool = False
    # After N batches, each attempt's database connection is killed.
    kill_after_batches: int = 0
    # The first attempt of every task, after its Nth commit and before marking,
    # creates "paused-<pid>" in `pause_dir` and waits (up to 60 s) for "go" there
    # (or "go-<pid>", for that task alone): the moment a test stops MySQL or kills a process.
    pause_after_commits: int = 0
    pause_dir: str = ""


@dataclass(frozen=True)
class SyncOptions:
    """What a run needs, shipped to every Spark task (so: plain values only)."""

    store_url: str = field(repr=False)  # may hold credentials
    target: Target
    partitions: int = DEFAULT_PARTITIONS
    batch_size: int = DEFAULT_BATCH
    batch_bytes: int = DEFAULT_BATCH_BYTES
    page_size: int = DEFAULT_PAGE
    delete_after_s: float | None = None  # retention: delete jobs synced longer ago than this
    # Copy again what the target already holds (idempotent: an upsert of the same rows).
    resync: bool = False
    lists: tuple[str, ...] = ()  # only these lists (all when empty)
    since_ms: int | None = None  # only jobs processed at or after this time (done_at, Unix ms)
    run_id: str = ""  # tasks report progress under it when set
    faults: SyncFaults | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.partitions <= N_PARTITIONS:
            raise SyncError(f"partitions must be from 1 to {N_PARTITIONS}, not {self.partitions}")
        if self.batch_size < 1 or self.batch_bytes < 1 or self.page_size < 1:
            raise SyncError("batch size, batch bytes and page size must be at least 1")
        if self.delete_after_s is not None and self.delete_after_s < 0:
            raise SyncError("the retention grace period cannot be negative")
        if self.delete_after_s is not None and (self.lists or self.since_ms is not None):
            raise SyncError("retention (--delete-after) applies to the whole store: not with --list or --since")
        store = parse_url(self.store_url)
        if store.is_embedded and store.path == MEMORY:
            raise SyncError(
                "the in-memory embedded store is private to one process, Spark tasks cannot read it: "
                "use embedded:///path/store.db"
            )


@dataclass
class Counts:
    """What tasks did; summed on the driver. Only these numbers leave a task."""

    scanned: int = 0  # processed jobs read (unsynced for the target, or all of them for a resync)
    copied: int = 0  # rows committed to the target
    marked: int = 0  # records marked as held by the target
    vanished: int = 0  # copied, then gone from the store before marking (deleted): nothing to mark
    rejected: int = 0  # not copyable: in sync_rejects, left unsynced
    unmarked: int = 0  # copied, but the record has no room for the mark: copied again by every run
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
    resync: bool = False

    @property
    def rows_per_s(self) -> float:
        return self.counts.copied / self.seconds if self.seconds > 0 else 0.0

    @property
    def rejects_note(self) -> str:
        """Empty when nothing was rejected; else where the rejects are."""
        n = self.counts.rejected
        if not n:
            return ""
        return f"{n:,} job(s) could not be copied: their reasons are in table {REJECTS_TABLE} of {self.target}"

    def as_dict(self) -> dict[str, Any]:
        return {"target": self.target, "resync": self.resync, "lists": self.lists, "seconds": round(self.seconds, 3),
                "started_ms": self.started_ms, "rows_per_s": round(self.rows_per_s), "rejects_table": REJECTS_TABLE,
                **asdict(self.counts)}

    def __str__(self) -> str:
        c = self.counts
        verb = "resynced" if self.resync else "synced"
        text = (
            f"{verb} {c.copied:,} job(s) to {self.target} in {self.seconds:.1f}s "
            f"({self.rows_per_s:,.0f} rows/s; {c.marked:,} marked, {c.rejected:,} rejected; "
            f"{self.lists:,} list summaries)"
        )
        if c.unmarked:
            text += (f"; {c.unmarked:,} copied job(s) could not be marked (their records are at the "
                     "namespace's max-record-size): every run copies them again")
        if c.deleted:
            text += f"; deleted {c.deleted:,} synced job(s) past the grace period"
        return text


def ranges(partitions: int) -> list[tuple[int, int]]:
    """4096 partitions cut into `partitions` contiguous (begin, count) ranges of near-equal size."""
    base, extra = divmod(N_PARTITIONS, partitions)
    out, begin = [], 0
    for i in range(partitions):
        count = base + (1 if i < extra else 0)
        out.append((begin, count))
        begin += count
    return out
