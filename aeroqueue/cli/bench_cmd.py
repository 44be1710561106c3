"""`aeroqueue bench`: reserve + complete figures by list size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..config import resolve_url
from .context import (
    MODE_OPT,
    Context,
    err_console,
    option,
    progress_bar,
)


def _writable_file(ctx: click.Context, param: click.Parameter, value: Path | None) -> Path | None:
    """Where the figures go, checked before the benchmark runs (minutes), not after it."""
    if value is not None:
        folder = value.parent
        if not folder.is_dir():
            raise click.BadParameter(f"{str(folder)!r}: no such directory", ctx=ctx, param=param)
        if not os.access(folder, os.W_OK) or (value.exists() and not os.access(value, os.W_OK)):
            raise click.BadParameter(f"{str(value)!r}: not writable", ctx=ctx, param=param)
    return value


@click.command()
@option("--sizes", env="BENCH_SIZES", default="1000,1000000", help="List sizes to measure, comma-separated.")
@option("--sample", env="BENCH_SAMPLE", type=click.IntRange(10), default=2000, help="Jobs measured on the single path (5x on the batch path).")
@option("--batch", env="BENCH_BATCH", type=click.IntRange(2, 1000), default=50, help="Batch size of the batch path.")
@MODE_OPT
@option("--json-out", env="BENCH_JSON", type=click.Path(dir_okay=False, path_type=Path), default=None,
        callback=_writable_file, help="Also write the figures as JSON here.")
@option("--claims", env="BENCH_CLAIMS", is_flag=True, help="Instead, compare the ways a reaper can find a dead session's claims.")
@click.pass_obj
def bench(obj: Context, sizes: str, sample: int, batch: int, mode: str, json_out: Path | None, claims: bool) -> None:
    """Measure reserve + complete throughput and latency by list size.

    Without --url (or AEROQUEUE_URL) it runs on a scratch embedded store, removed
    at the end. Given a store, it loads lists named bench-SIZE-XXXXXX into it and
    deletes every record of them at the end, also when interrupted.
    """
    from .. import bench as benchmark

    try:
        size_list = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of integers: {sizes!r}", param_hint="--sizes") from None
    if not size_list or min(size_list) < 1:
        raise click.BadParameter(f"list sizes must be at least 1 job each: {sizes!r}", param_hint="--sizes")
    where = str(resolve_url(obj.url)) if obj.url else "a scratch embedded store"
    err_console.print(
        f"bench on {where}: " + ("its lists are deleted at the end" if obj.url else "removed at the end"), highlight=False
    )
    if claims:
        designs = benchmark.compare_claim_designs(obj.url, jobs=sample, create=obj.create)
        table = Table(title="finding a dead session's claims: cost on the single reserve + complete path")
        for col in ("design", "jobs/s", "round trips/job", "vs untracked"):
            table.add_column(col, justify="right")
        for d in designs:
            table.add_row(d.design, f"{d.jobs_per_s:,.0f}", f"{d.round_trips_per_job:.2f}", f"{d.vs_untracked:.2f}")
        Console().print(table)
        return

    mode = mode or "tokens"  # its lists are new: without --mode they are token stores, so the table says
    with progress_bar() as progress:
        rows = benchmark.run(obj.url, size_list, sample=sample, batch=batch, mode=mode, progress=progress, create=obj.create)
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
