"""The sync benchmark: rows per second copied by the Spark sync, beside a plain
single-process Python loop over the same rows, in the same run.

Both copy the same processed jobs, written for the purpose straight into a
list of the benchmark's own with batch writes (the records a worker would
have left: ``done`` with a result, one in 20 ``dead`` with an error):

- the plain loop, first: one process, one scan of all 4096 partitions with
  the same filter and row encoding, the sync's own write (`Sink.copy`: LOAD
  DATA LOCAL on MySQL) in batches and a commit per batch. It does not mark records (that would take them away from the
  Spark run), so it is the floor of what a copy costs;
- then the Spark sync as ``aeroqueue sync`` runs it: tasks over partition
  ranges that scan, load, commit and mark;
- last, the target alone (the floor of any copy into it): the same rows,
  built in memory in the order a scan returns them (by partition, then
  digest), written by one connection with the sync's own write (`Sink.copy`),
  batch size and commits; only the time spent in the writes and commits counts.
  No copy into that target can be faster than this.

Each writes into a target of its own (two scratch databases on the MySQL
server given, dropped afterwards; or two SQLite files). The store is a
scratch embedded store, or the Aerospike server given, where only the
benchmark's own list is read, marked, and deleted afterwards.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import aerospike
from aerospike_helpers.operations import operations as op

from .. import keys, udfs
from ..backends import Backend, open_backend
from ..backends.base import N_PARTITIONS
from ..errors import SyncError
from ..lists import JobLists
from .job import run_sync, spark_session
from .options import DEFAULT_BATCH, DEFAULT_PARTITIONS, Counts, SyncOptions
from .scan import SCAN_BINS, to_copy
from .schema import JOB_COLUMNS, JOB_KEY, JOBS_TABLE, Refused, job_row, migrate
from .target import Target, parse_target
from .write import Sink

DEFAULT_JOBS = 100_000
DEAD_EVERY = 20  # one job in 20 failed its only attempt: the copy holds dead jobs too
WRITE_CHUNK = 1000


@dataclass
class BenchResult:
    jobs: int
    store: str
    target: str
    master: str
    partitions: int
    plain_rows: int
    plain_s: float
    spark_rows: int
    spark_s: float
    spark_start_s: float
    prepare_s: float
    spark_counts: Counts
    floor_rows: int = 0
    floor_s: float = 0.0

    @property
    def plain_rows_per_s(self) -> float:
        return self.plain_rows / self.plain_s if self.plain_s else 0.0

    @property
    def spark_rows_per_s(self) -> float:
        return self.spark_rows / self.spark_s if self.spark_s else 0.0

    @property
    def floor_rows_per_s(self) -> float:
        return self.floor_rows / self.floor_s if self.floor_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["plain_rows_per_s"] = round(self.plain_rows_per_s)
        out["spark_rows_per_s"] = round(self.spark_rows_per_s)
        out["floor_rows_per_s"] = round(self.floor_rows_per_s)
        return out


def _job(list_name: str, token: int, now: int) -> list[dict]:
    return [op.write(k, v) for k, v in _bins(list_name, token, now).items()]


def _bins(list_name: str, token: int, now: int) -> dict[str, Any]:
    bins: dict[str, Any] = {
        "list": list_name, "token": token, "jid": f"job-{token}", "att": 1, "max_att": 1, "done_at": now + token,
        "payload": {"customer": token % 977, "email": f"user{token}@example.com", "n": token},
    }
    if token % DEAD_EVERY == DEAD_EVERY - 1:
        bins.update(state="dead", err="bounced")
    else:
        bins.update(state="done", result={"sent": True, "token": token})
    return bins


def prepare(backend: Backend, list_name: str, jobs: int, progress: Callable[[int], None] | None = None) -> None:
    """`jobs` processed job records in a new list, by batch writes (a few at once)."""
    JobLists(backend).create(list_name, max_attempts=1)
    now = time.time_ns() // 1_000_000

    def write(start: int) -> int:
        end = min(jobs, start + WRITE_CHUNK)
        items = [(keys.job_name(list_name, t), _job(list_name, t, now)) for t in range(start, end)]
        failed = [code for code in backend.batch_operate(keys.JOB_SET, items) if code != 0]
        if failed:
            raise SyncError(f"writing the benchmark's jobs failed (Aerospike code {failed[0]})")
        return end - start

    done = 0
    # The embedded store writes one batch at a time anyway; a server takes a few at once.
    with ThreadPoolExecutor(1 if backend.is_embedded else 4) as pool:
        for n in pool.map(write, range(0, jobs, WRITE_CHUNK)):
            done += n
            if progress and done % 100_000 < WRITE_CHUNK:
                progress(done)


def remove_list(backend: Backend, list_name: str, jobs: int) -> None:
    """Delete the benchmark's job records and list header."""
    for start in range(0, jobs, WRITE_CHUNK):
        names = [keys.job_name(list_name, t) for t in range(start, min(jobs, start + WRITE_CHUNK))]
        backend.batch_operate(keys.JOB_SET, [(n, [op.delete()]) for n in names])
    backend.remove(keys.LIST_SET, list_name)


def plain_loop(backend: Backend, options: SyncOptions) -> int:
    """The baseline: one process scans every partition and writes the rows as the sync does."""
    copied = 0
    with Sink(options.target) as sink:
        rows: list[tuple[Any, ...]] = []
        # Page by page, as the sync's tasks read (no object per record).
        for page in backend.scan_pages(keys.JOB_SET, expression=to_copy(options), bins=SCAN_BINS,
                                       page_size=options.page_size):
            for _key, _meta, bins in page:
                try:
                    rows.append(job_row(bins, 0))
                except Refused:
                    continue
                if len(rows) >= options.batch_size:
                    sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows, newer="done_at")
                    sink.commit()
                    copied += len(rows)
                    rows = []
        sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows, newer="done_at")
        sink.commit()
        copied += len(rows)
    return copied


def scan_order(list_name: str, jobs: int) -> list[int]:
    """The tokens in the order a scan of all partitions returns their records:
    by partition, then digest (what a task's scan hands over, page after page)."""

    def where(token: int) -> tuple[int, bytearray]:
        digest = aerospike.calc_digest("test", keys.JOB_SET, keys.job_name(list_name, token))  # namespace: not hashed
        return int.from_bytes(digest[:2], "little") & (N_PARTITIONS - 1), digest

    return sorted(range(jobs), key=where)


def target_floor(target: Target, list_name: str, jobs: int, batch_size: int, now: int) -> tuple[int, float]:
    """The target alone: the benchmark's rows, in scan order, written by one
    connection in batches with a commit each; (rows, seconds in the writes
    and commits). Building the rows is not counted: this is the floor of a
    copy into this target, whatever reads the store."""
    order = iter(scan_order(list_name, jobs))
    rows = spent = 0.0
    with Sink(target) as sink:
        while chunk := list(islice(order, batch_size)):
            batch = [job_row(_bins(list_name, t, now), now) for t in chunk]
            t0 = time.perf_counter()
            refused = sink.copy(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, batch, newer="done_at")
            sink.commit()
            spent += time.perf_counter() - t0
            if refused:
                raise SyncError(f"benchmark check failed: {target} refused {len(refused)} row(s): {refused[0][1]}")
            rows += len(batch)
    return int(rows), spent


def count_rows(target: Target) -> int:
    with Sink(target) as sink:
        return int(sink.execute(f"SELECT COUNT(*) FROM {JOBS_TABLE}")[0][0])


PATHS = ("plain", "spark", "floor")


@contextmanager
def scratch_targets(target_url: str | None, workdir: Path) -> Iterator[tuple[Target, ...]]:
    """An empty target per path (`PATHS`): scratch databases on the MySQL server
    of `target_url` (dropped afterwards), or SQLite files in `workdir`."""
    base = parse_target(target_url) if target_url else None
    tag = uuid.uuid4().hex[:10]
    if base is None or base.dialect != "mysql":
        # Files of this run's own (a run before may have left its own, and their
        # rows would count here), removed afterwards like the scratch databases.
        stem = Path(base.path) if base else workdir / "sync.db"
        files = [stem.with_suffix(f".bench-{tag}.{p}.db") for p in PATHS]
        try:
            yield tuple(Target(dialect="sqlite", path=str(f)) for f in files)
        finally:
            for f in files:
                for extra in ("", "-wal", "-shm", "-journal"):
                    Path(str(f) + extra).unlink(missing_ok=True)
        return
    # Generated names: safe identifiers (a database name cannot be a parameter).
    names = [f"aq_bench_{tag}_{p}" for p in PATHS]
    with Sink(base) as admin:
        try:
            for name in names:
                admin.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        except Exception as e:
            if not admin.dialect.is_error(e):
                raise
            raise SyncError(f"the benchmark needs to create scratch databases on {base}: {base.redact(str(e))}") from None
        try:
            yield tuple(replace(base, database=name) for name in names)
        finally:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name}")


def run_bench(
    *,
    jobs: int = DEFAULT_JOBS,
    store_url: str | None = None,
    target_url: str | None = None,
    master: str | None = None,
    partitions: int = DEFAULT_PARTITIONS,
    batch_size: int = DEFAULT_BATCH,
    say: Callable[[str], None] = lambda _m: None,
) -> BenchResult:
    """Write `jobs` processed jobs into a list of the benchmark's own, then time both copies."""
    with tempfile.TemporaryDirectory(prefix="aq-sync-bench-") as tmp:
        work = Path(tmp)
        url = store_url or f"embedded://{work / 'store.db'}"
        backend = open_backend(url)
        list_name = f"aq-bench-{uuid.uuid4().hex[:10]}"
        try:
            udfs.ensure(backend)
            t0 = time.monotonic()
            say(f"writing {jobs:,} processed jobs into list {list_name} of {backend.url} (batch writes)...")
            try:
                prepare(backend, list_name, jobs, lambda n: say(f"  {n:,} written"))
                prepare_s = time.monotonic() - t0
                with scratch_targets(target_url, work) as (plain_target, spark_target, floor_target):
                    plain = SyncOptions(store_url=url, target=plain_target, partitions=partitions,
                                        batch_size=batch_size, lists=(list_name,))
                    spark_options = replace(plain, target=spark_target)
                    for t in (plain_target, spark_target, floor_target):
                        with Sink(t) as sink:
                            migrate(sink)
                    say("plain loop: scan + load in one process...")
                    t0 = time.monotonic()
                    plain_rows = plain_loop(backend, plain)
                    plain_s = time.monotonic() - t0
                    say("starting Spark...")
                    t0 = time.monotonic()
                    spark, created = spark_session(master, "aeroqueue-sync-bench")
                    spark_start_s = time.monotonic() - t0
                    try:
                        say("Spark sync: scan + load + commit + mark, in tasks...")
                        t0 = time.monotonic()
                        report = run_sync(spark_options, spark, backend)
                        spark_s = time.monotonic() - t0
                        used_master = str(spark.sparkContext.master)
                    finally:
                        if created:
                            spark.stop()
                    say("the target alone: the same rows from memory, loaded by one connection...")
                    floor_rows, floor_s = target_floor(floor_target, list_name, jobs, batch_size,
                                                       time.time_ns() // 1_000_000)
                    for t, want in ((plain_target, plain_rows), (spark_target, report.counts.copied),
                                    (floor_target, floor_rows)):
                        got = count_rows(t)
                        if got != jobs or want != jobs:
                            raise SyncError(f"benchmark check failed: {t} holds {got:,} rows, copied {want:,}, expected {jobs:,}")
                    shown = str(spark_target) if spark_target.dialect == "sqlite" else str(spark_target).rsplit("/", 1)[0] + "/(scratch)"
            finally:
                if store_url is not None:
                    say(f"deleting list {list_name}...")
                    remove_list(backend, list_name, jobs)
        finally:
            backend.close()
    return BenchResult(
        jobs=jobs, store="embedded (scratch)" if store_url is None else str(backend.url), target=shown,
        master=used_master, partitions=partitions, plain_rows=plain_rows, plain_s=plain_s,
        spark_rows=report.counts.copied, spark_s=spark_s, spark_start_s=spark_start_s, prepare_s=prepare_s,
        spark_counts=report.counts, floor_rows=floor_rows, floor_s=floor_s,
    )
