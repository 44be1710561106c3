"""Edges of what `aeroqueue load` reads: ids with whitespace around them, keys given
twice, numbers Python reads and a user would not mean, inputs that can be read once
(a terminal, a pipe by any name), a directory. Each either loads the same jobs from
CSV and JSON Lines, or is a clear error naming file, line and field, with nothing
written."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from aeroqueue.errors import LoadError
from aeroqueue.loading import JobSpec, from_iterable
from tests.lists.loadcli import assert_no_list, cli, jobs_of, registered


@pytest.fixture
def url(store_url: str) -> str:
    return registered(store_url)


# -- ids with whitespace around them ------------------------------------------------


@pytest.mark.parametrize(("name", "content"), [
    ("space.csv", "id,x\na,1\n b ,2\n"),
    ("space.jsonl", '{"id": "a", "x": 1}\n{"id": " b ", "x": 2}\n'),
    ("tab.jsonl", '{"id": "a", "x": 1}\n{"id": "b\\t", "x": 2}\n'),
    ("nbsp.csv", "id,x\na,1\n\u00a0b,2\n"),
])
def test_an_id_with_whitespace_around_it_is_refused_in_either_format(url, list_name, tmp_path, name, content):
    """A CSV file's ' b ' was loaded as job 'b', a JSON Lines file's as job ' b ': one id,
    two jobs. Refused in both, naming file, line and field; nothing is created."""
    path = tmp_path / name
    path.write_text(content)
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 1, out.output
    line = 3 if name.endswith(".csv") else 2  # after the header, or not
    assert f"{name}, line {line}, field 'id'" in out.output and "whitespace" in out.output, out.output
    assert_no_list(url, list_name)


def test_the_same_id_is_the_same_job_in_csv_and_json_lines(url, list_name, tmp_path):
    (tmp_path / "a.csv").write_text("id,x\nj 1,1\n")
    (tmp_path / "a.jsonl").write_text('{"id": "j 1", "x": 2}\n')
    assert cli(url, "load", list_name, str(tmp_path / "a.csv")).exit_code == 0
    again = cli(url, "load", list_name, str(tmp_path / "a.jsonl"))
    assert again.exit_code == 0 and "0 loaded, 1 already there" in again.output, again.output
    assert jobs_of(url, list_name) == {"j 1": {"x": "1"}}


@pytest.mark.parametrize("item", [(" a", {}), {"id": "a "}, JobSpec("a\n", {})])
def test_a_python_job_id_with_whitespace_around_it_is_refused(item):
    with pytest.raises(LoadError, match=r"line 2, field 'id'.*whitespace"):
        from_iterable([("ok", {}), item], max_payload=1000)


# -- keys given twice ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "content", "where"), [
    ("nested.jsonl", '{"id": "a", "payload": {"k": 1}}\n{"id": "b", "payload": {"n": {"k": 1, "k": 2}}}\n',
     ["line 2, field 'payload'", "key 'k' is given twice"]),
    # An escape spells the same key: the decoder's keys are compared, not the text.
    ("in-array.jsonl", '{"id": "b", "payload": [{"z": 1, "\\u007a": 2}]}\n',
     ["line 1, field 'payload'", "key 'z' is given twice"]),
    ("extra.jsonl", '{"id": "b", "email": "x@y", "email": "z@y"}\n', ["line 1, field 'email'", "given twice"]),
    ("inside-extra.jsonl", '{"id": "b", "payload": {}, "meta": {"t": 1, "t": 2}}\n',
     ["line 1, field 'meta'", "key 't' is given twice"]),
    ("cell.csv", 'id,payload\na,{}\nb,"{""k"": 1, ""k"": 2}"\n', ["line 3, field 'payload'", "key 'k' is given twice"]),
])
def test_a_key_given_twice_in_json_is_refused_naming_it(url, list_name, tmp_path, name, content, where):
    """JSON keeps the last of two values of a key without a word: {"k": 1, "k": 2} was
    loaded as {"k": 2}. Refused, naming file, line, field and the key."""
    path = tmp_path / name
    path.write_text(content)
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 1, out.output
    assert f"{name}, {where[0]}" in out.output and where[1] in out.output, out.output
    assert_no_list(url, list_name)



@pytest.mark.parametrize(("after", "says"), [
    ("[" * 5000 + "]" * 5000 + "}", "line 1, field 'b': JSON nested more than 31 deep"),
    ("}", "line 1: malformed JSON: Expecting value at column 41"),
], ids=["nested-past-the-decoder", "malformed"])
def test_a_key_given_twice_before_what_the_decoder_refuses_is_no_internal_error(url, list_name, tmp_path, after,
                                                                                says):
    """The decoder stops at the repeat, before the rest of the line; parsed again to name
    the field, JSON nested past Python's decoder (thousands deep) or malformed after it
    was an internal RecursionError or JSONDecodeError."""
    path = tmp_path / "after.jsonl"
    path.write_text('{"id": "a", "x": {"k": 1, "k": 2}, "b": ' + after + "\n")
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 1, out.output
    assert f"after.jsonl, {says}" in out.output, out.output
    assert_no_list(url, list_name)


@pytest.mark.parametrize("result", ['{"sent": true, "sent": false}', '[{"a": {"k": 1, "k": 2}}]'])
def test_complete_with_a_result_that_gives_a_key_twice_is_wrong_usage(url, result):
    """`complete --result '{"sent": true, "sent": false}'` stored {"sent": false}."""
    out = cli(url, "complete", "L", "0", "--session", "s", "--result", result)
    assert out.exit_code == 2, out.output
    assert "--result" in out.output and "is given twice in one object" in out.output, out.output


# -- numbers a person would not mean -----------------------------------------------


@pytest.mark.parametrize("value", ["1_800_000_000", " 1800000000", "1800000000 ", "\u0661\u0668\u0660\u0660" + "0" * 6,
                                   "\uff11\uff18" + "0" * 8, "nan", "inf", "Infinity", "0x10"])
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_run_at_python_reads_and_a_person_would_not_mean_is_refused(url, list_name, tmp_path, value, fmt):
    """float() reads '1_800_000_000', ' 12 ', Arabic-Indic and fullwidth digits and
    'nan': each loaded as a time (or, 'nan', said "out of range"). Refused naming file,
    line and field; nothing is created."""
    path = tmp_path / f"r.{fmt}"
    if fmt == "csv":
        path.write_text(f'id,run_at\na,1800000000\nb,"{value}"\n')
    else:
        path.write_text(json.dumps({"id": "a", "run_at": 1800000000}) + "\n"
                        + json.dumps({"id": "b", "run_at": value}) + "\n")
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 1, out.output
    line = 3 if fmt == "csv" else 2
    assert f"r.{fmt}, line {line}, field 'run_at'" in out.output, out.output
    assert "whitespace" in out.output or "digits 0-9" in out.output, out.output
    assert_no_list(url, list_name)


def test_run_at_as_people_write_it_loads(url, list_name, tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("id,run_at\na,1800000000\nb,1.8e9\nc,+1800000000.5\nd,2027-01-15T15:00:00Z\ne,\n")
    out = cli(url, "load", list_name, str(path))
    assert out.exit_code == 0, out.output
    status = json.loads(cli(url, "status", list_name, "--json").stdout)
    assert status["delayed"] == 4 and status["queued"] == 1, status


@pytest.mark.parametrize("option", ["--delay", "--timeout"])
@pytest.mark.parametrize("value", ["1_000", " 12 ", "\u0661\u0662", "nan", "inf"])
@pytest.mark.parametrize("how", ["option", "env"])
def test_seconds_python_reads_and_a_person_would_not_mean_are_wrong_usage(url, list_name, tmp_path, option, value,
                                                                          how):
    path = tmp_path / "a.csv"
    path.write_text("id\na\n")
    env_name = "AEROQUEUE_" + option.removeprefix("--").upper()
    if how == "env":
        out = cli(url, "load", list_name, str(path), env={env_name: value})
    else:
        out = cli(url, "load", list_name, str(path), option, value)
    assert out.exit_code == 2, out.output
    assert f"'{option}'" in out.output and f"{value!r} is not a number (digits 0-9" in out.output, out.output
    assert_no_list(url, list_name)


# -- inputs that read once: a terminal, a pipe by any name -----------------------------

ROOT = Path(__file__).resolve().parents[2]


def _aq_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AEROQUEUE_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


@pytest.mark.parametrize("name", ["-", "/dev/stdin"])
def test_jobs_typed_at_a_terminal_are_read_once_and_end_at_the_first_ctrl_d(url, list_name, name):
    """The loader reads its input twice. From a terminal, `/dev/stdin` was read for the
    check, then again to write: it waited for the jobs to be typed a second time and
    loaded those, unchecked. `-` read on past a Ctrl-D (a buffered read fills its
    size): it took two or three. Now both read the terminal once, to the first Ctrl-D,
    and say that they read it."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "aeroqueue", "--url", url, "--create", "load", list_name, name, "--format", "csv"],
            stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_aq_env(), text=True)
        os.close(slave)
        # The terminal keeps what is typed, the end of input (Ctrl-D at a line's start) too,
        # until the loader reads it.
        os.write(master, b"id,x\na,1\nb,2\n\x04")
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the load still waited for the terminal after Ctrl-D: {err!r}")
    finally:
        os.close(master)
    assert proc.returncode == 0, err
    assert "2 loaded" in out and "reading jobs from the terminal until Ctrl-D" in err, (out, err)
    assert jobs_of(url, list_name) == {"a": {"x": "1"}, "b": {"x": "2"}}


def test_a_pipe_named_dev_stdin_is_read_once(url, list_name):
    data = "id,v\n" + "".join(f"p{i},{i}\n" for i in range(300))
    done = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", url, "--create", "load", list_name, "/dev/stdin", "--json"],
        input=data, capture_output=True, text=True, timeout=120, env=_aq_env())
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["jobs"], summary["loaded"]) == (300, 300), summary
    assert "terminal" not in done.stderr, done.stderr


# -- a directory ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["dir", "dir.csv", "link.jsonl", "dir --format"])
def test_a_directory_as_file_is_wrong_usage_naming_it(url, list_name, tmp_path, how):
    """Checked, not fixed: click's own check says it, status 2, before the store is
    touched. Kept so that a change of FILE's type (allow_dash, a spool) keeps it."""
    name, *rest = how.split()
    (tmp_path / "dir").mkdir()
    if name.startswith("link"):
        (tmp_path / name).symlink_to(tmp_path / "dir")
    elif name != "dir":
        (tmp_path / name).mkdir()
    args = ["--format", "csv"] if rest else []
    out = cli(url, "load", list_name, str(tmp_path / name), *args)
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"'FILE': File '{tmp_path / name}' is a directory" in lines[0], out.output
    assert_no_list(url, list_name)
