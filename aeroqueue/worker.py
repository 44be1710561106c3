"""The worker: run a handler on reserved jobs, under a heartbeat session.

`run_job` is the one step every path shares: an API handler that reserves one
job per request calls it (or `process_one`) without running a worker; the
`Worker` runs it in N threads, heartbeats its session, reaps expired sessions
and sweeps now and then, and drains on SIGTERM/SIGINT: in-flight jobs finish
up to a deadline, the rest are released, the session is closed. Its maintenance
thread watches the handlers' time limits and renews prefetched jobs' claims at
every tick; reaps and sweeps, which can scan the whole job set, each run in a
thread of their own (`_Background`), so that they never hold those back.

A handler is ``def handle(job: Job) -> result``; its return value is stored
as the job's result, and an exception fails the job with its message and
traceback (retried after the list's backoff until its max attempts, then
dead); ``raise Retry(after=seconds)`` runs it again later without counting a
failure. Handlers run at least once per job and may run more than once when a
worker dies or pauses mid-job (its jobs come back): make their side effects
idempotent.

Time limits: a job must be acknowledged within its list's time limit
(``job.touch()`` extends it). Past it the worker stops waiting: in thread mode
it abandons the handler's thread (a Python thread cannot be killed; the
handler's late result is discarded) and starts another so that its
concurrency stays; with ``pool="process"`` each thread runs its handlers in a
child process, killed when a job overruns. Either way the claim ends as a
failed attempt that says it timed out.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import functools
import importlib
import logging
import multiprocessing
import os
import pickle
import random
import signal
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import keys, logs
from .acks import DEFAULT_LINGER_S, AckBatcher
from .backends import Backend
from .errors import (
    AeroqueueError,
    ClaimLost,
    ConfigError,
    JobNotFound,
    ListNotFound,
    RecordTooBig,
    SessionLost,
)
from .lists import JobLists, is_complete
from .observe import NULL_OBSERVER, WorkerObserver
from .queue import Job, Queue, Retry
from .results import ResultNotStorable, storable_result, too_big_to_store
from .selection import DEFAULT_BACKOFF_MAX_S, DEFAULT_REFRESH_S, ListArg, ListSelector, parse_lists
from .sessions import (
    DEFAULT_EXPIRY_S,
    DEFAULT_INTERVAL_S,
    ReapReport,
    Session,
    claim_sweep,
    claim_sweep_after,
    lost_take_due,
    reap,
    sweep,
    sweep_gate_wait,
)

log = logging.getLogger("aeroqueue.worker")

Handler = Callable[[Job], Any]
# The worker's exit statuses (README, "Exit statuses"); 1 and 2 are the CLI's
# (an error before work started, wrong usage).
EXIT_OK = 0  # stopped as asked (SIGTERM/SIGINT, drained) or every list complete
EXIT_SESSION_LOST = 3  # its session expired or was reaped: it stopped acknowledging
EXIT_THREADS_DIED = 4  # every handler thread died (handler processes that cannot start; else a bug in the worker)
# Jobs a worker thread reserves at a time: a reservation is two round trips
# (take, then one batch of claims). The jobs wait claimed in the thread's hands,
# as with Celery's prefetch. Unless --prefetch fixes it, the worker sizes it to
# its handlers' pace on each list: DEFAULT_PREFETCH until a handler has run a job
# of the list, then about PREFETCH_HOLD_S of work, between 1 and PREFETCH_MAX.
# Quick handlers get big reservations (their round trips spread over many jobs);
# slow ones get one job at a time, so no job waits behind another while other
# workers idle. One while the pace is unknown, as Sidekiq and River take jobs only
# for a free executor: with Celery's 4, one thread took a short list of long jobs
# whole (4 jobs of a minute, one after the other, beside 3 idle threads), and the
# one extra round trip of a quick list's first reservation is nothing.
DEFAULT_PREFETCH = 1
PREFETCH_MAX = 100
# --until-complete reads each list's done and dead bitmaps at most this often (and at
# least once a reap interval): not on every tick.
UNTIL_COMPLETE_CHECK_S = 1.0
# A list held short of complete by a dead loader's range: how often its recovery is tried.
RECOVER_EVERY_S = 5.0
PREFETCH_HOLD_S = 0.02
# How long a worker whose session was lost waits for acknowledgements under way: a
# transition's call and its push, each repeated up to 5 s while in doubt.
LOST_ACK_WAIT_S = 10.0
POOLS = ("thread", "process")
# A take or ID-store pop that lost its answer (`sessions.mark_lost_take`) sets off a
# sweep once the mark is LOST_TAKE_SETTLE_MS old (the sweep's grace is the mark's
# age: a shorter one would also take jobs whose holder's release or fail is still
# pushing them back, and offer them twice, one copy left over), through the sweep gate
# as if the interval were LOST_TAKE_SWEEP_EVERY_S: in a node's failure every
# reservation may lose its answer, and the store is then swept that often, not once
# a reap interval by every worker.
LOST_TAKE_SETTLE_MS = 2000
LOST_TAKE_SWEEP_EVERY_S = 30.0
# The sweep after a reap that ended a session begins this long after the reap: the
# reaps of other workers' that end sessions of the same host's dead processes are
# over by then, and their sweeps are served by this one (`claim_sweep_after`).
POST_REAP_SETTLE_S = 1.0


def check_handler_spec(spec: str) -> tuple[str, str]:
    """'package.module:function' -> (module, function), or a `ConfigError` when the
    text cannot name a function (the CLI's usage error, before anything is imported)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"handler {spec!r} must be written package.module:function")
    return module_name, attr


def load_handler(spec: str) -> Handler:
    """'package.module:function' -> the function."""
    module_name, attr = check_handler_spec(spec)
    # Like celery and gunicorn: a handler module in the current directory is found
    # whether the worker started as `aeroqueue` or `python -m aeroqueue`.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        # The module itself not found (not one it imports): say where it was looked for.
        top = module_name.partition(".")[0]
        hint = (f"; looked in the current directory ({os.getcwd()}) and PYTHONPATH"
                if isinstance(e, ModuleNotFoundError) and e.name == top else "")
        raise ConfigError(f"handler {spec!r}: cannot import {module_name!r} ({e}){hint}") from None
    except Exception as e:  # the handler's module itself failed (a missing setting, a typo): its error, not ours
        where = ""
        if not isinstance(e, SyntaxError):  # a SyntaxError's message names its file and line already
            # The deepest frame of the handler's code: not importlib's, not the standard library's.
            stdlib = sysconfig.get_paths()["stdlib"]
            ours = [f for f in traceback.extract_tb(e.__traceback__)
                    if not f.filename.startswith("<")
                    and not (f.filename.startswith(stdlib) and "site-packages" not in f.filename)]
            if ours:
                where = f" ({os.path.relpath(ours[-1].filename)}, line {ours[-1].lineno})"
        raise ConfigError(f"handler {spec!r}: importing {module_name!r} raised {type(e).__name__}: {e}{where}") from e
    fn = getattr(module, attr, _MISSING)
    if fn is _MISSING:
        raise ConfigError(f"handler {spec!r}: {module_name} has no function {attr!r}")
    if not callable(fn):
        raise ConfigError(f"handler {spec!r}: {module_name}.{attr} is not a function: it is {_what(fn)}")
    return fn


_MISSING = object()


def _what(value: Any) -> str:
    """What a value is, in a few words: its type, and a short text of it."""
    if value is None:
        return "None"
    try:
        text = repr(value)
    except Exception:  # a broken __repr__ must not hide the actual mistake
        text = object.__repr__(value)
    shown = text if len(text) <= 60 else text[:57] + "..."
    kind = type(value).__name__
    return f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} ({shown})"


@dataclass
class Counters:
    """What a worker did, for the live display and the final log line."""

    reserved: int = 0
    done: int = 0
    retried: int = 0
    dead: int = 0
    snoozed: int = 0  # the handler raised Retry(after=...)
    timed_out: int = 0  # ran past the time limit: the worker stopped waiting
    lost: int = 0  # acknowledgements refused: the claim had been given away
    unacked: int = 0  # finished after the session was lost: not acknowledged
    released: int = 0
    reaped: int = 0  # other sessions this worker reaped
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


_Copy = tuple[str, str | None]


def _copy(job: Job) -> _Copy:
    """A reserved copy of a job: its name and the request id (or lease id) that reserved
    it. A job reserved again (its claim ended by a reaper) has another."""
    return job.name, job.rid


def handler_pace(previous: float | None, took: float) -> float:
    """A handler's recent run time: a moving average that follows changes within a
    few jobs (what `prefetch_for` sizes a reservation by)."""
    return took if previous is None else 0.8 * previous + 0.2 * took


# The smallest reservation the worker leases rather than claims: a lease costs one more
# round trip and a UDF on the session record per batch, and saves a write per job.
LEASE_MIN = 16


def prefetch_for(handler_s: float | None) -> int:
    """How many jobs to reserve at once for handlers that take `handler_s` each
    (None: not known yet): about PREFETCH_HOLD_S of work, within 1..PREFETCH_MAX."""
    if handler_s is None:
        return DEFAULT_PREFETCH
    return max(1, min(PREFETCH_MAX, int(PREFETCH_HOLD_S / max(handler_s, 1e-6))))


def _failure_text(e: BaseException) -> str:
    """What went wrong, as stored in the job's error: true to what the handler did."""
    if isinstance(e, SystemExit):
        what = f"the handler called sys.exit({e.code!r})"
    elif isinstance(e, KeyboardInterrupt):
        what = "the handler raised KeyboardInterrupt"
    elif isinstance(e, ResultNotStorable):
        return str(e)
    else:
        what = f"{type(e).__name__}: {e}"
    return f"{what}\n{traceback.format_exc()}"


def run_handler(job: Job, handler: Handler, *, propagate: bool = True) -> tuple[bool, Any]:
    """Run the handler: (True, its result as it will be stored) or (False, what went
    wrong, with the traceback), or (False, the `Retry` it raised).

    Whatever the handler does fails that job and nothing else: an exception, a
    result that cannot be stored, ``sys.exit`` or ``KeyboardInterrupt`` raised
    inside it. Only on the main thread do the last two propagate: there they are
    the host program's Ctrl-C or exit (`run_job` fails the job first); not with
    `propagate` False (a handler process, whose main thread is aeroqueue's)."""
    try:
        return True, storable_result(handler(job))
    except Retry as r:
        return False, r
    except BaseException as e:
        if propagate and not isinstance(e, Exception) and threading.current_thread() is threading.main_thread():
            raise
        return False, _failure_text(e)


def acknowledge(queue: Queue, job: Job, ok: bool, value: Any, session: Session | None = None, *,
                _last: bool = False) -> str:
    """Acknowledge what the handler did: 'done', 'retry' (or 'delayed': after a backoff),
    'dead', 'snoozed' (it raised `Retry`), 'lost' (the claim was given away or ran past
    its time limit: the acknowledgement was refused) or 'unacked' (the session was lost
    while the handler ran: its claims may be someone else's, so nothing is sent; or it
    was closed, the worker stopped and its claims given back: the handler ran past the
    drain, and the store connection may be closing under it)."""
    if session is not None and (session.lost or session.closed):
        _log_unacked(job)
        return "unacked"
    try:
        if isinstance(value, Retry):
            queue.snooze(job, value.after)
            log.info("job snoozed", extra={"event": "job_snoozed", "list": job.list, "token": job.token, "jid": job.jid,
                                           "after_s": value.after})
            return "snoozed"
        if not ok:
            outcome = queue.fail(job, value)
            # A dead job needs someone to look (a terminal shows warnings only); a retry does not.
            log.log(logging.WARNING if outcome == "dead" else logging.INFO, "job failed", extra={
                "event": "job_failed", "list": job.list, "token": job.token, "jid": job.jid, "attempt": job.attempt,
                "outcome": outcome, "error": value.split("\n", 1)[0]})
            return outcome
        queue.complete(job, value)
    except ClaimLost:
        _log_claim_lost(job)
        return "lost"
    except JobNotFound:
        # Its list was dropped while the handler ran: nothing left to acknowledge.
        log.warning("job gone (its list was dropped): acknowledgement refused",
                    extra={"event": "claim_lost", "list": job.list, "token": job.token, "jid": job.jid})
        return "lost"
    except RecordTooBig as e:
        if _last:
            # Even a short failure does not fit the record: a store error, for the
            # caller to handle as one (the worker gives the job back, its attempt counted).
            raise
        if ok:
            # Retrying cannot help: the same result is as big next time.
            why = too_big_to_store(value, queue.backend.max_record_size(), "the handler's result")
            return acknowledge(queue, job, False, why, session, _last=True)
        if isinstance(value, Retry):
            return acknowledge(queue, job, False, f"the handler's result is too big to store ({e})", session, _last=True)
        # The failure itself did not fit (a huge message, or a record near the limit):
        # recorded once more, cut to its first line, and no more.
        first = value.split("\n", 1)[0][:500]
        return acknowledge(queue, job, False, f"{first}\n(the error was too big to store in the job's record: cut)",
                           session, _last=True)
    return "done"


def _log_done(job: Job, started: float) -> None:
    log.info("job done", extra={"event": "job_done", "list": job.list, "token": job.token, "jid": job.jid,
                                "attempt": job.attempt, "ms": round((time.monotonic() - started) * 1000, 2)})


def _log_claim_lost(job: Job) -> None:
    log.warning("claim lost: acknowledgement refused",
                extra={"event": "claim_lost", "list": job.list, "token": job.token, "jid": job.jid})


def _log_unacked(job: Job) -> None:
    log.warning("job finished after its session was lost or closed: not acknowledged",
                extra={"event": "job_unacked", "list": job.list, "token": job.token, "jid": job.jid})


def run_job(queue: Queue, job: Job, handler: Handler, session: Session | None = None) -> str:
    """Run the handler on one reserved job and acknowledge the outcome (`acknowledge`)."""
    started = time.monotonic()
    try:
        ok, value = run_handler(job, handler)
    except BaseException as e:  # only on the main thread: the host program's Ctrl-C or exit
        acknowledge(queue, job, False, _failure_text(e), session)
        raise
    outcome = acknowledge(queue, job, ok, value, session)
    if outcome == "done":
        _log_done(job, started)
    return outcome


def process_one(queue: Queue, list_name: str, session: Session | str, handler: Handler) -> str | None:
    """Reserve one job of a list and run `handler` on it: the API-handler path.
    None when the list has nothing to give."""
    jobs = queue.reserve(list_name, session, 1)
    if not jobs:
        return None
    return run_job(queue, jobs[0], handler, session if isinstance(session, Session) else None)


# How often a worker says again that a list it follows is not there (a typo in --list
# leaves it idle for ever otherwise).
MISSING_AGAIN_S = 60.0

_COUNTER_OF = {
    "done": "done", "retry": "retried", "delayed": "retried", "dead": "dead", "snoozed": "snoozed", "lost": "lost",
    "unacked": "unacked", "timed_out": "timed_out",
}


@dataclass(frozen=True)
class _SweepRun:
    """A sweep the worker started: what for."""

    grace_ms: int
    targeted: bool  # after a reap that ended a session (no gate), or a lost take answer (gate won already)


@dataclass(frozen=True)
class _Ended:
    """A background task that ended: what it returned, or `failed` (it raised: logged)."""

    value: Any = None
    failed: bool = False


class _Background:
    """One task at a time in a thread of its own: the worker has one for its sweeps and
    one for its reaps. A sweep scans the job set of every unfinished list, seconds on a
    big store; a reap scans it too for each session it ends (`recount_session`), and
    gives back that session's claims. In the maintenance thread they held back the
    renewals of prefetched jobs' time limits and the handlers' watchdog meanwhile
    (seen: a worker's prefetched jobs timed out, behind a sweep after a reap on a
    store full of other lists' jobs), and a sweep held back the reaps."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._ended = _Ended()  # how the last task ended

    @property
    def busy(self) -> bool:
        """A task runs, or ended and `ended` has not been asked since: none is started
        then, or how that one ended would be lost."""
        return self._thread is not None

    def start(self, task: Callable[[], Any]) -> None:
        assert not self.busy
        self._thread = threading.Thread(target=self._run, args=(task,), name=f"aeroqueue-{self.name}", daemon=True)
        self._thread.start()

    def ended(self) -> _Ended | None:
        """How the task started last ended, once it has: once."""
        if self._thread is None or self._thread.is_alive():
            return None
        self._thread = None
        return self._ended

    def _run(self, task: Callable[[], Any]) -> None:
        ended = _Ended(failed=True)
        try:
            ended = _Ended(task())
        except AeroqueueError as e:
            log.warning("maintenance failed", extra={"event": "maintenance_failed", "error": str(e)})
        except Exception:
            log.exception(f"{self.name} failed", extra={"event": "maintenance_failed"})
        finally:
            self._ended = ended

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for a task under way (its `stop` says yes by now: it ends early)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)


class Worker:
    """N threads running a handler on jobs of some lists, under one session."""

    def __init__(
        self,
        backend: Backend,
        handler: Handler,
        lists: Sequence[ListArg],
        *,
        concurrency: int = 1,
        batch: int | None = None,
        ack_linger_s: float = DEFAULT_LINGER_S,
        interval_s: float = DEFAULT_INTERVAL_S,
        expiry_s: float = DEFAULT_EXPIRY_S,
        drain_timeout_s: float = 30.0,
        reap_every_s: float | None = None,
        sweep_every_s: float = 300.0,
        sweep_grace_ms: int = 60_000,
        idle_s: float = 0.2,
        idle_max_s: float = DEFAULT_BACKOFF_MAX_S,
        refresh_lists_s: float = DEFAULT_REFRESH_S,
        until_complete: bool = False,
        observer: WorkerObserver | None = None,
        pool: str = "thread",
        lease: bool = True,
    ) -> None:
        # "name", "name=weight", (name, weight), or a glob pattern: see aeroqueue.selection.
        specs = parse_lists(lists)
        if concurrency < 1 or (batch is not None and batch < 1):
            raise ConfigError("concurrency and batch must be at least 1")
        if ack_linger_s < 0:
            raise ConfigError(f"ack_linger_s must be zero (acknowledge each job at once) or positive, not {ack_linger_s}")
        if pool not in POOLS:
            raise ConfigError(f"unknown pool {pool!r}: use 'thread' or 'process'")
        if pool == "process":
            # A spawned handler process gets the handler by pickling (its module and
            # name): a lambda or a nested function fails there, in every thread.
            try:
                pickle.dumps(handler)
            except RuntimeError:
                pass  # it holds a multiprocessing Queue or Lock: those pickle only while spawning, and do then
            except (pickle.PicklingError, AttributeError, TypeError) as e:
                raise ConfigError(f"pool 'process' needs a handler importable by name (a module-level function), "
                                  f"not {handler!r}: {e}") from None
        self.pool = pool
        self.backend = backend
        self.queue = Queue(backend)
        self.handler = handler
        self.observer = observer or NULL_OBSERVER
        # By list, a moving average of a handler's run (`handler_pace`): the lists of
        # one worker may hold quick jobs and long ones, and the long ones' first
        # reservation sized to the quick ones' pace took up to PREFETCH_MAX of them
        # into one thread. Before the selector, which says the lists it follows at once.
        self._pace: dict[str, float] = {}
        self.selector = ListSelector(
            specs, JobLists(backend).names, backoff_s=idle_s, backoff_max_s=idle_max_s, refresh_s=refresh_lists_s,
            on_change=self._following,
        )
        self.lists = [str(s) for s in specs]
        self.concurrency = concurrency
        self.batch = batch  # None: sized to the handlers' pace (`prefetch`)
        # Batches of LEASE_MIN or more are leased, not claimed (Queue.reserve).
        self.lease = lease
        self.ack_linger_s = ack_linger_s
        self.acks: AckBatcher | None = None  # while running, unless ack_linger_s is 0
        self.interval_s = interval_s
        self.expiry_s = expiry_s
        self.drain_timeout_s = drain_timeout_s
        self.reap_every_s = reap_every_s if reap_every_s is not None else expiry_s / 2
        self.sweep_every_s = sweep_every_s
        self.sweep_grace_ms = sweep_grace_ms
        self.idle_s = idle_s
        self.until_complete = until_complete
        self.counters = Counters()
        self.session: Session | None = None
        self._stopping = threading.Event()
        # A stop asked by SIGTERM/SIGINT (`on_signal`) that the main thread has not acted on yet.
        self._signalled = False
        # The jobs whose handler runs or whose ack is on its way, with their deadlines and
        # threads, by copy (`_copy`: name and request id), not by name: a job a reaper
        # ended past its limit can be reserved again by another thread of this worker
        # while the first still runs it, and the second copy, filed under the name,
        # hid the first from the watchdog (never retired, its prefetched jobs renewed
        # for ever) and was wiped when the first returned (a read of the worker's threads).
        self._in_flight: dict[_Copy, Job] = {}
        self._in_flight_lock = threading.Lock()
        # Every job a thread reserved and has not finished with, by name. The Job itself is
        # kept, and the entry (as `_reserved_at`'s) goes only with that very Job: a job
        # one thread pushes back (a failure with no backoff, a release) can be reserved
        # again by another thread of this worker before the first is done with its copy,
        # and the first, forgetting the name, wiped the second's hold: the orphan check
        # then gave the live claim away, and the job ran twice.
        self._held: dict[str, Job] = {}
        self._thread_state = threading.local()  # .asked: when this thread's last reserve was sent
        self._acking: dict[str, int] = {}  # jobs whose ack waits in `acks` (name -> how many)
        # Claims of our session no thread held at the last check, each with the session's
        # reservations under way when it was first seen (one of them may have made it).
        self._orphans: dict[tuple[str, str | None], frozenset[int]] = {}  # by (name, rid)
        # Jobs that never started whose release failed: an orphan check gives them back
        # refunded, not with the attempt counted (with one attempt allowed, dead unrun).
        self._unstarted: set[str] = set()
        # Jobs whose release failed (the store did not answer): still ours, maybe. Counted
        # when a later release (the orphan check, the drain) ends them, else at the end:
        # counted at the failure too, one job had two outcomes (unacked, then released).
        # By claim (`_copy`), with the release's refund and reason: repeated, a release
        # that landed is known by its reason (aq_job_v1's `repeated`), and its follow-up
        # (offering the job again) is redone.
        self._release_failed: dict[_Copy, tuple[Job, bool, str]] = {}
        # Threads reserving, or giving back the jobs they prefetched (`_work_loop`): a lost
        # session's close waits for them (`_await_acks`), or it gave those jobs back first,
        # their attempts charged.
        self._giving_back = 0
        # Claims (`_copy`) the lost session's drain counted unacked: a release of one
        # after (its renewal failing as the drain looked) counts it no more.
        self._counted: set[_Copy] = set()
        self._runners: set[_ChildRunner] = set()  # --pool process: the threads' handler processes
        self._warned: dict[str, float] = {}  # what `_warn_once` said already: when (time.monotonic)
        self._recover_at: dict[str, float] = {}  # list -> when `_recover_stalled` may try it again
        self._threads: list[threading.Thread] = []
        self._threads_died = False
        # The time limit, watched locally (the server's own limit is what decides):
        self._deadlines: dict[_Copy, float] = {}  # copy -> monotonic deadline of its running handler
        self._runner_of: dict[_Copy, threading.Thread] = {}  # copy -> the thread running it
        self._reserved_at: dict[str, tuple[Job, float]] = {}  # job name -> (it, monotonic time of its claim)
        # Keyed by the Thread itself: an ident is reused once its thread ends.
        self._prefetched: dict[threading.Thread, list[Job]] = {}  # jobs a thread holds, not started
        self._abandoned: set[int] = set()  # id() of jobs whose handler ran past the limit: result discarded
        self._retired: set[threading.Thread] = set()  # threads stuck in such a handler (replaced)
        self.queue.on_touch(self._touched)

    def request_stop(self, *_: Any) -> None:
        """Drain: finish what is in flight, take nothing new. From any thread, but not
        as a signal handler: install `on_signal` for that."""
        if not self._stopping.is_set():
            log.info("draining", extra={"event": "draining"})
        self._stopping.set()

    def on_signal(self, signum: int, frame: Any = None) -> None:
        """SIGTERM/SIGINT's handler: `request_stop`, made by the main thread at the next
        tick of its loop (0.2 s at most, and a reap or sweep under way ends early).

        Python runs a signal handler on the main thread between two of its bytecodes,
        and that thread may then be inside `_stopping.set()` or `.wait()`, holding the
        Event's lock, which is not reentrant: `request_stop` there waited for that lock
        for ever, and the worker never exited (the chaos test's SIGTERM as the worker
        began its drain on its own). A handler that only assigns takes no lock, and
        logs nothing either (a write to stderr interrupted there is not reentrant)."""
        self._signalled = True

    def _stop_asked(self) -> bool:
        """Asked to stop, though perhaps not acted on yet: a long reap or sweep ends early."""
        return self._signalled or self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        with self._in_flight_lock:
            return len(self._in_flight)

    # -- the loop ------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> int:
        """Work until stopped (SIGTERM/SIGINT or `request_stop`), the session is lost, or,
        with `until_complete`, every list is complete. Returns the process exit code.

        With `install_signals`, SIGTERM/SIGINT drain the worker while it runs and the
        previous handlers come back afterwards (for a host process that goes on)."""
        previous = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self.on_signal)
        try:
            # Opening the session may fail (the store down at start): the signal
            # handlers come back all the same, or the host would ignore SIGTERM for ever.
            self.session = session = Session.open(
                self.backend, interval_s=self.interval_s, expiry_s=self.expiry_s, on_beat=self.observer.heartbeat
            )
            try:
                if self.ack_linger_s > 0:
                    self.acks = AckBatcher(self.queue, self._ack_outcome, linger_s=self.ack_linger_s,
                                           lost=lambda: session.lost, too_big=self._too_big)
                log.info("worker started", extra={"event": "started", "session": session.id, "pid": os.getpid(),
                                                  "lists": self.lists, "concurrency": self.concurrency,
                                                  "batch": self.batch or "auto", "ack_linger_s": self.ack_linger_s})
                for _ in range(self.concurrency):
                    self._start_thread()
                self._maintain(session)
            finally:
                code = self._drain(session)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def _start_thread(self) -> None:
        t = threading.Thread(target=self._work, name=f"worker-{len(self._threads)}", daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self) -> None:
        assert self.session is not None
        session = self.session
        me = threading.current_thread()
        jobs: list[Job] = []  # reserved, not yet started (the watchdog may empty it)
        runner = _ChildRunner(self.handler) if self.pool == "process" else None
        if runner is not None:
            try:
                runner.start()  # before any claim: a child's start-up must not eat a job's time limit
            except _StartFailed as e:  # this thread cannot run a handler: it ends, said in the log
                log.error("a handler process could not start", extra={"event": "handler_start_failed", "error": str(e)})
                return
            with self._in_flight_lock:
                self._runners.add(runner)
        with self._in_flight_lock:
            self._prefetched[me] = jobs
        try:
            self._work_loop(session, me, jobs, runner)
        finally:
            if runner is not None:
                with self._in_flight_lock:
                    self._runners.discard(runner)
                runner.close()

    def _work_loop(self, session: Session, me: threading.Thread, jobs: list[Job], runner: _ChildRunner | None) -> None:
        while True:
            if me in self._retired:
                return  # replaced while stuck in a handler; its jobs went back then
            if self._stopping.is_set() or session.lost:
                with self._in_flight_lock:
                    left, jobs[:] = list(jobs), []
                    self._giving_back += 1  # a lost session's close waits for it (`_await_acks`)
                try:
                    self._release_unstarted(left, session)
                finally:
                    with self._in_flight_lock:
                        self._giving_back -= 1
                return
            if not jobs:
                with self._in_flight_lock:
                    self._giving_back += 1
                try:
                    got = self._reserve_any(session)
                    if not got:
                        continue
                    # The claims' limits run from the server's take, inside the call: from
                    # when it was sent, so that local deadlines (renewals, acks) are never late.
                    now = self._thread_state.asked
                    with self._in_flight_lock:
                        self._drop_stale_copies(me, got)
                        jobs.extend(got)
                        self._reserved_at.update((j.name, (j, now)) for j in got)
                finally:
                    with self._in_flight_lock:
                        self._giving_back -= 1
            with self._in_flight_lock:
                # Checked under the lock the drain takes its list of unstarted jobs
                # with: a reservation that came back after the stop (it was on its
                # way) starts nothing; the loop's top gives its jobs back.
                if not jobs or self._stopping.is_set() or session.lost:
                    continue
                job = jobs.pop(0)
                self._in_flight[_copy(job)] = job
                self._runner_of[_copy(job)] = threading.current_thread()
            try:
                outcome = self._run(job, session, runner)
            except _StartFailed as e:
                # Its handler process could not be started again (a deploy broke the
                # module, say): the job never ran. Given back with its attempt, not
                # failed one by one with every job after it; the thread ends.
                log.error("a handler process could not start", extra={"event": "handler_start_failed", "error": str(e)})
                with self._in_flight_lock:
                    left, jobs[:] = list(jobs), []
                self._release([job, *left], session, why=f"not started: {e}")
                return
            except AeroqueueError as e:  # the store failed mid-acknowledgement
                outcome = self._ack_failed(job, session, e)
            except BaseException:
                # The thread is dying (SystemExit or KeyboardInterrupt from a
                # handler...): give its jobs back rather than hold them under a
                # session that stays alive: the one it ran with its attempt counted,
                # the prefetched ones behind it (never started) refunded.
                self._release([job], session, refund=False)
                self._release(list(jobs), session)
                raise
            finally:
                with self._in_flight_lock:
                    abandoned = id(job) in self._abandoned
                    self._abandoned.discard(id(job))
                    # Unless the watchdog cleared it (a new claim may use the name); the
                    # drain, giving it back at its deadline, leaves that to this thread.
                    if self._in_flight.get(_copy(job)) is job:
                        self._forget(job)
            if abandoned:
                # Given up past its time limit, at the drain deadline, or with the session.
                log.warning("a handler returned after its job was given up: its result was discarded",
                            extra={"event": "late_result", "list": job.list, "token": job.token, "jid": job.jid})
                return  # the watchdog replaced this thread, or the worker stopped
            # "acking": `_ack_outcome` counts it once the ack is sent; "released": counted
            # as released when it was given back (`_ack_failed`).
            if outcome not in ("acking", "released"):
                self._count(job, outcome)

    def _run(self, job: Job, session: Session, runner: _ChildRunner | None = None) -> str:
        """Run one job and acknowledge it (one round trip); returns the outcome."""
        started = time.monotonic()
        reserved_at = self._reserved(job, started)
        if started - reserved_at > job.timeout_s / 4:
            # It waited in the prefetch for a good part of its limit: the limit runs
            # from the claim, so renew it before starting rather than lose the job.
            try:
                self.queue.touch(job)
            except ClaimLost:
                return "lost"
            except JobNotFound:
                # Its list was dropped while the job waited: nothing to run, nothing to give back.
                log.warning("job gone (its list was dropped): not started", extra={
                    "event": "claim_lost", "list": job.list, "token": job.token, "jid": job.jid})
                return "lost"
            except AeroqueueError as e:
                # The store failed: the job never started, so it goes back with its
                # attempt refunded (not as a failed acknowledgement, its attempt
                # counted: with one attempt allowed, it ended dead without running).
                log.warning("renewing a prefetched job's claim failed: given back", extra={
                    "event": "renew_failed", "list": job.list, "token": job.token, "jid": job.jid, "error": str(e)})
                self._release([job], session, why=f"not started: renewing its claim failed ({e})")
                # Counted where it is given back: by `_release`, or (the release failed too)
                # by the orphan check or the drain, refunded.
                return "released"
            reserved_at = started
        with self._in_flight_lock:
            self._deadlines[_copy(job)] = reserved_at + job.timeout_s
        if runner is not None:
            ok, value = runner.run(job, lambda: self._deadlines.get(_copy(job), 0.0), self.queue.touch)
            if ok is None:  # killed past the time limit
                self.observer.handler_duration(job.list, time.monotonic() - started)
                with self._in_flight_lock:
                    if id(job) in self._abandoned:  # given back at the drain deadline already
                        return "abandoned"
                    # No handler runs any more: what follows is an acknowledgement, which
                    # a worker whose session is lost lets finish (`_await_acks`).
                    self._runner_of.pop(_copy(job), None)
                return self._timed_out(job)
        else:
            ok, value = run_handler(job, self.handler)
        took = time.monotonic() - started
        self.observer.handler_duration(job.list, took)
        self._pace[job.list] = handler_pace(self._pace.get(job.list), took)
        with self._in_flight_lock:
            if id(job) in self._abandoned:
                return "abandoned"
            # Returned in time: the watchdog's no more. A slow ack past the limit is the
            # server's to refuse (ClaimLost), not a handler that timed out.
            self._runner_of.pop(_copy(job), None)
        if ok and self.acks is not None and not session.lost:
            # Sent with the next batch; held until then, so that no orphan check
            # gives back a claim whose ack is on its way.
            with self._in_flight_lock:
                self._acking[job.name] = self._acking.get(job.name, 0) + 1
            # Before its claim ends, whatever the linger: a late ack is refused.
            if self.acks.add(job, value, started, by=self._deadlines.get(_copy(job))):
                return "acking"
            self._unack(job.name)  # closed (draining past its deadline): acknowledged below, alone
        outcome = acknowledge(self.queue, job, ok, value, session)
        if outcome == "done":
            _log_done(job, started)
        return outcome

    def _reserve_any(self, session: Session) -> list[Job]:
        """Reserve from the next list the selector gives (weights, empty-list backoff);
        [] when it gave nothing (after a pause when no list may be polled yet)."""
        try:
            name = self.selector.pick()
        except AeroqueueError as e:  # reading the store's lists for a pattern failed
            log.warning("listing the lists failed", extra={"event": "lists_failed", "error": str(e)})
            name = None
        if name is None:
            self._stopping.wait(self.selector.wait_s())
            return []
        jobs: list[Job] = []
        found = False  # the list answered (jobs or none): it is there
        try:
            jobs = self._reserve(session, name)
            found = True
        except SessionLost:
            pass
        except ListNotFound as e:
            # Nothing to do until someone loads it (or, for a pattern's match, it was
            # dropped and the next refresh forgets it).
            self._warn_missing(name, e)
        except AeroqueueError as e:
            log.warning("reserve failed", extra={"event": "reserve_failed", "list": name, "error": str(e)})
        finally:
            # Whatever happened (even an unexpected error), the selector hears back: a
            # list it let one thread probe must not stay marked as being probed. No
            # pause on an empty answer: the selector skips that list for a while, and
            # the next pick goes to another list at once, or waits when none is ready.
            (self.selector.got if jobs else self.selector.empty)(name)
        if found and self._warned:  # there again, if empty: should it go missing again, say so again
            self._warned.pop(f"missing:{name}", None)
        if not jobs:
            return []
        self._hold(jobs)
        self.counters.add("reserved", len(jobs))
        self.observer.reserved(jobs[0].list, len(jobs))
        return jobs

    def _drop_stale_copies(self, me: threading.Thread, got: list[Job]) -> None:
        """The server gave out again a job another thread still has prefetched: that
        thread's claim ended (given back, expired, or undone by a node lost before it
        replicated), so its copy is stale. Running it would run the handler twice
        and end in a refused ack. Call with the lock held."""
        names = {j.name for j in got}
        for thread, theirs in self._prefetched.items():
            stale = [j for j in theirs if j.name in names] if thread is not me else []
            if stale:
                theirs[:] = [j for j in theirs if j.name not in names]
                log.warning("a prefetched job was given out again: its earlier copy is dropped",
                            extra={"event": "stale_prefetch", "jids": [j.jid for j in stale]})

    def _hold(self, jobs: list[Job]) -> None:
        with self._in_flight_lock:
            self._held.update((job.name, job) for job in jobs)

    def _unhold(self, jobs: list[Job]) -> None:
        with self._in_flight_lock:
            for job in jobs:
                if self._held.get(job.name) is job:
                    del self._held[job.name]

    def prefetch(self, list_name: str) -> int:
        """Jobs a thread reserves at a time from `list_name`: --prefetch when given,
        else about PREFETCH_HOLD_S of work at the handlers' recent pace on that list
        (DEFAULT_PREFETCH until one has run a job of it), between 1 and PREFETCH_MAX."""
        if self.batch is not None:
            return self.batch
        return prefetch_for(self._pace.get(list_name))

    def _following(self, lists: list[str]) -> None:
        """The selector's lists changed: the pace of a list no longer followed goes (a
        worker following a pattern for months meets a list per customer load)."""
        for name in set(self._pace) - set(lists):
            self._pace.pop(name, None)
        self.observer.following(lists)

    def _reserve(self, session: Session, name: str) -> list[Job]:
        asked = self._thread_state.asked = time.monotonic()
        try:
            n = self.prefetch(name)
            return self.queue.reserve(name, session, n, lease=self.lease and n >= LEASE_MIN)
        finally:
            self.observer.reserve_latency(name, time.monotonic() - asked)

    def _ack_outcome(self, job: Job, outcome: str, started: float) -> None:
        """What became of an ack sent by `acks`: logged as `acknowledge` would have, then settled."""
        if outcome == "done":
            _log_done(job, started)
        elif outcome == "lost":
            _log_claim_lost(job)
        elif outcome == "unacked":
            _log_unacked(job)
        self._settle(job, outcome)

    def _settle(self, job: Job, outcome: str) -> None:
        """A job whose ack went through `acks` is no longer held; counted as `_work` counts the others."""
        self._unack(job.name)
        if outcome == "failed":  # `acks` logged why
            assert self.session is not None
            outcome = self._ack_failed(job, self.session)
        if outcome == "released":
            return  # counted as released by `_release` (`_ack_failed`): once, as every reserved job
        self._count(job, outcome)

    def _count(self, job: Job, outcome: str) -> None:
        """One reserved job's outcome, in the counters and to the observer."""
        self.counters.add(_COUNTER_OF[outcome])
        self.observer.outcome(job.list, outcome)

    def _ack_failed(self, job: Job, session: Session, error: AeroqueueError | None = None) -> str:
        """The store failed mid-acknowledgement: the ack may or may not have landed. If
        the claim is still ours, the job goes back (its attempt counted) rather than
        stay held until this worker exits: a live session is never reaped. Counted by
        `_release` (or, its release failed too, by whatever gives it back later): its
        outcome is 'released', which `_settle` and `_work` count no further."""
        if error is not None:
            log.error("acknowledgement failed", extra={"event": "ack_failed", "jid": job.jid, "error": str(error)})
        self._release([job], session, refund=False)
        return "released"

    def _unack(self, name: str) -> None:
        with self._in_flight_lock:
            left = self._acking.get(name, 0) - 1
            if left > 0:
                self._acking[name] = left
            else:
                self._acking.pop(name, None)

    def _too_big(self, job: Job, why: str, started: float) -> None:
        """The store refused the handler's result as too big: fail the job instead
        (`acknowledge` logs what became of it)."""
        assert self.session is not None
        try:
            outcome = acknowledge(self.queue, job, False, why, self.session)
        except AeroqueueError as e:
            outcome = self._ack_failed(job, self.session, e)
        self._settle(job, outcome)

    def _release(self, jobs: list[Job], session: Session, *, refund: bool = True, why: str | None = None) -> int:
        """Give `jobs` back; this worker holds them no more. Returns how many it ended,
        each counted here once: released, or (without `refund`) dead, its last attempt
        spent; or lost: gone with its dropped list, or no longer held (a reaper or an
        operator took it: counted nowhere, a prefetched job buried before the drain
        left the counts one short). A release that fails is counted later, by the
        release that ends it (`_release_failed`).
        A lost session still gives back the claims it holds under its id: the release
        acts only on those, and a job never started goes back with its attempt (given
        back by the close, it was charged one: with one attempt allowed, dead unrun).
        Each job's hold ends just before its own release, not after the loop: released,
        a job may be reserved again at once by another thread, which holds it under the
        same name, and a late unhold would wipe that hold (the orphan check then gave the
        live claim away, and the job ran twice)."""
        why = why or ("worker draining" if refund else "acknowledgement failed")
        if session.closed:
            self._unhold(jobs)
            if session.lost:  # the lost session's close gave them back, and counted nothing
                self._count_unacked(jobs)
            return 0  # else given back, and counted, when it closed
        released = 0
        failed = False
        for job in jobs:
            self._unhold([job])
            if failed and session.lost:
                # A lost session's store failing (as it likely is): each release would
                # wait out its deadline, a drain of many jobs minutes long. The rest are
                # left to the close, and counted unacked at the end.
                with self._in_flight_lock:
                    self._release_failed[_copy(job)] = (job, refund, why)
                continue
            try:
                st = self.queue.release(job, why, refund=refund)
            except AeroqueueError as e:
                log.warning("release failed", extra={"event": "release_failed", "jid": job.jid, "error": str(e)})
                failed = True
                with self._in_flight_lock:
                    self._release_failed[_copy(job)] = (job, refund, why)
                    if refund:
                        self._unstarted.add(job.name)
                continue
            with self._in_flight_lock:
                self._release_failed.pop(_copy(job), None)
                counted = _copy(job) in self._counted
            released += 1
            if counted:
                continue  # counted unacked by the lost session's drain already
            if st == "released":
                self.counters.add("released")
                self.observer.released(job.list)
            elif st == "dead":
                self._count(job, "dead")
            else:
                if st == "missing":
                    # Its list was dropped: the job is gone, as an ack of it is refused ('lost').
                    log.warning("job gone (its list was dropped): nothing to give back", extra={
                        "event": "claim_lost", "list": job.list, "token": job.token, "jid": job.jid})
                else:  # 'not held': a reaper (its time limit, or the session's) or an operator took it
                    log.warning("claim lost: nothing to give back", extra={
                        "event": "claim_lost", "list": job.list, "token": job.token, "jid": job.jid})
                self._count(job, "lost")
        return released

    def _release_unstarted(self, jobs: list[Job], session: Session) -> None:
        """Give back jobs that never started, their attempts refunded, the session lost
        or not (`_release`)."""
        self._release(jobs, session)

    def _settle_release_failed(self, session: Session) -> list[Job]:
        """At the end: jobs whose release failed are given back once more, as first
        asked (same refund and reason: one that landed is known so, and its job offered
        again), each counted by that release, until one fails: the store fails again,
        and the rest would wait out a deadline each. Returns those left, uncounted: the
        close gives back what is still claimed (the caller counts the others unacked)."""
        with self._in_flight_lock:
            failed = list(self._release_failed.values())
        for job, refund, why in failed:
            self._release([job], session, refund=refund, why=why)
            with self._in_flight_lock:
                if _copy(job) in self._release_failed:
                    break  # the store fails again: the rest are not tried either
        with self._in_flight_lock:
            left, self._release_failed = [job for job, _, _ in self._release_failed.values()], {}
        return left

    def _count_unacked(self, jobs: list[Job]) -> None:
        with self._in_flight_lock:
            jobs = [job for job in jobs if _copy(job) not in self._counted]
            self._counted.update(_copy(job) for job in jobs)
        for job in jobs:
            self.counters.add("unacked")
            self.observer.outcome(job.list, "unacked")

    def _maintain(self, session: Session) -> None:
        """Reap and sweep on their schedules, each in a thread of its own (`_Background`),
        until told to stop; a reap or sweep under way is stopped (it ends early: the next
        one does the rest) and waited for."""
        lists = JobLists(self.backend)
        ended = threading.Event()
        reaper, sweeper = _Background("reap"), _Background("sweep")
        try:
            self._maintenance_loop(session, lists, reaper, sweeper,
                                   stop=lambda: ended.is_set() or session.lost or self._stop_asked())
        finally:
            ended.set()
            reaper.close()
            sweeper.close()

    def _maintenance_loop(self, session: Session, lists: JobLists, reaper: _Background, sweeper: _Background, *,
                          stop: Callable[[], bool]) -> None:
        next_reap = time.monotonic() + self.reap_every_s * random.uniform(0.5, 1.0)
        next_check = time.monotonic()  # --until-complete: status reads every bitmap, so not every tick
        next_sweep = time.monotonic() + self.sweep_every_s * random.uniform(0.5, 1.0)
        sweep_grace_ms = self.sweep_grace_ms
        # The regular sweep is the store's, not this worker's: it runs only once this
        # worker wins the sweep gate (`claim_sweep`), so the store is swept about every
        # --sweep-every whatever the number of workers. Until `gate_held` (monotonic) a
        # sweep that failed after winning runs again without asking the gate (it closed
        # for this interval when this worker won it). `targeted`: the sweep after a
        # reap that ended a session, which asks no gate, or after a lost take answer,
        # whose reap asked it already (`_lost_take_grace`).
        gate_held = 0.0
        targeted = False
        swept = _SweepRun(sweep_grace_ms, targeted)  # the last sweep started
        after_reap: float | None = None  # monotonic end of a reap whose sweep has yet to ask the gate
        while not self._stopping.wait(min(0.2, self.reap_every_s)):
            if self._signalled:
                self.request_stop()
                return
            if session.lost:
                log.error("session lost: stopping", extra={"event": "session_lost", "session": session.id})
                return
            if not any(t.is_alive() for t in self._threads):
                if self._stop_asked():
                    # They ended because asked to: a stop that came after this loop's
                    # wait, this thread descheduled meanwhile (seen in CI: five workers
                    # stopped at once, one exited 4 as if its threads had crashed).
                    return
                log.error("every worker thread has died: stopping", extra={"event": "threads_died"})
                self._threads_died = True
                return
            now = time.monotonic()
            try:
                if self.pool == "thread":
                    self._watch(session)
                self._renew_prefetched()
                reaped = reaper.ended()
                if reaped is not None and not reaped.failed:
                    report, lost_grace, reaped_at = reaped.value
                    if lost_grace is not None:
                        # Jobs of a take whose answer was lost (`_lost_take_grace`): the
                        # gate is won, for a sweep that begins after any reap below too.
                        next_sweep = now
                        sweep_grace_ms = min(sweep_grace_ms, lost_grace)
                        targeted, after_reap = True, None
                    if report.ended:
                        # A dead reserver may also have taken jobs it never claimed (killed
                        # between a take and its claim): no session holds them, so only a
                        # sweep finds them, up to --sweep-every plus --sweep-grace later
                        # (over 6 minutes by default). Sweep now, and count a job as lost
                        # once untouched for half the dead session's expiry: its last
                        # heartbeat is a whole expiry old, and its last take at most a
                        # heartbeat interval (under half the expiry) younger; a live
                        # reserver claims within milliseconds (a job of one offered anyway
                        # is claimed once: the second claim is refused, a wasted take,
                        # never a double hold). Only the reaper that ended the session:
                        # every worker whose reap took it up half-done would scan the job
                        # set too. And only if no other worker's sweep has begun since the
                        # reap (`claim_sweep_after`): when a host's workers die together,
                        # the workers that reap them would each scan the store; it begins
                        # POST_REAP_SETTLE_S after the reap, so that those reaps end first.
                        sweep_grace_ms = report.sweep_grace_ms(sweep_grace_ms)
                        if not targeted or after_reap is not None:  # else a won gate covers it
                            next_sweep = min(next_sweep, reaped_at + POST_REAP_SETTLE_S)
                            after_reap = reaped_at  # the latest: a sweep after it is after the others
                        targeted = True
                if now >= next_reap and not reaper.busy:
                    # One that fails (logged) runs again at its next turn.
                    reaper.start(functools.partial(self._reap, session, stop))
                    next_reap = now + self.reap_every_s * random.uniform(0.8, 1.2)
                done = sweeper.ended()
                if done is not None and done.failed:
                    # One that failed (a scan refused while partitions migrate) runs again
                    # a reap interval later, for what it was for (its grace; the gate it
                    # won, still held); not at the next tick: a node failure sets off
                    # reaps, and so sweeps, in many workers at once, and each would scan
                    # the job set five times a second until the store serves again.
                    next_sweep = min(next_sweep, now + min(self.reap_every_s, self.sweep_every_s) * random.uniform(0.8, 1.2))
                    sweep_grace_ms = min(sweep_grace_ms, swept.grace_ms)
                    targeted = targeted or swept.targeted
                elif done is not None and not swept.targeted:
                    gate_held = 0.0
                if now >= next_sweep and not sweeper.busy and after_reap is not None:
                    # Measured now, not at the tick's start: the server measures the gate's
                    # age when the claim reaches it, and a tick that took a while made a
                    # sweep begun since the reap look older than the reap.
                    since_ms, after_reap = int((time.monotonic() - after_reap) * 1000), None
                    if not claim_sweep_after(self.backend, since_ms, sweep_grace_ms, session.id):
                        # Served by another worker's sweep, begun since the reap.
                        next_sweep = now + self.sweep_every_s * random.uniform(0.8, 1.2)
                        sweep_grace_ms = self.sweep_grace_ms
                        targeted = False
                        continue
                if now >= next_sweep and not sweeper.busy:
                    ours = targeted or now < gate_held
                    if not ours:
                        ours = claim_sweep(self.backend, self.sweep_every_s, session.id, grace_ms=sweep_grace_ms)
                        if ours:
                            gate_held = now + self.sweep_every_s
                        else:
                            # Another worker's sweep began less than an interval ago: try
                            # again once the gate opens, spread over a fifth of an interval
                            # so that the losers do not all reach the gate record at once.
                            wait = sweep_gate_wait(self.backend, self.sweep_every_s)
                            next_sweep = now + wait + self.sweep_every_s * random.uniform(0.0, 0.2)
                    if ours:
                        swept = _SweepRun(sweep_grace_ms, targeted)
                        sweeper.start(functools.partial(sweep, self.backend, grace_ms=sweep_grace_ms, stop=stop))
                        next_sweep = now + self.sweep_every_s * random.uniform(0.8, 1.2)
                        sweep_grace_ms = self.sweep_grace_ms
                        targeted = False
                if self.until_complete and now >= next_check:
                    # At most a second after the last job: not the reap interval (half
                    # the expiry), which kept a worker with --expiry 60 idle for 30 s.
                    next_check = now + min(self.reap_every_s, UNTIL_COMPLETE_CHECK_S)
                    if self._all_complete(lists):
                        log.info("every list is complete", extra={"event": "lists_complete"})
                        return
            except AeroqueueError as e:
                log.warning("maintenance failed", extra={"event": "maintenance_failed", "error": str(e)})

    def _reap(self, session: Session, stop: Callable[[], bool]) -> tuple[ReapReport, int | None, float]:
        """A reap, then this worker's orphan check and its look at the lost-take mark
        (`_lost_take_grace`), whose grace it returns with the reap's report: in the
        reaper's thread (`_maintain`)."""
        try:
            report = reap(self.backend, stop=stop)
        except AeroqueueError as e:
            done = e.reaped
            if done is None or not done.ended:
                raise
            # The sessions it ended before the error are gone: no later reap would set
            # off the sweep for what they took and never claimed. Go on with what it did;
            # the rest is the next turn's.
            log.warning("maintenance failed", extra={"event": "maintenance_failed", "error": str(e)})
            report = done
        reaped_at = time.monotonic()
        if report.sessions:
            self.counters.add("reaped", report.sessions)
        # Not while stopping: the drain gives back every claim the session holds.
        if stop():
            return report, None, reaped_at
        # Neither step's failure (an index query refused while partitions migrate) may
        # fail the task: the report would be lost with it, and a session the reap ended
        # never swept after. Each is tried again at the next turn.
        try:
            self._release_orphans(session)
        except AeroqueueError as e:
            log.warning("maintenance failed", extra={"event": "maintenance_failed", "error": str(e)})
        try:
            return report, self._lost_take_grace(session), reaped_at
        except AeroqueueError as e:
            log.warning("maintenance failed", extra={"event": "maintenance_failed", "error": str(e)})
            return report, None, reaped_at

    def _lost_take_grace(self, session: Session) -> int | None:
        """The grace (ms) of a sweep for the jobs of takes whose answers were lost, when
        one is due and this worker won the gate for it; else None. The grace is the
        last lost answer's age: those jobs were last written before it."""
        due = lost_take_due(self.backend)
        if due is None or due.age_ms < LOST_TAKE_SETTLE_MS:
            return None
        if not claim_sweep(self.backend, LOST_TAKE_SWEEP_EVERY_S, session.id, grace_ms=due.age_ms, mark=due.mark):
            return None
        return due.age_ms

    def _renew_prefetched(self) -> None:
        """Prefetched jobs wait claimed while their thread works: their time limit runs
        from the claim, so renew it (a touch) once half of it has passed, rather than
        let a long job ahead of them time them out before they start."""
        now = time.monotonic()
        with self._in_flight_lock:
            waiting = [j for jobs in self._prefetched.values() for j in jobs
                       if now - self._reserved(j, now) > j.timeout_s / 2]
        for job in waiting:
            sent = time.monotonic()  # the renewed limit runs from the server's touch, after this
            try:
                self.queue.touch(job)
            except (ClaimLost, JobNotFound):
                # Its thread finds out when it starts it. Not a maintenance failure: a job
                # of a dropped list waiting behind a long handler would skip the reaps and
                # the --until-complete checks at every tick until then.
                continue
            with self._in_flight_lock:
                if self._reserved_at.get(job.name, (None,))[0] is job:
                    self._reserved_at[job.name] = (job, sent)

    def _await_acks(self, give_up: float) -> None:
        """Wait, until `give_up` (monotonic), for the threads acknowledging a job (in
        flight, its handler returned) or giving back the jobs they prefetched: a lost
        session's close, first, gave those back with their attempts charged."""
        while time.monotonic() < give_up:
            with self._in_flight_lock:
                if not self._giving_back and all(copy in self._runner_of for copy in self._in_flight):
                    return
            time.sleep(0.01)

    def _forget(self, job: Job) -> None:
        """A job's claim is over for this worker (call with the lock held, `job` in
        flight). Its hold and claim time go only if they are this copy's, not those of
        another thread that reserved the job again since (`_held`)."""
        name, copy = job.name, _copy(job)
        self._in_flight.pop(copy, None)
        self._deadlines.pop(copy, None)
        self._runner_of.pop(copy, None)
        if self._held.get(name) is job:
            del self._held[name]
        if self._reserved_at.get(name, (None,))[0] is job:
            del self._reserved_at[name]

    def _reserved(self, job: Job, default: float) -> float:
        """When this copy of `job` was claimed (monotonic), or `default`."""
        entry = self._reserved_at.get(job.name)
        return entry[1] if entry is not None and entry[0] is job else default

    def _touched(self, job: Job, seconds: float) -> None:
        with self._in_flight_lock:
            if _copy(job) in self._deadlines:
                self._deadlines[_copy(job)] = time.monotonic() + seconds

    def _watch(self, session: Session) -> None:
        """Thread mode's watchdog: stop waiting for handlers past their time limit."""
        now = time.monotonic()
        with self._in_flight_lock:
            overdue = [self._in_flight[copy] for copy, dl in self._deadlines.items()
                       if now > dl and copy in self._in_flight]
        for job in overdue:
            with self._in_flight_lock:
                thread = self._runner_of.get(_copy(job))
                if thread is None or self._in_flight.get(_copy(job)) is not job:
                    continue  # it finished meanwhile
                self._abandoned.add(id(job))
                self._forget(job)
                self._retired.add(thread)
                left = self._prefetched.pop(thread, [])
                waiting, left[:] = list(left), []
            # Its prefetched jobs never started: back, attempt refunded.
            self._release(waiting, session, why=f"not started: job {job.jid!r} ahead of it ran past its time limit")
            self._count(job, self._timed_out(job))
            if not self._stopping.is_set():
                self._start_thread()  # the stuck thread's place: concurrency stays

    def _timed_out(self, job: Job) -> str:
        """End a claim past its time limit, as a failed attempt; returns 'dead' if that was
        its last attempt (counted and observed as any dead job: an alert on dead jobs
        missed every job its time limit killed), else 'timed_out'."""
        st = "early"
        for _ in range(50):  # the server's clock may lag ours by a little: its limit decides
            try:
                st = self.queue.expire(job)
            except AeroqueueError as e:
                log.warning("ending a timed-out claim failed", extra={"event": "expire_failed", "jid": job.jid,
                                                                      "error": str(e)})
                break  # the reaper ends it
            if st != "early":
                break
            time.sleep(0.1)
        if st not in ("retry", "delayed", "dead") and self._died_of_this_attempt(job):
            st = "dead"  # a reaper (this worker's own, maybe) ended the overdue claim first
        log.warning("handler timed out", extra={"event": "timed_out", "list": job.list, "token": job.token,
                                                "jid": job.jid, "limit_s": job.timeout_s, "outcome": st})
        return "dead" if st == "dead" else "timed_out"

    def _died_of_this_attempt(self, job: Job) -> bool:
        """The job is dead with the attempt this worker ran (of this list, not one loaded
        again under its name)."""
        try:
            rec = self.backend.get(keys.JOB_SET, job.name, bins=["state", "att", "c"])
        except AeroqueueError:
            return False  # counted as timed out: the store's counts are the truth
        return (rec is not None and rec.bins.get("state") == "dead" and rec.bins.get("att") == job.attempt
                and (job.created is None or rec.bins.get("c") == job.created))

    def _all_complete(self, lists: JobLists) -> bool:
        """--until-complete: every named list is complete, and so is every list each
        pattern matches now, a pattern matching at least one (a pattern that matches
        nothing yet waits for its lists to be loaded)."""
        followed = self.selector.refresh()
        unmatched = [p for p, found in self.selector.pattern_matches().items() if not found]
        for pattern in unmatched:
            self._warn_once(f"pattern:{pattern}", "no list matches the pattern yet: waiting for one to be loaded",
                            {"event": "pattern_unmatched", "pattern": pattern})
        if unmatched:
            return False
        complete = True
        for name in followed:
            # Done and dead counts only (the bitmaps); the whole status (which also
            # marks the list complete) once they say so.
            try:
                head, done, dead = lists.finished(name)
            except ListNotFound as e:
                # Not loaded yet, or dropped (a new load may bring it back): it is not
                # complete. Said as a reservation says it.
                complete = False
                self._warn_missing(name, e)
                continue
            self._warned.pop(f"missing:{name}", None)
            if is_complete(head, done, dead) and lists.status(name).complete:
                continue
            complete = False
            total = head["total"]
            if head.get("pend") and done + dead == total:
                self._recover_stalled(lists, name)
            if head["sealed"] != 1 and total and done + dead == total:
                # A load without --seal may be followed by more loads: the list is not
                # complete, and this worker would wait for ever with no word why.
                self._warn_once(f"unsealed:{name}", "every job of the list is done or dead, but it is not sealed: it "
                                "is complete once sealed (aeroqueue seal LIST, or load --seal)",
                                {"event": "list_unsealed", "list": name, "total": total})
        return complete

    def _recover_stalled(self, lists: JobLists, name: str) -> None:
        """Every published job is done or dead and a load range is still pending: a
        loader that died mid-range (SIGKILL) holds the list short of complete. Its range
        is finished here once its lease has run out (`JobLists.recover`, which leaves a
        live loader's alone), not at the next sweep, minutes later. At most every
        RECOVER_EVERY_S a list."""
        now = time.monotonic()
        if now < self._recover_at.get(name, 0.0):
            return
        self._recover_at[name] = now + RECOVER_EVERY_S
        try:
            finished = lists.recover(name)
        except AeroqueueError as e:
            log.warning("finishing a dead loader's load range failed; a later check or sweep tries again",
                        extra={"event": "load_recover_failed", "list": name, "error": str(e)})
            return
        if finished:
            log.info("finished the load range(s) of a loader that died", extra={
                "event": "load_recovered", "list": name, "ranges": finished})

    def _warn_missing(self, name: str, e: ListNotFound) -> None:
        """A followed list is not there: said once a MISSING_AGAIN_S, not every poll (said
        once only, a mistyped --list left a worker idle without a word)."""
        self._warn_once(f"missing:{name}", "list not found", {"event": "list_missing", "error": str(e)},
                        again_s=MISSING_AGAIN_S)

    def _warn_once(self, key: str, message: str, extra: dict[str, Any], *, again_s: float | None = None) -> None:
        """A warning the first time `key` comes up: what a worker meets at every poll
        or check (a missing list, an unsealed one) is said once, not once a second;
        with `again_s`, again once that long has passed."""
        now = time.monotonic()
        said = self._warned.get(key)
        if said is None or (again_s is not None and now - said >= again_s):
            self._warned[key] = now
            log.warning(message, extra=extra)

    def _release_orphans(self, session: Session) -> None:
        """Give back claims of our session that no thread works on. A claim whose answer
        was lost (a node died mid-call, and the retries ran out), or a release that
        failed after a failed acknowledgement, leaves such a claim: nobody would ever
        finish it, and no reaper takes jobs from a live session. A claim found orphaned
        at two checks in a row (a reap interval apart), with every reservation under
        way at the first ended since, cannot be one a thread is still picking up, and
        is released with its attempt counted. A reservation's claims are a thread's
        only once it returns, which can be seconds after they land (a busy list record
        retried, a claim in doubt): released then, the job still ran, its ack was
        refused, and with one attempt allowed it ended dead though it succeeded."""
        held = dict(session.held())
        # Read after the claims: a reservation that made one of them and has not returned
        # is among these.
        under_way = session.claims_under_way()
        with self._in_flight_lock:
            orphans = set(held) - self._held.keys() - self._acking.keys()
            self._unstarted &= held.keys()  # given back since by someone else: forgotten
            unstarted = set(self._unstarted)
        # A claim is its job's name and request id: the job claimed again since (given
        # back and reserved anew between two checks) is another claim, seen anew.
        claims = {(name, held[name].get("rid")) for name in orphans}
        seen = self._orphans
        ripe = {claim for claim in claims if claim in seen and not seen[claim] & under_way}
        # The others wait, each with the reservations under way when it was first seen.
        self._orphans = {claim: seen.get(claim, under_way) for claim in claims - ripe}
        for name, _ in sorted(ripe):
            bins = held[name]
            job = Job(list=bins["list"], token=bins["token"], jid=bins["jid"], payload=None, rid=bins.get("rid", ""),
                      attempt=bins.get("att", 0), session=session.id, created=bins.get("c"))
            log.warning("orphaned claim released", extra={"event": "orphan_released", "list": job.list,
                                                          "token": job.token, "jid": job.jid})
            with self._in_flight_lock:
                failed = self._release_failed.get(_copy(job))
            if failed is not None:  # repeated as first asked: one that landed is known by its reason
                _, refund, why = failed
                self._release([job], session, refund=refund, why=why)
            else:
                self._release([job], session, refund=name in unstarted,
                              why="not started: an earlier release failed" if name in unstarted else None)

    def _drain(self, session: Session) -> int:
        self._stopping.set()
        deadline = time.monotonic() + self.drain_timeout_s
        # Jobs prefetched behind a running handler never started: back at once (their
        # threads would give them back only once that handler ends, up to the deadline).
        with self._in_flight_lock:
            unstarted = [j for jobs in self._prefetched.values() for j in jobs]
            for jobs in self._prefetched.values():
                jobs[:] = []
        self._release_unstarted(unstarted, session)
        # A lost session's handlers are not waited for: their acks would not be sent,
        # and the reaper has given their jobs to others already.
        while time.monotonic() < deadline and not session.lost:
            if self.pool == "thread":
                # A handler past its time limit is not waited for: its thread is retired.
                try:
                    self._watch(session)
                except AeroqueueError as e:
                    log.warning("time limit check failed", extra={"event": "watch_failed", "error": str(e)})
            waiting = [t for t in self._threads if t.is_alive() and t not in self._retired]
            if not waiting:
                break
            waiting[0].join(min(0.1, max(0.0, deadline - time.monotonic())))
        # The acks of what finished go out before the session closes (or, if it was
        # lost, end unacked). A handler still running past this acknowledges alone. They
        # get at least the time an ack may stay in doubt (`Queue.busy_deadline_s`) and a
        # second, past the drain deadline if need be: closed sooner, the session gave back
        # the claims of jobs whose handlers had succeeded, their attempts refunded, and
        # they ran again (with one attempt allowed, for ever at each stop).
        ack_wait = max(self.queue.busy_deadline_s + 1.0, deadline - time.monotonic())
        if self.acks is not None and not self.acks.close(ack_wait):
            log.warning("acknowledgements still pending at the drain deadline", extra={"event": "ack_timeout"})
        if not session.lost:
            # Ask the server, not the last heartbeat: a process paused past its
            # expiry (SIGSTOP, a long GC) may stop before its heartbeat thread
            # has run, and its session may be gone.
            try:
                session.beat()
            except Exception as e:  # any: the drain goes on to close the session (its heartbeat thread's rule)
                log.warning("last heartbeat failed", extra={"event": "heartbeat_failed", "error": f"{type(e).__name__}: {e}"})
        if session.lost:
            # An acknowledgement under way (sent before the session was known lost) may
            # have ended its claim and not offered the job yet: its thread is the only
            # one that will, the transition having marked the job offered
            # (`transitions.holder_mark`: a reaper's recount leaves it). It is let finish.
            self._await_acks(time.monotonic() + LOST_ACK_WAIT_S)
            # Jobs a reservation brought back after the drain's first look: given back
            # here, refunded, before the close would give them back charged.
            with self._in_flight_lock:
                late = [j for jobs in self._prefetched.values() for j in jobs]
                for jobs in self._prefetched.values():
                    jobs[:] = []
            self._release_unstarted(late, session)
            # The handlers still running are not waited for: their jobs end here, unacked
            # (their threads discard what comes back, as at the drain deadline), not
            # after the last count was logged, or never, the process gone by then.
            with self._in_flight_lock:
                running = [job for copy, job in self._in_flight.items() if copy in self._runner_of]
                self._abandoned.update(id(job) for job in running)
            self._count_unacked(running)
            # Handler processes ignore SIGTERM, which is how Python ends daemonic
            # children at exit: it would wait for a hung one for ever.
            self._stop_runners()
            # Those whose release failed twice: the close gives them back (charged), its
            # count no worker's: unacked.
            self._count_unacked(self._settle_release_failed(session))
            session.close(release=False)
            log.error("exiting: session lost", extra={"event": "stopped", "session": session.id, **self.counters.snapshot()})
            return EXIT_SESSION_LOST
        with self._in_flight_lock:
            # Only jobs whose handler still runs: one that returned is its thread's to
            # acknowledge. Their threads discard whatever the handlers return (`_run`):
            # given back here and counted released, a handler process that died of
            # `_stop_runners` below had its job failed too (refused: counted lost),
            # and a thread's late return counted it unacked: one job, two outcomes.
            stuck = [job for copy, job in self._in_flight.items() if copy in self._runner_of]
            self._abandoned.update(id(job) for job in stuck)
        if stuck:
            # Past the deadline: give these back now; their handlers' late acks will be
            # refused. Their attempt counts (they ran), so a job that always hangs ends.
            log.warning("drain deadline passed", extra={"event": "drain_timeout", "in_flight": len(stuck)})
            self._release(stuck, session, refund=False, why=f"the worker stopped: its {self.drain_timeout_s:g} s drain "
                                                              "deadline passed with the job still running")
            # Their handler processes ignore SIGTERM (a signal to the process group
            # must not kill them mid-job), which is also how Python ends daemonic
            # children at exit: it would wait for them. They end here.
            self._stop_runners()
        try:
            self.queue.flush()
        except AeroqueueError as e:  # the reaper's recount sets them if this process cannot
            log.warning("writing completion bits failed", extra={"event": "bits_failed", "error": str(e)})
        left = self._settle_release_failed(session)
        self.counters.add("released", session.close(release=True))
        for list_name, n in session.released_at_close.items():  # the metrics too, by list
            self.observer.released(list_name, n)
        # Counted by the close if it gave them back; else (ended by someone else since,
        # or the close failed) their fate is not this worker's to know: unacked.
        self._count_unacked([job for job in left if job.name not in session.ended_at_close])
        log.info("worker stopped", extra={"event": "stopped", "session": session.id, **self.counters.snapshot()})
        return EXIT_THREADS_DIED if self._threads_died else EXIT_OK


    def _stop_runners(self) -> None:
        with self._in_flight_lock:
            runners = list(self._runners)
        for runner in runners:
            runner.stop_now()


# Signals a handler process ignores: the worker's to act on (it drains).
_CHILD_IGNORES = {signal.SIGINT, signal.SIGTERM}


class _StartFailed(Exception):
    """A handler process did not start (its module no longer imports, fork failed):
    not a store error, so no job is acknowledged, failed or charged an attempt for it."""


class _KilledStarting(_StartFailed):
    """A handler process was killed by a signal while it started (the OOM killer, an
    operator's `kill -9`): something from outside, unlike a module that no longer imports."""


# Starts of one handler process tried in a row when each is killed by a signal. The
# thread ending at the first one cost the worker that much of its concurrency for
# good, and its last thread exited it with status 4, a bug's; a module that no longer
# imports exits instead, and is not tried again (each try would fail alike).
START_TRIES = 3


class _ChildRunner:
    """Runs one worker thread's handlers in a child process (``pool="process"``), one
    job at a time; kills the child when a job runs past its time limit, and starts
    a new one for the next job. Spawned, not forked: the parent has threads (the
    store client's among them), which a fork would copy mid-flight."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.proc: Any = None
        self.conn: Any = None
        self.stopped = False  # `stop_now` was called: the worker is stopping, nothing is started again

    def start(self, timeout_s: float = 120.0) -> None:
        """Start a child and wait until it has imported what it needs; one killed by a
        signal meanwhile is started again, up to `START_TRIES` in a row."""
        for tries in range(1, START_TRIES + 1):
            try:
                self._start_once(timeout_s)
                return
            except _KilledStarting as e:
                if tries == START_TRIES or self.stopped:
                    raise
                log.warning("a handler process was killed while starting: starting another", extra={
                    "event": "handler_start_retried", "error": str(e), "try": tries})

    def _start_once(self, timeout_s: float) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_child_main, args=(self.handler, child, os.getpid(), logs.configured()),
                                daemon=True, name="aeroqueue-handler")
        # The child ignores SIGINT and SIGTERM once it runs `_child_main`; before that
        # (Python starting, imports: most of a second) a Ctrl-C or a SIGTERM to the
        # process group would kill it mid-import. It starts with them blocked (a signal
        # mask is inherited through fork and exec), and unblocks them once ignored.
        # (The resource tracker first: starting it unblocks these signals in this thread.)
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _CHILD_IGNORES)
        try:
            self.proc.start()
        except OSError as e:  # fork or exec refused (ENOMEM, EAGAIN)
            self.proc = None
            raise _StartFailed(f"a handler process could not be started: {e}") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child.close()
        self.conn = parent
        if not parent.poll(timeout_s):
            self.kill()
            raise _StartFailed(f"a handler process did not start within {timeout_s:g} s")
        try:
            parent.recv()  # ("ready",)
        except (EOFError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.kill()  # if it lingers (a thread its imports started), it must not outlive this
            failed = _KilledStarting if code is not None and code < 0 else _StartFailed
            raise failed(f"a handler process died while starting (exit code {code})") from None

    def run(self, job: Job, deadline: Callable[[], float], touch: Callable[[Job, float | None], float]) -> tuple[bool | None, Any]:
        """(ok, value) as `run_handler` gives, or (None, None) when the job ran past
        `deadline()` (monotonic; it moves when the handler touches) and was killed."""
        if self.proc is None or not self.proc.is_alive():
            self.start()
        try:
            self.conn.send(job)  # pickled without its queue's `touch` (`Job.__reduce__`)
        except OSError:  # it died since the check (BrokenPipeError): the job never reached it
            return self._died()
        while True:
            remaining = deadline() - time.monotonic()
            if remaining <= 0:
                self.kill()
                # Started again now (the thread's next job is claimed already); if it
                # cannot be, the next `run` says so, and this job still timed out.
                with contextlib.suppress(_StartFailed):
                    self.start()
                return None, None
            if not self.conn.poll(min(remaining, 0.25)):
                if not self.proc.is_alive():
                    code = self.proc.exitcode
                    self.proc = None
                    return False, f"the handler's process died (exit code {code})"
                continue
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                self.kill()
                return False, "the handler's process died"
            if msg[0] == "touch":
                try:
                    answer: tuple[Any, ...] = ("ok", touch(job, msg[1]))
                except AeroqueueError as e:
                    answer = ("lost", str(e))
                except (TypeError, ValueError) as e:  # a bad argument: the handler's error, raised in it
                    answer = ("bad", type(e).__name__, str(e))
                try:
                    self.conn.send(answer)
                except OSError:  # it died while the touch was on its way (BrokenPipeError)
                    return self._died()
                continue
            return msg[1], msg[2]

    def _died(self) -> tuple[bool, str]:
        """The handler process is gone: its job fails as any handler death does."""
        proc, self.proc = self.proc, None
        code = None
        if proc is not None:
            proc.join(5)
            code = proc.exitcode
        return False, f"the handler's process died (exit code {code})"

    def stop_now(self) -> None:
        """Kill the handler process from another thread: the thread that owns this runner
        finds it dead at its next poll (its job fails as 'the handler's process died')."""
        self.stopped = True
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.kill()

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
            self.proc = None

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
            self.proc.join(2)
            if self.proc.is_alive():
                self.kill()


def _die_with_parent(parent_pid: int) -> None:
    """End this handler process once its worker is gone (SIGKILL, the OOM killer): its
    session expires and the job runs again elsewhere, and this one would go on beside
    it, for ever if it hangs (nobody is left to kill it at its time limit).

    On Linux the kernel sends SIGKILL when the worker's thread that started this
    process ends (PR_SET_PDEATHSIG; that thread owns it, and ends it first when it
    stops): that holds even while a handler keeps the GIL in C code (a regular
    expression gone exponential). A thread polling the parent's pid is the fallback
    elsewhere, and for a worker that died before the request was made."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="aeroqueue-parent-watch", daemon=True).start()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def _child_main(handler: Handler, conn: Any, parent_pid: int | None = None, logging_as: tuple[str, str] | None = None) -> None:
    """A handler process: run the jobs the parent sends, send back each outcome.
    `logging_as`: the worker's `configure_logging` (format, level), for the handler's
    own log lines to be the worker's (JSON, when its are): a spawned process starts
    with no logging set up, and printed them as bare text, warnings only."""
    if parent_pid is not None:
        _die_with_parent(parent_pid)
    if logging_as is not None:
        logs.configure_logging(*logging_as)
    # Ctrl-C, and a SIGTERM sent to the process group (systemd's default, `kill --
    # -PGID`), reach the children too: the parent drains, and lets running jobs
    # finish up to its --drain-timeout; it ends a child itself (SIGKILL, or closing
    # the pipe).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _CHILD_IGNORES)  # blocked while it started (`_ChildRunner.start`)
    conn.send(("ready",))

    def touch(job: Job, seconds: float | datetime.timedelta | None) -> None:
        conn.send(("touch", seconds))
        answer = conn.recv()
        if answer[0] == "bad":
            raise (TypeError if answer[1] == "TypeError" else ValueError)(answer[2])
        if answer[0] != "ok":
            raise ClaimLost(answer[1])

    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        # On this process's main thread, but it is not a host program's: sys.exit and
        # KeyboardInterrupt in the handler fail the job, as they do in a thread.
        ok, value = run_handler(dataclasses.replace(job, toucher=touch), handler, propagate=False)
        try:
            conn.send(("result", ok, value))
        except Exception as e:  # a value that does not pickle: that is the job's failure
            conn.send(("result", False, f"the handler's result cannot be sent back: {e}"))
