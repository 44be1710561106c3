"""Job list commands: create, tune, seal, pause, status, lists, export, kick, drop (load: load_cmd)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from ..errors import ConfigError, ListNotFound
from ..lists import JobLists, backoff_of
from ..sessions import reap
from .context import (
    BACKOFF_MAX_OPT,
    BACKOFF_OPT,
    JSON_OPT,
    LIST_ARG,
    MAX_ATT_OPT,
    MODE_OPT,
    TIMEOUT_OPT,
    Context,
    check_new_list_policy,
    err_console,
    note_new_list_options,
    option,
)


@click.command()
@LIST_ARG
@MODE_OPT
@MAX_ATT_OPT
@TIMEOUT_OPT
@BACKOFF_OPT
@BACKOFF_MAX_OPT
@click.pass_obj
def create(
    obj: Context, list_name: str, mode: str | None, max_attempts: int, timeout_s: float | None,
    backoff_s: float | None, backoff_max_s: float | None,
) -> None:
    """Create an empty job list (loading creates one too)."""
    lists = JobLists(obj.backend())
    check_new_list_policy(lists, list_name, max_attempts, timeout_s, backoff_s, backoff_max_s)
    made = lists.create(
        list_name, mode=mode, max_attempts=max_attempts, timeout_s=timeout_s, backoff_s=backoff_s,
        backoff_max_s=backoff_max_s,
    )
    click.echo(f"list {list_name!r} {'created' if made else 'already exists'} ({lists.header(list_name)['mode']} mode)")
    note_new_list_options(lists, list_name, exists=not made)


def _check_backoff(jl: JobLists, name: str, backoff_s: float | None, backoff_max_s: float | None) -> None:
    """A cap below the base, as wrong usage naming the options (exit 2, as `load` and
    `create` say it); the one not given is the list's own. The library's refusal (exit
    1) named neither option."""
    base, cap = (ms / 1000 for ms in backoff_of(jl.header(name)))
    lo, hi = base if backoff_s is None else backoff_s, cap if backoff_max_s is None else backoff_max_s
    if hi < lo:
        ctx = click.get_current_context()

        def whose(param: str, env: str) -> str:
            if ctx.get_parameter_source(param) is ParameterSource.ENVIRONMENT:
                return f", from AEROQUEUE_{env}"
            return ", the list's" if ctx.params.get(param) is None else ""

        cap_is = f"{hi:g} s" + whose("backoff_max_s", "BACKOFF_MAX")
        base_is = f"{lo:g} s" + whose("backoff_s", "BACKOFF")
        raise click.UsageError(f"--backoff-max ({cap_is}) is below --backoff ({base_is}): the cap must be at "
                               "least the base")


@click.command()
@LIST_ARG
@TIMEOUT_OPT
@BACKOFF_OPT
@BACKOFF_MAX_OPT
@click.pass_obj
def tune(
    obj: Context, list_name: str, timeout_s: float | None, backoff_s: float | None, backoff_max_s: float | None,
) -> None:
    """Change LIST's time limit and backoff. A new time limit applies to claims made from
    now on (a running handler can extend its own with job.touch()); a new backoff to
    failures from now on (running workers see it within 5 s)."""
    if timeout_s is None and backoff_s is None and backoff_max_s is None:
        raise click.UsageError("nothing to change: give --timeout, --backoff or --backoff-max")
    jl = JobLists(obj.backend())
    if backoff_s is not None or backoff_max_s is not None:
        _check_backoff(jl, list_name, backoff_s, backoff_max_s)
    jl.tune(list_name, timeout_s=timeout_s, backoff_s=backoff_s, backoff_max_s=backoff_max_s)
    st = jl.status(list_name)
    click.echo(f"{list_name}: time limit {st.timeout_s:g} s, backoff {st.backoff_s:g} s up to {st.backoff_max_s:g} s")


@click.command()
@LIST_ARG
@click.pass_obj
def seal(obj: Context, list_name: str) -> None:
    """Mark LIST complete for loading: later loads are refused."""
    JobLists(obj.backend()).seal(list_name)
    click.echo(f"list {list_name!r} sealed")


@click.command()
@LIST_ARG
@option("--resume", env="RESUME", is_flag=True, help="Resume a paused list instead.")
@click.pass_obj
def pause(obj: Context, list_name: str, resume: bool) -> None:
    """Stop (or with --resume, restart) reservations from LIST."""
    JobLists(obj.backend()).pause(list_name, not resume)
    click.echo(f"list {list_name!r} {'resumed' if resume else 'paused'}")




# `queued` first: what a reserve can take now. `reservable` alone left out the jobs back
# in the retry store (a kicked list read "reservable 0" while reserve handed out jobs).
STATUS_FIELDS = (
    "total", "queued", "reservable", "delayed", "in_flight", "retry_pending", "done", "dead", "sealed", "paused",
    "complete",
)
POLICY_FIELDS = ("timeout_s", "backoff_s", "backoff_max_s", "max_attempts")


def status_json(st: Any) -> dict[str, Any]:
    """The documented JSON shape of one list (`status --json`, each row of `lists --json`)."""
    # `dropping`: a drop that did not finish (README, "Dropping a list"); scripts must see it as the table does.
    return {"name": st.name, "mode": st.mode, **{f: getattr(st, f) for f in (*STATUS_FIELDS, *POLICY_FIELDS)},
            "dropping": st.dropping, "loads_in_progress": st.pending_ranges, "loads_stalled": st.stalled_ranges}


# The status table's words where a field's name alone misleads: `reservable` counts
# only the fresh jobs, and `queued` is those and `retry_pending` together.
_STATUS_LABELS = {"queued": "queued (reservable now)", "reservable": "fresh (never reserved)",
                  "retry_pending": "retry pending (queued)"}


def _cell(value: Any) -> str:
    return ("yes" if value else "no") if isinstance(value, bool) else f"{value:,}"


@click.command()
@LIST_ARG
@JSON_OPT
@click.pass_obj
def status(obj: Context, list_name: str, as_json: bool) -> None:
    """Show LIST's counts (total; queued, what a reserve can take now: the fresh jobs
    (reservable) and those back for a retry (retry pending); delayed, in flight, done,
    dead), its flags (sealed, paused, complete) and its time limit, backoff and attempts."""
    st = JobLists(obj.backend()).status(list_name)
    if as_json:
        click.echo(json.dumps(status_json(st)))
        return
    table = Table(title=f"{list_name} ({st.mode} mode)", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for f in STATUS_FIELDS:
        label = _STATUS_LABELS.get(f, f.replace("_", " "))
        if f == "queued" and st.paused:
            label = "queued (reservable once resumed)"
        table.add_row(label, _cell(getattr(st, f)))
    if st.pending_ranges:
        table.add_row("loads in progress", str(st.pending_ranges))
    if st.stalled_ranges:
        # Else a list whose every job is done says only "not complete", and its workers
        # wait for the next sweep (minutes) without a word.
        table.add_row("loads stalled", f"{st.stalled_ranges}: their loader died; `aeroqueue sweep` (or a worker "
                      "--until-complete) finishes them")
    if st.dropping:
        table.add_row("dropping", "a drop did not finish: run it again")
    table.add_row("time limit", f"{st.timeout_s:g} s")
    table.add_row("backoff", f"{st.backoff_s:g} s doubling, up to {st.backoff_max_s:g} s")
    table.add_row("max attempts", str(st.max_attempts))
    Console().print(table)


@click.command("lists")
@JSON_OPT
@click.pass_obj
def lists_cmd(obj: Context, as_json: bool) -> None:
    """List the job lists with their counts.

    On a terminal, a table that fits its width (long names wrap, never cut);
    piped, plain aligned columns with whole names, one list per line.
    """
    jl = JobLists(obj.backend())
    rows = []
    for name in jl.names():
        try:
            rows.append(jl.status(name))
        except ListNotFound:
            continue  # dropped since the scan found it
    if as_json:
        click.echo(json.dumps([status_json(r) for r in rows]))
        return
    console = Console()
    # Piped, `queued` (added since) comes last: the columns scripts cut stay where they were.
    fields = STATUS_FIELDS if console.is_terminal else (*(f for f in STATUS_FIELDS if f != "queued"), "queued")
    header = ["list", "mode", *(f.replace("_", " ") for f in fields)]
    cells = [[r.name, r.mode, *(_cell(getattr(r, f)) for f in fields)] for r in rows]
    if not console.is_terminal:
        # For grep, awk and cut: nothing truncated, nothing wrapped.
        widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
        for row in [header, *cells]:
            click.echo("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
        return
    if not rows:
        console.print("no job lists in this store yet: `aeroqueue load LIST FILE` makes one", highlight=False)
        return
    # A narrow terminal drops the least useful columns (never the name, which
    # wraps rather than being cut) until the table fits.
    natural = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    # The name can wrap down to 20, and its column is never under its min_width (8).
    natural[0] = max(min(natural[0], 20), _NAME_MIN_WIDTH)
    shown = list(range(len(header)))
    for drop in _DROP_ORDER:
        # Each column: its text, a space either side, and one border line.
        if sum(natural[i] + 3 for i in shown) + 1 <= console.width:
            break
        shown.remove(header.index(drop))
    table = _table(header, cells, shown)
    hidden = [h for i, h in enumerate(header) if i not in shown]
    if hidden:
        table.caption = f"not shown at this width: {', '.join(hidden)} (widen the terminal, or use --json)"
    console.print(table)


_NAME_MIN_WIDTH = 8
# `paused` late: a paused list looks idle (it is an outage's flag); `queued` is the
# sum of `reservable` and `retry pending`, which go first.
_DROP_ORDER = ("mode", "reservable", "retry pending", "sealed", "delayed", "in flight", "dead", "paused")


def _table(header: list[str], cells: list[list[str]], shown: list[int]) -> Table:
    table = Table()
    for i in shown:
        if i == 0:
            table.add_column(header[i], overflow="fold", min_width=_NAME_MIN_WIDTH)
        else:
            table.add_column(header[i], justify="left" if i == 1 else "right", no_wrap=True)
    for row in cells:
        table.add_row(*(row[i] for i in shown))
    return table


@click.command()
@LIST_ARG
@option("--state", env="STATE", type=click.Choice(["queued", "delayed", "claimed", "done", "dead"]), default=None,
        help="Only jobs in this state (delayed: waiting for a backoff, a snooze or their run_at).")
@option("--output", "-o", env="OUTPUT", type=click.File("w"), default="-", help="Where to write (default: standard output).")
@click.pass_obj
def export(obj: Context, list_name: str, state: str | None, output: Any) -> None:
    """Write LIST's job records as JSON Lines."""
    jl = JobLists(obj.backend())
    jl.header(list_name)  # a missing list is an error before the file is touched
    # click opens a "w" file lazily, at its first write: with no job to write it was
    # never opened, so an earlier export's file kept its jobs. Open (truncate) it now.
    opener = getattr(output, "open", None)  # click's LazyFile
    if callable(opener):
        opener()
    try:
        n = jl.export(list_name, output, state)
        output.flush()
    except BrokenPipeError:
        raise  # the reader went away (`| head`): the CLI's quiet 141
    except OSError as e:  # "[Errno 28] No space left on device" named no file
        where = getattr(output, "name", None) or "the output"
        raise ConfigError(f"{where}: cannot write the export: {e.strerror or e}; what it holds is incomplete") from None
    err_console.print(f"{n} job(s) exported", highlight=False)


@click.command()
@LIST_ARG
@click.pass_obj
def kick(obj: Context, list_name: str) -> None:
    """Put LIST's dead jobs back in the queue with fresh attempts."""
    n = JobLists(obj.backend()).kick(list_name)
    click.echo(f"{n} dead job(s) put back")


@click.command()
@LIST_ARG
@option("--yes", "-y", env="YES", is_flag=True, help="Drop without asking for confirmation.")
@JSON_OPT
@click.pass_obj
def drop(obj: Context, list_name: str, yes: bool, as_json: bool) -> None:
    """Delete LIST and all its records: jobs, job-id index, completion bits, ID store.

    Asks first (--yes to skip). Safe with workers running: they stop taking from
    LIST, and the acknowledgement of a job they hold is refused. The copy in
    MySQL is left alone; done and dead jobs no sync has copied yet are lost. --json prints {"name", "jobs", "index", "id_chunks", "bitmaps"}
    (records deleted).
    """
    jl = JobLists(obj.backend())
    if not yes:
        st = jl.status(list_name)  # a missing list is an error before anything is asked
        waiting = st.reservable + st.delayed + st.retry_pending  # every job not done, dead or running
        # The records go: a done or dead job that no sync has copied yet is gone with them.
        unsynced = (" Done and dead jobs not yet copied by `aeroqueue sync` are lost with it."
                    if st.done + st.dead else "")
        question = (f"Drop list {list_name!r} and all its records: {st.total:,} job(s), {waiting:,} waiting, "
                    f"{st.in_flight:,} in flight, {st.done:,} done, {st.dead:,} dead?{unsynced} This cannot be undone.")
        nobody = click.ClickException(f"list {list_name!r} not dropped: no confirmation (pass --yes to drop without asking)")
        if sys.stdin is None:  # file descriptor 0 closed (`<&-`): input() would raise RuntimeError
            raise nobody
        try:
            confirmed = click.confirm(question, default=False, err=True)
        except click.Abort as e:
            if isinstance(e.__context__, KeyboardInterrupt):  # click's `from None` keeps it here
                if sys.stdin.isatty():
                    click.echo(err=True)  # after the terminal's ^C: "error: interrupted" on a line of its own
                raise  # Ctrl-C: 130, as in every command
            raise nobody from None  # standard input at its end: nobody to ask
        finally:
            if not sys.stdin.isatty():
                # An answer from a pipe is not echoed: end the question's line, so
                # that what follows (an error) is a line of its own.
                click.echo(err=True)
        if not confirmed:
            raise click.ClickException(f"list {list_name!r} not dropped")
    # Expired sessions first: with every worker dead nobody reaps, and a dead session's
    # lease on the list would hold the drop until its time limit (minutes).
    reap(jl.backend)
    report = jl.drop(list_name)
    if as_json:
        click.echo(json.dumps(report.as_dict()))
    else:
        click.echo(f"list {list_name!r} dropped: {report.jobs:,} job(s), {report.index:,} index entries, "
                   f"{report.bitmaps:,} bitmap(s), {report.id_chunks:,} ID store chunk(s) deleted")
