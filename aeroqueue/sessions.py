"""Sessions, reaping and sweeping: a job reserved by a process that died comes back.

- A process opens a session; a background thread heartbeats it (the server
  stores its own now in ``beat``) and closes it on graceful shutdown,
  giving back what it holds. A heartbeat that finds the session gone or being
  reaped marks it lost: the process stops taking work and acknowledges
  nothing it held.
- Claims are made under a session. Each claimed job carries the session id
  in its ``sess`` bin, which has a secondary index, so the reaper finds a dead
  session's claims without scanning every job.
- Leases (``Queue.reserve(..., lease=True)``, the worker's batches) are listed
  in the session record itself, one entry per batch, and forgotten once every
  job of the batch is acknowledged. The reaper turns a dead session's leases,
  and a live one's past their time limit, into claims of that session
  (`claim_leases`), which it then recovers as any claim.
- The reaper (in every worker, and ``aeroqueue reap``) finds sessions whose
  last heartbeat is older than their expiry by the server's clock, moves them
  ``alive -> reaping`` with a generation check, releases each of their claims
  (only if still held by that session) onto the retry store, then deletes the
  session. Each step is idempotent; a half-done reap is finished by the next.
  On the embedded store a writer holds the store's lock in its own process:
  one stopped inside a write (SIGSTOP, Ctrl-Z) holds every heartbeat back, so
  its hold is credited to every live session when it commits
  (`backends.holds`).
- The sweeper (``aeroqueue sweep``, and rarely inside workers) catches what
  slipped through: jobs taken from the token store but never claimed, claims
  of sessions that no longer exist, and load ranges whose loader died.
  The store is swept about every ``--sweep-every`` by one of its workers, the
  one that wins the sweep gate (`claim_sweep`): not once per worker, so the
  cost of the scan does not grow with the number of workers. Sweeps may still
  overlap (the sweep a reaper runs after ending a session, ``aeroqueue sweep``,
  a long sweep still running when the next begins): a job is offered again
  only by the sweep that wrote its record while it was as that sweep's scan
  read it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from aerospike_helpers import expressions as xp
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import operations as op

from . import blocks, hotpath, keys, lease_entries, transitions
from .backends import IN_DOUBT, Backend, Record, retry_in_doubt
from .backends.base import NO_INDEX
from .config import CLOCK_MARGIN_MS, LEASE_SETTLE_S, MAX_SECONDS
from .errors import (
    AeroqueueError,
    BackendError,
    BackendTimeout,
    ConfigError,
    FilteredOut,
    GenerationConflict,
    ListNotFound,
    RecordBusy,
    RecordNotFound,
    SessionClosed,
    SessionForked,
    SessionLost,
)
from .lists import JobLists, backoff_of
from .transitions import flush_bits, push_retry, set_bits

log = logging.getLogger("aeroqueue.sessions")

DEFAULT_INTERVAL_S = 1.0
# LEASE_SETTLE_S lives in `config`: a drop (`lists`) waits on it too; the lease
# entries, and when one is past its limit, are read in `lease_entries` for both.
# How long after its take a reservation may still record its lease: well inside the
# sweep's wait. Later (a busy session record, an answer in doubt) it claims the jobs.
LEASE_WINDOW_S = LEASE_SETTLE_S / 2
DEFAULT_EXPIRY_S = 5.0
# How long a job must have been untouched before a sweep counts it as lost (`sweep`).
DEFAULT_SWEEP_GRACE_MS = 60_000

# Sessions past their expiry (server clock), or already being reaped (a half-done reap).
# By the last heartbeat's server ms (`beat`), not the record's last update: a reaper's
# unlease of a live session's overdue leases is a write too (aq_sess_v1.lua). A record
# without `beat` (none is made so) falls back on its last update.
_EXPIRED = xp.Or(
    xp.Eq(xp.StrBin("state"), "reaping"),
    xp.And(xp.BinExists("beat"), xp.GE(xp.Sub(hotpath.SERVER_NOW, xp.IntBin("beat")), xp.IntBin("exp"))),
    xp.And(xp.Not(xp.BinExists("beat")), xp.GE(xp.SinceUpdateTime(), xp.IntBin("exp"))),
).compile()
_CLAIMED = xp.Eq(xp.StrBin("state"), "claimed").compile()
# Claims past their time limit, by the server's clock: `tl` is the limit granted at
# the claim or the last touch, the record's last update.
_OVERDUE = xp.And(
    xp.Eq(xp.StrBin("state"), "claimed"),
    xp.GE(xp.SinceUpdateTime(), xp.IntBin("tl")),
).compile()


def check_timing(interval_s: float, expiry_s: float) -> None:
    """Expiry must leave room for a missed heartbeat: more than twice the interval."""
    # Up to ten years, as every duration: an infinite or huge one would reach the
    # store as an integer past 64 bits, which the aerospike client mishandles.
    if not 0 < interval_s <= MAX_SECONDS:  # NaN fails too
        raise ConfigError(f"heartbeat interval must be positive seconds up to {MAX_SECONDS:,}, not {interval_s}")
    if not expiry_s <= MAX_SECONDS:
        raise ConfigError(f"session expiry must be seconds up to {MAX_SECONDS:,}, not {expiry_s}")
    if expiry_s <= 2 * interval_s:
        raise ConfigError(
            f"session expiry ({expiry_s}s) must be more than twice the heartbeat interval ({interval_s}s), "
            "or one late heartbeat would get a live worker reaped"
        )


class Session:
    """A process's claim identity, kept alive by heartbeats."""

    def __init__(
        self, backend: Backend, session_id: str, *, interval_s: float, expiry_s: float,
        on_beat: Callable[[bool], None] | None = None,
    ) -> None:
        self.backend = backend
        self.on_beat = on_beat  # told each heartbeat's outcome (metrics)
        self._observer_failed = False  # its error was logged with its traceback once
        self.id = session_id
        self.interval_s = interval_s
        self.expiry_s = expiry_s
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = time.monotonic()
        self._pid = os.getpid()  # the process it belongs to (`SessionForked`)
        self.closed = False
        self.ended_at_close: dict[str, str] = {}  # job record -> its list: the claims `close` gave back
        self._closing = False  # close() has begun: no new claim under this id
        self._under_way: set[int] = set()  # reservations under way (`claiming`), which close() waits for
        self._reservations = itertools.count()  # their numbers
        self._claims_done = threading.Condition()
        self._settled: list[str] = []  # leases to forget with the next lease write
        self._settled_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        backend: Backend,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        expiry_s: float = DEFAULT_EXPIRY_S,
        heartbeat: bool = True,
        on_beat: Callable[[bool], None] | None = None,
    ) -> Session:
        """Open a session; with `heartbeat` a daemon thread keeps it alive until `close`."""
        check_timing(interval_s, expiry_s)
        session = cls(backend, uuid.uuid4().hex, interval_s=interval_s, expiry_s=expiry_s, on_beat=on_beat)
        tries = 0

        def open_once() -> Any:
            nonlocal tries
            tries += 1
            return transitions.sess_once(
                backend, session.id, "open", socket.gethostname()[:200], os.getpid(), int(expiry_s * 1000)
            )

        # Repeated while its answer is in doubt (a node of the cluster died mid-call) or
        # it was refused as late: 'exists' on a repeat is our own first attempt, which did land.
        st = retry_in_doubt(open_once)
        if st != "ok" and not (st == "exists" and tries > 1):  # a uuid4 collision: never in practice
            raise BackendError(f"session {session.id} already exists", operation="open session", key=session.id)
        if heartbeat:
            session._thread = threading.Thread(target=session._beat_forever, name=f"heartbeat-{session.id[:8]}", daemon=True)
            session._thread.start()
        return session

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def claim_id(self) -> str:
        """The id claims are made under; refuses once the session is lost (`SessionLost`)
        or closing (`SessionClosed`). A reservation holds `claiming` instead, which
        close() waits for."""
        if os.getpid() != self._pid:
            # Shared across a fork (a pre-fork server's master opened it): its heartbeat
            # runs in the other process only, and a close here gave back the other's jobs.
            raise SessionForked(f"session {self.id} was opened in process {self._pid}, before a fork: open a "
                                "session in each process after it forks")
        if self._lost.is_set():
            raise SessionLost(f"session {self.id} is lost: it stops taking work")
        if self._closing:
            raise SessionClosed(f"session {self.id} is closed: open another to take work")
        return self.id

    @contextlib.contextmanager
    def claiming(self) -> Iterator[str]:
        """A reservation's claims (or lease) under this session: `claim_id`'s checks, and
        close() waits until every one under way has ended before it gives back what the
        session holds. A claim made under a closed session's id (its record deleted) is
        no reaper's to give back: only a sweep's orphan pass found it, minutes later."""
        self._confirm_alive()
        with self._claims_done:
            sess = self.claim_id()
            number = next(self._reservations)
            self._under_way.add(number)
        try:
            yield sess
        finally:
            with self._claims_done:
                self._under_way.discard(number)
                self._claims_done.notify_all()

    @property
    def released_at_close(self) -> Counter[str]:
        """The jobs `close` gave back, by list (the worker's metrics)."""
        return Counter(self.ended_at_close.values())

    def _confirm_alive(self) -> None:
        """Before a reservation: if the heartbeat has not been confirmed for half the
        expiry (the process was paused: SIGSTOP, a long GC), ask the
        server now. Resumed, a worker's threads reserved before its heartbeat thread
        ran; a reaper had deleted the session meanwhile, so those claims were under an
        id no reaper looks at, and the close that gave them back charged each an
        attempt (with one allowed: dead, never run). Raises `SessionLost`, or the
        store's error."""
        if self._thread is None or self._lost.is_set() or self._closing:
            return  # no heartbeat to be late (an API handler's session), or refused by `claim_id`
        if time.monotonic() - self._last_ok <= self.expiry_s / 2:
            return
        if not self.beat():
            raise SessionLost(f"session {self.id} is lost: it stops taking work")

    def claims_under_way(self) -> frozenset[int]:
        """The reservations under way (`claiming`), by number: a claim the session holds
        that no caller has yet may be one of theirs, not forgotten (`Worker`'s orphan
        check waits until those under way when it first saw it have ended)."""
        with self._claims_done:
            return frozenset(self._under_way)

    def beat(self) -> bool:
        """One heartbeat. False (and the session lost) when the server says it is gone or reaping."""
        ok = False
        # Leases settled since the last lease write are forgotten with the beat: the
        # session record (which the dashboard, sweeps and reapers read) then lists
        # only what is held, within a heartbeat, even once the session stops leasing.
        with self._settled_lock:
            settled, self._settled = self._settled, []
        try:
            # Refused as late ('stale': a StaleRequest, a failed heartbeat), the next one is sent.
            st = transitions.sess_once(self.backend, self.id, "beat", settled or None)
            ok = st == "ok"
        except BaseException:
            with self._settled_lock:
                self._settled[:0] = settled
            raise
        finally:
            if self.on_beat:  # failed heartbeats (errors) are worth counting too
                try:
                    self.on_beat(ok)
                except Exception:
                    # An observer's error (a user's WorkerObserver) is not the heartbeat's:
                    # raised from here it undid a beat that landed, and ended the thread.
                    # Its traceback once; after that, a beat a second would fill the log.
                    (log.exception if not self._observer_failed else log.debug)(
                        "heartbeat observer failed", extra={"event": "heartbeat_observer_failed", "session": self.id})
                    self._observer_failed = True
        if st != "ok":
            self._lose(st)
            return False
        self._last_ok = time.monotonic()
        return True

    def _lose(self, why: str) -> None:
        """The server says the session is gone or being reaped: it takes no more work."""
        if not self._lost.is_set():
            log.warning("session lost", extra={"event": "session_lost", "session": self.id, "why": why})
        self._lost.set()

    def lease(
        self, lease_id: str, entry: list[Any], *, within_s: float = LEASE_WINDOW_S, by_ms: int | None = None
    ) -> None:
        """Record a lease on the session record (aq_sess_v1.lease: `entry` is
        [list, until, groups]), forgetting the leases settled since the last one.
        Raises `SessionLost` when the session is gone or being reaped, and
        `BackendTimeout` when it is not recorded (or may not be) within `within_s`
        by this process's clock, or `by_ms` by the server's."""
        with self._settled_lock:
            settled, self._settled = self._settled, []
        give_up = time.monotonic() + within_s

        def once() -> Any:
            left = give_up - time.monotonic()
            if left <= 0:
                raise BackendTimeout(f"lease {lease_id} not recorded within {within_s:.3g} s", key=self.id)
            if by_ms is None:
                return self.backend.udf(
                    keys.SESS_SET, self.id, keys.SESS_MOD, "lease", lease_id, entry, settled, deadline_s=left
                )
            return self.backend.udf(
                keys.SESS_SET, self.id, keys.SESS_MOD, "lease", lease_id, entry, settled, by_ms, deadline_s=left
            )

        try:
            st = retry_in_doubt(once, deadline_s=within_s)
        except BaseException:
            with self._settled_lock:
                self._settled[:0] = settled
            raise
        if st == "late":
            # Not written: the caller claims the jobs instead. Settled leases go with the next write.
            with self._settled_lock:
                self._settled[:0] = settled
            raise BackendTimeout(f"lease {lease_id} reached the server after its window", key=self.id)
        if st != "ok":
            self._lose(st)
            raise SessionLost(f"session {self.id} is {st}: it takes no more work")

    def settle(self, lease_id: str) -> None:
        """Every job of a lease was acknowledged or claimed: forget it with the next lease or heartbeat."""
        with self._settled_lock:
            self._settled.append(lease_id)

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.beat():
                    return
            except Exception as e:
                # Unconfirmed for a whole expiry: a reaper may have given our jobs
                # away, so act as lost rather than acknowledge them. Any error, not only
                # the store's: one the store did not translate ended this thread, and the
                # session, reaped meanwhile, was never known lost (its worker went on
                # claiming under an id no reaper looks at).
                log.warning("heartbeat failed", extra={"event": "heartbeat_failed", "session": self.id,
                                                       "error": f"{type(e).__name__}: {e}"})
                if time.monotonic() - self._last_ok > self.expiry_s:
                    self._lost.set()
                    return

    def held(self) -> list[tuple[str, dict[str, Any]]]:
        """The jobs this session holds a claim on (from the secondary index)."""
        return [(name, rec.bins) for name, rec in self.backend.find(keys.JOB_SET, "sess", self.id, expression=_CLAIMED)]

    def close(self, *, release: bool = True) -> int:
        """Stop heartbeating, give back what the session holds so others can take it at
        once, and delete the session (left to expire, for a reaper, if a reservation
        is still under way after the wait, or the store fails). Returns jobs released.

        A lost session still gives back the claims it holds under its id (a claim
        made after a reaper looked, by a process paused past its expiry): nobody
        else can hold a claim under this id, and the release only acts on claims
        still held, so nothing that became someone else's is touched."""
        if self.closed:
            return 0
        if os.getpid() != self._pid:
            # A copy inherited through a fork: the session, and what it holds, are the
            # other process's, which closes it. Its jobs here were never this copy's.
            self.closed = True
            return 0
        with self._claims_done:
            # No new reservation from here; those under way end first (within the expiry:
            # one waiting on a busy list is bounded by its own deadline): a claim they made
            # after the release below would outlive the session.
            self._closing = True
            end = time.monotonic() + self.expiry_s
            while self._under_way and (left := end - time.monotonic()) > 0:
                self._claims_done.wait(left)
            # Still under way (a take retried on a busy list, a call held up): its lease
            # may land after the leases are read below, and a record deleted then would
            # take it along, its jobs held by no one while they run. The record is left
            # to expire: the reaper gives back whatever it holds by then.
            left_running = len(self._under_way)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + 5)
        released = 0
        try:
            flush_bits(self.backend)  # what this process acknowledged counts before it goes
            if release or self._lost.is_set():
                # Leased jobs not acknowledged become claims of this session, given back below.
                # Within their time limit (the expiry), not past it as a reaper's: a reaper
                # running meanwhile would expire them as overdue, an attempt counted (a
                # job of one attempt dead, never run), where the release refunds it. Those
                # of a lease past its end timed out: claims past their limit, whose release
                # counts the attempt. A close that dies here leaves them to the session's reap.
                tlim = max(1, round(self.expiry_s * 1000))
                retry_in_doubt(lambda: claim_leases(self.backend, self.id, tlim=tlim), deadline_s=self.expiry_s)
            # Finding the claims is a query: while partitions migrate (a node came back)
            # it can fail for a while. Releasing is idempotent: repeated, up to the expiry.
            if self._lost.is_set():
                released = retry_in_doubt(
                    lambda: release_claims(self.backend, self.id, refund=False, why="session lost"), deadline_s=self.expiry_s
                )
            else:
                if release:
                    passes = 0

                    def release_pass() -> int:
                        nonlocal passes
                        passes += 1
                        return release_claims(self.backend, self.id, refund=True, why="session closed",
                                              ended=self.ended_at_close)

                    retry_in_doubt(release_pass, deadline_s=self.expiry_s)
                    if passes > 1:
                        # A pass cut short may have released a claim whose answer it lost:
                        # the next pass no longer finds it, and with the session record gone
                        # no reap's recount would offer it (only the regular sweep, minutes
                        # later). Offered here, as a reap would, before the record goes.
                        recount_session(self.backend, self.id)
                if left_running:
                    log.warning("reservations still under way at close: the session is left to expire", extra={
                        "event": "close_left_to_expire", "session": self.id, "reservations": left_running})
                else:
                    self.backend.remove(keys.SESS_SET, self.id)
        except BackendError as e:
            # The session record stays: it expires, and the reaper gives back what it
            # still holds. Deleting it would leave those claims to the rare sweep.
            log.warning("session left to expire", extra={"event": "close_failed", "session": self.id, "error": str(e)})
        if release and not self._lost.is_set():
            # Every pass's, not the last one's: a pass cut short (or the close, given up)
            # had released some.
            released = len(self.ended_at_close)
        self.closed = True
        return released

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def release_claims(
    backend: Backend, session_id: str, *, refund: bool, why: str, ended: dict[str, str] | None = None,
) -> int:
    """Release every job still claimed by a session onto its list's retry store.
    Idempotent: the release UDF only acts on a claim the session still holds. With
    `ended`, each job it ended is added there: its record's name -> its list."""
    released: dict[tuple[str, int | None], list[int]] = defaultdict(list)  # by list and its stamp (push_retry)
    dead: dict[tuple[str, int | None], list[int]] = defaultdict(list)
    tx = transitions.reaper_tx()  # another reaper's pass releasing the same claims offers none of them again
    try:
        for name, rec in backend.find(keys.JOB_SET, "sess", session_id, expression=_CLAIMED):
            # One attempt when in doubt (deadline_s=0): the callers repeat the whole pass.
            st = transitions.job_udf(backend, name, "release", session_id, 1 if refund else 0, why, "", deadline_s=0,
                                     busy_s=5.0, tx=tx)
            if st == "released":
                released[(rec.bins["list"], rec.bins.get("c"))].append(rec.bins["token"])
            elif st == "dead":
                dead[(rec.bins["list"], rec.bins.get("c"))].append(rec.bins["token"])
            if ended is not None and st in ("released", "dead"):
                ended[name] = rec.bins["list"]
    finally:
        # Whatever cut the pass short, what it released is offered again now: a
        # repeated pass no longer finds those jobs (their claim is gone from the index).
        for (list_name, created), tokens in dead.items():
            transitions.set_dead_bits(backend, list_name, tokens, created)
        for (list_name, created), tokens in released.items():
            push_retry(backend, list_name, _offer(backend, list_name, tokens, tx, created), created)
    return sum(len(t) for t in released.values()) + sum(len(t) for t in dead.values())


def _offer(backend: Backend, list_name: str, tokens: list[int], tx: str, created: int | None = None) -> list[int]:
    """Of the jobs the release pass `tx` released, those it offers again: each marked
    offered by it (`off`), unless another reaper offered it first. A reaper that takes
    up a half-done reap (the session 'reaping') recounts the session's jobs
    (`recount_session`) while the pass that released them may not have pushed them
    yet: each would offer them, and the job would wait twice in the retry store. The
    mark and the recount's fence (`_fence`, which marks too, under a generation check)
    let one of them offer it. A job this pass did not end last (`tx`) is not its to
    offer; one no `tx` was written on (a job module older than `tx`) is, as before.
    Repeated after a lost answer, the mark answers as it did.

    With a fresh deadline each time (`Backend.job_deadline`): run late by a node that
    froze and resumed, the mark would pass on its stale copy and replace the job that
    was claimed and completed since with the released one (README: a frozen node
    replays the calls it was sent). A mark refused past it offers nothing: the sweep
    offers the job.

    `created`: the list stamp the released jobs had (None: any). A pass paused across
    a drop and a load of the list again would otherwise mark the new list's job of
    that token, which no `tx` or `off` was written on yet, as its own offer."""
    names = keys.job_names(list_name, tokens)
    mine = [
        xp.Or(xp.Not(xp.BinExists("tx")), xp.Eq(xp.StrBin("tx"), tx)),
        xp.Or(xp.Not(xp.BinExists("off")), xp.Eq(xp.StrBin("off"), tx)),
        *([] if created is None else [xp.Eq(xp.IntBin("c"), created)]),
    ]

    def attempt() -> list[int]:
        deadline = backend.job_deadline()
        expression = xp.And(*mine, *([] if deadline is None else [hotpath.in_time(deadline)])).compile()
        return backend.batch_same_codes(keys.JOB_SET, names, [op.write("off", tx)], expression=expression)

    codes = retry_in_doubt(attempt)
    # 27: offered by another reaper, or ended again since, or past the deadline; 2: gone (a drop).
    failed = sorted({code for code in codes if code not in (0, 2, 27)})
    if failed:
        unoffered = sum(code in failed for code in codes)
        log.warning("release: the offer of %d released jobs failed (codes %s); the sweep offers them",
                    unoffered, failed, extra={"event": "release_offer_failed", "jobs": unoffered, "codes": failed})
    return [t for t, code in zip(tokens, codes, strict=True) if code == 0]


@dataclass(frozen=True)
class ReapReport:
    sessions: int  # expired sessions reaped
    released: int  # claims given back (or sent dead)
    timed_out: int = 0  # claims of live sessions ended past their time limit
    # Of `sessions`, those whose record this reaper deleted: each dead session's reap is
    # ended by one reaper, though several may run it (a scan that finds it 'reaping',
    # mid-way through another's pass, takes it up too). What a worker sweeps after.
    ended: int = 0
    # The shortest expiry (ms) among those: what the sweep after the reap counts from.
    ended_expiry_ms: int = 0

    def sweep_grace_ms(self, cap_ms: int) -> int:
        """The grace of the sweep after this reap, at most `cap_ms`: half the shortest
        expiry of the sessions it ended. Their last heartbeat is a whole expiry old
        and their last take at most a heartbeat interval (under half the expiry)
        younger, while a live reserver claims within milliseconds."""
        return min(cap_ms, self.ended_expiry_ms // 2)


def reap(backend: Backend, *, stop: Callable[[], bool] | None = None) -> ReapReport:
    """Reap every expired session (see the module docstring), and end the claims of
    live sessions that ran past their time limit (a handler that hangs). `stop` is
    asked between sessions: a worker whose own session was lost exits at once
    instead of finishing others' reaps (each is idempotent: the next reaper
    finishes it).

    An error raised part way carries what was done before it as ``reaped`` (a
    `ReapReport`): the sessions it ended are gone, so no later reap sets off the
    sweep for what they took and never claimed; the caller may run it (`aeroqueue
    reap` does)."""
    sessions = released = ended = ended_expiry_ms = timed_out = 0
    expired = set()
    try:
        for session_id, rec in backend.scan(keys.SESS_SET, expression=_EXPIRED):
            if stop is not None and stop():
                return ReapReport(sessions, released, ended=ended, ended_expiry_ms=ended_expiry_ms)
            expired.add(session_id)
            if rec.bins.get("state") == "alive" and not _take_for_reaping(backend, session_id, rec.gen):
                continue
            try:
                claim_leases(backend, session_id, rec.bins.get("leases"))
            except LeasesKept as e:
                # As for a take refused past its deadline: this session is a later pass's,
                # the others are reaped now.
                log.warning(str(e), extra={"event": "reap_late", "session": session_id})
                continue
            released += release_claims(backend, session_id, refund=False, why="session expired")
            # A process that died may not have written the bits of its last acks.
            recount_session(backend, session_id)
            if backend.remove(keys.SESS_SET, session_id):
                ended += 1
                exp = int(rec.bins.get("exp") or 0)
                ended_expiry_ms = min(ended_expiry_ms, exp) if ended_expiry_ms else exp
            sessions += 1
            log.info("session reaped", extra={"event": "reaped", "session": session_id, "released": released})
        live = [(sid, rec) for sid, rec in backend.scan(keys.SESS_SET, bins=["state", "leases"]) if sid not in expired]
        # The server's clock, read once a pass (never this host's: one whose clock is
        # behind the store's would skip every lease and claim past its limit by up to
        # that much, for as long as it stays behind).
        now, read_at = _server_now(backend, [sid for sid, _ in live]), time.monotonic()
        # Leases past their limit become claims first, so that the one query below
        # finds them among the claims past theirs.
        for sid, rec in live:
            if stop is not None and stop():
                break
            end_overdue_leases(backend, sid, rec.bins.get("leases"), server_now_ms=now)
        if now is not None:  # the server's clock has moved on as long as those took
            now += int((time.monotonic() - read_at) * 1000) + 1
        claims = overdue_claims(backend, server_now_ms=now) if live else {}
        for sid, _ in live:
            if stop is not None and stop():
                break
            timed_out += expire_overdue(backend, sid, claims=None if claims is None else claims.get(sid, []))
    except AeroqueueError as e:
        e.reaped = ReapReport(sessions, released, timed_out, ended, ended_expiry_ms)
        raise
    return ReapReport(sessions, released, timed_out, ended, ended_expiry_ms)


# What becomes of a job whose claim timed out, as the reaper's warning says it.
_TIMED_OUT = {"retry": "to be retried", "delayed": "to be retried after the list's backoff", "dead": "now dead"}


# The bins of an overdue claim that `expire_overdue` reads.
_OVERDUE_BINS = ["sess", "list", "token", "tl", "att", "jid", "c"]


def _server_now(backend: Backend, session_ids: list[str]) -> int | None:
    """The server's clock (ms), read on the first of these session records still there;
    None if none is (or none given)."""
    for sid in session_ids:
        now = lease_entries.server_now_ms(backend, sid)
        if now is not None:
            return now
    return None


def end_overdue_leases(
    backend: Backend, session_id: str, leases: dict[str, Any] | None, *, server_now_ms: int | None = None,
) -> None:
    """Turn a live session's leases past their limit into claims past theirs, which
    `expire_overdue` then ends (`leases`: the session record's, as a scan read them).
    The server's clock is read on the session record's node (`lease_entries.cutoff_ms`)
    only if a lease may be past its limit by `server_now_ms` (the server's clock as
    one node read it this pass) and the margin allowed between nodes' clocks: a
    worker's leases are almost always fresh, and every live session's read on every
    reaper's pass was a round trip a session a pass. Without `server_now_ms`, read.
    Never this host's clock, which may be behind the store's."""
    if not leases:
        return
    if server_now_ms is not None and all(e[1] >= server_now_ms + CLOCK_MARGIN_MS for e in leases.values()):
        return
    cutoff = lease_entries.cutoff_ms(backend, session_id)
    if cutoff is None:
        return
    try:
        claim_leases(backend, session_id, lease_entries.overdue(leases, cutoff))
    except LeasesKept as e:  # a later pass's; the session's claims are ended all the same
        log.warning(str(e), extra={"event": "reap_late", "session": session_id})


def overdue_claims(backend: Backend, *, server_now_ms: int | None = None) -> dict[str, list[Record]] | None:
    """Every claim past its time limit, by session, in one query of the claims index
    (`keys.CLAIMS_INDEX`: a job holds its deadline `dl` only while claimed, and a claim
    past its limit has one behind the server's clock). None without that index (a store
    registered before it): then `expire_overdue` queries each session's claims, one
    query a live session on every reaper's pass, each on every node.

    `server_now_ms`: the server's clock as one node read it; the query's upper bound
    is that and the margin allowed between nodes' clocks. Never this host's clock: one
    behind the store's by more than the margin left out every claim past its limit
    by less than that, for as long as it stayed behind. Without it, every claim is
    read (the expression keeps those past their limit)."""
    high = keys.INT64[1] if server_now_ms is None else server_now_ms + CLOCK_MARGIN_MS
    try:
        return claims_by_session(backend, _OVERDUE, _OVERDUE_BINS, high)
    except BackendError as e:
        if e.code not in NO_INDEX:
            raise
        return None


def claims_by_session(
    backend: Backend, expression: Any, bins: list[str], high: int = keys.INT64[1],
) -> dict[str, list[Record]]:
    """The claimed jobs whose deadline (`dl`) is at most `high` and that `expression`
    keeps (`bins` of each, "sess" among them), by session: one query of the claims index (`keys.CLAIMS_INDEX`: a job holds
    a deadline only while claimed), for the reaper and the dashboard alike. A store
    without that index answers a `BackendError` coded in `NO_INDEX`."""
    found = backend.find_between(keys.JOB_SET, "dl", keys.INT64[0], high, expression=expression, bins=bins)
    out: dict[str, list[Record]] = defaultdict(list)
    for _, rec in found:
        sess = rec.bins.get("sess")
        if isinstance(sess, str):
            out[sess].append(rec)
    return out


def expire_overdue(
    backend: Backend, session_id: str, leases: dict[str, Any] | None = None, *, claims: list[Record] | None = None,
) -> int:
    """End a live session's claims that ran past their time limit, each as a failed
    attempt whose error says it timed out (retried after the list's backoff, or
    dead), its leases past their limit first turned into such claims
    (`end_overdue_leases`). `claims`: those claims as `overdue_claims` found them;
    else one index query on the session's claims. Returns how many it ended."""
    end_overdue_leases(backend, session_id, leases)
    lists = JobLists(backend)
    policies: dict[str, tuple[int, int]] = {}
    ended = 0
    tx = transitions.reaper_tx()  # another reaper ending the same claims at once offers none of them again
    if claims is None:
        claims = [rec for _, rec in backend.find(keys.JOB_SET, "sess", session_id, expression=_OVERDUE)]
    for rec in claims:
        bins = rec.bins
        name = bins["list"]
        if name not in policies:
            try:
                policies[name] = backoff_of(lists.header(name))
            except ListNotFound:
                policies[name] = (0, 0)
        tl = bins.get("tl", 0)
        # A claim made from a lease past its end carries PAST_LIMIT: the lease had the limit.
        limit = "its lease's time limit" if tl < 0 else f"its time limit of {tl / 1000:g} s"
        why = f"timed out: not acknowledged within {limit} (session {session_id} still alive)"
        delay = transitions.backoff_ms(bins.get("att", 1), *policies[name])
        # Offered as a release pass offers (`_offer`): a reaper that takes the session up
        # if it dies now recounts its jobs, and would offer this one too before our push.
        st = transitions.expire(backend, name, bins["token"], session_id, why, delay_ms=delay, tx=tx,
                                offer=functools.partial(_offer, backend, name, tx=tx, created=bins.get("c")),
                                created=bins.get("c"))
        if st in ("retry", "delayed", "dead"):
            ended += 1
            # The job named in the message too: a command that sets no log handler (`aeroqueue reap`)
            # prints the message alone.
            log.warning("claim timed out: job %r (%s/%s) of session %s, %s", bins.get("jid"), bins["list"],
                        bins["token"], session_id, _TIMED_OUT[st],
                        extra={"event": "timed_out", "session": session_id, "list": bins["list"],
                               "token": bins["token"], "jid": bins.get("jid"), "outcome": st})
    return ended


# The time limit of a claim made from a lease the reaper ends: already past, by a
# millisecond, so the expiry that follows it in the same millisecond is not 'early'.
PAST_LIMIT = -1


def _take_for_reaping(backend: Backend, session_id: str, gen: int) -> bool:
    """alive -> reaping, if the record is as the reaper's scan read it (generation
    `gen`: a heartbeat since means it is alive after all) and, with a deadline
    (`Backend.job_deadline`), before it: run late by a node that froze and resumed, the
    write would put back the session as its stale copy had it, leases made since gone
    (aq_sess_v1.lua, header). False: not taken (this pass leaves it)."""
    for _ in range(2):
        deadline = backend.job_deadline()
        try:
            if deadline is None:
                backend.put(keys.SESS_SET, session_id, {"state": "reaping"}, gen=gen)
            else:
                backend.operate(keys.SESS_SET, session_id, [op.write("state", "reaping")], gen=gen,
                                expression=hotpath.in_time(deadline).compile(), update_only=True)
            return True
        except (GenerationConflict, RecordNotFound):
            return False  # alive after all, or gone
        except FilteredOut:
            continue  # reached the server past its deadline: nothing written, sent again once
    # Nothing else refuses the take: a reaper that never reaps should say why.
    log.warning("reap: taking session %s reached the server past its deadline twice; a later pass "
                "tries again (if every pass says so, is the store's clock ahead of this host's?)", session_id,
                extra={"event": "reap_late", "session": session_id})
    return False


def claim_leases(
    backend: Backend, session_id: str, leases: dict[str, Any] | None = None, *, tlim: int = PAST_LIMIT
) -> int:
    """Turn a session's leases (the session record's, or those given) into claims of
    that session under each lease's id, with a time limit of `tlim` ms (by default
    already past: a reaper's), and forget them: a reaper then releases or expires
    them as it does any claim. A job acked, or claimed by its holder, since the
    lease read it is left alone (the lease's fence). Idempotent; returns the jobs
    claimed.

    Given a `tlim` (a closing session's), a lease past its end by the server's clock
    becomes claims past their limit all the same: its jobs timed out, and the release
    that follows counts their attempt (aq_job_v1.lua, `release`), as the reaper would."""
    if leases is None:
        rec = backend.get(keys.SESS_SET, session_id, bins=["leases"])
        leases = lease_entries.of_record(rec.bins) if rec is not None else {}
    claimed = 0
    for lid, entry in leases.items():
        list_name = entry[0]
        for att, at, tokens, created in lease_entries.groups(entry):
            names = keys.job_names(list_name, tokens)

            def send(
                idx: list[int], names: list[str] = names, lid: str = lid, att: int = att, at: Any = at,
                created: Any = created, tlim: int = tlim, until: int | None = None,
            ) -> list[int]:
                return hotpath.claim_leased(
                    backend, [names[i] for i in idx], session_id, lid, tlim, att, at, backend.job_deadline(),
                    until=until, created=created,
                )

            # Undecided at the deadline, it raises and the lease stays, for the next pass.
            what = f"claiming the leased jobs of session {session_id}"
            if tlim == PAST_LIMIT:
                codes = hotpath.until_decided(send, len(names), 5.0, what)
            else:
                codes = hotpath.until_decided(functools.partial(send, until=entry[1]), len(names), 5.0, what)
                # Refused: past the lease's end, or not as leased any more (refused again).
                later = [names[i] for i, code in enumerate(codes) if code == 27]
                if later:
                    again = iter(hotpath.until_decided(functools.partial(send, names=later, tlim=PAST_LIMIT),
                                                       len(later), 5.0, what))
                    codes = [next(again) if code == 27 else code for code in codes]
            claimed += codes.count(0)
            _check_refused(backend, session_id, [n for n, code in zip(names, codes, strict=True) if code == 27],
                           att, at, created)
    if leases:
        retry_in_doubt(lambda: transitions.sess_once(backend, session_id, "unlease", list(leases)))
    return claimed


_FENCE_BINS = ["state", "att", "claimed", "kicked", "c"]


def _check_refused(
    backend: Backend, session_id: str, names: list[str], att: int, at: int | None, created: int | None
) -> None:
    """Claims of leased jobs the filter refused (27): the job left the lease (acked,
    claimed, kicked), or both tries reached the server past their deadline (a store
    whose clock is ahead, a request held up). A record still as the lease read it is
    the second: the lease must stay (raised: the next pass tries again), or its job,
    held by no one, would take its frozen holder's late ack."""
    if not names:
        return
    # A record not read (any code but 0 and 2: missing) may be as leased still: kept too.
    still = [n for n, (code, bins) in zip(names, backend.batch_bins(keys.JOB_SET, names, _FENCE_BINS), strict=True)
             if code != 2 and (code != 0 or (bins is not None and _fenced(bins, att, at, created)))]
    if still:
        raise LeasesKept(f"claiming the leased jobs of session {session_id}: {len(still)} still leased were "
                         "refused as past their deadline (or could not be read back); a later pass tries again (if "
                         "every pass says so, is the store's clock ahead of this host's?)", key=session_id)


class LeasesKept(BackendTimeout):
    """Leases a reaper could not claim were kept for a later pass."""


def leased_tokens(backend: Backend) -> set[tuple[str, int]]:
    """(list, token) of every job some session holds a lease on."""
    return {(list_name, token) for _, list_name, token in _leased(backend)}


def lease_holder(
    backend: Backend, list_name: str, token: int, bins: dict[str, Any] | None = None
) -> str | None:
    """The session holding a lease on job `token` of `list_name`, if any (a scan of the
    sessions: for an operator's question, not a hot path). With the job record's
    `bins`, only a lease whose fence the record still matches (as its ack's filter
    would): not one the job left since (failed, kicked, another list of the name)."""
    for sid, leases in lease_entries.scan(backend):
        for entry in leases.values():
            if entry[0] != list_name:
                continue
            for att, claimed, tokens, created in lease_entries.groups(entry):
                if token in tokens and (bins is None or _fenced(bins, att, claimed, created)):
                    return sid
    return None


def _fenced(bins: dict[str, Any], att: int, claimed: int | None, created: int | None) -> bool:
    """The record is as the lease read it (hotpath.lease_filter's conditions)."""
    return (bins.get("state") == "queued" and bins.get("att") == att and bins.get("claimed") == claimed
            and bins.get("kicked") is None and (created is None or bins.get("c") == created))


def _leased(backend: Backend) -> Iterator[tuple[str, str, int]]:
    for sid, leases in lease_entries.scan(backend):
        for entry in leases.values():
            for token in lease_entries.tokens(entry):
                yield sid, entry[0], token


def lease_of(
    backend: Backend, session_id: str, list_name: str, token: int
) -> tuple[str, hotpath.LeaseFence] | None:
    """The lease session `session_id` holds job `token` of `list_name` under, as its
    id and fence (`Job.lease`), or None."""
    rec = backend.get(keys.SESS_SET, session_id, bins=["leases"])
    for lid, entry in (lease_entries.of_record(rec.bins) if rec else {}).items():
        if entry[0] == list_name:
            for att, claimed, tokens, created in lease_entries.groups(entry):
                if token in tokens:
                    return lid, (att, claimed, entry[1], created)
    return None


def recount_session(backend: Backend, session_id: str) -> int:
    """Set the missing completion bits of the jobs a session finished: what a process
    that died had not written yet (`transitions.BitBuffer`); and offer again the jobs
    it gave back that no store holds (a release pass of a reaper or a close of it,
    cut short before its push: `release_claims`). One filtered scan of the job set,
    run when a session is reaped (rare); returns the bits it set."""
    finished = xp.And(
        xp.Eq(xp.StrBin("by"), session_id),
        xp.Or(xp.Eq(xp.StrBin("state"), "done"), xp.Eq(xp.StrBin("state"), "dead"), xp.Eq(xp.StrBin("state"), "queued")),
    ).compile()
    # The stores as they were before the scan (as `sweep` reads them): a job taken from
    # one while the scan runs is held there, not mistaken for one no store holds.
    lists = JobLists(backend)
    heads: dict[str, dict[str, Any]] = {}
    for name in lists.names():
        with contextlib.suppress(ListNotFound):  # dropped meanwhile
            heads[name] = lists.header(name)
    found: dict[tuple[str, str], list[_Found]] = defaultdict(list)
    for name, rec in backend.scan(keys.JOB_SET, expression=finished, bins=["list", "token", "state", "off", "c"]):
        found[(rec.bins["list"], rec.bins["state"])].append(_Found(name, rec.gen, rec.bins))
    for (list_name, state), jobs in found.items():
        head = heads.get(list_name)
        if state != "queued" or head is None:  # a list made or dropped since: not this reap's
            continue
        held = _held_by(lists, list_name, head)
        # One already offered (`off`: by the pass that released it, maybe pushing it as
        # this runs, by another recount, or by its holder, whose own fail, expire or
        # release marked it: `transitions.holder_mark`) is not offered twice: should its
        # offerer have died before the push, the sweep finds it.
        lost = [j for j in jobs if not held(j.bins["token"]) and j.bins.get("off") is None]
        # Fenced as the sweep's are: a job claimed since the scan read it is not offered.
        room = max(0, transitions.RETRY_CAP - len(head.get("retry") or []))
        # Deduplicated: judged lost from a store read before the scan, a job offered since
        # (a kick's push) may wait there already.
        push_retry(backend, list_name, _fence(backend, lost, room), head.get("created"), dedupe=True)
    # A list made since the heads were read is left to the sweep (it recounts every
    # finished job of a list not complete): there is no head to fence the bits with.
    return sum(_recount(backend, list_name, state, _tokens_of(jobs, heads[list_name]), heads[list_name]["created"])
               for (list_name, state), jobs in found.items() if state != "queued" and list_name in heads)


def _tokens_of(jobs: list[_Found], head: dict[str, Any]) -> list[int]:
    """The tokens of these finished jobs that are of the list `head` was read from: a
    job record of a list of the name dropped before it was made (brought back by a
    node that missed the drop) is not, and its bit would count in this list."""
    created, alloc = head["created"], head["alloc"]
    return [j.bins["token"] for j in jobs if keys.indexed_here(j.bins, created) and j.bins["token"] < alloc]


def _recount(backend: Backend, list_name: str, bitmap: str, tokens: list[int], created: int) -> int:
    """Set the missing `bitmap` bits of `tokens`, jobs a scan found finished in the list
    made at `created` (server ms, the head read before the scan); returns how many."""
    if not tokens:
        return 0
    have = _bits(backend, list_name, bitmap, tokens, created)
    missing = [t for t in tokens if t not in have]
    if not missing:
        return 0
    # Setting a bit makes its bitmap record if missing (`set_bits`). On a list dropped
    # since the scan (its bitmaps deleted: every bit reads missing) that would make the
    # record again after the drop, and nothing deletes it then: not the drop, done; nor a
    # create of the name, which deletes only what was written before the drop. A list
    # made again under the name would count those jobs finished before they ran, and
    # could be marked complete (never swept again) with one still to run. So, as a load
    # checks its list before it writes (`load._gone`): the list must be the one the scan
    # read, no drop begun. A drop that begins after this check deletes the bitmaps again
    # its grace after its last step (`JobLists.drop`), as it does for an ack's late bit.
    if not transitions.list_is(backend, list_name, created):
        return 0
    if bitmap == "dead":  # seen dead by a scan that may be old: kicked since, maybe
        transitions.set_dead_bits(backend, list_name, missing, created)
    else:
        set_bits(backend, list_name, missing, bitmap, 1, created)
    return len(missing)


@dataclass(frozen=True)
class SweepReport:
    requeued: int  # queued jobs taken but never claimed, and delayed jobs long due, offered again
    orphans: int  # claims of sessions that no longer exist, released
    recounted: int  # finished jobs whose completion bit was missing, counted
    ranges: int  # load ranges of dead loaders, finished


def claim_sweep(
    backend: Backend, every_s: float, holder: str, *, grace_ms: int = DEFAULT_SWEEP_GRACE_MS, mark: str | None = None,
    gate: str = keys.SWEEP_GATE,
) -> bool:
    """Whether this worker runs the store's regular sweep now: True when it won the
    sweep gate, which it does only if the last regular sweep of the store (by any
    worker) began `every_s` or more ago, by the server's clock. One atomic write on
    one record: the record's last update is the start of the last sweep, and a write
    filtered on its age lands for one of the workers that race for it, refused
    (FilteredOut) for the others. A missing gate (a new store, or truncated) is not
    filtered: the first write creates it, and the next one finds it too young.

    No TTL is involved (a namespace may refuse them: nsup-period 0). A winner that dies
    mid-sweep (or stops: its sweep ends early) leaves that interval's sweep undone: the
    next one runs an interval later, as it would with that worker alone. A claim whose
    answer is in doubt raises (the worker tries again a reap interval later, losing if
    it had landed: one sweep skipped). A frozen node that replays the write later (README:
    a frozen node replays the calls it was sent) moves the gate forward (one sweep
    skipped), and one that resumes as a second master may let a second worker win
    (one sweep added): the sweep is safe to run twice, and no deadline is needed.
    `grace_ms`: the grace of the sweep the winner runs (`claim_sweep_after` reads it);
    `mark`: the lost-take mark it is run for (`LostTake.mark`), which it serves."""
    try:
        _write_gate(backend, gate, holder, grace_ms, xp.GE(xp.SinceUpdateTime(), int(every_s * 1000)), mark)
    except FilteredOut:
        return False
    except RecordBusy:
        # Others are writing the gate at this very moment: one of them wins it.
        return False
    return True


def claim_sweep_after(
    backend: Backend, since_ms: int, grace_ms: int, holder: str, *, gate: str = keys.SWEEP_GATE
) -> bool:
    """Whether to run a sweep that must begin after an event `since_ms` ago, with a
    grace of `grace_ms` (a reap that ended a session: the jobs its process took and
    never claimed): False when a sweep through the gate began since then with no
    longer a grace, which finds what this one would (a shorter grace finds more).
    True, and the gate moved to this sweep, otherwise. When a host's workers die at
    once, the workers that reap them would each scan the store right after; this
    way the first scan serves the others. Whether that sweep then completes is not
    known here, as for any sweep through the gate: should it fail, its worker runs it
    again; should it die, the regular sweep finds those jobs."""
    fresh = xp.Or(
        xp.GE(xp.SinceUpdateTime(), since_ms),
        xp.Not(xp.BinExists("grace")),  # a gate of a release before grace bins: its grace unknown
        xp.GT(xp.IntBin("grace"), grace_ms),
    )
    try:
        _write_gate(backend, gate, holder, grace_ms, fresh)
    except FilteredOut:
        return False
    except RecordBusy:  # others write it this very moment, with what grace is unknown: sweep
        return True
    return True


def _write_gate(backend: Backend, gate: str, holder: str, grace_ms: int, when: Any, mark: str | None = None) -> None:
    ops = [op.write("sess", holder), op.write("host", socket.gethostname()[:200]), op.write("pid", os.getpid()),
           op.write("grace", int(grace_ms))]
    if mark is not None:
        ops.append(op.write("mark", mark))
    backend.operate(keys.LOCK_SET, gate, ops, expression=when.compile())


def sweep_gate_wait(backend: Backend, every_s: float, *, gate: str = keys.SWEEP_GATE) -> float:
    """Seconds until the sweep gate opens for a worker that sweeps every `every_s`
    (0: open now): the rest of that interval since the last sweep began, by the
    server's clock (the gate record's age, as `claim_sweep` measures it)."""
    try:
        rec = backend.operate(keys.LOCK_SET, gate, [eo.expression_read("since", xp.SinceUpdateTime().compile())])
    except RecordNotFound:
        return 0.0
    return max(0.0, every_s - rec.bins["since"] / 1000)


def mark_lost_take(backend: Backend, *, mark: str = keys.LOST_TAKE_MARK) -> None:
    """Say that a take or an ID-store pop lost its answer. Neither is repeated (a
    second one would take other jobs), so the jobs it took are held by no one until a
    sweep offers them again: with the regular sweep alone, up to --sweep-every plus
    --sweep-grace later (over 6 minutes by default). The mark's last update, by the
    server's clock, tells the workers to sweep sooner (`lost_take_due`); each write
    gives it a new `id`, which the sweep claimed for it records on the gate. Best
    effort: the store that lost the answer may refuse this too, and the regular sweep
    still finds those jobs."""
    with contextlib.suppress(AeroqueueError):
        backend.operate(keys.LOCK_SET, mark, [op.write("host", socket.gethostname()[:200]), op.write("pid", os.getpid()),
                                              op.write("id", uuid.uuid4().hex)])


@dataclass(frozen=True)
class LostTake:
    """A lost-take mark no sweep has served yet (`lost_take_due`)."""

    age_ms: int  # since its last write, by the server's clock
    mark: str | None  # its write's id: a sweep claimed with it (`claim_sweep`) serves it


def lost_take_due(backend: Backend, *, mark: str = keys.LOST_TAKE_MARK, gate: str = keys.SWEEP_GATE) -> LostTake | None:
    """The lost-take mark, if no sweep through the gate has served it; None otherwise.

    The jobs the lost take took were last written before the mark. A sweep finds a job
    once untouched for its grace, so one that began `d` ms after the mark finds them all
    if its grace is `d` or less: then it served the mark. One begun a moment after it
    with a longer grace (the regular sweep's 60 s, a reap's half expiry) does not, and
    the mark is still due: counted as served, those jobs waited for the regular sweep,
    minutes. The sweep claimed for the mark (its grace the mark's age as read, so no longer
    than the time since) names it on the gate and serves it whatever the two
    records' nodes' clocks say: a mark is never due for ever."""
    since = eo.expression_read("since", xp.SinceUpdateTime().compile())
    try:
        rec = backend.operate(keys.LOCK_SET, mark, [since, op.read("id")])
    except RecordNotFound:
        return None
    lost = LostTake(int(rec.bins["since"]), rec.bins.get("id"))
    try:
        g = backend.operate(keys.LOCK_SET, gate, [since, op.read("grace"), op.read("mark")]).bins
    except RecordNotFound:
        return lost
    if lost.mark is not None and g.get("mark") == lost.mark:
        return None
    grace = g.get("grace")
    # `lost.age_ms - g["since"]`: how long after the mark's write the gate's sweep began.
    if g["since"] <= lost.age_ms and grace is not None and lost.age_ms - g["since"] >= grace:
        return None
    return lost


def _any_of(exprs: list[Any]) -> Any:
    return exprs[0] if len(exprs) == 1 else xp.Or(*exprs)


def sweep(backend: Backend, *, grace_ms: int = DEFAULT_SWEEP_GRACE_MS, stop: Callable[[], bool] | None = None) -> SweepReport:
    """The rare pass over the jobs of every list that is not complete (complete
    lists cost nothing): run it at a low rate. `stop` is asked as the scan goes:
    a sweep cut short changes nothing it did not finish (the next one does it)."""
    lists = JobLists(backend)
    # A list dropped while the sweep runs is left out wherever it is met (a drop
    # removes its jobs too): a ListNotFound failed the whole sweep, every list's.
    ranges = 0
    # The stores as they were before the scan: a job taken while the scan runs is past
    # these heads, so it is never mistaken for one a dead reserver left behind.
    heads: dict[str, dict[str, Any]] = {}
    # In ID mode the chunks are the store: what they held before the scan, read with the
    # heads, for the same reason. Read after it, an ID a live reserver popped meanwhile
    # (its claim a round trip away) was in no chunk, and its job was offered again.
    unpopped: dict[str, list[int]] = {}
    names = lists.names()
    for name in names:
        with contextlib.suppress(ListNotFound):
            try:
                ranges += lists.recover(name)
            except ListNotFound:
                raise
            except AeroqueueError as e:
                # One list's range that cannot be finished (a store refusing its writes)
                # must not cost every other list its sweep: this list's published jobs
                # are swept all the same, and the next sweep tries the range again.
                log.warning("sweep: the load ranges of list %r were not recovered: %s", name, e,
                            extra={"event": "recover_failed", "list": name, "error": str(e)})
            if not lists.status(name).complete:
                heads[name] = lists.header(name)
                if heads[name]["mode"] == "ids":
                    unpopped[name] = lists.unpopped_ids(name, heads[name])
    unfinished = list(heads)
    if not unfinished:
        _clear_blocks(lists, names, heads)
        return SweepReport(0, 0, 0, ranges)
    state = xp.StrBin("state")
    stale = xp.GE(xp.SinceUpdateTime(), grace_ms)
    expression = xp.And(
        _any_of([xp.Eq(xp.StrBin("list"), name) for name in unfinished]),
        xp.Or(
            # Finished jobs: a worker may have died between the ack and its bit.
            xp.Eq(state, "done"), xp.Eq(state, "dead"),
            # Waiting jobs untouched for the grace period.
            xp.And(stale, xp.Or(xp.Eq(state, "claimed"), xp.Eq(state, "queued"), xp.Eq(state, "delayed"))),
        ),
    ).compile()
    heads_at = time.monotonic()
    found: dict[str, dict[str, list[_Found]]] = defaultdict(lambda: defaultdict(list))
    for i, (name, rec) in enumerate(backend.scan(keys.JOB_SET, expression=expression)):
        if stop is not None and i % 256 == 0 and stop():
            return SweepReport(0, 0, 0, ranges)
        found[rec.bins["state"]][rec.bins["list"]].append(_Found(name, rec.gen, rec.bins))

    recounted = sum(
        _recount(backend, list_name, bitmap, _tokens_of(jobs, heads[list_name]), heads[list_name]["created"])
        for bitmap in ("done", "dead")
        for list_name, jobs in found[bitmap].items()
    )
    # And the other way: a dead bit whose job is not dead (a process killed between
    # the two steps of `transitions.set_dead_bits`, after a kick) counts a waiting
    # job as finished. Dead jobs are few: their records are read back.
    for name in unfinished:
        with contextlib.suppress(ListNotFound):  # dropped meanwhile
            # The jobs the scan found dead need no second read.
            seen_dead = {j.bins["token"] for j in found["dead"].get(name, ())}
            created = heads[name]["created"]
            suspect = [t for t in lists.dead_tokens(name, heads[name]["alloc"], created) if t not in seen_dead]
            if suspect:
                transitions.check_dead_bits(backend, name, suspect, created)

    # Claims whose session is gone (a reaper missed them, or a claim raced a reap).
    holders = sorted({j.bins.get("sess", "") for jobs in found["claimed"].values() for j in jobs})
    alive = {sid for sid, rec in zip(holders, backend.batch_get(keys.SESS_SET, holders), strict=True) if rec is not None}
    orphans = sum(release_claims(backend, sid, refund=False, why="session vanished") for sid in holders if sid not in alive)

    # Jobs taken from a store but never claimed: the reserver died in between. A job
    # a live session leased is held, not lost.
    requeued = 0
    leased: set[tuple[str, int]] = set()
    if found["queued"]:
        # A reservation records its lease a round trip or two after its take: the
        # leases are read long enough after the heads that one in progress has landed.
        time.sleep(max(0.0, LEASE_SETTLE_S - (time.monotonic() - heads_at)))
        leased = leased_tokens(backend)
    # What each retry store takes more: lost and overdue jobs of one list share it.
    room = {name: max(0, transitions.RETRY_CAP - len(head.get("retry") or [])) for name, head in heads.items()}

    def offer(list_name: str, jobs: list[_Found]) -> int:
        tokens = _fence(backend, jobs, room[list_name])
        room[list_name] -= len(tokens)
        # Only to the list the heads were read of: a sweep paused across a drop and a
        # load again would offer the new list's jobs of those tokens, leased maybe.
        # Deduplicated: judged lost from the store as read before the scan, a job its
        # holder failed or released since (its push changes the list record only, which
        # the fence does not see) may wait there already, and would wait twice.
        return push_retry(backend, list_name, tokens, heads[list_name].get("created"), dedupe=True)

    for list_name, jobs in found["queued"].items():
        jobs = [j for j in jobs if (list_name, j.bins["token"]) not in leased]
        head = heads[list_name]
        with contextlib.suppress(ListNotFound):  # dropped meanwhile
            waiting = set(head.get("retry") or [])
            if head["mode"] == "ids":
                waiting.update(unpopped[list_name])
                lost = [j for j in jobs if j.bins["token"] not in waiting and j.bins["token"] < head["tail"]]
            else:
                lost = [j for j in jobs if j.bins["token"] < head["head"] and j.bins["token"] not in waiting]
            requeued += offer(list_name, lost)
    # Delayed jobs long past their time: the schedule was full, or a process died
    # between a failure and its follow-up. The claim checks `due` by the server's
    # clock, so one offered a little early is put back on the schedule, not run.
    # One the list record still holds (a gate nobody reserved from since it came
    # due, the schedule of a paused list, the token store) is waiting, not lost:
    # offered again, it was counted twice and left a copy behind in the retry store.
    # One of a range not yet published (its loader still writing, or killed before
    # its index) is no job of the list yet: offered, it ran, and the load run again
    # gave its id a token of its own, which ran too (the range, recovered, voided the first).
    overdue_before = time.time() * 1000 - grace_ms
    for list_name, jobs in found["delayed"].items():
        with contextlib.suppress(ListNotFound):  # dropped meanwhile
            head = heads[list_name]
            held = _held_by(lists, list_name, head, unpopped.get(list_name))
            late = [j for j in jobs if j.bins["token"] < head["tail"] and j.bins.get("due", 0) < overdue_before
                    and not held(j.bins["token"])]
            requeued += offer(list_name, late)
    if requeued or orphans:
        # What a crash left behind coming back: an operator looks for this line when a
        # job waited minutes (a reserver killed between its take and its claim).
        log.info("sweep offered lost jobs again", extra={"event": "swept", "requeued": requeued, "orphans": orphans})
    _clear_blocks(lists, names, heads)
    return SweepReport(requeued, orphans, recounted, ranges)


def _clear_blocks(lists: JobLists, names: list[str], heads: dict[str, dict[str, Any]]) -> None:
    """Delete the block records behind each list's head (`blocks.clear_passed`): a list
    whose jobs were reserved one at a time keeps every entry otherwise, until it is
    dropped. Complete lists too (their head read now): once each, then nothing to do."""
    for name in names:
        try:
            blocks.clear_passed(lists, name, heads.get(name) or lists.header(name))
        except ListNotFound:
            continue
        except AeroqueueError as e:  # the next sweep tries again
            log.warning("sweep: the block records of list %r were not cleared: %s", name, e,
                        extra={"event": "blocks_not_cleared", "list": name, "error": str(e)})


def _held_by(
    lists: JobLists, list_name: str, head: dict[str, Any], unpopped: list[int] | None = None
) -> Callable[[int], bool]:
    """Whether the list record (as `head` read it) still holds a token where a take
    will hand it out: the retry store, the schedule (tokens and ranges), gates, due
    ranges (`ready`), timed jobs, and the token store's [head, tail) or, in ID mode,
    the chunks not popped yet (`unpopped`, as read with `head`; None: read here). See
    aq_list_v1.lua's header."""
    if unpopped is None:
        unpopped = lists.unpopped_ids(list_name, head) if head["mode"] == "ids" else []
    singles = set(head.get("retry") or []) | set(head.get("timed") or {}) | set(unpopped)
    ranges: list[tuple[int, int]] = []
    for items in (head.get("sched") or {}).values():
        for item in items:
            if isinstance(item, list):
                ranges.append((item[0], item[0] + item[1]))
            else:
                singles.add(item)
    ranges += [(start, start + g["n"]) for start, g in (head.get("gates") or {}).items()]
    ranges += [(r[0], r[0] + r[1]) for r in head.get("ready") or []]
    if head["mode"] != "ids":
        ranges.append((head["head"], head["tail"]))
    return lambda t: t in singles or any(a <= t < b for a, b in ranges)


@dataclass(frozen=True)
class _Found:
    """A job record as the sweep's scan read it."""

    name: str
    gen: int
    bins: dict[str, Any]


# The fence's write: when a sweeper last offered the job again (server ms), and that
# it was offered: a release pass that has not offered it yet then leaves it (`_offer`).
_SWEPT = [eo.expression_write("swept", hotpath.SERVER_NOW_COMPILED), op.write("off", "sweep")]
FENCE_BATCH = 5000  # job records fenced a batch call


def _fence(backend: Backend, jobs: list[_Found], room: int) -> list[int]:
    """The tokens of at most `room` of `jobs` this sweep may offer again: those whose
    record it wrote while still as its scan read it (same generation). Sweeps overlap
    (the workers' regular one, one a reap set off, `aeroqueue sweep`, a frozen node's
    replay of the sweep gate), and two that scan at the same moment find the same lost jobs.
    Pushed by both, each job's claim refuses the second copy on a consistent store,
    but while a node rejoins two masters may each admit one claim (test_failover saw
    a job run and acknowledged twice that way): the fence narrows that, not closes it.

    A fence write refused, in doubt or failed offers nothing. Its job, if still lost,
    is offered by a later sweep: one grace period later if the write landed, since it
    is a write (the sweep looks at jobs untouched for the grace period). It carries
    a deadline (`Backend.job_deadline`): run late by a node that froze and resumed,
    its generation check passes on the stale copy, and the lost job would replace the
    one claimed and completed since (README: a frozen node replays the calls it was sent)."""
    jobs = jobs[:room]
    tokens: list[int] = []
    for at in range(0, len(jobs), FENCE_BATCH):
        batch = jobs[at:at + FENCE_BATCH]
        deadline = backend.job_deadline()
        try:
            codes = backend.batch_if_unchanged(
                keys.JOB_SET, [(j.name, j.gen) for j in batch], _SWEPT,
                expression=None if deadline is None else hotpath.in_time(deadline).compile(),
            )
        except IN_DOUBT:
            log.warning("sweep: the fence on %d lost jobs stayed in doubt; a later sweep offers them", len(batch),
                        extra={"event": "sweep_fence_in_doubt", "jobs": len(batch)})
            continue
        tokens += [j.bins["token"] for j, code in zip(batch, codes, strict=True) if code == 0]
        # 3: changed since the scan (another sweep, a claim); 2: gone (a drop); 27: past
        # the deadline (not written: a later sweep finds it lost again).
        failed = sorted({code for code in codes if code not in (0, 2, 3, 27)})
        if failed:
            unfenced = sum(code in failed for code in codes)
            log.warning("sweep: the fence failed on %d lost jobs (codes %s); a later sweep offers them",
                        unfenced, failed, extra={"event": "sweep_fence_failed", "jobs": unfenced, "codes": failed})
        if late := codes.count(27):
            # Nothing else refuses a fence (its generation check answers 3): a sweep that
            # does nothing every time should say why.
            log.warning("sweep: the fence on %d lost jobs reached the server past its deadline; a later sweep "
                        "offers them (if every sweep says so, is the store's clock ahead of this host's?)", late,
                        extra={"event": "sweep_fence_late", "jobs": late})
    return tokens


def _bits(backend: Backend, list_name: str, bitmap: str, tokens: list[int], created: int) -> set[int]:
    """Which of these tokens have their bit set in the bitmap of the list made at `created`."""
    chunks = sorted({keys.bit_position(t)[0] for t in tokens})
    recs = dict(zip(chunks, backend.batch_get(keys.DONE_SET, [keys.chunk_name(list_name, c) for c in chunks]), strict=True))
    out = set()
    for t in tokens:
        chunk, bit = keys.bit_position(t)
        rec = keys.bitmap_of(recs[chunk], created)
        data = bytes(rec.bins.get(bitmap) or b"") if rec is not None else b""
        if keys.bit_is_set(data, bit):
            out.add(t)
    return out
