"""The MySQL password never appears in output or logs: not on success, not in errors,
not in Spark's own logging (the whole spark-submit entry script runs in a child process)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from aeroqueue.cli.context import Context
from aeroqueue.cli.sync_cmd import sync as sync_command

from .helpers import make_jobs, mysql_port_closed

ROOT = Path(__file__).resolve().parents[2]


def _run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "sync" / "aeroqueue_sync.py"), *args],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, **(env or {})},
    )


def test_a_connection_error_through_the_spark_submit_script_names_no_password(registered, store_url, mysql_db,
                                                                              mysql_user, list_name):
    """The whole entry script in a child process: its error output, Spark's included.
    A successful run through it (--verbose, password in the URL) is checked in
    test_sync_cluster.py, on a standalone cluster."""
    if not registered.is_embedded:
        pytest.skip("a child process on the embedded store is enough to read every log line")
    user, password = mysql_user
    make_jobs(registered, list_name, done=2)
    # From the environment, against a port where nothing listens: one clear line, no password.
    port = mysql_port_closed()
    bad = _run_script("--url", store_url, "sync", "--mysql", f"mysql://{user}@127.0.0.1:{port}/{mysql_db}",
                      env={"AEROQUEUE_MYSQL_PASSWORD": password})
    everything = bad.stdout + bad.stderr
    assert bad.returncode == 1
    assert f"error: cannot connect to mysql://{user}:***@127.0.0.1:{port}/{mysql_db}" in bad.stderr
    assert password not in everything and "Traceback" not in everything


def test_wrong_password_error_and_logs_hold_no_password(registered, store_url, mysql_db, mysql_user, caplog):
    user, password = mysql_user
    wrong = password + "-wrong"
    caplog.set_level(logging.DEBUG)
    out = CliRunner().invoke(
        sync_command, ["--mysql", f"mysql://{user}:{wrong}@127.0.0.1:3306/{mysql_db}"],
        obj=Context(url=store_url, verbose=True),
    )
    assert out.exit_code != 0
    message = str(out.exception)
    assert "Access denied" in message and f"mysql://{user}:***@" in message
    for text in (out.output, message, caplog.text):
        assert wrong not in text and password not in text


def test_the_demo_shows_and_passes_its_target_without_the_password(registered, store_url, mysql_db, mysql_user,
                                                                   list_name, monkeypatch):
    """`make demo` with AEROQUEUE_DEMO_MYSQL holding a password: its summary printed the
    URL as given, and its sync's command line (which ps shows anyone) held it too."""
    if not registered.is_embedded:
        pytest.skip("the demo runs on an embedded store")
    from aeroqueue import demo

    user, password = mysql_user
    target = f"mysql://{user}:{password}@127.0.0.1:3306/{mysql_db}"
    make_jobs(registered, list_name, done=2)
    monkeypatch.setattr(demo, "LISTS", {list_name: ("tokens", 2)})  # the rows `_sync` counts
    children: list[tuple[list[str], dict[str, str]]] = []

    # The child's command line and environment are what is checked: no Spark runs (a
    # JVM costs the suite half a minute), and the rows it would copy are counted as 2.
    def recorded(cmd: list[str], **kw: Any) -> Any:
        children.append((list(cmd), dict(kw.get("env") or os.environ)))
        return subprocess.CompletedProcess(cmd, 0, stdout="{}", stderr="")

    class Counted:
        dialect = SimpleNamespace(placeholder="%s")

        def __init__(self, _target: Any) -> None: ...
        def __enter__(self) -> Counted: return self
        def __exit__(self, *exc: object) -> None: ...
        def execute(self, sql: str, params: list[str]) -> list[tuple[int]]:
            assert params == [list_name, 7]  # the list and its stamp
            return [(2,)]

    monkeypatch.setattr(demo.subprocess, "run", recorded)
    monkeypatch.setattr(demo, "Sink", Counted)
    shown = io.StringIO()
    console = Console(file=shown, width=200)
    rows, note = demo._sync(console, store_url, target, {list_name: 7})
    demo._show_target(console, target)
    assert (rows, note) == (2, ""), shown.getvalue()
    assert f"sync target: mysql://{user}:***@127.0.0.1:3306/{mysql_db}" in shown.getvalue()
    assert password not in shown.getvalue()
    [(cmd, env)] = children
    assert password not in " ".join(cmd) and env["AEROQUEUE_MYSQL"] == target
