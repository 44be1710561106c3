"""`aeroqueue load` from inputs that read once or change (pipes, <(...), closed standard
input, a file still being written), and JSON past what Python's decoder takes
(integers of thousands of digits, nesting thousands deep): each a clear error that
names file, line and field, or a load of every job, never a half-written list."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import aeroqueue
from aeroqueue.backends import open_backend
from aeroqueue.cli import load_cmd, main
from aeroqueue.errors import ListNotFound
from aeroqueue.lists import JobLists
from tests.waiting import wait_for

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


@pytest.mark.parametrize("name", ["/dev/stdin", "/dev/fd/0"])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_load_from_standard_input_by_name_redirected_from_a_file_tells_its_format(tmp_path, name, fmt):
    """`aeroqueue load L /dev/stdin < jobs.csv`: standard input by a name of its own,
    a regular file there, failed "cannot tell the format from the extension ''",
    where `-` (and a pipe by name) sniffs it."""
    url = f"embedded://{tmp_path / 's.db'}"
    src = tmp_path / "jobs"
    src.write_text("id,email\na1,x@y\na2,z@w\n" if fmt == "csv" else '{"id": "a1"}\n{"id": "a2"}\n')
    with src.open("rb") as stdin:
        out = _aq("--url", url, "--create", "load", "L", name, "--json", stdin=stdin)
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


# `aeroqueue load` and SIGTERM (a job runner's deadline, a service's stop): it died
# at once, status 143 from the signal and not a word, a range left pending on its
# lease (the next load waited for it to lapse). It stops between two ranges instead,
# says on one line how many jobs it loaded and that the same load run again finishes
# it, and exits 143.
_SLOW_LOAD = """
import sys, time
from aeroqueue import load
from aeroqueue.cli import main

real = load._RangeLoader.load_range

def slow(self, i, batch):  # a load long enough to be stopped half-way, on any machine
    time.sleep(0.05)
    return real(self, i, batch)

load._RangeLoader.load_range = slow
main(sys.argv[1:], prog_name="aeroqueue")
"""


def _handles_sigterm(pid: int) -> bool:
    """The process installed its SIGTERM handler (Linux: SigCgt, bit 15 from 1)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught >> (signal.SIGTERM - 1) & 1)


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")],
                         ids=["sigterm", "ctrl-c"])
def test_a_load_stopped_by_sigterm_says_what_it_loaded_and_the_same_load_finishes_it(
    store_url, tmp_path, list_name, signum, code, said
):
    """Ctrl-C too: it raised KeyboardInterrupt in the middle of a range, said only
    "interrupted", and left the range pending on its lease, which the same load run
    again waited out (13 s), slower behind each such range."""
    n, chunk = 6000, 100
    path = tmp_path / "jobs.csv"
    path.write_text("id,n\n" + "".join(f"j{i},{i}\n" for i in range(n)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    args = ["--url", store_url, "--create", "load", list_name, str(path), "--chunk-size", str(chunk), "--workers", "2"]
    backend = open_backend(store_url)
    lists = JobLists(backend)
    try:
        proc = subprocess.Popen([sys.executable, "-c", _SLOW_LOAD, *args], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(ListNotFound):
                    if lists.status(list_name).reservable >= 2 * chunk:
                        break
                time.sleep(0.02)
            assert proc.poll() is None, f"the load ended before it was stopped: {proc.communicate()}"
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == code, (proc.returncode, err)
        assert out == "" and len(err.splitlines()) == 1, err
        m = re.fullmatch(
            rf"error: load stopped by {said} before it finished: ([\d,]+) of {n:,} jobs loaded into {list_name}; "
            r"run the same load again to finish it \(it adds nothing twice\)\n", err)
        assert m, err
        loaded = int(m.group(1).replace(",", ""))
        assert 2 * chunk <= loaded < n and loaded % chunk == 0, err
        # What it says is what the list holds: the ranges in flight finished, none is
        # left pending on a lease for the next load to wait out.
        status = lists.status(list_name)
        assert (status.reservable, status.pending_ranges) == (loaded, 0)

        again = _aq(*args, "--json", timeout=120)
        assert again.returncode == 0, again.stderr
        report = json.loads(again.stdout)
        assert (report["loaded"], report["skipped"], report["waiting"]) == (n - loaded, loaded, 0)
        assert lists.status(list_name).reservable == n
    finally:
        with contextlib.suppress(ListNotFound):
            lists.drop(list_name, grace_s=0)
        backend.close()


def test_a_second_ctrl_c_stops_a_load_at_once_whatever_it_waits_for(tmp_path):
    """The first Ctrl-C waits for the ranges under way; a store locked by another
    process (or a dead loader's range) can make that long, and a second Ctrl-C was
    thrown away. Now it stops the load at once, as Python's own would."""
    url = f"embedded://{tmp_path / 's.db'}"
    path = tmp_path / "jobs.csv"
    path.write_text("id,n\n" + "".join(f"j{i},{i}\n" for i in range(50)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    stuck = _SLOW_LOAD.replace("time.sleep(0.05)", "print('writing', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", stuck, "--url", url, "--create", "load", "L", str(path),
                             "--chunk-size", "10"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert proc.poll() is None, "the first Ctrl-C waits for the range under way"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert took < 20, f"the second Ctrl-C took {took:.1f} s: it waited out the range (60 s)"
    assert err.strip().splitlines()[-1] == "error: interrupted", err


@pytest.mark.parametrize(("signum", "code", "said"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")],
                         ids=["sigterm", "ctrl-c"])
def test_a_load_waiting_behind_a_dead_loaders_range_stops_at_the_first_signal(tmp_path, signum, code, said):
    """Its jobs written, a load waits up to a lease (60 s here) for a range of another
    loader before them, which a dead loader never publishes. The first Ctrl-C (or
    SIGTERM) was held until that wait ran out; it ends the wait now, and the load
    says its jobs are written and what finishes the other range."""
    url = f"embedded://{tmp_path / 's.db'}"
    backend = aeroqueue.connect(url, create=True)
    lists = JobLists(backend)
    try:
        lists.create("L")
        assert lists._list_udf("L", "alloc", 5, 60_000, "dead")["st"] == "ok"
        path = tmp_path / "jobs.csv"
        path.write_text("id,n\n" + "".join(f"j{i},{i}\n" for i in range(10)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
        env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.Popen([sys.executable, "-m", "aeroqueue", "--url", url, "load", "L", str(path), "--seal"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for("the load's own range written, waiting behind the dead one", lambda: any(
                r.get("real") is not None for r in lists.header("L")["pend"].values()), 60)
            sent = time.monotonic()
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == code, (proc.returncode, err)
        assert took < 10, f"the stop took {took:.1f} s: it waited out the dead loader's lease"
        assert out == "L: 10 loaded, 0 already there\n", out
        assert err.strip().splitlines()[-1] == (
            f"error: load stopped by {said} while 10 of its jobs waited behind a load range of another load into L "
            "(its loader may have died): every job is written; the list is not sealed: run the same load again to "
            "seal it; once that range's lease runs out, a sweep or the same load run again finishes it"), err
        st = lists.status("L")
        # Published, and held behind the dead range (a live lease: not yet stalled); not
        # sealed, so that the same load run again seals it (a sealed list's rerun is a no-op).
        assert (st.total, st.pending_ranges, st.stalled_ranges, st.sealed) == (0, 2, 0, False)
    finally:
        backend.close()


def test_a_load_stopped_by_sigterm_while_it_reads_its_input_loads_nothing_and_says_so(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "aeroqueue", "--url", url, "--create", "load", "L", "-"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None
        proc.stdin.write("id,n\na1,1\n")  # and more to come: the input is still being read
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while not _handles_sigterm(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, err)
    assert err == ("error: load stopped by SIGTERM before it finished: 0 jobs loaded into L; "
                   "run the same load again to finish it (it adds nothing twice)\n"), err
    with pytest.raises(ListNotFound):
        JobLists(open_backend(url)).header("L")
