"""The sync benchmark, small: both paths copy every processed job, and it prints both rates."""

from __future__ import annotations

import json

from click.testing import CliRunner
from rich.console import Console

from aeroqueue.cli.context import Context
from aeroqueue.sync_bench import print_result, run_bench, sync_bench_command


def test_bench_against_mysql_prints_both_rates(spark, mysql_url):
    result = run_bench(jobs=300, target_url=mysql_url, partitions=4, batch_size=50)
    assert result.plain_rows == result.spark_rows == 300
    assert result.spark_counts.marked == 300 and result.plain_rows_per_s > 0 and result.spark_rows_per_s > 0
    console = Console(record=True, width=200)
    print_result(result, console)
    text = console.export_text()
    assert "plain Python loop (1 process)" in text and "Spark" in text and "rows/s" in text
    assert "(scratch)" in result.target


def test_bench_command_on_sqlite_files(spark):
    out = CliRunner().invoke(sync_bench_command, ["--jobs", "120", "--partitions", "2", "--json"],
                             obj=Context(url=None, verbose=False))
    assert out.exit_code == 0, out.output
    got = json.loads(out.output.strip().splitlines()[-1])
    assert got["jobs"] == got["plain_rows"] == got["spark_rows"] == 120
    assert got["plain_rows_per_s"] > 0 and got["spark_rows_per_s"] > 0
