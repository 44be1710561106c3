"""Starting with a seed down, with no seed at all, and the URL's client options, on a
real 2-node cluster (replication factor 2) in a network namespace."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cluster import Cluster

from .conftest import agent, aq, in_namespace


def test_every_kind_of_process_starts_with_one_seed_dead(cluster2: Cluster) -> None:
    list_name = "seeds-down"
    assert aq(cluster2, "create", list_name).returncode == 0
    cluster2.kill(1)
    cluster2.wait_stable([0])
    for seeds in ([0, 1], [1, 0]):  # the dead seed last, then first
        url = cluster2.url(seeds)
        assert agent(cluster2, "nodes", url) == {"nodes": ["A1"]}
        st = aq(cluster2, "status", list_name, "--json", url=url)
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["total"] == 0
        assert aq(cluster2, "udf", "status", url=url).returncode == 0


def test_the_cli_loads_reserves_and_acknowledges_with_the_first_seed_dead(cluster2: Cluster, tmp_path: Path) -> None:
    """Not only reads: the commands that write work through the full seed list, its
    first seed dead (a client tries the seeds in order)."""
    cluster2.kill(0)
    cluster2.wait_stable([1])
    jobs = tmp_path / "jobs.csv"
    jobs.write_text("id,n\nj1,1\n")
    out = aq(cluster2, "load", "cli-seed", str(jobs), "--seal")
    assert out.returncode == 0, out.stderr
    reserve = cluster2.popen(
        [sys.executable, "-m", "aeroqueue", "--url", cluster2.url(), "reserve", "cli-seed", "--hold", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **in_namespace(cluster2),
    )
    try:
        assert reserve.stdout is not None
        job = json.loads(reserve.stdout.readline())
        out = aq(cluster2, "complete", "cli-seed", str(job["token"]), "--session", job["session"])
        assert out.returncode == 0, out.stderr
        assert reserve.wait(30) == 0, "reserve ends once its job is acknowledged"
    finally:
        if reserve.poll() is None:
            reserve.kill()
    st = aq(cluster2, "status", "cli-seed", "--json")
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["done"] == 1


def test_no_seed_answering_is_one_clear_error(cluster2: Cluster) -> None:
    cluster2.kill(1)
    cluster2.kill(0)
    out = aq(cluster2, "status", "any", timeout=30)
    assert out.returncode == 1
    first = out.stderr.splitlines()[0]
    assert first.startswith(f"error: cannot connect to {cluster2.url()} through any of its 2 seeds: "), out.stderr
    assert "is the server running and reachable?" in first


def test_the_urls_timeouts_reach_the_client(cluster2: Cluster) -> None:
    """A frozen node makes a write time out after the URL's total_timeout, not the default 1000 ms."""
    url = cluster2.url(query="total_timeout=300&socket_timeout=200&connect_timeout=500&min_conns_per_node=2")
    pid = cluster2.pid(1)
    assert pid is not None
    got = agent(cluster2, "frozen-write", url, str(pid), "40")
    assert got["type"] == "BackendTimeout", got
    assert "socket=200 total=300" in got["error"], got


def test_use_services_alternate_reaches_the_client(cluster2: Cluster) -> None:
    """With it, the client learns the other nodes from their alternate-access-address: this
    cluster sets none, so the client knows only the seed it was given."""
    assert agent(cluster2, "nodes", cluster2.url([0])) == {"nodes": ["A1", "A2"]}
    assert agent(cluster2, "nodes", cluster2.url([0], query="use_services_alternate=true")) == {"nodes": ["A1"]}
