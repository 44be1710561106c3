"""Sessions and workers: worker, reap, sweep."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from typing import Any

import click
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..acks import DEFAULT_LINGER_S
from ..backends import Backend
from ..errors import AeroqueueError, ConfigError
from ..hosts import url_host
from ..logs import configure_logging
from ..selection import DEFAULT_BACKOFF_MAX_S, DEFAULT_REFRESH_S, parse_list
from ..sessions import DEFAULT_SWEEP_GRACE_MS, ReapReport, SweepReport
from ..sessions import reap as reap_sessions
from ..sessions import sweep as sweep_store
from ..worker import DEFAULT_PREFETCH, PREFETCH_HOLD_S, PREFETCH_MAX, check_handler_spec
from .context import (
    EXPIRY_OPT,
    HEARTBEAT_OPT,
    JSON_OPT,
    Context,
    bad_parameter,
    check_bind_host,
    check_session_timing,
    err_console,
    option,
    seconds,
    usage_check,
)
from .observe_cmd import METRICS_TRUSTED_HELP


@click.command()
@option("--handler", env="HANDLER", required=True, callback=usage_check(check_handler_spec), help="The function to run on each job: package.module:function.")
@option("--list", "lists", env="LISTS", multiple=True, required=True, callback=usage_check(parse_list), metavar="LIST[=WEIGHT]",
        help="A list to work on, with an optional weight (default 1): repeat for several, and jobs are taken in "
             "proportion to the weights. A glob ('cust-*', quoted) follows every matching list, also those loaded "
             "later (re-read every --refresh-lists seconds); its weight applies to each. (env: space-separated)")
@option("--refresh-lists", "refresh_lists", env="REFRESH_LISTS", type=seconds(0.1), default=DEFAULT_REFRESH_S,
        help="Seconds between reads of the store's lists, for --list patterns.")
@option("--idle-max", "idle_max", env="IDLE_MAX", type=seconds(0.01), default=DEFAULT_BACKOFF_MAX_S,
        help="Longest pause between polls of an empty or paused list (it backs off exponentially up to this).")
@option("--concurrency", "-c", env="CONCURRENCY", type=click.IntRange(1, 256), default=1, help="Handler threads.")
@option("--batch", "--prefetch", "batch", env="BATCH", type=click.IntRange(1, 1000), default=None,
        help=f"Jobs each thread reserves at a time (they wait claimed or leased; a reservation is 2 or 3 round trips). Default: "
             f"sized to the handlers' pace on each list, {DEFAULT_PREFETCH} until one has run a job of it, then "
             f"about {PREFETCH_HOLD_S * 1000:g} ms of work, 1 to {PREFETCH_MAX}.")
@option("--ack-linger", "ack_linger", env="ACK_LINGER", type=seconds(0), default=DEFAULT_LINGER_S * 1000, metavar="MS",
        help="Milliseconds a finished job's acknowledgement may wait to go out with others in one batch (one round "
             "trip for many jobs). 0: acknowledge each job on its own before taking the next.")
@option("--lease/--no-lease", "lease", env="LEASE", default=True,
        help="Lease reservations of 16 jobs or more instead of claiming each job: one write on the session record "
             "for the batch instead of one per job record, recovered by the reaper as claims are. The job records "
             "show 'queued' while leased jobs run; --no-lease claims each one.")
@HEARTBEAT_OPT
@EXPIRY_OPT
@option("--pool", env="POOL", type=click.Choice(["thread", "process"]), default="thread",
        help="Where handlers run: in the worker's threads (a handler past its time limit is abandoned, and a new "
             "thread takes its place), or one child process per thread (killed past the time limit).")
@option("--drain-timeout", env="DRAIN_TIMEOUT", type=seconds(0), default=30.0, help="Seconds to finish in-flight jobs on SIGTERM/SIGINT before releasing them.")
@option("--sweep-every", env="SWEEP_EVERY", type=seconds(1), default=300.0, help="Seconds between sweeps of the store, run by one of its workers (not by each).")
@option("--sweep-grace", env="SWEEP_GRACE", type=seconds(0), default=60.0, help="Seconds a job must have been untouched before the sweeper counts it as stuck.")
@option("--until-complete", env="UNTIL_COMPLETE", is_flag=True,
        help="Exit once every list is complete (sealed, and each of its jobs done or dead: a list loaded without --seal waits for `aeroqueue seal`, and the worker says so); with a pattern, once it matches at least one list and every list it matches is complete.")
@option("--metrics-port", env="WORKER_METRICS_PORT", type=click.IntRange(0, 65535), default=None,
        help="Serve this worker's Prometheus metrics on /metrics at this port (default: none).")
@option("--metrics-host", env="METRICS_HOST", default="127.0.0.1", callback=usage_check(check_bind_host),
        help="Address the metrics port binds.")
@option("--metrics-trusted-host", "metrics_trusted_hosts", env="METRICS_TRUSTED_HOSTS", multiple=True,
        help=METRICS_TRUSTED_HELP)
@option("--metrics-list-label/--no-metrics-list-label", "metrics_by_list", env="WORKER_METRICS_LIST_LABEL", default=True,
        help="Count jobs by list in the metrics (8 series for each list worked). --no-metrics-list-label counts "
             "every list together: 8 series labelled list=\"*\" whatever the number of lists (a list per customer "
             "load, tens of workers: too many series for Prometheus otherwise); the totals are the same.")
@option("--log-format", env="LOG_FORMAT", type=click.Choice(["json", "text"]), default="json", help="Log lines as JSON objects or plain text.")
@option("--log-level", env="LOG_LEVEL", type=click.Choice(["debug", "info", "warning", "error"]), default=None,
        help="Lowest level logged. Default: info, or warning on a terminal, where live counters show the progress.")
@click.pass_obj
def worker(
    obj: Context, handler: str, lists: tuple[str, ...], refresh_lists: float, idle_max: float, concurrency: int,
    batch: int | None, ack_linger: float, lease: bool, interval_s: float, expiry_s: float, pool: str, drain_timeout: float, sweep_every: float,
    sweep_grace: float, until_complete: bool,
    metrics_port: int | None, metrics_host: str, metrics_trusted_hosts: tuple[str, ...], metrics_by_list: bool,
    log_format: str, log_level: str | None,
) -> None:
    """Run HANDLER on jobs reserved from the lists, under a heartbeat session.

    Drains on SIGTERM/SIGINT (in-flight jobs finish up to --drain-timeout, the
    rest are released). Exit status: 0 stopped as asked or every list complete
    (--until-complete), 1 an error before work started, 2 wrong usage (a --handler
    that cannot be loaded, among others), 3 its session was lost,
    4 every handler thread died (with --pool process: handlers that cannot start).
    """
    from ..worker import Worker, load_handler

    live = sys.stderr.isatty()
    configure_logging(log_format, log_level or ("warning" if live else "info"), live=live)
    check_session_timing(interval_s, expiry_s)
    try:
        # Before the store is opened: a handler that cannot be loaded (its module not
        # found or failing to import, no such function) is a --handler that can never
        # work, wrong usage (status 2, as systemd's RestartPreventExitStatus= can
        # tell from a store down), not an error that a restart may get past.
        run = load_handler(handler)
    except ConfigError as e:
        raise bad_parameter(click.get_current_context(), "handler", e) from None
    observer = None
    if metrics_port is not None:
        from ..metrics import WorkerMetrics

        observer = WorkerMetrics(by_list=metrics_by_list)
    w = Worker(
        obj.backend(), run, list(lists), concurrency=concurrency, batch=batch,
        ack_linger_s=ack_linger / 1000, interval_s=interval_s,
        expiry_s=expiry_s, drain_timeout_s=drain_timeout, sweep_every_s=sweep_every,
        sweep_grace_ms=int(sweep_grace * 1000), until_complete=until_complete, observer=observer, pool=pool,
        idle_max_s=idle_max, refresh_lists_s=refresh_lists, lease=lease,
    )
    # For the life of the process, not just of run(): a SIGTERM arriving while a
    # finished worker exits must not kill it with the default action.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, w.on_signal)
    # After the handlers: a scraper that sees the port up may signal the worker at once.
    if observer is not None and metrics_port is not None:
        from ..metrics import serve

        observer.bind(lambda: w.in_flight)
        server = serve(observer.registry, metrics_port, metrics_host, metrics_trusted_hosts, option="--metrics-trusted-host")
        logging.getLogger("aeroqueue.worker").info(
            "serving metrics", extra={"event": "metrics", "url": f"http://{url_host(metrics_host)}:{server.server_port}/metrics"})
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
    # Text: a --list pattern such as "orders_[ab]*" is not markup.
    table = Table(title=Text(f"aeroqueue worker {w.session.id[:8] if w.session else ''} on {', '.join(w.lists)}"))
    snap = w.counters.snapshot()
    for name in ("reserved", "done", "retried", "dead", "lost", "unacked", "released", "reaped"):
        table.add_column(name, justify="right")
    table.add_column("in flight", justify="right")
    table.add_row(*(f"{snap[n]:,}" for n in ("reserved", "done", "retried", "dead", "lost", "unacked", "released", "reaped")), str(w.in_flight))
    return table


def _refresh(live: Live, w: Any, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        live.update(_counters_table(w))


@click.command()
@option("--sweep/--no-sweep", "then_sweep", env="REAP_SWEEP", default=True,
        help="After a reap that ended a session, sweep for the jobs its process took and never claimed (killed "
             "between the two), as a worker does: no session holds them, so the reap alone leaves them to the "
             "regular sweep. Scans every job, only when a session was ended (also when the reap then failed).")
@JSON_OPT
@click.pass_obj
def reap(obj: Context, then_sweep: bool, as_json: bool) -> None:
    """Reap expired sessions: their claimed jobs go back to the retry store. Also end
    the claims of live sessions past their time limit, as timed-out attempts (the
    job is retried, or dead without attempts left). Then, if it ended a session,
    sweep for the jobs that session took and never claimed (--no-sweep: not).

    --json prints {"sessions": reaped, "released": jobs given back, "timed_out":
    claims ended past their time limit, "swept": whether the sweep ran, "requeued":
    jobs it offered again, "orphans": claims of vanished sessions it released}.
    """
    backend = obj.backend()
    try:
        report = reap_sessions(backend)
    except AeroqueueError as e:
        # Sessions it ended before the error are gone: no later reap sets off their sweep.
        done = e.reaped
        if then_sweep and done is not None and done.ended:
            _sweep_after_reap(backend, done, e)
        raise
    swept = _sweep_after_reap(backend, report) if then_sweep and report.ended else None
    requeued, orphans = (swept.requeued, swept.orphans) if swept is not None else (0, 0)
    if as_json:
        click.echo(json.dumps({"sessions": report.sessions, "released": report.released, "timed_out": report.timed_out,
                               "swept": swept is not None, "requeued": requeued, "orphans": orphans}))
    else:
        said = (f"reaped {report.sessions} session(s), released {report.released} job(s), "
                f"timed out {report.timed_out} claim(s)")
        if swept is not None:
            said += f"; swept: requeued {requeued} job(s), released {orphans} orphaned claim(s)"
        click.echo(said)


def _sweep_after_reap(backend: Backend, report: ReapReport, failed: AeroqueueError | None = None) -> SweepReport | None:
    """The sweep after a reap that ended sessions, as a worker's (`Worker._maintenance_loop`):
    a job counts as lost once untouched for half the dead sessions' shortest expiry, not
    the regular sweep's grace. `failed`: the reap's own error, raised after this; its
    hint then says what the reap did and that the sweep ran."""
    grace_ms = report.sweep_grace_ms(DEFAULT_SWEEP_GRACE_MS)
    again = f"`aeroqueue sweep --grace {grace_ms / 1000:g}` runs it again"
    try:
        swept = sweep_store(backend, grace_ms=grace_ms)
    except AeroqueueError as e:
        # The sessions are gone now: no later reap sets this sweep off again.
        if failed is None:
            _hint_first(e, f"reaped {report.sessions} session(s), but the sweep after it failed: {again}")
            raise
        _hint_first(failed, f"reaped {report.sessions} session(s) before it, and the sweep after them failed too "
                            f"({e}): {again}")
        return None
    if failed is not None:
        _hint_first(failed, f"reaped {report.sessions} session(s) before it, and swept after them: requeued "
                            f"{swept.requeued} job(s); `aeroqueue reap` again finishes the rest")
    return swept


def _hint_first(e: AeroqueueError, said: str) -> None:
    """`said` ahead of the hint `e` already carries (its class's, or one set on its way)."""
    e.hint = f"{said}; {e.hint}" if e.hint else said


@click.command()
@option("--grace", "grace_s", env="SWEEP_GRACE", type=seconds(0), default=60.0, help="Seconds a job must have been untouched to count as stuck.")
@JSON_OPT
@click.pass_obj
def sweep(obj: Context, grace_s: float, as_json: bool) -> None:
    """Find what slipped through: jobs taken but never claimed, claims of vanished
    sessions, loads whose loader died. Scans every job: run it rarely.

    --json prints {"requeued", "orphans", "recounted", "ranges"} (counts, as in the text).
    """
    report = sweep_store(obj.backend(), grace_ms=int(grace_s * 1000))
    if as_json:
        click.echo(json.dumps({"requeued": report.requeued, "orphans": report.orphans, "recounted": report.recounted, "ranges": report.ranges}))
    else:
        click.echo(
            f"requeued {report.requeued} job(s), released {report.orphans} orphaned claim(s), "
            f"counted {report.recounted} uncounted ack(s), finished {report.ranges} load range(s)"
        )
