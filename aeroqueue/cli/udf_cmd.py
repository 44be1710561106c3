"""`aeroqueue udf`: register and check the Lua modules."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from .. import udfs
from .context import (
    JSON_OPT,
    Context,
    err_console,
    option,
)


@click.group()
def udf() -> None:
    """Register and check the Lua UDF modules on the cluster."""


@udf.command("register")
@option("--force", env="UDF_FORCE", is_flag=True, help="Upload every module even when the cluster's copy is the same.")
@JSON_OPT
@click.pass_obj
def udf_register(obj: Context, force: bool, as_json: bool) -> None:
    """Upload the packaged Lua modules the cluster lacks (or holds another version of),
    under their versioned names, and create the secondary index the reaper uses
    (aq_job.sess) if it is missing. On an up-to-date cluster it changes nothing.

    --json prints {"url", "uploaded": [modules], "indexes": [indexes created]}.
    """
    backend = obj.backend(check_udfs=False)
    done = udfs.register(backend, force=force)
    if as_json:
        click.echo(json.dumps({"url": str(backend.url), "uploaded": done.uploaded, "indexes": done.indexes}))
        return
    if not done.changed:
        click.echo(f"nothing changed on {backend.url}: every module and index is already in place")
        return
    if done.uploaded:
        click.echo(f"uploaded {len(done.uploaded)} module(s) to {backend.url}: {', '.join(done.uploaded)}")
    if done.indexes:
        click.echo(f"created index(es) on {backend.url}: {', '.join(done.indexes)}")


@udf.command("status")
@JSON_OPT
@click.pass_obj
def udf_status(obj: Context, as_json: bool) -> None:
    """Show registered vs packaged modules (by hash); exit 1 if any is missing or stale.

    --json prints [{"module", "state": "ok" | "stale" | "missing", "packaged", "registered"}].
    """
    backend = obj.backend(check_udfs=False)
    rows = udfs.status(backend)
    if as_json:
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
            # With the store's URL: typed without it, the advice registered on the default store.
            err_console.print(f"{udfs.register_advice(backend)} to upload the packaged modules", highlight=False,
                              soft_wrap=True, markup=False)
        sys.exit(1)
