"""`aeroqueue sync` as people run it: the target's choice, marks per target,
--resync, rejects that fail the run, one JSON line, progress."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mysql.connector
import pytest
from click.testing import CliRunner

from aeroqueue import keys
from aeroqueue.backends import Backend
from aeroqueue.cli import main
from aeroqueue.config import parse_url
from aeroqueue.sync import Lease, parse_target, remember_demo_target, run_sync, sync_once
from aeroqueue.sync.job import DAEMON_MODULE
from aeroqueue.sync.scan import to_copy
from tests.waiting import wait_for

from .conftest import DB_PREFIX
from .helpers import (
    assert_exactly_once,
    make_jobs,
    marked_anywhere,
    mysql_query,
    mysql_rows,
    options,
    processed,
    root_connection,
    synced_marks,
)
from .servers import TcpProxy


def _kill_group_if_running(proc: subprocess.Popen) -> None:
    """A test's `sync` still running when it ends (an assertion failed first): its
    whole process group (the JVM too) killed, and waited for."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def store(registered, spark):
    return registered


@pytest.fixture
def second_db(mysql_available):
    name = f"{DB_PREFIX}{uuid.uuid4().hex[:12]}"
    conn = root_connection()
    conn.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    yield name
    conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
    conn.close()


def _sync(store_url: str, *args: str):
    return CliRunner().invoke(main, ["--url", store_url, "sync", "--partitions", "4", *args])


def test_without_a_target_it_says_what_it_would_copy_and_copies_nothing(store, store_url, list_name):
    make_jobs(store, list_name, done=6, dead=2, queued=1)
    out = _sync(store_url, "--list", list_name)
    assert out.exit_code == 1
    assert "no sync target given: a run would copy up to 8 processed job(s) (6 done, 2 dead) of 1 list(s)" in out.output
    assert "--mysql mysql://user@host:3306/db" in out.output
    assert marked_anywhere(store, list_name) == set()


def test_the_demo_store_syncs_where_the_demo_did(store, store_url, list_name, mysql_db, mysql_url):
    if not store.is_embedded:
        pytest.skip("the demo's store is an embedded one")
    remember_demo_target(parse_url(store_url), mysql_url)
    make_jobs(store, list_name, done=5)
    out = _sync(store_url, "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output.strip().splitlines()[-1])["copied"] == 5
    assert_exactly_once(store, mysql_db, list_name)


def test_marks_are_per_target(store, store_url, list_name, mysql_db, mysql_url, second_db, spark):
    make_jobs(store, list_name, done=20, dead=3)
    sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    other_url = f"mysql://root@127.0.0.1:3306/{second_db}"
    assert synced_marks(store, list_name, other_url) == {}, "synced to one database, still unsynced for another"
    again = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert again.counts.copied == 0, "nothing new for the first"
    there = sync_once(options(store_url, other_url, lists=(list_name,)), spark, store)
    assert there.counts.copied == 23
    assert_exactly_once(store, second_db, list_name)
    assert set(synced_marks(store, list_name, mysql_url)) == set(synced_marks(store, list_name, other_url)) \
        == set(processed(store, list_name))


def test_the_filter_of_a_resync_of_everything_is_one_the_server_takes(store, list_name, store_url, mysql_url):
    """`sync --resync` with no --list or --since filtered with an And of one operand,
    which the server refuses (code 4): the run failed on a server, not embedded."""
    make_jobs(store, list_name, done=1)
    opts = options(store_url, mysql_url, resync=True)
    assert not opts.lists and opts.since_ms is None
    _, _, bins = store.client.get(store.key(keys.JOB_SET, f"{list_name}/0"), {"expressions": to_copy(opts)})
    assert bins["state"] == "done"


def test_resync_copies_again_what_the_target_has(store, store_url, list_name, mysql_db, mysql_url, spark):
    other = list_name + "-o"
    make_jobs(store, list_name, done=10, dead=2)
    make_jobs(store, other, done=4)
    sync_once(options(store_url, mysql_url, lists=(list_name, other)), spark, store)
    # Someone emptied the list's rows in MySQL: a plain sync does not see it, a resync repairs it.
    conn = root_connection(mysql_db)
    conn.cursor().execute("DELETE FROM aq_jobs WHERE list IN (%s, %s)", (list_name, other))
    conn.commit()
    conn.close()
    assert sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store).counts.copied == 0
    future = _sync(store_url, "--mysql", mysql_url, "--resync", "--list", list_name, "--since", "2999-01-01", "--json")
    assert future.exit_code == 0, future.output
    assert json.loads(future.output.strip().splitlines()[-1])["copied"] == 0
    out = _sync(store_url, "--mysql", mysql_url, "--resync", "--list", list_name, "--since", "1h", "--json")
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    got = json.loads(lines[-1])
    assert got["resync"] is True and got["copied"] == 12 and got["rejected"] == 0
    assert_exactly_once(store, mysql_db, list_name)
    assert mysql_rows(mysql_db, other) == [], "only the list asked for"
    twice = _sync(store_url, "--mysql", mysql_url, "--resync", "--list", list_name, "--json")
    assert twice.exit_code == 0 and json.loads(twice.output.strip().splitlines()[-1])["copied"] == 12
    assert_exactly_once(store, mysql_db, list_name)
    assert _sync(store_url, "--mysql", mysql_url, "--list", "no-such-list").output.count("no such job list") == 1


def test_a_run_with_rejects_exits_non_zero_naming_the_table(store, store_url, list_name, mysql_db, mysql_url):
    make_jobs(store, list_name, done=6)
    for token in (1, 4):
        store.put(keys.JOB_SET, keys.job_name(list_name, token), {"result": bytearray(b"\x01")})
    out = _sync(store_url, "--mysql", mysql_url, "--list", list_name, "--json")
    assert out.exit_code == 1
    lines = [line for line in out.output.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and json.loads(lines[0])["rejected"] == 2 and json.loads(lines[0])["copied"] == 4
    assert f"error: 2 job(s) could not be copied: their reasons are in table sync_rejects of mysql://root@127.0.0.1:3306/{mysql_db}" in out.output
    assert len(mysql_query(mysql_db, "SELECT * FROM sync_rejects WHERE list = %s", (list_name,))) == 2


def test_progress_reports_rows_copied_per_list(store, store_url, list_name, mysql_url, spark):
    other = list_name + "-p"
    make_jobs(store, list_name, done=30, dead=3)
    make_jobs(store, other, done=7)
    seen: list[dict[str, int]] = []
    report = run_sync(options(store_url, mysql_url, lists=(list_name, other), batch_size=5), spark, store, seen.append)
    assert report.counts.copied == 40
    assert seen and seen[-1] == {list_name: 33, other: 7}, "the last reading, after the run, is the whole"
    assert all(s.get(list_name, 0) <= 33 for s in seen)
    if store.is_embedded:  # on a shared server, a driver another test killed may have left its own
        assert list(store.scan(keys.SYNC_SET)) == [], "progress records are removed"


def _spark_only(registered: Backend) -> None:
    """A test of the command, its JVM and signals: the same whatever the store, and each
    costs a JVM's start (half a minute on a loaded machine), so it runs on one store."""
    if not registered.is_embedded:
        pytest.skip("signals and the JVM: the same on every store (run on the embedded one)")


# A task's Python daemon, as the JVM starts it (`python -m MODULE`): the JVM's own
# command line names the module too (--conf spark.python.daemon.module=...).
DAEMON = b"-m\0" + DAEMON_MODULE.encode() + b"\0"


def _await_in_group(proc: subprocess.Popen, needle: bytes, what: str, timeout_s: float) -> None:
    """Wait until a process with `needle` in its command line runs in `proc`'s group
    (`what` names it); fail if `proc` ended first."""
    wait_for(f"{what} running", lambda: proc.poll() is not None or _group_runs(proc.pid, needle), timeout_s,
             step_s=0.02)
    assert proc.poll() is None, f"the command ended (status {proc.returncode}) before it could be interrupted"


def _group_pids(pgid: int, needle: bytes) -> list[int]:
    """The processes of group `pgid` with `needle` in their command line."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) == pgid and needle in (stat.parent / "cmdline").read_bytes():
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _group_runs(pgid: int, needle: bytes) -> bool:
    """Whether a process of group `pgid` has `needle` in its command line."""
    return bool(_group_pids(pgid, needle))


def _sync_process(store_url: str, mysql_url: str, list_name: str, **popen: Any) -> subprocess.Popen:
    """`aeroqueue sync` of one list to MySQL in a process group of its own (as a
    terminal's job is), in small batches, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", mysql_url, "--list", list_name,
         "--partitions", "4", "--batch-size", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen,
    )


def _stderr_after(proc: subprocess.Popen, act: Callable[[], None], timeout_s: float) -> str:
    """`act()` on the running command, then its stderr once it ended; its process
    group is killed if it did not (or `act` failed)."""
    try:
        act()
        _, err = proc.communicate(timeout=timeout_s)
    finally:
        _kill_group_if_running(proc)
    return err


@pytest.mark.parametrize("how", ["group", "jvm ends first"])
def test_ctrl_c_during_a_run_ends_it_with_one_line_and_a_rerun_copies_each_job_once(
    registered, java, store_url, list_name, mysql_db, mysql_url, how
):
    """Ctrl-C reaches the whole process group (the terminal's doing): the command, its
    JVM and the Python workers of its tasks. PySpark's own SIGINT handler called the
    JVM from inside the handler while the main thread was in a call on the same
    socket: a run interrupted mid-task printed 'reentrant call' tracebacks.

    "jvm ends first": the JVM, which Ctrl-C ends too, is gone before the command is
    done with it: py4j's handling of the interrupt asks it to close the call's socket,
    and the command stops the Spark context. Each failed ("Answer from Java side is
    empty", "Connection refused") in place of the interrupt: status 1 (seen in a full
    test run). The JVM is stopped for the interrupt and killed after it, so that this
    order is certain."""
    if how != "group":
        _spark_only(registered)
    make_jobs(registered, list_name, done=3000)
    proc = _sync_process(store_url, mysql_url, list_name)
    try:
        _await_in_group(proc, DAEMON, "a task of the run", 120)
        if how == "group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            [jvm] = _group_pids(proc.pid, b"org.apache.spark.deploy.SparkSubmit")
            os.kill(jvm, signal.SIGSTOP)
            os.kill(proc.pid, signal.SIGINT)
            time.sleep(1.0)  # py4j's handling of it now waits on the stopped JVM
            os.kill(jvm, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        _kill_group_if_running(proc)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "reentrant" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1] == "error: interrupted", err[-3000:]
    again = _sync(store_url, "--mysql", mysql_url, "--list", list_name, "--json")
    assert again.exit_code == 0, again.output
    assert_exactly_once(registered, mysql_db, list_name)


def test_ctrl_c_while_the_jvm_starts_leaves_no_jvm_behind(registered, java, store_url, list_name, mysql_url):
    """Ctrl-C a moment after the command started its JVM, before the JVM answered: the
    command ended (130), and the JVM, which ignores SIGINT and SIGTERM and never got
    to read its stdin, lived on orphaned, holding the terminal's output."""
    _spark_only(registered)
    make_jobs(registered, list_name, done=30)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", mysql_url, "--list", list_name],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    jvm = b"org.apache.spark.deploy.SparkSubmit"
    try:
        _await_in_group(proc, jvm, "the JVM", 60)
        time.sleep(0.3)  # it takes seconds to answer
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(30) == 130
        wait_for("the JVM gone with the command", lambda: not _group_runs(proc.pid, jvm), 10, step_s=0.1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _sockets(pid: int, state: str) -> list[tuple[int, int]]:
    """(local port, remote port) of process `pid`'s TCP sockets in `state` ("0A"
    listening, "01" established), from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = row.split()
                if fields[3] == state and fields[9] in inodes:
                    found.append((int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
    return found


def _driver_connected_to_its_jvm(proc: subprocess.Popen) -> bool:
    """Whether the command holds a connection to a port its JVM listens on (the py4j
    gateway's: the JVM answered, and the Spark context starts)."""
    jvms = _group_pids(proc.pid, b"org.apache.spark.deploy.SparkSubmit")
    with contextlib.suppress(OSError):
        listening = {local for jvm in jvms for local, _ in _sockets(jvm, "0A")}
        return any(remote in listening for _, remote in _sockets(proc.pid, "01"))
    return False


def test_ctrl_c_while_the_spark_context_starts_ends_with_one_line(registered, java, store_url, list_name, mysql_url):
    """Ctrl-C once the JVM answered, while the Spark context starts (a second or so):
    py4j reports the call it cut short with `logging.exception` on the root logger,
    which had no handler yet, so the command printed that report and its traceback
    before "error: interrupted"; and PySpark's own handler, installed at the end of
    the context's start, could run instead of ours ('reentrant call'). The moment: the
    command connected to a port its JVM listens on (the gateway), and 0.3 s more."""
    _spark_only(registered)
    make_jobs(registered, list_name, done=30)
    proc = _sync_process(store_url, mysql_url, list_name)

    def interrupt() -> None:
        wait_for("the driver connected to its JVM",
                 lambda: proc.poll() is not None or _driver_connected_to_its_jvm(proc), 60, step_s=0.01)
        assert proc.poll() is None, "the command ended before it could be interrupted"
        time.sleep(0.3)  # into the start's py4j calls (it takes a second or so)
        os.killpg(proc.pid, signal.SIGINT)

    err = _stderr_after(proc, interrupt, 60)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "reentrant" not in err and "ERROR:" not in err, err[-3000:]
    assert err.rstrip().splitlines()[-1] == "error: interrupted", err[-3000:]


def test_a_stop_cancels_jobs_the_run_starts_after_it_too():
    """A stop that lands while a run sets up (its target's schema checked, before its
    Spark job starts) finds no job to cancel: one cancel then let the run copy
    everything, however long. Jobs are cancelled again until the block ends."""
    from types import SimpleNamespace

    from aeroqueue.cli.sync_cmd import _cancelled_on
    from aeroqueue.stopping import Stop

    cancels: list[float] = []
    spark = SimpleNamespace(sparkContext=SimpleNamespace(
        cancelAllJobs=lambda: cancels.append(time.monotonic()), setLogLevel=lambda level: None))
    stop = Stop(tick_s=0.05)
    stop.set()
    with _cancelled_on(stop, spark, quiet=True):  # type: ignore[arg-type]
        time.sleep(1.5)  # the run: its job starts after the first cancel
    assert len(cancels) >= 2, cancels
    after = len(cancels)
    time.sleep(0.7)
    assert len(cancels) == after, "nothing is cancelled once the block has ended"


def test_a_sync_commands_log_lines_print_once_in_the_usual_format():
    """`sync` logs its info lines through the handler every command gets: a handler of
    its own beside it printed each warning and error twice (ERROR ..., error ...)."""
    code = (
        "import logging\n"
        "from aeroqueue.logs import command_info, default_command_logging\n"
        "default_command_logging()  # what the command line does first\n"
        "command_info('aeroqueue.sync')  # what `sync` does\n"
        "log = logging.getLogger('aeroqueue.sync')\n"
        "log.error('1 job(s) could not be copied')\n"
        "log.info('schema migrated')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert [line.split(" ", 3)[2:] for line in lines] == [
        ["error", "1 job(s) could not be copied"], ["info", "schema migrated"]], out.stderr


@pytest.mark.parametrize("schedule", ["every", "once"])
def test_sigterm_to_the_whole_group_stops_a_sync_cleanly_and_a_rerun_copies_each_job_once(
    registered, java, store_url, list_name, mysql_db, mysql_url, schedule
):
    """A service manager stops `sync --every` with SIGTERM to all its processes at
    once (systemd's KillMode=control-group): the command, its JVM and the Python
    workers of its tasks. The JVM ran its shutdown hooks under the running job: the
    run failed, logged as a failure with Spark's stacks and a traceback of PySpark's
    accumulator server. It now ignores SIGTERM, the command cancels the run, stops
    Spark, releases its lease and exits 0. (Between runs it always did: a stop while
    the schedule sleeps is tested with `Scheduler`.) A single run (a cron job, a
    job runner's deadline) was killed by the signal (status -15) with its lease left
    held until the TTL ran out, refusing the next run meanwhile: it now ends the
    same way, with one line and status 143, as it did not do its work."""
    _spark_only(registered)
    make_jobs(registered, list_name, done=3000)
    every = ["--every", "1s"] if schedule == "every" else ["--lease", "10m"]  # a lease left held would show
    proc = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", mysql_url, "--list", list_name,
         "--partitions", "4", "--batch-size", "10", "--json", *every],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    reported = threading.Event()
    out: list[str] = []

    def read_stdout() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            out.append(line)
            reported.set()

    reader = threading.Thread(target=read_stdout, daemon=True)
    reader.start()
    try:
        _await_in_group(proc, DAEMON, "a task of the first run", 120)
        assert not reported.is_set(), "the first run ended before its tasks were seen"
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.stderr.read()  # type: ignore[union-attr]
        proc.wait(timeout=120)
        reader.join(10)
    finally:
        _kill_group_if_running(proc)
    if schedule == "every":
        assert proc.returncode == 0, err[-3000:]
    else:
        assert proc.returncode == 143, err[-3000:]
        assert err.rstrip().splitlines()[-1].startswith("error: sync stopped by SIGTERM"), err[-3000:]
        assert not out, "a run cut short reports nothing"
    for noise in ("Traceback", "Exception", " ERROR ", "sync run failed", "EOFError"):
        assert noise not in err, err[-3000:]
    assert registered.get(keys.LOCK_SET, parse_target(mysql_url).lease_name) is None, "the lease is released"
    again = _sync(store_url, "--mysql", mysql_url, "--list", list_name, "--json")
    assert again.exit_code == 0, again.output
    assert_exactly_once(registered, mysql_db, list_name)


def test_sigterm_to_the_group_while_the_jvm_starts_stops_the_schedule_with_status_0(
    registered, java, store_url, list_name, mysql_url
):
    """The SIGTERM handler came only after the JVM's start-up (seconds): a service
    stopped then ended killed by the signal (status -15). Now the handler is there
    before the JVM starts; the JVM, which ignores SIGTERM, finishes starting, and
    the command stops it with no run (or ends the run just begun)."""
    _spark_only(registered)
    make_jobs(registered, list_name, done=10)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", mysql_url, "--list", list_name,
         "--partitions", "4", "--json", "--every", "1h"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )

    def stop() -> None:
        _await_in_group(proc, b"org.apache.spark.deploy.SparkSubmit", "the JVM", 120)
        os.killpg(proc.pid, signal.SIGTERM)

    err = _stderr_after(proc, stop, 120)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and " ERROR " not in err, err[-3000:]
    assert registered.get(keys.LOCK_SET, parse_target(mysql_url).lease_name) is None, "no lease left held"


@pytest.fixture
def mysql_proxy(mysql_available) -> Iterator[TcpProxy]:
    """The machine's MySQL behind a proxy process of the test's own: killed, it is a
    database gone in the middle of a run, and it comes back on the same port."""
    proxy = TcpProxy(3306)
    proxy.start()
    yield proxy
    proxy.kill()


def _rows_copied(database: str, name: str) -> int:
    """The list's rows in the database (read past the proxy); 0 before its table exists."""
    try:
        return len(mysql_rows(database, name))
    except mysql.connector.Error:
        return 0


def _read_lines(stream: Any) -> tuple[list[str], threading.Thread]:
    """A stream's lines as they come, read by a thread of their own."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True)
    reader.start()
    return lines, reader


def _assert_one_clean_line(err: str, password: str) -> str:
    """No traceback, no Spark report or stack, no password: the error's one line, returned."""
    for noise in ("Traceback", "Exception", " ERROR ", "\tat ", "py4j", "Py4J"):
        assert noise not in err, err[-3000:]
    assert password not in err, "the password shown"
    last = err.rstrip().splitlines()[-1]
    assert last.startswith("error: "), err[-3000:]
    return last


def _kill_jvm(proc: subprocess.Popen) -> None:
    [jvm] = _group_pids(proc.pid, b"org.apache.spark.deploy.SparkSubmit")
    os.kill(jvm, signal.SIGKILL)


def test_mysql_or_the_jvm_killed_under_a_single_sync_ends_it_with_one_line(
    registered, java, store_url, list_name, mysql_db, mysql_user, mysql_proxy
):
    """The target's server gone in the middle of a run: Spark reported the failed
    task at ERROR, with the task's Python traceback inside a Java stack, dozens of
    lines before the command's own. The Spark driver's JVM killed under a run: the
    command said "the Spark job failed: [Errno 111] Connection refused", nothing of
    the JVM. Each now ends with one line naming what failed (the target without its
    password, the Spark driver), status 1 and the lease released; a rerun copies each
    job once."""
    user, password = mysql_user
    url = f"mysql://{user}:{password}@127.0.0.1:{mysql_proxy.port}/{mysql_db}"
    shown = f"mysql://{user}:***@127.0.0.1:{mysql_proxy.port}/{mysql_db}"
    make_jobs(registered, list_name, done=3000)
    lease = parse_target(url).lease_name

    def run_and(kill: Callable[[subprocess.Popen], None]) -> str:
        proc = _sync_process(store_url, url, list_name)
        before = _rows_copied(mysql_db, list_name)

        def act() -> None:
            _await_in_group(proc, DAEMON, "a task of the run", 120)
            wait_for("rows committed by the run", lambda: proc.poll() is not None
                     or _rows_copied(mysql_db, list_name) > before, 60, step_s=0.05)
            assert proc.poll() is None, "the run ended before it could be cut short"
            kill(proc)

        err = _stderr_after(proc, act, 120)
        assert proc.returncode == 1, err[-3000:]
        assert registered.get(keys.LOCK_SET, lease) is None, "the lease is released"
        return _assert_one_clean_line(err, password)

    line = run_and(lambda proc: mysql_proxy.kill())
    assert shown in line and ("failed while writing" in line or "cannot connect" in line), line
    mysql_proxy.start()
    line = run_and(_kill_jvm)
    assert line.startswith("error: the Spark driver (its JVM, pid ") and "ended during the run, killed by SIGKILL" in line
    assert len(processed(registered, list_name)) > _rows_copied(mysql_db, list_name), "both runs were cut short"
    again = _sync(store_url, "--mysql", url, "--list", list_name, "--json")
    assert again.exit_code == 0, again.output
    assert_exactly_once(registered, mysql_db, list_name)
    assert set(synced_marks(registered, list_name, url)) == set(processed(registered, list_name))


def test_mysql_then_the_jvm_killed_under_a_sync_every(
    registered, java, store_url, list_name, mysql_db, mysql_user, mysql_proxy
):
    """On a schedule, the target's server gone mid-run fails that run (one line, no
    Spark report or stack), and once it is back the next run copies the rest. The
    Spark driver's JVM killed: every later run failed the same way ("the Spark job
    failed: [Errno 111] Connection refused"), for as long as the service ran, exiting
    0 when stopped. Now the schedule ends there: one line naming the Spark driver,
    status 1, the lease released."""
    user, password = mysql_user
    url = f"mysql://{user}:{password}@127.0.0.1:{mysql_proxy.port}/{mysql_db}"
    shown = f"mysql://{user}:***@127.0.0.1:{mysql_proxy.port}/{mysql_db}"
    make_jobs(registered, list_name, done=3000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", url, "--list", list_name,
         "--partitions", "4", "--batch-size", "10", "--json", "--every", "1s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    out, _ = _read_lines(proc.stdout)
    errs, err_reader = _read_lines(proc.stderr)
    try:
        _await_in_group(proc, DAEMON, "a task of the first run", 120)
        wait_for("rows committed by the first run", lambda: _rows_copied(mysql_db, list_name) > 0, 60)
        assert not out, "the first run ended before it could be cut short"
        mysql_proxy.kill()
        wait_for("the failed run said", lambda: any("sync run failed" in line for line in errs), 60)
        mysql_proxy.start()
        wait_for("a run after the failed one", lambda: proc.poll() is not None or out, 120)
        assert proc.poll() is None, "".join(errs)[-3000:]
        _kill_jvm(proc)
        proc.wait(60)
        err_reader.join(10)
    finally:
        _kill_group_if_running(proc)
    err = "".join(errs)
    assert proc.returncode == 1, err[-3000:]
    last = _assert_one_clean_line(err, password)
    assert last.startswith("error: the Spark driver (its JVM, pid ") and "killed by SIGKILL" in last, err[-3000:]
    failed = [line for line in errs if "sync run failed" in line]
    assert failed and all(shown in line for line in failed), err[-3000:]
    assert registered.get(keys.LOCK_SET, parse_target(url).lease_name) is None, "the lease is released"
    assert json.loads(out[0])["copied"] > 0
    assert_exactly_once(registered, mysql_db, list_name)
    assert set(synced_marks(registered, list_name, url)) == set(processed(registered, list_name))


# `python -m aeroqueue`, with PySpark's accumulator server taking 30 s to shut down
# (its real wait: up to 1.5 s, see `stop_spark`): a command that waits for it shows.
_SLOW_ACCUMULATORS = (
    "import time\n"
    "import pyspark.accumulators as a\n"
    "for cls in (a.AccumulatorTCPServer, getattr(a, 'AccumulatorUnixServer', None)):\n"
    "    if cls is not None:\n"
    "        cls.shutdown = lambda self, real=cls.shutdown: (time.sleep(30), real(self))[1]\n"
    "from aeroqueue.cli import main\n"
    "main()\n"
)


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_sigterm_ends_a_sync_every_and_its_jvm_promptly(registered, java, store_url, list_name, mysql_db, mysql_url):
    """A SIGTERM'd `sync --every` kept its JVM up about 2 s: stopping the Spark
    session waited for PySpark's accumulator server, whose thread serves the JVM's
    connection (open once a task has ended) and looks for the shutdown once a second,
    the JVM up until the command ended. Here that server takes 30 s to shut down: the
    command and its JVM end well before, the run under way cancelled, each job in
    MySQL once (every run of --resync copies them all again) and its lease released."""
    make_jobs(registered, list_name, done=3000)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_ACCUMULATORS, "--url", store_url, "sync", "--mysql", mysql_url, "--list",
         list_name, "--partitions", "4", "--batch-size", "10", "--json", "--resync", "--every", "1s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    out, _ = _read_lines(proc.stdout)
    errs, err_reader = _read_lines(proc.stderr)
    try:
        wait_for("the first run's report", lambda: proc.poll() is not None or out, 180)
        assert proc.poll() is None, "".join(errs)[-3000:]
        time.sleep(1.0)  # into the second run (the first took more than its 1 s)
        [jvm] = _group_pids(proc.pid, b"org.apache.spark.deploy.SparkSubmit")
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
        wait_for("the JVM ended", lambda: not _alive(jvm), 60, step_s=0.02)
        took = time.monotonic() - signalled
        err_reader.join(10)
    finally:
        _kill_group_if_running(proc)
    err = "".join(errs)
    assert proc.returncode == 0, err[-3000:]
    assert took < 15, f"the JVM ended {took:.1f} s after SIGTERM"
    for noise in ("Traceback", "Exception", " ERROR ", "sync run failed"):
        assert noise not in err, err[-3000:]
    assert registered.get(keys.LOCK_SET, parse_target(mysql_url).lease_name) is None, "the lease is released"
    assert_exactly_once(registered, mysql_db, list_name)


@pytest.fixture
def no_jvm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose JAVA_HOME's `java` only leaves a file behind (and fails):
    whether a command started its JVM, seen without the seconds one takes."""
    home = tmp_path / "java-home"
    (home / "bin").mkdir(parents=True)
    started = tmp_path / "jvm-started"
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\ntouch '{started}'\nexit 1\n")
    java.chmod(0o755)
    return {**os.environ, "JAVA_HOME": str(home)}, started


@pytest.mark.parametrize("schedule", ["once", "every"])
def test_a_sync_another_holds_the_lease_for_starts_no_jvm(registered, store_url, list_name, mysql_url, no_jvm,
                                                          schedule):
    """A sync killed outright leaves its lease held until it runs out, and the next
    run started its JVM (seconds of CPU) before it looked at the lease, to be refused
    only then; a second scheduler started one to stand by with. The lease comes
    first now: a single run is refused at once, a scheduler stands by, and neither
    starts a JVM (which would leave `no_jvm`'s file)."""
    make_jobs(registered, list_name, done=3)
    holder = Lease(registered, parse_target(mysql_url).lease_name, ttl_s=30)
    assert holder.acquire()
    env, jvm_started = no_jvm
    command = [sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", mysql_url, "--list", list_name]
    try:
        if schedule == "once":
            out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
            assert out.returncode == 1, out.stderr[-3000:]
            last = out.stderr.rstrip().splitlines()[-1]
            assert last.startswith(f"error: another sync to {mysql_url} is running"), out.stderr[-3000:]
            assert f"pid {os.getpid()}" in last and "Traceback" not in out.stderr
        else:
            proc = subprocess.Popen([*command, "--every", "1s"], env=env, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            try:
                for line in proc.stderr:  # type: ignore[union-attr]
                    if "standing by" in line:
                        break
                assert proc.poll() is None, f"the scheduler ended (status {proc.returncode}) instead of standing by"
                time.sleep(1.5)  # it looks at the lease again every second
                assert not jvm_started.exists(), "a scheduler on standby started a JVM"
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0
            finally:
                _kill_group_if_running(proc)
        assert not jvm_started.exists(), "a JVM was started for a run the lease refused"
    finally:
        holder.release()
    assert marked_anywhere(registered, list_name) == set()


@pytest.mark.parametrize("schedule", ["once", "every"])
def test_a_jvm_that_ends_as_it_starts_is_said_in_one_line(registered, store_url, list_name, mysql_url, no_jvm,
                                                         schedule):
    """Spark's JVM gone before it answered (killed, no Java, a wrong option): the
    command said "internal error, PySparkRuntimeError: [JAVA_GATEWAY_EXITED] ...
    please report it". Now it names the Spark driver and how it ended; a schedule
    ends there, as no later run could start one either."""
    make_jobs(registered, list_name, done=1)
    env, jvm_started = no_jvm
    every = ["--every", "1s"] if schedule == "every" else []
    out = subprocess.run([sys.executable, "-m", "aeroqueue", "--url", store_url, "sync", "--mysql", mysql_url,
                          "--list", list_name, *every], env=env, capture_output=True, text=True, timeout=120)
    assert jvm_started.exists()
    assert out.returncode == 1, out.stderr[-3000:]
    last = out.stderr.rstrip().splitlines()[-1]
    assert last.startswith("error: the Spark driver (its JVM, pid ") and "ended as it started, with exit status" in last, \
        out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert registered.get(keys.LOCK_SET, parse_target(mysql_url).lease_name) is None


@pytest.mark.parametrize("schedule", ["once", "every"])
def test_without_pyspark_a_sync_says_so_at_once(registered, store_url, list_name, mysql_url, schedule):
    """A schedule starts Spark at its first run, once it holds the lease: a failure
    there is a failed run, logged, and tried again at the next. PySpark missing is
    said before, and ends the command."""
    make_jobs(registered, list_name, done=1)
    hide = "import sys\nsys.modules['pyspark'] = None\nfrom aeroqueue.cli import main\nmain()\n"
    every = ["--every", "1s"] if schedule == "every" else []
    out = subprocess.run([sys.executable, "-c", hide, "--url", store_url, "sync", "--mysql", mysql_url, "--list",
                          list_name, *every], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.rstrip().splitlines()[-1] == (
        "error: PySpark is not installed: pip install 'aeroqueue[spark]' (and Java 17 for Spark)")
    assert registered.get(keys.LOCK_SET, parse_target(mysql_url).lease_name) is None


def test_a_sync_started_with_sigint_ignored_runs_through_sigints(
    registered, java, store_url, list_name, mysql_db, mysql_url
):
    """A sync started with SIGINT ignored (a background job of a script) keeps it
    ignored, as Python does at start-up: it ignored it while its JVM started, then the
    Spark context installed a handler and a SIGINT stopped the run (130). SIGINT is
    sent to the command every 0.2 s from its JVM's start to its end: the run copies
    every job and exits 0."""
    _spark_only(registered)
    make_jobs(registered, list_name, done=300)
    proc = _sync_process(store_url, mysql_url, list_name, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    sent = 0
    try:
        _await_in_group(proc, b"org.apache.spark.deploy.SparkSubmit", "the JVM", 60)
        give_up = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < give_up:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
                sent += 1
            time.sleep(0.2)
        _, err = proc.communicate(timeout=30)
    finally:
        _kill_group_if_running(proc)
    assert proc.returncode == 0, err[-3000:]
    assert sent >= 5, f"{sent} SIGINTs: the run ended before they could span it"
    assert_exactly_once(registered, mysql_db, list_name)
