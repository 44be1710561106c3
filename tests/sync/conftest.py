"""Sync fixtures: one local Spark for the whole run, a scratch MySQL database per
test, and job lists with processed and unprocessed jobs on each backend. Every
Spark a test starts keeps its scratch under the test's tmp_path (`spark_scratch`).

Sync scans every job record of the store, so on a shared server a test may
copy other tests' jobs too: assertions only look at the test's own list.
`registered` and `list_name` come from the root conftest.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeroqueue.sync.job import DAEMON_MODULE, DRIVER_JVM_OPTIONS
from tests.conftest import require

from .helpers import root_connection
from .servers import spark_scratch_env

# Two worker threads; a failed task is tried up to 3 times (local mode's
# default is once, which would hide Spark's retry from the tests).
SPARK_MASTER = "local[2,3]"
# Scratch databases' names begin with it: several people running tests against one
# MariaDB each give theirs (AEROQUEUE_TEST_DB_PREFIX), so that whose a database is shows.
DB_PREFIX = os.environ.get("AEROQUEUE_TEST_DB_PREFIX", "aqs_")
if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,20}", DB_PREFIX):
    raise ValueError(f"AEROQUEUE_TEST_DB_PREFIX={DB_PREFIX!r}: letters, digits and '_' only, at most 21")


@pytest.fixture(autouse=True)
def spark_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the Sparks this test starts keep their scratch: the sync commands and
    drivers it runs as processes inherit the environment. Tests SIGKILL JVMs, whose
    shutdown hooks would have deleted it; left in /tmp, a run left some 140 entries."""
    directory = tmp_path / "spark-scratch"
    for name, value in spark_scratch_env(directory).items():
        monkeypatch.setenv(name, value)
    return directory


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One SparkSession for the whole test run: the JVM starts once, its scratch in a
    directory of the run's (its JVM reads the environment once, as it starts)."""
    require(shutil.which("java") is not None, "Java is not installed (Spark needs Java 17)")
    from pyspark.sql import SparkSession

    # The Python workers must run this interpreter (its venv has aeroqueue).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with pytest.MonkeyPatch.context() as env:
        for name, value in spark_scratch_env(tmp_path_factory.mktemp("spark-session")).items():
            env.setenv(name, value)
        session = (
            SparkSession.builder.master(SPARK_MASTER)
            .appName("aeroqueue-sync-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.defaultJavaOptions", DRIVER_JVM_OPTIONS)  # as the sync's own JVM
            .config("spark.python.daemon.module", DAEMON_MODULE)  # and its workers
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def mysql_db(mysql_available: None) -> Iterator[str]:
    """A scratch database of its own, dropped afterwards."""
    name = f"{DB_PREFIX}{uuid.uuid4().hex[:12]}"  # generated: a safe identifier (DDL takes no parameters)
    conn = root_connection()
    try:
        conn.cursor().execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        yield name
    finally:
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {name}")
        conn.close()


@pytest.fixture
def mysql_url(mysql_db: str) -> str:
    return f"mysql://root@127.0.0.1:3306/{mysql_db}"


@pytest.fixture
def mysql_user(mysql_db: str) -> Iterator[tuple[str, str]]:
    """A user with a password, allowed into the scratch database only."""
    user = f"aqs_{uuid.uuid4().hex[:10]}"
    password = f"Pw-{secrets.token_hex(8)}-x"
    conn = root_connection()
    cur = conn.cursor()
    hosts = ("localhost", "127.0.0.1")
    try:
        for host in hosts:
            cur.execute("CREATE USER %s@%s IDENTIFIED BY %s", (user, host, password))
            # Identifiers cannot be parameters: the database name is generated (aqs_<hex>).
            cur.execute(f"GRANT ALL ON {mysql_db}.* TO %s@%s", (user, host))
        yield user, password
    finally:
        for host in hosts:
            cur.execute("DROP USER IF EXISTS %s@%s", (user, host))
        conn.close()
