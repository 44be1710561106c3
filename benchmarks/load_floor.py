"""The floor of loading into a server: bare `batch_write`s of records shaped like a load's.

    python -m benchmarks.load_floor --url aerospike://127.0.0.1:3000/test --server-pid PID
                                    [--jobs 1000000] [--batch 1000] [--threads 1,4] [--procs 1,2]
                                    [--shapes job+jidx,job,jidx,job-json]

No parsing, no checks, no allocation or publication: pre-built batches of
create-only writes, sent by T threads in each of P processes, then removed.
What it measures is what the client library and the server cost per record
on this machine, which no loader built on them can beat:

- ``job+jidx``: what a load writes per job (a 7-bin job record with a map
  payload, and its one-bin job-id index entry);
- ``job``: the job record alone; ``jidx``: the index entry alone;
- ``job-json``: the job record with its payload as one JSON string instead
  of a map (fewer objects for the client to convert).

Figures per row: jobs/s (wall), client CPU µs per job (all processes, user +
system), server CPU µs per job (from /proc of ``--server-pid``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import aerospike
import click
from aerospike_helpers.batch.records import BatchRecords, Remove, Write
from aerospike_helpers.operations import operations as op

from .harness import process_cpu_s

_CREATE = {"exists": aerospike.POLICY_EXISTS_CREATE, "key": aerospike.POLICY_KEY_SEND}


def _payload(i: int) -> dict[str, str]:
    return {"email": f"user{i}@example.com", "plan": ("free", "pro", "team")[i % 3], "amount": f"{(i * 37) % 1000}.00"}


def _writes(ns: str, shape: str, name: str, lo: int, hi: int) -> list[Write]:
    out: list[Write] = []
    same = [op.write("list", name), op.write("state", "queued"), op.write("att", 0), op.write("max_att", 3)]
    for t in range(lo, hi):
        jid = f"cust-{t:08d}"
        if shape in ("job+jidx", "job", "job-json"):
            payload: Any = _payload(t) if shape != "job-json" else json.dumps(_payload(t), separators=(",", ":"))
            out.append(Write((ns, "aq_job", f"{name}/{t}"),
                             [op.write("token", t), op.write("jid", jid), op.write("payload", payload), *same],
                             policy=_CREATE))
        if shape in ("job+jidx", "jidx"):
            out.append(Write((ns, "aq_jidx", f"{name}/{jid}"), [op.write("tok", t)], policy=_CREATE))
    return out


def _connect(host: str, port: int) -> Any:
    return aerospike.client({"hosts": [(host, port)], "policies": {"batch": {"total_timeout": 30_000}}}).connect()


def _proc(host: str, port: int, ns: str, shape: str, name: str, lo: int, hi: int, batch: int, threads: int,
          build_inside: bool) -> tuple[float, int, float, float]:
    """One process: `threads` threads writing [lo, hi) in batches.
    Returns (its CPU s, failures, start, end): wall times after any pre-building."""
    client = _connect(host, port)
    ranges = [(a, min(a + batch, hi)) for a in range(lo, hi, batch)]
    prebuilt = None if build_inside else [_writes(ns, shape, name, a, b) for a, b in ranges]
    failures = 0
    c0 = time.process_time()
    start = time.time()

    def one(k: int) -> int:
        a, b = ranges[k]
        recs = prebuilt[k] if prebuilt is not None else _writes(ns, shape, name, a, b)
        out = client.batch_write(BatchRecords(recs))
        return sum(1 for r in out.batch_records if r.result != 0)

    with ThreadPoolExecutor(threads) as pool:
        failures = sum(pool.map(one, range(len(ranges))))
    end = time.time()
    cpu = time.process_time() - c0
    client.close()
    return cpu, failures, start, end


def _remove(host: str, port: int, ns: str, name: str, n: int) -> None:
    client = _connect(host, port)
    keys = [(ns, "aq_job", f"{name}/{t}") for t in range(n)] + [(ns, "aq_jidx", f"{name}/cust-{t:08d}") for t in range(n)]
    for i in range(0, len(keys), 5000):
        client.batch_write(BatchRecords([Remove(k) for k in keys[i:i + 5000]]))
    client.close()


def measure(url: str, server_pid: int | None, n: int, batch: int, threads: int, procs: int, shape: str,
            build_inside: bool) -> dict[str, Any]:
    rest = url.split("://", 1)[1]
    hostport, ns = rest.split("/", 1)
    host, port = hostport.split(":")
    name = f"floor-{uuid.uuid4().hex[:6]}"
    per = -(-n // procs)
    spans = [(p * per, min(n, (p + 1) * per)) for p in range(procs)]
    with ProcessPoolExecutor(procs) as pool:
        # The server's CPU covers the processes' building too, when it idles: fine, it idles.
        s0 = process_cpu_s(server_pid)
        futs = [pool.submit(_proc, host, int(port), ns, shape, name, a, b, batch, threads, build_inside) for a, b in spans]
        results = [f.result() for f in futs]
        s1 = process_cpu_s(server_pid)
    # From the first process's start of writing to the last one's end.
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    _remove(host, int(port), ns, name, n)
    cpu = sum(r[0] for r in results)
    return {
        "shape": shape, "jobs": n, "batch": batch, "threads": threads, "procs": procs, "build_inside": build_inside,
        "wall_s": round(wall, 2), "jobs_per_s": round(n / wall), "client_us_per_job": round(cpu / n * 1e6, 1),
        "server_us_per_job": round((s1 - s0) / n * 1e6, 1) if s0 is not None and s1 is not None else None,
        "failures": sum(r[1] for r in results), "load_avg": round(os.getloadavg()[0], 1),
    }


@click.command()
@click.option("--url", required=True, help="aerospike://host:port/namespace")
@click.option("--server-pid", type=int, default=None, help="pid of the local asd, for its CPU per job")
@click.option("--jobs", type=int, default=1_000_000)
@click.option("--batch", "batches", default="1000", help="records per batch_write (jobs), comma-separated")
@click.option("--threads", "threads_", default="1,4", help="threads per process, comma-separated")
@click.option("--procs", "procs_", default="1,2", help="processes, comma-separated")
@click.option("--shapes", default="job+jidx", help="comma-separated: job+jidx, job, jidx, job-json")
@click.option("--build-inside", is_flag=True, help="build the Write objects inside the timed loop (as a loader does)")
def main(url: str, server_pid: int | None, jobs: int, batches: str, threads_: str, procs_: str, shapes: str,
         build_inside: bool) -> None:
    """Bare batch_write throughput with pre-built batches: the floor of a load."""
    for shape in shapes.split(","):
        for b in (int(x) for x in batches.split(",")):
            for p in (int(x) for x in procs_.split(",")):
                for t in (int(x) for x in threads_.split(",")):
                    click.echo(json.dumps(measure(url, server_pid, jobs, b, t, p, shape, build_inside)))


if __name__ == "__main__":
    main()
