"""Reserve and acknowledge: the hot path (design.md, flows reserve/complete/fail).

Round trips, token mode:

- ``reserve``: ``take`` on the list record (the retry store first, then the
  token store), then ``claim`` on the job record (one batch call for n > 1):
  2 per reservation, whatever its size. This is the API handler's path.
- ``complete``: ``complete`` on the job record: 1. Its completion bit goes
  through the process's `transitions.BitBuffer`, one bitmap write per chunk
  for many jobs, so it costs next to nothing per job.
- The worker (`aeroqueue worker`) reserves a few jobs at a time (its
  ``--prefetch``, 4 by default) and acks each: 1 + 2/4 = 1.5 per job.
- ``complete_and_reserve``: acks and the next claims in one batch call after
  the ``take``: 2 per job even one job at a time. Measured on a server on the
  same 2-core machine it costs more CPU than it saves (a batch call's
  objects and the server's batch threads), so the worker prefetches instead;
  it is kept for clients far from their server, where round trips cost more
  than CPU (not measured here).

Each of these UDFs is O(1) in the list's size.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import keys, transitions
from .backends import IN_DOUBT, Backend, BatchResult, retry_busy, retry_in_doubt
from .errors import AeroqueueError, ClaimLost, JobNotFound, ListNotFound, RecordBusy
from .lists import JobLists
from .sessions import Session


@dataclass(frozen=True)
class Job:
    """A reserved job, claimed under `session`."""

    list: str
    token: int
    jid: str
    payload: Any
    attempt: int
    session: str

    @property
    def name(self) -> str:
        return keys.job_name(self.list, self.token)


class Queue:
    """Reservation and acknowledgement on one store."""

    def __init__(self, backend: Backend, *, busy_deadline_s: float = 5.0) -> None:
        self.backend = backend
        self.lists = JobLists(backend)
        # How long RecordBusy on a hot key is retried before it reaches the caller.
        self.busy_deadline_s = busy_deadline_s
        self.bits = transitions.bit_buffer(backend)
        self._modes: dict[str, str] = {}

    def _udf(self, set_name: str, name: str, module: str, function: str, *args: Any) -> Any:
        return self.backend.udf(set_name, name, module, function, *args, deadline_s=self.busy_deadline_s)

    def _job_udf(self, job_name: str, function: str, *args: Any) -> Any:
        """A job UDF that is safe to repeat (claim with its request id, complete: a repeat
        that finds it done answers as the first did), repeated while its answer is in
        doubt: a node that dies mid-call costs a retry, not a job."""
        return retry_in_doubt(
            lambda: self._udf(keys.JOB_SET, job_name, keys.JOB_MOD, function, *args), deadline_s=self.busy_deadline_s
        )

    # -- reserve -------------------------------------------------------------

    def reserve(self, list_name: str, session: Session | str, count: int = 1) -> list[Job]:
        """Reserve up to `count` jobs of a list for `session`; [] when none is reservable.

        O(1) in the list's size: one UDF on the list record takes tokens, one
        (batch) UDF claims them. Tokens that turn out void or already taken (a
        duplicate retry entry) are skipped, and the call tries again, so it
        returns nothing only when the list has nothing to give.
        """
        reserved, _ = self._reserve(list_name, session, count, [])
        return reserved

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
        (maybe nothing): the next reservation shows it again."""
        return self._reserve(list_name, session, count, list(done))

    def _reserve(
        self, list_name: str, session: Session | str, count: int, acks: list[tuple[Job, Any]]
    ) -> tuple[list[Job], list[Job]]:
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        sess = session if isinstance(session, str) else session.claim_id()
        rid = uuid.uuid4().hex  # makes a claim whose answer was lost safe to repeat
        got: list[Job] = []
        lost: list[Job] = []
        pending = acks  # the acks, until they have been sent
        seen: set[int] = set()
        try:
            while len(got) < count:
                taken = self._take(list_name, count - len(got))
                # The retry store may hold a token twice (harmless for anyone else:
                # the claim refuses a job that is not queued). Under one request id
                # the second claim would answer 'ok' again, as a repeated call does,
                # and the job would be handed out twice: claim each token once.
                tokens = [t for t in dict.fromkeys(taken) if t not in seen]
                seen.update(tokens)
                if not taken and not pending:
                    break
                these, pending = pending, []
                got.extend(self._claim(list_name, sess, rid, tokens, these, got, lost))
                if not taken:
                    break
        except AeroqueueError as e:
            if getattr(e, "_from_ack", False):
                raise  # an ack failed; `reserved` carries what was claimed
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

    def _take(self, name: str, k: int) -> list[int]:
        out = self._udf(keys.LIST_SET, name, keys.LIST_MOD, "take", k)
        st = out["st"]
        if st == "missing":
            raise ListNotFound(f"no job list named {name!r}")
        if st == "paused":
            return []
        retry, start, n = out["retry"], out["start"], out["n"]
        tokens = list(range(start, start + n)) if not retry else [*retry, *range(start, start + n)]
        if len(tokens) < k and self._mode(name) == "ids":
            tokens += self._pop_ids(name, k - len(tokens), out["cursor"], out["pubs"])
        return tokens

    def _mode(self, name: str) -> str:
        mode = self._modes.get(name)
        if mode is None:
            mode = self._modes[name] = self.lists.header(name)["mode"]
        return mode

    def _pop_ids(self, name: str, k: int, cursor: int, pubs: int) -> list[int]:
        """ID mode: pop from the chunk at the cursor; move the cursor past drained chunks."""
        got: list[int] = []
        while len(got) < k and cursor < pubs:
            got.extend(self._udf(keys.IDS_SET, keys.chunk_name(name, cursor), keys.IDS_MOD, "pop", k - len(got)))
            if len(got) < k:
                seen = cursor
                cursor = self._udf(keys.LIST_SET, name, keys.LIST_MOD, "advance", seen)
                if cursor <= seen:  # the list record is gone
                    break
        return got

    def _claim(
        self, name: str, sess: str, rid: str, tokens: list[int], acks: list[tuple[Job, Any]],
        earlier: list[Job], lost: list[Job],
    ) -> list[Job]:
        acked: list[BatchResult] = []
        if not acks and len(tokens) == 1:
            answers = [self._claim_one(name, sess, rid, tokens[0])]
        else:
            calls = [(keys.job_name(name, t), [sess, rid]) for t in tokens]
            try:
                if not acks:
                    results = self.backend.batch_apply(keys.JOB_SET, [c[0] for c in calls], keys.JOB_MOD, "claim", sess, rid)
                else:
                    results = self._batch(calls, acks)
            except IN_DOUBT:
                # The whole batch's answer was lost (a node died mid-call): each claim
                # and ack is repeated alone below, which is safe for both.
                names = [c[0] for c in calls] + [job.name for job, _ in acks]
                results = [BatchResult(name=n, ok=False, value=None, code=-1) for n in names]
            results, acked = results[: len(calls)], results[len(calls) :]
            answers = [r.value for r in results if r.ok]
            # A busy key, or an answer lost in the batch: claim it alone. The same
            # request id makes a claim that did happen answer 'ok' again.
            answers += [self._claim_one(name, sess, rid, t) for t, r in zip(tokens, results, strict=True) if not r.ok]
        jobs = [
            Job(list=name, token=a["token"], jid=a["jid"], payload=a.get("payload"), attempt=a["att"], session=sess)
            for a in answers
            if a and a.get("st") == "ok"
        ]
        try:
            for (job, result), answer in zip(acks, acked, strict=True):
                if not self._acked(job, result, answer):
                    lost.append(job)
        except AeroqueueError as e:
            e.reserved = earlier + jobs
            e._from_ack = True  # type: ignore[attr-defined]
            raise
        return jobs

    def _batch(self, claims: list[tuple[str, list[Any]]], acks: list[tuple[Job, Any]]) -> list[BatchResult]:
        """Claims and acks in one batch call: the claims' results, then the acks'."""
        calls = [(n, "claim", args) for n, args in claims]
        calls += [(job.name, "complete", [job.session, {job.token: result}]) for job, result in acks]
        return self.backend.batch_udfs(keys.JOB_SET, calls, keys.JOB_MOD)

    def _claim_one(self, name: str, sess: str, rid: str, token: int) -> Any:
        """One claim, repeated while its answer is in doubt (a timeout, a node lost) until the deadline."""
        return self._job_udf(keys.job_name(name, token), "claim", sess, rid)

    # -- acknowledge -------------------------------------------------------------

    def complete(self, job: Job, result: Any = None) -> None:
        """Mark a job done, exactly once. Repeating a successful complete is harmless;
        a complete from a session that lost the claim raises `ClaimLost`."""
        st = self._job_udf(job.name, "complete", job.session, {job.token: result})
        self._check(job, st)
        self.bits.add(job.list, [job.token])

    def _acked(self, job: Job, result: Any, answer: BatchResult) -> bool:
        """An ack that rode in a batch, checked as `complete` checks: False when the
        claim was lost; an ack in doubt (busy, timeout) is sent again alone."""
        if not answer.ok:
            try:
                self.complete(job, result)
            except ClaimLost:
                return False
            return True
        if answer.value == "lost":
            return False
        self._check(job, answer.value)
        self.bits.add(job.list, [job.token])
        return True

    def complete_many(self, jobs: Sequence[Job], results: Sequence[Any] | None = None) -> list[Job]:
        """Complete a batch in one batch UDF call. Returns the jobs whose claim was lost
        (not completed by this call)."""
        if not jobs:
            return []
        results = list(results) if results is not None else [None] * len(jobs)
        lost: list[Job] = []
        by_session: dict[str, list[tuple[Job, Any]]] = defaultdict(list)
        for job, res in zip(jobs, results, strict=True):
            by_session[job.session].append((job, res))
        for sess, pairs in by_session.items():
            # Each job gets only its own result (not the whole batch's), in one round trip.
            out = self.backend.batch_udf(
                keys.JOB_SET, [(j.name, [sess, {j.token: r}]) for j, r in pairs], keys.JOB_MOD, "complete"
            )
            for (job, res), r in zip(pairs, out, strict=True):
                st = r.value if r.ok else None
                if st is None:  # this key failed (busy, in doubt): complete it alone
                    try:
                        self.complete(job, res)
                    except (ClaimLost, JobNotFound):
                        lost.append(job)
                elif st in ("ok", "again"):
                    self.bits.add(job.list, [job.token])
                else:
                    lost.append(job)
        return lost

    def fail(self, job: Job, error: str) -> str:
        """Record a failure: back to the queue while attempts remain ('retry'), else 'dead'."""
        st = transitions.fail(self.backend, job.list, job.token, job.session, error, deadline_s=self.busy_deadline_s)
        self._check(job, st)
        return st

    def release(self, job: Job, why: str = "released", *, refund: bool = True) -> str:
        """Give a claimed job back, if this session still holds it. With `refund` the
        attempt is returned (it never ran); without, it counts (it ran, or may have)."""
        return transitions.release(
            self.backend, job.list, job.token, job.session, refund=refund, why=why, deadline_s=self.busy_deadline_s
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
                "(expired or reaped, and the job was given to another session); the acknowledgement was refused"
            )


__all__ = ["Job", "Queue", "RecordBusy", "retry_busy"]
