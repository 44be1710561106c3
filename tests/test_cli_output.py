"""What the CLI writes when there is little to say: a drop answered from a pipe or with
standard input closed, an export of nothing, the lists table on a terminal just
wide enough, a group called without its command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from aeroqueue.backends import open_backend
from aeroqueue.cli import main
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec

ROOT = Path(__file__).resolve().parents[1]
CLEAN = {"AEROQUEUE_URL": None, "AEROQUEUE_VERBOSE": None, "AEROQUEUE_CREATE": None, "AEROQUEUE_JSON": None}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _a_loaded_list(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """A list 'L' of one job in a new embedded store: the environment and the command
    line (without its subcommand) of an `aeroqueue` process on it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id\na1\n")
    aq = [sys.executable, "-m", "aeroqueue", "--url", f"embedded://{tmp_path / 's.db'}"]
    assert subprocess.run([*aq, "--create", "load", "L", str(jobs)], env=env, capture_output=True).returncode == 0
    return env, aq


# `aeroqueue drop LIST` answered from a pipe ("n", or standard input closed): the
# error was glued to the question on one line ("... [y/N]: error: list 'L' not
# dropped"), so the line that says what went wrong does not start with "error:"
# (README: errors are one line on stderr).
@pytest.mark.parametrize("answer", [b"n\n", b""])
def test_a_drop_not_confirmed_says_so_on_a_line_of_its_own(tmp_path, answer):
    env, aq = _a_loaded_list(tmp_path)
    out = subprocess.run([*aq, "drop", "L"], env=env, input=answer, capture_output=True, timeout=60)
    assert out.returncode == 1
    last = out.stderr.decode().splitlines()[-1]
    assert last.startswith("error: list 'L' not dropped"), out.stderr


def test_a_drop_with_standard_input_closed_is_no_confirmation_not_an_internal_error(tmp_path):
    """README: "a question nobody can answer (standard input closed) ... leaves the
    list alone (status 1)". With file descriptor 0 closed (`<&-`, some daemons) it
    was "internal error, RuntimeError: input(): lost sys.stdin"."""
    env, aq = _a_loaded_list(tmp_path)
    out = subprocess.run(["/bin/sh", "-c", 'exec "$@" <&-', "sh", *aq, "drop", "L"], env=env, capture_output=True,
                         timeout=60)
    assert out.returncode == 1
    assert "internal error" not in out.stderr.decode() and "no confirmation" in out.stderr.decode(), out.stderr
    assert subprocess.run([*aq, "status", "L"], env=env, capture_output=True).returncode == 0, "left alone"


@pytest.mark.parametrize("args", [["status", "L", "--json"], ["lists"], ["export", "L"]])
def test_a_command_whose_output_has_nowhere_to_go_says_so(tmp_path, args):
    """With file descriptor 1 closed (`>&-`) Python sets sys.stdout to None and
    click.echo prints nothing: `status --json` exited 0 with its answer lost. A
    write fails, as GNU tools' do: one error line, status 1."""
    env, aq = _a_loaded_list(tmp_path)
    out = subprocess.run(["/bin/sh", "-c", 'exec "$@" >&-', "sh", *aq, *args], env=env, capture_output=True,
                         timeout=60)
    said = out.stderr.decode()
    assert out.returncode == 1 and said.startswith("error: ") and "standard output is closed" in said, said
    assert len(said.splitlines()) == 1 and "internal error" not in said, said
    assert subprocess.run([*aq, *args], env=env, capture_output=True).returncode == 0, "with it open: fine"


def test_ctrl_c_at_the_drop_question_is_an_interruption_and_leaves_the_list(tmp_path):
    """Ctrl-C at the question exited 1 ("not dropped: no confirmation", as for standard
    input at its end), where every other command's Ctrl-C is 130 (README's table)."""
    import signal

    env, aq = _a_loaded_list(tmp_path)
    proc = subprocess.Popen([*aq, "drop", "L"], env=env, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        asked, deadline = b"", time.monotonic() + 60
        while b"[y/N]" not in asked and time.monotonic() < deadline:
            asked += os.read(proc.stderr.fileno(), 4096) or b""  # type: ignore[union-attr]
        assert b"[y/N]" in asked, asked
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
    finally:
        proc.kill()
    assert proc.returncode == 130, (asked + rest).decode()
    assert rest.decode().splitlines()[-1] == "error: interrupted", rest
    assert subprocess.run([*aq, "status", "L"], env=env, capture_output=True).returncode == 0, "left alone"


# `aeroqueue export LIST --state dead -o FILE` with nothing to export said
# "0 job(s) exported" but never opened FILE (click opens a "w" file lazily): no file
# was made, and one there from an earlier export kept its old jobs.
def test_export_of_nothing_leaves_an_empty_file_not_the_last_export(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    assert CliRunner().invoke(main, ["--url", url, "--create", "init"], env=CLEAN).exit_code == 0
    backend = open_backend(url)
    JobLists(backend).load("L", [JobSpec("c0", {}), JobSpec("c1", {})])
    backend.close()
    out_file = tmp_path / "dead.jsonl"
    out_file.write_text('{"jid": "yesterday\'s dead job"}\n')
    out = CliRunner().invoke(main, ["--url", url, "export", "L", "--state", "dead", "-o", str(out_file)], env=CLEAN)
    assert out.exit_code == 0, out.output
    assert "0 job(s) exported" in out.stderr
    assert out_file.read_text() == "", "the file still holds an earlier export"
    fresh = tmp_path / "fresh.jsonl"
    out = CliRunner().invoke(main, ["--url", url, "export", "L", "--state", "dead", "-o", str(fresh)], env=CLEAN)
    assert out.exit_code == 0 and fresh.exists(), "no file was made"


def test_export_of_a_missing_list_leaves_the_file_alone(tmp_path):
    url = f"embedded://{tmp_path / 's.db'}"
    assert CliRunner().invoke(main, ["--url", url, "--create", "init"], env=CLEAN).exit_code == 0
    out_file = tmp_path / "keep.jsonl"
    out_file.write_text("keep\n")
    out = CliRunner().invoke(main, ["--url", url, "export", "nolist", "-o", str(out_file)], env=CLEAN)
    assert out.exit_code == 1 and out_file.read_text() == "keep\n"


def test_an_export_the_file_system_refuses_names_the_file(tmp_path):
    """`export -o /dev/full` said "[Errno 28] No space left on device": which file,
    and that what it holds is incomplete, went unsaid."""
    url = f"embedded://{tmp_path / 's.db'}"
    assert CliRunner().invoke(main, ["--url", url, "--create", "init"], env=CLEAN).exit_code == 0
    backend = open_backend(url)
    JobLists(backend).load("L", [JobSpec(f"c{i}", {"x": "y" * 100}) for i in range(100)])
    backend.close()
    out = CliRunner().invoke(main, ["--url", url, "export", "L", "-o", "/dev/full"], env=CLEAN)
    assert out.exit_code == 1, out.output
    assert "error: /dev/full: cannot write the export: No space left on device; what it holds is incomplete" in out.stderr


# `aeroqueue lists` on a terminal: "a table that fits the terminal" (README). With
# list names shorter than the name column's minimum width (8), the table came out
# wider than the terminal and rich cut its last column ("complet", "n" for "no").
@pytest.mark.parametrize("columns", [58, 80, 104])
def test_lists_table_with_short_names_is_not_cut_at_the_terminal_edge(tmp_path, columns):
    url = f"embedded://{tmp_path / 's.db'}"
    assert CliRunner().invoke(main, ["--url", url, "--create", "init"], env=CLEAN).exit_code == 0
    backend = open_backend(url)
    JobLists(backend).load("a", [JobSpec("c0", {})])
    backend.close()
    out = CliRunner().invoke(main, ["--url", url, "lists"], env={**CLEAN, "TTY_COMPATIBLE": "1", "COLUMNS": str(columns)})
    assert out.exit_code == 0, out.output
    rows = [line for line in ANSI.sub("", out.stdout).splitlines() if line.startswith(("┃", "│", "┏", "└"))]
    assert rows and all(line.rstrip()[-1] in "┃│┓┘" for line in rows), "\n".join(rows)
    assert "complete" in rows[1], rows[1]


# `aeroqueue` alone, or `aeroqueue job` / `aeroqueue udf` without their command:
# click answers with the help (NoArgsIsHelpError, a UsageError), which the one-line
# error handler flattened into a single "error: Usage: ... Options: ... Commands: ..."
# line of 700+ characters: unreadable where a new user looks first.
@pytest.mark.parametrize("args", [[], ["job"], ["udf"]])
def test_a_group_without_its_command_shows_its_help_as_help(args):
    out = CliRunner().invoke(main, args, env=CLEAN)
    assert out.exit_code == 2, out.output
    lines = out.output.splitlines()
    assert any(line.strip() == "Commands:" for line in lines), out.output
    assert max(len(line) for line in lines) < 200, "the help is not flattened into one line"
