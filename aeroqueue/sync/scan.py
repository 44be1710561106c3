"""Reading what to copy: processed jobs the target does not hold yet, streamed in batches.

A job is unsynced for a target while its mark bin (see `Target.mark_bin`)
is missing or names another version (its ``done_at``). The filter runs on
the server; the scan streams pages (`Backend.scan`), so a task holds one
page and one batch whatever the size of its partitions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from aerospike_helpers import expressions as exp

from .. import keys
from ..backends import Backend
from .options import SyncOptions
from .schema import Refused, job_row, reject_row
from .write import utf8_len

SCAN_BINS = ["list", "token", "jid", "state", "att", "payload", "result", "err", "done_at", "c"]

PROCESSED = exp.Or(exp.Eq(exp.StrBin("state"), "done"), exp.Eq(exp.StrBin("state"), "dead"))


def unsynced(mark_bin: str) -> Any:
    """The target holds no copy of this version of the job: no mark, or a mark of
    an older version (the job was kicked and processed again since)."""
    return exp.Or(exp.Not(exp.BinExists(mark_bin)), exp.NE(exp.IntBin(mark_bin), exp.IntBin("done_at")))


def synced(mark_bin: str) -> Any:
    """The target holds this very version of the job."""
    return exp.And(exp.BinExists(mark_bin), exp.Eq(exp.IntBin(mark_bin), exp.IntBin("done_at")))


def _any_list(names: Sequence[str]) -> Any:
    tests = [exp.Eq(exp.StrBin("list"), name) for name in names]
    return tests[0] if len(tests) == 1 else exp.Or(*tests)


def to_copy(options: SyncOptions) -> Any:
    """The compiled server-side filter of the jobs a run copies."""
    parts = [PROCESSED]
    if not options.resync:
        parts.append(unsynced(options.target.mark_bin))
    if options.lists:
        parts.append(_any_list(options.lists))
    if options.since_ms is not None:
        parts.append(exp.GE(exp.IntBin("done_at"), options.since_ms))
    # An And of one operand is refused by the server (code 4): `--resync` alone has one.
    return (parts[0] if len(parts) == 1 else exp.And(*parts)).compile()


@dataclass
class Batch:
    """Rows ready for one upsert, with what marking them needs."""

    names: list[str] = field(default_factory=list)  # job record names
    versions: list[Any] = field(default_factory=list)  # their done_at
    bins: list[dict[str, Any]] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rejects: list[tuple[Any, ...]] = field(default_factory=list)
    bytes: int = 0
    scanned: int = 0
    scan_s: float = 0.0

    def __len__(self) -> int:
        return len(self.rows) + len(self.rejects)

    def add(self, name: str, bins: dict[str, Any], synced_at: int) -> None:
        self.scanned += 1
        try:
            row = job_row(bins, synced_at)
        except Refused as e:
            self.rejects.append(reject_row(bins, str(e), synced_at))
            return
        self.names.append(name)
        self.versions.append(bins.get("done_at"))
        self.bins.append(bins)
        self.rows.append(row)
        # The payload and the result are what can be large (JOB_COLUMNS order).
        self.bytes += 128 + utf8_len(row[5] or "") + utf8_len(row[6] or "")


def batches(
    backend: Backend, options: SyncOptions, begin: int, count: int, synced_at: int
) -> Iterator[Batch]:
    """The range's jobs to copy, as batches of at most `batch_size` rows or `batch_bytes` bytes."""
    pages = backend.scan_pages(
        keys.JOB_SET, begin=begin, count=count, expression=to_copy(options), bins=SCAN_BINS,
        page_size=options.page_size,
    )
    batch = Batch()
    while True:
        t0 = time.perf_counter()
        page = next(pages, None)
        batch.scan_s += time.perf_counter() - t0
        if page is None:
            break
        for key, _meta, bins in page:
            batch.add(key[2], bins, synced_at)
            if len(batch) >= options.batch_size or batch.bytes >= options.batch_bytes:
                yield batch
                batch = Batch()
    if len(batch) or batch.scanned:
        yield batch
