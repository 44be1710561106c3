"""The edges a user meets in the first hour (issue 17): store URLs, one-line errors
and exit statuses, --verbose anywhere, reserve's session, acknowledgement
refusals, `lists` on terminals and pipes, JSON output, and `bench`'s store."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from aeroqueue import errors, keys, udfs
from aeroqueue.backends import open_backend
from aeroqueue.cli import main
from aeroqueue.config import CLOCK_MARGIN_MS
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, reap
from tests.sessions.test_sweep_gate import refuse_recount_after_the_first
from tests.sessions.test_taken_never_claimed import VICTIM
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]

# Environment variables that would change what these commands do, removed for each run.
CLEAN = {"AEROQUEUE_URL": None, "AEROQUEUE_VERBOSE": None, "AEROQUEUE_CREATE": None, "AEROQUEUE_JSON": None,
         "FORCE_COLOR": None, "TTY_COMPATIBLE": None, "COLUMNS": None}


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def cli(*args: str, url: str | None = None, **env: str | None) -> Result:
    argv = (["--url", url] if url is not None else []) + list(args)
    return CliRunner().invoke(main, argv, env={**CLEAN, **env})


def one_error_line(out: Result, code: int) -> str:
    """The run failed with `code` and said why in exactly one line on stderr, no traceback."""
    assert out.exit_code == code, (out.exit_code, out.output)
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert "Traceback" not in out.output
    return lines[0]


@pytest.fixture
def ready_url(store_url: str) -> str:
    """A store the CLI will open: an embedded one made with `aeroqueue init`, or the real server."""
    out = cli("init", url=store_url)
    assert out.exit_code == 0, out.output
    return store_url


# -- store URLs -----------------------------------------------------------------


def test_a_store_in_a_directory_that_does_not_exist_is_an_error_and_makes_nothing(tmp_path):
    for args in (("lists",), ("--create", "lists"), ("init",)):
        line = one_error_line(cli(*args, url=f"embedded://{tmp_path}/typo/store.db"), 1)
        assert f"directory {tmp_path}/typo does not exist" in line
        # init and --create make the file, never its directory: sending the user to them
        # (as for a missing file) would be a circle, `init` itself answering "run init".
        assert f"mkdir -p {tmp_path}/typo" in line and "aeroqueue init" not in line and "--create" not in line, line
    assert not (tmp_path / "typo").exists()


def test_a_namespace_the_cluster_does_not_have_is_named_with_where_to_fix_it(real_url):
    """A server-only case: an embedded store has no namespaces to get wrong."""
    wrong = real_url.rsplit("/", 1)[0] + "/no_such_ns"
    line = one_error_line(cli("lists", url=wrong), 1)
    assert "Invalid namespace: no_such_ns" in line and "aerospike://host:3000/NAMESPACE" in line, line


def test_credentials_for_a_server_without_users_say_so_not_that_it_is_down(real_url):
    """A server-only case: a URL with user:password@ for a server whose security is off
    (every Community Edition server). The client's own message is "Failed to connect",
    as for a server that is down: the error must say the login was refused instead."""
    scheme, rest = real_url.split("://", 1)
    line = one_error_line(cli("lists", url=f"{scheme}://app:pw-not-shown@{rest}"), 1)
    assert "the server refused the login (SecurityNotSupported, code 51)" in line, line
    assert "remove user:password@" in line and "is the server running" not in line, line
    assert "pw-not-shown" not in line and "app:***@" in line, line


def test_a_store_file_that_does_not_exist_needs_init_or_create(tmp_path):
    url = f"embedded://{tmp_path}/store.db"
    line = one_error_line(cli("lists", url=url), 1)
    assert "does not exist" in line and "aeroqueue init" in line and "--create" in line
    assert not (tmp_path / "store.db").exists(), "a typo must not become a new, empty store"
    made = cli("init", "--json", url=url)
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["created"] is True and (tmp_path / "store.db").is_file()
    again = cli("init", "--json", url=url)
    assert json.loads(again.stdout)["created"] is False, "init is safe to repeat"
    assert cli("lists", "--json", url=url).stdout.strip() == "[]"
    other = f"embedded://{tmp_path}/other.db"
    assert cli("--create", "lists", "--json", url=other).exit_code == 0
    assert cli("lists", url=other, AEROQUEUE_CREATE=None).exit_code == 0, "made by --create"
    third = f"embedded://{tmp_path}/third.db"
    assert cli("lists", url=third, AEROQUEUE_CREATE="1").exit_code == 0


def test_the_python_api_and_the_dashboard_refuse_a_store_file_that_does_not_exist(tmp_path, monkeypatch):
    """`aeroqueue.connect()` and the dashboard's `create_app()` read AEROQUEUE_URL as
    the CLI does, and a typo in it is an error there too, not a new empty store."""
    import aeroqueue
    from aeroqueue.dashboard import create_app

    url = f"embedded://{tmp_path}/typo.db"
    monkeypatch.setenv("AEROQUEUE_URL", url)
    monkeypatch.delenv("AEROQUEUE_CREATE", raising=False)
    with pytest.raises(errors.AeroqueueError, match="does not exist"):
        aeroqueue.connect()
    with pytest.raises(errors.AeroqueueError, match="does not exist"):
        create_app()
    with pytest.raises(errors.AeroqueueError, match="does not exist"):
        aeroqueue.connect(url)
    assert not (tmp_path / "typo.db").exists()
    aeroqueue.connect(create=True).close()
    assert (tmp_path / "typo.db").is_file(), "made when asked"
    monkeypatch.setenv("AEROQUEUE_URL", f"embedded://{tmp_path}/env.db")
    monkeypatch.setenv("AEROQUEUE_CREATE", "1")
    create_app().extensions["aeroqueue"].backend.close()
    assert (tmp_path / "env.db").is_file(), "made with AEROQUEUE_CREATE, as by the CLI"
    monkeypatch.delenv("AEROQUEUE_URL")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    aeroqueue.connect().close()
    assert (tmp_path / "xdg" / "aeroqueue" / "store.db").is_file(), "the default store is made on first use"


def test_the_default_store_is_made_on_first_use(tmp_path):
    out = cli("lists", "--json", XDG_DATA_HOME=str(tmp_path / "xdg"))
    assert out.exit_code == 0, out.output
    assert (tmp_path / "xdg" / "aeroqueue" / "store.db").is_file()
    shown = json.loads(cli("config", "--json", XDG_DATA_HOME=str(tmp_path / "xdg")).stdout)
    assert shown["source"] == "default" and shown["exists"] is True


@pytest.mark.parametrize("kind", ["text", "foreign-sqlite", "directory"])
def test_a_file_that_is_not_a_store_is_a_clear_error_and_stays_untouched(tmp_path, kind):
    path = tmp_path / "passwd"
    if kind == "text":
        path.write_text("root:x:0:0:root:/root:/bin/bash\n" * 40)
    elif kind == "foreign-sqlite":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE customers (id INTEGER)")
    else:
        path.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    content = path.read_bytes() if path.is_file() else None
    line = one_error_line(cli("--create", "lists", url=f"embedded://{path}"), 1)
    assert str(path) in line and ("not an aeroqueue store" in line or "cannot open it as a store" in line
                                  or "is a directory" in line)
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "no -wal or -shm file left beside it"
    if content is not None:
        assert path.read_bytes() == content


def test_an_empty_file_becomes_a_store_only_when_asked(tmp_path):
    """A store emptied by accident (truncated to 0 bytes, replaced by `touch`) was made
    again, empty, by the next command, its jobs gone without a word (a README
    walk-through). It is made there only with --create, as a missing one."""
    path = tmp_path / "store.db"
    path.touch()
    line = one_error_line(cli("lists", url=f"embedded://{path}"), 1)
    assert f"embedded store {path} is an empty file, not a store yet" in line and "--create" in line, line
    assert path.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["store.db"]
    out = cli("--create", "lists", "--json", url=f"embedded://{path}")
    assert out.exit_code == 0 and json.loads(out.stdout) == [], out.output
    assert cli("lists", url=f"embedded://{path}").exit_code == 0  # a store now


def test_an_empty_default_store_is_refused_too_and_init_says_it_made_it(tmp_path):
    """The default store is made on first use: an empty file there is no first use,
    and was made again, empty, as a named one was. `init`, which the refusal points
    to, then said the store "was there" (a second read)."""
    xdg = tmp_path / "xdg"
    path = xdg / "aeroqueue" / "store.db"
    path.parent.mkdir(parents=True)
    path.touch()
    line = one_error_line(cli("lists", XDG_DATA_HOME=str(xdg)), 1)
    assert f"embedded store {path} is an empty file, not a store yet" in line, line
    assert path.stat().st_size == 0
    made = cli("init", "--json", XDG_DATA_HOME=str(xdg))
    assert made.exit_code == 0 and json.loads(made.stdout)["created"] is True, made.output
    assert cli("lists", XDG_DATA_HOME=str(xdg)).exit_code == 0
    again = cli("init", "--json", XDG_DATA_HOME=str(xdg))
    assert json.loads(again.stdout)["created"] is False, again.output


def test_etc_passwd_is_one_line(tmp_path):
    line = one_error_line(cli("lists", url="embedded:///etc/passwd"), 1)
    assert "/etc/passwd" in line and "not" in line
    assert not Path("/etc/passwd-wal").exists()


@pytest.mark.parametrize("how", ["env", "blank env", "option"])
@pytest.mark.parametrize("command", ["lists", "config"])
def test_an_empty_url_is_an_error_not_the_default(tmp_path, how, command):
    xdg = str(tmp_path / "xdg")
    if how == "option":
        out = cli(command, url="", XDG_DATA_HOME=xdg)
    else:
        # Blank, as a broken script may leave it: click passes it on as if typed.
        out = cli(command, AEROQUEUE_URL="" if how == "env" else " \t", XDG_DATA_HOME=xdg)
    line = one_error_line(out, 1)
    assert line.startswith(f"error: {'--url' if how == 'option' else 'AEROQUEUE_URL'} is set but empty"), line
    # Help needs no store: it is shown whatever the URL holds.
    if how == "option":
        helped = cli(command, "--help", url="", XDG_DATA_HOME=xdg)
    else:
        helped = cli(command, "--help", AEROQUEUE_URL="" if how == "env" else " \t", XDG_DATA_HOME=xdg)
    assert helped.exit_code == 0 and "Usage:" in helped.stdout, helped.output
    assert not (tmp_path / "xdg").exists(), "the default store was not used"


# -- one-line errors, exit statuses, --verbose ----------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        # Which store: an unset AEROQUEUE_URL reads the default one, and the list looked lost.
        (("status", "nope"), 1, "no job list named 'nope' (looked in embedded:///"),
        (("--url", "aerospike://h:notaport/test", "lists"), 1, "port 'notaport'"),
        (("frobnicate",), 2, "No such command 'frobnicate'"),
        (("status",), 2, "Missing argument 'LIST'"),
        (("reserve", "x", "--count", "zero"), 2, "'zero' is not a valid integer"),
        (("--bogus", "lists"), 2, "No such option '--bogus'"),
        (("complete", "x", "0", "--session", "s", "--result", "{nope"), 2, "--result"),
        # An empty bind address (an unset variable in a unit file) bound every address.
        (("dashboard", "--host", ""), 2, "Invalid value for '--host' (env var: 'AEROQUEUE_DASHBOARD_HOST'): the "
                                         "address to bind is empty"),
        (("metrics", "--host", " "), 2, "the address to bind is empty: give 127.0.0.1"),
        (("worker", "--handler", "os:getcwd", "--list", "L", "--metrics-host", ""), 2, "'--metrics-host'"),
        # Said before the benchmark's minutes, not after them.
        (("bench", "--json-out", "/nonexistent/figures.json"), 2, "'/nonexistent': no such directory"),
    ],
)
def test_every_error_is_one_line_with_its_exit_status(tmp_path, args, code, says):
    open_backend(f"embedded://{tmp_path}/s.db").close()
    out = cli(*args) if args[0] == "--url" else cli(*args, url=f"embedded://{tmp_path}/s.db")
    assert says in one_error_line(out, code)


def test_session_timing_that_does_not_fit_names_where_each_value_came_from(tmp_path):
    """A value read from AEROQUEUE_EXPIRY or AEROQUEUE_HEARTBEAT is named so: the user
    who typed no --expiry would look for it on the command line in vain."""
    url = f"embedded://{tmp_path}/s.db"
    open_backend(url).close()
    out = cli("reserve", "L", "--hold", "5", "--expiry", "3", url=url, AEROQUEUE_HEARTBEAT="2")
    assert one_error_line(out, 2).startswith("error: --expiry and --heartbeat (AEROQUEUE_HEARTBEAT): session expiry")
    out = cli("worker", "--handler", "json:dumps", "--list", "L", url=url, AEROQUEUE_HEARTBEAT="2", AEROQUEUE_EXPIRY="3")
    assert one_error_line(out, 2).startswith("error: --expiry (AEROQUEUE_EXPIRY) and --heartbeat (AEROQUEUE_HEARTBEAT):")


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        # Out-of-range numbers are usage errors, not an overflow deep down (inf, NaN too).
        (("load", "L", "JOBS", "--delay", "1e30"), 2, "'--delay'"),
        (("load", "L", "JOBS", "--delay", "nan"), 2, "'nan' is not a number"),
        (("load", "L", "JOBS", "--timeout", "inf"), 2, "'--timeout'"),
        (("create", "L", "--max-attempts", "99999999999999999999"), 2, "'--max-attempts'"),
        (("create", "L", "--backoff", "1e20"), 2, "'--backoff'"),
        (("sweep", "--grace", "inf"), 2, "'--grace'"),
        (("bench", "--sizes", "1000,0"), 2, "at least 1 job each"),
        (("bench", "--sizes", ","), 2, "at least 1 job each"),
        # Refused as usage, before Spark starts (the scheduler refused 0 only once it had).
        (("sync", "--every", "0"), 2, "'0' is not more than 0"),
        (("sync", "--lease", "0s"), 2, "'0s' is not more than 0"),
        (("sync", "--delete-after", "99999999999d"), 2, "more than ten years"),
        (("sync", "--mysql", "mysql://root:pw@:3306/db"), 2, "target URL 'mysql://root:***@:3306/db': no host"),
        (("sync", "--mysql", "mysql://u@127.0.0.1:3306/db", "--list", "bad name"), 2,
         "Invalid value for '--list' (env var: 'AEROQUEUE_SYNC_LISTS'): invalid list name 'bad name'"),
        # Retention with a narrowed run: options that do not go together, wrong usage.
        (("sync", "--mysql", "mysql://u@127.0.0.1:3306/db", "--delete-after", "7d", "--list", "L"), 2,
         "retention (--delete-after) applies to the whole store: not with --list or --since"),
        (("sync", "--mysql", "mysql://u@127.0.0.1:3306/db", "--delete-after", "7d", "--since", "2d"), 2,
         "applies to the whole store"),
        (("worker", "--handler", "json:dumps", "--list", "L", "--drain-timeout", "nan"), 2, "'nan' is not a number"),
        (("worker", "--handler", "json:dumps", "--list", "L", "--heartbeat", "2", "--expiry", "3"), 2,
         "more than twice the heartbeat interval"),
        (("reserve", "L", "--hold", "5", "--heartbeat", "2", "--expiry", "3"), 2, "more than twice"),
        # A new list's backoff base above the default cap.
        (("create", "L", "--backoff", "7200"), 2, "the backoff cap (3600 s) would be below its base (7200 s)"),
        (("load", "L", "JOBS", "--backoff", "7200"), 2, "below its base"),
        (("load", "L", "JOBS", "--backoff", "10", "--backoff-max", "5"), 2, "the backoff cap (5 s) is below its base"),
        (("worker", "--handler", "json", "--list", "L"), 2, "handler 'json' must be written package.module:function"),
        # A list name with a trailing newline (a regex `$` lets one through).
        (("create", "L\n"), 2, "invalid list name 'L\\n'"),
        (("status", "a b"), 2, "invalid list name 'a b'"),
        (("load", "_x", "JOBS"), 2, "invalid list name '_x'"),
    ],
)
def test_bad_numbers_and_names_are_refused_before_anything_is_written(tmp_path, args, code, says):
    url = f"embedded://{tmp_path}/s.db"
    open_backend(url).close()
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,n\na,1\nb,2\n")
    out = cli(*[str(jobs) if a == "JOBS" else a for a in args], url=url)
    assert says in one_error_line(out, code)
    backend = open_backend(url)
    try:
        assert JobLists(backend).names() == [], "no list made"
        assert list(backend.scan(keys.JOB_SET)) == [], "no job written"
    finally:
        backend.close()


def test_an_unexpected_error_is_one_line_too(tmp_path, monkeypatch):
    def broken(*_: object) -> list[str]:
        raise TypeError("a bug")

    monkeypatch.setattr(JobLists, "names", broken)
    url = f"embedded://{tmp_path}/s.db"
    line = one_error_line(cli("--create", "lists", url=url), 1)
    assert "internal error" in line and "TypeError: a bug" in line and "--verbose" in line
    assert "Traceback" in cli("--create", "lists", "--verbose", url=url).stderr


SECRET = "S3cr3t-edges-XYZ"
MYSQL_WITH_PASSWORD = f"mysql://u:{SECRET}@127.0.0.1:3306/db"
STORE_WITH_PASSWORD = f"aerospike://u:{SECRET}@127.0.0.1:3000/test"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # --mysql forgotten: click quotes the argument it did not expect.
        (("sync", MYSQL_WITH_PASSWORD), "unexpected extra argument (mysql://u:***@127.0.0.1:3306/db)"),
        (("sync-bench", MYSQL_WITH_PASSWORD), "unexpected extra argument (mysql://u:***@"),
        # --url forgotten, before or after the command.
        ((STORE_WITH_PASSWORD, "lists"), "No such command 'aerospike://u:***@127.0.0.1:3000/test'"),
        (("lists", STORE_WITH_PASSWORD), "unexpected extra argument (aerospike://u:***@"),
        # A URL where a list name or another option's value goes.
        (("status", STORE_WITH_PASSWORD), "invalid list name 'aerospike://u:***@"),
        (("sync", "--every", MYSQL_WITH_PASSWORD), "'mysql://u:***@127.0.0.1:3306/db' is not a duration"),
        (("sync", "--partitions", MYSQL_WITH_PASSWORD), "'mysql://u:***@"),
        # A blank in the password: masked whole, as the argument it came in.
        (("sync", f"mysql://u:pa {SECRET}@h/db"), "unexpected extra argument (mysql://u:***@h/db)"),
        (("sync", f"--every=mysql://u:pa {SECRET}@h/db"), "'mysql://u:***@h/db' is not a duration"),
    ],
)
def test_a_usage_error_quoting_a_url_masks_its_password(tmp_path, args, says):
    """The real command in a process of its own: click's usage errors quote the value
    they refused, and a URL typed in the wrong place is still a password on a screen."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    out = subprocess.run([sys.executable, "-m", "aeroqueue", *args], capture_output=True, text=True, timeout=60,
                         env={**env, "XDG_DATA_HOME": str(tmp_path)}, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert SECRET not in out.stdout + out.stderr


@pytest.mark.parametrize(("file", "says"), [
    (MYSQL_WITH_PASSWORD + ".csv", "mysql:/u:***@127.0.0.1:3306/db.csv: cannot read the file"),
    (f"mysql://u:pa {SECRET}@h/db", "mysql:/u:***@h/db: cannot read the file"),  # missing, whatever its name
    (STORE_WITH_PASSWORD + ".jsonl", "aerospike:/u:***@127.0.0.1:3000/test.jsonl: cannot read the file"),
])
def test_a_url_given_as_the_file_to_load_has_its_password_masked(tmp_path, file, says):
    """`load L mysql://...`: the file's name, as a path makes it (one slash of the two),
    was quoted in the error whole, password and all: not the argument as typed, which
    is what the masking looked for."""
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    out = subprocess.run([sys.executable, "-m", "aeroqueue", "--url", f"embedded://{tmp_path}/s.db", "--create",
                          "load", "L", file], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert says in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert SECRET not in out.stdout + out.stderr


def test_an_unexpected_error_quoting_a_url_masks_its_password_traceback_too(tmp_path, monkeypatch):
    def broken(*_: object) -> list[str]:
        raise TypeError(f"a bug near {MYSQL_WITH_PASSWORD}")

    monkeypatch.setattr(JobLists, "names", broken)
    url = f"embedded://{tmp_path}/s.db"
    line = one_error_line(cli("--create", "lists", url=url), 1)
    assert "TypeError: a bug near mysql://u:***@127.0.0.1:3306/db" in line
    loud = cli("--create", "lists", "--verbose", url=url)
    assert "Traceback" in loud.stderr and "mysql://u:***@" in loud.stderr and SECRET not in loud.output


def test_the_command_contexts_repr_masks_the_store_password():
    """A debugger, a log of locals or a rich traceback with locals shows reprs."""
    from aeroqueue.cli.context import Context

    shown = repr(Context(url=f"aerospike://app:{SECRET}@127.0.0.1:3000/test", verbose=False))
    assert SECRET not in shown and "aerospike://app:***@127.0.0.1:3000/test" in shown, shown


@pytest.mark.parametrize(
    "argv",
    [
        ["--verbose", "status", "nope"],
        ["status", "--verbose", "nope"],
        ["status", "nope", "-v"],
        ["udf", "register", "--verbose"],
        ["udf", "--verbose", "register"],
    ],
)
def test_verbose_works_anywhere_on_the_line(tmp_path, argv):
    url = f"embedded://{tmp_path}/s.db"
    if argv[0] == "udf":
        url = f"embedded://{tmp_path}/missing.db"  # an error to show the traceback of
    else:
        open_backend(url).close()
    quiet = cli(*[a for a in argv if a not in ("--verbose", "-v")], url=url)
    assert quiet.exit_code == 1 and "Traceback" not in quiet.output
    loud = cli(*argv, url=url)
    assert loud.exit_code == 1 and "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.splitlines()[-1].startswith("error: "), "the one line still ends the output"
    assert "Traceback" in cli(*[a for a in argv if a not in ("--verbose", "-v")], url=url, AEROQUEUE_VERBOSE="1").stderr


# -- complete and fail: which job, and why not ------------------------------------------


def test_ack_refusals_name_the_job_id_and_say_why(ready_url, list_name):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"c{i}", {}) for i in range(5)], max_attempts=1)
    queue = Queue(backend)
    holder = Session.open(backend)
    try:
        never = one_error_line(cli("complete", list_name, "0", "--session", holder.id, url=ready_url), 1)
        assert "job 'c0'" in never and "never reserved" in never and "another session" not in never
        [j0, j1, j2] = queue.reserve(list_name, holder, 3)
        other = one_error_line(cli("complete", list_name, str(j0.token), "--session", "intruder", url=ready_url), 1)
        assert f"job {j0.jid!r}" in other and "claimed by another session, not intruder" in other
        assert holder.id not in other, "the holder's id is what complete asks: never quoted to another"

        ok = cli("complete", list_name, str(j0.token), "--session", holder.id, "--result", '{"n": 1}', "--json", url=ready_url)
        assert ok.exit_code == 0, ok.output
        assert json.loads(ok.stdout) == {"list": list_name, "token": j0.token, "id": j0.jid, "session": holder.id,
                                         "outcome": "done"}
        done = one_error_line(cli("fail", list_name, str(j0.token), "--session", "late", "--error", "x", url=ready_url), 1)
        assert f"job {j0.jid!r}" in done and f"already done (completed by session {holder.id})" in done

        dead = cli("fail", list_name, str(j1.token), "--session", holder.id, "--error", "broken", "--json", url=ready_url)
        assert json.loads(dead.stdout)["outcome"] == "dead" and json.loads(dead.stdout)["id"] == j1.jid
        line = one_error_line(cli("complete", list_name, str(j1.token), "--session", holder.id, url=ready_url), 1)
        assert "is dead" in line and f"aeroqueue kick {list_name}" in line
    finally:
        holder.close()  # releases j2
    back = one_error_line(cli("complete", list_name, str(j2.token), "--session", holder.id, url=ready_url), 1)
    assert f"job {j2.jid!r}" in back and "back in the queue" in back and "session closed" in back
    missing = one_error_line(cli("complete", list_name, "99", "--session", "s", url=ready_url), 1)
    assert f"list {list_name!r} has no job with token 99" in missing
    assert "no job list named" in one_error_line(cli("fail", "no-such-list", "0", "--session", "s", "--error", "e", url=ready_url), 1)
    # A blank error is what the job's record would keep of the failure: refused, as a blank bury reason is.
    for blank in ("", "  "):
        said = one_error_line(cli("fail", list_name, str(j2.token), "--session", "s", "--error", blank, url=ready_url), 2)
        assert "--error" in said and "the error is empty" in said, said



@pytest.mark.parametrize("held", ["claimed", "leased"])
def test_an_ack_past_the_time_limit_says_so_not_that_another_session_holds_it(ready_url, list_name, held):
    """The holding session itself, too late: the refusal says the time limit ran out
    (when, by the server's clock) and what becomes of the job, instead of 'claimed by
    session X, not X'."""
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"t{i}", {}) for i in range(3)], timeout_s=0.3, backoff_s=0)
    holder = Session.open(backend)
    try:
        jobs = Queue(backend).reserve(list_name, holder, 3, lease=held == "leased")
        assert all((j.lease is not None) == (held == "leased") for j in jobs)
        time.sleep(0.6)
        ends = set()
        for job, ack in zip(jobs, (["complete"], ["fail", "--error", "e"], ["complete", "--result", "1"]), strict=True):
            line = one_error_line(cli(ack[0], list_name, str(job.token), "--session", holder.id, *ack[1:],
                                      url=ready_url), 1)
            assert f"job {job.jid!r}" in line and f"not {holder.id}" not in line, line
            assert "time limit" in line and "ran out at" in line and "server's clock" in line, line
            assert "aeroqueue reap" in line and "retries the job" in line and "dead" in line, line
            ends.add(re.search(r"ran out at (\S+)", line).group(1))  # type: ignore[union-attr]
        if held == "claimed":
            rec = backend.get(keys.JOB_SET, jobs[0].name)
            assert rec is not None and rec.bins["state"] == "claimed", "left for the reaper"
            when = dt.datetime.fromtimestamp(rec.bins["dl"] / 1000, dt.UTC).isoformat(timespec="milliseconds")
            assert when in ends
        else:
            time.sleep(CLOCK_MARGIN_MS / 1000)  # the reaper ends a lease only this much past its end
        assert reap(backend).timed_out >= 3, "what the refusal says: the reaper ends them"
    finally:
        holder.close()
        backend.close()


@pytest.mark.parametrize(("text", "why"), [
    ("NaN", "not JSON compliant"), ("Infinity", "not JSON compliant"), ("-Infinity", "not JSON compliant"),
    ("1e999", "not JSON compliant"), ('{"n": [NaN]}', "not JSON compliant"),
    ("99999999999999999999999", "does not fit in 64 bits"),
    ("[" * 32 + "]" * 32, "nested more than 31 deep"),
    ('{"a": "x\\u0000y"}', "NUL character"),
])
def test_complete_refuses_a_result_that_cannot_be_stored_and_leaves_the_job_claimed(ready_url, list_name, text, why):
    """Python's json reads NaN, Infinity and 1e999 (inf), but they are not JSON: stored,
    `job show --json` and `export` would print invalid JSON and the sync would refuse
    the row. The worker refuses such results (`storable_result`); so does the CLI."""
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec("r0", {})])
    with Session.open(backend) as holder:
        (j0,) = Queue(backend).reserve(list_name, holder, 1)
        line = one_error_line(cli("complete", list_name, str(j0.token), "--session", holder.id, "--result", text,
                                  url=ready_url), 2)
        assert "--result" in line and "cannot be stored" in line and why in line
        rec = backend.get(keys.JOB_SET, j0.name)
        assert rec is not None and rec.bins["state"] == "claimed" and rec.bins.get("result") is None, "nothing written"
        ok = cli("complete", list_name, str(j0.token), "--session", holder.id, "--result", "[1.5, 2]", url=ready_url)
        assert ok.exit_code == 0, ok.output
    shown = cli("job", "show", list_name, "r0", "--json", url=ready_url)
    assert json.loads(shown.stdout)["result"] == [1.5, 2]


@pytest.mark.parametrize(("opts", "outcome", "says"), [
    ({"backoff_s": 0}, "retry", "will be retried"),
    ({}, "delayed", "will be retried after the list's backoff"),  # the default backoff: 1 s
    ({"max_attempts": 1}, "dead", "is dead"),
])
def test_fail_says_what_becomes_of_the_job(ready_url, list_name, opts, outcome, says):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec("f0", {}), JobSpec("f1", {})], **opts)
    with Session.open(backend) as holder:
        j0, j1 = Queue(backend).reserve(list_name, holder, 2)
        text = cli("fail", list_name, str(j0.token), "--session", holder.id, "--error", "e", url=ready_url)
        assert text.exit_code == 0, text.output
        assert text.stdout == f"{list_name}/{j0.token} (id 'f0') {says}\n"
        as_json = cli("fail", list_name, str(j1.token), "--session", holder.id, "--error", "e", "--json", url=ready_url)
        assert json.loads(as_json.stdout)["outcome"] == outcome



def test_loading_more_into_an_ids_list_needs_no_mode(ready_url, list_name, tmp_path):
    first, more = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("id\na\nb\n")
    more.write_text("id\nc\n")
    assert cli("load", list_name, str(first), "--mode", "ids", url=ready_url).exit_code == 0
    again = cli("load", list_name, str(more), url=ready_url)
    assert again.exit_code == 0, again.output
    st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
    assert (st["mode"], st["total"]) == ("ids", 3)
    assert "already exists (ids mode)" in cli("create", list_name, url=ready_url).stdout
    wrong = one_error_line(cli("load", list_name, str(more), "--mode", "tokens", url=ready_url), 1)
    assert "exists in 'ids' mode, not 'tokens'" in wrong


def test_an_ack_of_a_buried_job_says_it_was_buried(ready_url, list_name):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec("b0", {})], seal=True)
    with Session.open(backend) as holder:
        [job] = Queue(backend).reserve(list_name, holder, 1)
        assert JobLists(backend).bury(list_name, "b0", "bad address") == "dead"
        line = one_error_line(cli("complete", list_name, str(job.token), "--session", holder.id, url=ready_url), 1)
        assert "was buried by an operator (bad address)" in line and f"aeroqueue job kick {list_name} b0" in line
    kicked = f"{list_name}-k"
    JobLists(backend).load(kicked, [JobSpec(f"k{i}", {}) for i in range(20)])
    with Session.open(backend) as holder:
        leased = Queue(backend).reserve(kicked, holder, 20, lease=True)
        first = next(j for j in leased if j.jid == "k0")
        assert first.lease is not None
        assert JobLists(backend).bury(kicked, "k0") == "dead" and JobLists(backend).kick_job(kicked, "k0")
        line = one_error_line(cli("complete", kicked, str(first.token), "--session", holder.id, url=ready_url), 1)
        assert "was kicked back into the queue after its lease" in line and "ran out" not in line


def test_loading_into_an_existing_list_says_its_setup_options_change_nothing(ready_url, list_name, tmp_path):
    jobs = tmp_path / "a.csv"
    jobs.write_text("id\na\n")
    first = cli("load", list_name, str(jobs), "--timeout", "42", url=ready_url)
    assert first.exit_code == 0 and "note:" not in first.stderr, "a new list takes them"
    again = cli("load", list_name, str(jobs), "--timeout", "9", "--max-attempts", "2", url=ready_url)
    assert again.exit_code == 0, again.output
    said = " ".join(again.stderr.split())
    assert f"note: {list_name} exists, so --max-attempts, --timeout change nothing" in said
    st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
    assert (st["timeout_s"], st["max_attempts"]) == (42, 5)
    assert "note:" not in cli("load", list_name, str(jobs), url=ready_url).stderr
    # An existing list's own backoff: a base above the default cap is no error for it.
    slow = f"{list_name}-slow"
    assert cli("create", slow, "--backoff", "7200", "--backoff-max", "10000", url=ready_url).exit_code == 0
    more = cli("load", slow, str(jobs), "--backoff", "7200", url=ready_url)
    assert more.exit_code == 0 and "note:" in more.stderr, more.output


def test_contradicting_list_options_are_refused_before_the_input_is_read(ready_url, list_name, tmp_path):
    """--backoff above --backoff-max was refused (exit 1) only once the whole file had
    been checked: minutes into a large load, and after any error in the file."""
    jobs = tmp_path / "a.csv"
    jobs.write_text("id,payload\na,{}\nb,{not json\n")
    out = cli("load", list_name, str(jobs), "--backoff", "10", "--backoff-max", "5", url=ready_url)
    assert out.exit_code == 2, out.output
    assert "the backoff cap (5 s) is below its base (10 s)" in " ".join(out.stderr.split())
    assert "line 3" not in out.stderr, "the input was read"
    # Against the default cap (3600 s), for a new list only: an existing one keeps its own.
    out = cli("load", list_name, str(jobs), "--backoff", "7200", url=ready_url)
    assert out.exit_code == 2 and "would be below its base (7200 s)" in " ".join(out.stderr.split()), out.output
    with pytest.raises(errors.ListNotFound):
        JobLists(open_backend(ready_url)).header(list_name)


def test_tuning_a_backoff_cap_below_its_base_is_usage_naming_the_options(ready_url, list_name):
    """`tune --backoff 5 --backoff-max 2` was refused with exit 1 and "the backoff cap (2 s)
    is below its base (5 s)", naming no option, where load and create call it usage (a
    README walk-through). The option not given is the list's own value."""
    assert cli("create", list_name, "--backoff", "1", "--backoff-max", "60", url=ready_url).exit_code == 0
    for args, says in [
        (("--backoff", "5", "--backoff-max", "2"), "--backoff-max (2 s) is below --backoff (5 s)"),
        (("--backoff-max", "0.5"), "--backoff-max (0.5 s) is below --backoff (1 s, the list's)"),
        (("--backoff", "90"), "--backoff-max (60 s, the list's) is below --backoff (90 s)"),
    ]:
        assert says in one_error_line(cli("tune", list_name, *args, url=ready_url), 2)
    # Values from the environment are named by their variables, as --heartbeat's are.
    said = one_error_line(cli("tune", list_name, url=ready_url, AEROQUEUE_BACKOFF="5", AEROQUEUE_BACKOFF_MAX="2"), 2)
    assert "--backoff-max (2 s, from AEROQUEUE_BACKOFF_MAX) is below --backoff (5 s, from AEROQUEUE_BACKOFF)" in said, said
    st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
    assert (st["backoff_s"], st["backoff_max_s"]) == (1, 60), "nothing changed"
    assert cli("tune", list_name, "--backoff", "90", "--backoff-max", "120", url=ready_url).exit_code == 0
    st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
    assert (st["backoff_s"], st["backoff_max_s"]) == (90, 120)


def test_creating_a_list_that_exists_says_its_setup_options_change_nothing(ready_url, list_name):
    made = cli("create", list_name, "--timeout", "42", url=ready_url)
    assert made.exit_code == 0 and "note:" not in made.stderr, "a new list takes them"
    again = cli("create", list_name, "--max-attempts", "2", "--backoff", "0", url=ready_url)
    assert again.exit_code == 0 and "already exists" in again.stdout, again.output
    said = " ".join(again.stderr.split())
    assert f"note: {list_name} exists, so --max-attempts, --backoff change nothing" in said, said
    st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
    assert (st["timeout_s"], st["max_attempts"], st["backoff_s"]) == (42, 5, 1)
    assert "note:" not in cli("create", list_name, url=ready_url).stderr

def test_export_lists_the_jobs_of_each_state(ready_url, list_name):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"e{i}", {}) for i in range(4)], backoff_s=600, seal=True)
    queue = Queue(backend)
    with Session.open(backend) as holder:
        done, delayed, claimed = queue.reserve(list_name, holder, 3)
        queue.complete(done, "ok")
        assert queue.fail(delayed, "later") == "delayed"
        for state, ids in [("queued", ["e3"]), ("delayed", ["e1"]), ("claimed", ["e2"]), ("done", ["e0"]), ("dead", [])]:
            out = cli("export", list_name, "--state", state, url=ready_url)
            assert out.exit_code == 0, out.output
            assert [json.loads(line)["jid"] for line in out.stdout.splitlines()] == ids, state
        queue.release(claimed)

@pytest.mark.parametrize("how", ["reloaded", "reserved again"])
def test_an_acknowledgement_with_its_claim_is_refused_once_the_session_holds_a_later_reservation(
    ready_url, list_name, how
):
    """`complete` and `fail` name a job by list, token and session: a session that
    reserves the same token again (the list dropped and loaded again under its name,
    or the job back in the queue) would have a stale acknowledgement of its first
    claim taken for one of the new claim. With `--claim` (the request id `reserve`
    prints) only that reservation's claim is acknowledged, as from Python."""
    backend = open_backend(ready_url)
    lists = JobLists(backend)
    lists.load(list_name, [JobSpec("old", {})], backoff_s=0)
    with Session.open(backend) as s:
        if how == "reloaded":
            first = json.loads(cli("reserve", list_name, "--session", s.id, url=ready_url).stdout)
            lists.drop(list_name, grace_s=0)
            lists.load(list_name, [JobSpec("new", {})], backoff_s=0)
        else:
            job = Queue(backend).reserve(list_name, s)[0]
            first = {"token": job.token, "claim": job.rid}
            assert Queue(backend).release(job) == "released"
        out = cli("reserve", list_name, "--session", s.id, url=ready_url)
        assert out.exit_code == 0, out.output
        second = json.loads(out.stdout)
        assert second["token"] == first["token"] and second["claim"] != first["claim"] and second["claim"]
        token = str(first["token"])
        held = backend.get(keys.JOB_SET, keys.job_name(list_name, int(token)))
        assert held is not None and (held.bins["state"], held.bins["rid"], held.bins["att"]) == ("claimed", second["claim"], 1)
        for args in (("complete", "--result", '"stale"'), ("fail", "--error", "stale")):
            line = one_error_line(cli(args[0], list_name, token, "--session", s.id, "--claim", first["claim"],
                                      *args[1:], url=ready_url), 1)
            assert f"held by session {s.id} under another reservation, not claim {first['claim']}" in line, line
        rec = backend.get(keys.JOB_SET, keys.job_name(list_name, int(token)))
        assert rec is not None and (rec.gen, rec.bins) == (held.gen, held.bins), "a stale ack writes nothing"
        ok = cli("complete", list_name, token, "--session", s.id, "--claim", second["claim"], "--json", url=ready_url)
        assert ok.exit_code == 0, ok.output
        assert json.loads(ok.stdout)["outcome"] == "done"
        again = cli("complete", list_name, token, "--session", s.id, "--claim", second["claim"], url=ready_url)
        assert again.exit_code == 0, again.output  # repeating a completion is harmless
        stale = one_error_line(cli("complete", list_name, token, "--session", s.id, "--claim", first["claim"],
                                   url=ready_url), 1)
        assert "already done" in stale, stale
        blank = cli("complete", list_name, token, "--session", s.id, "--claim", " ", url=ready_url)
        assert blank.exit_code == 2 and "the claim is empty" in blank.output, blank.output
    rec = backend.get(keys.JOB_SET, keys.job_name(list_name, int(token)))
    assert rec is not None and (rec.bins["state"], rec.bins.get("result"), rec.bins["att"]) == ("done", None, 1)
    assert rec.bins["jid"] == ("new" if how == "reloaded" else "old")


def test_complete_and_fail_act_on_a_job_the_session_holds_by_a_lease(ready_url, list_name):
    """A worker's batches are leased, not claimed: `complete --session` and `fail
    --session` find the lease on the session record and acknowledge through it, once."""
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"l{i}", {}) for i in range(3)], backoff_s=0)
    holder = Session.open(backend)
    try:
        j0, j1, j2 = Queue(backend).reserve(list_name, holder, 3, lease=True)
        assert j0.lease is not None, "leased, not claimed"
        ok = cli("complete", list_name, str(j0.token), "--session", holder.id, "--result", '{"n": 1}', "--json",
                 url=ready_url)
        assert ok.exit_code == 0, ok.output
        assert json.loads(ok.stdout)["outcome"] == "done"
        again = cli("complete", list_name, str(j0.token), "--session", holder.id, "--result", '{"n": 2}', url=ready_url)
        assert again.exit_code == 0, again.output  # repeating a completion is harmless
        failed = cli("fail", list_name, str(j1.token), "--session", holder.id, "--error", "broken", "--json",
                     url=ready_url)
        assert failed.exit_code == 0, failed.output
        assert json.loads(failed.stdout)["outcome"] == "retry"
        other = one_error_line(cli("complete", list_name, str(j2.token), "--session", "intruder", url=ready_url), 1)
        assert f"job {j2.jid!r}" in other and "leased by another session, not intruder" in other
        assert holder.id not in other, "the holder's id is what complete asks: never quoted to another"
        # A claim names the lease (its id): another is refused, that one acknowledges.
        wrong = one_error_line(cli("complete", list_name, str(j2.token), "--session", holder.id, "--claim", "x" + j2.rid,
                                   url=ready_url), 1)
        assert f"held by session {holder.id} under another reservation, not claim x{j2.rid}" in wrong, wrong
        named = cli("complete", list_name, str(j2.token), "--session", holder.id, "--claim", j2.rid, url=ready_url)
        assert named.exit_code == 0, named.output
        Queue(backend).complete(j0, "twice")  # the same session and lease: a repeat, harmless
        rec0 = backend.get(keys.JOB_SET, j0.name)
        rec1 = backend.get(keys.JOB_SET, j1.name)
        assert rec0 is not None and rec0.bins["state"] == "done" and rec0.bins["result"] == {"n": 1}
        assert rec1 is not None and rec1.bins["state"] == "queued" and rec1.bins["att"] == 1
        rec2 = backend.get(keys.JOB_SET, j2.name)
        assert rec2 is not None and (rec2.bins["state"], rec2.bins["rid"], rec2.bins["att"]) == ("done", j2.rid, 1)
    finally:
        holder.close()
        backend.close()


@pytest.mark.parametrize("as_json", [True, False])
def test_reap_reports_the_claims_it_ended_past_their_time_limit(ready_url, list_name, as_json):
    """A reap that ends overdue claims of live sessions did work: it says how many, and
    its warnings name each job, not two bare 'claim timed out' lines."""
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"o{i}", {}) for i in range(2)], timeout_s=0.3, backoff_s=0)
    # Another live session's overdue claims, as earlier tests may leave on a shared
    # server: the reap ends them too, and says 12 or more.
    others = f"o{list_name[1:]}"  # a name the warnings' filter below does not take for this list's
    JobLists(backend).load(others, [JobSpec(f"x{i}", {}) for i in range(10)], timeout_s=0.3, backoff_s=0)
    with Session.open(backend) as holder, Session.open(backend) as other:
        assert len(Queue(backend).reserve(others, other, 10)) == 10
        jobs = Queue(backend).reserve(list_name, holder, 2)
        time.sleep(0.6)
        # A process of its own: what reaches stderr with no log handler set (pytest's would catch it).
        out = subprocess.run([sys.executable, "-m", "aeroqueue", "--url", ready_url, "reap", *(["--json"] if as_json else [])],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k not in CLEAN})
        assert out.returncode == 0, out.stderr
        if as_json:
            report = json.loads(out.stdout)
            assert report["timed_out"] >= 12 and report["sessions"] >= 0  # (>=: other tests' leftovers on a shared server)
        else:
            # (A sweep after it, should it end other tests' expired sessions on a shared server.)
            said = re.fullmatch(r"reaped \d+ session\(s\), released \d+ job\(s\), timed out (\d+) claim\(s\)(; swept: .*)?\n",
                                out.stdout)
            assert said and int(said.group(1)) >= 12, out.stdout
        warned = [line for line in out.stderr.splitlines() if list_name in line]
        assert len(warned) == 2, out.stderr
        # Log lines, not bare messages: a time and the level before each.
        assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} warning claim timed out", w) for w in warned), warned
        for job in jobs:
            assert any(f"{list_name}/{job.token}" in w and repr(job.jid) in w and holder.id in w for w in warned), warned
    assert [JobLists(backend).find_job(list_name, j.jid)["state"] for j in jobs] == ["queued", "queued"]


@pytest.mark.parametrize("how", ["text", "json", "no-sweep"])
def test_reap_alone_brings_back_the_jobs_a_reserver_killed_before_its_claim_took(ready_url, list_name, how):
    """A reserver SIGKILLed between its take and its claim: no session holds what it
    took, so its reap gives nothing back. A worker's reap that ends such a session
    sweeps at once (`Worker._maintenance_loop`); `aeroqueue reap` from cron does too,
    or those jobs waited for the regular sweep (minutes) with no worker to run it."""
    backend = open_backend(ready_url)
    lists = JobLists(backend)
    lists.load(list_name, [JobSpec(f"k{i}", {}) for i in range(8)], seal=True)
    root = Path(__file__).resolve().parents[1]
    victim = subprocess.Popen([sys.executable, "-c", VICTIM, ready_url, list_name, "1.0"], cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None
        took = json.loads(victim.stdout.readline())
        assert (took["st"], took["n"]) == ("ok", 5), took
        sid = next(sid for sid, rec in backend.scan(keys.SESS_SET) if rec.bins.get("pid") == victim.pid)
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()
    st = lists.status(list_name)
    assert (st.in_flight, st.reservable, st.retry_pending) == (5, 3, 0), "taken, held by nobody"
    args = ["reap", *(["--json"] if how == "json" else []), *(["--no-sweep"] if how == "no-sweep" else [])]
    outs = []

    def reaped() -> bool:
        out = cli(*args, url=ready_url)
        assert out.exit_code == 0, out.output
        outs.append(out.stdout)
        return backend.get(keys.SESS_SET, sid) is None

    # Its expiry is a second: a reap ends its session once that has passed, by the server's clock.
    wait_for("the killed reserver's session reaped", reaped, 30, step_s=0.2)
    st = lists.status(list_name)
    if how == "no-sweep":
        assert (st.in_flight, st.retry_pending) == (5, 0), "left to the regular sweep"
        assert "swept" not in outs[-1], outs
        return
    assert (st.in_flight, st.reservable, st.retry_pending) == (0, 3, 5), outs
    if how == "json":
        report = json.loads(outs[-1])
        # (>=: a shared server may hold other tests' expired sessions and lost jobs)
        assert report["swept"] is True and report["sessions"] >= 1 and report["requeued"] >= 5, report
    else:
        said = re.fullmatch(r"reaped \d+ session\(s\), released \d+ job\(s\), timed out \d+ claim\(s\); "
                            r"swept: requeued (\d+) job\(s\), released \d+ orphaned claim\(s\)\n", outs[-1])
        assert said and int(said.group(1)) >= 5, outs
    with Session.open(backend) as s:
        assert sorted(j.jid for j in Queue(backend).reserve(list_name, s, 8)) == [f"k{i}" for i in range(8)]


def test_a_sweep_after_a_reap_that_fails_says_the_reap_was_done_and_how_to_sweep(ready_url, monkeypatch):
    """The reap ended its sessions: no later reap sets that sweep off again, so the
    error says so, and what runs it, rather than a bare store error."""
    from aeroqueue.cli import worker_cmd

    def down(*args: object, **kw: object) -> None:
        raise errors.BackendError("the store stopped answering")

    monkeypatch.setattr(worker_cmd, "sweep_store", down)
    dead = Session.open(open_backend(ready_url), interval_s=0.05, expiry_s=0.2, heartbeat=False)
    time.sleep(0.5)
    line = one_error_line(cli("reap", url=ready_url), 1)
    assert "the store stopped answering" in line and "but the sweep after it failed" in line, line
    # Half the shortest expiry of the sessions it ended: 0.1 s, or less for another test's on a shared server.
    grace = re.search(r"`aeroqueue sweep --grace ([0-9.]+)` runs it again", line)
    assert grace and float(grace.group(1)) <= 0.1, line
    assert open_backend(ready_url).get(keys.SESS_SET, dead.id) is None, "reaped all the same"


@contextlib.contextmanager
def _a_reap_failing_part_way(backend: Any, monkeypatch: pytest.MonkeyPatch, message: str) -> Iterator[list[Session]]:
    """Two expired sessions of the test's own, and a reap that ends whichever of them
    it reaches first and fails (BackendError(`message`)) on the other's recount; other
    tests' sessions on a shared server are reaped as usual. Afterwards every session of
    the test is reaped, so none is left for a later test's reap to end."""
    dead = [Session.open(backend, interval_s=0.05, expiry_s=0.2, heartbeat=False) for _ in range(2)]
    time.sleep(0.5)
    refuse_recount_after_the_first(monkeypatch, dead, errors.BackendError(message))
    try:
        yield dead
    finally:
        monkeypatch.undo()
        reap(backend)


def test_a_reap_that_fails_part_way_still_sweeps_for_the_sessions_it_ended(ready_url, list_name, monkeypatch):
    """A reap that fails after it ended a session: that session is gone, so the next
    reap would not set off the sweep for the jobs it took and never claimed, and they
    waited for the regular sweep. The command sweeps for it before it says the error."""
    backend = open_backend(ready_url)
    lists = JobLists(backend)
    lists.load(list_name, [JobSpec(f"k{i}", {}) for i in range(8)], seal=True)
    # Taken by a reserver that died before claiming: no session holds them.
    took = lists._list_udf(list_name, "take", 5)
    assert took["n"] == 5, took
    with _a_reap_failing_part_way(backend, monkeypatch, "the store stopped answering") as dead:
        line = one_error_line(cli("reap", url=ready_url), 1)
        assert "the store stopped answering" in line, line
        said = re.search(r"reaped (\d+) session\(s\) before it, and swept after them: requeued (\d+) job\(s\)", line)
        # (>=: other tests' expired sessions and lost jobs on a shared server)
        assert said and int(said.group(1)) >= 1 and int(said.group(2)) >= 5, line
        st = lists.status(list_name)
        assert (st.in_flight, st.reservable, st.retry_pending) == (0, 3, 5), "swept back"
        left = [s for s in dead if backend.get(keys.SESS_SET, s.id) is not None]
        assert len(left) == 1 and backend.get(keys.SESS_SET, left[0].id).bins["state"] == "reaping", \
            "one ended, the other left for the next reap"
    assert all(backend.get(keys.SESS_SET, s.id) is None for s in dead), "the next reap ends it"
    with Session.open(backend) as s:
        assert sorted(j.jid for j in Queue(backend).reserve(list_name, s, 8)) == [f"k{i}" for i in range(8)]


def test_a_reap_and_its_sweep_that_both_fail_say_so_in_one_line(ready_url, monkeypatch):
    """The reap's error is the one raised; the sweep's is named in it, with what runs
    that sweep again."""
    from aeroqueue.cli import worker_cmd

    def down(*args: object, **kw: object) -> None:
        raise errors.BackendError("the store stopped answering")

    backend = open_backend(ready_url)
    with _a_reap_failing_part_way(backend, monkeypatch, "the reap's own failure"):
        monkeypatch.setattr(worker_cmd, "sweep_store", down)
        line = one_error_line(cli("reap", url=ready_url), 1)
    assert "the reap's own failure" in line and "the sweep after them failed too (the store stopped answering)" in line, line
    assert re.search(r"`aeroqueue sweep --grace [0-9.]+` runs it again", line), line


# -- reserve and its session ----------------------------------------------------------


def _reserve_process(url: str, list_name: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", url, "reserve", list_name, *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_reserve_heartbeats_while_holding_and_ends_when_every_job_is_acknowledged(ready_url, list_name):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"c{i}", {}) for i in range(5)], backoff_s=0)
    proc = _reserve_process(ready_url, list_name, "-n", "3", "--hold", "60", "--heartbeat", "0.2", "--expiry", "1")
    try:
        assert proc.stdout is not None
        jobs = [json.loads(proc.stdout.readline()) for _ in range(3)]
        time.sleep(2.5)  # two and a half expiries: a session nobody heartbeats would be reaped now
        reap(backend)  # (other tests' leftovers on a shared server may go; this one must not)
        assert backend.get(keys.SESS_SET, jobs[0]["session"]) is not None
        assert all(backend.get(keys.JOB_SET, keys.job_name(list_name, j["token"])).bins["state"] == "claimed" for j in jobs)
        assert cli("complete", list_name, str(jobs[0]["token"]), "--session", jobs[0]["session"], url=ready_url).exit_code == 0
        assert cli("complete", list_name, str(jobs[1]["token"]), "--session", jobs[1]["session"], url=ready_url).exit_code == 0
        assert proc.poll() is None, "one job is still held"
        assert cli("fail", list_name, str(jobs[2]["token"]), "--session", jobs[2]["session"], "--error", "e", url=ready_url).exit_code == 0
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    assert "released" not in (proc.stderr.read() if proc.stderr else "")
    st = JobLists(backend).status(list_name)
    assert (st.done, st.in_flight, st.retry_pending, st.reservable) == (2, 0, 1, 2)
    assert backend.get(keys.SESS_SET, jobs[0]["session"]) is None, "its session is closed"


@pytest.mark.parametrize("end", ["time", "sigterm"])
def test_reserve_releases_what_is_left_when_it_ends(ready_url, list_name, end):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"c{i}", {}) for i in range(3)])
    proc = _reserve_process(ready_url, list_name, "-n", "2", "--hold", "2" if end == "time" else "60")
    assert proc.stdout is not None
    jobs = [json.loads(proc.stdout.readline()) for _ in range(2)]
    assert jobs[0]["claim"] == jobs[1]["claim"], "one reservation, one claim"
    assert cli("complete", list_name, str(jobs[0]["token"]), "--session", jobs[0]["session"], url=ready_url).exit_code == 0
    if end == "sigterm":
        proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    err = proc.stderr.read() if proc.stderr else ""
    assert "released 1 job(s)" in err
    # The command to acknowledge with, on one line to copy (it was cut at 80 columns, mid-command).
    ack = f"`aeroqueue complete {list_name} TOKEN --session {jobs[0]['session']} --claim {jobs[0]['claim']}`"
    assert any(ack in line for line in err.splitlines()), err
    rec = backend.get(keys.JOB_SET, keys.job_name(list_name, jobs[1]["token"])).bins
    assert rec["state"] == "queued" and rec["att"] == 0, "back at once, its attempt refunded"
    st = JobLists(backend).status(list_name)
    assert (st.done, st.in_flight, st.retry_pending + st.reservable) == (1, 0, 2)


def test_reserve_needs_hold_or_a_live_session(ready_url, list_name):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec("c0", {})])
    line = one_error_line(cli("reserve", list_name, url=ready_url), 2)
    assert "--hold" in line and "--session" in line
    gone = one_error_line(cli("reserve", list_name, "--session", "no-such-session", url=ready_url), 1)
    assert "no-such-session does not exist or is not alive" in gone
    assert JobLists(backend).status(list_name).reservable == 1, "nothing was taken"


# -- lists, status, --json ------------------------------------------------------------------


def test_lists_of_an_empty_store_says_how_to_make_one_on_a_terminal_and_prints_the_header_when_piped(tmp_path):
    url = f"embedded://{tmp_path / 'empty.db'}"
    assert cli("--create", "init", url=url).exit_code == 0
    shown = cli("lists", url=url, TTY_COMPATIBLE="1", COLUMNS="120")
    assert shown.exit_code == 0 and "no job lists in this store yet" in shown.stdout and "aeroqueue load" in shown.stdout
    piped = cli("lists", url=url)
    assert piped.exit_code == 0 and piped.stdout.split()[:3] == ["list", "mode", "total"], "scripts get the header"


def test_lists_prints_whole_names_when_piped_and_fits_a_terminal(ready_url):
    backend = open_backend(ready_url)
    long_name = f"{os.getpid()}-a-customer-list-with-a-really-long-name-for-the-terminal"[:64]
    JobLists(backend).load(long_name, [JobSpec("c0", {})])
    piped = cli("lists", url=ready_url)
    assert piped.exit_code == 0
    row = next(line for line in piped.stdout.splitlines() if line.startswith(long_name))
    assert row.split()[0] == long_name and "…" not in piped.stdout
    assert piped.stdout.splitlines()[0].split()[:3] == ["list", "mode", "total"]
    narrow = cli("lists", url=ready_url, TTY_COMPATIBLE="1", COLUMNS="60")
    assert narrow.exit_code == 0
    lines = ANSI.sub("", narrow.stdout).splitlines()
    assert max(len(line) for line in lines) <= 60
    cells = "".join(line.split("│")[1].strip() for line in lines if line.startswith("│"))
    assert long_name in cells, "wrapped, never cut"
    assert "not shown at this width" in " ".join(" ".join(lines).split())
    wide = ANSI.sub("", cli("lists", url=ready_url, TTY_COMPATIBLE="1", COLUMNS="400").stdout)
    assert "not shown" not in wide and "retry pending" in wide and long_name in wide


def test_queued_counts_what_a_reserve_can_take_now_and_a_terminal_keeps_paused(ready_url, list_name):
    """A helper's operator walk: after a kick, `reservable` read 0 while a reserve handed
    out every kicked job (back in the retry store: `retry_pending`), and the dashboard
    and the exporter called them queued. `queued` is that sum. And an 80-column
    terminal's `lists` hid `paused` first: a paused list looked idle."""
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"c{i}", {}) for i in range(3)], backoff_s=0)
    with Session.open(backend) as holder:
        (job,) = Queue(backend).reserve(list_name, holder, 1)
        assert Queue(backend).fail(job, "broken") == "retry"
        st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
        assert (st["queued"], st["reservable"], st["retry_pending"]) == (3, 2, 1), st
        table = ANSI.sub("", cli("status", list_name, url=ready_url).stdout)
        assert re.search(r"queued \(reservable now\)\s*│\s*3 │", table), table
        assert (len(Queue(backend).reserve(list_name, holder, 10)), "what queued said") == (3, "what queued said")
    assert cli("pause", list_name, url=ready_url).exit_code == 0
    narrow = ANSI.sub("", cli("lists", url=ready_url, TTY_COMPATIBLE="1", COLUMNS="80").stdout)
    header = next(line for line in narrow.splitlines() if "total" in line)
    assert "paused" in header and "queued" in header, narrow


def test_status_json_has_paused(ready_url, list_name):
    JobLists(open_backend(ready_url)).load(list_name, [JobSpec("c0", {})])
    assert json.loads(cli("status", list_name, "--json", url=ready_url).stdout)["paused"] is False
    assert cli("pause", list_name, url=ready_url).exit_code == 0
    st = json.loads(cli("status", list_name, "--json", url=ready_url).stdout)
    assert st["paused"] is True and st["name"] == list_name
    row = next(r for r in json.loads(cli("lists", "--json", url=ready_url).stdout) if r["name"] == list_name)
    assert row == st
    with Session.open(open_backend(ready_url)) as holder:
        paused = cli("reserve", list_name, "--session", holder.id, url=ready_url)
        assert paused.exit_code == 0 and paused.stdout == "", "nothing reserved"
        assert f"{list_name} is paused: `aeroqueue pause {list_name} --resume` resumes it" in paused.stderr
        assert cli("pause", list_name, "--resume", url=ready_url).exit_code == 0
        assert json.loads(cli("reserve", list_name, "--session", holder.id, url=ready_url).stdout)["id"] == "c0"


STATUS_KEYS = {"name", "mode", "total", "queued", "reservable", "delayed", "in_flight", "retry_pending", "done", "dead", "sealed",
               "paused", "complete", "timeout_s", "backoff_s", "backoff_max_s", "max_attempts", "dropping",
               "loads_in_progress", "loads_stalled"}


def test_json_shapes_are_the_documented_ones(ready_url, list_name):
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec("c0", {})])

    def shape(*args: str) -> object:
        out = cli(*args, "--json", url=ready_url)
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout)

    assert set(shape("status", list_name)) == STATUS_KEYS  # type: ignore[arg-type]
    assert set(shape("reap")) == {"sessions", "released", "timed_out", "swept", "requeued", "orphans"}  # type: ignore[arg-type]
    assert set(shape("sweep")) == {"requeued", "orphans", "recounted", "ranges"}  # type: ignore[arg-type]
    assert set(shape("udf", "register")) == {"url", "uploaded", "indexes"}  # type: ignore[arg-type]
    assert set(shape("init")) == {"url", "backend", "created", "uploaded", "indexes"}  # type: ignore[arg-type]
    assert {m["state"] for m in shape("udf", "status")} == {"ok"}  # type: ignore[union-attr, index]
    config = shape("config")
    assert set(config) >= {"url", "backend", "namespace", "source"} and config["source"] == "--url"  # type: ignore[index]
    with Session.open(backend) as s:
        out = cli("reserve", list_name, "--session", s.id, "--json", url=ready_url)
        job = json.loads(out.stdout)
        assert set(job) == {"list", "token", "id", "payload", "attempt", "session", "claim"} and job["session"] == s.id


# -- bench ------------------------------------------------------------------------------------------


def test_bench_uses_a_scratch_store_unless_told_and_shows_progress(tmp_path):
    xdg = tmp_path / "xdg"
    out = cli("bench", "--sizes", "100,200", "--sample", "10", "--batch", "5", XDG_DATA_HOME=str(xdg))
    assert out.exit_code == 0, out.output
    assert "scratch embedded store" in out.stderr
    assert "loading 200 jobs" in out.stderr and "measuring batch 5 on 200" in out.stderr, "the progress bar"
    assert "jobs in list" in out.stdout
    assert not xdg.exists(), "the user's default store is not touched"


@pytest.mark.parametrize("mode", [None, "tokens", "ids"])
def test_bench_on_a_given_store_deletes_everything_it_made(ready_url, mode, tmp_path):
    backend = open_backend(ready_url)
    sets = (keys.LIST_SET, keys.JOB_SET, keys.JIDX_SET, keys.DONE_SET, keys.IDS_SET, keys.BLOCK_SET)

    def bench_records() -> dict[str, int]:
        counts = {s: sum(1 for name, _ in backend.scan(s) if str(name).startswith("bench-")) for s in sets}
        return {**counts, "sessions": sum(1 for _ in backend.scan(keys.SESS_SET))}

    before = bench_records()
    figures = tmp_path / "bench.json"
    out = cli("bench", "--sizes", "150,300", "--sample", "10", "--batch", "5", "--json-out", str(figures),
              *(["--mode", mode] if mode else []), url=ready_url)
    assert out.exit_code == 0, out.output
    assert "its lists are deleted at the end" in out.stderr
    # Without --mode its lists are token stores, and the table and the figures say so (not "None mode").
    assert f"({mode or 'tokens'} mode)" in out.stdout, out.stdout
    assert json.loads(figures.read_text())["mode"] == (mode or "tokens")
    assert bench_records() == before
    assert not [n for n in JobLists(backend).names() if n.startswith("bench-")]
    assert udfs.status(backend) and all(s.state == "ok" for s in udfs.status(backend))


def test_bench_claims_refuses_a_store_with_open_sessions(tmp_path):
    url = f"embedded://{tmp_path}/s.db"
    backend = open_backend(url)
    udfs.register(backend)
    with Session.open(backend):
        out = cli("bench", "--claims", "--sample", "10", url=url)
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert "refused" in out.stderr.splitlines()[-1] and "open sessions" in out.stderr.splitlines()[-1]
    assert backend.create_index(keys.JOB_SET, "sess", keys.SESS_INDEX) is False, "the reaper's index is still there"


def test_an_unterminated_quote_is_reported_on_the_line_it_opens(tmp_path):
    url = f"embedded://{tmp_path}/s.db"
    data = tmp_path / "jobs.csv"
    data.write_text('id,email\nc0,a@example.com\n\nc1,"b@example.com\nc2,c@example.com\nc3,d@example.com\n')
    out = cli("--create", "load", "customers", str(data), url=url)
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert "jobs.csv, line 4: malformed CSV" in out.stderr.splitlines()[-1]  # (after load's progress bar)


def test_output_cut_short_by_its_reader_is_not_an_error(ready_url, list_name):
    """`aeroqueue export LIST | head -1`: the reader goes away; the command stops with
    the status shells give SIGPIPE, and says nothing (no 'error: Broken pipe', no
    traceback at exit)."""
    backend = open_backend(ready_url)
    JobLists(backend).load(list_name, [JobSpec(f"p{i}", {"pad": "x" * 200}) for i in range(2000)])
    backend.close()
    proc = subprocess.Popen([sys.executable, "-m", "aeroqueue", "--url", ready_url, "export", list_name],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={k: v for k, v in os.environ.items() if k not in CLEAN})
    assert proc.stdout is not None and proc.stderr is not None
    first = json.loads(proc.stdout.readline())
    assert first["list"] == list_name
    proc.stdout.close()  # 2,000 lines of 250 bytes: more than a pipe holds, so a write after this fails
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert err == ""


@pytest.mark.parametrize("command", [["complete"], ["fail", "--error", "e"]], ids=["complete", "fail"])
def test_a_job_id_given_for_its_token_says_what_token_is(tmp_path, command):
    """`aeroqueue complete LIST c5` (the job's id where its token goes) said only "'c5' is
    not a valid integer range.": nothing of what TOKEN is, nor where to find it. Still
    wrong usage (2), said before any store is opened."""
    out = cli(*command[:1], "L", "c5", "--session", "s", *command[1:], url=f"embedded://{tmp_path / 'none.db'}")
    line = one_error_line(out, 2)
    assert line.startswith("error: Invalid value for 'TOKEN': 'c5' is not a token: TOKEN is the job's number in its "
                           "list, the \"token\" that `aeroqueue reserve` printed for it (not its id)"), line
    assert not (tmp_path / "none.db").exists()
    # A number out of range keeps click's own message.
    assert "-1 is not in the range x>=0" in one_error_line(cli(*command[:1], "L", "--session", "s", *command[1:], "--",
                                                               "-1"), 2)


@pytest.mark.parametrize(("args", "env", "names"), [
    ([b"job", b"show", b"L", b"c\xff"], {}, "'ID'"),
    ([b"job", b"bury", b"L", b"1", b"--reason", b"r\xe9"], {}, "'--reason'"),
    ([b"fail", b"L", b"0", b"--error", b"x"], {"AEROQUEUE_SESSION": b"s\xff"}, "'--session'"),
    ([b"fail", b"L", b"0", b"--session", b"s", b"--error", b"caf\xe9"], {}, "'--error'"),
    ([b"complete", b"L", b"0", b"--session", b"s", b"--result", b'"\xff"'], {}, "'--result'"),
])
def test_text_in_another_encoding_is_wrong_usage_not_a_crash(ready_url, args, env, names):
    """A job id, session, reason, error or result typed in a Latin-1 terminal: as a
    record's name (a job id, a session) it crashed the aerospike client (a segfault,
    status 139, not a word said); as a value the server refused it with a message
    naming neither. Now wrong usage (2), naming the argument, before anything is sent."""
    environ = {**{k: v for k, v in os.environ.items() if k not in CLEAN}, "AEROQUEUE_URL": ready_url}
    run = subprocess.run([sys.executable, "-m", "aeroqueue", *args], env={**environ, **env},
                         capture_output=True, timeout=60)
    err = run.stderr.decode("utf-8", "replace")
    assert run.returncode == 2, (run.returncode, err[-2000:])
    assert f"Invalid value for {names}" in err and "is not valid UTF-8 text" in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


# Clipboard, clear screen, bidi, CR (within: an id may not end in whitespace).
EVIL_ID = "inv\x1b]52;c;cm0gLXJmIH4=\x07oice\x1b[2J\u202egpj.exe\rok"


def test_a_customers_terminal_controls_reach_no_terminal(ready_url, list_name, caplog):
    """A job id (a customer's file) and a handler's error are printed for an operator:
    `job show`, an error line, a worker's log line. Raw, ESC sequences would set the
    operator's clipboard (OSC 52) or clear the screen, CR overwrite a line, U+202E
    show "exe.jpg" for "gpj.exe". They are shown as escapes; the JSON forms were and
    are escaped by JSON itself."""
    import logging

    from aeroqueue.logs import TextLines

    lists = JobLists(open_backend(ready_url))
    lists.load(list_name, [JobSpec(EVIL_ID, {"note": "\x1b[31mred"})], max_attempts=1)
    q = Queue(lists.backend)
    with Session.open(lists.backend, heartbeat=False) as s:
        job = q.reserve(list_name, s)[0]
        q.fail(job, "boom\x1b]0;owned\x07\n  at line\u2028two")
    shown = cli("job", "show", list_name, EVIL_ID, url=ready_url)
    assert shown.exit_code == 0, shown.output
    missing = cli("job", "show", list_name, EVIL_ID + "x", url=ready_url)
    assert missing.exit_code == 1
    record = logging.LogRecord("aeroqueue.worker", logging.WARNING, "", 0, "job %s failed", (EVIL_ID,), None)
    record.jid, record.error = EVIL_ID, "a\x85b"
    line = TextLines().format(record)
    for out in (shown.stdout, missing.stderr, line):
        assert not any(c in out for c in "\x1b\x07\r\u202e\u2028\x85"), repr(out)
    assert "inv\\u001b]52;c;cm0gLXJmIH4=\\u0007oice\\u001b[2J\\u202egpj.exe\\u000d" in shown.stdout, shown.stdout
    assert "boom\\u001b]0;owned\\u0007" in shown.stdout and "\n  at line\\u2028two" in shown.stdout, shown.stdout
    assert "inv\\u001b]52" in missing.stderr or "inv\\x1b]52" in missing.stderr, missing.stderr
    assert 'jid="inv\\u001b]52' in line and 'error="a\\u0085b"' in line, line
    assert json.loads(line.split("jid=", 1)[1].split(" error=")[0]) == EVIL_ID, "still JSON, read back whole"


def test_text_that_moves_no_cursor_is_shown_as_it_is(ready_url, list_name, capsys):
    """Only what a terminal acts on or what reorders text is escaped: an ideographic or
    no-break space, an emoji's zero width joiners, a CRLF line end in a traceback are
    shown as they are (a second read: str.isprintable escaped them all, and an id
    copied from the page was no longer found). An error line quoting raw text (no
    repr) gets the same treatment as the rest."""
    from aeroqueue.cli.context import _say_error
    from aeroqueue.logs import visible

    jid = "東京\u3000支店 \U0001f468\u200d\U0001f469\u200d\U0001f467 \u00a0x"
    lists = JobLists(open_backend(ready_url))
    lists.load(list_name, [JobSpec(jid, 1)])
    shown = cli("job", "show", list_name, jid, url=ready_url)
    assert shown.exit_code == 0 and jid in shown.stdout, shown.stdout
    assert visible("Traceback\r\n  line\r\n", keep="\n") == "Traceback\n  line\n"
    _say_error("error: job a\x1b[2Jb\u202ec failed\n")
    assert capsys.readouterr().err == "error: job a\\u001b[2Jb\\u202ec failed\n"


@pytest.mark.parametrize(("source", "spec", "says"), [
    ("import aq_missing_dependency\ndef h(job):\n    return 1\n", "{m}:h",
     "cannot import '{m}' (No module named 'aq_missing_dependency')"),
    ("def h(job):\n    return 1\nLIMIT = 1 / 0\n", "{m}:h", "importing '{m}' raised ZeroDivisionError: division by zero"),
    ("def h(job):\n    return 1\n", "{m}:nope", "{m} has no function 'nope'"),
    (None, "aq_no_such_pkg.jobs:send", "cannot import 'aq_no_such_pkg.jobs' (No module named 'aq_no_such_pkg')"),
], ids=["its-import-missing", "its-import-raising", "no-such-function", "no-such-module"])
def test_a_handler_that_cannot_be_loaded_is_wrong_usage_naming_the_option_before_the_store(tmp_path, source, spec,
                                                                                          says):
    """It exited 1, as a store down does, after opening the store: a --handler that
    can never work is wrong usage (status 2), which a supervisor can tell from an
    outage. A real process, with a store that is not there: the handler comes first."""
    module = f"aq_handler_{os.urandom(4).hex()}"
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    with socket.socket() as s:  # a port nothing listens on: the store is down
        s.bind(("127.0.0.1", 0))
        down = f"aerospike://127.0.0.1:{s.getsockname()[1]}/test"
    proc = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", down, "worker", "--handler", spec.format(m=module), "--list", "L"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: Invalid value for '--handler' (env var: 'AEROQUEUE_HANDLER'): handler "
                           f"'{spec.format(m=module)}': "), line
    assert says.format(m=module) in line, line


def _console_script(tmp_path: Path) -> Path:
    """The `aeroqueue` script as pip writes it from pyproject.toml's entry point."""
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["aeroqueue"]
    module, function = entry.split(":")
    script = tmp_path / "aeroqueue"
    script.write_text(f"import sys\nfrom {module} import {function}\nif __name__ == '__main__':\n"
                      f"    sys.exit({function}())\n")
    return script


def test_ctrl_c_while_the_command_starts_is_the_one_line_exit_not_a_traceback(tmp_path):
    """A Ctrl-C in the first tenths of a second, while Python imports the command line,
    printed a KeyboardInterrupt traceback. A real process, the console script, SIGINT
    at moments spread over its start: each run ends with the one line and status 130,
    or (a signal before the interpreter ran any of the package, or after the command
    ended) as if aeroqueue had no part in it."""
    script = _console_script(tmp_path)
    package = str(ROOT / "aeroqueue")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in CLEAN:
        env.pop(k, None)
    argv = [sys.executable, str(script), "--url", f"embedded://{tmp_path}/s.db", "--create", "lists"]
    started = time.monotonic()
    subprocess.run(argv, env=env, capture_output=True, timeout=60, check=True)
    whole = time.monotonic() - started  # the store made; each run below reads it
    interrupted = []
    for i in range(1, 13):
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(whole * i / 12)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        if proc.returncode == 130:
            # After a blank line (click's), so that it starts a line after the terminal's "^C".
            assert err == "\nerror: interrupted\n", err
            interrupted.append(i)
        elif proc.returncode == -signal.SIGINT:  # in Python's own start, before the script ran
            assert package not in err, err
        else:
            assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    assert len(interrupted) >= 3, f"too few signals landed while the command ran: {interrupted}"
