"""deploy/'s monitoring files agree with the code and with docker-compose.yml: the
scrape config reaches the ports the exporter and the workers serve, and every
metric the Grafana dashboard queries is one aeroqueue exports."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aeroqueue import udfs
from aeroqueue.backends import open_backend
from aeroqueue.hosts import TrustedHosts
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.metrics import ListNames, WorkerMetrics, store_registry
from tests.test_deploy import command_argv, invocations, option_value

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana" / "aeroqueue.json"



@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return found


def argv(service: dict[str, Any]) -> list[str]:
    (only,) = invocations(shlex.join(command_argv(service["command"])))
    return only


def exported_names(tmp_path: Path) -> set[str]:
    """Every sample name aeroqueue exports (worker and exporter), with one list loaded."""
    backend = open_backend(f"embedded://{tmp_path / 'store.db'}")
    try:
        udfs.register(backend)
        JobLists(backend).load("l", [JobSpec("x", 1)])
        worker = WorkerMetrics(lambda: 0)
        worker.reserved("l", 1)
        for outcome in ("done", "retry", "dead", "timed_out", "lost"):
            worker.outcome("l", outcome)
        worker.released("l")
        worker.handler_duration("l", 0.1)
        worker.reserve_latency("l", 0.01)
        worker.heartbeat(True)
        text = generate_latest(worker.registry).decode() + generate_latest(
            store_registry(backend, ListNames(backend, ["l"]))
        ).decode()
    finally:
        backend.close()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_prometheus_scrapes_what_the_stack_serves(services: dict[str, Any]) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}

    exporter = argv(services["aeroqueue-metrics"])
    assert exporter[:2] == ["aeroqueue", "metrics"]
    assert option_value(exporter, "--host") == "0.0.0.0", "the exporter must listen beyond its container's loopback"
    targets = [t for sc in jobs["aeroqueue-lists"]["static_configs"] for t in sc["targets"]]
    assert targets == [f"aeroqueue-metrics:{option_value(exporter, '--port')}"]
    # Prometheus sends the target as the Host header: the exporter must be told to
    # trust the service's name, or it answers 400 (aeroqueue.hosts).
    trusted = [value for flag, value in itertools.pairwise(exporter) if flag == "--trusted-host"]
    assert TrustedHosts(trusted, bound=option_value(exporter, "--host")).allows(targets[0]), (
        f"the exporter refuses the Host {targets[0]!r} Prometheus sends: add --trusted-host")

    worker = argv(services["aeroqueue-worker"])
    port = option_value(worker, "--metrics-port")
    assert port and option_value(worker, "--metrics-host") == "0.0.0.0"
    (sd,) = jobs["aeroqueue-workers"]["dns_sd_configs"]
    # Found by their A records, the workers are scraped at their own addresses, which a
    # wildcard bind serves as the Host (the address the request came in at).
    assert sd["names"] == ["aeroqueue-worker"] and str(sd["port"]) == port and sd["type"] == "A"
    assert port in [str(p) for p in services["aeroqueue-worker"].get("expose", [])]


def test_grafana_queries_only_metrics_that_exist(tmp_path: Path) -> None:
    dashboard = json.loads(GRAFANA.read_text())
    exported = exported_names(tmp_path)
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "list"} <= variables
    queried = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried |= set(re.findall(r"\baeroqueue_[a-z_]+", target["expr"]))
    missing = sorted(queried - exported)
    assert not missing, f"the dashboard queries metrics nobody exports: {missing}"
    # The metrics all have a panel.
    for name in ("aeroqueue_jobs_completed_total", "aeroqueue_jobs_failed_total", "aeroqueue_jobs_dead_total",
                 "aeroqueue_jobs_timed_out_total", "aeroqueue_handler_duration_seconds_bucket",
                 "aeroqueue_reserve_duration_seconds_bucket", "aeroqueue_worker_jobs_in_flight",
                 "aeroqueue_session_heartbeats_total", "aeroqueue_list_jobs_by_state", "aeroqueue_list_completion_ratio"):
        assert name in queried, f"no panel shows {name}"


def test_the_checker_catches_an_unknown_metric(tmp_path: Path) -> None:
    exported = exported_names(tmp_path)
    assert "aeroqueue_jobs_completed_total" in exported
    assert "aeroqueue_jobs_finished_total" not in exported  # a typo in a panel would be caught
