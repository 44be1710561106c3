"""`aeroqueue udf`: register and check the Lua modules."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from .. import udfs
from .context import (
    Context,
    err_console,
)


@click.group()
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
