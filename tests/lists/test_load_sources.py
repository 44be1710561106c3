"""`aeroqueue load` from inputs that read once or change (pipes, <(...), closed standard
input, a file still being written), and JSON past what Python's decoder takes
(integers of thousands of digits, nesting thousands deep): each a clear error that
names file, line and field, or a load of every job, never a half-written list."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from aeroqueue.backends import open_backend
from aeroqueue.cli import load_cmd, main
from aeroqueue.lists import JobLists

ROOT = Path(__file__).resolve().parents[2]
CLEAN = {"AEROQUEUE_URL": None, "AEROQUEUE_VERBOSE": None, "AEROQUEUE_CREATE": None, "AEROQUEUE_JSON": None}
HUGE = "1" * 5000
DEEP = "[" * 5000 + "]" * 5000


def _aq(*args: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "aeroqueue", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


# `aeroqueue load L <(zcat jobs.csv.gz)` and named pipes: the loader reads its
# input twice (check, then write), so a pipe given by name must be spooled as
# standard input is, or the second read finds nothing (or blocks forever).
def test_load_from_process_substitution_loads_every_job(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    rfd, wfd = os.pipe()
    os.write(wfd, b"id,email\na1,x@y\na2,z@w\n")
    os.close(wfd)
    # What bash's <(...) passes: /dev/fd/N, a pipe.
    out = _aq("--url", url, "--create", "load", "L", f"/dev/fd/{rfd}", "--format", "csv", "--json",
              pass_fds=(rfd,))
    os.close(rfd)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["loaded"] == 2


def test_load_from_a_named_pipe_does_not_hang(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    fifo = tmp_path / "jobs.csv"
    os.mkfifo(fifo)

    def feed() -> None:
        with open(fifo, "wb") as f:
            f.write(b"id,email\na1,x@y\na2,z@w\n")

    threading.Thread(target=feed, daemon=True).start()
    try:
        out = _aq("--url", url, "--create", "load", "L", str(fifo), "--json", timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError("load of a named pipe hung on its second read") from None
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["loaded"] == 2


def _names(url: str) -> list[str]:
    backend = open_backend(url)
    try:
        return JobLists(backend).names()
    finally:
        backend.close()


# A file that grows while it is loaded (an exporter still writing it): the write
# pass read lines the check pass never saw. A bad one stopped the load half-way
# with "nothing was loaded: fix the input" although the list was created and jobs
# were written; a good one was loaded unchecked (a duplicate id silently voided).
def test_lines_appended_after_the_check_are_not_loaded_unchecked(tmp_path, monkeypatch):
    url = f"embedded://{tmp_path / 's.db'}"
    jobs: Path = tmp_path / "jobs.csv"
    jobs.write_text("id,email\na1,x@y\na2,z@w\n")
    real_load = JobLists.load

    def load_while_the_exporter_appends(self, *args, **kw):  # the write pass starts: the file grows
        with jobs.open("a") as f:
            f.write("a3,more\nnot,a,row\n")
        return real_load(self, *args, **kw)

    monkeypatch.setattr(JobLists, "load", load_while_the_exporter_appends)
    out = CliRunner().invoke(main, ["--url", url, "--create", "load", "L", str(jobs), "--json"], env=CLEAN)
    if out.exit_code != 0:
        assert "nothing was loaded" not in out.stderr or _names(url) == [], (
            f"said {out.stderr.strip()!r} but list(s) {_names(url)} were created")
    else:
        assert '"loaded": 2' in out.stdout, "only the rows the check pass saw"


def test_a_file_that_changed_during_the_check_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    url = f"embedded://{tmp_path / 's.db'}"
    jobs: Path = tmp_path / "jobs.csv"
    jobs.write_text("id,email\na1,x@y\na2,z@w\n")
    real_validate = load_cmd.validate

    def validate_then_grow(*args, **kw):
        n = real_validate(*args, **kw)
        with jobs.open("a") as f:
            f.write("a1,duplicate\n")
        return n

    monkeypatch.setattr(load_cmd, "validate", validate_then_grow)
    out = CliRunner().invoke(main, ["--url", url, "--create", "load", "L", str(jobs), "--json"], env=CLEAN)
    # Either refused (nothing made), or only the 2 checked rows loaded: never the unchecked duplicate.
    if out.exit_code == 0:
        assert '"loaded": 2' in out.stdout and '"voided": 0' in out.stdout, out.stdout
    else:
        assert _names(url) == [], out.stderr


# `aeroqueue load L -` with standard input closed (`<&-`): an internal error
# ("AttributeError: 'NoneType' object has no attribute 'buffer'") instead of one
# line naming <stdin>.
def test_load_from_a_closed_standard_input_is_a_clear_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    url = f"embedded://{tmp_path / 's.db'}"
    aq = [sys.executable, "-m", "aeroqueue", "--url", url, "--create"]
    out = subprocess.run(["/bin/sh", "-c", 'exec "$@" <&-', "sh", *aq, "load", "L", "-"], env=env,
                         capture_output=True, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("error: <stdin>") and "internal error" not in err, err


def _one_error(out) -> str:
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


# An integer of more than 4,300 digits (Python's int() limit for text) in a load's
# JSON: README promises integers outside 64 bits are refused "with file, line and
# field"; it was an internal error ("ValueError: Exceeds the limit (4300 digits)")
# naming neither. `complete --result` with one was an internal error too, not a
# usage error.
@pytest.mark.parametrize(("name", "text", "field"), [
    ("jobs.jsonl", f'{{"id": "a", "n": {HUGE}}}\n', "'n'"),
    ("ids.jsonl", f'{{"id": {HUGE}}}\n', "'id'"),
    ("jobs.csv", f"id,payload\na,{HUGE}\n", "'payload'"),
])
def test_an_integer_of_thousands_of_digits_is_refused_with_file_line_and_field(tmp_path, name, text, field):
    path, line = _refused_load(tmp_path, name, text)
    assert f"{path}, line " in line and f"field {field}" in line and "64-bit" in line, line


def _refused_load(tmp_path: Path, name: str, text: str) -> tuple[Path, str]:
    """Load `text` from a file `name`: refused with status 1 and one error line (returned),
    no list created."""
    url = f"embedded://{tmp_path / 's.db'}"
    path = tmp_path / name
    path.write_text(text)
    out = CliRunner().invoke(main, ["--url", url, "--create", "load", "L", str(path)], env=CLEAN)
    assert out.exit_code == 1
    line = _one_error(out)
    status = CliRunner().invoke(main, ["--url", url, "status", "L"], env=CLEAN)
    assert status.exit_code == 1 and "no job list named 'L'" in status.stderr, "nothing was created"
    return path, line


@pytest.mark.parametrize("result", [HUGE, DEEP], ids=["thousands-of-digits", "nested-thousands-deep"])
def test_complete_with_a_result_past_the_decoder_is_wrong_usage(tmp_path, result):
    url = f"embedded://{tmp_path / 's.db'}"
    out = CliRunner().invoke(main, ["--url", url, "--create", "complete", "L", "0", "--session", "s", "--result", result],
                             env=CLEAN)
    assert out.exit_code == 2, out.output
    assert "--result" in _one_error(out)


# JSON nested deeper than Python's recursion limit (about 1,000 levels) in a load:
# README promises nesting deeper than 31 is refused "with file, line and field"; it
# was an internal error ("RecursionError: maximum recursion depth exceeded"). The
# same for `complete --result`, which should be wrong usage (status 2).
@pytest.mark.parametrize(("name", "text"), [
    ("jobs.jsonl", f'{{"id": "a", "n": {DEEP}}}\n'),
    ("payload.jsonl", f'{{"id": "a", "payload": {DEEP}}}\n'),
    ("jobs.csv", f"id,payload\na,{DEEP}\n"),
])
def test_json_nested_thousands_deep_is_refused_with_file_line_and_field(tmp_path, name, text):
    path, line = _refused_load(tmp_path, name, text)
    assert f"{path}, line " in line and "field " in line and "nested more than 31 deep" in line, line
