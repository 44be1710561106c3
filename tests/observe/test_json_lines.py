"""AEROQUEUE_LOG_FORMAT=json: every line a process logs is a JSON object, whoever logs
it (the package, a handler's own `logging` calls, werkzeug's request lines, Python's
warnings), and no line holds a URL's password. Only the package's loggers logged
JSON: the others printed text lines into the same stream, which a log shipper that
parses JSON lines could not read."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from aeroqueue.backends import Backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from tests.observe.conftest import free_port, spawn, stop
from tests.observe.handlers import SECRET

pytestmark = pytest.mark.timeout(120)


def json_lines(log: Path) -> list[dict[str, Any]]:
    """Every line of `log`, each a JSON object (fails on the first that is not)."""
    text = log.read_text()
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\nin:\n{text[-3000:]}")
        assert isinstance(entry, dict) and {"ts", "level", "msg"} <= set(entry), line
        entries.append(entry)
    return entries


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_a_workers_handler_logs_json_lines_without_passwords(
    registered: Backend, store_url: str, list_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: str,
) -> None:
    JobLists(registered).load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    monkeypatch.setenv("AEROQUEUE_LOG_FORMAT", "json")
    log = tmp_path / "worker.log"
    proc = spawn(["--url", store_url, "worker", "--handler", "tests.observe.handlers:chatty", "--list", list_name,
                  "--heartbeat", "0.2", "--expiry", "2", "--until-complete", "--pool", pool], log)
    try:
        proc.wait(timeout=90)
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    entries = json_lines(log)
    mine = [e for e in entries if e.get("logger") == "tests.observe.handlers"]
    assert sorted(e["msg"] for e in mine if e["level"] == "info") == [f"handling j{i}" for i in range(3)], entries
    assert sum(e["msg"] == "recovered" and "ValueError: no invoice" in e.get("exc", "") for e in mine) == 3, mine
    assert sum(e["msg"].startswith("charging through https://billing:***@") for e in mine) == 3, mine
    assert sum(e.get("logger") == "root" and e["level"] == "error" for e in entries) == 3, entries
    assert any(e.get("logger") == "py.warnings" and "a deprecated call" in e["msg"] for e in entries), entries
    ours = [e for e in entries if "logger" not in e]  # the package's own lines
    assert ours and all("event" in e for e in ours), ours
    assert SECRET not in log.read_text()


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_an_exception_no_thread_caught_is_a_json_line_too(
    registered: Backend, store_url: str, list_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pool: str,
) -> None:
    """A thread a handler started died of an exception: threading's hook printed its
    traceback as text lines among the JSON ones. A real worker process, in both pools."""
    JobLists(registered).load(list_name, [JobSpec(f"j{i}", {}) for i in range(2)], seal=True)
    monkeypatch.setenv("AEROQUEUE_LOG_FORMAT", "json")
    log = tmp_path / "worker.log"
    proc = spawn(["--url", store_url, "worker", "--handler", "tests.observe.handlers:leaves_a_thread_dying",
                  "--list", list_name, "--heartbeat", "0.2", "--expiry", "2", "--until-complete", "--pool", pool], log)
    try:
        proc.wait(timeout=90)
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    died = [e for e in json_lines(log) if e.get("event") == "thread_exception"]
    assert sorted(e["thread_name"] for e in died) == ["side-j0", "side-j1"], died
    assert all(e["level"] == "error" and "LookupError: no price for j" in e["exc"] for e in died), died
    assert SECRET not in log.read_text()


def test_the_dashboards_request_lines_are_json_lines_without_passwords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """werkzeug prints its request lines itself, as text, unless the root logger has a
    handler. The store does not answer here (its URL carries a password): the pages
    are 503s, and the error is logged."""
    monkeypatch.setenv("AEROQUEUE_LOG_FORMAT", "json")
    port, log = free_port(), tmp_path / "dashboard.log"
    nowhere = f"aerospike://admin:{SECRET}@127.0.0.1:{free_port()}/test"  # nothing listens there
    proc = spawn(["--url", nowhere, "dashboard", "--port", str(port), "--connect-every", "1"], log)
    try:
        answers = []
        for path in ("/", "/static/dashboard.css", "/lists/none?x=1"):
            for _ in range(300):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                        answers.append(resp.status)
                    break
                except urllib.error.HTTPError as e:
                    answers.append(e.code)
                    break
                except (urllib.error.URLError, ConnectionError):
                    assert proc.poll() is None, log.read_text()[-3000:]
                    time.sleep(0.05)
        assert answers == [503, 200, 503], answers
    finally:
        assert stop(proc) == 0, log.read_text()[-3000:]
    entries = json_lines(log)
    requests = [e["msg"] for e in entries if e.get("logger") == "werkzeug"]
    assert any('"GET / HTTP/1.1" 503' in m for m in requests), entries
    assert any('"GET /static/dashboard.css HTTP/1.1" 200' in m for m in requests), entries
    assert any(e.get("event") == "serving" for e in entries), entries
    assert any(e.get("event") == "store_unreachable" for e in entries), entries
    assert SECRET not in log.read_text()
