"""The `aeroqueue` command line: load job lists and operate the queue.

Every option can also be set from an environment variable, named in its help
(``AEROQUEUE_URL`` for ``--url``, ...). Errors print one line saying what went
wrong and what to do next; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from . import udfs
from .backends import Backend, open_backend
from .config import ENV_URL, default_store_path, resolve_url
from .errors import AeroqueueError
from .lists import DEFAULT_CHUNK, DEFAULT_MAX_ATTEMPTS, JobLists, max_payload
from .loading import read_file, validate
from .queue import Job, Queue
from .sessions import Session, check_timing
from .sessions import reap as reap_sessions
from .sessions import sweep as sweep_store

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

err_console = Console(stderr=True)


@dataclass
class Context:
    url: str | None
    verbose: bool
    _backend: Backend | None = None

    def backend(self, *, check_udfs: bool = True) -> Backend:
        if self._backend is None:
            self._backend = open_backend(self.url)
            if check_udfs:
                udfs.ensure(self._backend)
        return self._backend


class AeroqueueGroup(click.Group):
    """Turns aeroqueue errors into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AeroqueueError as e:
            verbose = bool(ctx.obj and ctx.obj.verbose) or "--verbose" in sys.argv or "-v" in sys.argv
            if verbose:
                click.echo(traceback.format_exc(), err=True)
            # One line, never wrapped, so scripts and people can both read it.
            click.echo(f"error: {e}" + (f" ({e.hint})" if e.hint else ""), err=True)
            if not verbose:
                click.echo("(run with --verbose for the traceback)", err=True)
            ctx.exit(1)


@click.group(cls=AeroqueueGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--url",
    envvar=ENV_URL,
    show_envvar=True,
    metavar="URL",
    help=(
        "Where the records live: aerospike://host:3000[,host2:3000]/namespace for a server or cluster, "
        "embedded:///path/store.db for the embedded store. "
        f"Default: the embedded store at {default_store_path()}."
    ),
)
@click.option("-v", "--verbose", is_flag=True, envvar="AEROQUEUE_VERBOSE", show_envvar=True, help="Show tracebacks on errors.")
@click.version_option(package_name="aeroqueue")
@click.pass_context
def main(ctx: click.Context, url: str | None, verbose: bool) -> None:
    """aeroqueue: a job queue on Aerospike.

    Load job lists, reserve jobs in O(1), acknowledge each exactly once, and
    recover the jobs of workers that died.
    """
    ctx.obj = Context(url=url, verbose=verbose)
    ctx.call_on_close(lambda: ctx.obj._backend and ctx.obj._backend.close())


# -- udf -------------------------------------------------------------------


@main.group()
def udf() -> None:
    """Register and check the Lua UDF modules on the cluster."""


@udf.command("register")
@click.pass_obj
def udf_register(obj: Context) -> None:
    """Upload the packaged Lua modules under their versioned names, and create the
    secondary index the reaper uses (aq_job.sess)."""
    backend = obj.backend(check_udfs=False)
    names = udfs.register(backend)
    click.echo(f"registered {len(names)} module(s) on {backend.url}: {', '.join(names)}")


@udf.command("status")
@click.option("--json", "as_json", is_flag=True, envvar="AEROQUEUE_JSON", show_envvar=True, help="Print JSON.")
@click.pass_obj
def udf_status(obj: Context, as_json: bool) -> None:
    """Show registered vs packaged modules (by hash); exit 1 if any is missing or stale."""
    backend = obj.backend(check_udfs=False)
    rows = udfs.status(backend)
    if as_json:
        import json

        click.echo(json.dumps([{"module": s.name, "state": s.state, "packaged": s.packaged, "registered": s.registered} for s in rows]))
    else:
        table = Table(title=f"UDF modules on {backend.url}")
        for col in ("module", "state", "packaged sha1", "registered sha1"):
            table.add_column(col)
        for s in rows:
            style = {"ok": "green", "stale": "yellow", "missing": "red"}[s.state]
            table.add_row(s.name, f"[{style}]{s.state}[/]", s.packaged[:12], (s.registered or "-")[:12])
        Console().print(table)
    if any(s.state != "ok" for s in rows):
        if not as_json:
            err_console.print("run `aeroqueue udf register` to upload the packaged modules", highlight=False)
        sys.exit(1)


# -- job lists ---------------------------------------------------------------


def option(*decls: str, env: str, **kw: Any) -> Callable[[F], F]:
    """A click option that also reads AEROQUEUE_<env>, named in its help."""
    return click.option(*decls, envvar=f"AEROQUEUE_{env}", show_envvar=True, **kw)


LIST_ARG = click.argument("list_name", metavar="LIST")
MODE_OPT = option(
    "--mode", env="MODE", type=click.Choice(["tokens", "ids"]), default="tokens",
    help="tokens: sequential token store; ids: list-pop ID store (chunked).",
)
MAX_ATT_OPT = option("--max-attempts", env="MAX_ATTEMPTS", type=click.IntRange(1), default=DEFAULT_MAX_ATTEMPTS, help="Failures before a job goes dead.")
JSON_OPT = option("--json", "as_json", env="JSON", is_flag=True, help="Print JSON instead of a table.")


@main.command()
@LIST_ARG
@MODE_OPT
@MAX_ATT_OPT
@click.pass_obj
def create(obj: Context, list_name: str, mode: str, max_attempts: int) -> None:
    """Create an empty job list (loading creates one too)."""
    made = JobLists(obj.backend()).create(list_name, mode=mode, max_attempts=max_attempts)
    click.echo(f"list {list_name!r} {'created' if made else 'already exists'} ({mode} mode)")


@main.command()
@LIST_ARG
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@option("--format", "fmt", env="FORMAT", type=click.Choice(["csv", "jsonl"]), default=None, help="Input format (default: from the extension).")
@option("--id-field", env="ID_FIELD", default="id", help="The column (CSV) or field (JSON Lines) holding the job id.")
@MODE_OPT
@MAX_ATT_OPT
@option("--seal", env="SEAL", is_flag=True, help="Mark the list complete for loading afterwards.")
@option("--chunk-size", env="CHUNK_SIZE", type=click.IntRange(1, 50_000), default=DEFAULT_CHUNK, help="Jobs per load range (and per ID-store chunk record).")
@click.pass_obj
def load(
    obj: Context, list_name: str, file: Path, fmt: str | None, id_field: str, mode: str,
    max_attempts: int, seal: bool, chunk_size: int,
) -> None:
    """Load jobs from a CSV or JSON Lines FILE into LIST.

    The whole file is checked first: a bad line loads nothing. Re-running the
    same load adds nothing twice (jobs are keyed by their id).
    """
    backend = obj.backend()
    limit = max_payload(backend)
    source = str(file)
    with _progress() as progress:
        checking = progress.add_task(f"checking {file.name}", total=None)
        n = validate(_advance(progress, checking, read_file(file, fmt=fmt, id_field=id_field, max_payload=limit)), source, id_field)
        progress.update(checking, total=n, completed=n)
        loading = progress.add_task(f"loading into {list_name}", total=n)
        report = JobLists(backend).load(
            list_name, read_file(file, fmt=fmt, id_field=id_field, max_payload=limit), mode=mode, seal=seal,
            chunk_size=chunk_size, max_attempts=max_attempts, progress=lambda k: progress.advance(loading, k),
        )
    click.echo(
        f"{list_name}: {report.loaded} loaded, {report.skipped} already there"
        + (f", {report.voided} duplicate(s) left void" if report.voided else "")
        + (" (sealed)" if seal else "")
    )


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=err_console, transient=False,
    )


def _advance(progress: Progress, task: Any, items: Iterable[T]) -> Iterator[T]:
    for i, item in enumerate(items, start=1):
        if i % 1000 == 0:
            progress.update(task, completed=i)
        yield item


@main.command()
@LIST_ARG
@click.pass_obj
def seal(obj: Context, list_name: str) -> None:
    """Mark LIST complete for loading: later loads are refused."""
    JobLists(obj.backend()).seal(list_name)
    click.echo(f"list {list_name!r} sealed")


@main.command()
@LIST_ARG
@option("--resume", env="RESUME", is_flag=True, help="Resume a paused list instead.")
@click.pass_obj
def pause(obj: Context, list_name: str, resume: bool) -> None:
    """Stop (or with --resume, restart) reservations from LIST."""
    JobLists(obj.backend()).pause(list_name, not resume)
    click.echo(f"list {list_name!r} {'resumed' if resume else 'paused'}")


@main.command()
@LIST_ARG
@option("--count", "-n", env="COUNT", type=click.IntRange(1, 10_000), default=1, help="How many jobs to reserve.")
@option("--session", env="SESSION", default=None, help="Reserve under this session id (default: open a new session).")
@click.pass_obj
def reserve(obj: Context, list_name: str, count: int, session: str | None) -> None:
    """Reserve up to N jobs of LIST and print them as JSON lines.

    Each line carries the session id the claim is held under; acknowledge
    with `aeroqueue complete` or `aeroqueue fail`.
    """
    backend = obj.backend()
    sess = session or Session.open(backend).id
    for job in Queue(backend).reserve(list_name, sess, count):
        click.echo(json.dumps({"list": job.list, "token": job.token, "id": job.jid, "payload": job.payload,
                               "attempt": job.attempt, "session": job.session}))


def _job_from_args(obj: Context, list_name: str, token: int, session: str) -> Job:
    return Job(list=list_name, token=token, jid=str(token), payload=None, attempt=0, session=session)


@main.command()
@LIST_ARG
@click.argument("token", type=click.IntRange(0))
@option("--session", env="SESSION", required=True, help="The session the job was reserved under.")
@option("--result", env="RESULT", default="null", help="The result, as JSON.")
@click.pass_obj
def complete(obj: Context, list_name: str, token: int, session: str, result: str) -> None:
    """Acknowledge job TOKEN of LIST as done (exactly once)."""
    try:
        value = json.loads(result)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e.msg}", param_hint="--result") from None
    Queue(obj.backend()).complete(_job_from_args(obj, list_name, token, session), value)
    click.echo(f"{list_name}/{token} done")


@main.command()
@LIST_ARG
@click.argument("token", type=click.IntRange(0))
@option("--session", env="SESSION", required=True, help="The session the job was reserved under.")
@option("--error", "error_text", env="ERROR", required=True, help="What went wrong.")
@click.pass_obj
def fail(obj: Context, list_name: str, token: int, session: str, error_text: str) -> None:
    """Record a failure of job TOKEN: retried while attempts remain, else dead."""
    outcome = Queue(obj.backend()).fail(_job_from_args(obj, list_name, token, session), error_text)
    click.echo(f"{list_name}/{token} {'will be retried' if outcome == 'retry' else 'is dead'}")


STATUS_FIELDS = ("total", "reservable", "in_flight", "retry_pending", "done", "dead", "sealed", "complete")


@main.command()
@LIST_ARG
@JSON_OPT
@click.pass_obj
def status(obj: Context, list_name: str, as_json: bool) -> None:
    """Show LIST's counts: total, reservable, in flight, retry pending, done, dead, sealed, complete."""
    st = JobLists(obj.backend()).status(list_name)
    if as_json:
        click.echo(json.dumps({f: getattr(st, f) for f in STATUS_FIELDS}))
        return
    table = Table(title=f"{list_name} ({st.mode} mode)")
    table.add_column("")
    table.add_column("", justify="right")
    for f in STATUS_FIELDS:
        value = getattr(st, f)
        table.add_row(f.replace("_", " "), ("yes" if value else "no") if isinstance(value, bool) else f"{value:,}")
    if st.paused:
        table.add_row("paused", "yes")
    if st.pending_ranges:
        table.add_row("loads in progress", str(st.pending_ranges))
    Console().print(table)


@main.command("lists")
@JSON_OPT
@click.pass_obj
def lists_cmd(obj: Context, as_json: bool) -> None:
    """List the job lists with their counts."""
    jl = JobLists(obj.backend())
    rows = [jl.status(name) for name in jl.names()]
    if as_json:
        click.echo(json.dumps([{"name": r.name, **{f: getattr(r, f) for f in STATUS_FIELDS}} for r in rows]))
        return
    table = Table()
    for col in ("list", "mode", *STATUS_FIELDS):
        table.add_column(col.replace("_", " "), justify="left" if col in ("list", "mode") else "right")
    for r in rows:
        table.add_row(r.name, r.mode, *(("yes" if getattr(r, f) else "no") if isinstance(getattr(r, f), bool) else f"{getattr(r, f):,}" for f in STATUS_FIELDS))
    Console().print(table)


@main.command()
@LIST_ARG
@option("--state", env="STATE", type=click.Choice(["queued", "claimed", "done", "dead"]), default=None, help="Only jobs in this state.")
@option("--output", "-o", env="OUTPUT", type=click.File("w"), default="-", help="Where to write (default: standard output).")
@click.pass_obj
def export(obj: Context, list_name: str, state: str | None, output: Any) -> None:
    """Write LIST's job records as JSON Lines."""
    n = JobLists(obj.backend()).export(list_name, output, state)
    err_console.print(f"{n} job(s) exported", highlight=False)


@main.command()
@LIST_ARG
@click.pass_obj
def kick(obj: Context, list_name: str) -> None:
    """Put LIST's dead jobs back in the queue with fresh attempts."""
    n = JobLists(obj.backend()).kick(list_name)
    click.echo(f"{n} dead job(s) put back")


@main.command()
@option("--sizes", env="BENCH_SIZES", default="1000,1000000", help="List sizes to measure, comma-separated.")
@option("--sample", env="BENCH_SAMPLE", type=click.IntRange(10), default=2000, help="Jobs measured on the single path (5x on the batch path).")
@option("--batch", env="BENCH_BATCH", type=click.IntRange(2, 1000), default=50, help="Batch size of the batch path.")
@MODE_OPT
@option("--json-out", env="BENCH_JSON", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the figures as JSON here.")
@option("--claims", env="BENCH_CLAIMS", is_flag=True, help="Instead, compare the ways a reaper can find a dead session's claims.")
@click.pass_obj
def bench(obj: Context, sizes: str, sample: int, batch: int, mode: str, json_out: Path | None, claims: bool) -> None:
    """Measure reserve + complete throughput and latency by list size.

    Without --url (or AEROQUEUE_URL) it runs on a scratch embedded store.
    """
    from . import bench as benchmark

    if claims:
        designs = benchmark.compare_claim_designs(obj.url, jobs=sample)
        table = Table(title="finding a dead session's claims: cost on the single reserve + complete path")
        for col in ("design", "jobs/s", "round trips/job", "vs untracked"):
            table.add_column(col, justify="right")
        for d in designs:
            table.add_row(d.design, f"{d.jobs_per_s:,.0f}", f"{d.round_trips_per_job:.2f}", f"{d.vs_untracked:.2f}")
        Console().print(table)
        return

    try:
        size_list = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of integers: {sizes!r}", param_hint="--sizes") from None
    with _progress() as progress:
        rows = benchmark.run(obj.url, size_list, sample=sample, batch=batch, mode=mode, progress=progress)
    where = str(resolve_url(obj.url)) if obj.url else "a scratch embedded store"
    table = Table(title=f"aeroqueue reserve + complete ({mode} mode) on {where}")
    for col in ("jobs in list", "path", "measured", "jobs/s", "reserve p50 ms", "reserve p99 ms",
                "complete p50 ms", "complete p99 ms", "round trips/job"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r.jobs_in_list:,}", r.path, f"{r.measured:,}", f"{r.jobs_per_s:,.0f}", f"{r.reserve_p50_ms:.3f}",
                      f"{r.reserve_p99_ms:.3f}", f"{r.complete_p50_ms:.3f}", f"{r.complete_p99_ms:.3f}", f"{r.round_trips_per_job:.2f}")
    Console(width=max(140, Console().width)).print(table)
    for path in ("single", f"batch {batch}"):
        ratio = benchmark.o1_ratio(rows, path)
        if ratio is not None:
            click.echo(f"O(1) check, {path}: reserve p50 on {max(size_list):,} jobs / on {min(size_list):,} jobs = {ratio:.2f}")
    if json_out:
        json_out.write_text(json.dumps({"url": where, "mode": mode, "rows": [r.as_dict() for r in rows]}, indent=1))


# -- sessions and workers ----------------------------------------------------

_STANDARD_LOG_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonLines(logging.Formatter):
    """One JSON object per log line: time, level, message and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD_LOG_ATTRS})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextLines(logging.Formatter):
    """A plain line: time, level, message, then the record's extra fields as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD_LOG_ATTRS)
        return f"{self.formatTime(record)} {record.levelname.lower()} {record.getMessage()}" + (f" {extras}" if extras else "")


def configure_logging(fmt: str, level: str = "info", *, live: bool = False) -> None:
    handler: logging.Handler
    if live:  # print above the live counters instead of through them
        from rich.logging import RichHandler

        handler = RichHandler(console=err_console, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines() if fmt == "json" else TextLines())
    root = logging.getLogger("aeroqueue")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


HEARTBEAT_OPT = option("--heartbeat", "interval_s", env="HEARTBEAT", type=click.FloatRange(min=0.01), default=1.0, help="Seconds between heartbeats.")
EXPIRY_OPT = option("--expiry", "expiry_s", env="EXPIRY", type=click.FloatRange(min=0.05), default=5.0, help="Seconds without a heartbeat after which a session is dead (more than twice --heartbeat).")


@main.command()
@option("--handler", env="HANDLER", required=True, help="The function to run on each job: package.module:function.")
@option("--list", "lists", env="LISTS", multiple=True, required=True, help="A list to work on; repeat for several (env: space-separated).")
@option("--concurrency", "-c", env="CONCURRENCY", type=click.IntRange(1, 256), default=1, help="Handler threads.")
@option("--batch", env="BATCH", type=click.IntRange(1, 1000), default=1, help="Jobs reserved per reservation.")
@HEARTBEAT_OPT
@EXPIRY_OPT
@option("--drain-timeout", env="DRAIN_TIMEOUT", type=click.FloatRange(min=0), default=30.0, help="Seconds to finish in-flight jobs on SIGTERM/SIGINT before releasing them.")
@option("--sweep-every", env="SWEEP_EVERY", type=click.FloatRange(min=1), default=300.0, help="Seconds between sweeps inside the worker.")
@option("--sweep-grace", env="SWEEP_GRACE", type=click.FloatRange(min=0), default=60.0, help="Seconds a job must have been untouched before the sweeper counts it as stuck.")
@option("--until-complete", env="UNTIL_COMPLETE", is_flag=True, help="Exit once every list is complete.")
@option("--log-format", env="LOG_FORMAT", type=click.Choice(["json", "text"]), default="json", help="Log lines as JSON objects or plain text.")
@option("--log-level", env="LOG_LEVEL", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
        help="Lowest level logged. Default: info, or warning on a terminal, where live counters show the progress.")
@click.pass_obj
def worker(
    obj: Context, handler: str, lists: tuple[str, ...], concurrency: int, batch: int, interval_s: float,
    expiry_s: float, drain_timeout: float, sweep_every: float, sweep_grace: float, until_complete: bool, log_format: str,
    log_level: str | None,
) -> None:
    """Run HANDLER on jobs reserved from the lists, under a heartbeat session.

    Drains on SIGTERM/SIGINT (in-flight jobs finish up to --drain-timeout, the
    rest are released), and exits with status 3 if its session is lost.
    """
    from .worker import Worker, load_handler

    live = sys.stderr.isatty()
    configure_logging(log_format, log_level or ("warning" if live else "info"), live=live)
    check_timing(interval_s, expiry_s)
    w = Worker(
        obj.backend(), load_handler(handler), list(lists), concurrency=concurrency, batch=batch, interval_s=interval_s,
        expiry_s=expiry_s, drain_timeout_s=drain_timeout, sweep_every_s=sweep_every,
        sweep_grace_ms=int(sweep_grace * 1000), until_complete=until_complete,
    )
    # For the life of the process, not just of run(): a SIGTERM arriving while a
    # finished worker exits must not kill it with the default action.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, w.request_stop)
    if live:
        with Live(_counters_table(w), console=err_console, refresh_per_second=2, transient=False) as display:
            stop = threading.Event()
            refresher = threading.Thread(target=_refresh, args=(display, w, stop), daemon=True)
            refresher.start()
            code = w.run(install_signals=False)
            stop.set()
            display.update(_counters_table(w))
    else:
        code = w.run(install_signals=False)
    # Stopped: a late SIGTERM asks for what is already happening. Python's shutdown
    # resets handlers to the default action (death by signal) but keeps SIG_IGN.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


def _counters_table(w: Any) -> Table:
    table = Table(title=f"aeroqueue worker {w.session.id[:8] if w.session else ''} on {', '.join(w.lists)}")
    snap = w.counters.snapshot()
    for name in ("reserved", "done", "retried", "dead", "lost", "unacked", "released", "reaped"):
        table.add_column(name, justify="right")
    table.add_column("in flight", justify="right")
    table.add_row(*(f"{snap[n]:,}" for n in ("reserved", "done", "retried", "dead", "lost", "unacked", "released", "reaped")), str(w.in_flight))
    return table


def _refresh(live: Live, w: Any, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        live.update(_counters_table(w))


@main.command()
@JSON_OPT
@click.pass_obj
def reap(obj: Context, as_json: bool) -> None:
    """Reap expired sessions: their claimed jobs go back to the retry store."""
    report = reap_sessions(obj.backend())
    if as_json:
        click.echo(json.dumps({"sessions": report.sessions, "released": report.released}))
    else:
        click.echo(f"reaped {report.sessions} session(s), released {report.released} job(s)")


@main.command()
@option("--grace", "grace_s", env="SWEEP_GRACE", type=click.FloatRange(min=0), default=60.0, help="Seconds a job must have been untouched to count as stuck.")
@JSON_OPT
@click.pass_obj
def sweep(obj: Context, grace_s: float, as_json: bool) -> None:
    """Find what slipped through: jobs taken but never claimed, claims of vanished
    sessions, loads whose loader died. Scans every job: run it rarely."""
    report = sweep_store(obj.backend(), grace_ms=int(grace_s * 1000))
    if as_json:
        click.echo(json.dumps({"requeued": report.requeued, "orphans": report.orphans, "recounted": report.recounted, "ranges": report.ranges}))
    else:
        click.echo(
            f"requeued {report.requeued} job(s), released {report.orphans} orphaned claim(s), "
            f"counted {report.recounted} uncounted ack(s), finished {report.ranges} load range(s)"
        )


@main.command("config")
@click.pass_obj
def show_config(obj: Context) -> None:
    """Show the store URL in use (credentials masked)."""
    click.echo(str(resolve_url(obj.url)))


def _register_sync() -> None:
    # pyspark and the MySQL driver load only when a sync command runs.
    from .sync import sync_command
    from .sync_bench import sync_bench_command

    main.add_command(sync_command)
    main.add_command(sync_bench_command)


_register_sync()


if __name__ == "__main__":  # pragma: no cover
    main()
