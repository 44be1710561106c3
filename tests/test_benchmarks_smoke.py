"""The peers benchmark, in small: a few dozen jobs on aeroqueue and Redis.

It checks the report's shape and the exactly-once audit, never timings (timed
tests flake). Redis is measured when it answers on 127.0.0.1:6379 and must be
reported as skipped, with the reason, when it does not; beanstalkd is pointed
at a binary that does not exist, so the skip path is always exercised.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.harness import RunRow, WorkerResult, _merge, with_retry
from benchmarks.peers import peers_command
from benchmarks.report import markdown
from tests.conftest import port_open

JOBS = 30
BATCH = 10
BATCH_JOBS = 40  # --batch-jobs: the batch runs load their own count


def _redis_up() -> bool:
    return importlib.util.find_spec("redis") is not None and port_open("127.0.0.1", 6379)


def test_harness_report_and_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    args = [
        "--jobs", str(JOBS), "--batch-jobs", str(BATCH_JOBS), "--clients", "2", "--batch", str(BATCH),
        "--peers", "redis,beanstalkd", "--beanstalkd-bin", str(tmp_path / "no-such-beanstalkd"),
        "--json", str(out), "--markdown", str(tmp_path / "report.md"), "--quiet", "--timeout", "60",
        "--settle", "0",  # no waiting for a quiet machine: this test checks no timings
    ]
    png = importlib.util.find_spec("matplotlib") is not None
    if png:
        args += ["--png", str(tmp_path / "report.png")]
    # No AEROQUEUE_URL from the environment: aeroqueue must run on a scratch embedded store.
    result = CliRunner().invoke(peers_command, args, env={"AEROQUEUE_URL": None})
    assert result.exit_code == 0, result.output + repr(result.exception)

    report = json.loads(out.read_text())
    assert report["schema"] == "aeroqueue-peers/1"
    assert {"nproc", "memory_gib", "cpu"} <= set(report["machine"])
    assert report["aeroqueue_backend"].startswith("embedded")
    assert report["params"]["jobs"] == JOBS and report["params"]["batch"] == BATCH
    assert report["params"]["batch_jobs"] == BATCH_JOBS
    assert report["scaling"] is None

    redis_up = _redis_up()
    peers = {p["name"]: p for p in report["peers"]}
    assert list(peers) == ["aeroqueue", "beanstalkd", "redis"]
    assert peers["beanstalkd"]["status"] == "skipped" and "not found" in peers["beanstalkd"]["reason"]
    assert peers["redis"]["status"] == ("ok" if redis_up else "skipped")
    for p in peers.values():
        if p["status"] == "ok":
            assert p["version"] and p["recipe"] and p["durability"]

    rows = {(r["peer"], r["mode"]): r for r in report["rows"]}
    measured = ["aeroqueue"] + (["redis"] if redis_up else [])
    assert set(rows) == {(p, m) for p in ["aeroqueue", "beanstalkd", "redis"] for m in ("single", f"batch {BATCH}")}
    for peer in measured:
        for mode in ("single", f"batch {BATCH}"):
            row = rows[peer, mode]
            assert row["status"] == "ok", row
            # Every job acked exactly once, by the clients' count and by the server's.
            jobs = JOBS if mode == "single" else BATCH_JOBS
            assert (row["jobs"], row["acked"], row["duplicates"], row["missing"]) == (jobs, jobs, 0, 0), row
            assert row["exactly_once"] and row["server_check"] is None, row
            if peer == "aeroqueue":  # the worker's path: acks ride with the next reservation
                assert 1 <= row["reserve_calls"] <= row["clients"], row
            else:
                assert row["reserve_calls"] >= (JOBS if mode == "single" else BATCH_JOBS // BATCH)
            assert row["round_trips_per_job"] > 0
            # CPU a job: the clients' own (every thread, to the nanosecond), and the whole
            # machine's (in 10 ms ticks: a run of 30 jobs may fit between two).
            assert row["client_cpu_us_per_job"] > 0 and row["machine_cpu_us_per_job"] >= 0, row
            assert row["clients"] == 2
    for mode in ("single", f"batch {BATCH}"):
        assert rows["aeroqueue", mode]["vs_aeroqueue_jobs_per_s"] == 1.0
        assert rows["aeroqueue", mode]["trips_source"] == "backend.round_trips"
        assert rows["beanstalkd", mode]["status"] == "skipped" and rows["beanstalkd", mode]["reason"]
        if not redis_up:
            assert rows["redis", mode]["status"] == "skipped" and rows["redis", mode]["reason"]

    text = markdown(report)
    assert "| peer | mode | clients | jobs/s |" in text and "skipped" in text
    assert f"{JOBS:,} jobs one at a time, {BATCH_JOBS:,} in batches" in text
    assert "| client CPU us/job | machine CPU us/job |" in text
    if png:
        assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_report_and_the_output_hold_no_password(tmp_path: Path) -> None:
    """The real command in its own process (the report quotes its command line):
    passwords in a URL typed wrongly, with a blank in them, or in a key=value DSN."""
    secret = "S3cr3t-peers-XYZ"
    out = tmp_path / "report.json"
    args = [
        "--jobs", str(JOBS), "--clients", "2", "--batch", str(BATCH), "--peers", "mysql",
        "--mysql-url", f"mysql//u:{secret}@127.0.0.1:3306/db",  # ':' forgotten: the peer is skipped
        "--redis-url", f"redis://u:{secret} x@127.0.0.1:6379/0",
        "--postgres-dsn", f"host=127.0.0.1 password={secret}",
        "--json", str(out), "--markdown", str(tmp_path / "report.md"), "--timeout", "60", "--settle", "0",
    ]
    env = {k: v for k, v in os.environ.items() if k != "AEROQUEUE_URL"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.peers", *args], capture_output=True, text=True,
                          timeout=240, env=env, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert "--mysql-url 'mysql//u:***@127.0.0.1:3306/db'" in report["command"], report["command"]
    assert "password=***" in report["command"]
    [mysql] = [p for p in report["peers"] if p["name"] == "mysql"]
    assert mysql["status"] == "skipped" and "mysql//u:***@" in mysql["reason"]
    for text in (done.stdout, done.stderr, out.read_text(), (tmp_path / "report.md").read_text()):
        assert secret not in text


def test_audit_catches_a_job_acked_twice_and_one_never_acked() -> None:
    def result(index: int, acked: list[int]) -> WorkerResult:
        return WorkerResult(index, array("q", acked), array("q", [1000] * len(acked)), array("q"), 0, 0, 0, 0.0, 1.0, False)

    row = RunRow(peer="x", mode="single", batch=1, clients=2, jobs=4, expected=4, status="ok")
    _merge(row, [result(0, [0, 1]), result(1, [1, 3])], 0.5, [], "adapter calls")
    assert (row.acked, row.duplicates, row.missing, row.exactly_once) == (4, 1, 1, False)


def test_retry_repeats_only_what_a_worker_would_retry() -> None:
    attempts: list[int] = []
    retried: list[int] = []

    def deadlocks_twice() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise DeadlockError("1213 deadlock found when trying to get lock")
        return "claimed"

    def retryable(e: BaseException) -> bool:
        return isinstance(e, DeadlockError)

    assert with_retry(deadlocks_twice, retryable, lambda: retried.append(1), base_s=0) == "claimed"
    assert (len(attempts), len(retried)) == (3, 2)

    def broken() -> None:
        raise ValueError("not a deadlock")

    with pytest.raises(ValueError):
        with_retry(broken, retryable, lambda: retried.append(1), base_s=0)
    assert len(retried) == 2  # a non-retryable error is raised at once


class DeadlockError(Exception):
    pass


def test_load_benchmark_in_small(tmp_path: Path, store_url: str) -> None:
    """`python -m benchmarks.load`: one row per backend with its figures, and a server's
    list removed afterwards (nothing left behind)."""
    from aeroqueue import keys
    from aeroqueue.backends import open_backend
    from benchmarks.load import main as load_bench

    server = None if store_url.startswith("embedded") else store_url
    out = tmp_path / "load.json"
    result = CliRunner().invoke(load_bench, ["--sizes", "300", "--json", str(out),
                                             *(["--url", server] if server else [])])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["rows"]) for r in rows] == [("embedded", 300)] + ([("aerospike", 300)] if server else [])
    for r in rows:
        assert r["jobs_per_s"] > 0 and r["peak_rss_mb"] > 10 and r["client_cpu_us_per_job"] > 0
    assert "| embedded | 300 |" in result.output
    if server:
        backend = open_backend(server)
        names = [n for n, _ in backend.scan(keys.LIST_SET, bins=["mode"]) if n.startswith("loadbench-300-")]
        assert names == [], "the benchmark's lists are removed from the server"
        backend.close()


def test_load_floor_benchmark_in_small(store_url: str) -> None:
    """`python -m benchmarks.load_floor`: one JSON row per setting, every write landed,
    and the records it wrote removed afterwards. Server only: it measures the client."""
    if store_url.startswith("embedded"):
        pytest.skip("the floor is measured against a real server")
    from aeroqueue.backends import open_backend
    from benchmarks.load_floor import main as floor_bench

    result = CliRunner().invoke(floor_bench, ["--url", store_url, "--jobs", "300", "--batch", "100",
                                              "--threads", "2", "--procs", "1", "--shapes", "job+jidx,jidx"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["shape"], r["jobs"], r["failures"]) for r in rows] == [("job+jidx", 300, 0), ("jidx", 300, 0)]
    assert all(r["jobs_per_s"] > 0 and r["client_us_per_job"] > 0 for r in rows)
    backend = open_backend(store_url)
    left = [k for k, _ in backend.scan("aq_job") if str(k).startswith("floor-")]
    backend.close()
    assert left == [], "the benchmark's records are removed"


def test_ack_benchmark_in_small(store_url: str, registered: Any) -> None:
    """`python -m benchmarks.acks`: one JSON row per shape, each having checked that
    every job ended done, and its lists dropped afterwards (`registered`: the store
    runs the UDFs, as the benchmark requires of a server)."""
    from aeroqueue import keys
    from aeroqueue.backends import open_backend
    from benchmarks.acks import main as ack_bench

    def bench_lists() -> set[str]:  # on a shared server, another run's may stand beside ours
        backend = open_backend(store_url)
        try:
            return {str(n) for n, _ in backend.scan(keys.LIST_SET, bins=["mode"]) if str(n).startswith("ackbench-")}
        finally:
            backend.close()

    before = bench_lists()
    result = CliRunner().invoke(ack_bench, ["--url", store_url, "--jobs", "40", "--batch", "10",
                                            "--modes", "lease,claim", "--results", "shared,each", "--leases", "1,2"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["mode"], r["results"], r["leases"]) for r in rows] == [
        (m, r, n) for m in ("lease", "claim") for r in ("shared", "each") for n in (1, 2)
    ]
    assert all(r["client_us_per_job"] > 0 and r["trips_per_100_jobs"] > 0 for r in rows)
    assert bench_lists() <= before, "the benchmark's lists are dropped"


def test_lease_floor_acks_what_it_read_once_and_nothing_changed_since(store_url: str) -> None:
    """The `lease-floor` peer's ack admits a job only while it is still queued with the
    attempt count the reserve read: a second ack, or one after somebody else moved the
    job on, is refused. On both backends (its figures count only on a server)."""
    from aerospike_helpers.operations import operations as op

    from aeroqueue import keys
    from aeroqueue.backends import open_backend
    from benchmarks.peer_aeroqueue import AeroqueuePeer

    peer = AeroqueuePeer(store_url, path="lease-floor")
    peer.start()
    prepared = peer.prepare(20)
    worker = prepared.worker(prepared.config)
    backend = open_backend(store_url)
    try:
        first = worker.reserve(10)
        assert sorted(n for n, _ in first) == list(range(10))
        assert sorted(worker.ack(first)) == list(range(10))
        assert worker.ack(first) == [], "a job already done is refused"
        second = worker.reserve(10)
        _, (token, _, _) = second[0]
        # Somebody else moved this job on after it was read (a reaper's requeue counts an attempt).
        backend.operate(keys.JOB_SET, keys.job_name(prepared.config["list"], token), [op.increment("att", 1)])
        assert sorted(worker.ack(second)) == sorted(n for n, _ in second[1:])
        assert worker.reserve(10) == []
        assert peer.verify(prepared, 19) is None, "the server counts 19 jobs done"
    finally:
        backend.close()
        worker.close()
        peer.discard(prepared)
        peer.stop()


def test_rounds_interleave_and_report_medians(tmp_path: Path) -> None:
    """`--rounds 2`: every peer measured twice, each round's ratios against that round's
    aeroqueue, one table per round and a table of medians over the rounds."""
    import statistics

    out = tmp_path / "report.json"
    args = ["--jobs", "20", "--clients", "1", "--batch", "5", "--peers", "none", "--rounds", "2",
            "--json", str(out), "--quiet", "--timeout", "60", "--settle", "0"]
    result = CliRunner().invoke(peers_command, args, env={"AEROQUEUE_URL": None})
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(out.read_text())
    assert report["params"]["rounds"] == 2
    rows = report["rows"]
    assert [(r["mode"], r["round"]) for r in rows] == [("single", 1), ("batch 5", 1), ("single", 2), ("batch 5", 2)]
    assert all(r["exactly_once"] and r["vs_aeroqueue_jobs_per_s"] == 1.0 for r in rows)

    text = markdown(report)
    assert "(round 1 of 2)" in text and "(round 2 of 2)" in text and "Medians over the 2 rounds" in text
    medians = text.split("Medians over the 2 rounds", 1)[1]
    for mode in ("single", "batch 5"):
        rates = [r["jobs_per_s"] for r in rows if r["mode"] == mode]
        line = next(line for line in medians.splitlines() if line.startswith(f"| aeroqueue | {mode} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[3] == "2" and cells[4] == f"{statistics.median(rates):,.0f}", line
        assert cells[5] == f"{min(rates):,.0f} to {max(rates):,.0f}", line
        assert cells[-1] == "yes, all 2 rounds", line
    # The chart shows one measured row per peer and mode: the median round's.
    from benchmarks.report import representative

    picked = representative(rows)
    assert [(r["mode"], r["jobs_per_s"]) for r in picked] == [
        (mode, min(r["jobs_per_s"] for r in rows if r["mode"] == mode)) for mode in ("single", "batch 5")
    ]


def test_batch_jobs_size_every_batch_run_and_only_those(tmp_path: Path) -> None:
    """`--batch-jobs`: the batch runs load their own count, in the main run and in the
    client-count run of `--scaling` alike; the one-at-a-time runs and the list sizes
    keep theirs, and every title says which count is which."""
    from benchmarks.report import titles

    out = tmp_path / "report.json"
    args = ["--jobs", "12", "--batch-jobs", "18", "--clients", "1", "--batch", "5", "--peers", "none",
            "--scaling", "--scaling-sizes", "10,20", "--scaling-clients", "1,2", "--sample", "5",
            "--json", str(out), "--quiet", "--timeout", "60", "--settle", "0"]
    result = CliRunner().invoke(peers_command, args, env={"AEROQUEUE_URL": None})
    assert result.exit_code == 0, result.output + repr(result.exception)
    report = json.loads(out.read_text())
    runs = report["rows"] + report["scaling"]["clients"]
    assert sorted((r["clients"], r["mode"], r["jobs"], r["acked"]) for r in runs) == [
        (1, "batch 5", 18, 18), (1, "batch 5", 18, 18), (1, "single", 12, 12), (1, "single", 12, 12),
        (2, "batch 5", 18, 18), (2, "single", 12, 12),
    ]
    assert sorted(r["jobs"] for r in report["scaling"]["list_size"]) == [10, 20]
    names = titles(report)
    assert "12 jobs one at a time, 18 in batches" in names["main"]
    assert "12 jobs one at a time, 18 in batches" in names["clients"]


def test_list_sizes_are_sampled_in_interleaved_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_sizes`: every list loaded first, then sampled a share at a time, all lists
    in each turn; each row's figures span all its turns, and its jobs are audited
    across them (the sample taken once, nothing acked twice)."""
    from benchmarks import harness
    from benchmarks.peer_aeroqueue import AeroqueuePeer

    order: list[tuple[str, int | None]] = []
    drive = harness._drive

    def spy(prepared: harness.Prepared, **kw: object) -> object:
        order.append((prepared.config["list"], kw["max_jobs"]))  # type: ignore[arg-type]
        return drive(prepared, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(harness, "_drive", spy)
    peer = AeroqueuePeer(None, "aeroqueue-api")
    peer.start()
    try:
        rows = harness.run_sizes(peer, sizes=[12, 40], sample=25, turns=3, timeout_s=60, settle_s=0)
    finally:
        peer.stop()
    small, big = order[0][0], order[1][0]
    assert order == [(small, 4), (big, 9), (small, 4), (big, 8), (small, 4), (big, 8)]
    assert [(r.jobs, r.expected, r.acked, r.reserve_calls) for r in rows] == [(12, 12, 12, 12), (40, 25, 25, 25)]
    assert all(r.exactly_once and r.status == "ok" and r.server_check is None for r in rows), rows
    assert all(r.load_s and r.load_s > 0 and r.elapsed_s > 0 and r.reserve_p50_ms > 0 for r in rows)


def test_record_benchmark_in_small(store_url: str) -> None:
    """`python -m benchmarks.records` runs every variant on records of its own, each
    write admitted by its filter, and deletes them (on both backends; its figures
    count only on a server)."""
    from aeroqueue.backends import open_backend
    from benchmarks.records import SET, VARIANTS
    from benchmarks.records import main as record_bench

    def names_in_set() -> set[str]:  # another run on a shared server may have its own there
        backend = open_backend(store_url)
        try:
            return {str(n) for n, _ in backend.scan(SET, bins=["state"])}
        finally:
            backend.close()

    before = names_in_set()
    result = CliRunner().invoke(record_bench, ["--url", store_url, "--calls", "3", "--batch", "5", "--rounds", "2"])
    assert result.exit_code == 0, result.output + repr(result.exception)
    for name in VARIANTS:
        assert result.output.count(f"round 1 {name}: server None us, client") == 1, result.output
        assert result.output.count(f"round 2 {name}: server None us, client") == 1, result.output
    assert names_in_set() <= before, "the benchmark's records are deleted"


def test_record_benchmark_refuses_a_figure_of_refused_writes(store_url: str) -> None:
    """A filter that refuses a record (here: the lease ack's, for an attempt count the
    records do not have) would measure less work than an ack: the benchmark says so
    and gives no figure, and still deletes its records."""
    import click as click_

    from aeroqueue import hotpath
    from aeroqueue.backends import open_backend
    from benchmarks.records import ACK_OPS, SET, Variant, _write, measure

    backend = open_backend(store_url)
    try:
        before = {str(n) for n, _ in backend.scan(SET, bins=["state"])}
        wrong = Variant("wrong-att", "a filter for attempt 1", _write(ACK_OPS, lambda: hotpath.lease_filter(1, None)))
        with pytest.raises(click_.ClickException, match="wrong-att: 10 of 10 records refused"):
            measure(backend, None, wrong, calls=2, batch=5)
        assert {str(n) for n, _ in backend.scan(SET, bins=["state"])} <= before
    finally:
        backend.close()
