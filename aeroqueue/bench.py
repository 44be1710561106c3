"""`aeroqueue bench`: reserve + complete throughput and latency, by list size.

It prints figures, it asserts nothing: the O(1) claim shows as the ratio of
reserve latency on the largest list to the smallest (about 1.0 when the cost
does not grow with the list), and the round trips per job are counted at the
backend boundary.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import udfs
from .backends import Backend, open_backend
from .lists import JobLists
from .loading import JobSpec
from .queue import Queue
from .sessions import Session


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


def measure(backend: Backend, list_name: str, jobs: int, batch: int) -> BenchRow:
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
def _store(url: str | None) -> Iterator[Backend]:
    """The store to measure: the URL's (its modules verified), or a scratch embedded
    store, so that a user's own store is never touched by default."""
    with contextlib.ExitStack() as stack:
        if url is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="aeroqueue-bench-"))
            url = f"embedded://{Path(tmp) / 'bench.db'}"
        backend = open_backend(url)
        stack.callback(backend.close)
        udfs.register(backend) if backend.is_embedded else udfs.verify(backend)
        yield backend


def run(
    url: str | None,
    sizes: list[int],
    *,
    sample: int = 2000,
    batch: int = 50,
    mode: str = "tokens",
    progress: Any = None,
) -> list[BenchRow]:
    """Load a list of each size, then measure the single and the batch path on it."""
    with _store(url) as backend:
        lists = JobLists(backend)
        rows = []
        for size in sizes:
            name = f"bench-{size}-{uuid.uuid4().hex[:6]}"
            task = progress.add_task(f"loading {size:,} jobs", total=size) if progress else None
            lists.load(
                name,
                (JobSpec(f"j{i}", {"i": i}) for i in range(size)),
                mode=mode,
                chunk_size=1000,
                progress=functools.partial(progress.advance, task) if progress else None,
            )
            for b in (1, batch):
                n = min(sample if b == 1 else sample * 5, size // 2)
                row = measure(backend, name, n, b)
                row.jobs_in_list = size
                rows.append(row)
        return rows


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


def compare_claim_designs(url: str | None, *, jobs: int = 3000, list_size: int = 20_000) -> list[DesignRow]:
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

    with _store(url) as backend:
        lists = JobLists(backend)
        queue = Queue(backend)
        results: dict[str, tuple[float, float]] = {}
        for design in ("untracked", "index", "intent"):
            if design == "untracked":
                backend.client.index_remove(backend.namespace, keys.SESS_INDEX)
            elif design == "index":
                backend.create_index(keys.JOB_SET, "sess", keys.SESS_INDEX)
            name = f"design-{design}-{uuid.uuid4().hex[:6]}"
            lists.load(name, (JobSpec(f"j{i}", {"i": i}) for i in range(list_size)), chunk_size=1000)
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
