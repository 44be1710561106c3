"""What one record touch costs the server: the lease path's read and ack write, alone.

    python -m benchmarks.records --url aerospike://127.0.0.1:3000/test --server-pid PID
                                 [--calls 1000] [--batch 100] [--rounds 2] [--variants ...]

A leased job costs the server two record touches: the lease's batch read of the
job record and the ack's filtered batch write. This measures each touch with
nothing around it (one client, one thread, no lists, sessions or bits), and
the ack write stripped of its filter and expressions piece by piece, to tell
what the guarantees cost from what touching a record costs at all
(`benchmarks/RESULTS.md`, "Where the server's share goes").

Every variant runs `--calls` batch calls of `--batch` records, on records of a
set of its own (`aq_bench_rec`) written fresh for it as a never-reserved job
record (queued, attempt 0) and deleted after: every write is admitted by its
filter, and the run checks that each one was. Variants run interleaved,
`--rounds` times. Per variant: server CPU µs a record (from /proc of
`--server-pid` while the calls ran: anything else the server does counts too,
and /proc counts in 10 ms ticks), and client CPU µs a record (this process).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from aerospike_helpers.operations import operations as op
from rich.console import Console
from rich.table import Table

from aeroqueue import hotpath
from aeroqueue.backends import Backend, open_backend

from .harness import CLOCK_TICKS, process_cpu_s

SET = "aq_bench_rec"
WRITE_CHUNK = 1000  # records a batch call when writing and deleting them outside the measurement
FAR_MS = 3_600_000  # the lease's end and the request's deadline: an hour ahead, so every filter admits


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    # One batch call on the given record names: each record's code (0: done, or read).
    call: Callable[[Backend, list[str]], list[int]]


def _write(ops: list[dict], expression: Callable[[], Any] | None) -> Callable[[Backend, list[str]], list[int]]:
    def call(backend: Backend, names: list[str]) -> list[int]:
        return backend.batch_same_codes(SET, names, ops, expression=expression() if expression else None)

    return call


def _read(backend: Backend, names: list[str]) -> list[int]:
    return [code if bins is not None else 2 for code, bins in backend.batch_bins(SET, names, hotpath.LEASE_READS_LIST)]


def _later() -> int:
    return int(time.time() * 1000) + FAR_MS


ACK_OPS = hotpath.lease_done_ops("bench-session", "bench-lease", "ok")
VARIANTS = {
    v.name: v
    for v in (
        Variant("ack", "the lease ack: its five writes and result, its full filter (state, att, claimed, "
                "lease end, deadline)",
                _write(ACK_OPS, lambda: hotpath.lease_filter(0, None, until=_later(), deadline=_later()))),
        Variant("ack-no-deadline", "the same without the deadline condition",
                _write(ACK_OPS, lambda: hotpath.lease_filter(0, None, until=_later()))),
        Variant("ack-no-done-at", "the same without the done_at expression write",
                _write([o for o in ACK_OPS if o.get("bin") != "done_at"],
                       lambda: hotpath.lease_filter(0, None, until=_later(), deadline=_later()))),
        Variant("state-filter", "the ack's writes, filter on state alone", _write(ACK_OPS, hotpath.queued_filter)),
        Variant("one-bin-filtered", "one bin written, filter on state",
                _write([op.write("state", "done")], hotpath.queued_filter)),
        Variant("one-bin", "one bin written, no filter", _write([op.write("state", "done")], None)),
        Variant("lease-read", "the lease's batch read of its six bins", _read),
    )
}


def _prepare(backend: Backend, names: list[str]) -> None:
    """Each name a job record with the bins a load writes: queued, never attempted."""
    for lo in range(0, len(names), WRITE_CHUNK):
        part = names[lo:lo + WRITE_CHUNK]
        codes = backend.batch_operate(SET, [
            (n, [op.write("list", "records-bench"), op.write("att", 0), op.write("max_att", 5),
                 op.write("state", "queued"), op.write("jid", n), op.write("token", lo + i),
                 op.write("payload", {"i": lo + i})])
            for i, n in enumerate(part)
        ])
        if any(codes):
            raise click.ClickException(f"could not write the records to measure: codes {sorted(set(codes))}")


def _delete(backend: Backend, names: list[str]) -> None:
    """Delete the records (those never written included: a failed `_prepare`)."""
    failed: set[int] = set()
    for lo in range(0, len(names), WRITE_CHUNK):
        codes = backend.batch_operate(SET, [(n, [op.delete()]) for n in names[lo:lo + WRITE_CHUNK]])
        failed.update(c for c in codes if c not in (0, 2))  # 2: not there
    if failed:
        raise click.ClickException(f"could not delete every record of set {SET}: codes {sorted(failed)}")


def measure(backend: Backend, server_pid: int | None, variant: Variant, calls: int, batch: int) -> dict[str, Any]:
    """One variant on fresh records: CPU µs a record, server's and client's."""
    names = [f"rec-{uuid.uuid4().hex[:12]}-{i}" for i in range(calls * batch)]
    client = server = 0.0
    refused = 0
    try:
        _prepare(backend, names)
        for lo in range(0, len(names), batch):
            part = names[lo:lo + batch]
            s0, c0 = process_cpu_s(server_pid), time.process_time()
            codes = variant.call(backend, part)
            client += time.process_time() - c0
            s1 = process_cpu_s(server_pid)
            if s0 is not None and s1 is not None:
                server += s1 - s0
            refused += sum(1 for c in codes if c != 0)
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            _delete(backend, names)
        raise
    _delete(backend, names)
    if refused:
        # A refused write costs the server less than one admitted: the figure would mislead.
        raise click.ClickException(f"{variant.name}: {refused} of {len(names)} records refused or missing")
    return {
        "variant": variant.name,
        "records": len(names),
        "server_us": round(server / len(names) * 1e6, 1) if server_pid is not None else None,
        "client_us": round(client / len(names) * 1e6, 1),
    }


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise click.BadParameter(f"unknown variant(s) {', '.join(unknown) or '(none given)'}: choose from "
                                 f"{', '.join(VARIANTS)}", param_hint="--variants")
    return names


@click.command()
@click.option("--url", envvar="AEROQUEUE_BENCH_URL", show_envvar=True, required=True,
              help="aerospike://host:port/namespace (an embedded store's URL runs too: its figures say nothing "
              "about a server)")
@click.option("--server-pid", envvar="AEROQUEUE_BENCH_SERVER_PID", show_envvar=True, type=int, default=None,
              help="pid of the local asd, for its CPU a record")
@click.option("--calls", type=click.IntRange(1), default=1000, show_default=True, help="batch calls a variant")
@click.option("--batch", type=click.IntRange(1, 5000), default=100, show_default=True, help="records a call")
@click.option("--rounds", type=click.IntRange(1, 50), default=2, show_default=True,
              help="every variant this many times, interleaved")
@click.option("--variants", "variants_", default=",".join(VARIANTS), show_default=True,
              help="comma-separated, from: " + ", ".join(VARIANTS))
def main(url: str, server_pid: int | None, calls: int, batch: int, rounds: int, variants_: str) -> None:
    """Server and client CPU a record of one batch read or write, by variant."""
    chosen = _names(variants_)
    if server_pid is not None:
        process_cpu_s(server_pid)  # a wrong pid fails here, not after minutes
    backend = open_backend(url)
    console = Console(stderr=True)
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in chosen}
    try:
        for round_no in range(1, rounds + 1):
            for name in chosen:
                row = measure(backend, server_pid, VARIANTS[name], calls, batch)
                rows[name].append(row)
                console.print(f"round {round_no} {name}: server {row['server_us']} us, client {row['client_us']} us a record")
    finally:
        backend.close()
    # /proc counts the server's CPU in ticks: one tick over the records of a variant.
    tick_us = 1e6 / CLOCK_TICKS / (calls * batch)
    table = Table(title=f"CPU µs a record: {calls:,} calls of {batch} records a variant, {rounds} round(s), "
                  f"interleaved; the server's figures step by {tick_us:.2g} µs (one /proc tick)")
    for col in ("variant", "what", "server, each round", "client, each round", "server median", "client median"):
        table.add_column(col)
    for name in chosen:
        server = [r["server_us"] for r in rows[name] if r["server_us"] is not None]
        client = [r["client_us"] for r in rows[name]]
        table.add_row(
            name, VARIANTS[name].what,
            ", ".join(f"{x:.1f}" for x in server) or "-", ", ".join(f"{x:.1f}" for x in client),
            f"{statistics.median(server):.1f}" if server else "-", f"{statistics.median(client):.1f}",
        )
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
