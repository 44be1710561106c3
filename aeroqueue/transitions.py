"""The job's state transitions, client half: one home for what follows each UDF.

The job record changes state only through the UDFs of ``aq_job_v1.lua``
(design.md, Records). Each transition has a follow-up on other records, done
here and nowhere else:

- ``complete``: the job's bit in the list's ``done`` bitmap;
- ``fail`` / ``expire`` (time limit) / ``release``: back onto the list's
  retry store while attempts remain, or onto its schedule when a backoff
  applies (``delayed``), else the ``dead`` bit;
- ``snooze`` (the handler's ``Retry(after=...)``): onto the schedule;
- ``bury``: the ``dead`` bit;
- ``kick``: the ``dead`` bit cleared, then back onto the retry store and off
  the schedule, and the list's completion time cleared.

Every follow-up is idempotent (a bit set twice counts once; a push repeated
after a lost answer adds no token the store holds already), so a transition
whose answer was lost is simply repeated.

Completion bits are written in bulk: a bitmap chunk is an 8 KiB record, and
rewriting it for every job cost as much server time as the job's own claim.
`BitBuffer` collects ``done`` bits and writes each chunk's pending bits in one
operate, within ``max_delay_s`` or once ``max_pending`` are waiting, and at
`flush` (workers flush as they stop; `JobLists.status` flushes this process's
bits before it counts). A process killed with bits pending leaves done jobs
uncounted: the reaper and the sweeper recount them (sessions.recount).
``dead`` bits, rare, are written at once, and read back against the job: a
kick may have made it queued again meanwhile (`set_dead_bits`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import random
import threading
import time
import uuid
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import aerospike
from aerospike_helpers.operations import bitwise_operations as bw
from aerospike_helpers.operations import operations as op

from . import hotpath, keys
from .backends import FRESH_DEADLINE, Backend, retry_in_doubt
from .errors import AeroqueueError, FilteredOut, RecordNotFound, StaleRequest

T = TypeVar("T")

log = logging.getLogger("aeroqueue.transitions")

RETRY_CAP = 20_000  # tokens kept in the list record's retry store (well under max-record-size)
SCHED_CAP = 20_000  # tokens kept in the list record's schedule; the rest wait in their records for the sweeper
ERROR_BYTES = 4000  # of each error (message and traceback, UTF-8) kept in a job's history
BITMAP_BYTES = keys.BITS_PER_CHUNK // 8
_GROW = bw.bit_resize("done", BITMAP_BYTES, resize_flags=aerospike.BIT_RESIZE_GROW_ONLY)


# -- follow-ups ----------------------------------------------------------------


def set_bits(
    backend: Backend, list_name: str, tokens: Iterable[int], bitmap: str, value: int, created: int | None = None
) -> None:
    """Set (1) or clear (0) tokens' bits in a completion bitmap ('done' or 'dead', or
    'void': tokens that hold no job): one operate per bitmap chunk, idempotent, so a
    retried ack never double-counts.

    `created`: the stamp of the list the bits are of (None: a job written before
    stamps, written whatever list is there). A chunk is stamped with it, and only a
    chunk of that list (or one written before stamps) takes them: a writer paused past
    a drop of the list and a load of it again under its name, or a node that missed
    the drop bringing the old chunk back, would otherwise count the old list's jobs
    in the new one, and could call it complete with jobs still to run. A chunk of
    another list in the way is deleted if the list is ours (the old list's; the
    sweep's recount sets back any of ours a rejoin replaced), else our bits go."""
    by_chunk: dict[int, list[int]] = defaultdict(list)
    per = keys.BITS_PER_CHUNK  # keys.bit_position, inline: this runs once a job
    for t in tokens:
        by_chunk[t // per].append(t % per)
    for chunk, bits in by_chunk.items():
        # Grow-only resize makes the chunk exist at its full size, whoever comes first.
        grow = _GROW if bitmap == "done" else bw.bit_resize(bitmap, BITMAP_BYTES, resize_flags=aerospike.BIT_RESIZE_GROW_ONLY)
        ops = [grow, _span_op(bitmap, bits, value)]
        name = keys.chunk_name(list_name, chunk)
        if created is None:
            # Repeated while busy or in doubt (a node lost mid-call): it sets the same bits.
            # A clear never makes the chunk: a missing one has no bit set, and one made for
            # nothing on a list dropped meanwhile would outlive the drop (a dead bit checked
            # against a job the drop deleted: `check_dead_bits`).
            with contextlib.suppress(RecordNotFound):
                retry_in_doubt(functools.partial(backend.operate, keys.DONE_SET, name, ops, update_only=not value))
        else:
            _set_stamped(backend, list_name, name, ops, value, created)


def _set_stamped(backend: Backend, list_name: str, name: str, ops: list[dict], value: int, created: int) -> None:
    """`set_bits` on one chunk, for the list made at `created`."""
    if value:
        ops = [op.write("c", created), *ops]
    for _ in range(5):
        try:
            retry_in_doubt(functools.partial(backend.operate, keys.DONE_SET, name, ops, update_only=not value,
                                             expression=hotpath.ours(created)))
            return
        except RecordNotFound:
            return  # a clear: no chunk, no bit set
        except FilteredOut:
            pass
        rec = backend.get(keys.DONE_SET, name, bins=["c"])
        if rec is None or keys.bitmap_of(rec, created) is not None:
            continue  # deleted or replaced meanwhile: again
        if not value:
            return  # nothing of ours in another list's chunk to clear
        if not list_is(backend, list_name, created):
            log.warning("completion bits of a list dropped since were not written", extra={
                "event": "bits_dropped", "list": list_name, "chunk": name})
            return
        # The chunk of a list of this name dropped before ours was made.
        delete_left_by(backend, keys.DONE_SET, name, rec.bins["c"])
    raise AeroqueueError(f"the completion bitmap {name} of list {list_name!r} kept changing: bits not written")


DEAD_CHECK_CHUNK = 5_000  # job records `set_dead_bits` reads back a batch call


def set_dead_bits(backend: Backend, list_name: str, tokens: list[int], created: int | None = None) -> None:
    """The dead bits of jobs that went dead, each written after the job's own
    transition, so a kick (dead -> queued, its bit cleared) may have run in
    between. Set, then checked: a bit whose job is not dead any more is cleared
    again. Left set, it would count a queued job as dead for good, and the list
    as complete while that job runs (a complete list is never swept). Should the
    job die again between the two steps, the bit is lost instead: the sweep's
    recount sets it back, as it does for a worker that died before its bits. A
    process killed between the two steps leaves the bit: the sweep, and a status
    about to mark the list complete, check every dead bit the same way
    (`check_dead_bits`). `created`: the list's stamp (`set_bits`)."""
    for i in range(0, len(tokens), DEAD_CHECK_CHUNK):  # a sweep's recount may bring thousands
        part = tokens[i:i + DEAD_CHECK_CHUNK]
        set_bits(backend, list_name, part, "dead", 1, created)
        check_dead_bits(backend, list_name, part, created)


def check_dead_bits(backend: Backend, list_name: str, tokens: list[int], created: int | None = None) -> int:
    """The second step of `set_dead_bits`: clear the dead bits of those of `tokens`
    whose job is not dead (kicked since; or it holds no job). Returns how many it
    cleared. Also how a list about to be marked complete checks its dead bits
    (`JobLists.status`): a process killed between the two steps of `set_dead_bits`
    leaves a bit set, after a kick, on a job that is queued again."""
    undone = 0
    for i in range(0, len(tokens), DEAD_CHECK_CHUNK):
        part = tokens[i:i + DEAD_CHECK_CHUNK]
        names = [keys.job_name(list_name, t) for t in part]
        recs = retry_in_doubt(functools.partial(backend.batch_get, keys.JOB_SET, names, bins=["state", "c"]))
        # A job of another list of the name (dropped, made again) is not this bit's.
        undo = [t for t, rec in zip(part, recs, strict=True)
                if rec is None or rec.bins.get("state") != "dead"
                or (created is not None and rec.bins.get("c", created) != created)]
        if undo:
            set_bits(backend, list_name, undo, "dead", 0, created)
            undone += len(undo)
    return undone


def _span_op(bitmap: str, bits: list[int], value: int) -> dict:
    """One operation that sets (OR) or clears (AND) `bits` and leaves the others of
    their byte span alone: one op per chunk, not one `bit_set` per bit, for the
    server to apply and for the client to build (each `bit_set` also warns)."""
    lo, hi = min(bits) & ~7, (max(bits) | 7) + 1
    mask = bytearray((hi - lo) // 8)
    for bit in bits:
        mask[(bit - lo) >> 3] |= 0x80 >> ((bit - lo) & 7)
    if value:
        return bw.bit_or(bitmap, lo, hi - lo, len(mask), mask)
    return bw.bit_and(bitmap, lo, hi - lo, len(mask), bytearray(b ^ 0xFF for b in mask))


def push_retry(
    backend: Backend, list_name: str, tokens: list[int], created: int | None = None, *, dedupe: bool = False
) -> int:
    """Offer jobs again: onto the list's retry store (served before the token store).
    Returns how many fit; the rest stay queued for the sweeper to find. `created`: the
    list the jobs are of (their records' stamp `c`); a list made again under its name
    since takes none (its tokens are other jobs: a holder or reaper paused across the
    drop would have one of them offered twice while a lease holds it). None: any.
    `dedupe`: a token the store holds already is not added again (a pass over the
    store: for a sweep's offers, judged from a store read before another's push)."""
    if not tokens:
        return 0
    return _offer_udf(backend, list_name, "push_retry", (tokens, RETRY_CAP), created, dedupe)


def schedule(backend: Backend, list_name: str, tokens: list[int], delay_ms: int, created: int | None = None) -> int:
    """Offer jobs again `delay_ms` from now (server clock): onto the list's schedule.
    Returns how many fit; the rest stay delayed in their records for the sweeper.
    `created`: as for `push_retry`."""
    if not tokens:
        return 0
    return _offer_udf(backend, list_name, "schedule", (tokens, max(0, int(delay_ms)), SCHED_CAP), created)


def _offer_udf(
    backend: Backend, list_name: str, function: str, args: tuple[Any, ...], created: int | None, dedupe: bool = False
) -> int:
    """A list UDF that offers tokens (`push_retry`, `schedule`), repeated while its
    answer is in doubt. A repeat says so (a trailing `again`, which an older module
    ignores): the first call may have landed, and a token added twice would count
    its job waiting while it runs; `dedupe` says so from the first call. `created`
    goes after the deadline (`list_once`). How many tokens it took."""
    calls = 0
    after = () if created is None else (created,)

    def once() -> int:
        nonlocal calls
        calls += 1
        return int(list_once(backend, list_name, function, *args, int(dedupe or calls > 1), after=after))

    return retry_in_doubt(once)


# Each list UDF's arguments before its deadline (aq_list_v1.lua). A call may leave
# trailing optional ones out: they are given as nil, so that the deadline lands in
# its own place, never in theirs. Reads (expired) and the embedded store's credit
# take no deadline.
_LIST_ARGS = {
    "take": 1, "advance": 1, "push_retry": 3, "schedule": 4, "unschedule": 1, "reopen": 0, "alloc": 4,
    "renew": 3, "publish": 6, "create": 4, "tune": 1, "set_flag": 2, "mark_complete": 1, "tombstone": 0,
}


def _with_deadline(function: str, args: tuple[Any, ...], after: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    n = _LIST_ARGS.get(function)
    if n is None:
        return args
    if len(args) > n:
        raise TypeError(f"{keys.LIST_MOD}.{function} takes {n} argument(s) before its deadline, not {len(args)}")
    return (*args, *(None,) * (n - len(args)), FRESH_DEADLINE, *after)


def list_once(
    backend: Backend, list_name: str, function: str, *args: Any, busy_s: float = 5.0, after: tuple[Any, ...] = ()
) -> Any:
    """One call of a list UDF, given its arguments but the deadline, which it gets
    (`Backend.job_deadline`; aq_list_v1.lua, header), a busy key retried for `busy_s`;
    `StaleRequest` if the server refused it as run past it (nothing was done: safe to
    repeat). `after`: arguments after the deadline (added to a function later: a
    caller older than them leaves them out)."""
    answer = backend.udf(keys.LIST_SET, list_name, keys.LIST_MOD, function, *_with_deadline(function, args, after),
                         deadline_s=busy_s)
    if is_stale(answer):
        raise stale_list_call(function, list_name)
    return answer


def list_write(backend: Backend, list_name: str, function: str, *args: Any, after: tuple[Any, ...] = ()) -> Any:
    """`list_once`, repeated while its answer is in doubt or refused as stale: for the
    calls that are safe to repeat (a repeat answers as the first did)."""
    return retry_in_doubt(lambda: list_once(backend, list_name, function, *args, after=after))


def list_udf(
    backend: Backend, list_name: str, function: str, *args: Any, deadline_s: float = 5.0, after: tuple[Any, ...] = ()
) -> Any:
    """A list UDF a worker sends (`take`, `advance`) with a fresh `Backend.job_deadline`
    as its last argument, repeated while the server refuses it as run past that
    deadline ('stale': nothing was done), until `deadline_s`; then `StaleRequest`. A
    lost answer is not repeated here: a take may have landed (the sweep finds its
    tokens). The deadline keeps a frozen node's late run of the call from rolling
    the list record back (aq_list_v1.lua, header). `after`: as for `list_once`."""
    return retry_stale(
        lambda: list_once(backend, list_name, function, *args, busy_s=deadline_s, after=after), deadline_s=deadline_s
    )


def retry_stale(fn: Callable[[], T], *, deadline_s: float = 5.0) -> T:
    """Run `fn`, again while the server refuses it as run past its deadline
    (`StaleRequest`: nothing was done, so a repeat is safe even for a call that is
    not), until `deadline_s`; then the last `StaleRequest` reaches the caller."""
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            return fn()
        except StaleRequest:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.01)


def stale_call(module: str, function: str, set_name: str, key: str) -> StaleRequest:
    """The error of a UDF the server refused as run past its deadline."""
    return StaleRequest(
        f"{module}.{function} on {set_name}/{key}: the server ran it after the deadline this "
        "client gave it, and refused it (nothing was done)",
        operation=f"{module}.{function}", key=key,
    )


def stale_list_call(function: str, list_name: str) -> StaleRequest:
    """The error of a list UDF the server refused as run past its deadline, to the end."""
    return stale_call(keys.LIST_MOD, function, keys.LIST_SET, list_name)


def backoff_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """How long attempt `attempt` (1-based) waits after failing: between half and all
    of base * 2^(attempt-1), capped, so that retries of many jobs spread out."""
    if base_ms <= 0:
        return 0
    full = min(cap_ms, base_ms * (1 << min(max(attempt, 1) - 1, 40)))
    return round(full * (rng or random).uniform(0.5, 1.0))


def error_text(text: str) -> str:
    """An error as kept in the job's history: its start and its end (the traceback's last lines).
    A NUL shows as \\x00: the Aerospike client would end the text there."""
    text = text.replace("\x00", "\\x00")
    if not text.isascii():  # a lone surrogate (a file name's undecodable byte) as \udcxx: no client can send one
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= ERROR_BYTES // 4 or len(data := text.encode("utf-8")) <= ERROR_BYTES:
        return text
    # Cut by bytes (the record's size is bytes), at character boundaries, leaving room
    # for the marker.
    half = (ERROR_BYTES - 50) // 2
    head = data[:half].decode("utf-8", "ignore")
    tail = data[-half:].decode("utf-8", "ignore")
    return f"{head}\n[... {len(text) - len(head) - len(tail)} characters cut ...]\n{tail}"


def list_is(backend: Backend, list_name: str, created: int) -> bool:
    """Whether list `list_name` is still the one made at `created` (server ms), no drop
    of it begun: not dropped (a tombstone has no `created`), nor made again since."""
    rec = retry_in_doubt(functools.partial(backend.get, keys.LIST_SET, list_name, bins=["created", "dropping"]))
    return rec is not None and rec.bins.get("created") == created and rec.bins.get("dropping") != 1


def delete_left_by(backend: Backend, set_name: str, key: str, stamp: int) -> None:
    """Delete record `key`, left in the way by another list of the name (dropped before
    the caller's list was made), while it still holds that list's stamp `stamp` (bin
    "c"). The caller checks first that its own list is current; a caller stopped
    between that check and this delete, while its list was dropped and made again,
    must not delete the new list's record, hence the stamp, not "not ours". Not by
    generation either: a record another writer deleted and made again starts at the
    same generation as the stale one. Gone or replaced since: nothing to do.
    (`load._delete_left_by_another` does the same for many records at once.)"""
    with contextlib.suppress(FilteredOut, RecordNotFound):
        backend.operate(set_name, key, [op.delete()], update_only=True, expression=hotpath.stamped(stamp))


class BitBuffer:
    """``done`` bits waiting to be written, per list (and the list's stamp, as the acked
    jobs' claims or leases read it); thread-safe.

    A bit is written only to the list it was acked in: a process paused (SIGSTOP, a
    long pause) with bits pending, past a drop of the list and a load of it again
    under its name, wrote them into the new list's bitmap when it resumed, which
    then counted jobs never run as done and could call the list complete. Each
    flush reads the list's stamp first and drops the bits of a list gone since."""

    def __init__(self, backend: Backend, *, max_pending: int = 512, max_delay_s: float = 0.05) -> None:
        self.backend = backend
        self.max_pending = max_pending
        self.max_delay_s = max_delay_s
        self._fresh()
        self._closed = False

    def _fresh(self) -> None:
        """No bits pending, no writer yet, locks free. Also in a forked child
        (`_after_fork`): only the thread that forked lives on, so the writer is gone (the
        child's bits waited for 512 of them, a flush or the exit: a pre-fork server's
        worker never counted its jobs done), and a lock another thread held at the fork
        would stay held. The parent's pending bits are the parent's to write."""
        self._pending: dict[tuple[str, int | None], set[int]] = defaultdict(set)
        self._count = 0
        self._lock = threading.Lock()
        self._flushing = threading.Lock()  # one writer at a time keeps chunks in order
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, list_name: str, tokens: Iterable[int], created: int | None = None) -> None:
        """Bits to write for `tokens` of list `list_name`, made at `created` (the jobs'
        stamp `c`; None: a job written before stamps, written whatever list is there)."""
        with self._lock:
            pending = self._pending[(list_name, created)]
            before = len(pending)
            pending.update(tokens)
            self._count += len(pending) - before
            full = self._count >= self.max_pending
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="aeroqueue-bits", daemon=True)
                self._thread.start()
        if full:
            self.flush()
        elif not self._wake.is_set():  # set() takes a lock; once set, the writer is on its way
            self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            # Let a few more acks join this write: the delay bounds how stale counts get.
            threading.Event().wait(self.max_delay_s)
            try:
                self.flush()
            except AeroqueueError as e:  # kept pending; the next flush tries again
                log.warning("writing completion bits failed", extra={"event": "bits_failed", "error": str(e)})
                self._wake.set()

    def flush(self) -> int:
        """Write every pending bit now; returns how many. On failure the bits stay
        pending (and the error reaches the caller)."""
        with self._flushing:
            with self._lock:
                taken, self._pending = self._pending, defaultdict(set)
                self._count = 0
            written = 0
            try:
                for key in list(taken):
                    list_name, created = key
                    if created is not None and not list_is(self.backend, list_name, created):
                        log.warning("completion bits of a list dropped since were not written", extra={
                            "event": "bits_dropped", "list": list_name, "jobs": len(taken.pop(key))})
                        continue
                    set_bits(self.backend, list_name, taken[key], "done", 1, created)
                    written += len(taken.pop(key))
            finally:
                if taken:  # put back what was not written
                    with self._lock:
                        for key, tokens in taken.items():
                            self._pending[key].update(tokens)
                            self._count += len(tokens)
            return written

    def close(self) -> None:
        """Flush and stop the writer thread."""
        self._closed = True
        self._wake.set()
        self.flush()


_BUFFERS: weakref.WeakKeyDictionary[Backend, BitBuffer] = weakref.WeakKeyDictionary()
_BUFFERS_LOCK = threading.Lock()


def _after_fork() -> None:
    global _BUFFERS_LOCK
    _BUFFERS_LOCK = threading.Lock()
    for buf in list(_BUFFERS.values()):
        buf._fresh()


os.register_at_fork(after_in_child=_after_fork)


def bit_buffer(backend: Backend) -> BitBuffer:
    """The process's bit buffer for a store connection (one per Backend, so every
    Queue, Session and JobLists on it reads its own writes after `flush_bits`)."""
    with _BUFFERS_LOCK:
        buf = _BUFFERS.get(backend)
        if buf is None or buf._closed:
            buf = _BUFFERS[backend] = BitBuffer(backend)
            backend.on_close(buf.close)
            _register_exit_flush()
        return buf


@functools.cache
def _register_exit_flush() -> None:
    # A short-lived process (a CLI command, a script) exits right after its ack:
    # the writer thread is a daemon and would die with the bits.
    atexit.register(_flush_all)


def _flush_all() -> None:
    for buf in list(_BUFFERS.values()):
        if not buf._closed:
            try:
                buf.close()
            except Exception as e:  # at exit: say so, the reaper's recount repairs it
                log.warning("writing completion bits at exit failed", extra={"event": "bits_failed", "error": str(e)})


def flush_bits(backend: Backend) -> None:
    """Write this process's pending completion bits for a store, if any."""
    buf = _BUFFERS.get(backend)
    if buf is not None:
        buf.flush()


# -- transitions ---------------------------------------------------------------


def is_stale(answer: Any) -> bool:
    """Whether a job or list UDF's answer says it ran past its deadline and did nothing."""
    return answer == "stale" or (isinstance(answer, dict) and answer.get("st") == "stale")


def job_udf(
    backend: Backend, job_name: str, function: str, *args: Any, deadline_s: float = 5.0, busy_s: float | None = None,
    tx: str | None = None, off: str | None = None, created: int | None = None,
) -> Any:
    """A job UDF that makes or ends a claim, or buries a job, given every argument up
    to its request id (a bury's: its reason; trailing ones left out are sent as nil):
    sent with a fresh `Backend.job_deadline` each time, and repeated while its answer
    is in doubt (a timeout, a node lost, or 'stale': refused, nothing done) until
    `deadline_s`. A repeat answers as the first did, so repeating is safe. A busy key
    is retried for `busy_s` (default: `deadline_s`). `tx`: the id of a fail, expire or
    release (`reaper_tx`, `holder_mark`), and `off` (with a `tx`): the mark it leaves on
    the job, which the caller offers itself right after (aq_job_v1.lua, `end_claim`);
    both after the deadline, so that a job module that takes neither ignores them.
    `created` (a claim's and a bury's only, after its deadline too): the stamp of the
    list the token was taken from, or of the job as read; a job of another list of
    the name answers 'other'."""
    if off is not None and tx is None:
        raise ValueError(f"{keys.JOB_MOD}.{function}: an offer mark (off) needs the call's id (tx)")
    if created is not None and (function not in ("claim", "bury") or tx is not None):
        raise ValueError(f"{keys.JOB_MOD}.{function}: only a claim or a bury takes the list's stamp (created)")
    extra = (created,) if created is not None else () if tx is None else (tx,) if off is None else (tx, off)

    return retry_in_doubt(
        lambda: job_once(backend, job_name, function, *args, extra=extra, busy_s=deadline_s if busy_s is None else busy_s),
        deadline_s=deadline_s,
    )


# Each job UDF's arguments before its deadline (aq_job_v1.lua): trailing optional
# ones left out are given as nil, so that the deadline lands in its own place.
_JOB_ARGS = {
    "claim": 3, "complete": 3, "fail": 4, "expire": 4, "release": 4, "snooze": 3, "touch": 3, "kick": 0, "bury": 1,
}


def _once(
    backend: Backend, set_name: str, key: str, module: str, takes: dict[str, int], function: str, args: tuple[Any, ...],
    busy_s: float, *, optional: bool = False, extra: tuple[Any, ...] = (),
) -> Any:
    """One call of UDF `module.function` on record `key`, given its arguments before
    its deadline (`takes[function]` of them; with `optional`, trailing ones may be left
    out, sent as nil) and after it (`extra`), a busy key retried for `busy_s`;
    `StaleRequest` if the server refused it as run past the deadline (nothing was done:
    safe to repeat)."""
    n = takes[function]
    if len(args) > n or (len(args) < n and not optional):
        raise TypeError(f"{module}.{function} takes {n} argument(s) before its deadline, not {len(args)}")
    answer = backend.udf(set_name, key, module, function, *args, *(None,) * (n - len(args)), FRESH_DEADLINE, *extra,
                         deadline_s=busy_s)
    if is_stale(answer):
        raise stale_call(module, function, set_name, key)
    return answer


def job_once(
    backend: Backend, job_name: str, function: str, *args: Any, extra: tuple[Any, ...] = (), busy_s: float = 5.0,
) -> Any:
    """One call of a job UDF (`_once`), trailing arguments before the deadline optional."""
    return _once(backend, keys.JOB_SET, job_name, keys.JOB_MOD, _JOB_ARGS, function, args, busy_s, optional=True,
                 extra=extra)


# Each session UDF's arguments before its deadline (aq_sess_v1.lua; `lease` has a window
# of its own instead).
_SESS_ARGS = {"open": 3, "beat": 1, "unlease": 1}


def sess_once(backend: Backend, session_id: str, function: str, *args: Any, busy_s: float = 5.0) -> Any:
    """One call of a session UDF (`_once`). Without its deadline a frozen node's late
    beat or unlease wrote the session back as its stale copy had it, and the leases
    made since were gone (aq_sess_v1.lua, header)."""
    return _once(backend, keys.SESS_SET, session_id, keys.SESS_MOD, _SESS_ARGS, function, args, busy_s)


# Each ID store UDF's arguments before its deadline (aq_ids_v1.lua): both write a chunk.
_IDS_ARGS = {"pop": 1, "remove": 1}


def ids_once(
    backend: Backend, chunk: str, function: str, *args: Any, busy_s: float = 5.0, extra: tuple[Any, ...] = ()
) -> Any:
    """One call of an ID store UDF on chunk record `chunk` (`_once`; `extra`: arguments
    after the deadline). Without its deadline a frozen node's late run would put the
    chunk back as it had it: IDs popped meanwhile handed out again, a kicked job's ID
    back in it (aq_ids_v1.lua, header)."""
    return _once(backend, keys.IDS_SET, chunk, keys.IDS_MOD, _IDS_ARGS, function, args, busy_s, extra=extra)


def reaper_tx() -> str:
    """An id for one reaper's calls that end claims of a session it does not own. Two
    reapers (every worker runs one) may end the same claim at once, with the same
    error: under one session and error, the job UDF would answer the second as a
    repeat of the first, and each would offer the job again, leaving it twice in the
    retry store (counted waiting while it runs) or on the schedule. Under its own id,
    only a repeat of the call that ended the claim answers as that call did."""
    return uuid.uuid4().hex


# The `off` mark of a job its holder's own fail, expire or release ended: the holder
# offers it itself (`holder_mark`). Short: it is written on the job's record, which
# may be near the store's max-record-size, on every such failure.
HOLDER_OFF = "own"


def holder_mark(holder: bool, rid: str) -> tuple[str | None, str | None]:
    """The `tx` and `off` of a holder's own fail, expire or release (none for another's).

    The holder pushes the job right after the transition, and a paused holder (SIGSTOP,
    a long GC pause, a VM migration) may do so only after its session was reaped: the
    reaper's recount (`sessions.recount_session`) found the job queued, ended by the
    session and in no store, and offered it as well, so it waited twice in the retry
    store. Marked offered in the transition's own write (`off`), it is left to the
    holder, at no extra round trip; should the holder die before its push, the sweep
    finds the job, as it finds one a reaper's pass left unpushed.

    Its id is the claim's request id: the same for every repeat of the call (so a
    repeat after a lost answer still answers as the first did, and the holder pushes
    the job nobody else offers), unique to the reservation in any process (the UDF
    checks the session apart), and never a reaper's: a reaper's call with the same
    error is not taken for the holder's repeat."""
    return (rid, HOLDER_OFF) if holder else (None, None)


def after_fail(
    backend: Backend, list_name: str, token: int, outcome: str, delay_ms: int = 0,
    offer: Callable[[list[int]], list[int]] | None = None, created: int | None = None,
) -> None:
    """Follow-up of a fail, expire, snooze or release: dead bit, back onto the retry
    store (what `offer` lets through, if given), or onto the schedule (`delayed`).
    `created`: the job's list stamp as its claim read it (`push_retry`)."""
    if outcome == "dead":
        set_dead_bits(backend, list_name, [token], created)
    elif outcome in ("retry", "released"):
        push_retry(backend, list_name, [token] if offer is None else offer([token]), created)
    elif outcome == "delayed":
        schedule(backend, list_name, [token], delay_ms, created)


def _transition(
    backend: Backend, list_name: str, token: int, function: str, *args: Any, delay_ms: int = 0, deadline_s: float = 5.0,
    tx: str | None = None, off: str | None = None, offer: Callable[[list[int]], list[int]] | None = None,
    created: int | None = None,
) -> str:
    """One job UDF that ends a claim, then its follow-up (`bury` does the same with the
    stamp given to the UDF as well, which these functions do not take). Repeated
    while its answer is in doubt, for `deadline_s`: a repeat answers as the first did,
    and the follow-up is idempotent. `tx`, `off`: as `job_udf` takes them; `created`:
    as `after_fail` does."""
    st = str(job_udf(backend, keys.job_name(list_name, token), function, *args, deadline_s=deadline_s, tx=tx, off=off))
    after_fail(backend, list_name, token, st, delay_ms, offer, created)
    return st


def release(
    backend: Backend, list_name: str, token: int, session_id: str, *, refund: bool, why: str, rid: str = "",
    deadline_s: float = 5.0, holder: bool = False, created: int | None = None,
) -> str:
    """claimed by `session_id` -> queued (or dead when attempts are used up and the
    attempt is not refunded); 'released', 'dead', 'not held' or 'missing'. `holder`:
    the call is the claim's holder's own (`holder_mark`). `created`: the job's list
    stamp as read (`after_fail`), for this and the other transitions below."""
    tx, off = holder_mark(holder, rid)
    return _transition(
        backend, list_name, token, "release", session_id, 1 if refund else 0, why, rid, deadline_s=deadline_s,
        tx=tx, off=off, created=created,
    )


def fail(
    backend: Backend, list_name: str, token: int, session_id: str, error: str, *, delay_ms: int = 0, rid: str = "",
    deadline_s: float = 5.0, holder: bool = False, created: int | None = None,
) -> str:
    """claimed by `session_id` (under request id `rid`, when given) -> queued while
    attempts remain ('retry'), or delayed for `delay_ms` (its backoff: 'delayed'), else
    'dead'; 'lost', 'late' (past its time limit) or 'missing' change nothing.
    `holder`: the call is the claim's holder's own (`holder_mark`)."""
    tx, off = holder_mark(holder, rid)
    return _transition(
        backend, list_name, token, "fail", session_id, error_text(error), int(delay_ms), rid, delay_ms=delay_ms,
        deadline_s=deadline_s, tx=tx, off=off, created=created,
    )


def expire(
    backend: Backend, list_name: str, token: int, session_id: str, why: str, *, delay_ms: int = 0, rid: str = "",
    deadline_s: float = 5.0, tx: str | None = None, offer: Callable[[list[int]], list[int]] | None = None,
    holder: bool = False, created: int | None = None,
) -> str:
    """A claim past its time limit ends as a failed attempt (error `why`): 'retry',
    'delayed', 'dead'; 'early' (not past it by the server's clock), 'lost' or
    'missing' change nothing. `tx`: a reaper's id (`reaper_tx`); `offer`: which of
    the job's token it may push onto the retry store (`sessions._offer`). `holder`
    (instead): the call is the claim's holder's own (`holder_mark`)."""
    off = None
    if holder:
        if tx is not None or offer is not None:
            raise ValueError("expire: a holder's call carries its own id and offers the job itself (no tx, no offer)")
        tx, off = holder_mark(holder, rid)
    return _transition(
        backend, list_name, token, "expire", session_id, int(delay_ms), why, rid, delay_ms=delay_ms,
        deadline_s=deadline_s, tx=tx, off=off, offer=offer, created=created,
    )


def snooze(
    backend: Backend, list_name: str, token: int, session_id: str, delay_ms: int, *, rid: str = "",
    deadline_s: float = 5.0, created: int | None = None,
) -> str:
    """The handler asked to run later: claimed -> delayed for `delay_ms`, the attempt
    given back. 'delayed', or 'lost' / 'late' / 'missing' (nothing changed)."""
    delay_ms = max(1, int(delay_ms))
    return _transition(
        backend, list_name, token, "snooze", session_id, delay_ms, rid, delay_ms=delay_ms, deadline_s=deadline_s,
        created=created,
    )


def _unchunk(backend: Backend, list_name: str, tokens: list[int], created: int | None) -> None:
    """ID mode: take kicked tokens out of the published chunks not popped yet
    (`aq_ids_v1.remove`). A pop racing this hands one out first: its claim takes
    the kicked job, and the retry store's copy is refused by its own claim.
    `created`: the kicked jobs' list stamp; another list of the name is left alone."""
    head = backend.get(keys.LIST_SET, list_name, bins=["mode", "cursor", "pubs", "created"])
    if head is None or head.bins.get("mode") != "ids" or created not in (None, head.bins.get("created")):
        return
    names = [keys.chunk_name(list_name, c) for c in range(head.bins["cursor"], head.bins["pubs"])]
    want = set(tokens)
    for chunk, rec in zip(names, backend.batch_get(keys.IDS_SET, names, bins=["ids"]), strict=True):
        held = [t for t in (rec.bins.get("ids") or []) if t in want] if rec is not None else []
        if held:
            # A repeat of a remove that landed finds nothing to take; a 'stale' one did nothing.
            retry_in_doubt(functools.partial(
                retry_stale, functools.partial(ids_once, backend, chunk, "remove", held, extra=(created,))
            ))


def bury(backend: Backend, list_name: str, token: int, why: str, created: int | None = None) -> str:
    """queued, delayed or claimed -> dead, by hand. Returns the state afterwards
    ('dead', or 'done' / 'void' / 'missing': left alone; 'other': the record is
    another list's of the name, dropped and loaded again since). `created`: the
    job's list stamp, as read (the bury's own check, and `after_fail`'s)."""
    st = str(job_udf(backend, keys.job_name(list_name, token), "bury", error_text(why), created=created))
    after_fail(backend, list_name, token, st, 0, None, created)
    return st


# Tokens a call of the list record's `unschedule` takes: a kick of every dead job of a
# big list makes several, each well under the record's size in arguments.
UNSCHEDULE_CHUNK = 5_000


def kick(
    backend: Backend, list_name: str, tokens: list[int], *, dead_only: bool = False, created: int | None = None
) -> int:
    """dead -> queued with fresh attempts, delayed -> queued now (an operator's
    decision; `dead_only`: dead jobs only; `created`: the list's stamp, as `set_bits`
    takes it). Returns how many.

    Bits first: a kick interrupted after this leaves the list incomplete, so the
    sweeper sets the bits of jobs still dead and requeues the kicked ones. The
    other order could leave a kicked job waiting in a list that counts as
    complete, which nobody sweeps. And after: a dead bit written late, by
    whoever made the job dead (`set_dead_bits`), may have landed in between.
    A kicked job leaves the other places the list record keeps it (the
    schedule, a delayed load's range, the token store ahead: `unschedule`; in ID
    mode the chunk not popped yet: `_unchunk`) as it enters the retry store: it
    waits in one place, and is offered once."""
    set_bits(backend, list_name, tokens, "dead", 0, created)
    # After the deadline: dead_only, then the stamp (a record of another list of the
    # name, dropped and loaded again since the caller read its stamp, answers 'other').
    only = (1 if dead_only else None, created)
    # A kick whose answer was lost is not repeated here: its repeat would answer 'not
    # kickable' and leave the job unpushed; the caller hears it, and the sweeper
    # finishes what it did. A 'stale' one did nothing, and is repeated.
    kicked = [
        t for t in tokens
        if retry_stale(functools.partial(job_once, backend, keys.job_name(list_name, t), "kick", extra=only)) == "ok"
    ]
    if kicked:
        set_bits(backend, list_name, kicked, "dead", 0, created)
        push_retry(backend, list_name, kicked, created)
        # After the push: a kick cut short between the two leaves a job in both
        # places (offered twice, a claim fences the second), never in neither.
        for i in range(0, len(kicked), UNSCHEDULE_CHUNK):
            part = kicked[i:i + UNSCHEDULE_CHUNK]
            list_write(backend, list_name, "unschedule", part, after=(created,))
        _unchunk(backend, list_name, kicked, created)
        # A complete list is not complete any more: its completion time goes.
        list_write(backend, list_name, "reopen", after=(created,))
    return len(kicked)

