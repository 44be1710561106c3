"""Shared fixtures.

Backends: every contract case runs on the embedded backend, and also on a real
Aerospike server when ``AEROQUEUE_TEST_URL=aerospike://host:3000/ns`` is set.
External services (MySQL, Java for Spark) skip locally when missing and fail
the run in CI (``CI=true``), so a green CI always means they ran.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeroqueue import udfs
from aeroqueue.backends import Backend, open_backend
from aeroqueue.config import parse_url
from aeroqueue.errors import AeroqueueError
from aeroqueue.lists import JobLists
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from tests import durations

# One server URL, or several separated by blanks (separate servers, for
# tests/run.py to split the real-server tests among): pytest alone uses the first.
REAL_URL = next(iter(os.environ.get("AEROQUEUE_TEST_URL", "").split()), None)
# "i/n" (set by tests/run.py): this process runs the i-th of n parts of the
# real-server tests, each part on a server of its own.
SHARD = os.environ.get("AEROQUEUE_TEST_SHARD")
# "i/n" (set by tests/run.py): this process runs the i-th of n parts of the tests
# that need no real server and are not the embedded store's own ("the rest").
REST_SHARD = os.environ.get("AEROQUEUE_TEST_REST_SHARD")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SHARED = Path(__file__).resolve().parents[2] / "shared"


def pytest_configure(config: pytest.Config) -> None:
    # Tests Ctrl-C the commands they start (SIGINT to the child, as a terminal does).
    # A run started in the background of a non-interactive shell (`make test &` in a
    # script) has SIGINT ignored, and every child it starts inherits that: those
    # tests then failed for how the run was started, not for what they test.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def require(condition: bool, why: str) -> None:
    """Skip locally, fail in CI, when an external service the test needs is missing."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{why} (CI=true: a missing service fails the run)")
    pytest.skip(why)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def backend_urls(tmp: Path) -> list[tuple[str, str]]:
    urls = [("embedded", f"embedded://{tmp / 'store.db'}")]
    if REAL_URL:
        urls.append(("aerospike", REAL_URL))
    return urls


# `make test` runs the suite as pytest processes side by side (tests/run.py):
# `-m real_server`, and `-m "not real_server"` in two. The tests that use a real
# server run one after another on it: a reaper or sweep of one test must never act
# on another test's expired claims while that test waits to count them itself.
# Given several servers (CI starts two), they are split into one process per
# server (AEROQUEUE_TEST_SHARD). The rest has stores of its own (embedded files,
# scratch databases, the multi-node cluster in its network namespace). The embedded
# store's own tests (tests/embedded, and make demo's, which runs on it alone: marked
# embedded_own) are split among the real-server processes too when there are several:
# they wait less than those, and the multi-node and sync tests' process, their home
# otherwise, was the run's long pole. The multi-node tests (one cluster per process,
# on a fixed subnet) and the Spark tests that share the session's SparkSession (a
# JVM per process that has one) are marked `apart`: they run in a process of
# their own, beside the rest.
EMBEDDED_TESTS = (Path(__file__).parent / "embedded", Path(__file__).parent / "sync" / "test_demo.py")
MULTINODE_TESTS = Path(__file__).parent / "multinode"


def _uses_spark(item: pytest.Item) -> bool:
    """The test uses the session's SparkSession (the `spark` fixture)."""
    return "spark" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_server: list[pytest.Item] = []
    embedded_own: list[pytest.Item] = []
    apart: list[pytest.Item] = []
    for item in items:
        params = getattr(item, "callspec", None)
        if (params is not None and params.params.get("store_url") == "aerospike") or "real_url" in getattr(
            item, "fixturenames", ()
        ):
            item.add_marker(pytest.mark.real_server)
            on_server.append(item)
        elif any(item.path.is_relative_to(p) for p in EMBEDDED_TESTS):
            item.add_marker(pytest.mark.embedded_own)
            embedded_own.append(item)
        elif item.path.is_relative_to(MULTINODE_TESTS) or _uses_spark(item):
            item.add_marker(pytest.mark.apart)
            apart.append(item)
    others: set[int] = set()
    # Each process of a split takes its share by the tests' measured times
    # (tests/durations.py), so that the processes end together.
    if SHARD:
        part, parts = (int(x) for x in SHARD.split("/"))
        shared = on_server + embedded_own
        # The tests that use the session's SparkSession share one process: each
        # process that has one starts a JVM (some 12 CPU-seconds, and slower
        # under load).
        spark = {id(item) for item in shared if _uses_spark(item)}
        others = {id(item) for item, p in zip(shared, durations.share(shared, parts, spark), strict=True) if p != part}
    if REST_SHARD:
        part, parts = (int(x) for x in REST_SHARD.split("/"))
        taken = {id(item) for group in (on_server, embedded_own, apart) for item in group}
        rest = [item for item in items if id(item) not in taken]
        others |= {id(item) for item, p in zip(rest, durations.share(rest, parts), strict=True) if p != part}
    if others:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in others])
        items[:] = [item for item in items if id(item) not in others]


@pytest.fixture(scope="session")
def real_url() -> str:
    """The real server's URL (AEROQUEUE_TEST_URL), checked once to answer: skipped
    with the reason locally when there is none, a failure in CI (.ci/run starts the
    server of ../shared/aerospike and sets it)."""
    require(
        bool(REAL_URL),
        "set AEROQUEUE_TEST_URL=aerospike://host:3000/ns to run against a real server "
        "(../shared/aerospike/server start, then AEROQUEUE_TEST_URL=$(../shared/aerospike/server url))",
    )
    assert REAL_URL is not None
    hosts = parse_url(REAL_URL).hosts
    require(
        any(port_open(host, port) for host, port in hosts),
        f"no Aerospike server answers at {REAL_URL} (AEROQUEUE_TEST_URL)",
    )
    return REAL_URL


def mark_reaping(backend: Backend, session_id: str) -> None:
    """What a reaper does first: take the session (state 'reaping'), lost to its owner
    from then on. A compare-and-set against the record as read, tried again when a
    heartbeat lands in between."""
    from aeroqueue import keys
    from aeroqueue.errors import GenerationConflict

    for _ in range(50):
        rec = backend.get(keys.SESS_SET, session_id)
        assert rec is not None, f"session {session_id} is gone"
        try:
            backend.put(keys.SESS_SET, session_id, {"state": "reaping"}, gen=rec.gen)
            return
        except GenerationConflict:
            continue
    raise AssertionError(f"session {session_id}: its heartbeats won 50 times in a row")


@pytest.fixture(params=["embedded", "aerospike"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL for each backend: a fresh embedded file, or the real server."""
    if request.param == "aerospike":
        return str(request.getfixturevalue("real_url"))
    return f"embedded://{tmp_path / 'store.db'}"


@pytest.fixture
def backend(store_url: str) -> Iterator[Backend]:
    b = open_backend(store_url)
    yield b
    b.close()


@pytest.fixture
def set_name() -> str:
    """A set of its own for each test, so tests never see each other's records on a shared server."""
    return f"aqt_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def java() -> str:
    path = shutil.which("java")
    require(path is not None, "Java is not installed (Spark needs Java 17)")
    return str(path)


@pytest.fixture
def mysql_available() -> None:
    require(port_open("127.0.0.1", 3306), "MySQL/MariaDB is not listening on 127.0.0.1:3306")


# -- job lists and sessions, on every backend ----------------------------------


@pytest.fixture
def registered(backend: Backend) -> Backend:
    udfs.register(backend)
    return backend


@pytest.fixture
def queue(registered: Backend) -> Queue:
    return Queue(registered)


@pytest.fixture
def lists(registered: Backend) -> JobLists:
    return JobLists(registered)


@pytest.fixture
def list_name() -> str:
    """A list of its own per test, so tests never meet on a shared server."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def big_list(registered: Backend, list_name: str) -> Iterator[str]:
    """`list_name` for a test that loads thousands of jobs: the list is dropped
    afterwards. On the shared server every record a test leaves behind is read
    again by each later scan (sync, drop, bench, sweeps): two 20,000-job lists
    made such tests 8 s instead of 0.2 s."""
    yield list_name
    if registered.is_embedded:
        return  # a fresh store file per test
    with contextlib.suppress(AeroqueueError):  # never loaded, or already dropped by the test
        JobLists(registered).drop(list_name, grace_s=0)


@pytest.fixture
def session(registered: Backend) -> Iterator[Session]:
    s = Session.open(registered)
    yield s
    s.close()
