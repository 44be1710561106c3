"""The sync unchanged on a Spark standalone cluster: a master and a worker from the
installed pyspark on 127.0.0.1, the job file submitted with spark-submit, and an
executor killed in the middle of its tasks."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aeroqueue import udfs
from aeroqueue.backends import open_backend
from tests.conftest import require
from tests.waiting import wait_for

from .helpers import assert_exactly_once, make_jobs, processed, synced_marks
from .servers import SparkCluster, spark_home

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> SparkCluster:
    require(shutil.which("java") is not None, "Java is not installed (Spark needs Java 17)")
    c = SparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.start()
    except BaseException:
        c.stop()
        raise
    yield c
    c.stop()


def _env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1"}


@pytest.fixture
def real_store(real_url):
    """The real server only: how Spark deploys and retries is Spark's business,
    whatever the store; one run of these slow tests is enough (the store paths run
    on both backends in local mode, test_sync.py and test_sync_faults.py)."""
    backend = open_backend(real_url)
    udfs.register(backend)
    yield backend
    backend.close()


def test_spark_submit_to_a_standalone_cluster(real_store, real_url, cluster, list_name, mysql_db, mysql_user):
    """The job file submitted as a user would, to a master and a worker, with a
    password in the URL and Spark at its most talkative (--verbose): the rows land,
    the marks follow, and the password shows nowhere in the output."""
    registered, store_url = real_store, real_url
    user, password = mysql_user
    make_jobs(registered, list_name, done=60, dead=4, queued=5)
    mysql_url = f"mysql://{user}:{password}@127.0.0.1:3306/{mysql_db}"
    out = subprocess.run(
        [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url, str(ROOT / "sync" / "aeroqueue_sync.py"),
         "--verbose", "--url", store_url, "sync", "--mysql", mysql_url, "--list", list_name, "--partitions", "4",
         "--json"],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:].replace(password, "***")
    assert password not in out.stdout + out.stderr, "the password showed in the output"
    got = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert got["copied"] == 64 and got["tasks"] == 4 and got["rejected"] == 0
    assert_exactly_once(registered, mysql_db, list_name)
    assert set(synced_marks(registered, list_name, mysql_url)) == set(processed(registered, list_name))
    apps = cluster.state().get("completedapps", [])
    assert any(a.get("name") == "aeroqueue-sync" for a in apps), "it ran on the cluster, not in local mode"


def test_an_executor_killed_mid_task(real_store, real_url, cluster, list_name, mysql_db, mysql_url, tmp_path):
    registered, store_url = real_store, real_url
    make_jobs(registered, list_name, done=120, dead=8)
    args = {"store": store_url, "target": mysql_url, "master": cluster.url, "partitions": 4, "batch": 10,
            "lists": [list_name], "pause_dir": str(tmp_path), "lease_s": 30.0}
    driver = subprocess.Popen([sys.executable, str(HERE / "run_driver.py"), json.dumps(args)], env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for("a task paused after its commit", lambda: any(tmp_path.glob("paused-*")), 180, step_s=0.2)
        victims = cluster.executors()
        assert victims, "the executor JVM of the run"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        (tmp_path / "go").touch()  # tasks not yet started run through on the new executor
        stdout, stderr = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert driver.returncode == 0, stderr[-3000:]
    report = json.loads(stdout.strip().splitlines()[-1])
    # A killed task's Python worker may outlive its executor and finish its range
    # unseen (the retry then finds it marked): counts vary, the copy may not.
    assert report["tasks"] == 4
    assert_exactly_once(registered, mysql_db, list_name)
    assert set(synced_marks(registered, list_name, mysql_url)) == set(processed(registered, list_name))
