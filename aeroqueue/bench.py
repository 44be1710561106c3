"""`aeroqueue bench`: reserve + complete throughput and latency, by list size.

It prints figures, it asserts nothing: the O(1) claim shows as the ratio of
reserve latency on the largest list to the smallest (about 1.0 when the cost
does not grow with the list), and the round trips per job are counted at the
backend boundary.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.operations import operations as op

from . import blocks, keys, udfs
from .backends import Backend, open_backend
from .errors import BackendError, ConfigError
from .lists import JobLists
from .loading import Checked, JobSpec
from .queue import Queue
from .sessions import Session

RECORD_NOT_FOUND = 2  # Aerospike's code: deleting what is already gone is fine


@dataclass
class BenchRow:
    jobs_in_list: int
    path: str  # "single" or "batch N"
    measured: int  # jobs reserved and completed
    jobs_per_s: float
    reserve_p50_ms: float
    reserve_p99_ms: float
    complete_p50_ms: float
    complete_p99_ms: float
    round_trips_per_job: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def measure(backend: Backend, list_name: str, jobs: int, batch: int, advance: Callable[[int], Any] | None = None) -> BenchRow:
    """Reserve and complete `jobs` jobs of a loaded list, `batch` at a time (1: the single path)."""
    queue = Queue(backend)
    session = Session.open(backend)
    reserve_ms: list[float] = []
    complete_ms: list[float] = []
    done = 0
    trips0 = backend.round_trips
    t0 = time.perf_counter()
    while done < jobs:
        a = time.perf_counter()
        got = queue.reserve(list_name, session, min(batch, jobs - done))
        b = time.perf_counter()
        if not got:
            break
        if batch == 1:
            queue.complete(got[0], "ok")
        else:
            queue.complete_many(got, ["ok"] * len(got))
        c = time.perf_counter()
        reserve_ms.append((b - a) * 1000 / len(got))
        complete_ms.append((c - b) * 1000 / len(got))
        done += len(got)
        if advance is not None:
            advance(len(got))
    elapsed = time.perf_counter() - t0
    trips = backend.round_trips - trips0
    session.close()
    return BenchRow(
        jobs_in_list=0,
        path="single" if batch == 1 else f"batch {batch}",
        measured=done,
        jobs_per_s=done / elapsed if elapsed else 0.0,
        reserve_p50_ms=_pct(reserve_ms, 50),
        reserve_p99_ms=_pct(reserve_ms, 99),
        complete_p50_ms=_pct(complete_ms, 50),
        complete_p99_ms=_pct(complete_ms, 99),
        # The session's open and close are not per job.
        round_trips_per_job=(trips - 1) / done if done else 0.0,
    )


@contextlib.contextmanager
def _store(url: str | None, create: bool = True) -> Iterator[tuple[Backend, bool]]:
    """The store to measure, and whether it is a scratch one: the URL's (its
    modules verified), or a scratch embedded store, so that a user's own store
    is never touched by default."""
    with contextlib.ExitStack() as stack:
        scratch = url is None
        if scratch:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="aeroqueue-bench-"))
            url = f"embedded://{Path(tmp) / 'bench.db'}"
        backend = open_backend(url, create=create or scratch)
        stack.callback(backend.close)
        udfs.register(backend) if backend.is_embedded else udfs.verify(backend)
        yield backend, scratch


@contextlib.contextmanager
def _cleanup(backend: Backend, scratch: bool) -> Iterator[list[tuple[str, int]]]:
    """Collects (list, size) as lists are made; drops them all at the end, whatever
    happens, unless the whole store is a scratch one that goes away anyway."""
    made: list[tuple[str, int]] = []
    try:
        yield made
    finally:
        if not scratch:
            for name, size in made:
                drop_list(backend, name, (f"j{i}" for i in range(size)))


def run(
    url: str | None,
    sizes: list[int],
    *,
    sample: int = 2000,
    batch: int = 50,
    mode: str = "tokens",
    progress: Any = None,
    create: bool = True,
) -> list[BenchRow]:
    """Load a list of each size, then measure the single and the batch path on it.
    Every list it made is removed at the end (a scratch store is removed whole)."""
    with _store(url, create) as (backend, scratch), _cleanup(backend, scratch) as made:
        lists = JobLists(backend)
        rows = []
        for size in sizes:
            name = f"bench-{size}-{uuid.uuid4().hex[:6]}"
            made.append((name, size))
            task = progress.add_task(f"loading {size:,} jobs", total=size) if progress else None
            lists.load(
                name,
                Checked(JobSpec(f"j{i}", {"i": i}) for i in range(size)),
                mode=mode,
                chunk_size=1000,
                progress=functools.partial(progress.advance, task) if progress else None,
            )
            for b in (1, batch):
                n = min(sample if b == 1 else sample * 5, size // 2)
                task = progress.add_task(f"measuring {'single' if b == 1 else f'batch {b}'} on {size:,}", total=n) if progress else None
                row = measure(backend, name, n, b, functools.partial(progress.advance, task) if progress else None)
                row.jobs_in_list = size
                rows.append(row)
        return rows


def drop_list(backend: Backend, name: str, jids: Iterable[str], *, chunk: int = 5000) -> int:
    """Delete every record of a list the benchmark made (jobs, id index, bitmaps, ID
    chunks, the list record last): batch deletes, `chunk` records a round trip.
    Returns how many records were deleted."""
    head = backend.get(keys.LIST_SET, name)
    if head is None:
        return 0
    alloc = int(head.bins.get("alloc") or 0)
    ranges = int(head.bins.get("seq") or 0)
    names: Iterator[tuple[str, str]] = itertools.chain(
        ((keys.BLOCK_SET, n) for n in blocks.names_upto(name, alloc)),  # first, as a drop does
        ((keys.JOB_SET, keys.job_name(name, t)) for t in range(alloc)),
        ((keys.JIDX_SET, keys.jidx_name(name, jid)) for jid in jids),
        ((keys.DONE_SET, keys.chunk_name(name, c)) for c in range(-(-alloc // keys.BITS_PER_CHUNK))),
        ((keys.IDS_SET, keys.chunk_name(name, c)) for c in range(ranges)),
    )
    deleted = 0
    while batch := list(itertools.islice(names, chunk)):
        deleted += _delete(backend, batch)
    return deleted + _delete(backend, [(keys.LIST_SET, name)])


def _delete(backend: Backend, names: list[tuple[str, str]]) -> int:
    backend.round_trips += 1
    out = backend.client.batch_write(BatchRecords([Write(backend.key(s, n), [op.delete()]) for s, n in names]))
    codes = [br.result for br in out.batch_records]
    bad = sorted({c for c in codes if c not in (0, RECORD_NOT_FOUND)})
    if bad:
        raise BackendError(f"deleting the benchmark's records failed (codes {bad})", operation="batch_write delete")
    return codes.count(0)


def o1_ratio(rows: list[BenchRow], path: str) -> float | None:
    """Reserve p50 on the largest list over the smallest: ~1.0 means O(1) in the list's size."""
    chosen = sorted((r for r in rows if r.path == path), key=lambda r: r.jobs_in_list)
    if len(chosen) < 2 or not chosen[0].reserve_p50_ms:
        return None
    return chosen[-1].reserve_p50_ms / chosen[0].reserve_p50_ms


@dataclass
class DesignRow:
    design: str
    jobs_per_s: float
    round_trips_per_job: float
    vs_untracked: float  # throughput relative to claims nobody could find


@contextlib.contextmanager
def _index_back(backend: Backend) -> Iterator[None]:
    """Whatever happens, leave the reaper's index in place."""
    try:
        yield
    finally:
        backend.create_index(keys.JOB_SET, "sess", keys.SESS_INDEX)


def compare_claim_designs(url: str | None, *, jobs: int = 3000, list_size: int = 20_000, create: bool = True) -> list[DesignRow]:
    """How a reaper finds a dead session's claims, measured on the single path:

    - untracked: no way to find them (the job-list benchmark before sessions);
    - index: a secondary index on the job's ``sess`` bin (what aeroqueue uses):
      the server maintains it on the claim write, no extra round trip;
    - intent: the job key appended to the session record's ``claims`` list
      before each claim (design.md's other option): one more round trip per
      reservation, even before pruning the list on acknowledgement is counted.
    """
    from aerospike_helpers.operations import list_operations as lo

    from . import keys

    with _store(url, create) as (backend, scratch), _cleanup(backend, scratch) as made, _index_back(backend):
        if not scratch and any(True for _ in backend.scan(keys.SESS_SET, bins=["state"])):
            # "untracked" drops the reaper's index for a while: not under live workers.
            raise ConfigError(
                f"bench --claims drops the reaper's index for a while: refused on {backend.url}, which has "
                "open sessions; run it on a scratch store (no --url) or a store nobody uses"
            )
        lists = JobLists(backend)
        queue = Queue(backend)
        results: dict[str, tuple[float, float]] = {}
        for design in ("untracked", "index", "intent"):
            if design == "untracked":
                backend.client.index_remove(backend.namespace, keys.SESS_INDEX)
            elif design == "index":
                backend.create_index(keys.JOB_SET, "sess", keys.SESS_INDEX)
            name = f"design-{design}-{uuid.uuid4().hex[:6]}"
            made.append((name, list_size))
            lists.load(name, Checked(JobSpec(f"j{i}", {"i": i}) for i in range(list_size)), chunk_size=1000)
            session = Session.open(backend, heartbeat=False)
            trips0, t0 = backend.round_trips, time.perf_counter()
            for _ in range(jobs):
                if design == "intent":
                    backend.operate(keys.SESS_SET, session.id, [lo.list_append("claims", f"{name}/next")])
                [job] = queue.reserve(name, session, 1)
                queue.complete(job, "ok")
            elapsed = time.perf_counter() - t0
            results[design] = (jobs / elapsed, (backend.round_trips - trips0) / jobs)
            session.close(release=False)
        base = results["untracked"][0]
        return [DesignRow(d, r[0], r[1], r[0] / base) for d, r in results.items()]
