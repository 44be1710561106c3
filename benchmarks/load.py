"""`aeroqueue load` of generated CSV files: jobs/s and peak RSS by size and backend.

    python -m benchmarks.load [--url aerospike://127.0.0.1:3000/test] [--sizes 10000,100000,1000000]
                              [--server-pid PID] [--workers N] [--markdown out.md] [--json out.json]

Each row is one `aeroqueue load LIST FILE --json` run in its own process, as
a user runs it: the whole file is checked, then read again and written.
Figures: jobs/s over the whole command (check + write), the time of each
pass, the loader's peak RSS (from wait4, the child's own maximum) and its CPU
per job (peak RSS: the child's VmHWM, sampled every 20 ms); on a local server given by ``--server-pid``, the server's CPU per
job too, so that the machine's bound shows (client + server CPU per job on
the cores there are).

The embedded backend runs (unless ``--no-embedded``) on a scratch store per
size, deleted afterwards. ``--url`` adds a server: each list loaded there is removed
afterwards (batch removes), so nothing is left behind.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import click

from .harness import process_cpu_s

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)


@dataclass
class LoadRow:
    backend: str
    rows: int
    jobs_per_s: float
    check_s: float
    write_s: float
    wall_s: float
    peak_rss_mb: float
    client_cpu_us_per_job: float
    server_cpu_us_per_job: float | None


def make_csv(path: Path, n: int) -> None:
    """A customer export: id, email, plan, amount (small payloads, as in issue 19)."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "email", "plan", "amount"])
        for i in range(n):
            w.writerow([f"cust-{i:08d}", f"user{i}@example.com", ("free", "pro", "team")[i % 3], f"{(i * 37) % 1000}.00"])


def _remove_list(url: str, name: str, rows: int) -> None:
    """Everything the load wrote: job records, index entries, ID chunks, the list record."""
    from aerospike_helpers.batch.records import BatchRecords, Remove

    from aeroqueue import keys
    from aeroqueue.backends import open_backend

    backend = open_backend(url)
    head = backend.get(keys.LIST_SET, name)
    alloc = head.bins["alloc"] if head else rows
    ns = backend.namespace

    def remove(batch: list[tuple[str, str]]) -> None:
        backend.client.batch_write(BatchRecords([Remove((ns, s, k)) for s, k in batch]))

    names = [(keys.JOB_SET, keys.job_name(name, t)) for t in range(alloc)]
    names += [(keys.JIDX_SET, keys.jidx_name(name, f"cust-{i:08d}")) for i in range(rows)]
    names += [(keys.IDS_SET, keys.chunk_name(name, c)) for c in range(head.bins.get("seq", 0) if head else 0)]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(remove, [names[i:i + 5000] for i in range(0, len(names), 5000)]))
    backend.remove(keys.LIST_SET, name)
    backend.close()


def run(
    url: str | None, sizes: list[int], *, server_pid: int | None, workers: int | None, embedded: bool = True
) -> list[LoadRow]:
    rows: list[LoadRow] = []
    with tempfile.TemporaryDirectory(prefix="aeroqueue-loadbench-") as tmp:
        for n in sizes:
            path = Path(tmp) / f"jobs-{n}.csv"
            make_csv(path, n)
            if embedded:
                store = Path(tmp) / f"store-{n}.db"
                rows.append(_measure(f"embedded://{store}", path, n, None, workers))
                for suffix in ("", "-wal", "-shm", ".lock"):
                    Path(f"{store}{suffix}").unlink(missing_ok=True)
            if url:
                rows.append(_measure(url, path, n, server_pid, workers))
            path.unlink()
    return rows


def _measure(url: str, path: Path, n: int, server_pid: int | None, workers: int | None) -> LoadRow:
    # The child's own peak RSS: its VmHWM, sampled while it runs. (wait4's ru_maxrss would
    # not do: Linux carries the parent's RSS at fork over into the child's maximum.)
    cmd = [sys.executable, "-m", "aeroqueue", "--url", url, *(["--create"] if url.startswith("embedded") else []),
           "load", f"loadbench-{n}-{uuid.uuid4().hex[:6]}", str(path), "--json"]
    if workers:
        cmd += ["--workers", str(workers)]
    s0 = process_cpu_s(server_pid)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        peak = [0]
        watcher = threading.Thread(target=_watch_hwm, args=(proc.pid, peak), daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        watcher.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        s1 = process_cpu_s(server_pid)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise click.ClickException(f"load of {n:,} rows into {url} failed: {err.read().decode().strip()[-500:]}")
        summary = json.loads(out.read())
    name = summary["list"]
    if not url.startswith("embedded"):
        _remove_list(url, name, n)
    return LoadRow(
        backend="embedded" if url.startswith("embedded") else "aerospike",
        rows=n,
        jobs_per_s=n / wall,
        check_s=summary["check_s"],
        write_s=summary["load_s"],
        wall_s=wall,
        peak_rss_mb=peak[0] / 1024,
        client_cpu_us_per_job=(usage.ru_utime + usage.ru_stime) / n * 1e6,
        server_cpu_us_per_job=(s1 - s0) / n * 1e6 if s0 is not None and s1 is not None else None,
    )


def _watch_hwm(pid: int, peak: list[int]) -> None:
    """Keep the largest VmHWM (kB) of `pid` in peak[0] until the process is gone."""
    status = Path(f"/proc/{pid}/status")
    while True:
        try:
            text = status.read_text()
        except OSError:
            return
        if "VmHWM:" not in text:  # a zombie: exited, waiting for wait4
            return
        kb = int(text.split("VmHWM:", 1)[1].split()[0])
        peak[0] = max(peak[0], kb)
        time.sleep(0.02)


def markdown(rows: list[LoadRow]) -> str:
    lines = [
        "| backend | rows | jobs/s (whole command) | check s | write s | peak RSS MB | loader CPU µs/job | server CPU µs/job |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        server = f"{r.server_cpu_us_per_job:.1f}" if r.server_cpu_us_per_job is not None else "n/a"
        lines.append(f"| {r.backend} | {r.rows:,} | {r.jobs_per_s:,.0f} | {r.check_s:.2f} | {r.write_s:.2f} | "
                     f"{r.peak_rss_mb:.0f} | {r.client_cpu_us_per_job:.1f} | {server} |")
    return "\n".join(lines)


@click.command()
@click.option("--url", envvar="AEROQUEUE_BENCH_URL", show_envvar=True, default=None,
              help="Also load into this server (aerospike://host:port/ns); lists are removed afterwards.")
@click.option("--sizes", envvar="AEROQUEUE_BENCH_SIZES", show_envvar=True,
              default=",".join(str(s) for s in DEFAULT_SIZES), help="Row counts, comma-separated.")
@click.option("--server-pid", envvar="AEROQUEUE_BENCH_SERVER_PID", show_envvar=True, type=int, default=None,
              help="pid of a local asd, to report its CPU per job.")
@click.option("--workers", envvar="AEROQUEUE_LOAD_WORKERS", show_envvar=True, type=int, default=None,
              help="Ranges in flight (aeroqueue load --workers).")
@click.option("--no-embedded", is_flag=True, envvar="AEROQUEUE_BENCH_NO_EMBEDDED", show_envvar=True,
              help="Only the server given by --url.")
@click.option("--markdown", "md_out", envvar="AEROQUEUE_BENCH_MARKDOWN", show_envvar=True,
              type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the table here.")
@click.option("--json", "json_out", envvar="AEROQUEUE_BENCH_JSON", show_envvar=True,
              type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON here.")
def main(url: str | None, sizes: str, server_pid: int | None, workers: int | None, no_embedded: bool,
         md_out: Path | None, json_out: Path | None) -> None:
    """Load generated CSV files of each size; print jobs/s and peak RSS per backend."""
    try:
        size_list = [int(x) for x in sizes.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of integers: {sizes!r}", param_hint="--sizes") from None
    started = datetime.now(UTC)
    load_before = os.getloadavg()[0]
    if no_embedded and not url:
        raise click.UsageError("--no-embedded needs --url")
    rows = run(url, size_list, server_pid=server_pid, workers=workers, embedded=not no_embedded)
    table = markdown(rows)
    header = (f"Measured {started:%Y-%m-%d %H:%M} UTC on {os.cpu_count()} cores, {platform.platform()}, "
              f"Python {platform.python_version()}; load average {load_before:.1f} before, "
              f"{os.getloadavg()[0]:.1f} after.")
    click.echo(header)
    click.echo(table)
    if md_out:
        md_out.write_text(header + "\n\n" + table + "\n")
    if json_out:
        json_out.write_text(json.dumps({"started": started.isoformat(), "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
