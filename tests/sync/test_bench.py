"""The sync benchmark, small: both paths copy every processed job, and it prints both rates."""

from __future__ import annotations

import json

from click.testing import CliRunner
from rich.console import Console

from aeroqueue import keys
from aeroqueue.cli.context import Context
from aeroqueue.cli.sync_cmd import print_bench, sync_bench
from aeroqueue.sync.bench import run_bench


def test_bench_in_a_store_reads_marks_and_removes_only_its_own_list(registered, store_url, spark, mysql_url):
    before = {n for n, _ in registered.scan(keys.LIST_SET)}
    result = run_bench(jobs=300, store_url=store_url, target_url=mysql_url, partitions=4, batch_size=50)
    assert result.plain_rows == result.spark_rows == 300, "only the benchmark's own list is copied"
    assert result.floor_rows == 300 and result.floor_rows_per_s > 0, "the target alone, on the same rows"
    assert result.spark_counts.marked == 300 and result.plain_rows_per_s > 0 and result.spark_rows_per_s > 0
    assert {n for n, _ in registered.scan(keys.LIST_SET)} == before, "its list is gone afterwards"
    assert not [n for n, _ in registered.scan(keys.JOB_SET, bins=["list"]) if n.startswith("aq-bench-")]
    console = Console(record=True, width=200)
    print_bench(result, console)
    text = console.export_text()
    assert "plain Python loop (1 process)" in text and "Spark" in text and "rows/s" in text
    assert "the target alone" in text
    assert "(scratch)" in result.target


def test_bench_command_on_a_scratch_store_and_sqlite_files(spark):
    out = CliRunner().invoke(sync_bench, ["--jobs", "120", "--partitions", "2", "--json"],
                             obj=Context(url=None, verbose=False))
    assert out.exit_code == 0, out.output
    got = json.loads(out.output.strip().splitlines()[-1])
    assert got["jobs"] == got["plain_rows"] == got["spark_rows"] == got["floor_rows"] == 120
    assert got["plain_rows_per_s"] > 0 and got["spark_rows_per_s"] > 0 and got["floor_rows_per_s"] > 0


def test_bench_into_sqlite_files_runs_again_and_leaves_no_files(spark, tmp_path, spark_scratch):
    """A SQLite target URL names where the benchmark's scratch files go: they are its
    own, empty at the start of each run and gone at the end. (`spark_scratch`, the
    tests' own Spark scratch directory, is in tmp_path too.)"""
    target = f"sqlite://{tmp_path}/sync.db"
    for _ in range(2):
        result = run_bench(jobs=40, target_url=target, partitions=2, batch_size=15)
        assert result.plain_rows == result.spark_rows == result.floor_rows == 40
    assert sorted(p.name for p in tmp_path.iterdir() if p != spark_scratch) == [], "no scratch file is left behind"
