"""Reserve and acknowledge: the hot path (design.md, flows reserve/complete/fail).

Round trips, token mode:

- ``reserve``: ``take`` on the list record (the retry store first, then the
  token store), then ``claim`` on the job record (one batch call for n > 1):
  2 per reservation, whatever its size. This is the API handler's path.
- ``complete``: ``complete`` on the job record: 1.
- In a batch, claims of queued jobs and acks of plainly held claims are native
  operations (`hotpath`): a quarter of a batch UDF's server CPU per job and
  less client CPU; any other case goes to the Lua function, which decides.
  One job at a time stays with the UDF, which costs the client less. Its completion bit goes
  through the process's `transitions.BitBuffer`, one bitmap write per chunk
  for many jobs, so it costs next to nothing per job.
- The worker (`aeroqueue worker`) reserves a few jobs at a time (its
  ``--prefetch``, 4 by default) and acks each: 1 + 2/4 = 1.5 per job.
- ``reserve(..., lease=True)`` (the worker, from 16 jobs): ``take``, one batch
  read of the fresh jobs, one ``lease`` on the session record: 3 per batch,
  and no write per job until its ack.
- ``complete_and_reserve``: acks and the next claims in one batch call after
  the ``take``: 2 per job even one job at a time. Measured on a server on the
  same 2-core machine it costs more CPU than it saves (a batch call's
  objects and the server's batch threads), so the worker prefetches instead;
  it is kept for clients far from their server, where round trips cost more
  than CPU (not measured here).

Each of these UDFs is O(1) in the list's size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import itertools
import logging
import math
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import blocks, hotpath, keys, transitions
from .backends import IN_DOUBT, Backend, BatchResult, retry_busy
from .config import MAX_SECONDS, whole
from .errors import (
    AeroqueueError,
    BackendTimeout,
    ClaimLost,
    JobNotFound,
    ListNotFound,
    RecordBusy,
    RecordTooBig,
    SessionClosed,
    SessionLost,
    StaleRequest,
)
from .hotpath import LeaseFence
from .lists import JobLists, backoff_of
from .results import checked_result, result_size, too_big_to_store
from .sessions import LEASE_WINDOW_S, PAST_LIMIT, Session, mark_lost_take

log = logging.getLogger("aeroqueue.queue")

# Seconds between two `sessions.mark_lost_take` writes of one queue, at most.
LOST_MARK_EVERY_S = 1.0


@dataclass(frozen=True)
class Job:
    """A reserved job, claimed under `session`, with `timeout_s` to be acknowledged
    (the list's time limit when it was claimed; `touch` extends it)."""

    list: str
    token: int
    jid: str
    payload: Any
    attempt: int
    session: str
    timeout_s: float = 300.0
    rid: str = ""  # the claim's request id: an ack names the claim, not only the session
    toucher: Callable[[Job, float | datetime.timedelta | None], object] | None = field(default=None, compare=False, repr=False)
    # Leased, not claimed (`Queue.reserve(..., lease=True)`): the record's attempt count,
    # last claim time and list stamp as read, and the server ms the lease's time limit
    # ends (`hotpath.LeaseFence`).
    lease: LeaseFence | None = None
    # The list's stamp (`created`, bin `c` of every job record a load writes) as the claim
    # or lease read it: a job pushed back is offered only to that list, not to one made
    # again under its name since (`transitions.push_retry`). None: a job written before stamps.
    created: int | None = None

    @property
    def name(self) -> str:
        return keys.job_name(self.list, self.token)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (handed to another process, kept for a later ack) or deep-copied, a job
        # leaves its `toucher` behind: a bound method of its Queue, the store's client
        # and all, failed with "cannot pickle 'aerospike.Client' object". The copy
        # acknowledges as the original does; its `touch` says it has no queue.
        return (Job, tuple(None if f.name == "toucher" else getattr(self, f.name) for f in dataclasses.fields(Job)))

    def touch(self, seconds: float | datetime.timedelta | None = None) -> None:
        """The handler needs longer: its claim's time limit becomes `seconds` (default:
        the list's time limit) from now. Raises `ClaimLost` when the claim is gone or
        already past its limit."""
        if self.toucher is None:
            raise ClaimLost(f"job {self.name} (id {self.jid!r}) was not reserved through a queue: nothing to touch")
        self.toucher(self, seconds)


POLICY_TTL_S = 5.0  # how long a list's backoff settings are cached


def _delay_s(seconds: Any, what: str, *, positive: bool = False) -> float:
    """`seconds` as a float within what a record holds in milliseconds and `tune`
    allows (ten years), else ValueError naming `what`: an infinite or huge delay
    never reaches the store (the aerospike client refuses an integer past 64 bits
    and was seen to corrupt its own heap doing so). Without `positive`, a delay
    already past (a computed `next_slot - time.time()`) is zero. A `timedelta` is
    its seconds; so is numeric text, as float() reads it (a Retry-After header)."""
    if isinstance(seconds, datetime.timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool):
        raise TypeError(f"{what} takes seconds (a number or a timedelta), not {seconds!r}")
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        raise TypeError(f"{what} takes seconds (a number or a timedelta), not {seconds!r}") from None
    if not positive and -math.inf < value < 0:
        value = 0.0
    low_ok = value > 0 if positive else value >= 0
    if not (low_ok and value <= MAX_SECONDS):  # NaN fails too
        lowest = "more than 0" if positive else "from 0"
        raise ValueError(f"{what} takes seconds {lowest} up to {MAX_SECONDS:,} (ten years), not {seconds}")
    return value


class Retry(Exception):
    """Raised by a handler: run this job again `after` seconds from now. The attempt
    is given back and no error is recorded (River's snooze, Sidekiq's retry_in)."""

    def __init__(self, after: float | datetime.timedelta = 0.0, reason: str = "") -> None:
        after = _delay_s(after, "Retry(after=...)")
        super().__init__(reason or f"retry after {after:g} s")
        self.after = after
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (a --pool process child sends it back)
        return (Retry, (self.after, self.reason))


class Queue:
    """Reservation and acknowledgement on one store."""

    def __init__(self, backend: Backend, *, busy_deadline_s: float = 5.0) -> None:
        self.backend = backend
        self.lists = JobLists(backend)
        # How long RecordBusy on a hot key is retried before it reaches the caller.
        self.busy_deadline_s = busy_deadline_s
        self.bits = transitions.bit_buffer(backend)
        self._modes: dict[str, str] = {}
        # (read at, backoff base ms, backoff cap ms) per list: `tune` reaches a
        # running worker within POLICY_TTL_S.
        self._policies: dict[str, tuple[float, int, int]] = {}
        self._touched: list[Callable[[Job, float], None]] = []  # told of each touch (the worker's watchdog)
        self._lock = threading.Lock()
        # Leases this queue made: id -> (session, tokens not yet acknowledged or claimed,
        # server ms the lease ends). The last one settled, the session forgets the lease
        # with its next lease or heartbeat; one past its end is the reaper's.
        self._leases: dict[str, tuple[Session, set[int], int]] = {}
        self._lost_marked = -LOST_MARK_EVERY_S  # monotonic: the last `mark_lost_take` this queue sent
        self._lost_later: threading.Timer | None = None  # the mark set for the end of that second
        self._lost_lock = threading.Lock()

    def _udf(self, set_name: str, name: str, module: str, function: str, *args: Any) -> Any:
        return self.backend.udf(set_name, name, module, function, *args, deadline_s=self.busy_deadline_s)

    def _job_udf(self, job_name: str, function: str, *args: Any, created: int | None = None) -> Any:
        """A job UDF that is safe to repeat (claim with its request id, complete: a repeat
        that finds it done answers as the first did), repeated while its answer is in
        doubt: a node that dies mid-call costs a retry, not a job. Each attempt carries
        its deadline (`transitions.job_udf`; `created`: a claim's list stamp)."""
        return transitions.job_udf(
            self.backend, job_name, function, *args, deadline_s=self.busy_deadline_s, created=created
        )

    def _answer_lost(self, e: BackendTimeout) -> None:
        """A take or an ID-store pop lost its answer: its jobs are held by no one, and
        the workers are told so that one of them sweeps soon (`mark_lost_take`). At
        most once a `LOST_MARK_EVERY_S` from this process: in a node's failure every
        reservation may lose its answer, and the mark is one record."""
        if isinstance(e, StaleRequest):  # refused: nothing was taken
            return
        self._mark_lost_take()

    def _mark_lost_take(self) -> None:
        """`mark_lost_take`, at most once a `LOST_MARK_EVERY_S` from this process."""
        with self._lost_lock:
            wait = self._lost_marked + LOST_MARK_EVERY_S - time.monotonic()
            if wait > 0:
                # Marked less than a second ago: this one is marked at the end of that
                # second, not skipped. Its jobs may have been written since the last mark
                # (a retry store's), and the sweep that mark sets off counts from it.
                if self._lost_later is None:
                    self._lost_later = threading.Timer(wait, self._mark_lost_later)
                    self._lost_later.daemon = True
                    self._lost_later.start()
                return
            self._lost_marked = time.monotonic()
        mark_lost_take(self.backend)

    def _mark_lost_later(self) -> None:
        with self._lost_lock:
            self._lost_marked, self._lost_later = time.monotonic(), None
        mark_lost_take(self.backend)

    # -- reserve -------------------------------------------------------------

    def reserve(self, list_name: str, session: Session | str, count: int = 1, *, lease: bool = False) -> list[Job]:
        """Reserve up to `count` jobs of a list for `session`; [] when none is reservable.

        With `lease` (a batch, under a `Session`: the worker's path) the jobs are read,
        not claimed: the session record lists them (one write for the batch), and each
        ack is admitted only while the job is as the lease read it and the lease's time
        limit has not run out. It saves a write per job; the job records show 'queued'
        while the jobs run. A dead session's leases, and leases past their limit, are
        turned into claims by the reaper and recovered as claims are.

        O(1) in the list's size: one UDF on the list record takes tokens, one
        (batch) UDF claims them. Tokens that turn out void or already taken (a
        duplicate retry entry) are skipped, and the call tries again, so it
        returns nothing only when the list has nothing to give.
        """
        count = whole("count", count)
        _checked_target(list_name, session)
        if not isinstance(lease, bool):  # lease="no" read as true
            raise TypeError(f"reserve: lease must be True or False, not {lease!r:.60}")
        if count == 1:
            return self._reserve_one(list_name, session)
        reserved, _ = self._reserve(list_name, session, count, [], lease=lease and isinstance(session, Session))
        return reserved

    def _reserve_one(self, name: str, session: Session | str) -> list[Job]:
        """`reserve` of one job, the API handler's call: its two round trips made
        directly, without the retry loops' frames around each. Measured on the real
        server with four clients (benchmarks/RESULTS.md), the Python around the calls
        cost three times what it costs in a loop without I/O, so its length is most
        of what the API path adds to the bare calls. Every other case continues in
        `_reserve`, from where this left off: a busy list record (nothing was taken),
        an answer that is not one fresh token, a claim in doubt or refused as stale
        (repeated under the same request id), a token that was not claimable."""
        if not isinstance(session, str):
            with session.claiming() as sess:  # close() waits for it
                return self._reserve_one(name, sess)
        sess = session
        backend = self.backend
        try:
            out = backend.apply(keys.LIST_SET, name, keys.LIST_MOD, "take", 1, backend.job_deadline())
        except RecordBusy:
            return self._reserve(name, sess, 1, [])[0]
        except BackendTimeout as e:
            self._answer_lost(e)
            raise
        if out["st"] == "stale":  # nothing was taken: the loop's take repeats it
            return self._reserve(name, sess, 1, [])[0]
        if out["st"] != "ok" or out["retry"] or out["n"] != 1:
            try:
                tokens, tlim, _, _, created = self._tokens(name, 1, out)
            except _ListReplaced:
                return self._reserve(name, sess, 1, [])[0]
            return self._reserve(name, sess, 1, [], first=(tokens, tlim, created))[0]
        token, tlim, rid, created = out["start"], out.get("tlim") or 300_000, _request_id(), out.get("c")
        try:
            answer = backend.apply(
                keys.JOB_SET, keys.job_name(name, token), keys.JOB_MOD, "claim", sess, rid, tlim, backend.job_deadline(),
                created,
            )
        except IN_DOUBT:
            answer = None
        if answer is None or transitions.is_stale(answer):
            answer = self._claim_one(name, sess, rid, tlim, token, created)
        if answer and answer["st"] == "ok":
            return [Job(list=name, token=token, jid=answer["jid"], payload=answer.get("payload"),
                        attempt=answer["att"], session=sess, timeout_s=tlim / 1000, rid=rid, toucher=self.touch,
                        created=answer.get("c"))]
        self._reschedule(name, [answer])
        return self._reserve(name, sess, 1, [], rid=rid, seen={token}, stamp=created)[0]

    def complete_and_reserve(
        self, done: Sequence[tuple[Job, Any]], list_name: str, session: Session | str, count: int = 1
    ) -> tuple[list[Job], list[Job]]:
        """Complete jobs (`(job, result)` pairs) and reserve up to `count` jobs of
        `list_name`, in two round trips: ``take``, then one batch call carrying the
        acks and the claims. Returns (jobs reserved, jobs whose claim was lost:
        not completed by this call).

        An ack that fails (not refused: failed, e.g. a timeout) raises its error
        after the new jobs were claimed: they are on the exception's ``reserved``
        attribute, for the caller to run or release. A failure of the
        reservation alone, once the acks went through, returns what was claimed
        (maybe nothing): the next reservation shows it again. Leased jobs' acks go
        first, in a batch of their own (they are not the UDF's to complete). A result
        JSON cannot hold raises `ResultNotStorable` before anything is sent. Results that
        would make their records too big raise `RecordTooBig` once everything else is
        done: its ``too_big`` holds those jobs, ``lost`` and ``reserved`` the rest. A
        session being closed reserves nothing: the acks still go out."""
        count = whole("count", count)
        _checked_target(list_name, session)
        try:
            done = [(j, r) for j, r in done]
        except (TypeError, ValueError):
            raise TypeError("complete_and_reserve: done must hold (job, result) pairs") from None
        _checked_jobs("complete_and_reserve", [j for j, _ in done])
        results = _checked_results([r for _, r in done])
        done = [(j, r) for (j, _), r in zip(done, results, strict=True)]
        leased = [(j, r) for j, r in done if j.lease is not None]
        too_big = None
        try:
            lost = self.complete_many([j for j, _ in leased], [r for _, r in leased]) if leased else []
        except RecordTooBig as e:  # the rest of the leased acks are decided: go on with the others
            too_big, lost = e, list(getattr(e, "lost", []))
        try:
            got, refused = self._reserve(list_name, session, count, [(j, r) for j, r in done if j.lease is None])
        except AeroqueueError as e:
            # One error accounts for every ack: the leased ones' (lost, too big) too.
            if too_big is not None or lost:
                e.too_big = [*getattr(too_big, "too_big", []), *getattr(e, "too_big", [])]  # type: ignore[attr-defined]
                e.lost = [*lost, *getattr(e, "lost", [])]  # type: ignore[attr-defined]
            raise
        if too_big is not None:
            too_big.lost, too_big.reserved = lost + refused, got  # type: ignore[attr-defined]
            raise too_big
        return got, lost + refused

    def _reserve(
        self, list_name: str, session: Session | str, count: int, acks: list[tuple[Job, Any]], *,
        first: tuple[list[int], int, int | None] | None = None, rid: str | None = None,
        seen: set[int] | None = None, stamp: int | None = None, lease: bool = False,
    ) -> tuple[list[Job], list[Job]]:
        """The general reservation loop. `first`: tokens already taken (and their time
        limit and list stamp), claimed before any new take; `rid`, `seen` and `stamp`:
        the request id, the tokens a caller already tried under it (`_reserve_one`) and
        the stamp of the list they were taken from; `lease`: lease the jobs (`reserve`),
        `session` being a `Session`."""
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        with contextlib.ExitStack() as held:
            if isinstance(session, str):
                sess = session
            else:
                try:
                    sess = held.enter_context(session.claiming())  # close() waits for it
                except SessionClosed:
                    if not acks:
                        raise
                    # Closing: no new claim, but the acks it carries go out (their jobs'
                    # handlers are done: held back, close() gave the jobs back to run again).
                    return [], self.complete_many([j for j, _ in acks], [r for _, r in acks])
            return self._reserve_as(list_name, session, sess, count, acks, first=first, rid=rid, seen=seen,
                                    stamp=stamp, lease=lease)

    def _reserve_as(
        self, list_name: str, session: Session | str, sess: str, count: int, acks: list[tuple[Job, Any]], *,
        first: tuple[list[int], int, int | None] | None, rid: str | None, seen: set[int] | None, stamp: int | None,
        lease: bool,
    ) -> tuple[list[Job], list[Job]]:
        """`_reserve`'s loop, under session id `sess` (`session` itself for a lease)."""
        rid = rid or _request_id()  # makes a claim whose answer was lost safe to repeat
        got: list[Job] = []
        lost: list[Job] = []
        pending = acks  # the acks, until they have been sent
        seen = set() if seen is None else seen
        these: list[tuple[Job, Any]] = []
        replaced = 0  # takes whose cursor was another list's chunk (ID mode), in a row
        try:
            while len(got) < count:
                now, fresh, took = None, range(0), time.monotonic()
                if first is not None:
                    (taken, tlim, created), first = first, None
                else:
                    try:
                        taken, tlim, now, fresh, created = self._take(list_name, count - len(got))
                    except _ListReplaced:
                        # The next take is the new list's. Bounded all the same: a chunk
                        # that stayed another list's would make this loop for ever.
                        replaced += 1
                        if replaced > REPLACED_RETAKES:
                            break
                        continue
                    replaced = 0
                if created is not None and created != stamp:
                    if stamp is not None:
                        # The list was dropped and loaded again between two takes:
                        # the tokens seen were the old list's, these are other jobs.
                        seen.clear()
                    stamp = created
                # The retry store may hold a token twice (harmless for anyone else:
                # the claim refuses a job that is not queued). Under one request id
                # the second claim would answer 'ok' again, as a repeated call does,
                # and the job would be handed out twice: claim each token once.
                tokens = [t for t in dict.fromkeys(taken) if t not in seen]
                seen.update(tokens)
                if not taken and not pending:
                    break
                these, pending = pending, []
                if lease and not these and now is not None and len(fresh) > 1:
                    assert isinstance(session, Session)
                    got.extend(self._lease(list_name, session, rid, tlim, now, tokens, fresh, took, created))
                else:
                    got.extend(self._claim(list_name, sess, rid, tlim, tokens, these, got, lost, created))
                if not taken:
                    break
        except AeroqueueError as e:
            if getattr(e, "_from_ack", False):
                raise  # an ack failed; `reserved` carries what was claimed
            if getattr(e, "_acks_unsent", False):
                pending = these  # the batch carrying them was refused whole
            if pending:
                # The acks never left: send them alone, so the jobs are not held until reaped.
                try:
                    lost += self.complete_many([j for j, _ in pending], [r for _, r in pending])
                except AeroqueueError as failed:
                    failed.reserved = got
                    raise
            if not got and not acks:
                raise
            # Never drop jobs already claimed: they would stay held by a live
            # session, which no reaper touches. With acks, the acks are what the
            # caller must know about: they went through. A reserve problem shows
            # again at the next reservation.
        return got, lost

    def _take(self, name: str, k: int) -> tuple[list[int], int, int | None, range, int | None]:
        """Tokens to claim, the list's time limit (ms) for their claims, the take's
        server ms (None from a list module older than leases), the fresh tokens
        among them, and the list's stamp (`_tokens`)."""
        try:
            out = transitions.list_udf(self.backend, name, "take", k, deadline_s=self.busy_deadline_s)
        except BackendTimeout as e:
            self._answer_lost(e)
            raise
        return self._tokens(name, k, out)

    def _tokens(self, name: str, k: int, out: dict[str, Any]) -> tuple[list[int], int, int | None, range, int | None]:
        """A `take` answer's tokens (up to `k`, topped up from the ID store), time limit,
        server ms, the run the token store handed out: tokens no one was ever given,
        which only this take holds (the retry store may hold a token twice, or one a
        late reaper pushed back while someone holds it: only a claim fences those),
        and the list's stamp (None from a list module older than block records)."""
        st = out["st"]
        if st == "missing":
            raise ListNotFound(f"no job list named {name!r}")
        if st == "paused":
            return [], 0, None, range(0), None
        retry, start, n = out["retry"], out["start"], out["n"]
        tokens = list(range(start, start + n)) if not retry else [*retry, *range(start, start + n)]
        # The take's own word first: a list dropped and loaded again under its name in the
        # other mode would be served by the mode cached for the first (ID mode: never
        # popped, its jobs never handed out). A list module older than that: the cache.
        if len(tokens) < k and (out.get("mode") or self._mode(name)) == "ids":
            tokens += self._pop_ids(name, k - len(tokens), out["cursor"], out["pubs"], out.get("c"), held=len(tokens))
        return tokens, out.get("tlim") or 300_000, out.get("now"), range(start, start + n), out.get("c")

    def _mode(self, name: str) -> str:
        mode = self._modes.get(name)
        if mode is None:
            mode = self._modes[name] = self.lists.header(name)["mode"]
        return mode

    def _pop_ids(
        self, name: str, k: int, cursor: int, pubs: int, created: int | None, *, held: int = 0
    ) -> list[int]:
        """ID mode: pop from the chunk at the cursor; move the cursor past drained chunks.
        `created`: the stamp of the list the take read the cursor from; a chunk (or list
        record) of another list of the name, dropped and loaded again since, is left to
        that list's own takes. `held`: how many tokens the take gave this reservation
        already (its retry store's).

        A pop is not repeated when its answer is lost: a second pop would take other IDs.
        The IDs it took have left their chunk unclaimed, their jobs `queued`: a sweep
        offers them again, as a reserver's that died between its pop and its claims,
        set off by the mark a lost answer leaves (`_answer_lost`). A pop or an advance that fails once tokens are
        held returns them, to be claimed: they left the list record and their chunks,
        and raising would leave them to the sweeper too. The store's trouble shows at
        the next call."""
        got: list[int] = []
        try:
            while len(got) < k and cursor < pubs:
                # A 'stale' pop did nothing: sent again, with a fresh deadline.
                pop = functools.partial(
                    transitions.ids_once, self.backend, keys.chunk_name(name, cursor), "pop", k - len(got),
                    busy_s=self.busy_deadline_s, extra=(created,),
                )
                try:
                    popped = transitions.retry_stale(pop, deadline_s=self.busy_deadline_s)
                except BackendTimeout as e:
                    self._answer_lost(e)
                    raise
                if popped == "other":  # the name's list since the take: its chunks are its own
                    if not got and not held:
                        raise _ListReplaced  # nothing taken: `_reserve` takes again, from the new list
                    break
                got.extend(popped)
                if len(got) < k:
                    seen = cursor
                    cursor = transitions.list_udf(
                        self.backend, name, "advance", seen, deadline_s=self.busy_deadline_s, after=(created,)
                    )
                    if cursor <= seen:  # the list record is gone, or another list's
                        break
        except AeroqueueError as e:
            if not got and not held:
                raise
            log.warning("ID store pops cut short: the jobs taken so far are claimed", extra={
                "event": "pops_cut_short", "list": name, "taken": held + len(got), "error": str(e)})
        return got

    def _claim(
        self, name: str, sess: str, rid: str, tlim: int, tokens: list[int], acks: list[tuple[Job, Any]],
        earlier: list[Job], lost: list[Job], created: int | None = None,
    ) -> list[Job]:
        """Claim `tokens` (taken from the list of stamp `created`: a job of another list
        of the name is not claimed) and send `acks` with them; the jobs claimed."""
        jobs: list[Job] = []
        acked: list[BatchResult] = []
        if acks:
            calls = [(keys.job_name(name, t), [sess, rid, tlim]) for t in tokens]
            try:
                results = self._batch(calls, acks, created)
            except IN_DOUBT:
                # The whole batch's answer was lost (a node died mid-call): each claim
                # and ack is repeated alone below, which is safe for both.
                names = [c[0] for c in calls] + [job.name for job, _ in acks]
                results = [BatchResult(name=n, ok=False, value=None, code=-1) for n in names]
            except AeroqueueError as e:
                e._acks_unsent = True  # type: ignore[attr-defined]  # refused whole: `_reserve` sends them alone
                raise
            results, acked = results[: len(calls)], results[len(calls) :]
            answers = [r.value for r in results if _answered(r)]
            # A busy key, an answer lost in the batch, or a claim refused as stale: claim
            # it alone. The same request id makes a claim that did happen answer 'ok' again.
            # The acks' answers are in: whatever fails here, they are still decided below.
            answers += self._claim_alone(
                name, sess, rid, tlim, [t for t, r in zip(tokens, results, strict=True) if not _answered(r)],
                created, keep=True,
            )
        elif len(tokens) == 1:
            answers = [self._claim_one(name, sess, rid, tlim, tokens[0], created)]
        else:
            jobs, answers = self._claim_many(name, sess, rid, tlim, tokens, created)
        try:
            self._reschedule(name, answers)
        except AeroqueueError as e:
            # The delayed jobs the claims refused stay off the schedule, the sweeper's;
            # the jobs claimed are handed out all the same.
            log.warning("delayed jobs not scheduled", extra={"event": "reschedule_failed", "list": name, "error": str(e)})
        jobs += self._jobs(name, sess, rid, tlim, [a for a in answers if a and a.get("st") == "ok"])
        too_big: list[tuple[Job, Any]] = []
        failed: AeroqueueError | None = None
        try:
            for (job, result), answer in zip(acks, acked, strict=True):
                try:
                    if not self._acked(job, result, answer):
                        lost.append(job)
                except RecordTooBig:
                    too_big.append((job, result))  # the same result is as big next time: the others go on
                except AeroqueueError as e:
                    # The others are decided (and counted) all the same: one ack's
                    # trouble must not leave acks that landed without their bits.
                    failed = failed or e
            if failed is not None:
                # Its account too: what else was refused or too big is not lost from sight.
                failed.too_big, failed.lost = [j for j, _ in too_big], lost  # type: ignore[attr-defined]
                raise failed
            if too_big:
                raise _too_big(too_big, len(acks), lost, self.backend.max_record_size())
        except AeroqueueError as e:
            e.reserved = earlier + jobs
            e._from_ack = True  # type: ignore[attr-defined]
            raise
        return jobs

    def _claim_many(
        self, name: str, sess: str, rid: str, tlim: int, tokens: list[int], created: int | None
    ) -> tuple[list[Job], list[Any]]:
        """Claims of many tokens in one batch of native operations (`hotpath`): the jobs
        claimed, and the UDF's answers for every token the batch left undecided. Jobs are
        built straight from the bins the batch read: on the batch path, an intermediate
        object per record cost the client more than its share of the call itself."""
        backend = self.backend
        try:
            out = hotpath.claim_many(
                backend, keys.job_names(name, tokens), sess, rid, tlim, backend.job_deadline(), created
            )
        except IN_DOUBT:  # the whole answer was lost: each is claimed alone below
            out = [(-1, None)] * len(tokens)
        jobs = self._jobs(name, sess, rid, tlim, [b for code, b in out if code == 0 and b is not None])
        # Not a queued job (or no job), or past its deadline: the UDF decides. Busy, or the
        # answer lost: claimed alone, where the same request id makes a claim that did
        # happen answer 'ok' again.
        undecided = [t for t, (code, b) in zip(tokens, out, strict=True) if code != 0 or b is None]
        return jobs, self._claim_alone(name, sess, rid, tlim, undecided, created, keep=bool(jobs))

    def _claim_alone(
        self, name: str, sess: str, rid: str, tlim: int, tokens: list[int], created: int | None, *, keep: bool
    ) -> list[Any]:
        """`_claim_one` of each token: the answers. A claim that fails raises, unless
        something is to be kept (`keep`: jobs claimed or acks decided by the same call)
        or an earlier token here was answered: then the answers so far are returned.
        Jobs already claimed are handed out, not dropped: this live session would hold
        them until their time limit, each losing an attempt. The tokens not tried are
        the sweeper's, as a reserver's that died between take and claim; the store's
        trouble shows at the next call."""
        answers = []
        for t in tokens:
            try:
                answers.append(self._claim_one(name, sess, rid, tlim, t, created))
            except AeroqueueError as e:
                if not keep and not answers:
                    raise
                log.warning("claims cut short: the jobs claimed so far are handed out", extra={
                    "event": "claims_cut_short", "list": name, "untried": len(tokens) - len(answers), "error": str(e)})
                break
        return answers

    def _lease(
        self, name: str, session: Session, rid: str, tlim: int, now: int, tokens: list[int], fresh: range, took: float,
        created: int | None = None,
    ) -> list[Job]:
        """Lease the queued jobs among the `fresh` `tokens` to `session`: one pop of their
        block records (`blocks`, the list's stamp `created` given), one batch read of
        the records of those without an entry, one write of the lease on the session
        record. The other tokens
        (from the retry store, which may hold a token twice), and fresh ones that are not
        a queued job (delayed, gone) or were kicked, are claimed as `reserve` claims them, so a claim
        fences them and the UDF decides. Each lease has its own id (a reservation that
        takes twice makes two), which claims made from it (`_adopt`, the reaper) carry
        as request id."""
        # Split by content, not by count: under one request id a second pass may hold a
        # retry-store token in place of a fresh one seen before, and only a claim fences it.
        others = [t for t in tokens if t not in fresh]
        if others:
            tokens = [t for t in tokens if t in fresh]
        lid, until, sess = _request_id(), now + tlim, session.id  # under `Session.claiming` (`_reserve`)
        popped: list[tuple[int, list[Any]]] = []  # (token, its block entry [jid, payload])
        leased: list[dict[str, Any]] = []  # the bins read of the others leased
        held: list[int] = []
        groups: dict[tuple[int, int | None, int | None], list[int]] = defaultdict(list)
        if created is not None:
            # Jobs as their loader wrote them (blocks.py): attempt 0, never claimed, this
            # list's. The ack's filter checks each record, as for any lease.
            entries = blocks.pop(self.backend, name, created, tokens)
            if entries:
                popped = [(t, entries[t]) for t in tokens if t in entries]
                held = [t for t, _ in popped]
                groups[(0, None, created)] = list(held)
                tokens = [t for t in tokens if t not in entries]
        try:
            recs = self.backend.batch_bins(keys.JOB_SET, keys.job_names(name, tokens), hotpath.LEASE_READS_LIST)
        except AeroqueueError:
            if not popped:
                # Nothing is leased: claimed instead, whose batch handles every failure.
                return self._claim(name, sess, rid, tlim, others + tokens, [], [], [], created)
            # The popped ones are leased; the others claimed after them.
            recs = [(-1, None)] * len(tokens)
        for token, (code, b) in zip(tokens, recs, strict=True):
            if code == 0 and b is not None and created is not None and b.get("c") not in (None, created):
                # Another list of the name, dropped and loaded again since the take:
                # its job, which its own takes hand out, is nothing of this one's.
                continue
            # A kicked job may be in the retry store too (aq_job_v1.lua, `kicked`): a
            # lease would not fence that copy, a claim does.
            if code == 0 and b is not None and b.get("state") == "queued" and type(b.get("att")) is int \
                    and b.get("kicked") is None:
                leased.append(b)
                held.append(token)
                groups[(b["att"], b.get("claimed"), b.get("c"))].append(token)
            else:
                others.append(token)
        jobs: list[Job] = []
        if held:
            # Recorded before any job is handed out: a process that dies after this
            # leaves its jobs to the reaper. One that dies between the take and this
            # leaves them taken and held by no one: the sweeper's, as between a take
            # and a claim. Recorded late, a sweep may have missed it (LEASE_SETTLE_S).
            entry = [name, until, [[att, at, toks, c] for (att, at, c), toks in groups.items()]]
            try:
                # Also by the server's clock, from the take's: a lease sent in time but
                # frozen on its way (its process stopped, a node holding it) lands too late.
                session.lease(lid, entry, within_s=max(0.0, took + LEASE_WINDOW_S - time.monotonic()),
                              by_ms=now + round(LEASE_WINDOW_S * 1000))
            except SessionLost:
                # Reaped meanwhile (its process paused past the expiry, say): what the
                # take took is held by no one, as after a lost answer. Marked, so that
                # a worker sweeps soon rather than the regular sweep, minutes later.
                self._mark_lost_take()
                raise
            except AeroqueueError as e:
                # Not recorded in time, maybe not at all (or too big for the session
                # record): claimed instead, which fences them whatever a sweep did. If
                # the lease did land, the claims make it void, and it is forgotten.
                log.warning("lease not recorded: jobs claimed instead", extra={
                    "event": "lease_fallback", "list": name, "jobs": len(held), "error": str(e)})
                session.settle(lid)
                return self._claim(name, sess, lid, tlim, held + others, [], [], [], created)
            with self._lock:
                # Leases whose jobs someone else acknowledged (or nobody did) end here,
                # not in this dict: the reaper ends them on the server.
                for old in [k for k, v in self._leases.items() if v[2] < now]:
                    del self._leases[old]
                self._leases[lid] = (session, set(held), until)
            jobs = self._popped_jobs(name, sess, lid, tlim, popped, until, created)
            jobs += self._jobs(name, sess, lid, tlim, leased, until=until)
        if others:
            try:
                jobs += self._claim(name, sess, lid, tlim, others, [], jobs, [], created)
            except AeroqueueError as e:
                if not jobs:
                    raise
                # The leased jobs are handed out, not dropped: the lease holds them for
                # this live session. The others not claimed are the sweeper's (`_claim_alone`).
                log.warning("claims cut short: the leased jobs are handed out", extra={
                    "event": "claims_cut_short", "list": name, "untried": len(others), "error": str(e)})
        return jobs

    def _settled(self, *jobs: Job) -> None:
        """Leased jobs were acknowledged, or claimed (`_adopt`): their leases hold them
        no more; the session forgets a lease with none left (with its next lease or
        heartbeat, or when it closes)."""
        by_lease: dict[str, list[int]] = defaultdict(list)
        for job in jobs:
            by_lease[job.rid].append(job.token)
        for lid, tokens in by_lease.items():
            self._settle_tokens(lid, tokens)

    def _settle_tokens(self, lid: str, tokens: list[int]) -> None:
        """`_settled` for tokens of one lease."""
        with self._lock:
            entry = self._leases.get(lid)
            if entry is None:
                return
            entry[1].difference_update(tokens)
            if entry[1]:
                return
            del self._leases[lid]
        entry[0].settle(lid)

    def _adopt(self, job: Job, tlim: int, *, in_time: bool = False, late: bool = False) -> None:
        """A leased job becomes a claim of its session under the lease's id, with a time
        limit of `tlim` ms: fail, snooze, release, expire and touch are UDFs that act on
        claims. If the job is no longer as the lease read it, nothing changes, and the
        UDF that follows answers for what it is ('lost', 'again').

        `in_time` (touch, fail, snooze: what a claim past its limit refuses as 'late'):
        only before the lease's end by the server's clock. Past it the job stays leased,
        and the lease with it, for the reaper to end as timed out, as a late ack leaves
        it; the UDF that follows finds it not held and answers 'lost'.

        `late` (release, which counts a timed-out attempt rather than refusing it):
        before the lease's end a claim of `tlim`, past it one already past its limit, as
        the reaper makes it, so that the release counts the attempt the lease spent."""
        if job.lease is None:
            return
        att, claimed, until, created = job.lease
        backend = self.backend

        def adopt(tlim: int, until: int | None) -> int:
            # Safe to repeat: a repeat that finds it claimed already changes nothing. Still
            # in doubt at the deadline, the error reaches the caller and the lease keeps the job.
            return hotpath.until_decided(
                lambda _: hotpath.claim_leased(
                    backend, [job.name], job.session, job.rid, tlim, att, claimed, backend.job_deadline(),
                    until=until, created=created,
                ),
                1, self.busy_deadline_s, f"claiming leased job {job.name}",
            )[0]

        code = adopt(tlim, until if in_time or late else None)
        if code != 0 and late:
            # Past the lease's end, or not as leased any more (then refused again).
            code = adopt(PAST_LIMIT, None)
        if code == 0 or not in_time:
            self._settled(job)

    def _popped_jobs(
        self, name: str, sess: str, lid: str, tlim: int, popped: list[tuple[int, list[Any]]], until: int,
        created: int | None,
    ) -> list[Job]:
        """Jobs leased from their block entries (`_lease`): `_jobs` of bins as the loader
        wrote them (attempt 0, never claimed), built straight from the entries. Every
        job of the lease shares one fence tuple; a dict a job built first and read back
        cost the client as much again (about 0.9 us a job, measured)."""
        base = {"list": name, "session": sess, "timeout_s": tlim / 1000, "rid": lid, "toucher": self.touch,
                "lease": (0, None, until, created), "created": created, "attempt": 1}
        new = object.__new__
        jobs: list[Job] = []
        append = jobs.append
        for token, (jid, payload) in popped:
            job = new(Job)
            d = job.__dict__
            d.update(base)
            d["token"], d["jid"], d["payload"] = token, jid, payload
            append(job)
        return jobs

    def _jobs(
        self, name: str, sess: str, rid: str, tlim: int, claims: list[dict[str, Any]], *, until: int | None = None
    ) -> list[Job]:
        """Jobs from what their claims answered (the UDF's 'ok' answers, or the bins a
        native claim read: both hold token, jid, payload and att), or, with `until`,
        from the bins a lease read (`_lease`: the attempt is the next one, and the
        fence is the att and claimed read).

        Built by filling each instance's dict from one shared template, not by the
        frozen dataclass's __init__ (a guarded setattr per field): on the batch path
        that __init__ was a third of the client's own Python per job. The result is
        the same object (`test_reserved_jobs_are_plain_jobs`)."""
        base = {"list": name, "session": sess, "timeout_s": tlim / 1000, "rid": rid, "toucher": self.touch,
                "lease": None, "created": None}
        new = object.__new__
        jobs: list[Job] = []
        append = jobs.append
        if until is None:
            for c in claims:
                job = new(Job)
                d = job.__dict__
                d.update(base)
                d["token"], d["jid"], d["payload"], d["attempt"] = c["token"], c["jid"], c.get("payload"), c["att"]
                d["created"] = c.get("c")
                append(job)
            return jobs
        for b in claims:
            job = new(Job)
            d = job.__dict__
            d.update(base)
            att = b["att"]
            d["token"], d["jid"], d["payload"], d["attempt"] = b["token"], b["jid"], b.get("payload"), att + 1
            d["lease"] = (att, b.get("claimed"), until, b.get("c"))
            d["created"] = b.get("c")
            append(job)
        return jobs

    def _batch(
        self, claims: list[tuple[str, list[Any]]], acks: list[tuple[Job, Any]], created: int | None
    ) -> list[BatchResult]:
        """Claims (of the list of stamp `created`) and acks in one batch call: the claims'
        results, then the acks'."""
        deadline = self.backend.job_deadline()
        calls = [(n, "claim", [*args, deadline, created]) for n, args in claims]
        calls += [(job.name, "complete", [job.session, {job.token: result}, job.rid, deadline]) for job, result in acks]
        return self.backend.batch_udfs(keys.JOB_SET, calls, keys.JOB_MOD)

    def _claim_one(self, name: str, sess: str, rid: str, tlim: int, token: int, created: int | None) -> Any:
        """One claim, repeated while its answer is in doubt (a timeout, a node lost)
        until the deadline. The UDF, not the native operation: for one record the
        operation costs the client more CPU than the UDF costs the server
        (`hotpath`), so the native form is kept for batches. `created`: the stamp of
        the list the token was taken from (`_claim`)."""
        return self._job_udf(keys.job_name(name, token), "claim", sess, rid, tlim, created=created)

    def _reschedule(self, name: str, answers: list[Any]) -> None:
        """Delayed jobs reached before their time (a recovered load range, the sweeper,
        an overflowing schedule) go onto the schedule for when they are due."""
        waits: dict[tuple[int, int | None], list[int]] = defaultdict(list)
        for a in answers:
            if a and a.get("st") == "delayed":
                waits[(int(a["wait"]), a.get("c"))].append(a["token"])
        for (wait, created), toks in waits.items():
            transitions.schedule(self.backend, name, toks, wait, created)

    # -- acknowledge -------------------------------------------------------------

    def complete(self, job: Job, result: Any = None) -> None:
        """Mark a job done, exactly once. Repeating a successful complete is harmless;
        a complete from a session that lost the claim raises `ClaimLost`. A result
        that cannot be stored as JSON raises `ResultNotStorable`, with nothing sent."""
        _checked_jobs("complete", [job])
        result = checked_result(result)
        try:
            self._complete_one(job, result)
        except RecordTooBig as e:
            # The store's own answer names the UDF and the code, not the sizes nor what to do;
            # ``too_big`` and ``lost`` as complete_many's, so one handler serves both.
            raise _too_big([(job, result)], 1, [], self.backend.max_record_size()) from e

    def _complete_one(self, job: Job, result: Any) -> None:
        if job.lease is not None:
            code = self._leased_codes([job], [result])[0]
            if code == 13:
                raise RecordTooBig(f"acknowledging job {job.jid!r}: the record would exceed the namespace's "
                                   "max-record-size", code=13)
            if code == 0:
                self._settled(job)
                self.bits.add(job.list, [job.token], job.created)
                return
            try:
                self._complete_claim(job, result)
            except ClaimLost:
                if time.time() * 1000 > job.lease[2]:
                    # Past the lease's end (by this host's clock: the refusal was the server's),
                    # say so, as for a claim: 'lost' named an expiry, a reap or a bury.
                    self._check(job, "late")
                raise
            self._settled(job)  # done, by a claim made from the lease, or before ('again')
            return
        self._complete_claim(job, result)

    def _complete_claim(self, job: Job, result: Any) -> None:
        """`complete` by the UDF: a claim's ack, or a leased job's that is not as leased
        any more (claimed by its holder since: done; acknowledged already: 'again';
        anything else: `ClaimLost`)."""
        # The UDF for one job, as for one claim (`_claim_one`), sent directly the first
        # time (`_reserve_one` says why); in doubt or refused as stale, it is repeated
        # with the retry loops, which is safe: a repeat that finds it done answers 'again'.
        backend, args = self.backend, (job.session, {job.token: result}, job.rid)
        try:
            st = backend.apply(keys.JOB_SET, job.name, keys.JOB_MOD, "complete", *args, backend.job_deadline())
        except IN_DOUBT:
            st = None
        if st is None or transitions.is_stale(st):
            st = self._job_udf(job.name, "complete", *args)
        self._check(job, st)
        self.bits.add(job.list, [job.token], job.created)

    def _acked(self, job: Job, result: Any, answer: BatchResult) -> bool:
        """An ack that rode in a batch, checked as `complete` checks: False when the
        claim was lost; an ack in doubt (busy, timeout) is sent again alone."""
        if not _answered(answer):
            try:
                self.complete(job, result)
            except ClaimLost:
                return False
            return True
        if answer.value in ("lost", "late"):
            return False
        self._check(job, answer.value)
        self.bits.add(job.list, [job.token], job.created)
        return True

    def complete_many(self, jobs: Sequence[Job], results: Sequence[Any] | None = None) -> list[Job]:
        """Complete a batch in one round trip (native operations, `hotpath`). Returns the
        jobs whose claim was lost (not completed by this call). `results`, if given, holds
        one result per job (ValueError otherwise, before anything is written), each a
        value JSON can hold (`ResultNotStorable` otherwise, before anything is written).
        Jobs whose record the result would make too big are not completed: once every
        other ack is decided, `RecordTooBig` is raised, its ``too_big`` holding those
        jobs and its ``lost`` what this call would have returned."""
        if not jobs:
            return []
        _checked_jobs("complete_many", jobs)
        results = _checked_results(results) if results is not None else [None] * len(jobs)
        if len(results) != len(jobs):
            # Checked before anything is written: a mismatch found later would leave
            # some jobs done without their bits and their lease unsettled.
            raise ValueError(f"complete_many: {len(jobs)} jobs but {len(results)} results")
        lost: list[Job] = []
        lease = _one_lease(jobs, results)
        if lease is not None:
            # The common batch: one lease's jobs, one result for all. Every step below
            # runs once for the batch, not once a job (the client's share per job was
            # most of what aeroqueue's own Python added to the calls).
            list_name, sess, rid, fence = lease
            tokens = [j.token for j in jobs]
            names = keys.job_names(list_name, tokens)
            backend = self.backend
            try:
                codes = hotpath.until_decided(
                    lambda idx: hotpath.complete_leased_same(
                        backend, [names[i] for i in idx], sess, rid, fence, results[0], backend.job_deadline()
                    ),
                    len(names), self.busy_deadline_s, f"acknowledging {len(names)} leased jobs", too_big=True,
                )
            except AeroqueueError as e:  # in doubt, or failed part-way
                self._landed(jobs, e)
                raise
            if not any(codes):  # every one done
                self.bits.add(list_name, tokens, fence[3])
                self._settle_tokens(rid, tokens)
                return []
        else:
            codes = self._complete_codes(jobs, results)
        done: list[Job] = []
        alone, too_big = [], []
        for job, res, code in zip(jobs, results, codes, strict=True):
            if code == 0:
                done.append(job)
            elif code == 13:
                too_big.append((job, res))
            else:
                alone.append((job, res))
        # The bits of what is done before any repeat below can raise.
        self._add_bits(done)
        self._settled(*[job for job in done if job.lease is not None])
        for job, res in alone:
            # Not plainly ours, past its deadline, busy, or the answer lost: the UDF
            # completes it alone, or says why not ('again' is fine).
            try:
                self._complete_claim(job, res)
            except (ClaimLost, JobNotFound):
                # Not settled: past the lease's limit and untouched, it is the reaper's
                # to end as timed out (the lease says so); taken by anyone since, the
                # reaper finds that and only forgets the lease.
                lost.append(job)
                continue
            except RecordTooBig:
                too_big.append((job, res))
                continue
            if job.lease is not None:
                self._settled(job)
        if too_big:
            # Raised once every other ack is decided (and counted): the same result
            # is as big next time, so these jobs are the caller's to fail instead.
            raise _too_big(too_big, len(jobs), lost, self.backend.max_record_size())
        return lost

    def _leased_codes(self, jobs: Sequence[Job], results: Sequence[Any]) -> list[int]:
        """The acks of leased jobs, each to a deciding code: 0 done; 2 or 27 not as
        leased any more (the UDF tells 'again', 'late' or 'lost'). An ack whose answer
        was lost is sent again, not taken for refused: the UDF cannot complete a job
        that is only leased, so it would call a job that did not land 'lost'."""
        name = keys.job_name
        items = [(name(j.list, j.token), j.session, j.rid, j.lease, r) for j, r in zip(jobs, results, strict=True) if j.lease]
        backend = self.backend
        try:
            return hotpath.until_decided(
                lambda idx: hotpath.complete_leased(backend, [items[i] for i in idx], backend.job_deadline()),
                len(items), self.busy_deadline_s, f"acknowledging {len(items)} leased jobs", too_big=True,
            )
        except AeroqueueError as e:  # in doubt, or failed part-way
            self._landed([j for j in jobs if j.lease], e)
            raise

    def _landed(self, jobs: Sequence[Job], err: AeroqueueError) -> None:
        """Leased acks some of which stayed in doubt, or whose call failed part-way
        (`err`, from `hotpath.until_decided`): those that landed are done all the same,
        so they are counted (their bits) and settled before the error reaches the
        caller. Otherwise their bits waited for a rare sweep (a session that closes is
        never reaped to recount them)."""
        codes = getattr(err, "codes", None)
        if codes is None:
            return
        landed = [j for j, code in zip(jobs, codes, strict=True) if code == 0]
        self._add_bits(landed)
        self._settled(*landed)

    def _add_bits(self, jobs: Sequence[Job]) -> None:
        """The completion bits of acknowledged `jobs`: one add per list (and list stamp,
        which the bit writer checks before it writes: `transitions.BitBuffer`)."""
        by_list: dict[tuple[str, int | None], list[int]] = defaultdict(list)
        for job in jobs:
            by_list[(job.list, job.created)].append(job.token)
        for (list_name, created), tokens in by_list.items():
            self.bits.add(list_name, tokens, created)

    def _complete_codes(self, jobs: Sequence[Job], results: list[Any]) -> list[int]:
        """Each job's code from one batch of native acks (0: done), claims and leases
        alike (two batches when a call mixes them); -1 sends a job to the UDF."""
        leased = [i for i, j in enumerate(jobs) if j.lease is not None]
        if not leased and len(jobs) == 1:
            return [-1]  # one claim: the UDF
        if len(leased) == len(jobs):  # a lease's batch: the common case
            return self._leased_codes(jobs, results)
        codes = [-1] * len(jobs)
        if leased:
            out = self._leased_codes([jobs[i] for i in leased], [results[i] for i in leased])
            for i, code in zip(leased, out, strict=True):
                codes[i] = code
        deadline = self.backend.job_deadline()
        try:
            claimed = [i for i, j in enumerate(jobs) if j.lease is None]
            if len(claimed) > 1:
                # Each job gets only its own result (not the whole batch's).
                out = hotpath.complete_many(
                    self.backend, [(jobs[i].name, jobs[i].session, jobs[i].rid, results[i]) for i in claimed], deadline
                )
                for i, code in zip(claimed, out, strict=True):
                    codes[i] = code
        except IN_DOUBT:
            pass  # what did not come back goes to the UDF, which is safe to repeat
        except AeroqueueError as e:
            # One claim's call failed plainly after others landed (`hotpath._per_group`):
            # those are done; the rest goes to the UDF, which says why not.
            for i, code in zip(claimed, getattr(e, "codes", None) or [], strict=False):
                if code == 0:
                    codes[i] = 0
        return codes

    def fail(self, job: Job, error: str) -> str:
        """Record a failure: back to the queue while attempts remain, after the list's
        backoff ('delayed', or 'retry' with no backoff), else 'dead'."""
        _checked_jobs("fail", [job])
        if not isinstance(error, str):
            raise TypeError(f"fail: error must be text (str), not {error!r:.60}")
        self._adopt(job, _ms(job.timeout_s), in_time=True)
        st = transitions.fail(
            self.backend, job.list, job.token, job.session, error, delay_ms=self.backoff_ms(job.list, job.attempt),
            rid=job.rid, deadline_s=self.busy_deadline_s, holder=True, created=job.created,
        )
        self._check(job, st)
        return st

    def snooze(self, job: Job, after_s: float) -> str:
        """Run the job again `after_s` from now, without counting this attempt ('delayed')."""
        _checked_jobs("snooze", [job])
        after_s = _delay_s(after_s, "Retry(after=...)")
        self._adopt(job, _ms(job.timeout_s), in_time=True)
        st = transitions.snooze(self.backend, job.list, job.token, job.session, round(after_s * 1000), rid=job.rid,
                                deadline_s=self.busy_deadline_s, created=job.created)
        self._check(job, st)
        return st

    def expire(self, job: Job, why: str | None = None) -> str:
        """End a claim that ran past its time limit, as a failed attempt whose error says
        so: 'retry', 'delayed', 'dead', or 'early' (not past it by the server's clock
        yet), 'lost' (not ours any more)."""
        _checked_jobs("expire", [job])
        why = why or f"timed out: not acknowledged within its time limit of {job.timeout_s:g} s"
        self._adopt(job, PAST_LIMIT)  # the caller judged it past its limit: so is the claim's
        return transitions.expire(
            self.backend, job.list, job.token, job.session, why, delay_ms=self.backoff_ms(job.list, job.attempt),
            rid=job.rid, deadline_s=self.busy_deadline_s, holder=True, created=job.created,
        )

    def touch(self, job: Job, seconds: float | datetime.timedelta | None = None) -> float:
        """Extend a claim's time limit to `seconds` (default: the job's own) from now.
        Returns the seconds granted; `ClaimLost` if the claim is gone or already late."""
        _checked_jobs("touch", [job])
        seconds = _delay_s(job.timeout_s if seconds is None else seconds, "touch", positive=True)
        self._adopt(job, _ms(seconds), in_time=True)
        sent = time.monotonic()
        out = self._job_udf(job.name, "touch", job.session, max(1, round(seconds * 1000)), job.rid)
        self._check(job, out["st"])
        # The new limit runs from the server's touch, inside the call: a listener's
        # deadline counted from the answer would come after the server's.
        left = seconds - (time.monotonic() - sent)
        for listener in list(self._touched):
            listener(job, left)
        return seconds

    def on_touch(self, listener: Callable[[Job, float], None]) -> None:
        """Be told of every touch made through this queue: the job, and the seconds its
        claim has left from now (those granted, less the touch's round trip)."""
        self._touched.append(listener)

    def backoff_ms(self, list_name: str, attempt: int) -> int:
        """How long a failed attempt waits before the job is reservable again."""
        now = time.monotonic()
        with self._lock:
            policy = self._policies.get(list_name)
        if policy is None or now - policy[0] > POLICY_TTL_S:
            try:
                head = self.lists.header(list_name)
            except ListNotFound:
                return 0
            policy = (now, *backoff_of(head))
            with self._lock:
                self._policies[list_name] = policy
        return transitions.backoff_ms(attempt, policy[1], policy[2])

    def release(self, job: Job, why: str = "released", *, refund: bool = True) -> str:
        """Give a claimed job back, if this session still holds it. With `refund` the
        attempt is returned (it never ran); without, it counts (it ran, or may have).
        Past its claim's (or lease's) time limit it counts whatever `refund` says: the
        attempt timed out, as the reaper would have ended it ('dead' on the last one)."""
        _checked_jobs("release", [job])
        self._adopt(job, _ms(job.timeout_s), late=True)
        return transitions.release(
            self.backend, job.list, job.token, job.session, refund=refund, why=why, rid=job.rid,
            deadline_s=self.busy_deadline_s, holder=True, created=job.created,
        )

    def flush(self) -> None:
        """Write the completion bits still pending in this process."""
        self.bits.flush()

    @staticmethod
    def _check(job: Job, st: str) -> None:
        if st == "missing":
            raise JobNotFound(f"job {job.name} (id {job.jid!r}) does not exist")
        if st == "lost":
            raise ClaimLost(
                f"job {job.name} (id {job.jid!r}): the claim of session {job.session} was lost "
                "(expired, reaped or buried, and maybe given to another session); the acknowledgement was refused"
            )
        if st == "late":
            raise ClaimLost(
                f"job {job.name} (id {job.jid!r}): the claim ran past its time limit ({job.timeout_s:g} s) and will "
                "be retried as timed out; the acknowledgement was refused"
            )


# Request ids: a random prefix per process and a counter, unique without a
# getrandom call per reservation (uuid4 cost the API path a system call each).
# A forked child (gunicorn's pre-fork workers) draws a prefix of its own.
_RID_PREFIX = ""
_rid_counter = itertools.count()


def _too_big(too_big: list[tuple[Job, Any]], of: int, lost: list[Job], max_record_size: int) -> RecordTooBig:
    """The error for acks whose results would make their records too big, raised once
    every other ack of the call is decided: ``too_big`` holds those jobs, ``lost``
    the call's refused ones. It says the (largest) result's size and the limit."""
    if len(too_big) == 1:
        (job, result), = too_big
        what, why = f"job {job.jid!r}" + (f" (1 of {of})" if of > 1 else ""), too_big_to_store(result, max_record_size)
    else:
        largest = max((r for _, r in too_big), key=lambda r: result_size(r) or 0)
        what = f"{len(too_big)} of {of} jobs"
        why = too_big_to_store(largest, max_record_size, "the largest result")
    others = "; the others were acknowledged" if len(too_big) < of else ""
    err = RecordTooBig(f"acknowledging {what}: {why}{others}", code=13)
    err.too_big, err.lost = [j for j, _ in too_big], lost  # type: ignore[attr-defined]
    return err


# Takes again after an ID-mode take met another list's chunk with nothing taken (a
# drop and a load of the name in between): one is enough unless the name is dropped
# and loaded again over and over.
REPLACED_RETAKES = 3


class _ListReplaced(Exception):
    """An ID-mode take's cursor was of a list dropped and loaded again under its name
    since, and it took nothing: the reservation takes again, from the new list."""


def _checked_results(results: Sequence[Any]) -> list[Any]:
    """`checked_result` of each result, once per object: a result shared by a batch
    stays one object (`_one_lease` looks for that)."""
    if isinstance(results, str | bytes):  # a sequence too: its characters would be the results
        raise TypeError(f"results must hold one result per job, not be one {type(results).__name__}: {results!r:.40}")
    if not isinstance(results, (list, tuple)):
        results = list(results)  # any iterable, a generator too
    first = results[0] if results else None
    if all(r is first for r in results):  # one result for a whole batch: checked once
        return [checked_result(first)] * len(results)
    seen: dict[int, tuple[Any, Any]] = {}  # id -> (the object, kept alive so its id is not reused; its value)
    out = []
    for r in results:
        known = seen.get(id(r))
        if known is None:
            known = seen[id(r)] = (r, checked_result(r))
        out.append(known[1])
    return out


def _one_lease(jobs: Sequence[Job], results: list[Any]) -> tuple[str, str, str, LeaseFence] | None:
    """(list, session, lease id, fence) when every job was leased by one lease with the
    same fence and every result is the same object (a lease's batch acknowledged at
    once); None otherwise."""
    first = jobs[0]
    fence, rid, sess, name, res = first.lease, first.rid, first.session, first.list, results[0]
    if fence is None:
        return None
    for job in jobs:
        if job.rid != rid or job.lease != fence or job.session != sess or job.list != name:
            return None
    for r in results:
        if r is not res:
            return None
    return name, sess, rid, fence


def _new_rid_prefix() -> None:
    global _RID_PREFIX, _rid_counter
    _RID_PREFIX, _rid_counter = uuid.uuid4().hex[:20], itertools.count()


_new_rid_prefix()
os.register_at_fork(after_in_child=_new_rid_prefix)


def _checked_target(list_name: Any, session: Any) -> None:
    """A reservation's list and session, checked before any call: a wrong one surfaced
    as an AttributeError deep in the reservation, and an empty session id made claims
    that no session's heartbeat keeps (the reaper's, minutes later)."""
    keys.check_list_name(list_name)
    if isinstance(session, str):
        if not session:
            raise ValueError("session id must not be empty: pass a Session, or the id of an open one")
    elif not isinstance(session, Session):
        raise TypeError(f"session must be a Session or a session id (str), not {session!r:.60}")


def _checked_jobs(what: str, jobs: Sequence[Any]) -> None:
    if isinstance(jobs, Job):  # complete_many(job): "'Job' object is not iterable" named no call
        raise TypeError(f"{what} takes a list of Jobs, not one Job: {what}([job])")
    for job in jobs:
        if not isinstance(job, Job):
            raise TypeError(f"{what} takes Jobs (as Queue.reserve returns them), not {job!r:.60}")


def _request_id() -> str:
    return f"{_RID_PREFIX}{next(_rid_counter):012x}"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _answered(result: BatchResult) -> bool:
    """A batch member's answer that settles it: not an error, and not refused as stale."""
    return result.ok and not transitions.is_stale(result.value)


__all__ = ["Job", "Queue", "RecordBusy", "Retry", "retry_busy"]
