"""Faults with real processes: MySQL stopped in the middle of a run (a server the
test starts, stops and restarts), and the sync's driver killed between commit
and mark. Afterwards every processed job is in MySQL exactly once and nothing
is marked that is not there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aeroqueue import udfs
from aeroqueue.backends import open_backend
from aeroqueue.errors import SyncError
from aeroqueue.sync import SyncFaults, sync_once
from tests.conftest import require
from tests.waiting import wait_for

from .helpers import (
    assert_exactly_once,
    make_jobs,
    mysql_rows,
    options,
    processed,
    root_connection,
    synced_marks,
)
from .servers import OwnMariaDB

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def own_mariadb(tmp_path_factory) -> OwnMariaDB:
    require(OwnMariaDB.available(), "mariadbd and mariadb-install-db are not installed")
    server = OwnMariaDB(tmp_path_factory.mktemp("mariadb"))
    server.install()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store(registered, spark):
    return registered


def _copied(database: str, name: str, port: int) -> set[str]:
    return {bytes(r["jid"]).decode() for r in mysql_rows(database, name, port)}


def _run_in_thread(opts, spark, store) -> tuple[threading.Thread, list[BaseException]]:
    """A sync run started in a thread, and what it raised (the run is expected to fail)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            sync_once(opts, spark, store, lease_s=5)
        except BaseException as e:  # kept for the assertion
            failure.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, failure


def test_mysql_stopped_mid_run_then_restarted(store, store_url, list_name, spark, own_mariadb, tmp_path):
    db = f"aqf_{list_name.replace('-', '_')}"
    conn = root_connection(port=own_mariadb.port)
    conn.cursor().execute(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
    conn.close()
    url = f"mysql://root@127.0.0.1:{own_mariadb.port}/{db}"
    make_jobs(store, list_name, done=200, dead=10)
    faults = SyncFaults(pause_after_commits=2, pause_dir=str(tmp_path))
    opts = options(store_url, url, partitions=2, batch_size=20, lists=(list_name,), faults=faults)
    t, failure = _run_in_thread(opts, spark, store)
    wait_for("a task paused after its commits", lambda: any(tmp_path.glob("paused-*")), 120, step_s=0.2)
    own_mariadb.stop()  # MySQL goes away between two batches
    (tmp_path / "go").touch()
    t.join(240)
    assert not t.is_alive()
    assert failure and isinstance(failure[0], SyncError), failure
    own_mariadb.start()
    # MySQL first, the marks after: a task of the failed run still copying and marking
    # now would show as marked and not copied (test_a_failed_run_returns_once_its_tasks_have_ended).
    copied = _copied(db, list_name, own_mariadb.port)
    marked = synced_marks(store, list_name, url)
    assert copied and set(marked) <= copied, "nothing is marked that MySQL did not commit"
    assert len(copied) < 210
    sync_once(options(store_url, url, partitions=2, lists=(list_name,)), spark, store, lease_s=5)
    assert_exactly_once(store, db, list_name, own_mariadb.port)
    assert set(synced_marks(store, list_name, url)) == set(processed(store, list_name))


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_failed_run_returns_once_its_tasks_have_ended(store, store_url, list_name, mysql_db, mysql_url, spark, tmp_path):
    """A Spark job fails as soon as one task has failed its last attempt; its other
    tasks run on until Spark kills them, seconds later. The run returns (and gives
    up its lease) only once they have ended: nothing of it is copied or marked
    after it failed."""
    make_jobs(store, list_name, done=200)
    # Each task's first attempt holds after its first commit; every attempt's connection
    # is killed after its first batch, so a task let go fails attempt after attempt.
    faults = SyncFaults(pause_after_commits=1, pause_dir=str(tmp_path), kill_after_batches=1)
    opts = options(store_url, mysql_url, partitions=2, batch_size=10, lists=(list_name,), faults=faults)
    t, failure = _run_in_thread(opts, spark, store)
    wait_for("both tasks held after their first commit", lambda: len(list(tmp_path.glob("paused-*"))) == 2, 120,
             step_s=0.2)
    failing, held = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("paused-*"))
    (tmp_path / f"go-{failing}").touch()
    t.join(240)
    assert not t.is_alive()
    assert failure and isinstance(failure[0], SyncError), failure
    assert not _running(held), "the run returned while one of its tasks still ran"
    copied = {bytes(r["jid"]).decode() for r in mysql_rows(mysql_db, list_name)}
    marked = synced_marks(store, list_name, mysql_url)
    (tmp_path / "go").touch()  # a task still held would go on now
    time.sleep(1)
    assert {bytes(r["jid"]).decode() for r in mysql_rows(mysql_db, list_name)} == copied, "copied after the run"
    assert synced_marks(store, list_name, mysql_url) == marked, "marked after the run"
    assert set(marked) <= copied


def test_waiting_for_the_tasks_of_a_run_whose_context_stopped_returns_at_once():
    """The context stopped under the run (another thread, Ctrl-C's `finally`), or its JVM
    gone: there are no tasks left to wait for, and the run's own error is the one to
    say. Asking for the status tracker raised, and that error replaced the run's."""
    from types import SimpleNamespace

    from aeroqueue.sync.job import _await_tasks

    asked: list[str] = []

    def stopped() -> None:
        asked.append("statusTracker")
        raise AttributeError("'NoneType' object has no attribute 'statusTracker'")  # `sc._jsc` is None

    _await_tasks(SimpleNamespace(statusTracker=stopped), "aeroqueue-sync-x")
    assert asked == ["statusTracker"], "it asked again: it waited on a context that had stopped"


@pytest.fixture
def real_store(real_url, spark):
    """The real server only: the driver's death is the Spark driver's business,
    whatever the store, and each run of this test starts a driver and its JVM; the
    store's side of a commit without its mark runs on both backends in
    test_sync.py (test_task_dying_between_commit_and_mark_is_retried_harmlessly)."""
    backend = open_backend(real_url)
    udfs.register(backend)
    yield backend
    backend.close()


def test_the_driver_killed_between_commit_and_mark(real_store, real_url, list_name, mysql_db, mysql_url, spark, tmp_path,
                                                   java):
    store, store_url = real_store, real_url
    make_jobs(store, list_name, done=90, dead=6)
    args = {"store": store_url, "target": mysql_url, "master": "local[2]", "partitions": 2, "batch": 15,
            "lists": [list_name], "pause_dir": str(tmp_path), "lease_s": 2.0}
    stderr = tmp_path / "driver.err"
    with open(stderr, "w") as err:
        driver = subprocess.Popen([sys.executable, str(HERE / "run_driver.py"), json.dumps(args)],
                                  env={**os.environ, "PYSPARK_PYTHON": sys.executable}, start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for("a task paused after its commit", lambda: any(tmp_path.glob("paused-*")), 180, step_s=0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
        driver.wait()
    # Without --verbose, Spark's own logging is down to errors from the JVM's first line on.
    said = [line for line in stderr.read_text().splitlines() if line.strip() and "incubator modules" not in line]
    assert said == [], "Spark said more than errors"
    copied = {bytes(r["jid"]).decode() for r in mysql_rows(mysql_db, list_name)}
    marked = synced_marks(store, list_name, mysql_url)
    assert copied, "the paused task had committed"
    assert set(marked) < copied, "committed and never marked: the next run copies it again"
    # The dead driver's lease runs out (2 s by the server's clock); the next run completes the copy.
    time.sleep(2.5)
    report = sync_once(options(store_url, mysql_url, lists=(list_name,)), spark, store)
    assert report.counts.copied >= len(processed(store, list_name)) - len(marked)
    assert_exactly_once(store, mysql_db, list_name)
    assert set(synced_marks(store, list_name, mysql_url)) == set(processed(store, list_name))
