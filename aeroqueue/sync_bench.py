"""`aeroqueue sync-bench`: rows per second copied by the Spark sync, beside a plain
single-process Python loop over the same rows, in the same run.

Both start from the same processed jobs in a scratch store:

- the plain loop, first: one process, one scan of all 4096 partitions with the
  same expression filter, the same row encoding, ``executemany`` in batches
  and a commit per batch. It does not mark records synced (that would take
  them away from the Spark run), so it is the floor of what a copy costs;
- then the Spark sync, as ``aeroqueue sync`` runs it: tasks over partition
  ranges that scan, upsert, commit and mark each record synced with a UDF.

Each writes into a target of its own (two scratch databases on the MySQL
server given, dropped afterwards; or two SQLite files). Spark's start-up is
reported apart from its run; the per-phase seconds are summed over tasks.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from . import keys, udfs
from .backends import Backend, open_backend
from .config import parse_url
from .lists import JobLists
from .loading import JobSpec
from .queue import Queue
from .sessions import Session
from .sync import (
    DEFAULT_BATCH,
    DEFAULT_PARTITIONS,
    JOB_COLUMNS,
    JOB_KEY,
    JOBS_TABLE,
    SCAN_BINS,
    UNSYNCED,
    Counts,
    Refused,
    Sink,
    SyncError,
    SyncOptions,
    Target,
    job_row,
    migrate,
    parse_target,
    run_sync,
    spark_session,
)

if TYPE_CHECKING:
    from .cli.context import Context

DEFAULT_JOBS = 100_000
DEAD_EVERY = 20  # one job in 20 fails its only attempt: the copy holds dead jobs too


@dataclass
class BenchResult:
    jobs: int
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

    @property
    def plain_rows_per_s(self) -> float:
        return self.plain_rows / self.plain_s if self.plain_s else 0.0

    @property
    def spark_rows_per_s(self) -> float:
        return self.spark_rows / self.spark_s if self.spark_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["plain_rows_per_s"] = round(self.plain_rows_per_s)
        out["spark_rows_per_s"] = round(self.spark_rows_per_s)
        return out


def prepare(backend: Backend, list_name: str, jobs: int, progress: Callable[[int], None] | None = None) -> None:
    """Load `jobs` jobs and process every one through the queue: done, or dead."""
    specs = (JobSpec(f"job-{i}", {"customer": i % 977, "email": f"user{i}@example.com", "n": i}) for i in range(jobs))
    JobLists(backend).load(list_name, specs, max_attempts=1, seal=True)
    q = Queue(backend)
    finished = 0
    with Session.open(backend) as s:
        while True:
            got = q.reserve(list_name, s, 1000)
            if not got:
                break
            for j in got:
                if j.token % DEAD_EVERY == DEAD_EVERY - 1:
                    q.fail(j, "bounced")
            ok = [j for j in got if j.token % DEAD_EVERY != DEAD_EVERY - 1]
            # Small acknowledgement batches: a batch's results travel as one map
            # argument that every job's UDF call receives whole.
            for i in range(0, len(ok), 50):
                chunk = ok[i:i + 50]
                q.complete_many(chunk, [{"sent": True, "token": j.token} for j in chunk])
            finished += len(got)
            if progress:
                progress(finished)


def plain_loop(backend: Backend, target: Target, batch_size: int) -> int:
    """The baseline: one process scans every partition and executemany's the rows."""
    copied = 0
    with Sink(target) as sink:
        rows: list[tuple[Any, ...]] = []
        for _name, rec in backend.scan(keys.JOB_SET, expression=UNSYNCED, bins=SCAN_BINS):
            try:
                rows.append(job_row(rec.bins, 0))
            except Refused:
                continue
            if len(rows) >= batch_size:
                sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows)
                sink.commit()
                copied += len(rows)
                rows = []
        sink.upsert(JOBS_TABLE, JOB_COLUMNS, JOB_KEY, rows)
        sink.commit()
        copied += len(rows)
    return copied


def count_rows(target: Target) -> int:
    with Sink(target) as sink:
        return int(sink.execute(f"SELECT COUNT(*) FROM {JOBS_TABLE}")[0][0])


@contextmanager
def scratch_targets(target_url: str | None, workdir: Path) -> Iterator[tuple[Target, Target]]:
    """Two empty targets: scratch databases on the MySQL server of `target_url`
    (dropped afterwards), or two SQLite files in `workdir`."""
    if not target_url:
        yield Target(dialect="sqlite", path=str(workdir / "plain.db")), Target(dialect="sqlite", path=str(workdir / "spark.db"))
        return
    base = parse_target(target_url, parse_url(f"embedded://{workdir / 'store.db'}"))
    if base.dialect != "mysql":
        yield (Target(dialect="sqlite", path=str(Path(base.path).with_suffix(".plain.db"))),
               Target(dialect="sqlite", path=str(Path(base.path).with_suffix(".spark.db"))))
        return
    tag = uuid.uuid4().hex[:10]
    # Generated names: safe identifiers (a database name cannot be a parameter).
    names = [f"aq_bench_{tag}_plain", f"aq_bench_{tag}_spark"]
    with Sink(base) as admin:
        try:
            for name in names:
                admin.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        except Exception as e:
            if not admin.dialect.is_error(e):
                raise
            raise SyncError(
                f"the benchmark needs to create scratch databases on {base}: {base.redact(str(e))}"
            ) from None
        try:
            yield replace(base, database=names[0]), replace(base, database=names[1])
        finally:
            for name in names:
                admin.execute(f"DROP DATABASE IF EXISTS {name}")


def run_bench(
    *,
    jobs: int = DEFAULT_JOBS,
    target_url: str | None = None,
    master: str | None = None,
    partitions: int = DEFAULT_PARTITIONS,
    batch_size: int = DEFAULT_BATCH,
    say: Callable[[str], None] = lambda _m: None,
) -> BenchResult:
    """Prepare `jobs` processed jobs in a scratch embedded store, then time both copies."""
    with tempfile.TemporaryDirectory(prefix="aq-sync-bench-") as tmp:
        work = Path(tmp)
        store_url = f"embedded://{work / 'store.db'}"
        backend = open_backend(store_url)
        try:
            udfs.register(backend)
            t0 = time.monotonic()
            say(f"preparing {jobs:,} processed jobs (load, reserve, complete or fail)...")
            prepare(backend, "bench", jobs, lambda n: say(f"  {n:,} processed") if n % 20_000 == 0 else None)
            prepare_s = time.monotonic() - t0
            with scratch_targets(target_url, work) as (plain_target, spark_target):
                for t in (plain_target, spark_target):
                    with Sink(t) as sink:
                        migrate(sink)
                say("plain loop: scan + executemany in one process...")
                t0 = time.monotonic()
                plain_rows = plain_loop(backend, plain_target, batch_size)
                plain_s = time.monotonic() - t0
                say("starting Spark...")
                t0 = time.monotonic()
                spark, created = spark_session(master, "aeroqueue-sync-bench")
                spark_start_s = time.monotonic() - t0
                try:
                    say("Spark sync: scan + upsert + commit + mark, in tasks...")
                    options = SyncOptions(store_url=store_url, target=spark_target, partitions=partitions, batch_size=batch_size)
                    t0 = time.monotonic()
                    report = run_sync(options, spark, backend)
                    spark_s = time.monotonic() - t0
                    used_master = str(spark.sparkContext.master)
                finally:
                    if created:
                        spark.stop()
                for t, want in ((plain_target, plain_rows), (spark_target, report.counts.copied)):
                    got = count_rows(t)
                    if got != jobs or want != jobs:
                        raise SyncError(f"benchmark check failed: {t} holds {got:,} rows, copied {want:,}, expected {jobs:,}")
                shown = str(spark_target) if spark_target.dialect == "sqlite" else str(spark_target).rsplit("/", 1)[0] + "/(scratch)"
        finally:
            backend.close()
    return BenchResult(
        jobs=jobs, target=shown, master=used_master, partitions=partitions, plain_rows=plain_rows, plain_s=plain_s,
        spark_rows=report.counts.copied, spark_s=spark_s, spark_start_s=spark_start_s, prepare_s=prepare_s,
        spark_counts=report.counts,
    )


def print_result(r: BenchResult, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"aeroqueue sync: {r.jobs:,} processed jobs -> {r.target}")
    for col in ("path", "rows", "seconds", "rows/s", "does"):
        table.add_column(col, justify="left" if col in ("path", "does") else "right")
    table.add_row("plain Python loop (1 process)", f"{r.plain_rows:,}", f"{r.plain_s:.2f}", f"{r.plain_rows_per_s:,.0f}",
                  "scan + executemany + commit")
    table.add_row(f"Spark {r.master}, {r.partitions} tasks", f"{r.spark_rows:,}", f"{r.spark_s:.2f}",
                  f"{r.spark_rows_per_s:,.0f}", "scan + upsert + commit + mark synced")
    console.print(table)
    c = r.spark_counts
    console.print(
        f"Spark task seconds, summed over tasks: scan {c.scan_s:.2f}, write {c.write_s:.2f}, mark {c.mark_s:.2f}; "
        f"Spark start-up {r.spark_start_s:.1f}s and preparing the jobs {r.prepare_s:.1f}s are not counted.",
        highlight=False,
    )


@click.command("sync-bench")
@click.option("--jobs", type=click.IntRange(1, 10_000_000), default=DEFAULT_JOBS, envvar="AEROQUEUE_BENCH_JOBS",
              show_envvar=True, help="Processed jobs to copy.")
@click.option("--mysql", "target_url", envvar="AEROQUEUE_MYSQL", show_envvar=True, metavar="URL", default=None,
              help="A MySQL server to copy to (two scratch databases are created on it and dropped); default: SQLite files.")
@click.option("--master", envvar="AEROQUEUE_SPARK_MASTER", show_envvar=True, default=None, metavar="MASTER",
              help="Spark master (default: local[*]).")
@click.option("--partitions", type=click.IntRange(1, 4096), default=DEFAULT_PARTITIONS, envvar="AEROQUEUE_SYNC_PARTITIONS",
              show_envvar=True, help="Spark tasks.")
@click.option("--batch-size", type=click.IntRange(1, 100_000), default=DEFAULT_BATCH, envvar="AEROQUEUE_SYNC_BATCH_SIZE",
              show_envvar=True, help="Rows per executemany and commit, on both paths.")
@click.option("--json", "as_json", is_flag=True, envvar="AEROQUEUE_JSON", show_envvar=True, help="Print JSON.")
@click.pass_obj
def sync_bench_command(
    obj: Context, jobs: int, target_url: str | None, master: str | None, partitions: int, batch_size: int, as_json: bool,
) -> None:
    """Rows per second synced by Spark, beside a plain Python loop (scan, executemany), for the same jobs.

    Always runs on a scratch embedded store of its own (the sync marks every
    processed job it copies, so it must never meet real jobs).
    """
    import json

    err = Console(stderr=True)
    if obj is not None and obj.url:
        err.print("note: --url is ignored: the benchmark runs on a scratch embedded store of its own", highlight=False)
    result = run_bench(jobs=jobs, target_url=target_url, master=master, partitions=partitions, batch_size=batch_size,
                       say=lambda m: err.print(m, highlight=False))
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        print_result(result)
