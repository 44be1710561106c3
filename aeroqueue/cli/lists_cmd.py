"""Job list commands: create, load, seal, pause, status, lists, export, kick."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..lists import DEFAULT_CHUNK, JobLists, max_payload
from ..loading import read_file, validate
from .context import (
    JSON_OPT,
    LIST_ARG,
    MAX_ATT_OPT,
    MODE_OPT,
    Context,
    advance,
    err_console,
    option,
    progress_bar,
)


@click.command()
@LIST_ARG
@MODE_OPT
@MAX_ATT_OPT
@click.pass_obj
def create(obj: Context, list_name: str, mode: str, max_attempts: int) -> None:
    """Create an empty job list (loading creates one too)."""
    made = JobLists(obj.backend()).create(list_name, mode=mode, max_attempts=max_attempts)
    click.echo(f"list {list_name!r} {'created' if made else 'already exists'} ({mode} mode)")


@click.command()
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
    with progress_bar() as progress:
        checking = progress.add_task(f"checking {file.name}", total=None)
        n = validate(advance(progress, checking, read_file(file, fmt=fmt, id_field=id_field, max_payload=limit)), source, id_field)
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




STATUS_FIELDS = ("total", "reservable", "in_flight", "retry_pending", "done", "dead", "sealed", "complete")


@click.command()
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


@click.command("lists")
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


@click.command()
@LIST_ARG
@option("--state", env="STATE", type=click.Choice(["queued", "claimed", "done", "dead"]), default=None, help="Only jobs in this state.")
@option("--output", "-o", env="OUTPUT", type=click.File("w"), default="-", help="Where to write (default: standard output).")
@click.pass_obj
def export(obj: Context, list_name: str, state: str | None, output: Any) -> None:
    """Write LIST's job records as JSON Lines."""
    n = JobLists(obj.backend()).export(list_name, output, state)
    err_console.print(f"{n} job(s) exported", highlight=False)


@click.command()
@LIST_ARG
@click.pass_obj
def kick(obj: Context, list_name: str) -> None:
    """Put LIST's dead jobs back in the queue with fresh attempts."""
    n = JobLists(obj.backend()).kick(list_name)
    click.echo(f"{n} dead job(s) put back")

