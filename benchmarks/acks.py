"""What an ack batch costs the client: `Queue.complete_many` in its shapes.

    python -m benchmarks.acks --url aerospike://127.0.0.1:3000/test [--server-pid PID]
                              [--jobs 20000] [--batch 100] [--modes lease,claim]
                              [--results shared,each] [--leases 1,2]

One client, one thread, no peers: a list of `--jobs` jobs is reserved in
batches of `--batch` (`--leases` reserves of batch/leases jobs each, their jobs
interleaved, as in a worker's ack batch gathered from several threads) and
each batch acknowledged with one `complete_many`. `--results shared`: one
result object for the whole batch (None, or a constant: the benchmark peers'
ack); `each`: a result per job, as handlers that return something give.

Figures per row, for the `complete_many` calls only: client CPU µs per job
(user + system of this process), server CPU µs per job (from /proc of
`--server-pid`, while the calls ran; other clients of the server count too),
and round trips per 100 jobs. Every row checks that every job ended done, with
the result it was acknowledged with.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import Any

import click

import aeroqueue
from aeroqueue import keys
from aeroqueue.errors import ListNotFound
from aeroqueue.lists import JobLists
from aeroqueue.loading import Checked, JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session

from .harness import process_cpu_s


def _wrong_results(backend: Any, name: str, expected: dict[int, Any]) -> list[int]:
    """The tokens whose job record is not done with the result it was acknowledged with."""
    tokens = sorted(expected)
    wrong = []
    for lo in range(0, len(tokens), 5000):
        part = tokens[lo:lo + 5000]
        for token, (code, bins) in zip(part, backend.batch_bins(keys.JOB_SET, keys.job_names(name, part),
                                                               ["state", "result"]), strict=True):
            if code != 0 or bins is None or bins.get("state") != "done" or bins.get("result") != expected[token]:
                wrong.append(token)
    return wrong


def measure(url: str, server_pid: int | None, n: int, batch: int, mode: str, results: str, leases: int) -> dict[str, Any]:
    backend = aeroqueue.connect(url)  # a server without this client's UDFs is refused
    lists = JobLists(backend)
    name = f"ackbench-{uuid.uuid4().hex[:8]}"
    per = max(1, batch // leases)
    client = server = 0.0
    trips = acked = lost = 0
    session = None
    expected: dict[int, Any] = {}  # token -> the result it was acknowledged with
    try:
        lists.load(name, Checked(JobSpec(jid=str(i), payload={"i": i}) for i in range(n)))
        queue, session = Queue(backend), Session.open(backend)
        while True:
            got = [queue.reserve(name, session, per, lease=mode == "lease") for _ in range(leases)]
            if not any(got):
                break
            # Interleaved, as acks from several handler threads arrive.
            jobs = [g[i] for i in range(per) for g in got if i < len(g)]
            res: list[Any] = ["ok"] * len(jobs) if results == "shared" else [{"t": j.token} for j in jobs]
            s0, c0, r0 = process_cpu_s(server_pid), time.process_time(), backend.round_trips
            lost += len(queue.complete_many(jobs, res))
            client += time.process_time() - c0
            s1 = process_cpu_s(server_pid)
            if s0 is not None and s1 is not None:
                server += s1 - s0
            trips += backend.round_trips - r0
            acked += len(jobs)
            expected.update((j.token, r) for j, r in zip(jobs, res, strict=True))
        queue.flush()
        done = lists.status(name).done
        wrong = _wrong_results(backend, name, expected)
    finally:
        if session is not None:
            session.close()
        with contextlib.suppress(ListNotFound):  # the load failed before the list existed
            lists.drop(name, grace_s=0)
        backend.close()
    if done != n or lost or acked != n or wrong:
        raise click.ClickException(
            f"{mode}/{results}/{leases}: {acked} acked, {lost} lost, {done} done of {n}, "
            f"{len(wrong)} stored with another result (tokens {wrong[:5]})"
        )
    return {
        "mode": mode, "results": results, "leases": leases, "jobs": n, "batch": batch,
        "client_us_per_job": round(client / n * 1e6, 2),
        "server_us_per_job": round(server / n * 1e6, 2) if server_pid is not None else None,
        "trips_per_100_jobs": round(trips / n * 100, 2),
    }


@click.command()
@click.option("--url", envvar="AEROQUEUE_BENCH_URL", show_envvar=True, required=True,
              help="aerospike://host:port/namespace (or an embedded store's URL)")
@click.option("--server-pid", envvar="AEROQUEUE_BENCH_SERVER_PID", show_envvar=True, type=int, default=None,
              help="pid of the local asd, for its CPU per job")
@click.option("--jobs", type=int, default=20_000, show_default=True)
@click.option("--batch", type=int, default=100, show_default=True, help="jobs per complete_many")
@click.option("--modes", default="lease,claim", show_default=True, help="comma-separated: lease, claim")
@click.option("--results", "results_", default="shared,each", show_default=True,
              help="comma-separated: shared (one result object a batch), each (one a job)")
@click.option("--leases", "leases_", default="1,2", show_default=True, help="reserves a batch mixes, comma-separated")
def main(url: str, server_pid: int | None, jobs: int, batch: int, modes: str, results_: str, leases_: str) -> None:
    """Client CPU a job of acknowledging a batch, one JSON row per setting."""
    for mode in modes.split(","):
        for results in results_.split(","):
            for leases in (int(x) for x in leases_.split(",")):
                click.echo(json.dumps(measure(url, server_pid, jobs, batch, mode, results, leases)))


if __name__ == "__main__":
    main()
