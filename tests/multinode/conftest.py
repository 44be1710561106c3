"""Fixtures for multi-node tests: real Aerospike clusters in network namespaces.

Each test gets the session's cluster (tests/cluster.py) started again with
the nodes it asks for, empty (about 3 s); the UDF modules are registered once
(about 10 s). Clients, workers and the web
handler run inside the namespace as subprocesses (`Cluster.run`/`popen`).
Tests skip with the reason where network namespaces cannot be made, and fail
in CI (CI=true). Every namespace and asd process is removed at the end, even
when a test fails; one left behind by a run that was itself killed is removed
by the next run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aeroqueue import udfs
from tests.cluster import PREFIX, Cluster, namespaces_possible
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
_OURS = re.compile(rf"^{re.escape(PREFIX)}p(\d+)$")


def _remove_leftovers() -> None:
    """Namespaces of earlier test runs whose pytest process is gone (killed mid-run)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in listed:
        m = _OURS.match(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            Cluster(name[len(PREFIX):], 9).down()
            shutil.rmtree(f"/tmp/aeroqueue-cluster-{name[len(PREFIX):]}", ignore_errors=True)


# The session's cluster while it runs: stopped after the last multi-node test, so that
# its nodes do not idle under the tests that follow in the same process (a 3-node
# cluster costs some 9% of a core doing nothing: 27 CPU-seconds under the sync tests).
_RUNNING: list[Cluster] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)  # the test's own fixtures first: they may still use the cluster
    finally:
        if not os.environ.get("AEROQUEUE_KEEP_CLUSTER") and (nextitem is None or not nextitem.path.is_relative_to(HERE)):
            for c in _RUNNING:
                c.down()  # its directory (the registered modules) goes at the session's end


@pytest.fixture(scope="session")
def clusters() -> Iterator[Callable[..., Cluster]]:
    """fresh(n, min_cluster_size=None): this session's cluster started again with n
    nodes, empty, its UDF modules registered. Every size shares the nodes' directories, where the modules
    and the index definition survive restarts (a node that joins gets them from
    the others), so they are registered once (about 10 s); a restart takes about
    3 s, less than waiting for the migrations a test before left behind, and no
    test sees another's records."""
    why = namespaces_possible()
    require(why is None, f"multi-node tests need network namespaces here: {why}")
    _remove_leftovers()
    name = f"p{os.getpid()}"
    last = _RUNNING

    def fresh(n: int, min_cluster_size: int | None = None) -> Cluster:
        for c in last:
            c.down()
        # From 3 nodes, a majority (README: running on a cluster): a node cut off, or
        # frozen and resumed, then forms no cluster of its own, so no partition has
        # two masters. Two nodes cannot have that and survive the loss of one.
        # Every node (`min_cluster_size=n`): the others keep a frozen node in the
        # cluster and its partitions unanswered for as long as it stays frozen.
        if min_cluster_size is None:
            min_cluster_size = n // 2 + 1 if n >= 3 else 1
        last[:] = [Cluster(name, n, subnet="10.77.5", min_cluster_size=min_cluster_size)]
        cluster = last[0].up()
        if not (cluster.root / ".registered").exists():
            out = aq(cluster, "udf", "register", timeout=120)
            assert out.returncode == 0, out.stderr
            (cluster.root / ".registered").touch()
        _wait_for_modules(cluster)
        return cluster

    try:
        yield fresh
    finally:
        for c in last:
            if os.environ.get("AEROQUEUE_KEEP_CLUSTER"):  # to look at a failure: `python -m tests.cluster --name ...`
                print(f"\nkept cluster {c.name}: {c.url()} (namespace {c.netns}, dir {c.root})")
                continue
            c.down()
            shutil.rmtree(c.root, ignore_errors=True)


def _wait_for_modules(cluster: Cluster, timeout_s: float = 30.0) -> None:
    """Until every node serves the UDF modules and the index. A node whose directory
    is new (the first 3-node cluster after 2-node ones) gets them from the others
    after it joins, a moment after the cluster forms: a worker that opened its session
    on it then failed with "UDF: Execution Error 1" (module not found)."""
    modules = [f"filename={name}.lua" for name in udfs.packaged()]
    give_up = time.monotonic() + timeout_s
    for node in cluster.nodes:
        while True:
            listed = cluster.info(node.index, "udf-list") + cluster.info(node.index, "sindex-list:ns=test")
            missing = [m for m in modules if m not in listed] + [i for _, _, i, _ in udfs.INDEXES if i not in listed]
            if not missing:
                break
            assert time.monotonic() < give_up, f"node {node.index} still lacks {missing} after {timeout_s:.0f}s"
            time.sleep(0.2)


@pytest.fixture
def cluster1(clusters: Callable[[int], Cluster]) -> Cluster:
    return clusters(1)


@pytest.fixture
def cluster2(clusters: Callable[[int], Cluster]) -> Cluster:
    return clusters(2)


@pytest.fixture
def cluster3(clusters: Callable[[int], Cluster]) -> Cluster:
    return clusters(3)


def in_namespace(cluster: Cluster) -> dict[str, Any]:
    """Where clients run: the cluster's directory (the client drops a copy of every
    registered .lua file into its cwd), with the repository importable."""
    return {"cwd": cluster.root, "env": {**os.environ, "PYTHONPATH": str(ROOT)}}


def aq(cluster: Cluster, *args: str, url: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`aeroqueue ARGS` inside the cluster's namespace."""
    return cluster.run(
        [sys.executable, "-m", "aeroqueue", "--url", url or cluster.url(), *args],
        capture_output=True, text=True, timeout=timeout, **in_namespace(cluster),
    )


def agent(cluster: Cluster, *args: str, timeout: float = 60) -> Any:
    """tests/multinode/agent.py inside the namespace; its JSON answer."""
    out = cluster.run(
        [sys.executable, "-m", "tests.multinode.agent", *args],
        capture_output=True, text=True, timeout=timeout, **in_namespace(cluster),
    )
    assert out.returncode == 0, f"agent {args[0]} failed:\n{out.stderr}"
    return json.loads(out.stdout)
