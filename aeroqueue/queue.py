"""Reserve and acknowledge: the hot path (design.md, flows reserve/complete/fail).

Round trips on the single path, token mode: ``take`` on the list record (the
retry store first, then the token store), ``claim`` on the job record,
``complete`` on the job record, and one bitwise operate on the completion
bitmap: 4 per job. The batch path makes the same four calls per batch
(batch UDFs), whatever its size.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aerospike
from aerospike_helpers.operations import bitwise_operations as bw

from . import keys
from .backends import Backend, retry_busy
from .errors import AeroqueueError, BackendTimeout, ClaimLost, JobNotFound, ListNotFound
from .lists import RETRY_CAP, JobLists

if TYPE_CHECKING:
    from .sessions import Session

BITMAP_BYTES = keys.BITS_PER_CHUNK // 8
_ONE = bytearray([0x80])
_ZERO = bytearray([0x00])


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
        self._modes: dict[str, str] = {}

    def _udf(self, set_name: str, name: str, module: str, function: str, *args: Any) -> Any:
        return self.backend.udf(set_name, name, module, function, *args, deadline_s=self.busy_deadline_s)

    # -- reserve -------------------------------------------------------------

    def reserve(self, list_name: str, session: Session | str, count: int = 1) -> list[Job]:
        """Reserve up to `count` jobs of a list for `session`; [] when none is reservable.

        O(1) in the list's size: one UDF on the list record takes tokens, one
        (batch) UDF claims them. Tokens that turn out void or already taken (a
        duplicate retry entry) are skipped, and the call tries again, so it
        returns nothing only when the list has nothing to give.
        """
        if count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        sess = session if isinstance(session, str) else session.claim_id()
        rid = uuid.uuid4().hex  # makes a claim whose answer was lost safe to repeat
        got: list[Job] = []
        try:
            while len(got) < count:
                tokens = self._take(list_name, count - len(got))
                if not tokens:
                    break
                got.extend(self._claim(list_name, sess, rid, tokens))
        except AeroqueueError:
            if not got:
                raise
            # Never drop jobs already claimed: they would stay held by a live
            # session, which no reaper touches. The error will show again.
        return got

    def _take(self, name: str, k: int) -> list[int]:
        out = self._udf(keys.LIST_SET, name, keys.LIST_MOD, "take", k)
        st = out["st"]
        if st == "missing":
            raise ListNotFound(f"no job list named {name!r}")
        if st == "paused":
            return []
        tokens = list(out["retry"]) + list(range(out["start"], out["start"] + out["n"]))
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

    def _claim(self, name: str, sess: str, rid: str, tokens: list[int]) -> list[Job]:
        if len(tokens) == 1:
            answers = [self._claim_one(name, sess, rid, tokens[0])]
        else:
            names = [keys.job_name(name, t) for t in tokens]
            results = self.backend.batch_apply(keys.JOB_SET, names, keys.JOB_MOD, "claim", sess, rid)
            answers = [r.value for r in results if r.ok]
            # A busy key, or an answer lost in the batch: claim it alone. The same
            # request id makes a claim that did happen answer 'ok' again.
            answers += [self._claim_one(name, sess, rid, t) for t, r in zip(tokens, results, strict=True) if not r.ok]
        return [
            Job(list=name, token=a["token"], jid=a["jid"], payload=a.get("payload"), attempt=a["att"], session=sess)
            for a in answers
            if a and a.get("st") == "ok"
        ]

    def _claim_one(self, name: str, sess: str, rid: str, token: int) -> Any:
        """One claim, repeated while its answer is in doubt (a timeout) until the deadline."""
        give_up = time.monotonic() + self.busy_deadline_s
        while True:
            try:
                return self._udf(keys.JOB_SET, keys.job_name(name, token), keys.JOB_MOD, "claim", sess, rid)
            except BackendTimeout:
                if time.monotonic() >= give_up:
                    raise

    # -- acknowledge -------------------------------------------------------------

    def complete(self, job: Job, result: Any = None) -> None:
        """Mark a job done, exactly once. Repeating a successful complete is harmless;
        a complete from a session that lost the claim raises `ClaimLost`."""
        st = self._udf(keys.JOB_SET, job.name, keys.JOB_MOD, "complete", job.session, {job.token: result})
        self._check(job, st)
        self.set_bits(job.list, [job.token], "done", 1)

    def complete_many(self, jobs: Sequence[Job], results: Sequence[Any] | None = None) -> list[Job]:
        """Complete a batch in one batch UDF (plus one bitmap write per chunk).
        Returns the jobs whose claim was lost (not completed by this call)."""
        if not jobs:
            return []
        results = list(results) if results is not None else [None] * len(jobs)
        lost: list[Job] = []
        by_session: dict[str, list[tuple[Job, Any]]] = defaultdict(list)
        for job, res in zip(jobs, results, strict=True):
            by_session[job.session].append((job, res))
        for sess, pairs in by_session.items():
            for list_name, group in _group_by_list(pairs).items():
                # Each job gets only its own result (not the whole batch's), in one round trip.
                out = self.backend.batch_udf(
                    keys.JOB_SET, [(j.name, [sess, {j.token: r}]) for j, r in group], keys.JOB_MOD, "complete"
                )
                done = []
                try:
                    for (job, res), r in zip(group, out, strict=True):
                        st = r.value if r.ok else None
                        if st is None:  # this key failed (busy, in doubt): complete it alone
                            try:
                                self.complete(job, res)
                            except (ClaimLost, JobNotFound):
                                lost.append(job)
                        elif st in ("ok", "again"):
                            done.append(job.token)
                        else:
                            lost.append(job)
                finally:
                    # Whatever happens to the rest, count what was completed.
                    self.set_bits(list_name, done, "done", 1)
        return lost

    def fail(self, job: Job, error: str) -> str:
        """Record a failure: back to the queue while attempts remain ('retry'), else 'dead'."""
        st = self._udf(keys.JOB_SET, job.name, keys.JOB_MOD, "fail", job.session, error)
        self._check(job, st)
        # A repeated fail answers as the first did, so these follow-ups are redone
        # (both are idempotent) when the first answer was lost.
        if st == "dead":
            self.set_bits(job.list, [job.token], "dead", 1)
        else:
            self.push_retry(job.list, [job.token])
        return str(st)

    def release(self, job: Job, why: str = "released", *, refund: bool = True) -> str:
        """Give a claimed job back, if this session still holds it. With `refund` the
        attempt is returned (it never ran); without, it counts (it ran, or may have)."""
        st = self._udf(keys.JOB_SET, job.name, keys.JOB_MOD, "release", job.session, 1 if refund else 0, why)
        if st == "released":
            self.push_retry(job.list, [job.token])
        elif st == "dead":
            self.set_bits(job.list, [job.token], "dead", 1)
        return str(st)

    @staticmethod
    def _check(job: Job, st: str) -> None:
        if st == "missing":
            raise JobNotFound(f"job {job.name} (id {job.jid!r}) does not exist")
        if st == "lost":
            raise ClaimLost(
                f"job {job.name} (id {job.jid!r}): the claim of session {job.session} was lost "
                "(expired or reaped, and the job was given to another session); the acknowledgement was refused"
            )

    # -- shared with lists and sessions ------------------------------------------

    def set_bits(self, list_name: str, tokens: Iterable[int], bitmap: str, value: int) -> None:
        set_bits(self.backend, list_name, tokens, bitmap, value)

    def push_retry(self, list_name: str, tokens: list[int]) -> int:
        return push_retry(self.backend, list_name, tokens)


def set_bits(backend: Backend, list_name: str, tokens: Iterable[int], bitmap: str, value: int) -> None:
    """Set (1) or clear (0) tokens' bits in a completion bitmap ('done' or 'dead'):
    one operate per bitmap chunk, idempotent, so a retried ack never double-counts."""
    by_chunk: dict[int, list[int]] = defaultdict(list)
    for t in tokens:
        chunk, bit = keys.bit_position(t)
        by_chunk[chunk].append(bit)
    for chunk, bits in by_chunk.items():
        # Grow-only resize makes the chunk exist at its full size, whoever comes first.
        ops = [bw.bit_resize(bitmap, BITMAP_BYTES, resize_flags=aerospike.BIT_RESIZE_GROW_ONLY)]
        ops += [bw.bit_set(bitmap, bit, 1, 1, _ONE if value else _ZERO) for bit in bits]
        retry_busy(functools.partial(backend.operate, keys.DONE_SET, keys.chunk_name(list_name, chunk), ops))


def push_retry(backend: Backend, list_name: str, tokens: list[int]) -> int:
    """Offer jobs again: onto the list's retry store (served before the token store).
    Returns how many fit; the rest stay queued for the sweeper to find."""
    if not tokens:
        return 0
    accepted: int = backend.udf(keys.LIST_SET, list_name, keys.LIST_MOD, "push_retry", tokens, RETRY_CAP)
    return accepted


def _group_by_list(pairs: list[tuple[Job, Any]]) -> dict[str, list[tuple[Job, Any]]]:
    out: dict[str, list[tuple[Job, Any]]] = defaultdict(list)
    for job, res in pairs:
        out[job.list].append((job, res))
    return out
