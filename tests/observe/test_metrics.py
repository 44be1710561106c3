"""Prometheus metrics: a worker's counters scraped over HTTP while it runs and
audited against the store job by job; the exporter's per-list gauges against
`status`, without a scan per scrape. On every backend (AEROQUEUE_TEST_URL)."""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aeroqueue import keys, udfs
from aeroqueue.backends import Backend, open_backend
from aeroqueue.backends.base import UnansweredLast
from aeroqueue.errors import BackendTimeout, StoreUnreachable
from aeroqueue.hosts import TrustedHosts, host_name, is_wildcard
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.metrics import (
    AFTER_TIMEOUT_MS,
    ListNames,
    StoreCollector,
    StoreLater,
    WorkerMetrics,
    completion,
    serve,
    state_counts,
    store_registry,
)
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from aeroqueue.worker import DEFAULT_PREFETCH, Worker
from tests.observe.conftest import free_port, spawn, stop

pytestmark = pytest.mark.timeout(120)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

COUNTERS = ("reserved", "completed", "failed", "timed_out", "dead", "released", "lost")


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        return parse(resp.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 30) -> Samples:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return scrape(url)
        except (urllib.error.URLError, ConnectionError):
            assert proc.poll() is None, f"the process exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{url} never answered:\n{log.read_text()[-3000:]}"
            time.sleep(0.05)


# -- the worker ------------------------------------------------------------------------------


def test_worker_metrics_while_it_runs_match_the_store(registered: Backend, store_url: str, list_name: str, tmp_path: Path) -> None:
    lists = JobLists(registered)
    specs = (
        [JobSpec(f"ok{i}", {"sleep": 0.02}) for i in range(20)]
        + [JobSpec(f"flaky{i}", {"sleep": 0.02, "fail_until": 1}) for i in range(5)]  # fails once, then done
        + [JobSpec(f"bad{i}", {"fail_until": 99}) for i in range(5)]  # fails both attempts: dead
    )
    lists.load(list_name, specs, max_attempts=2, seal=True)
    port, log = free_port(), tmp_path / "worker.log"
    proc = spawn([
        "--url", store_url, "worker", "--handler", "tests.observe.handlers:scripted", "--list", list_name,
        "--heartbeat", "0.2", "--expiry", "2", "--metrics-port", str(port), "--log-format", "json",
    ], log)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        scrapes = [wait_for(url, proc, log)]
        deadline = time.monotonic() + 60
        while (value(scrapes[-1], "aeroqueue_jobs_completed_total", list=list_name) or 0) + (
            value(scrapes[-1], "aeroqueue_jobs_dead_total", list=list_name) or 0
        ) < len(specs):
            assert time.monotonic() < deadline, f"the worker did not finish:\n{log.read_text()[-3000:]}"
            assert proc.poll() is None, f"the worker exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
            scrapes.append(scrape(url))
        time.sleep(0.5)  # at least two heartbeats at 0.2 s
        scrapes.append(scrape(url))
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]

    # Counters only ever go up, scrape after scrape.
    for name in COUNTERS:
        seen = [value(s, f"aeroqueue_jobs_{name}_total", list=list_name) or 0 for s in scrapes]
        assert seen == sorted(seen), f"{name} went down: {seen}"
    final = scrapes[-1]

    def counter(name: str) -> float:
        return value(final, f"aeroqueue_jobs_{name}_total", list=list_name) or 0

    # Audit against the store, job by job: each claim is one reservation; every
    # attempt but a job's last failed and was retried; the last one is done or dead.
    st = lists.status(list_name)
    jobs = list(lists.jobs(list_name))
    assert len(jobs) == len(specs)
    assert counter("completed") == st.done == sum(j["state"] == "done" for j in jobs) == 25
    assert counter("dead") == st.dead == sum(j["state"] == "dead" for j in jobs) == 5
    assert counter("reserved") == sum(j["att"] for j in jobs) == 40
    assert counter("failed") == sum(j["att"] - 1 for j in jobs) == 10
    assert counter("timed_out") == counter("released") == counter("lost") == 0
    # One handler run per reservation; a reserve call claims up to the worker's
    # prefetch, so at least 40 / prefetch of them (some find nothing).
    assert value(final, "aeroqueue_handler_duration_seconds_count") == 40
    assert (value(final, "aeroqueue_handler_duration_seconds_sum") or 0) >= 25 * 0.02
    assert (value(final, "aeroqueue_reserve_duration_seconds_count") or 0) >= 40 / DEFAULT_PREFETCH
    assert value(final, "aeroqueue_worker_jobs_in_flight") == 0
    assert (value(final, "aeroqueue_session_heartbeats_total", result="ok") or 0) >= 2
    assert value(final, "aeroqueue_session_heartbeats_total", result="failed") == 0
    assert abs((value(final, "aeroqueue_session_last_heartbeat_timestamp_seconds") or 0) - time.time()) < 30


def test_a_worker_told_to_count_every_list_together_has_8_job_series_whatever_the_lists(
    registered: Backend, store_url: str, list_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By list, a worker has 8 series per list it works on: with a list per customer
    load and tens of workers, Prometheus holds hundreds of thousands. Without the
    list label (its environment variable, as a deployment sets it) the same 8 series
    count every list, labelled list="*", and the totals are the store's."""
    lists = JobLists(registered)
    names = [f"{list_name}-{i}" for i in range(5)]
    for i, name in enumerate(names):
        lists.load(name, [JobSpec(f"ok{j}", {}) for j in range(4)] + [JobSpec("bad", {"fail_until": 99})] * (i % 2),
                   max_attempts=2, seal=True)
    monkeypatch.setenv("AEROQUEUE_WORKER_METRICS_LIST_LABEL", "false")
    port, log = free_port(), tmp_path / "worker.log"
    proc = spawn([
        "--url", store_url, "worker", "--handler", "tests.observe.handlers:scripted", "--list", f"{list_name}-*",
        "--heartbeat", "0.2", "--expiry", "2", "--metrics-port", str(port),
    ], log)
    url = f"http://127.0.0.1:{port}/metrics"

    def finished(samples: Samples) -> float:  # whatever the labels
        return sum(v for (n, _), v in samples.items() if n in ("aeroqueue_jobs_completed_total", "aeroqueue_jobs_dead_total"))

    try:
        samples = wait_for(url, proc, log)
        deadline = time.monotonic() + 60
        while finished(samples) < 22:
            assert time.monotonic() < deadline, f"the worker did not finish:\n{log.read_text()[-3000:]}"
            assert proc.poll() is None, f"the worker exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
            time.sleep(0.05)
            samples = scrape(url)
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    jobs_series = {(n, labels) for n, labels in samples if n.startswith("aeroqueue_jobs_") and n.endswith("_total")}
    assert jobs_series == {(f"aeroqueue_jobs_{name}_total", frozenset({("list", "*")}))
                           for name in (*COUNTERS, "snoozed")}, sorted(jobs_series)
    assert not any(dict(labels).get("list") not in (None, "*") for _, labels in samples), "a series names a list"
    every = [job for name in names for job in lists.jobs(name)]
    assert len(every) == 22

    def counter(name: str) -> float:
        return value(samples, f"aeroqueue_jobs_{name}_total", list="*") or 0

    assert counter("completed") == sum(lists.status(n).done for n in names) == 20
    assert counter("dead") == sum(lists.status(n).dead for n in names) == 2
    assert counter("reserved") == sum(j["att"] for j in every) == 24
    assert counter("failed") == sum(j["att"] - 1 for j in every) == 2


def _drop_a_list_with_jobs_in_flight(m: WorkerMetrics) -> None:
    """Lists a and b followed, jobs of each reserved, a no longer followed, then the
    outcomes of all three: a's lost and released, b's done."""
    m.following(["a", "b"])
    m.reserved("a", 2)
    m.reserved("b", 1)
    m.following(["b"])
    m.lost("a")
    m.released("a")
    m.done("b")


def test_counted_together_a_lists_counts_stay_when_it_is_no_longer_followed() -> None:
    """A list dropped takes no count with it from the totals: a counter going down is
    a reset to rate(), and the reservations' outcomes would no longer add up."""
    m = WorkerMetrics(by_list=False)
    assert _series(m.registry, "aeroqueue_jobs_dead_total") == {"*": 0}  # from the start
    _drop_a_list_with_jobs_in_flight(m)
    assert _series(m.registry, "aeroqueue_jobs_reserved_total") == {"*": 3}
    assert _series(m.registry, "aeroqueue_jobs_lost_total") == {"*": 1}
    assert _series(m.registry, "aeroqueue_jobs_released_total") == {"*": 1}
    assert _series(m.registry, "aeroqueue_jobs_completed_total") == {"*": 1}


def test_worker_metrics_count_each_outcome_by_list() -> None:
    m = WorkerMetrics(lambda: 3)
    m.reserved("a", 4)
    for outcome in ("done", "done", "retry", "dead", "lost", "unacked", "timed_out", "snoozed"):
        m.outcome("a", outcome)
    m.reserved("b", 1)
    m.outcome("b", "done")
    m.released("b")
    m.heartbeat(True)
    m.heartbeat(False)
    s = parse(generate_latest(m.registry).decode())
    expected = {("a", "reserved"): 4, ("a", "completed"): 2, ("a", "failed"): 1, ("a", "dead"): 1, ("a", "lost"): 2,
                ("a", "timed_out"): 1, ("a", "snoozed"): 1, ("b", "reserved"): 1, ("b", "completed"): 1, ("b", "released"): 1}
    for (lst, name), n in expected.items():
        assert value(s, f"aeroqueue_jobs_{name}_total", list=lst) == n, (lst, name)
    assert value(s, "aeroqueue_jobs_dead_total", list="b") == 0  # there from b's first reservation
    assert value(s, "aeroqueue_jobs_dead_total", list="c") is None  # never reserved from: no series
    assert value(s, "aeroqueue_worker_jobs_in_flight") == 3
    assert value(s, "aeroqueue_session_heartbeats_total", result="ok") == 1
    assert value(s, "aeroqueue_session_heartbeats_total", result="failed") == 1


def test_no_last_heartbeat_time_before_the_first_heartbeat() -> None:
    """It was 0 until then (a heartbeat interval at each worker's start): time() minus
    it, the dashboard's panel and a stale-heartbeat alert, said 56 years."""
    m = WorkerMetrics()
    name = "aeroqueue_session_last_heartbeat_timestamp_seconds"
    for beat in (None, False):
        if beat is not None:
            m.heartbeat(beat)
        families = {f.name: f for f in text_string_to_metric_families(generate_latest(m.registry).decode())}
        assert families[name].type == "gauge" and families[name].samples == [], beat
    m.heartbeat(True)
    assert abs((value(parse(generate_latest(m.registry).decode()), name) or 0) - time.time()) < 30


def _series(registry: CollectorRegistry, name: str) -> dict[str, float]:
    """list -> value of counter `name`'s series."""
    return {s.labels["list"]: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
            for s in f.samples if s.name == name}


def test_a_workers_counters_are_there_from_a_lists_first_reservation_and_go_with_the_list(
    registered: Backend, list_name: str,
) -> None:
    """A series that appeared with its first increment hid it from rate()/increase(): a
    list's first dead job, often its only one, never showed on the dashboard or in an
    alert. And a worker following a pattern kept the series of every list it had ever
    worked on: dropped lists' series stayed in every scrape for the life of the process.
    A list followed but never reserved from (none loaded yet) has none: a worker's
    series are per list it works on, times the workers."""
    lists, first, second = JobLists(registered), f"{list_name}-a", f"{list_name}-b"
    lists.load(first, [JobSpec(f"j{i}", {}) for i in range(2)], seal=True)
    metrics = WorkerMetrics()
    worker = Worker(registered, lambda job: "ok", [f"{list_name}-*", f"{list_name}.none"], observer=metrics, ack_linger_s=0,
                    interval_s=0.2, expiry_s=2, refresh_lists_s=0.1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        def wait(until: Any) -> None:
            deadline = time.monotonic() + 30
            while not until():
                assert time.monotonic() < deadline, _series(metrics.registry, "aeroqueue_jobs_completed_total")
                assert thread.is_alive()
                time.sleep(0.05)

        wait(lambda: _series(metrics.registry, "aeroqueue_jobs_completed_total").get(first) == 2)
        for name in ("dead", "failed", "timed_out", "snoozed", "released", "lost"):
            assert _series(metrics.registry, f"aeroqueue_jobs_{name}_total") == {first: 0}, name
        lists.drop(first, grace_s=0)
        # A list gone, and none new: the series go all the same.
        wait(lambda: first not in _series(metrics.registry, "aeroqueue_jobs_completed_total"))
        lists.load(second, [JobSpec("k", {})], seal=True)
        wait(lambda: _series(metrics.registry, "aeroqueue_jobs_completed_total") == {second: 1})
        assert _series(metrics.registry, "aeroqueue_jobs_dead_total") == {second: 0}
    finally:
        worker.request_stop()
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_an_outcome_after_its_list_is_no_longer_followed_brings_no_series_back() -> None:
    """A job in flight when its list was dropped ends after `following` removed the
    list's series (lost, or released): its count brought them back, for good."""
    m = WorkerMetrics()
    _drop_a_list_with_jobs_in_flight(m)
    assert _series(m.registry, "aeroqueue_jobs_lost_total") == {"b": 0}
    assert _series(m.registry, "aeroqueue_jobs_released_total") == {"b": 0}
    assert _series(m.registry, "aeroqueue_jobs_completed_total") == {"b": 1}


def test_a_failed_acknowledgement_is_counted_once(registered: Backend, list_name: str) -> None:
    """An ack the store failed gives the job back: it was counted released and lost, so
    a worker's outcomes added up to more than it reserved."""
    JobLists(registered).load(list_name, [JobSpec(f"j{i}", {"i": i}) for i in range(3)], seal=True)
    metrics = WorkerMetrics()
    worker = Worker(registered, lambda job: "ok", [list_name], ack_linger_s=0, lease=False, until_complete=True,
                    observer=metrics, interval_s=0.2, expiry_s=2)
    complete, failed = worker.queue.complete, []

    def complete_failing_once(job, result=None):  # the store fails before the ack lands
        if not failed:
            failed.append(job.jid)
            raise BackendTimeout("injected: the acknowledgement timed out")
        return complete(job, result)

    worker.queue.complete = complete_failing_once  # type: ignore[method-assign]
    assert worker.run(install_signals=False) == 0
    counts = {s.name: s.value for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())
              for s in f.samples if s.labels.get("list") == list_name and s.name.endswith("_total")}
    ended = {o: counts.get(f"aeroqueue_jobs_{o}_total", 0)
             for o in ("completed", "failed", "snoozed", "dead", "timed_out", "released", "lost")}
    assert failed and counts["aeroqueue_jobs_reserved_total"] == 4  # 3 jobs, one of them twice
    assert ended == {**dict.fromkeys(ended, 0), "completed": 3, "released": 1}, ended


def test_metric_names_follow_prometheus_conventions(registered: Backend, list_name: str) -> None:
    JobLists(registered).load(list_name, [JobSpec("x", 1)])
    worker = WorkerMetrics()
    worker.reserved(list_name, 1)
    worker.done(list_name)
    store = store_registry(registered, ListNames(registered, [list_name]))
    families = [
        *text_string_to_metric_families(generate_latest(worker.registry).decode()),
        *text_string_to_metric_families(generate_latest(store).decode()),
    ]
    names = {f.name: f.type for f in families if not f.name.startswith("process_")}
    for required in ("aeroqueue_jobs_completed", "aeroqueue_jobs_reserved", "aeroqueue_jobs_failed",
                     "aeroqueue_jobs_timed_out", "aeroqueue_jobs_dead", "aeroqueue_session_heartbeats"):
        assert names.get(required) == "counter", required
    for name, kind in names.items():
        assert name.startswith("aeroqueue_"), name
        assert not any(unit in name for unit in ("_ms", "millis", "_minutes", "percent")), f"{name}: use base units"
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        if kind != "counter":
            assert not name.endswith("_total"), f"{name}: _total is for counters"
    assert names["aeroqueue_handler_duration_seconds"] == names["aeroqueue_reserve_duration_seconds"] == "histogram"
    assert names["aeroqueue_list_completion_ratio"] == "gauge"


# -- the exporter -----------------------------------------------------------------------------


def _prepare(backend: Backend, list_name: str) -> tuple[str, str]:
    """Two lists: one with done, dead, claimed and queued jobs; one paused and untouched."""
    lists, queue = JobLists(backend), Queue(backend)
    other = f"{list_name}-b"
    lists.load(list_name, [JobSpec(f"j{i}", i) for i in range(12)], max_attempts=1, seal=True)
    lists.load(other, [JobSpec(f"k{i}", i) for i in range(5)])
    lists.pause(other)
    session = Session.open(backend, heartbeat=False)
    jobs = queue.reserve(list_name, session, 6)
    for job in jobs[:3]:
        queue.complete(job)
    for job in jobs[3:5]:
        queue.fail(job, "boom")  # one attempt only: dead
    return list_name, other  # jobs[5] stays claimed


def _check_gauges(samples: Samples, lists: JobLists, name: str) -> None:
    st = lists.status(name)
    assert value(samples, "aeroqueue_list_jobs", list=name) == st.total
    for state, n in state_counts(st).items():
        assert value(samples, "aeroqueue_list_jobs_by_state", list=name, state=state) == n, state
    assert value(samples, "aeroqueue_list_completion_ratio", list=name) == pytest.approx(completion(st))
    assert value(samples, "aeroqueue_list_paused", list=name) == (1 if st.paused else 0)
    assert value(samples, "aeroqueue_list_complete", list=name) == (1 if st.complete else 0)


def test_exporter_gauges_are_the_store_counts_without_a_scan_per_scrape(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, other = _prepare(registered, list_name)
    lists = JobLists(registered)
    scans: list[str] = []
    real_scan = registered.scan
    monkeypatch.setattr(registered, "scan", lambda set_name, **kw: scans.append(set_name) or real_scan(set_name, **kw))

    named = store_registry(registered, ListNames(registered, [first, other]))
    for _ in range(3):
        samples = parse(generate_latest(named).decode())
    assert scans == [], "named lists need no scan"
    for name in (first, other):
        _check_gauges(samples, lists, name)
    # The figures themselves, not only their agreement with status.
    assert value(samples, "aeroqueue_list_jobs", list=first) == 12
    by_state = {s: value(samples, "aeroqueue_list_jobs_by_state", list=first, state=s) for s in
                ("queued", "delayed", "claimed", "done", "dead")}
    assert by_state == {"queued": 6, "delayed": 0, "claimed": 1, "done": 3, "dead": 2}
    assert value(samples, "aeroqueue_list_completion_ratio", list=first) == pytest.approx(5 / 12)
    assert value(samples, "aeroqueue_list_paused", list=other) == 1
    assert value(samples, "aeroqueue_lists") == 2

    discovered = store_registry(registered, ListNames(registered, discover_every_s=3600))
    for _ in range(3):
        samples = parse(generate_latest(discovered).decode())
    assert len(scans) == 1, f"one discovery scan for three scrapes, not {len(scans)}"
    for name in (first, other):
        _check_gauges(samples, lists, name)


def test_exporter_states_add_up_to_the_status() -> None:
    st: Any = SimpleNamespace(reservable=4, retry_pending=1, in_flight=2, done=3, dead=1, total=15, delayed=4)
    assert state_counts(st) == {"queued": 5, "delayed": 4, "claimed": 2, "done": 3, "dead": 1}
    assert sum(state_counts(st).values()) == st.total


def test_exporter_counts_a_real_delayed_load(registered: Backend, list_name: str) -> None:
    JobLists(registered).load(list_name, [JobSpec("x", 1), JobSpec("y", 2)], delay_s=3600)
    JobLists(registered).load(list_name, [JobSpec("z", 3)])
    samples = parse(generate_latest(store_registry(registered, lambda: [list_name])).decode())
    assert value(samples, "aeroqueue_list_jobs_by_state", list=list_name, state="delayed") == 2
    assert value(samples, "aeroqueue_list_jobs_by_state", list=list_name, state="queued") == 1


def test_a_list_named_twice_is_exported_once(registered: Backend, list_name: str) -> None:
    """`--list L --list L`: each of L's series came twice, which an OpenMetrics parser
    (what Prometheus asks for first) refuses whole."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as parse_openmetrics,
    )

    JobLists(registered).load(list_name, [JobSpec("x", 1)])
    registry = store_registry(registered, ListNames(registered, [list_name, list_name]))
    families = list(parse_openmetrics(openmetrics(registry).decode()))  # read whole: it raises at a series twice
    assert "aeroqueue_list_jobs" in {f.name for f in families}
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "aeroqueue_lists") == 1


def test_exporter_skips_a_list_that_vanished(registered: Backend, list_name: str, caplog) -> None:
    JobLists(registered).load(list_name, [JobSpec("x", 1)])
    collector = StoreCollector(registered, lambda: [list_name, f"{list_name}-gone"])
    registry = store_registry(registered, lambda: [list_name, f"{list_name}-gone"])
    with caplog.at_level(logging.WARNING, logger="aeroqueue.metrics"):
        for _ in range(3):
            samples = parse(generate_latest(registry).decode())
    assert value(samples, "aeroqueue_list_jobs", list=list_name) == 1
    assert value(samples, "aeroqueue_list_jobs", list=f"{list_name}-gone") is None
    assert value(samples, "aeroqueue_exporter_errors_total") == 0
    assert value(samples, "aeroqueue_store_up") == 1, "a list not found is not a failed read"
    missing = [r for r in caplog.records if getattr(r, "event", "") == "list_missing"]
    assert [r.list for r in missing] == [f"{list_name}-gone"], "said once, not each scrape"
    assert list(collector.collect())  # a collector on its own works too


def test_metrics_command_refuses_a_bad_list_name_and_names_a_port_in_use(registered: Backend, store_url: str) -> None:
    from click.testing import CliRunner

    from aeroqueue.cli import main

    bad = CliRunner().invoke(main, ["--url", store_url, "metrics", "--port", "0", "--list", "bad name"])
    assert bad.exit_code == 2 and "invalid list name 'bad name'" in bad.output, bad.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = CliRunner().invoke(main, ["--url", store_url, "metrics", "--port", str(port)])
    assert busy.exit_code == 1 and f"127.0.0.1:{port}" in busy.output and "in use" in busy.output, busy.output


def test_metrics_command_serves_the_gauges_over_http(registered: Backend, store_url: str, list_name: str, tmp_path: Path) -> None:
    first, other = _prepare(registered, list_name)
    port, log = free_port(), tmp_path / "exporter.log"
    proc = spawn(["--url", store_url, "metrics", "--port", str(port), "--list", first, "--list", other], log)
    try:
        samples = wait_for(f"http://127.0.0.1:{port}/metrics", proc, log)
        lists = JobLists(registered)
        for name in (first, other):
            _check_gauges(samples, lists, name)
        assert value(samples, "aeroqueue_list_jobs_by_state", list=first, state="dead") == 2
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("fails", ["names", "status"])
def test_a_store_that_cannot_be_read_says_so_in_store_up(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch, fails: str,
) -> None:
    """While the store cannot be read, the lists it could not answer for have no
    series: an alert on their dead jobs would quietly resolve during the outage.
    `aeroqueue_store_up` 0 says the scrape is not the store's whole truth."""
    JobLists(registered).load(list_name, [JobSpec("x", 1)])
    down = BackendTimeout("scan of aq_list failed: timed out", operation="scan", key="aq_list")
    names: Any = lambda: [list_name]  # noqa: E731
    registry = store_registry(registered, names)
    assert value(parse(generate_latest(registry).decode()), "aeroqueue_store_up") == 1
    if fails == "names":
        def unreadable() -> list[str]:
            raise down
        registry = store_registry(registered, unreadable)
    else:
        def timed_out(*args: Any, **kw: Any) -> Any:
            raise down
        monkeypatch.setattr(JobLists, "status", timed_out)
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "aeroqueue_list_jobs", list=list_name) is None
    assert value(samples, "aeroqueue_store_up") == 0
    assert value(samples, "aeroqueue_exporter_errors_total") == 1


def test_a_failed_discovery_keeps_the_lists_found_before_and_is_not_retried_each_scrape(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scan of the list set that fails (a frozen node: each attempt waits out the
    scan's 5 s limit) is retried after `retry_s`, not at every scrape, and the lists
    found before are still exported meanwhile, with `aeroqueue_store_up` 0 until a
    scan answers again."""
    JobLists(registered).load(list_name, [JobSpec("x", 1)])
    clock = [1000.0]
    monkeypatch.setattr("aeroqueue.metrics.time.monotonic", lambda: clock[0])
    names = ListNames(registered, discover_every_s=60, retry_s=10)
    registry = store_registry(registered, names)
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "aeroqueue_list_jobs", list=list_name) == 1
    assert value(samples, "aeroqueue_store_up") == 1

    scans: list[str] = []
    real_scan = registered.scan

    def frozen(set_name: str, **kw: Any) -> Any:
        scans.append(set_name)
        raise BackendTimeout("scan of aq_list failed: timed out", operation="scan", key=set_name)

    monkeypatch.setattr(registered, "scan", frozen)
    for step in (60.0, 1.0, 8.0):  # a discovery due, then two scrapes inside the retry delay
        clock[0] += step
        samples = parse(generate_latest(registry).decode())
        assert value(samples, "aeroqueue_list_jobs", list=list_name) == 1, "the list found before is still read"
        assert value(samples, "aeroqueue_store_up") == 0, "the list set is not known to be whole"
    assert len(scans) == 1, f"one scan attempt inside the retry delay, not {len(scans)}"
    assert value(samples, "aeroqueue_exporter_errors_total") == 1, "the failure counted once, not once a scrape"

    clock[0] += 2.0  # past the retry delay: scanned again, still failing
    generate_latest(registry)
    assert len(scans) == 2
    monkeypatch.setattr(registered, "scan", real_scan)
    clock[0] += 10.0  # the next retry answers: whole again, new lists included
    other = f"{list_name}-new"
    JobLists(registered).load(other, [JobSpec("y", 2), JobSpec("z", 3)])
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "aeroqueue_store_up") == 1
    assert value(samples, "aeroqueue_list_jobs", list=other) == 2


def test_lists_after_a_timed_out_one_are_read_with_a_short_limit_within_a_budget(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One frozen node of several holds only the lists whose names hash to it: a
    scrape that stopped at the first list that timed out exported nothing of the
    healthy nodes' lists after it. They are read on, each read within 100 ms, until
    the budget is spent; the lists not read have no series, and store_up says so.
    The next scrape reads the lists that did not answer last: read first, a frozen
    node's lists spent the budget before the healthy ones were tried."""
    names = [f"{list_name}-{i}" for i in range(4)]
    for i, name in enumerate(names):
        JobLists(registered).load(name, [JobSpec(f"j{k}", k) for k in range(i + 1)])
    frozen = {names[1]}
    real_status = JobLists.status

    def status(self: JobLists, name: str, *args: Any, **kw: Any) -> Any:
        if name in frozen:
            raise BackendTimeout(f"read of aq_list/{name} failed: timed out", operation="get", key=name)
        return real_status(self, name, *args, **kw)

    monkeypatch.setattr(JobLists, "status", status)
    # Each list read on its own, as when the batch read of them all failed (`prefetch`).
    monkeypatch.setattr(JobLists, "prefetch", lambda self, names: {})
    # The short limit, made long enough for a loaded machine's healthy reads: what is
    # checked is that the later reads get it, not how fast they are.
    monkeypatch.setattr("aeroqueue.metrics.AFTER_TIMEOUT_MS", 1500)
    spy = ReadSpy(registered.client)
    monkeypatch.setattr(registered, "client", spy)
    registry = store_registry(registered, lambda: names)
    samples = parse(generate_latest(registry).decode())
    assert [value(samples, "aeroqueue_list_jobs", list=n) for n in names] == [1, None, 3, 4]
    assert value(samples, "aeroqueue_store_up") == 0
    limits = [ms for call, _, ms in spy.seen if call in ("get", "batch_read")]
    assert limits[0] == 1000 and limits[-1] == 1500, limits

    monkeypatch.setattr("aeroqueue.metrics.AFTER_TIMEOUT_BUDGET_S", 0.0)  # spent at once: nothing more is read
    samples = parse(generate_latest(registry).decode())
    # names[1] read last: every healthy list before the budget starts.
    assert [value(samples, "aeroqueue_list_jobs", list=n) for n in names] == [1, None, 3, 4]
    assert value(samples, "aeroqueue_store_up") == 0

    frozen.add(names[2])  # answered last time, so read before names[3]: nothing read after it
    samples = parse(generate_latest(registry).decode())
    assert [value(samples, "aeroqueue_list_jobs", list=n) for n in names] == [1, None, None, None]
    samples = parse(generate_latest(registry).decode())  # names[3] answered last time: before both
    assert [value(samples, "aeroqueue_list_jobs", list=n) for n in names] == [1, None, None, 4]
    assert value(samples, "aeroqueue_store_up") == 0


def test_a_scrape_reads_every_list_in_the_same_round_trips_whatever_their_number(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scrape read each list's record and completion bitmaps with two round trips
    of its own: thousands of lists, thousands of calls a scrape. Now two batch calls
    for all; their counts are the same as a list's own status. A batch call that
    fails (one node not answering) leaves each list read on its own, within the
    short limits a read that did not answer starts."""
    lists = JobLists(registered)
    names = [f"{list_name}-{i}" for i in range(12)]
    for i, name in enumerate(names):
        lists.load(name, [JobSpec(f"j{k}", k) for k in range(i + 1)], seal=True)
    queue = Queue(registered)
    with Session.open(registered, heartbeat=False) as s:
        queue.complete_many(queue.reserve(names[3], s, 2), ["ok", "ok"])
    few, every = (lambda: names[:3]), (lambda: names)

    def cost(which: Callable[[], list[str]]) -> tuple[int, dict]:
        before = registered.round_trips
        samples = parse(generate_latest(store_registry(registered, which)).decode())
        return registered.round_trips - before, samples

    (three, _), (twelve, samples) = cost(few), cost(every)
    assert twelve == three, (three, twelve)  # it was two more a list: 18 more
    for i, name in enumerate(names):
        st = lists.status(name)
        assert value(samples, "aeroqueue_list_jobs", list=name) == i + 1 == st.total
        assert value(samples, "aeroqueue_list_jobs_by_state", list=name, state="done") == st.done
    assert value(samples, "aeroqueue_list_jobs_by_state", list=names[3], state="done") == 2
    assert value(samples, "aeroqueue_store_up") == 1

    def frozen(self: JobLists, names: list[str]) -> Any:
        raise BackendTimeout("batch read of aq_list failed: timed out", operation="batch_read", key=names[0])

    monkeypatch.setattr(JobLists, "prefetch", frozen)
    spy = ReadSpy(registered.client)
    monkeypatch.setattr(registered, "client", spy)
    samples = parse(generate_latest(store_registry(registered, every)).decode())
    assert [value(samples, "aeroqueue_list_jobs", list=n) for n in names] == list(range(1, 13))
    # Every list read after all: the store is up; the read that did not answer is an error.
    assert value(samples, "aeroqueue_store_up") == 1
    assert value(samples, "aeroqueue_exporter_errors_total") == 1
    limits = {ms for call, _, ms in spy.seen if call in ("get", "batch_read")}
    assert limits == {AFTER_TIMEOUT_MS}, limits


def test_the_read_order_forgets_a_list_no_longer_named():
    """A dropped list's name is not kept for the life of the process."""
    order = UnansweredLast()
    order.note("a", False)
    assert order.order(["a", "b"]) == ["b", "a"]
    assert order.order(["b"]) == ["b"]  # "a" dropped: forgotten
    assert order.order(["a", "b"]) == ["a", "b"]  # loaded again: read in its place


def test_a_store_answering_every_read_slowly_costs_a_scrape_the_time_prometheus_gives_it(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each read answering just within its limit (an overloaded store, not a frozen
    one) had no bound: a scrape of 39 lists took 12 s, past Prometheus's scrape
    timeout, and the scrape failed whole, store_up with it. Within the time the
    scraper says it waits (its header), the scrape answers with the lists it read,
    and store_up 0; with no such header, it reads them all."""
    names = [f"{list_name}-{i}" for i in range(6)]
    for name in names:
        JobLists(registered).load(name, [JobSpec("j", 1)])
    real_status = JobLists.status
    reads: list[str] = []

    def slow(self: JobLists, name: str, *args: Any, **kw: Any) -> Any:
        reads.append(name)
        time.sleep(0.25)
        return real_status(self, name, *args, **kw)

    monkeypatch.setattr(JobLists, "status", slow)
    monkeypatch.setattr(JobLists, "prefetch", lambda self, names: {})  # each list read on its own
    server = serve(store_registry(registered, lambda: names), 0)
    try:
        def scrape(**headers: str) -> dict:
            reads.clear()
            req = urllib.request.Request(f"http://127.0.0.1:{server.server_port}/metrics", headers=headers)
            with urllib.request.urlopen(req, timeout=30) as resp:
                return parse(resp.read().decode())

        samples = scrape(**{"X-Prometheus-Scrape-Timeout-Seconds": "1.25"})  # 0.75 s to read in
        exported = [n for n in names if value(samples, "aeroqueue_list_jobs", list=n) is not None]
        assert exported and len(exported) < len(names) and exported == reads, (exported, reads)
        assert value(samples, "aeroqueue_store_up") == 0
        assert value(samples, "aeroqueue_exporter_errors_total") == 1
        samples = scrape()
        assert [value(samples, "aeroqueue_list_jobs", list=n) for n in names] == [1] * len(names)
        assert value(samples, "aeroqueue_store_up") == 1
    finally:
        server.shutdown()


class ReadSpy:
    """A backend's client that notes each read's total_timeout (None: the client's
    configured policy) and the thread that made it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.seen: list[tuple[str, str, int | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def note(self, call: str, policy: dict[str, Any] | None) -> None:
        self.seen.append((call, threading.current_thread().name, (policy or {}).get("total_timeout")))

    def get(self, key: Any, policy: dict[str, Any] | None = None) -> Any:
        self.note("get", policy)
        return self._client.get(key, policy)

    def select(self, key: Any, bins: list[str], policy: dict[str, Any] | None = None) -> Any:
        self.note("select", policy)
        return self._client.select(key, bins, policy)

    def batch_read(self, keys_: list[Any], bins: list[str] | None = None, policy: dict[str, Any] | None = None) -> Any:
        self.note("batch_read", policy)
        return self._client.batch_read(keys_, bins, policy)

    def query(self, namespace: str, set_name: str) -> Any:
        spy, query = self, self._client.query(namespace, set_name)

        class Query:
            def __getattr__(self, name: str) -> Any:
                return getattr(query, name)

            def __setattr__(self, name: str, value: Any) -> None:
                setattr(query, name, value)

            def results(self, policy: dict[str, Any] | None = None, *more: Any) -> Any:
                spy.note("query", policy)
                return query.results(policy, *more)

            def foreach(self, callback: Any, policy: dict[str, Any] | None = None, *more: Any) -> Any:
                spy.note("scan", policy)  # Backend.scan_answered's
                return query.foreach(callback, policy, *more)

        return Query()


def test_a_scrapes_reads_have_time_limits_and_other_threads_reads_do_not(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A scrape reads the store within `Backend.bounded_reads`: a record read within
    the URL's total_timeout (the client's 1 s here), the scan that discovers the lists
    within 5 s, where the client's default waits 30 s for a frozen node. Reads made
    meanwhile by another thread (the sync's scans, in a process that also serves
    metrics) keep their own policies."""
    JobLists(registered).load(list_name, [JobSpec("x", 1)])
    spy = ReadSpy(registered.client)
    monkeypatch.setattr(registered, "client", spy)
    me = threading.current_thread().name
    samples = parse(generate_latest(store_registry(registered, ListNames(registered))).decode())
    assert value(samples, "aeroqueue_list_jobs", list=list_name) == 1 and value(samples, "aeroqueue_store_up") == 1
    scrape = set(spy.seen)
    assert {call for call, _, _ in scrape} >= {"batch_read", "query"}, scrape  # the lists' records: `prefetch`
    assert scrape == {(call, me, 5000 if call == "query" else 1000) for call, _, _ in scrape}
    spy.seen.clear()
    with registered.bounded_reads():
        other = threading.Thread(name="sync", target=lambda: (
            list(registered.scan(keys.LIST_SET)), registered.get(keys.LIST_SET, list_name),
            registered.batch_get(keys.LIST_SET, [list_name])))
        other.start()
        other.join()
    registered.get(keys.LIST_SET, list_name)  # after the block
    assert set(spy.seen) == {("query", "sync", None), ("get", "sync", None), ("batch_read", "sync", None),
                             ("get", me, None)}


# -- the Host header (DNS rebinding) ----------------------------------------------------------


def get_as(port: int, host: str, *, address: str = "127.0.0.1", path: str = "/metrics") -> tuple[int, str]:
    """GET `path` from `address`:`port` with `host` as the Host header, whatever the address."""
    conn = http.client.HTTPConnection(address, port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_both_metrics_commands_refuse_a_host_they_are_not_known_by(
    registered: Backend, store_url: str, list_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A page of rebind.example, once that name resolves to 127.0.0.1, is same-origin
    with the metrics port for the browser: it could read the list names and counts.
    The exporter and a worker's metrics port answer 400 to a Host that names none of
    a loopback name, a trusted one (option or environment) or their address."""
    JobLists(registered).load(list_name, [JobSpec("x", 1)], seal=True)
    exporter_port, worker_port = free_port(), free_port()
    exporter_log, worker_log = tmp_path / "exporter.log", tmp_path / "worker.log"
    exporter = spawn(["--url", store_url, "metrics", "--port", str(exporter_port), "--list", list_name,
                      "--trusted-host", "Prom.Example.", "--trusted-host", "[fd00::5]:9420"], exporter_log)
    monkeypatch.setenv("AEROQUEUE_METRICS_TRUSTED_HOSTS", "prom.example  [fd00::5]")
    worker = spawn(["--url", store_url, "worker", "--handler", "tests.observe.handlers:scripted", "--list", list_name,
                    "--heartbeat", "0.2", "--expiry", "2", "--metrics-port", str(worker_port), "--log-format", "json"],
                   worker_log)
    try:
        for port, proc, log, option in ((exporter_port, exporter, exporter_log, "--trusted-host"),
                                        (worker_port, worker, worker_log, "--metrics-trusted-host")):
            wait_for(f"http://127.0.0.1:{port}/metrics", proc, log)
            for host in (f"localhost:{port}", "127.0.0.1", f"[::1]:{port}", "LOCALHOST.", f"prom.example:{port}",
                         "PROM.EXAMPLE", "[FD00:0::5]:80"):
                status, body = get_as(port, host)
                assert status == 200 and "aeroqueue_" in body, (port, host, status)
            for host in (f"rebind.example:{port}", "prom.example.rebind.example", "127.0.0.1.nip.io", "[fd00::6]", ""):
                status, body = get_as(port, host)
                assert status == 400, (port, host, status)
                assert option in body and "aeroqueue_" not in body and list_name not in body, (port, host, body)
    finally:
        codes = stop(exporter), stop(worker)
    assert codes == (0, 0), exporter_log.read_text()[-2000:] + worker_log.read_text()[-2000:]


def test_the_bound_address_is_a_name_the_metrics_are_served_as() -> None:
    """Bound to another address than loopback, the server is scraped as that address
    (Prometheus sends its target as the Host): that address is trusted, no other."""
    server = serve(CollectorRegistry(), 0, "127.0.0.2")
    try:
        port = server.server_port
        assert get_as(port, f"127.0.0.2:{port}", address="127.0.0.2")[0] == 200
        assert get_as(port, f"localhost:{port}", address="127.0.0.2")[0] == 200
        status, body = get_as(port, f"127.0.0.3:{port}", address="127.0.0.2")
        assert status == 400 and "--trusted-host" in body
    finally:
        server.shutdown()
        server.server_close()


def test_healthz_answers_at_once_whatever_the_store_and_the_host() -> None:
    """Every path was the metrics, read from the store: a liveness probe of /healthz took a
    frozen store's 3 s, past a kubelet's 1 s default, and the exporter was restarted over
    and over during the outage, its `aeroqueue_store_up 0` with it."""
    frozen = threading.Event()
    collected: list[str] = []

    class Frozen:
        def collect(self) -> Any:
            collected.append(threading.current_thread().name)
            frozen.wait(10)  # a scrape of a store that does not answer
            return iter(())

    registry = CollectorRegistry()
    registry.register(Frozen())  # type: ignore[arg-type]
    frozen.set()  # registering collects once
    frozen.clear()
    collected.clear()
    server = serve(registry, 0)
    try:
        port = server.server_port
        for host in (f"127.0.0.1:{port}", f"10.1.2.3:{port}", "rebind.example"):  # a kubelet sends the pod's address
            status, body = get_as(port, host, path="/healthz")
            assert (status, body) == (200, "ok\n"), host
            # Whether it read the store, not how long it took (a loaded machine's answer
            # may take a second): a probe that scraped would have waited for the freeze.
            assert collected == [], f"{host}: /healthz read the metrics"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # a HEAD: the headers only
            sock.sendall(b"HEAD /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"\r\n\r\n"), answer
    finally:
        frozen.set()
        server.shutdown()
        server.server_close()


def test_trusted_hosts_rule() -> None:
    """One rule for the dashboard and the metrics ports (aeroqueue.hosts)."""
    assert host_name("[::1]:8420") == "::1" and host_name("Proxy.Example.:443") == "proxy.example"
    assert host_name("[0:0::1]") == host_name("::1") == "::1"
    assert host_name("::ffff:10.0.0.5") == "10.0.0.5", "a dual-stack socket's IPv4 address"
    assert [is_wildcard(a) for a in ("0.0.0.0", "::", "", "[::]", "127.0.0.1", "10.0.0.5", "host.example")] == [
        True, True, True, True, False, False, False]
    # Bound to a wildcard, the address a request came in at is served, as Prometheus
    # scrapes it (a pod's address found by service discovery); a page cannot make a
    # browser send the server's address as the Host, only a name of its own.
    wildcard = TrustedHosts(["prom.example"], bound="0.0.0.0")
    assert wildcard.allows("10.0.0.5:9420", "10.0.0.5")
    assert wildcard.allows("10.0.0.5:9420", "::ffff:10.0.0.5")
    assert not wildcard.allows("10.0.0.6:9420", "10.0.0.5"), "another address: a NAT or a proxy, to be trusted by name"
    assert not wildcard.allows("10.0.0.5:9420"), "the connection's address unknown: names only"
    assert not wildcard.allows("0.0.0.0:9420", "10.0.0.5") and not wildcard.allows("", "10.0.0.5")
    assert wildcard.allows("Prom.Example:9420") and wildcard.allows("[::1]:9420") and not wildcard.allows("rebind.example")
    bound = TrustedHosts(bound="10.0.0.5")
    assert bound.allows("10.0.0.5:9420") and not bound.allows("10.0.0.6")


def test_an_ipv6_address_is_printed_in_brackets_as_a_url_that_opens(tmp_path: Path) -> None:
    """`--host ::1` printed "dashboard on http://::1:8420/": a URL neither a browser nor
    curl takes. The metrics exporter, the dashboard and a worker's metrics line print
    http://[::1]:PORT/..., and that URL answers."""
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    url = f"embedded://{tmp_path / 'store.db'}"
    backend = open_backend(url)
    udfs.register(backend)
    JobLists(backend).load("L", [JobSpec("x", 1)])
    backend.close()
    commands = {
        "metrics": ["metrics", "--host", "::1", "--port", "0", "--list", "L"],
        "dashboard": ["dashboard", "--host", "::1", "--port", "0"],
        "worker": ["worker", "--handler", "tests.observe.handlers:scripted", "--list", "L", "--metrics-host", "::1",
                   "--metrics-port", "0", "--log-format", "json"],
    }
    procs = {name: spawn(["--url", url, *args], tmp_path / f"{name}.log") for name, args in commands.items()}
    try:
        for name, proc in procs.items():
            log = tmp_path / f"{name}.log"
            deadline = time.monotonic() + 30
            while not (found := re.search(r'http://[^\s"]+', log.read_text())):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            printed = found.group(0)
            assert re.fullmatch(r"http://\[::1\]:\d+/(metrics)?", printed), (name, printed)
            with urllib.request.urlopen(printed, timeout=10) as answer:
                assert answer.status == 200, (name, printed)
    finally:
        codes = {name: stop(proc) for name, proc in procs.items()}
    assert codes == {name: 0 for name in procs}, codes


def test_an_exporter_whose_store_did_not_answer_connects_later_and_no_scrape_waits(
    registered: Backend, list_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """`StoreLater`: until the store answers, each scrape says `aeroqueue_store_up` 0 at
    once, also while a connect is under way; its thread tries again every retry time,
    whatever the error (the client's own too), each reason said once and every failure
    counted; then the store's own gauges, the counter going on."""
    JobLists(registered).load(list_name, [JobSpec("a", 1), JobSpec("b", 2)])
    attempts: list[int] = []
    connecting, release, connected = threading.Event(), threading.Event(), threading.Event()
    down = StoreUnreachable("cannot connect to aerospike://nowhere:3000/test through its seed: Failed to connect")
    answers: list[Exception | None] = [down, down, RuntimeError("the client's own"), None]

    def connect(errors: int) -> StoreCollector:
        attempts.append(errors)
        answer = answers[len(attempts) - 1]
        if answer is not None:
            raise answer
        connecting.set()
        try:
            assert release.wait(10)
        finally:
            connected.set()
        return StoreCollector(registered, lambda: [list_name], errors=errors)

    registry = CollectorRegistry()
    with caplog.at_level(logging.DEBUG, logger="aeroqueue.metrics"):
        later = StoreLater(connect, down, retry_s=0.2)
        try:
            registry.register(later)
            samples = parse(generate_latest(registry).decode())
            assert value(samples, "aeroqueue_store_up") == 0 and value(samples, "aeroqueue_lists") == 0
            assert attempts == [], "no attempt before the retry time"
            assert connecting.wait(10), "the thread kept trying past the errors"
            for _ in range(3):  # while the connect is under way
                samples = parse(generate_latest(registry).decode())
                # The connect waits for `release`, set below: a scrape that waited for it
                # would return only once the connect had given up (not how long it took).
                assert not connected.is_set() and value(samples, "aeroqueue_store_up") == 0
            assert value(samples, "aeroqueue_exporter_errors_total") == 4
            release.set()
            deadline = time.monotonic() + 10
            while value(samples := parse(generate_latest(registry).decode()), "aeroqueue_store_up") != 1:
                assert time.monotonic() < deadline, "never connected"
                time.sleep(0.05)
        finally:
            release.set()
            later.close()
    assert value(samples, "aeroqueue_list_jobs", list=list_name) == 2
    assert value(samples, "aeroqueue_exporter_errors_total") == 4, "the counter goes on from the failed connects"
    assert attempts == [1, 2, 3, 4], "one attempt each retry time, no more"
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned.count("store not reachable: serving aeroqueue_store_up 0 until it answers") == 1, warned
    assert warned.count("store not usable: serving aeroqueue_store_up 0 until it answers") == 1, warned
    said = [getattr(r, "error", "") for r in caplog.records if r.levelno == logging.WARNING]
    assert "RuntimeError: the client's own" in said, said


def test_the_exporters_log_lines_are_json_when_the_log_format_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """AEROQUEUE_LOG_FORMAT=json (set for every service of the compose stack) made only
    the worker's lines JSON: the exporter's, the dashboard's and the sync's reached the
    JSON log pipeline as text, which it could not parse or filter by event."""
    monkeypatch.setenv("AEROQUEUE_LOG_FORMAT", "json")
    port, log = free_port(), tmp_path / "exporter.log"
    nowhere = f"aerospike://admin:pw-{free_port()}@127.0.0.1:{free_port()}/test"  # nothing listens there
    proc = spawn(["--url", nowhere, "metrics", "--port", str(port), "--connect-every", "1"], log)
    try:
        samples = wait_for(f"http://127.0.0.1:{port}/metrics", proc, log)
        assert value(samples, "aeroqueue_store_up") == 0
    finally:
        assert stop(proc) == 0, log.read_text()[-3000:]
    lines = [line for line in log.read_text().splitlines() if line.startswith(("{", "20"))]  # not the banner
    assert lines, log.read_text()
    for line in lines:
        entry = json.loads(line)
        assert {"ts", "level", "msg", "event"} <= set(entry), entry
    assert any(json.loads(line)["event"] == "store_unreachable" for line in lines), lines
    assert ":pw-" not in log.read_text()
