"""Sessions, reaping and sweeping: a job reserved by a process that died comes back.

- A process opens a session; a background thread heartbeats it (a write, so
  the server's last-update time moves) and closes it on graceful shutdown,
  giving back what it holds. A heartbeat that finds the session gone or being
  reaped marks it lost: the process stops taking work and acknowledges
  nothing it held.
- Claims are made under a session. Each claimed job carries the session id
  in its ``sess`` bin, which has a secondary index, so the reaper finds a dead
  session's claims without scanning every job.
- The reaper (in every worker, and ``aeroqueue reap``) finds sessions whose
  record the server has not seen updated for their expiry, moves them
  ``alive -> reaping`` with a generation check, releases each of their claims
  (only if still held by that session) onto the retry store, then deletes the
  session. Each step is idempotent; a half-done reap is finished by the next.
- The sweeper (``aeroqueue sweep``, and rarely inside workers) catches what
  slipped through: jobs taken from the token store but never claimed, claims
  of sessions that no longer exist, and load ranges whose loader died.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from aerospike_helpers import expressions as xp

from . import keys
from .backends import Backend
from .errors import BackendError, ConfigError, GenerationConflict, ListNotFound, SessionLost

log = logging.getLogger("aeroqueue.sessions")

DEFAULT_INTERVAL_S = 1.0
DEFAULT_EXPIRY_S = 5.0
SESS_INDEX = "aq_job_sess"  # the secondary index on aq_job.sess

# Sessions past their expiry (server clock), or already being reaped (a half-done reap).
_EXPIRED = xp.Or(
    xp.Eq(xp.StrBin("state"), "reaping"),
    xp.GE(xp.SinceUpdateTime(), xp.IntBin("exp")),
).compile()
_CLAIMED = xp.Eq(xp.StrBin("state"), "claimed").compile()


def check_timing(interval_s: float, expiry_s: float) -> None:
    """Expiry must leave room for a missed heartbeat: more than twice the interval."""
    if interval_s <= 0:
        raise ConfigError(f"heartbeat interval must be positive, not {interval_s}")
    if expiry_s <= 2 * interval_s:
        raise ConfigError(
            f"session expiry ({expiry_s}s) must be more than twice the heartbeat interval ({interval_s}s), "
            "or one late heartbeat would get a live worker reaped"
        )


class Session:
    """A process's claim identity, kept alive by heartbeats."""

    def __init__(self, backend: Backend, session_id: str, *, interval_s: float, expiry_s: float) -> None:
        self.backend = backend
        self.id = session_id
        self.interval_s = interval_s
        self.expiry_s = expiry_s
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = time.monotonic()
        self.closed = False

    @classmethod
    def open(
        cls,
        backend: Backend,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        expiry_s: float = DEFAULT_EXPIRY_S,
        heartbeat: bool = True,
    ) -> Session:
        """Open a session; with `heartbeat` a daemon thread keeps it alive until `close`."""
        check_timing(interval_s, expiry_s)
        session = cls(backend, uuid.uuid4().hex, interval_s=interval_s, expiry_s=expiry_s)
        st = backend.udf(
            keys.SESS_SET, session.id, keys.SESS_MOD, "open", socket.gethostname()[:200], os.getpid(), int(expiry_s * 1000)
        )
        if st != "ok":  # a uuid4 collision: never in practice
            raise BackendError(f"session {session.id} already exists", operation="open session", key=session.id)
        if heartbeat:
            session._thread = threading.Thread(target=session._beat_forever, name=f"heartbeat-{session.id[:8]}", daemon=True)
            session._thread.start()
        return session

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def claim_id(self) -> str:
        """The id claims are made under; refuses once the session is lost."""
        if self._lost.is_set():
            raise SessionLost(f"session {self.id} is lost: it stops taking work")
        return self.id

    def beat(self) -> bool:
        """One heartbeat. False (and the session lost) when the server says it is gone or reaping."""
        st = self.backend.udf(keys.SESS_SET, self.id, keys.SESS_MOD, "beat")
        if st != "ok":
            if not self._lost.is_set():
                log.warning("session lost", extra={"event": "session_lost", "session": self.id, "why": st})
            self._lost.set()
            return False
        self._last_ok = time.monotonic()
        return True

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if not self.beat():
                    return
            except BackendError as e:
                # Unconfirmed for a whole expiry: a reaper may have given our jobs
                # away, so act as lost rather than acknowledge them.
                log.warning("heartbeat failed", extra={"event": "heartbeat_failed", "session": self.id, "error": str(e)})
                if time.monotonic() - self._last_ok > self.expiry_s:
                    self._lost.set()
                    return

    def held(self) -> list[tuple[str, dict[str, Any]]]:
        """The jobs this session holds a claim on (from the secondary index)."""
        return [(name, rec.bins) for name, rec in self.backend.find(keys.JOB_SET, "sess", self.id, expression=_CLAIMED)]

    def close(self, *, release: bool = True) -> int:
        """Stop heartbeating, give back what the session holds so others can take it at
        once, and delete the session. A lost session gives back nothing: a reaper
        does, and its claims may already be someone else's. Returns jobs released."""
        if self.closed:
            return 0
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + 5)
        released = 0
        if release and not self._lost.is_set():
            released = release_claims(self.backend, self.id, refund=True, why="session closed")
        if not self._lost.is_set():
            self.backend.remove(keys.SESS_SET, self.id)
        self.closed = True
        return released

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def release_claims(backend: Backend, session_id: str, *, refund: bool, why: str) -> int:
    """Release every job still claimed by a session onto its list's retry store.
    Idempotent: the release UDF only acts on a claim the session still holds."""
    from .queue import push_retry, set_bits

    released: dict[str, list[int]] = defaultdict(list)
    dead: dict[str, list[int]] = defaultdict(list)
    for name, rec in backend.find(keys.JOB_SET, "sess", session_id, expression=_CLAIMED):
        st = backend.udf(keys.JOB_SET, name, keys.JOB_MOD, "release", session_id, 1 if refund else 0, why)
        if st == "released":
            released[rec.bins["list"]].append(rec.bins["token"])
        elif st == "dead":
            dead[rec.bins["list"]].append(rec.bins["token"])
    for list_name, tokens in dead.items():
        set_bits(backend, list_name, tokens, "dead", 1)
    for list_name, tokens in released.items():
        push_retry(backend, list_name, tokens)
    return sum(len(t) for t in released.values()) + sum(len(t) for t in dead.values())


@dataclass(frozen=True)
class ReapReport:
    sessions: int  # expired sessions reaped
    released: int  # claims given back (or sent dead)


def reap(backend: Backend) -> ReapReport:
    """Reap every expired session (see the module docstring)."""
    sessions = released = 0
    for session_id, rec in backend.scan(keys.SESS_SET, expression=_EXPIRED):
        if rec.bins.get("state") == "alive":
            try:
                # Generation check: a heartbeat since our scan means it is alive after all.
                backend.put(keys.SESS_SET, session_id, {"state": "reaping"}, gen=rec.gen)
            except GenerationConflict:
                continue
        released += release_claims(backend, session_id, refund=False, why="session expired")
        backend.remove(keys.SESS_SET, session_id)
        sessions += 1
        log.info("session reaped", extra={"event": "reaped", "session": session_id, "released": released})
    return ReapReport(sessions, released)


@dataclass(frozen=True)
class SweepReport:
    requeued: int  # queued jobs taken but never claimed, offered again
    orphans: int  # claims of sessions that no longer exist, released
    ranges: int  # load ranges of dead loaders, finished


def sweep(backend: Backend, *, grace_ms: int = 60_000) -> SweepReport:
    """The rare full pass: O(jobs in the store), so run it at a low rate."""
    from .lists import JobLists
    from .queue import push_retry

    lists = JobLists(backend)
    ranges = sum(lists.recover(name) for name in lists.names())
    stale = xp.GE(xp.SinceUpdateTime(), grace_ms)

    # Claims whose session is gone (a reaper missed them, or a claim raced a reap).
    claimed = list(backend.scan(keys.JOB_SET, expression=xp.And(xp.Eq(xp.StrBin("state"), "claimed"), stale).compile()))
    holders = sorted({rec.bins.get("sess", "") for _, rec in claimed})
    alive = {sid for sid, rec in zip(holders, backend.batch_get(keys.SESS_SET, holders), strict=True) if rec is not None}
    orphans = 0
    for sid in holders:
        if sid not in alive:
            orphans += release_claims(backend, sid, refund=False, why="session vanished")

    # Jobs taken from a store but never claimed: the reserver died in between.
    queued = backend.scan(keys.JOB_SET, expression=xp.And(xp.Eq(xp.StrBin("state"), "queued"), stale).compile())
    by_list: dict[str, list[int]] = defaultdict(list)
    for _, rec in queued:
        by_list[rec.bins["list"]].append(rec.bins["token"])
    requeued = 0
    for list_name, tokens in by_list.items():
        try:
            head = lists.header(list_name)
        except ListNotFound:  # the list is gone: nothing to offer them to
            continue
        waiting = set(head.get("retry") or [])
        if head["mode"] == "ids":
            chunks = backend.batch_get(keys.IDS_SET, [keys.chunk_name(list_name, c) for c in range(head["cursor"], head["pubs"])])
            for c in chunks:
                waiting.update((c.bins.get("ids") or []) if c else [])
            lost = [t for t in tokens if t not in waiting and t < head["tail"]]
        else:
            lost = [t for t in tokens if t < head["head"] and t not in waiting]
        if lost:
            requeued += push_retry(backend, list_name, lost)
    return SweepReport(requeued, orphans, ranges)
