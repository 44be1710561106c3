"""`aeroqueue sync` and `aeroqueue sync-bench`: the Spark sync to MySQL, and its benchmark.

A thin shell over `aeroqueue.sync`: options, the target's choice, the
progress bar and the output. PySpark and the MySQL driver load only when a
run starts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from ..backends import Backend
from ..backends.base import N_PARTITIONS
from ..config import ENV_URL, MAX_SECONDS, default_store_path, parse_url
from ..errors import ListNotFound, SyncError, Terminated
from ..keys import check_list_name
from ..lists import JobLists
from ..logs import command_info
from ..stopping import Stop
from ..sync import (
    DEFAULT_BATCH,
    DEFAULT_LEASE_S,
    DEFAULT_PARTITIONS,
    Scheduler,
    SyncOptions,
    SyncReport,
    Target,
    demo_target,
    parse_target,
    rows_to_copy,
    run_sync,
    spark_session,
    sync_lease,
)
from ..sync.bench import DEFAULT_JOBS, BenchResult, run_bench
from ..sync.job import require_pyspark, stop_spark
from ..sync.target import ENV_MYSQL_PWD, ENV_PASSWORD
from .context import Context, err_console, option, progress_bar, usage_check, verbose_requested

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("aeroqueue.sync")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'90', '90s', '5m', '2h', '7d', '500ms' -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration: use a number with ms, s, m, h or d (e.g. 5m)")
    return float(m.group(1)) * _UNIT_S[m.group(2) or "s"]


def parse_since(text: str, now_ms: int | None = None) -> int:
    """--since: a duration back from now ('2h', '7d') or a date/time ('2026-11-01', '2026-11-01T12:00:00+00:00',
    UTC unless it says otherwise) -> Unix ms."""
    now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
    try:
        return now_ms - int(parse_duration(text) * 1000)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is neither a duration (2h, 7d) nor a date (2026-11-01 or 2026-11-01T12:00:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


class Duration(click.ParamType):
    """A duration up to ten years (config.MAX_SECONDS); with `positive`, more than 0:
    refused as usage, not after Spark has started."""

    name = "DURATION"

    def __init__(self, *, positive: bool = False) -> None:
        self.positive = positive

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value) if isinstance(value, (int, float)) else parse_duration(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if self.positive and not seconds > 0:
            self.fail(f"{value!r} is not more than 0", param, ctx)
        if not seconds <= MAX_SECONDS:  # NaN fails too
            self.fail(f"{value!r} is more than ten years ({MAX_SECONDS:,} s)", param, ctx)
        return seconds


class Since(click.ParamType):
    name = "WHEN"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_since(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


DURATION = Duration()
INTERVAL = Duration(positive=True)


def store_url_text(url: str | None) -> str:
    """The store URL as given (credentials included: the executors need them),
    or the default embedded store's."""
    return url or os.environ.get(ENV_URL) or f"embedded://{default_store_path()}"


@contextlib.contextmanager
def _cancelled_on(stop: Stop, spark: SparkSession, *, quiet: bool) -> Iterator[None]:
    """The Spark jobs of the block are cancelled once `stop` is set (SIGTERM): a
    stop does not wait for a long run. What the cancelled tasks committed is marked;
    the rest is the next run's (rows are upserts). With `quiet`, Spark logs nothing
    from then on: the tasks failing as they are cancelled, and as the context stops
    under the last of them, is what the stop asked for, not news."""
    done = threading.Event()

    def watch() -> None:
        silenced = False
        while not done.is_set():
            if not stop.wait(0.2):
                continue
            if quiet and not silenced:
                _silence(spark)
                silenced = True
            # Again until the block ends: a job the run starts after a cancel (the
            # stop landed while it set up) is not cancelled by it.
            with contextlib.suppress(Exception):  # the context stopping, or stopped
                spark.sparkContext.cancelAllJobs()
            done.wait(0.5)

    watcher = threading.Thread(target=watch, name="aeroqueue-sync-stop", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _silence(spark: SparkSession) -> None:
    """Spark logs nothing more: its tasks failing as a stop or Ctrl-C cancels them is
    what was asked for, not news. Its JVM (which Ctrl-C and kills reach too) may be
    gone already."""
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("OFF")


# Ctrl-C reached this process during the run. It reaches the JVM too, whose end
# the main thread, blocked in a py4j call, may see first (when the signal landed on
# another thread, the call is not interrupted): a Spark failure then, not Ctrl-C.
_sigint_seen = False


def _on_sigint(signum: int, frame: Any) -> None:
    global _sigint_seen
    _sigint_seen = True
    raise KeyboardInterrupt


def _sigint_ignored() -> bool:
    """Whether this process was given SIGINT ignored (read before anything installs a handler)."""
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _plain_interrupts(verbose: bool, ignored: bool = False) -> None:
    """Ctrl-C during a run ends the command with one line, as it ends every other.

    PySpark's own SIGINT handler calls the JVM (cancelAllJobs) from inside the
    handler, mostly while the main thread is in the middle of a call on the same
    py4j socket: 'reentrant call' tracebacks, several of them. Ours (`_on_sigint`)
    raises KeyboardInterrupt instead, as the default one does, and notes that Ctrl-C
    came; the command's `finally` stops the context,
    which cancels its jobs. py4j logs the interrupted call with the root logger's
    `logging.exception`, which, with no handler there, prints a traceback:
    unless --verbose, the root logger gets one that keeps them.

    `ignored`: the command was started with SIGINT ignored (a background job of a
    script), as `_sigint_ignored` read it before the Spark context started: SIGINT
    stays ignored, as Python keeps it at start-up. The context's start installs the
    same (`spark_session(sigint=...)`), not PySpark's handler, which it installs over
    whatever it finds: SIGINT then stopped a run that had ignored it while its JVM
    started."""
    global _sigint_seen
    _sigint_seen = False
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else _on_sigint)
    root = logging.getLogger()
    if not verbose and not root.handlers:
        root.addHandler(logging.NullHandler())


def _no_target(lists: JobLists, store: str, only: tuple[str, ...]) -> SyncError:
    """No --mysql: say what a run would copy, and how to point it somewhere."""
    names = list(only) or lists.names()
    done = dead = 0
    for name in names:
        st = lists.status(name)
        done, dead = done + st.done, dead + st.dead
    return SyncError(
        f"no sync target given: a run would copy up to {done + dead:,} processed job(s) ({done:,} done, {dead:,} dead) "
        f"of {len(names):,} list(s) from {store}, minus what the target already holds; "
        "point it at a database with --mysql mysql://user@host:3306/db (or AEROQUEUE_MYSQL), "
        "or sqlite:///path/sync.db for a file"
    )


class SyncProgress:
    """Rows copied of rows to copy, per list, on a terminal (rich)."""

    def __init__(self, to_copy: dict[str, int]) -> None:
        self.bar = progress_bar()
        shown = {name: n for name, n in to_copy.items() if n > 0}
        self.total = self.bar.add_task("all lists", total=sum(shown.values()) or None)
        self.tasks = {name: self.bar.add_task(f"  {name}", total=n) for name, n in list(shown.items())[:20]}

    def __enter__(self) -> SyncProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def update(self, copied: dict[str, int]) -> None:
        total = 0
        for name, n in copied.items():
            total += n
            task = self.tasks.get(name)
            if task is not None:
                # An estimate: a row copied before and never marked counts twice.
                self.bar.update(task, completed=n, total=max(n, self.bar.tasks[task].total or 0))
        self.bar.update(self.total, completed=total, total=max(total, self.bar.tasks[self.total].total or 0))


@click.command("sync")
@option(
    "--mysql", "target_url", env="MYSQL", metavar="URL", default=None,
    # A malformed URL is wrong usage (exit 2), said before the store is opened.
    callback=usage_check(lambda url: url is None or parse_target(url)),
    help=(
        "Where processed jobs are copied: mysql://user[:password]@host:3306/db (the password may instead come "
        f"from {ENV_PASSWORD} or {ENV_MYSQL_PWD}), or sqlite:///path/sync.db. Required, except for the store "
        "`make demo` made (it remembers its target); without it the sync says what it would copy."
    ),
)
@option("--master", env="SPARK_MASTER", default=None, metavar="MASTER",
        help="Spark master, e.g. local[*] or spark://host:7077. Default: spark-submit's, else local[*].")
@option("--every", env="SYNC_EVERY", type=INTERVAL, default=None,
        help="Run on a schedule (e.g. 5m) instead of once; one scheduler per target holds its lease, others stand by.")
@option("--resync", env="SYNC_RESYNC", is_flag=True,
        help="Copy again what the target already holds (idempotent); with --list and --since to narrow it.")
@option("--list", "only", env="SYNC_LISTS", multiple=True, metavar="LIST", callback=usage_check(check_list_name),
        help="Only these lists (repeat the option; the variable takes names separated by spaces).")
@option("--since", env="SYNC_SINCE", type=Since(), default=None,
        help="Only jobs processed since: a duration back from now (2h, 7d) or a date (2026-11-01, UTC).")
@option("--partitions", env="SYNC_PARTITIONS", type=click.IntRange(1, N_PARTITIONS), default=DEFAULT_PARTITIONS,
        help="Spark tasks; each scans an equal share of Aerospike's 4096 partitions.")
@option("--batch-size", env="SYNC_BATCH_SIZE", type=click.IntRange(1, 100_000), default=DEFAULT_BATCH,
        help="Rows per load (LOAD DATA LOCAL, or an upsert where the row is there already) and commit.")
@option("--delete-after", env="SYNC_DELETE_AFTER", type=DURATION, default=None,
        help="Retention: delete jobs from Aerospike once this target has held them this long (e.g. 7d). Jobs it does not hold are never deleted. Default: keep.")
@option("--lease", "lease_s", env="SYNC_LEASE", type=INTERVAL, default=f"{DEFAULT_LEASE_S:.0f}s",
        help="How long a target's sync lease outlives a scheduler that stopped renewing it.")
@option("--json", "as_json", env="JSON", is_flag=True, help="Print one JSON line per run (no progress bar).")
@click.pass_obj
def sync(
    obj: Context, target_url: str | None, master: str | None, every: float | None, resync: bool,
    only: tuple[str, ...], since: int | None, partitions: int, batch_size: int, delete_after: float | None,
    lease_s: float, as_json: bool,
) -> None:
    """Copy processed jobs (done or dead) to MySQL with Spark, once or on a schedule.

    Each job lands once (an upsert keyed by list and job id) and is marked
    as held by that target only after its row is committed, so a crash
    re-copies some rows and loses none. Records that cannot be stored go to
    the sync_rejects table with the reason, and the run exits non-zero.
    SIGTERM cancels the run under way and releases the lease: on a schedule
    the command then exits 0, a single run cut short 143. On a schedule a
    failed run (the target down, say) is logged in one line and the next one
    tries again; a Spark driver that died ends it, with status 1.
    """
    if delete_after is not None and (only or since is not None):
        # Wrong usage (status 2), said before the store is opened, as SyncOptions would
        # refuse it only after the lists were looked up.
        raise click.UsageError("retention (--delete-after) applies to the whole store: not with --list or --since")
    text = store_url_text(obj.url)
    store = parse_url(text)
    backend = obj.backend()
    lists = JobLists(backend)
    for name in only:
        try:
            lists.header(name)
        except ListNotFound:
            raise SyncError(f"--list {name!r}: no such job list in {store}") from None
    target: Target | None = parse_target(target_url) if target_url else demo_target(store)
    if target is None:
        raise _no_target(lists, str(store), only)
    options = SyncOptions(
        store_url=text, target=target, partitions=partitions, batch_size=batch_size, delete_after_s=delete_after,
        resync=resync, lists=only, since_ms=since,
    )
    command_info(log.name)
    if every is None:
        from ..sync import Sink, migrate

        # Fail fast, before a JVM starts, when the target is unreachable.
        with Sink(options.target) as sink:
            migrate(sink)

    def report(r: SyncReport) -> None:
        click.echo(json.dumps(r.as_dict()) if as_json else str(r))

    verbose = verbose_requested(click.get_current_context())
    # SIGTERM (a service's stop, a job runner's deadline) asks for a stop from the
    # start on: during the JVM's start-up too, which then completes (a JVM started
    # here ignores SIGTERM: `spark_session`) and no run starts. A run under way is
    # cancelled and its lease released: killed, a one-shot run left its lease held
    # until the TTL ran out, and the next run was refused meanwhile. It stays
    # handled until the context is stopped, so a second one cannot kill the command
    # half-way. On a schedule a stop is the service's end (status 0); a single run
    # cut short did not do its work (`Terminated`, 143).
    stop = Stop()
    handled = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, stop.on_signal) if handled else None
    try:
        _sync_with_spark(backend, options, target, master, every, lease_s, as_json, verbose, stop, report)
    finally:
        if handled:
            signal.signal(signal.SIGTERM, previous)


class _Spark:
    """The command's Spark session, started on first use: once the run holds the
    target's lease. A run another sync holds the lease for is refused (once), or
    stands by (--every), before a JVM starts: seconds of CPU, for nothing."""

    def __init__(self, master: str | None, verbose: bool, ignored: bool) -> None:
        self.master, self.verbose, self.ignored = master, verbose, ignored
        self.session: SparkSession | None = None
        self.created = False  # started here (else one already running: spark-submit's, a test's)

    def get(self) -> SparkSession:
        if self.session is None:
            sigint = signal.SIG_IGN if self.ignored else _on_sigint
            self.session, self.created = spark_session(self.master, verbose=self.verbose, sigint=sigint)
            if not self.created:  # a context already running keeps the handler PySpark installed then
                _plain_interrupts(self.verbose, self.ignored)
        return self.session

    @property
    def quiet(self) -> bool:
        """Spark's logging may be silenced at a stop: the context is ours, and no --verbose."""
        return self.created and not self.verbose


def _sync_with_spark(
    backend: Backend, options: SyncOptions, target: Target, master: str | None, every: float | None, lease_s: float,
    as_json: bool, verbose: bool, stop: Stop, report: Callable[[SyncReport], None],
) -> None:
    # Said at once: a schedule, which starts Spark at its first run, would log it run after run.
    require_pyspark()
    ignored = _sigint_ignored()  # before anything installs a handler
    # From before the JVM starts: Ctrl-C is ours (and py4j's report of a call it cut
    # short is kept, not printed with its traceback) through the context's start too.
    _plain_interrupts(verbose, ignored)
    spark = _Spark(master, verbose, ignored)

    def once(session: SparkSession) -> SyncReport:
        if not as_json and err_console.is_terminal:
            with SyncProgress(rows_to_copy(backend, options)) as bar:
                return run_sync(options, session, backend, bar.update)
        return run_sync(options, session, backend)

    def work() -> None:
        if every is None:
            try:
                # The lease first (refused at once if another sync holds it), then the JVM.
                with sync_lease(options, backend, lease_s=lease_s):
                    session = spark.get()
                    if stop.is_set():  # during the JVM's start-up
                        raise Terminated()
                    with _cancelled_on(stop, session, quiet=spark.quiet):
                        r = once(session)
            except Exception as e:
                if stop.is_set():
                    # Most often the cancel's own failure; with --verbose, whatever it was.
                    log.debug("the run ended after SIGTERM: %s", e, extra={"event": "sync_stopped"})
                    raise Terminated(
                        "sync stopped by SIGTERM before its run ended: what it committed is marked, "
                        "the next run copies the rest"
                    ) from None
                raise
            report(r)
            if r.counts.rejected:
                raise SyncError(r.rejects_note)
            return

        def one_run() -> None:
            session = spark.get()  # the first run's: once the scheduler holds the lease
            if stop.is_set():  # during the JVM's start-up: no run
                return
            with _cancelled_on(stop, session, quiet=spark.quiet):
                r = run_sync(options, session, backend)
            report(r)
            if r.counts.rejected:
                log.error("%s", r.rejects_note, extra={"event": "sync_rejects"})

        scheduler = Scheduler(backend, every, one_run, lease_s=lease_s, lock=target.lease_name, stop=stop)
        try:
            scheduler.run()
        except KeyboardInterrupt:
            scheduler.stop.set()

    try:
        try:
            work()
        except Exception:
            if _sigint_seen:  # the JVM's end, seen first: Ctrl-C all the same
                raise KeyboardInterrupt from None
            raise
    except KeyboardInterrupt:
        if spark.session is not None and spark.quiet:
            # The tasks still running fail as the context stops under them, and Spark
            # logs each failure, with its stack: what Ctrl-C asked for, not news.
            _silence(spark.session)
        raise
    finally:
        if spark.session is not None and spark.created:
            if stop.is_set() and not verbose:  # as in `_cancelled_on`
                _silence(spark.session)
            try:
                stop_spark(spark.session)
            except Exception as e:  # its JVM gone (Ctrl-C, killed): whatever the run said stands
                log.debug("stopping Spark failed: %s", e, extra={"event": "spark_stop_failed"})


def print_bench(r: BenchResult, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"aeroqueue sync: {r.jobs:,} processed jobs from {r.store} -> {r.target}")
    for col in ("path", "rows", "seconds", "rows/s", "does"):
        table.add_column(col, justify="left" if col in ("path", "does") else "right")
    table.add_row("plain Python loop (1 process)", f"{r.plain_rows:,}", f"{r.plain_s:.2f}", f"{r.plain_rows_per_s:,.0f}",
                  "scan + load + commit")
    table.add_row(f"Spark {r.master}, {r.partitions} tasks", f"{r.spark_rows:,}", f"{r.spark_s:.2f}",
                  f"{r.spark_rows_per_s:,.0f}", "scan + load + commit + mark")
    table.add_row("the target alone (1 connection)", f"{r.floor_rows:,}", f"{r.floor_s:.2f}", f"{r.floor_rows_per_s:,.0f}",
                  "the same rows from memory, in scan order: load + commit only (the floor)")
    console.print(table)
    c = r.spark_counts
    console.print(
        f"Spark task seconds, summed over tasks: scan {c.scan_s:.2f}, write {c.write_s:.2f}, mark {c.mark_s:.2f}; "
        f"Spark start-up {r.spark_start_s:.1f}s and writing the jobs {r.prepare_s:.1f}s are not counted.",
        highlight=False,
    )


@click.command("sync-bench")
@option("--jobs", env="BENCH_JOBS", type=click.IntRange(1, 10_000_000), default=DEFAULT_JOBS, help="Processed jobs to copy.")
@option("--mysql", "target_url", env="MYSQL", metavar="URL", default=None,
        help="A MySQL server to copy to (two scratch databases are created on it and dropped); default: SQLite files.")
@option("--master", env="SPARK_MASTER", default=None, metavar="MASTER", help="Spark master (default: local[*]).")
@option("--partitions", env="SYNC_PARTITIONS", type=click.IntRange(1, N_PARTITIONS), default=DEFAULT_PARTITIONS,
        help="Spark tasks.")
@option("--batch-size", env="SYNC_BATCH_SIZE", type=click.IntRange(1, 100_000), default=DEFAULT_BATCH,
        help="Rows per load and commit, on every path.")
@option("--json", "as_json", env="JSON", is_flag=True, help="Print JSON.")
@click.pass_obj
def sync_bench(
    obj: Context, jobs: int, target_url: str | None, master: str | None, partitions: int, batch_size: int, as_json: bool,
) -> None:
    """Rows per second synced by Spark, beside a plain Python loop (scan, load), for the same jobs.

    With --url (or AEROQUEUE_URL) the jobs are written into a list of the
    benchmark's own in that store, and only that list is read, marked and
    deleted afterwards; without, into a scratch embedded store.
    """
    say = Console(stderr=True)
    url = obj.url if obj is not None else None
    result = run_bench(jobs=jobs, store_url=url, target_url=target_url, master=master, partitions=partitions,
                       batch_size=batch_size, say=lambda m: say.print(m, highlight=False))
    if as_json:
        click.echo(json.dumps(result.as_dict()))
    else:
        print_bench(result)


def spark_submit_main(argv: list[str] | None = None) -> None:
    """The aeroqueue command line, for ``spark-submit sync/aeroqueue_sync.py ...``."""
    from . import main

    main(args=argv, prog_name="aeroqueue_sync.py")
