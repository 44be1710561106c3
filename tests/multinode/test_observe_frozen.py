"""The observers with a frozen store: `aeroqueue metrics` and `aeroqueue dashboard`
run as processes against a one-node cluster of the test's own, whose asd is then
stopped (SIGSTOP). A scrape must still answer, quickly, with `aeroqueue_store_up 0`,
and a page must be a quick error: without time limits on their reads, a scan
waited for the client's socket timeout (30 s) and each named list for a read's
(1 s, one after another). Both also bind 0.0.0.0 here, where the node's address
is a real interface: a request at that address is served (Prometheus sends its
target as the Host), one with a forged Host is not (DNS rebinding)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster import Cluster
from tests.multinode.conftest import agent, in_namespace

pytestmark = pytest.mark.timeout(240)

LISTS = [f"frozen-{i}" for i in range(10)]
METRICS_PORT, DASHBOARD_PORT = 9420, 8420
# A frozen node costs a scrape one record read's time limit (the client's default,
# 1 s) and 250 ms for each other list, 2 s at most, whatever the number of lists: 10
# lists cost 10 s before (the limit leaves a loaded machine room). A page reading the
# lists' names waits for a scan's limit (5 s), 30 s before.
SCRAPE_LIMIT_S = 6.0
SCAN_PAGE_LIMIT_S = 15.0


def samples(body: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(body) for s in f.samples if not s.labels}


def serve(cluster: Cluster, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "w") as out:
        return cluster.popen([sys.executable, "-m", "aeroqueue", "--url", cluster.url(), *args],
                             stdout=subprocess.DEVNULL, stderr=out, **in_namespace(cluster))


def stop(*procs: subprocess.Popen[bytes]) -> None:
    """SIGTERM to each, at once (each takes up to a second to notice), then wait for them."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(cluster: Cluster, *specs: str) -> list[dict[str, Any]]:
    """The answers to GET each spec ('URL' or 'URL|HOST'; a first 'stop=PID' freezes
    that asd for them), from inside the cluster's namespace, in one process."""
    answers: list[dict[str, Any]] = agent(cluster, "http", *specs)["answers"]
    return answers


def test_a_frozen_store_costs_a_scrape_and_a_page_one_time_limit(cluster1: Cluster, tmp_path: Path) -> None:
    url = cluster1.url()
    lists = [arg for name in LISTS for arg in ("--list", name)]
    # The servers start while the lists load: a list named before it exists is read once it does.
    exporter = serve(cluster1, tmp_path / "metrics.log", "metrics", "--host", "0.0.0.0", "--port", str(METRICS_PORT), *lists)
    dashboard = serve(cluster1, tmp_path / "dashboard.log", "dashboard", "--host", "0.0.0.0", "--port", str(DASHBOARD_PORT),
                      "--read-only")
    scrape = f"http://127.0.0.1:{METRICS_PORT}/metrics"
    at_node = f"http://{cluster1.nodes[0].addr}:{METRICS_PORT}/metrics"
    index, page = f"http://127.0.0.1:{DASHBOARD_PORT}/", f"http://127.0.0.1:{DASHBOARD_PORT}/lists/{LISTS[0]}"
    try:
        load = f"from tests.multinode.agent import load\nfor name in {LISTS!r}: print(load({url!r}, name, 3))"
        out = cluster1.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120, **in_namespace(cluster1))
        assert out.returncode == 0 and out.stdout.count("'loaded': 3") == len(LISTS), out.stdout + out.stderr
        dash_at_node = f"http://{cluster1.nodes[0].addr}:{DASHBOARD_PORT}/"
        healthy, node, forged, dash, dash_node, dash_forged = get(
            cluster1, scrape, at_node, f"{at_node}|rebind.example:{METRICS_PORT}", index, dash_at_node,
            f"{dash_at_node}|rebind.example:{DASHBOARD_PORT}")
        assert healthy["status"] == 200, (tmp_path / "metrics.log").read_text()[-3000:]
        assert samples(healthy["body"])["aeroqueue_store_up"] == 1 and samples(healthy["body"])["aeroqueue_lists"] == len(LISTS)
        # Bound to 0.0.0.0: scraped at the node's address, as Prometheus would be.
        assert node["status"] == 200
        assert forged["status"] == 400 and "--trusted-host" in forged["body"] and "aeroqueue_" not in forged["body"]
        assert dash["status"] == 200, (tmp_path / "dashboard.log").read_text()[-3000:]
        assert dash_node["status"] == 200 and dash_forged["status"] == 400, (dash_node["status"], dash_forged["status"])

        pid = cluster1.pid(0)
        frozen, list_page, index_page = get(cluster1, f"stop={pid}", scrape, page, index)
        print(f"\nfrozen: scrape {frozen['seconds']:.2f} s, list page {list_page['seconds']:.2f} s, "
              f"index {index_page['seconds']:.2f} s")
        assert frozen["status"] == 200, frozen
        got = samples(frozen["body"])
        assert got["aeroqueue_store_up"] == 0 and got["aeroqueue_lists"] == 0, got
        assert frozen["seconds"] < SCRAPE_LIMIT_S, f"a scrape of {len(LISTS)} lists took {frozen['seconds']:.1f} s"
        assert list_page["status"] == 503 and list_page["seconds"] < SCRAPE_LIMIT_S, (list_page["status"], list_page["seconds"])
        assert index_page["status"] == 503 and index_page["seconds"] < SCAN_PAGE_LIMIT_S, (
            index_page["status"], index_page["seconds"])

        # Resumed: the next scrapes read every list again.
        deadline = time.monotonic() + 60
        while samples(get(cluster1, scrape)[0]["body"])["aeroqueue_store_up"] != 1:
            assert time.monotonic() < deadline, "the exporter never read the store again after SIGCONT"
            time.sleep(0.5)
    finally:
        stop(exporter, dashboard)
    assert exporter.returncode == 0, (tmp_path / "metrics.log").read_text()[-3000:]
    assert dashboard.returncode == 0, (tmp_path / "dashboard.log").read_text()[-3000:]
