"""The workload every queue runs, and the client processes that run it.

A run: a fresh queue holding N jobs is prepared by the parent (not timed);
C client processes (multiprocessing ``spawn``) connect, say they are ready,
wait for one start signal, then each loops "reserve up to k jobs, acknowledge
them" until the queue gives nothing (or a per-client cap, or the deadline).
Each client times its own reserve calls; the parent merges what the clients
report, audits that every job was acknowledged exactly once, and asks the
peer's server whether it agrees.

Peers plug in as two halves: a `Peer` (parent side: start the service,
prepare and audit a queue, drop it) and a `Worker` (child side: one
connection, reserve and ack). Workers are created inside the child, so
nothing but plain config crosses the process boundary.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import queue as queue_mod
import random
import time
import traceback
from abc import ABC, abstractmethod
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

# Spawning a client imports its peer's libraries (aeroqueue loads lupa and the
# aerospike client): 16 of them on 2 cores take a while before the start signal.
START_TIMEOUT_S = 120.0
# After the deadline, the time a client gets to send its figures back.
REPORT_GRACE_S = 30.0
# Other processes using more than this fraction of all CPUs make a run's figures
# suspect: `settle` waits for less, and the table flags a run that did not get it.
QUIET_CPU = 0.25


class PeerUnavailable(Exception):
    """The peer's service or client library is missing; the message says which and what to do."""


@dataclass(frozen=True)
class PeerInfo:
    """What the table says about a peer: what ran, where, and what it promises."""

    name: str
    version: str
    target: str  # where it ran, never with credentials
    recipe: str  # how jobs are claimed and acknowledged
    durability: str  # as configured on this machine, read from the server where possible


class Worker(ABC):
    """One client's connection to a queue; constructed in the client process.

    Counters are cumulative; the harness takes differences around the timed loop,
    so connecting and disconnecting never count.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        """Subclasses connect here, with what the peer's `prepare` put in `config`."""
        self.calls = 0  # calls this adapter made to the server
        self.retries = 0  # claims or acks repeated after a deadlock, serialization failure or busy key
        self.lost = 0  # acks the queue refused because this client no longer held the claim

    @abstractmethod
    def reserve(self, n: int) -> list[tuple[int, Any]]:
        """Claim up to `n` jobs: (job number, handle) pairs; [] when nothing is left."""

    @abstractmethod
    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        """Acknowledge claimed jobs; returns the numbers of those the queue accepted."""

    def round_trips(self) -> int:
        """Calls that reached the server so far."""
        return self.calls

    def unconfirmed(self) -> int:
        """Acks sent on their way whose outcome is not known yet (a worker that
        batches its acks in the background); 0 for the others."""
        return 0

    def flush(self) -> list[int]:
        """Wait for the acks on their way: the numbers of the jobs accepted."""
        return []

    def close(self) -> None:  # noqa: B027 - most workers have nothing to release
        """Release the connection."""


class PipelinedWorker(Worker):
    """A client whose acks travel with its next reservation (aeroqueue's worker path)."""

    @abstractmethod
    def ack_and_reserve(self, jobs: list[tuple[int, Any]], n: int) -> tuple[list[int], list[tuple[int, Any]]]:
        """Acknowledge `jobs` and claim up to `n` more: (numbers accepted, new jobs)."""


@dataclass(frozen=True)
class Prepared:
    """A queue ready to run: the worker class and the plain config each client gets."""

    worker: type[Worker]
    config: dict[str, Any]
    jobs: int


class Peer(ABC):
    """The parent's side of one queue system."""

    name: ClassVar[str]
    # The peer's batch reserve in a few words; None when it has none.
    batch_form: ClassVar[str | None]
    # Whether `Worker.round_trips()` counts the server calls itself (aeroqueue: at
    # the backend boundary) or the adapter's own calls (the peers).
    trips_source: ClassVar[str] = "adapter calls"

    @abstractmethod
    def start(self) -> PeerInfo:
        """Connect (or launch the service); raise `PeerUnavailable` with the reason."""

    @abstractmethod
    def prepare(self, n_jobs: int) -> Prepared:
        """A fresh queue holding jobs 0..n_jobs-1."""

    @abstractmethod
    def verify(self, prepared: Prepared, acked: int) -> str | None:
        """Ask the server: are exactly `acked` jobs done and none left claimed?
        None when it agrees, else what is wrong."""

    @abstractmethod
    def discard(self, prepared: Prepared) -> None:
        """Drop everything `prepare` created."""

    def stop(self) -> None:  # noqa: B027 - only peers that launch a service need it
        """Release what `start` took (connections, a launched server)."""


# -- the client process ------------------------------------------------------------


@dataclass
class WorkerResult:
    index: int
    acked: array  # job numbers whose ack was accepted ('q')
    reserve_ns: array  # one entry per reserve call that returned jobs ('q')
    ack_ns: array
    round_trips: int
    retries: int
    lost: int
    started: float  # time.monotonic(): CLOCK_MONOTONIC, comparable across processes
    finished: float
    timed_out: bool
    error: str | None = None
    cpu_s: float = 0.0  # CPU of the whole client process (its threads too) while it looped


def _client(
    index: int,
    worker_cls: type[Worker],
    config: dict[str, Any],
    batch: int,
    max_jobs: int | None,
    budget_s: float,
    events: Any,
    go: Any,
) -> None:
    """Body of one client process: connect, report ready, wait for the start, loop, report."""

    def failed(why: str) -> None:
        events.put(("done", WorkerResult(index, array("q"), array("q"), array("q"), 0, 0, 0, 0.0, 0.0, False, why)))

    try:
        worker = worker_cls(config)
    except BaseException:
        failed(f"client {index} could not connect: {traceback.format_exc(limit=3)}")
        return
    events.put(("ready", index))
    if not go.wait(START_TIMEOUT_S):
        failed(f"client {index}: no start signal within {START_TIMEOUT_S:.0f} s")
        worker.close()
        return
    acked, reserve_ns, ack_ns = array("q"), array("q"), array("q")
    trips0, retries0, lost0 = worker.round_trips(), worker.retries, worker.lost
    cpu0 = time.process_time()
    started = time.monotonic()
    deadline = started + budget_s
    timed_out = False
    error = None
    clock = time.perf_counter_ns
    pipelined = max_jobs is None and isinstance(worker, PipelinedWorker)
    try:
        got: list[tuple[int, Any]] = []
        while max_jobs is None or len(acked) < max_jobs:
            if time.monotonic() > deadline:
                timed_out = True
                break
            # A sample counts the acks on their way too, or it would take more than its share.
            want = batch if max_jobs is None else min(batch, max_jobs - len(acked) - worker.unconfirmed())
            if want <= 0:
                acked.extend(worker.flush())
                continue
            if pipelined and got:
                # The acks ride with the next reservation: timed as acks, and the
                # reserve samples are the standalone reserves only.
                a = clock()
                done, got = worker.ack_and_reserve(got, want)  # type: ignore[attr-defined]
                ack_ns.append(clock() - a)
                acked.extend(done)
                continue
            a = clock()
            got = worker.reserve(want)
            b = clock()
            if not got:  # the queue is empty: the final, empty reserve is not a latency sample
                break
            reserve_ns.append(b - a)
            if pipelined:
                continue
            done = worker.ack(got)
            c = clock()
            ack_ns.append(c - b)
            acked.extend(done)
            got = []
        acked.extend(worker.flush())  # the last acks count once the server took them
    except BaseException:
        error = f"client {index}: {traceback.format_exc(limit=4)}"
    finished = time.monotonic()
    result = WorkerResult(
        index,
        acked,
        reserve_ns,
        ack_ns,
        worker.round_trips() - trips0,
        worker.retries - retries0,
        worker.lost - lost0,
        started,
        finished,
        timed_out,
        error,
        cpu_s=time.process_time() - cpu0,
    )
    with contextlib.suppress(Exception):  # the figures are in; a failing disconnect must not lose them
        worker.close()
    events.put(("done", result))


# -- the parent ------------------------------------------------------------------------


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # jiffies a second in /proc/stat


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def process_cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system) process `pid` has spent, from /proc; None without
    a pid. For a local server's share of a run: read before and after."""
    if pid is None:
        return None
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # past the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def cpu_busy(window_s: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over the next `window_s` (None off Linux)."""
    a = _cpu_times()
    time.sleep(window_s)
    b = _cpu_times()
    if a is None or b is None or b[1] == a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1])


def settle(max_wait_s: float, quiet: float = QUIET_CPU) -> float | None:
    """Wait (up to `max_wait_s`) until the machine is quiet; returns the CPU fraction
    other processes used just before the run.

    The previous run leaves work behind in the servers (a checkpoint, a purge of a
    dropped table), and a shared machine has other users: either would be billed
    to the next run. Called while the clients wait for the start signal, so what
    it sees is everybody but this run.
    """
    give_up = time.monotonic() + max_wait_s
    while True:
        busy = cpu_busy()
        if busy is None or busy <= quiet or time.monotonic() >= give_up:
            return busy


@dataclass
class RunRow:
    """One measured (or skipped) run: what the table and the JSON show."""

    peer: str
    mode: str  # "single" or "batch <k>"
    batch: int
    clients: int
    jobs: int  # jobs in the queue when the run started
    expected: int  # jobs the run should acknowledge
    status: str  # "ok", "failed", "timeout", "skipped", "n/a"
    reason: str | None = None
    acked: int = 0
    duplicates: int = 0  # acks accepted twice for one job: must be 0
    missing: int = 0  # expected jobs never acked
    exactly_once: bool = False
    server_check: str | None = None  # None: the server agrees
    load_s: float = 0.0
    elapsed_s: float = 0.0
    jobs_per_s: float = 0.0
    reserve_calls: int = 0
    reserve_p50_ms: float = 0.0
    reserve_p99_ms: float = 0.0
    ack_p50_ms: float = 0.0
    ack_p99_ms: float = 0.0
    round_trips_per_job: float | None = None
    trips_source: str | None = None
    retries: int = 0
    lost: int = 0
    background_cpu: float | None = None  # fraction of all CPUs others used just before the start
    # CPU a job: of the client processes alone, and of the whole machine (clients, the
    # queue's server, everything else) from the start signal to the last report. On a
    # machine whose cores the clients and the server share, these decide throughput.
    client_cpu_us_per_job: float | None = None
    machine_cpu_us_per_job: float | None = None
    cleanup_error: str | None = None  # what `discard` could not remove
    vs_aeroqueue_jobs_per_s: float | None = None  # this row's jobs/s over aeroqueue's
    vs_aeroqueue_p50: float | None = None  # this row's reserve p50 over aeroqueue's
    round: int = 1  # which round of the run (`--rounds`): ratios compare rows of one round

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def mode_name(batch: int) -> str:
    return "single" if batch == 1 else f"batch {batch}"


def percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def run(
    peer: Peer,
    *,
    jobs: int,
    clients: int,
    batch: int,
    max_jobs: int | None = None,
    timeout_s: float = 300.0,
    settle_s: float = 30.0,
    timed_load: bool = False,
    log: Callable[[str], None] | None = None,
) -> RunRow:
    """Prepare a queue of `jobs` jobs, drain it with `clients` processes, audit, drop it.

    `max_jobs` caps what each client takes (a sample of a big list); None drains the list.
    `timed_load`: the load time is a reported figure, so wait for a quiet machine first.
    """
    mode = mode_name(batch)
    expected = jobs if max_jobs is None else min(jobs, max_jobs * clients)
    row = RunRow(peer=peer.name, mode=mode, batch=batch, clients=clients, jobs=jobs, expected=expected, status="ok")
    if batch > 1 and peer.batch_form is None:
        row.status, row.reason = "n/a", f"{peer.name} has no batch reserve"
        return row
    if timed_load:
        settle(settle_s)
    t = time.perf_counter()
    prepared = peer.prepare(jobs)
    row.load_s = time.perf_counter() - t
    try:
        results, t0, errors, row.background_cpu, machine_s = _drive(
            prepared, clients=clients, batch=batch, max_jobs=max_jobs, timeout_s=timeout_s, settle_s=settle_s
        )
        _merge(row, results, t0, errors, peer.trips_source)
        if machine_s is not None and row.acked:
            row.machine_cpu_us_per_job = machine_s / row.acked * 1e6
        if row.status in ("ok", "timeout"):
            row.server_check = peer.verify(prepared, row.acked)
            if row.server_check is not None:
                row.exactly_once = False
    finally:
        try:
            peer.discard(prepared)
        except Exception as e:  # the figures stand; the leftovers must be reported
            row.cleanup_error = f"{type(e).__name__}: {e}"[:300]
    if log:
        log(_describe(row))
    return row


def run_sizes(
    peer: Peer,
    *,
    sizes: list[int],
    sample: int,
    turns: int,
    timeout_s: float = 300.0,
    settle_s: float = 30.0,
    log: Callable[[str], None] | None = None,
) -> list[RunRow]:
    """Reserve cost by list size, one client, one job at a time: every list is loaded
    first (each load timed on a quiet machine), then each list gives up to `sample`
    reservations over `turns` interleaved turns (all lists, then all again), and its
    row's p50 is over all of them.

    Measured one list after the other, a size's figure was whatever the machine
    did in that minute: on a 2-core VM a one-client p50 comes in two levels from one
    run to the next (benchmarks/RESULTS.md), and a ratio of two runs landed on
    either. Interleaved, a drift bills every size alike. Jobs are audited across
    the turns: a job acked in two turns is a duplicate."""
    rows: list[RunRow] = []
    prepared: list[Prepared | None] = []
    results: list[list[WorkerResult]] = []
    errors: list[list[str]] = []
    try:
        for size in sizes:
            row = RunRow(peer=peer.name, mode="single", batch=1, clients=1, jobs=size, expected=min(size, sample),
                         status="ok")
            rows.append(row)
            results.append([])
            errors.append([])
            settle(settle_s)
            t = time.perf_counter()
            try:
                prepared.append(peer.prepare(size))
            except Exception as e:
                prepared.append(None)
                row.status, row.reason = "failed", f"load: {type(e).__name__}: {e}"[:500]
                continue
            row.load_s = time.perf_counter() - t
        for turn in range(turns):
            for i, (row, prep) in enumerate(zip(rows, prepared, strict=True)):
                # This turn's share of the sample: what is left, spread over the turns left.
                share = -(-(row.expected - sum(len(r.acked) for r in results[i])) // (turns - turn))
                if prep is None or share <= 0:
                    continue
                got, _, errs, background, _ = _drive(
                    prep, clients=1, batch=1, max_jobs=share, timeout_s=timeout_s, settle_s=settle_s
                )
                results[i] += got
                errors[i] += errs
                if background is not None:
                    row.background_cpu = max(row.background_cpu or 0.0, background)
        for row, prep, got, errs in zip(rows, prepared, results, errors, strict=True):
            if prep is None:
                continue
            _merge(row, got, 0.0, errs, peer.trips_source)
            row.elapsed_s = sum(r.finished - r.started for r in got if r.finished)
            row.jobs_per_s = row.acked / row.elapsed_s if row.elapsed_s > 0 else 0.0
            if row.status in ("ok", "timeout"):
                row.server_check = peer.verify(prep, row.acked)
                if row.server_check is not None:
                    row.exactly_once = False
    finally:
        for row, prep in zip(rows, prepared, strict=False):
            if prep is None:
                continue
            try:
                peer.discard(prep)
            except Exception as e:  # the figures stand; the leftovers must be reported
                row.cleanup_error = f"{type(e).__name__}: {e}"[:300]
    if log:
        for row in rows:
            log(_describe(row))
    return rows


def _drive(
    prepared: Prepared, *, clients: int, batch: int, max_jobs: int | None, timeout_s: float, settle_s: float
) -> tuple[list[WorkerResult], float, list[str], float | None, float | None]:
    """Run the clients: (their results, start time, errors, CPU fraction others used
    before the start, CPU seconds the whole machine spent from the start to the last report)."""
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=_client,
            args=(i, prepared.worker, prepared.config, batch, max_jobs, timeout_s, events, go),
            name=f"bench-client-{i}",
            daemon=True,  # a client never outlives the harness, whatever happens to it
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    results: dict[int, WorkerResult] = {}
    errors: list[str] = []
    t0 = 0.0
    background = None
    cpu_start = cpu_end = None
    try:
        ready: set[int] = set()
        give_up = time.monotonic() + START_TIMEOUT_S
        while len(ready) + len(results) < clients:
            kind, payload = _next_event(events, procs, give_up, results)
            if kind == "ready":
                ready.add(payload)
            elif kind == "done":
                results[payload.index] = payload
        background = settle(settle_s)
        cpu_start = _cpu_times()
        t0 = time.monotonic()
        go.set()
        give_up = t0 + timeout_s + REPORT_GRACE_S
        while len(results) < clients:
            kind, payload = _next_event(events, procs, give_up, results)
            if kind == "done":
                results[payload.index] = payload
        cpu_end = _cpu_times()
    except TimeoutError as e:
        errors.append(str(e))
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
                p.join(5)
        events.close()
    machine_s = (cpu_end[0] - cpu_start[0]) / CLOCK_TICKS if cpu_start and cpu_end else None
    return [results[i] for i in sorted(results)], t0, errors, background, machine_s


def _next_event(events: Any, procs: list[Any], give_up: float, results: dict[int, WorkerResult]) -> tuple[str, Any]:
    """The next message from a client; a client that died without reporting is reported for it."""
    while True:
        try:
            msg: tuple[str, Any] = events.get(timeout=0.2)
            return msg
        except queue_mod.Empty:
            pass
        for i, p in enumerate(procs):
            if p.exitcode not in (None, 0) and i not in results:
                why = f"client {i} exited with code {p.exitcode} without reporting"
                return "done", WorkerResult(i, array("q"), array("q"), array("q"), 0, 0, 0, 0.0, 0.0, False, why)
        if time.monotonic() > give_up:
            raise TimeoutError(f"clients did not report in time ({len(results)} of {len(procs)} did)")


def _merge(row: RunRow, results: list[WorkerResult], t0: float, errors: list[str], trips_source: str) -> None:
    errors = errors + [r.error for r in results if r.error]
    if errors:
        # Each error's first line says which client, its last names the exception:
        # enough for the table (the full tracebacks would drown it).
        row.status, row.reason = "failed", "; ".join(_last_line(e) for e in errors)[:500]
    elif any(r.timed_out for r in results) or len(results) < row.clients:
        row.status, row.reason = "timeout", "the deadline passed before the queue was empty"
    counts: Counter[int] = Counter()
    for r in results:
        counts.update(r.acked)
    row.acked = sum(counts.values())
    row.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    if row.expected == row.jobs:
        row.missing = sum(1 for n in range(row.jobs) if n not in counts)
    else:  # a sample: which jobs it took is the queue's business, how many is not
        row.missing = max(0, row.expected - len(counts))
    strays = sum(1 for n in counts if not 0 <= n < row.jobs)
    row.exactly_once = row.status == "ok" and row.duplicates == 0 and row.missing == 0 and strays == 0
    finished = [r.finished for r in results if r.finished]
    row.elapsed_s = (max(finished) - t0) if finished and t0 else 0.0
    row.jobs_per_s = row.acked / row.elapsed_s if row.elapsed_s > 0 else 0.0
    reserve = sorted(v for r in results for v in r.reserve_ns)
    acks = sorted(v for r in results for v in r.ack_ns)
    row.reserve_calls = len(reserve)
    row.reserve_p50_ms = percentile(reserve, 50) / 1e6
    row.reserve_p99_ms = percentile(reserve, 99) / 1e6
    row.ack_p50_ms = percentile(acks, 50) / 1e6
    row.ack_p99_ms = percentile(acks, 99) / 1e6
    trips = sum(r.round_trips for r in results)
    row.round_trips_per_job = trips / row.acked if row.acked else None
    row.trips_source = trips_source
    row.retries = sum(r.retries for r in results)
    row.client_cpu_us_per_job = sum(r.cpu_s for r in results) / row.acked * 1e6 if row.acked else None
    row.lost = sum(r.lost for r in results)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else text
    return f"{lines[0]} ... {lines[-1]}"


def _describe(row: RunRow) -> str:
    head = f"{row.peer:<10} {row.mode:<9} x{row.clients:<2} {row.jobs:>9,} jobs"
    if row.cleanup_error:
        head += f" (cleanup failed: {row.cleanup_error})"
    if row.status != "ok":
        return f"{head}: {row.status}: {row.reason}"
    check = "exactly once" if row.exactly_once else f"NOT exactly once ({row.duplicates} dup, {row.missing} missing, server: {row.server_check})"
    return (
        f"{head}: {row.acked:,} acked in {row.elapsed_s:.2f} s = {row.jobs_per_s:,.0f} jobs/s, "
        f"reserve p50 {row.reserve_p50_ms:.3f} ms p99 {row.reserve_p99_ms:.3f} ms, {check}"
    )


# -- shared by the adapters -------------------------------------------------------------


def check_states(counts: dict[str, int], acked: int) -> str | None:
    """The server's view of a drained table: `acked` rows done, none claimed or dead."""
    problems = []
    if counts.get("done", 0) != acked:
        problems.append(f"{counts.get('done', 0)} rows done, {acked} acked")
    for state in ("claimed", "dead"):
        if counts.get(state):
            problems.append(f"{counts[state]} rows {state}")
    return "; ".join(problems) or None


def with_retry(
    fn: Callable[[], T],
    retryable: Callable[[BaseException], bool],
    on_retry: Callable[[], None],
    *,
    attempts: int = 20,
    base_s: float = 0.001,
    cap_s: float = 0.1,
) -> T:
    """Run `fn`; on a retryable error (deadlock, serialization failure) run it again
    after a full-jitter exponential backoff, as a production worker would."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:
            if attempt == attempts or not retryable(e):
                raise
            on_retry()
            # Full jitter: clients that collided do not collide again in step.
            time.sleep(random.uniform(0, min(cap_s, base_s * 2**attempt)))
    raise AssertionError("unreachable")
