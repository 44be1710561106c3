"""Prometheus metrics: a worker's counters, and per-list gauges read from the store.

Two sources, two commands:

- `WorkerMetrics` is a `WorkerObserver`: ``aeroqueue worker --metrics-port P``
  counts what that worker does (jobs reserved, completed, failed, timed out,
  dead, released, lost, by list), how long handlers and reservations take
  (histograms), the jobs in flight and the session's heartbeats.
- `StoreCollector` answers each scrape of ``aeroqueue metrics --port P`` with
  every list's counts as they are in the store, read at scrape time the way
  `JobLists.status` reads them: the list's header record and its completion
  bitmap chunks, a few reads per list, never a scan of the jobs. Which lists
  exist is a scan of the list set, so it is not done per scrape: either the
  lists are named, or they are discovered at most every `discover_every_s`.

Names follow Prometheus' conventions: a common ``aeroqueue_`` prefix, base
units (seconds, ratios), ``_total`` for counters only. Histograms carry no
list label: one series set per worker, whatever number of lists it follows; the
job counters have one (8 series a list worked) unless the worker counts every list
together (``--no-metrics-list-label``: 8 in all, ``list="*"``).
Each source has its own registry, so several can live in one process (tests).

Both are served by `serve`, which answers only requests whose Host header names
the server by a loopback name, its address or a trusted name (aeroqueue.hosts:
DNS rebinding), and the exporter reads the store within bounds
(`Backend.bounded_reads`): a frozen or unreachable store costs a scrape about
one read's time limit and a short budget for the other lists (a frozen node of
several holds only some lists), and the scrape still answers, with
`aeroqueue_store_up` 0.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import keys
from .backends import Backend
from .backends.base import AFTER_TIMEOUT_BUDGET_S, AFTER_TIMEOUT_MS, UnansweredLast
from .backends.later import Later
from .errors import AeroqueueError, BackendTimeout, ClusterChanging, ConfigError, ListNotFound
from .hosts import TrustedHosts
from .lists import JobLists, ListStatus
from .observe import WorkerObserver

log = logging.getLogger("aeroqueue.metrics")

# Handlers run from milliseconds to the job time limit (minutes).
HANDLER_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# A reservation is two or three round trips (more when the key is busy).
RESERVE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)

STATES = ("queued", "delayed", "claimed", "done", "dead")

# The `list` label of a worker's job counters that count every list together
# (`WorkerMetrics(by_list=False)`): no list is named "*" (keys.check_list_name).
ALL_LISTS = "*"


class WorkerMetrics(WorkerObserver):
    """A worker's metrics, in a registry of their own (`registry`).

    `by_list=False`: the job counters count every list together, as one series each
    labelled ``list="*"``, whatever the number of lists worked. By list, a worker has
    8 series per list it works on: with a list per customer load and tens of
    workers, hundreds of thousands of series in Prometheus. The label stays (with
    one value), so that the queries and dashboards written for it still work."""

    def __init__(
        self, in_flight: Callable[[], float] | None = None, *, registry: CollectorRegistry | None = None,
        by_list: bool = True,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.by_list = by_list
        r = self.registry

        def jobs(name: str, what: str) -> Counter:
            return Counter(f"aeroqueue_jobs_{name}", what, ["list"], registry=r)

        self.jobs_reserved = jobs("reserved", "Jobs reserved (claimed) by this worker.")
        self.jobs_completed = jobs("completed", "Jobs this worker completed (acknowledged done).")
        self.jobs_failed = jobs("failed", "Failed attempts put back for a retry (a last attempt that fails counts as dead).")
        self.jobs_timed_out = jobs("timed_out", "Attempts whose handler ran past the job's time limit, the job put "
                                   "back for another (on its last attempt it counts as dead).")
        self.jobs_dead = jobs("dead", "Jobs that failed or timed out on their last attempt here and went dead.")
        self.jobs_snoozed = jobs("snoozed", "Jobs whose handler asked to run them later (Retry(after=...)): not failures.")
        self.jobs_released = jobs("released", "Jobs given back unfinished (draining, or an acknowledgement that failed).")
        self.jobs_lost = jobs("lost", "Outcomes not acknowledged: the claim or the session was lost meanwhile.")
        self._per_list = (self.jobs_reserved, self.jobs_completed, self.jobs_failed, self.jobs_timed_out,
                          self.jobs_dead, self.jobs_snoozed, self.jobs_released, self.jobs_lost)
        self._worked: set[str] = set()  # lists reserved from: their series exist
        self._lists_lock = threading.Lock()
        self.handler_seconds = Histogram(
            "aeroqueue_handler_duration_seconds", "Time a handler took on one job, whatever its outcome.",
            buckets=HANDLER_BUCKETS, registry=r,
        )
        self.reserve_seconds = Histogram(
            "aeroqueue_reserve_duration_seconds", "Time one reservation call took (including those that found nothing).",
            buckets=RESERVE_BUCKETS, registry=r,
        )
        self.in_flight = Gauge("aeroqueue_worker_jobs_in_flight", "Jobs whose handler is running now.", registry=r)
        if in_flight is not None:
            self.in_flight.set_function(in_flight)
        self.heartbeats = Counter(
            "aeroqueue_session_heartbeats", "Session heartbeats, by result (ok, or failed: refused or not answered).",
            ["result"], registry=r,
        )
        self.last_heartbeat = _Timestamp(
            "aeroqueue_session_last_heartbeat_timestamp_seconds",
            "When the session's last heartbeat succeeded (Unix time); no sample before the first.", registry=r,
        )
        for result in ("ok", "failed"):  # both series exist from the start, so rate() sees the first one
            self.heartbeats.labels(result)
        if not by_list:  # the same 8 series for the life of the process, at 0 from its start
            for counter in self._per_list:
                counter.labels(ALL_LISTS)
        ProcessCollector(registry=r)

    def bind(self, in_flight: Callable[[], float]) -> None:
        """Read the in-flight gauge from this function at each scrape."""
        self.in_flight.set_function(in_flight)

    # -- WorkerObserver -----------------------------------------------------------

    def following(self, lists: list[str]) -> None:
        """The series of a list no longer followed (dropped, so that a pattern no longer
        matches it) go: a worker following a pattern for months kept those of every
        list it had ever worked on, dropped long ago, in every scrape."""
        if not self.by_list:
            # Nothing to drop: the totals go on (a counter removed and made again
            # would go back to 0, which rate() reads as a reset, not as jobs gone).
            return
        now = set(lists)
        with self._lists_lock:
            self._worked &= now
            for counter in self._per_list:
                for family in counter.collect():
                    for name in {s.labels["list"] for s in family.samples} - now:
                        counter.remove(name)

    def _first_reservation(self, list_name: str) -> None:
        """All of a list's counters at 0 from its first reservation here: a series that
        appears with its first increment hides that increment from rate() and
        increase(), and a list's first dead job, often its only one, never showed."""
        with self._lists_lock:
            if list_name not in self._worked:
                self._worked.add(list_name)
                for counter in self._per_list:
                    counter.labels(list_name)

    def reserve_latency(self, list_name: str, seconds: float) -> None:
        self.reserve_seconds.observe(seconds)

    def reserved(self, list_name: str, n: int) -> None:
        if not self.by_list:
            self.jobs_reserved.labels(ALL_LISTS).inc(n)
            return
        if list_name not in self._worked:
            self._first_reservation(list_name)
        self.jobs_reserved.labels(list_name).inc(n)

    def handler_duration(self, list_name: str, seconds: float) -> None:
        self.handler_seconds.observe(seconds)

    def _count(self, counter: Counter, list_name: str, n: int = 1) -> None:
        """An outcome of a list still followed: one that ends after its list stopped
        being followed (a job in flight when its list was dropped, ending lost or
        released) brought back the series `following` had removed, for good. Counted
        together (`by_list` False), it is counted: every reservation's outcome is, so
        the totals add up."""
        if not self.by_list:
            counter.labels(ALL_LISTS).inc(n)
            return
        with self._lists_lock:
            if list_name in self._worked:
                counter.labels(list_name).inc(n)

    def done(self, list_name: str) -> None:
        self._count(self.jobs_completed, list_name)

    def failed(self, list_name: str) -> None:
        self._count(self.jobs_failed, list_name)

    def dead(self, list_name: str) -> None:
        self._count(self.jobs_dead, list_name)

    def timed_out(self, list_name: str) -> None:
        self._count(self.jobs_timed_out, list_name)

    def snoozed(self, list_name: str) -> None:
        self._count(self.jobs_snoozed, list_name)

    def released(self, list_name: str, n: int = 1) -> None:
        self._count(self.jobs_released, list_name, n)

    def lost(self, list_name: str) -> None:
        self._count(self.jobs_lost, list_name)

    def heartbeat(self, ok: bool) -> None:
        self.heartbeats.labels("ok" if ok else "failed").inc()
        if ok:
            self.last_heartbeat.set_to_current_time()


class _Timestamp(Collector):
    """A gauge of a time, with no sample until it is first set. A Gauge's 0 until the
    first heartbeat (a heartbeat interval at each worker's start) made
    `time() - aeroqueue_session_last_heartbeat_timestamp_seconds` some 56 years: a
    stale-heartbeat alert fired, and the dashboard's panel scaled to the spike."""

    def __init__(self, name: str, documentation: str, *, registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.value: float | None = None
        registry.register(self)

    def set_to_current_time(self) -> None:
        self.value = time.time()

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation)
        if self.value is not None:
            family.add_metric([], self.value)
        yield family

    def describe(self) -> Iterator[Metric]:  # registered without a first collect
        yield GaugeMetricFamily(self.name, self.documentation)


# -- the store exporter -----------------------------------------------------------------


class DiscoveryFailed(AeroqueueError):
    """The scan of the list set failed: the lists found before are still exported."""

    def __init__(self, cause: AeroqueueError, names: list[str], *, fresh: bool) -> None:
        super().__init__(str(cause))
        self.names = names  # the lists the last scan that answered found
        self.fresh = fresh  # this call's own scan failed (False: a failure not yet retried)


class ListNames:
    """The lists to export: the ones named, or those found by a scan of the list set
    at most every `discover_every_s` (the scan is the only costly read).

    A scan that fails is retried after `retry_s` at most, not at every scrape: on a
    frozen node each attempt waits out the scan's time limit. Until one answers,
    each call raises `DiscoveryFailed` with the lists found before."""

    def __init__(
        self, backend: Backend, names: Sequence[str] = (), *, discover_every_s: float = 60.0, retry_s: float = 30.0,
    ) -> None:
        self.lists = JobLists(backend)
        # A bad name now, not a failed read each scrape; a name given twice once (each
        # of its series twice made the whole exposition invalid to an OpenMetrics parser).
        self.fixed = list(dict.fromkeys(keys.check_list_name(n) for n in names))
        self.discover_every_s = discover_every_s
        self.retry_s = min(retry_s, discover_every_s)
        self._found: list[str] = []
        self._at = float("-inf")
        self._failed: AeroqueueError | None = None
        self._lock = threading.Lock()

    def __call__(self) -> list[str]:
        if self.fixed:
            return self.fixed
        with self._lock:  # concurrent scrapes share one discovery
            wait = self.discover_every_s if self._failed is None else self.retry_s
            if time.monotonic() - self._at < wait:
                if self._failed is not None:
                    raise DiscoveryFailed(self._failed, list(self._found), fresh=False)
                return list(self._found)
            try:
                self._found = self.lists.names()
            except AeroqueueError as e:
                self._failed, self._at = e, time.monotonic()
                raise DiscoveryFailed(e, list(self._found), fresh=True) from e
            self._failed, self._at = None, time.monotonic()
            return list(self._found)


def state_counts(st: ListStatus) -> dict[str, int]:
    """A status as the exporter's states (`delayed`: waiting for their time, not reservable yet)."""
    return {
        "queued": st.reservable + st.retry_pending,
        "delayed": st.delayed,
        "claimed": st.in_flight,
        "done": st.done,
        "dead": st.dead,
    }


def completion(st: ListStatus) -> float:
    """Finished (done or dead) over total: 0..1; an empty list is 0."""
    return (st.done + st.dead) / st.total if st.total else 0.0


class StoreCollector(Collector):
    """Per-list gauges, read from the store at each scrape (within `Backend.bounded_reads`)."""

    def __init__(self, backend: Backend, names: Callable[[], Iterable[str]], *, errors: int = 0) -> None:
        self.backend = backend
        self.lists = JobLists(backend)
        self.names = names
        self._errors = errors  # counted before (`StoreLater`)
        self._missing: set[str] = set()  # lists said to be missing (once each)
        self._lock = threading.Lock()
        self._read_order = UnansweredLast()  # a frozen node's lists read after the others

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        total = GaugeMetricFamily("aeroqueue_list_jobs", "Jobs loaded into the list.", labels=["list"])
        by_state = GaugeMetricFamily(
            "aeroqueue_list_jobs_by_state",
            "Jobs of the list by state: queued (reservable or waiting for a retry), delayed, claimed, done, dead.",
            labels=["list", "state"],
        )
        ratio = GaugeMetricFamily("aeroqueue_list_completion_ratio", "Finished jobs (done or dead) over total, 0 to 1.", labels=["list"])
        complete = GaugeMetricFamily("aeroqueue_list_complete", "1 once the list is sealed and every job is done or dead.", labels=["list"])
        paused = GaugeMetricFamily("aeroqueue_list_paused", "1 while reservations from the list are paused.", labels=["list"])
        sealed = GaugeMetricFamily("aeroqueue_list_sealed", "1 once loading into the list is finished.", labels=["list"])
        n = 0
        read_all = True  # every read of this scrape answered
        # Within time limits: a frozen or unreachable store costs a scrape one read's
        # limit (a scan's, when the lists are discovered), not 30 s, and it still answers.
        with self.backend.bounded_reads():
            try:
                names = list(self.names())
            except DiscoveryFailed as e:
                # The lists found before are still read: a list set that cannot be
                # scanned (one node frozen) is no reason to stop exporting the rest.
                if e.fresh:
                    self._error("cannot list the job lists; exporting the lists found before", e)
                names, read_all = e.names, False
            except AeroqueueError as e:
                self._error("cannot list the job lists", e)
                names, read_all = [], False
            budget = SCRAPE_BUDGET.get()
            statuses = self._statuses(names, math.inf if budget is None else started + budget)
        for name, st in statuses:
            if st is None:
                read_all = False
                continue
            n += 1
            total.add_metric([name], st.total)
            for state, count in state_counts(st).items():
                by_state.add_metric([name, state], count)
            ratio.add_metric([name], completion(st))
            complete.add_metric([name], 1 if st.complete else 0)
            paused.add_metric([name], 1 if st.paused else 0)
            sealed.add_metric([name], 1 if st.sealed else 0)
        yield from (total, by_state, ratio, complete, paused, sealed)
        with self._lock:
            errors = self._errors
        yield from _scrape_families(n, read_all, errors, time.monotonic() - started)

    def _statuses(self, names: list[str], give_up: float) -> list[tuple[str, ListStatus | None]]:
        """Each list's status, None for those not read: after `give_up` (time.monotonic),
        none is (`SCRAPE_BUDGET`).

        Once a read has not answered in time (a frozen or unreachable node), the
        lists after it are read with a short limit (`AFTER_TIMEOUT_MS`), within
        `AFTER_TIMEOUT_BUDGET_S` in all: those of healthy nodes still answer in
        milliseconds (a list's records live on the node its name hashes to, so one
        frozen node of several holds only some lists), and those of the frozen node
        cost a scrape no more than the budget, however many there are. Those that did
        not answer last scrape are read last (`UnansweredLast`)."""
        names = self._read_order.order(names)
        out: list[tuple[str, ListStatus | None]] = []
        budget_end: float | None = None  # set by the first read that timed out
        unread = 0
        # Every list's records in two batch calls, not two round trips a list. A batch
        # call one node does not answer fails whole: the lists are then read one by
        # one, within the budget that a read that did not answer starts.
        read: dict[str, Any] = {}
        if names:
            try:
                read = self.lists.prefetch(names)
            except (BackendTimeout, ClusterChanging) as e:
                budget_end = time.monotonic() + AFTER_TIMEOUT_BUDGET_S
                self._error(f"cannot read the lists together; each gets {AFTER_TIMEOUT_MS} ms", e)
            except AeroqueueError as e:
                log.debug("lists not read together: one by one", extra={"event": "scrape_one_by_one", "error": str(e)})
        for i, name in enumerate(names):
            now = time.monotonic()
            out_of_time = now >= give_up
            if out_of_time or (budget_end is not None and now >= budget_end):
                out.extend((other, None) for other in names[i:])
                unread += len(names) - i
                if out_of_time:
                    self._error("the scraper's timeout came before every list was read",
                                BackendTimeout(f"{len(names) - i} of {len(names)} lists not read"))
                break
            try:
                if budget_end is None:
                    st = self.lists.status(name, read=read.get(name))
                else:
                    with self.backend.bounded_reads(record_ms=AFTER_TIMEOUT_MS):
                        st = self.lists.status(name, read=read.get(name))
                out.append((name, st))
                self._read_order.note(name, True)
            except ListNotFound:
                # Named but not loaded (a typo?), or dropped since it was discovered:
                # no series for it, and a word once, not one each scrape.
                with self._lock:
                    new = name not in self._missing
                    self._missing.add(name)
                if new:
                    log.warning("list not found: no series for it", extra={"event": "list_missing", "list": name})
            except (BackendTimeout, ClusterChanging) as e:
                if budget_end is None:
                    budget_end = time.monotonic() + AFTER_TIMEOUT_BUDGET_S
                    self._error(f"cannot read list {name!r}; the other lists get {AFTER_TIMEOUT_MS} ms each", e)
                else:
                    self._count_error()
                out.append((name, None))
                self._read_order.note(name, False)
                unread += 1
            except AeroqueueError as e:
                self._error(f"cannot read list {name!r}", e)
                out.append((name, None))
        if unread > 1:
            log.warning(f"{unread} of {len(names)} lists not read this scrape",
                        extra={"event": "scrape_incomplete", "unread": unread})
        return out

    def _count_error(self) -> None:
        with self._lock:
            self._errors += 1

    def _error(self, what: str, e: Exception) -> None:
        self._count_error()
        log.warning(what, extra={"event": "scrape_failed", "error": str(e)})


def store_registry(backend: Backend, names: Callable[[], Iterable[str]]) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StoreCollector(backend, names))
    return registry


class StoreLater(Collector):
    """The exporter of a store that did not answer when it started (a server still
    coming up, or down): it serves anyway, `aeroqueue_store_up` 0, rather than exit,
    which Prometheus would see as the exporter down, for a reason on another host.
    `connect(failures)` (the `StoreCollector` of the store once it answers, its error
    counter going on from `failures`) is called every `retry_s` by a thread of its
    own (`backends.later.Later`), so that no scrape waits on a connect; from then on
    the scrapes are that collector's. `error`: why the first attempt failed."""

    def __init__(self, connect: Callable[[int], StoreCollector], error: Exception, *, retry_s: float = 10.0) -> None:
        self._later = Later(connect, error, retry_s=retry_s, log=log, meanwhile="serving aeroqueue_store_up 0")

    def close(self) -> None:
        """Stop trying (a connect under way ends first)."""
        self._later.close()

    def collect(self) -> Iterator[Metric]:
        collector = self._later.value
        if collector is not None:
            yield from collector.collect()
            return
        yield from _scrape_families(0, False, self._later.failures, 0.0)


def _scrape_families(lists: int, up: bool, errors: int, took_s: float) -> Iterator[Metric]:
    """What every scrape says of itself, whether or not the store answered."""
    yield GaugeMetricFamily("aeroqueue_lists", "Job lists exported.", value=lists)
    # A list the store could not answer for has no series this scrape: an alert on
    # its dead jobs would quietly resolve during an outage. This says so.
    yield GaugeMetricFamily(
        "aeroqueue_store_up", "1 if this scrape read every list from the store, 0 if a read failed "
        "(the lists it could not read have no series: alert on this).", value=1 if up else 0,
    )
    yield CounterMetricFamily("aeroqueue_exporter_errors", "Store reads that failed during scrapes.", value=errors)
    yield GaugeMetricFamily(
        "aeroqueue_exporter_scrape_duration_seconds", "Time this scrape took to read the store.", value=took_s,
    )


# How long the scrape being collected may read the store (seconds; None: no bound but
# each read's). Prometheus says how long it waits for an answer (its scrape_timeout,
# 10 s by default) in a header of each scrape: a store answering every read just
# within its limit (overloaded, not frozen) made a scrape of 39 lists take 12 s, and
# the scrape failed whole, `aeroqueue_store_up` with it. Within the time it has, the
# scrape now answers with the lists it read and `aeroqueue_store_up` 0.
SCRAPE_BUDGET: ContextVar[float | None] = ContextVar("aeroqueue_scrape_budget", default=None)
_SCRAPE_TIMEOUT = "HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS"
SCRAPE_MARGIN_S = 0.5  # of the scraper's timeout, left for answering


def _scrape_budget(environ: dict[str, Any]) -> float | None:
    try:
        timeout = float(environ.get(_SCRAPE_TIMEOUT, ""))
    except ValueError:
        return None  # absent (curl, another scraper) or not a number: no bound
    return max(SCRAPE_MARGIN_S, timeout - SCRAPE_MARGIN_S) if math.isfinite(timeout) and timeout > 0 else None


def serve(
    registry: CollectorRegistry, port: int, host: str = "127.0.0.1", trusted_hosts: Iterable[str] = (),
    *, option: str = "--trusted-host",
) -> Any:
    """Serve /metrics from `registry` (and /healthz: "ok", read from nothing) in a
    daemon thread; returns the HTTP server
    (`server_port` is the port bound, useful with port 0; `shutdown()` stops it).

    Requests whose Host header names none of a loopback name, `host` (unless a
    wildcard), `trusted_hosts` and the address the request came in at get 400
    (aeroqueue.hosts); `option` is the one that adds a name, for the answer to say."""
    trusted = TrustedHosts(trusted_hosts, bound=host, option=option)
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == HEALTH_PATH:  # "ok" tells no other site anything: any Host
            return _healthy(start_response, head=environ.get("REQUEST_METHOD") == "HEAD")
        host_header = environ.get("HTTP_HOST", "")
        if not trusted.allows(host_header, environ.get(_LOCAL_ADDRESS)):
            body = (trusted.refusal(host_header, "this metrics port") + "\n").encode()
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8"),
                                               ("Content-Length", str(len(body)))])
            return [body]
        # The registry is read inside this call (the answer is one block of bytes).
        token = SCRAPE_BUDGET.set(_scrape_budget(environ))
        try:
            result: Iterable[bytes] = metrics_app(environ, start_response)
        finally:
            SCRAPE_BUDGET.reset(token)
        return result

    try:
        # What prometheus_client's start_http_server does, with the check in front:
        # the address family the host asks for, a thread per request.
        family, _, _, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

        class Server(_ThreadingServer):
            address_family = family

        server = make_server(str(address[0]), port, app, Server, handler_class=_Handler)
    except OSError as e:
        # "[Errno 98] Address already in use" named neither the address nor the port.
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {e.strerror or e}") from None
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


_LOCAL_ADDRESS = "aeroqueue.local_address"

# A liveness probe's path: answered without reading the registry, so without a read of
# the store. Every path was the metrics: a probe of /healthz read every list, and with
# the store frozen took 3 s, past a kubelet's 1 s default, so the exporter was
# restarted again and again during a store outage, and its `aeroqueue_store_up 0`
# went with it. Whether the store answers is `aeroqueue_store_up`'s to say.
HEALTH_PATH = "/healthz"


def _healthy(start_response: Callable[..., Any], *, head: bool = False) -> Iterable[bytes]:
    """200 "ok"; to a HEAD (a load balancer's check) the headers alone: wsgiref sends
    whatever body it is given, which a client keeping the connection reads as the
    start of its next answer."""
    body = b"ok\n"
    start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                              ("Cache-Control", "no-store")])
    return [] if head else [body]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress does not hold up the process's exit


class _Handler(WSGIRequestHandler):
    """Quiet (no line per scrape on stderr), and telling the app the server's address
    of the connection: with a wildcard bind, the address a scraper reached it at."""

    def get_environ(self) -> dict[str, Any]:
        environ: dict[str, Any] = super().get_environ()
        with contextlib.suppress(OSError, IndexError):
            environ[_LOCAL_ADDRESS] = str(self.connection.getsockname()[0])
        return environ

    def log_message(self, format: str, *args: Any) -> None:
        pass
