"""Job lists: create, load, seal, status, export, kick, drop.

The load flow (ranges, the job-id index as commit point, recovery of a dead
loader's ranges) lives in `aeroqueue.load`; `JobLists.load` and
`JobLists.recover` are its entry points.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from aerospike_helpers import expressions as exp
from aerospike_helpers.batch.records import Write
from aerospike_helpers.operations import operations as op

from . import blocks, keys, lease_entries, transitions
from . import load as _load
from .backends import Backend, retry_in_doubt
from .config import LEASE_SETTLE_S, MAX_ATTEMPTS, MAX_SECONDS, seconds, whole
from .errors import (
    AeroqueueError,
    ConfigError,
    JobNotFound,
    ListError,
    ListModeMismatch,
    ListNotFound,
    ListReplaced,
    ListSealed,
)
from .load import DEFAULT_CHUNK, DEFAULT_LEASE_MS, LoadReport, max_payload

MODES = ("tokens", "ids")
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_TIMEOUT_S = 300.0  # a claim's time limit
DEFAULT_BACKOFF_S = 1.0  # attempt n waits between half and all of base * 2^(n-1)...
DEFAULT_BACKOFF_MAX_S = 3600.0  # ...capped here
PAGE = 1000  # records per batch read when walking a list
PREFETCH_BATCH = 5000  # records per batch read of `JobLists.prefetch`
# How long a drop waits for completion bits still on their way (a worker's bit buffer
# writes within ~50 ms of an ack) before it deletes the bitmaps a second time.
DROP_GRACE_S = 1.0
# `dropping` while a drop is only begun (sealed and paused, nothing deleted yet);
# 1 once records go.
DROP_BEGUN = 2

__all__ = ["DEFAULT_CHUNK", "DEFAULT_LEASE_MS", "DropReport", "JobLists", "ListStatus", "LoadReport", "max_payload"]


@dataclass(frozen=True)
class DropReport:
    """What `JobLists.drop` deleted, by kind of record."""

    name: str
    jobs: int  # job records (aq_job), void tokens included
    index: int  # job-id index entries (aq_jidx)
    id_chunks: int  # ID store chunks (aq_ids)
    bitmaps: int  # completion bitmap chunks (aq_done)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ListStatus:
    name: str
    mode: str
    total: int
    reservable: int
    in_flight: int
    retry_pending: int
    done: int
    dead: int
    sealed: bool
    complete: bool
    paused: bool
    pending_ranges: int
    max_attempts: int
    created: int
    completed_at: int | None
    delayed: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    backoff_s: float = DEFAULT_BACKOFF_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    dropping: bool = False  # a drop started and did not finish: run it again
    # Of `pending_ranges`, those whose loader missed its lease (it died): the list is not
    # complete until a sweep, `recover` or a worker --until-complete finishes them.
    stalled_ranges: int = 0

    @property
    def queued(self) -> int:
        """What a reserve can take now: the fresh jobs (`reservable`) and those back in the
        retry store (`retry_pending`: failed, released or kicked, their backoff over), as
        the dashboard and the exporter count `queued`."""
        return self.reservable + self.retry_pending

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_bury_reason(why: str) -> str:
    """A bury's reason is the dead job's last error, what an operator reads later: it
    must say something."""
    if not why.strip():
        raise ConfigError("the reason for a bury is empty: it is the dead job's last error; say why it is buried")
    return why


class JobLists:
    """Job lists in one store."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # How long a load repeats batch writes whose answer was lost or that a
        # changing cluster could not serve (a node died, migrations) before it gives up.
        self.write_retry_s = 10.0

    # -- small helpers ---------------------------------------------------------

    def _list_udf(self, name: str, function: str, *args: Any, after: tuple[Any, ...] = ()) -> Any:
        """A list UDF given every argument but its deadline (`transitions.list_once`;
        `after`: the arguments that follow the deadline)."""
        # Every list call here is safe to repeat after a lost answer (a node died
        # mid-call), alloc only with the range's id (aq_list_v1.lua, alloc): without
        # one, a repeat would allocate a second range.
        if function == "alloc" and (len(args) < 3 or args[2] is None):
            return transitions.list_once(self.backend, name, function, *args, after=after)
        return transitions.list_write(self.backend, name, function, *args, after=after)

    def _batch_write(self, writes: list[Any], what: str, stamp: Any = None) -> list[int]:
        """Each write's result code, writes answered in doubt repeated for `write_retry_s`
        (see `aeroqueue.load.batch_write`, and its `stamp`)."""
        return _load.batch_write(self.backend, writes, what, self.write_retry_s, stamp)

    def header(self, name: str) -> dict[str, Any]:
        rec = self.backend.get(keys.LIST_SET, keys.check_list_name(name))
        if rec is None or is_tombstone(rec.bins):
            raise ListNotFound(f"no job list named {name!r}")
        return rec.bins

    # -- create, seal, pause ---------------------------------------------------

    def create(
        self, name: str, *, mode: str | None = None, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout_s: float | None = None, backoff_s: float | None = None, backoff_max_s: float | None = None,
    ) -> bool:
        """Create a list (True), or check an existing one has the same mode (False).
        `mode` None: an existing list's own, else 'tokens'. The time limit and backoff
        (None: the defaults) apply to a new list only; an existing list keeps its own
        (`tune` changes them)."""
        keys.check_list_name(name)
        asked = mode
        for _ in range(CREATE_TRIES):
            rec = self.backend.get(keys.LIST_SET, name, bins=["mode", *TOMBSTONE_BINS])
            clean = None
            if rec is not None and is_tombstone(rec.bins):
                # A dropped list: first what a node that missed its drop brought back.
                self._clear_tombstone(name, rec.bins)
                clean, rec = rec.bins[DROPPED], None
            mode = asked
            if mode is None:
                mode = str(rec.bins["mode"]) if rec is not None else "tokens"
            if mode not in MODES:
                raise ListModeMismatch(f"unknown mode {mode!r}: use 'tokens' or 'ids'")
            # An existing list keeps its own policy (the UDF ignores opts): checked only as given.
            opts = new_list_policy(max_attempts=max_attempts, timeout_s=timeout_s, backoff_s=backoff_s,
                                   backoff_max_s=backoff_max_s, new=rec is None)
            out = self._list_udf(name, "create", mode, max_attempts, opts, clean)
            if out["st"] != "dropped":  # else dropped since the read: clean what that drop names
                break
        else:
            raise ListError(f"list {name!r} was dropped {CREATE_TRIES} times while it was being created")
        if out["st"] == "exists" and out["mode"] != mode:
            if asked is None:
                return False  # made since the read, by a loader that asked for its mode: no mode was asked here
            raise ListModeMismatch(f"list {name!r} exists in {out['mode']!r} mode, not {mode!r}")
        return bool(out["st"] == "created")

    def tune(
        self, name: str, *, timeout_s: float | None = None, backoff_s: float | None = None,
        backoff_max_s: float | None = None,
    ) -> None:
        """Change a list's time limit and backoff (None: unchanged). A new time limit
        applies to claims made from now on; a new backoff to failures from now on."""
        opts = _policy_opts(timeout_s, backoff_s, backoff_max_s)
        head = self.header(name)
        base, cap = backoff_of(head)
        lo, hi = opts.get("bo", base), opts.get("bo_max", cap)
        if hi < lo:
            raise ConfigError(f"list {name!r}: the backoff cap ({hi / 1000:g} s) is below its base ({lo / 1000:g} s)")
        if opts and self._list_udf(name, "tune", opts) == "missing":
            raise ListNotFound(f"no job list named {name!r}")

    def seal(self, name: str) -> None:
        """Loading is finished: refuse further loads; the list can now become complete."""
        self._flag(name, "sealed", 1)

    def pause(self, name: str, paused: bool = True, *, created: int | None = None) -> None:
        """Pause (or resume) the list. `created`: its stamp as the caller saw it (a
        page): `ListReplaced` for another list of the name, nothing set."""
        self._flag(name, "paused", 1 if paused else 0, created)

    def _flag(self, name: str, flag: str, value: int, created: int | None = None) -> None:
        st = self._list_udf(keys.check_list_name(name), "set_flag", flag, value,
                            after=() if created is None else (created,))
        if st == "missing":
            raise ListNotFound(f"no job list named {name!r}")
        if st == "other":
            raise ListReplaced(f"list {name!r} was dropped and loaded again: {flag} left as it was")
        if st == "dropping":
            raise ListError(f"list {name!r} is being dropped (a drop started and did not finish): "
                            "run the drop again to finish it")
        if st == "given up":
            raise ListError(_given_up(name))
        if st != "ok":
            raise ListSealed(f"list {name!r}: cannot set {flag}={value} ({st})")

    def names(self) -> list[str]:
        return sorted(name for name, rec in self.backend.scan(keys.LIST_SET, bins=["mode", DROPPED])
                      if not is_tombstone(rec.bins))

    # -- load --------------------------------------------------------------------

    def load(
        self,
        name: str,
        jobs: Iterable[Any],
        *,
        mode: str | None = None,
        seal: bool = False,
        chunk_size: int | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        progress: Callable[[int], None] | None = None,
        workers: int | None = None,
        timeout_s: float | None = None,
        backoff_s: float | None = None,
        backoff_max_s: float | None = None,
        delay_s: float = 0.0,
        stop: Callable[[], bool] | None = None,
        on_range: Callable[[LoadReport], None] | None = None,
    ) -> LoadReport:
        """Load jobs into a list, creating it if needed (see `aeroqueue.load`).

        `jobs` yields `JobSpec`s, `(id, payload)` pairs or `{"id", "payload"}`
        dicts (other fields as in a JSON Lines file: the payload without one, else
        merged into it), all checked here (ids, sizes, duplicates, run_at, values JSON or
        MySQL cannot hold) before anything is written: a `LoadError` names the
        item (its 1-based place, or a JobSpec's `line`) and field. Only jobs
        wrapped in `loading.Checked` (the CLI's, checked whole as it reads a file)
        are taken as they come. No jobs at all is an error (nothing is created). A sealed list takes no new
        job: loading only jobs it already holds is a no-op
        (`LoadReport.already_sealed`), any new one raises `ListSealed`.
        `workers` ranges are written at once (default: 8 on a server, 1 on the
        embedded store), of `chunk_size` jobs each (default: 1,000 on a server,
        10,000 on the embedded store but for lists in ID mode). `timeout_s`, `backoff_s` and
        `backoff_max_s` set a new list's time limit and backoff (`create`); `delay_s` holds these
        jobs back for that long (server clock), and a job's own `run_at` until then.
        Once its jobs are written, a load whose ranges wait behind another loader's
        waits up to a lease for it (recovering it if its loader died); `stop()` true
        ends that wait (`LoadReport.waiting` counts the jobs still held back).
        `progress(k)` is told of each `k` jobs gone through (a range written, or
        refused as already there); `on_range(report)`, at the same time, of what they
        came to (loaded, skipped, voided): a load that raises has returned no report,
        and its caller says from these how many jobs it loaded before it stopped."""
        return _load.load(
            self, name, jobs, mode=mode, seal=seal, chunk_size=chunk_size, lease_ms=lease_ms,
            max_attempts=max_attempts, progress=progress, workers=workers, timeout_s=timeout_s, backoff_s=backoff_s,
            backoff_max_s=backoff_max_s, delay_s=delay_s, stop=stop, on_range=on_range,
        )

    def recover(self, name: str) -> int:
        """Finish load ranges whose loader missed its lease (it died). Returns how many."""
        return _load.recover(self, name)

    # -- status ------------------------------------------------------------------

    def prefetch(self, names: list[str]) -> dict[str, tuple[dict[str, Any], list[Any]]]:
        """What `status` reads of each of `names`, for all of them in two batch calls
        (their list records, then their completion bitmaps): a scrape of thousands of
        lists made two round trips a list. Lists not there are left out (`status`
        says so). A batch call that fails raises: the caller reads list by list."""
        transitions.flush_bits(self.backend)  # this process's acks count at once
        heads: dict[str, dict[str, Any]] = {}
        for lo in range(0, len(names), PREFETCH_BATCH):
            part = names[lo:lo + PREFETCH_BATCH]
            recs = self.backend.batch_get(keys.LIST_SET, [keys.check_list_name(n) for n in part])
            heads.update((n, rec.bins) for n, rec in zip(part, recs, strict=True)
                         if rec is not None and not is_tombstone(rec.bins))
        wanted = [(name, _bitmap_names(name, head["alloc"])) for name, head in heads.items()]
        flat = [k for _, ks in wanted for k in ks]
        got: list[Any] = []
        for lo in range(0, len(flat), PREFETCH_BATCH):
            got += self.backend.batch_get(keys.DONE_SET, flat[lo:lo + PREFETCH_BATCH])
        out, at = {}, 0
        for name, ks in wanted:
            out[name] = (heads[name], got[at:at + len(ks)])
            at += len(ks)
        return out

    def status(self, name: str, *, read: tuple[dict[str, Any], list[Any]] | None = None) -> ListStatus:
        """A list's counts and state. `read`: its list record's bins and completion
        bitmap records as `prefetch` read them (else read here)."""
        head, done, dead, finished, voids = self._progress(name, read)
        # About to be marked complete (and never swept again): its dead bits checked
        # against the jobs first. A process killed between the two steps of
        # `transitions.set_dead_bits` after a kick leaves the bit of a queued job.
        if (is_complete(head, done, dead) and head.get("done_at") is None
                and transitions.check_dead_bits(self.backend, name, self.dead_tokens(name, head["alloc"], head["created"]),
                                                head["created"])):
            head, done, dead, finished, voids = self._progress(name)
        # Delayed jobs whose time has come wait on the list record until the next take
        # releases them: counted as that take will leave them (by this host's clock).
        reopens = head.get("reopens", 0)  # kicks so far, read before the bits
        head = _released(head, time.time() * 1000)
        # Each job counted once: a token may also stand where it no longer waits. A
        # kick moves it to the retry store and out of the schedule, a delayed load's
        # range (into its skip), the token store ahead (into `timed`) or an unpopped
        # ID-mode chunk (transitions._unchunk); a kick cut short may leave it in both
        # for a while. A push repeated after a lost answer adds no token the store
        # holds, but one taken in between again; a bury leaves it where it was, finished.
        retry_set = {t for t in head.get("retry") or [] if not finished(t)}
        retry = len(retry_set)
        scheduled = {t for items in (head.get("sched") or {}).values() for t in items if not isinstance(t, list)}
        delayed, held_back = _delayed(head, sum(1 for t in scheduled if t not in retry_set and not finished(t)), finished,
                                      retry_set)
        base, cap = backoff_of(head)
        # Tokens a gate or `timed` holds back are subtracted by `held_back` already.
        gates = [(start, start + g["n"]) for start, g in (head.get("gates") or {}).items()]
        timed = set(head.get("timed") or {})

        def in_gate(t: int) -> bool:
            return any(a <= t < b for a, b in gates)

        def waits_here(t: int) -> bool:
            """Not held back: the store's own, unless finished or pending in the retry store."""
            return t not in timed and not in_gate(t)

        if head["mode"] == "ids":
            # A gated chunk is whole until the cursor reaches it: its jobs are delayed.
            ahead, due = self._unpopped(name, head)
            # A gated chunk's tokens are the gate's to count (less those a kick took out).
            held_back = sum(1 for t in ahead if in_gate(t)) if gates else 0
            gone = sum(1 for t in ahead if (t in retry_set or finished(t)) and waits_here(t))
            reservable = len(ahead) - held_back - gone
            # A job with a later run_at of its own waits in its chunk (ID mode schedules
            # it only once popped and refused by its claim): delayed, not reservable.
            # A gated chunk's are counted by its gate. By this host's clock: a count.
            if due:
                now_ms = time.time() * 1000
                waiting = set(ahead)
                later = sum(1 for t, when in due.items()
                            if when > now_ms and t in waiting and waits_here(t) and t not in retry_set and not finished(t))
                reservable -= later
                delayed += later
            # The same holds in a due range a take stepped over (`ready`): its chunk sits
            # behind the cursor, and the range hands the job out to be refused.
            if head.get("ready"):
                later = self._later_in_ready(name, head, finished, retry_set)
                reservable -= later
                delayed += later
        else:
            lo, hi = head["head"], head["tail"]

            def outside_gates(bits: _Finished) -> int:
                """Tokens of [lo, hi) with a bit set, but those of gates (counted there)."""
                return bits.within(lo, hi) - sum(bits.within(max(a, lo), min(b, hi)) for a, b in gates if a < hi and b > lo)

            gone = outside_gates(finished)
            gone -= sum(1 for t in timed if lo <= t < hi and finished(t) and not in_gate(t))
            gone += sum(1 for t in retry_set if lo <= t < hi and waits_here(t))
            # Void tokens (a job id another loader indexed first, a dead loader's unwritten
            # job) are handed out and refused by their claim: no job waits there. A gate
            # holds its voids back with the rest and counts only its real jobs.
            gone += outside_gates(voids)
            reservable = hi - lo - held_back - gone
        reservable += sum(_ready(r, finished) - voids.within(r[0], r[0] + r[1])
                          - _pending_in(r[0], r[1], r[2] if len(r) > 2 else None, retry_set) for r in head.get("ready") or [])
        total = head["total"]
        # Ranges allocated and not yet published: written ones waiting behind another
        # share an entry of `pend` (aq_list_v1 publish), so its size is not their number.
        pending = head["seq"] - head["pubs"]
        stalled = len(self._pending_ranges(head, expired=True))
        sealed = head["sealed"] == 1
        complete = is_complete(head, done, dead)
        # A kick cut short before its `reopen` leaves the completion time of an
        # incomplete list: not shown.
        completed_at = head.get("done_at") if complete else None
        if complete and completed_at is None:
            completed_at = self._list_udf(name, "mark_complete", reopens)
            if completed_at == -1:  # kicked since the bits were read: maybe not complete now
                return self.status(name)
        return ListStatus(
            name=name,
            mode=head["mode"],
            total=total,
            reservable=reservable,
            # Reserved and not yet acknowledged: whatever is neither waiting nor finished.
            in_flight=max(0, total - reservable - retry - delayed - done - dead),
            retry_pending=retry,
            done=done,
            dead=dead,
            sealed=sealed,
            complete=complete,
            paused=head["paused"] == 1,
            dropping=head.get("dropping") == 1,
            pending_ranges=pending,
            stalled_ranges=stalled,
            max_attempts=head["max_att"],
            created=head["created"],
            completed_at=completed_at,
            delayed=delayed,
            timeout_s=head.get("tlim", 300_000) / 1000,
            backoff_s=base / 1000,
            backoff_max_s=cap / 1000,
        )

    def finished(self, name: str) -> tuple[dict[str, Any], int, int]:
        """(the list record, jobs done, jobs dead): what completion needs
        (`is_complete`), without the counts of waiting jobs, for which `status`
        reads the ID store's chunks."""
        head, done, dead, _, _ = self._progress(name)
        return head, done, dead

    def _progress(
        self, name: str, read: tuple[dict[str, Any], list[Any]] | None = None,
    ) -> tuple[dict[str, Any], int, int, _Finished, _Finished]:
        if read is not None:  # `prefetch`'s
            head, recs = read
            return (head, *self._bits(name, head["alloc"], head["created"], recs))
        transitions.flush_bits(self.backend)  # this process's acks count at once
        head = self.header(name)
        done, dead, finished, voids = self._bits(name, head["alloc"], head["created"])
        return head, done, dead, finished, voids

    def unpopped_ids(self, name: str, head: dict[str, Any]) -> list[int]:
        """ID mode: the tokens still waiting in the published chunks from the cursor on."""
        return self._unpopped(name, head)[0]

    def _unpopped(self, name: str, head: dict[str, Any]) -> tuple[list[int], dict[int, int]]:
        """`unpopped_ids`, and when those chunks' jobs with a run_at of their own are
        due (token -> server ms, load.finish_range; popped ones may be among them)."""
        chunks = self.backend.batch_get(
            keys.IDS_SET, [keys.chunk_name(name, c) for c in range(head["cursor"], head["pubs"])], bins=["ids", "due"]
        )
        tokens = [t for c in chunks if c is not None for t in (c.bins.get("ids") or [])]
        due = {t: when for c in chunks if c is not None for t, when in (c.bins.get("due") or {}).items()}
        return tokens, due

    def _later_in_ready(self, name: str, head: dict[str, Any], finished: _Finished, retry: set[int]) -> int:
        """ID mode: jobs of `ready` ranges with a later run_at of their own (not in the
        range's skip, not finished). A range does not say which chunk it came from
        (a chunk is one load range, stepped over whole), so this reads the `due` of
        every chunk behind the cursor: O(chunks), only while a delayed load's range
        is being served. A job also pending in the retry store (a kick cut short) is
        counted there, and `_pending_in` takes it off the range already."""
        chunks = self.backend.batch_get(
            keys.IDS_SET, [keys.chunk_name(name, c) for c in range(head["cursor"])], bins=["due"]
        )
        due = {t: when for c in chunks if c is not None for t, when in (c.bins.get("due") or {}).items()}
        if not due:
            return 0
        now_ms = time.time() * 1000
        later = 0
        for item in head["ready"]:
            start, n = item[0], item[1]
            skip = item[2] if len(item) > 2 and item[2] else {}
            later += sum(1 for t, when in due.items()
                         if when > now_ms and start <= t < start + n and t not in skip and t not in retry
                         and not finished(t))
        return later

    def dead_tokens(self, name: str, alloc: int, created: int | None) -> list[int]:
        """The tokens whose dead bit is set (a done one's too: it is wrong), in the
        bitmaps of the list made at `created`."""
        per = keys.BITS_PER_CHUNK
        tokens = []
        for chunk, rec in enumerate(self._bitmaps(name, alloc, created)):
            x = _chunk_bits(rec, "dead")
            while x:  # the set bits only: dead jobs are few
                bit = x.bit_length() - 1
                tokens.append(chunk * per + per - 1 - bit)
                x ^= 1 << bit
        return sorted(tokens)

    def _bits(
        self, name: str, alloc: int, created: int | None, recs: list[Any] | None = None,
    ) -> tuple[int, int, _Finished, _Finished]:
        """Done and dead bits set, which tokens have either, and which are void (hold
        no job: load.void_bits). A retry store entry whose job finished is a
        duplicate, pending nothing: a release or requeue repeated after a lost answer,
        its first push taken meanwhile, pushes a token twice (rather than strand it),
        the job runs once, and a take skips the second entry."""
        done = dead = 0
        maps: dict[int, int] = {}
        voids: dict[int, int] = {}
        bitmaps = self._bitmaps(name, alloc, created) if recs is None else [keys.bitmap_of(r, created) for r in recs]
        for chunk, rec in enumerate(bitmaps):
            if rec is None:
                continue
            d, x = _chunk_bits(rec, "done"), _chunk_bits(rec, "dead")
            maps[chunk] = d | x
            done += d.bit_count()
            # Each job counted once: a done job whose dead bit is set too (a dead bit left
            # by a process killed in `transitions.set_dead_bits`, its job kicked and
            # done since) is done.
            dead += (x & ~d).bit_count()
            if rec.bins.get("void"):
                voids[chunk] = _chunk_bits(rec, "void")
        return done, dead, _Finished(maps), _Finished(voids)

    def _bitmaps(self, name: str, alloc: int, created: int | None) -> list[Any]:
        """The completion bitmap records of a list's `alloc` tokens, one a chunk (None: no
        bit set yet, or the chunk is of another list of the name: `keys.bitmap_of`)."""
        recs = self.backend.batch_get(keys.DONE_SET, _bitmap_names(name, alloc))
        return [keys.bitmap_of(rec, created) for rec in recs]

    # -- walking a list ----------------------------------------------------------

    def jobs(self, name: str, state: str | None = None) -> Iterator[dict[str, Any]]:
        """Every job of a list, in token order (batch reads, O(list size)): the records
        of its published ranges. A range still loading holds no job of the list yet: one
        a killed loader left showed its records as queued, beside the same ids the load
        run again wrote at tokens of their own, until a recovery voided them."""
        head = self.header(name)
        for lo in range(0, head["tail"], PAGE):
            names = [keys.job_name(name, t) for t in range(lo, min(lo + PAGE, head["tail"]))]
            for rec in self.backend.batch_get(keys.JOB_SET, names):
                if rec is None or rec.bins.get("state") == "void":
                    continue
                if state is None or rec.bins.get("state") == state:
                    yield rec.bins

    def export(self, name: str, out: Any, state: str | None = None) -> int:
        """Write job records as JSON Lines; returns how many."""
        n = 0
        for job in self.jobs(name, state):
            out.write(json.dumps(_jsonable(job), sort_keys=True) + "\n")
            n += 1
        return n

    def kick(
        self, name: str, tokens: Iterable[int] | None = None, *, dead_only: bool = False, created: int | None = None
    ) -> int:
        """Put jobs back in the queue now: dead ones with fresh attempts, delayed ones
        before their time. All of the list's dead jobs, or only these tokens (a token
        that is neither dead nor delayed is left alone, and so is one of a range a load
        has not published yet; with `dead_only`, a delayed one too). Returns how many.
        `created`: the stamp of the list the caller saw (a page shown before a drop and
        a load of the name): `ListReplaced` if the name's list is another one now."""
        head = self.header(name)
        if created is not None and head["created"] != created:
            raise ListReplaced(f"list {name!r} was dropped and loaded again since it was read: nothing was kicked")
        if tokens is None:
            # The jobs the scan read dead, still dead: one kicked by another since and
            # delayed again by its backoff keeps its wait.
            tokens, dead_only = [job["token"] for job in self.jobs(name, "dead")], True
        else:
            tokens = _published(head, tokens)
        return transitions.kick(self.backend, name, list(tokens), dead_only=dead_only, created=head["created"])

    # -- one job, by its own id --------------------------------------------------

    def find_job(self, name: str, jid: str) -> dict[str, Any]:
        """A job's record, found by the id it was loaded with (through the job-id index)."""
        created = self.header(name)["created"]
        idx = self.backend.get(keys.JIDX_SET, keys.jidx_name(name, str(jid)))
        tok = idx.bins.get("tok") if idx is not None and keys.indexed_here(idx.bins, created) else None
        rec = self.backend.get(keys.JOB_SET, keys.job_name(name, tok)) if tok is not None else None
        if rec is None or rec.bins.get("state") == "void" or str(rec.bins.get("jid")) != str(jid):
            raise JobNotFound(f"list {name!r} has no job with id {jid!r}")
        return rec.bins

    def kick_job(self, name: str, jid: str) -> bool:
        """Put one dead or delayed job back in the queue now; False if it was neither
        (or its load has not published it yet)."""
        head = self.header(name)
        tokens = _published(head, [self.find_job(name, jid)["token"]])
        return transitions.kick(self.backend, name, tokens, created=head["created"]) == 1

    def bury(self, name: str, jid: str, why: str = "buried by an operator") -> str:
        """Send one job to dead by hand (a claim on it is lost: its ack will be refused).
        Returns the job's state afterwards: 'dead', or 'done' (left alone). `why` is
        the dead job's last error: blank raises `ConfigError`."""
        check_bury_reason(why)
        job = self.find_job(name, jid)
        state = transitions.bury(self.backend, name, job["token"], why, job.get("c"))
        if state == "other":  # dropped and loaded again since it was found: that job is gone
            raise JobNotFound(f"list {name!r} has no job with id {jid!r} any more (dropped and loaded again)")
        # Read after the bury: the head only grows, and a token it passed since had its
        # block written before it was published. Another list of the name since: no
        # block of this job's is trusted any more.
        head = self.header(name)
        if state != "dead" or head["mode"] != "tokens" or head["created"] != job.get("c", head["created"]):
            return state
        # A job never handed out keeps its block entry, which says queued (blocks.py).
        # Marked after the bury: a reservation that pops the entry before the mark runs
        # a job the bury is ending (its ack refused), as one that read the record
        # just before the bury would.
        try:
            blocks.forget(self.backend, name, job["token"], head["created"], fresh=job["token"] >= head["head"])
        except ListNotFound:
            raise
        except AeroqueueError as e:
            raise ListError(f"job {jid!r} of list {name!r} is dead, but its block record could not be marked "
                            f"({e}): run the bury again to finish it") from e
        return state

    # -- drop --------------------------------------------------------------------

    def drop(
        self, name: str, *, grace_s: float = DROP_GRACE_S, load_wait_s: float = 10.0, lease_wait_s: float = 10.0
    ) -> DropReport:
        """Delete a list and every record it owns (design.md, Records): its job records,
        job-id index entries, ID store chunks, completion bitmaps, and last the list
        record itself (which holds the retry store and the load ranges).

        Safe with workers running: the list is sealed and paused first, so no load
        allocates and no reservation takes from it; a worker still holding a claim
        finds its job gone, and its acknowledgement is refused (`JobNotFound`). The
        list record goes last, so a drop that is interrupted (or fails) leaves the
        list sealed and paused, and running it again finishes it. A list missing
        raises `ListNotFound`; a load in progress (a range allocated, its lease not
        run out) raises `ListError` before anything changes.

        Leased jobs (`Queue.reserve(..., lease=True)`) are waited for, up to
        `lease_wait_s`, before any job record is deleted: a lease's ack is fenced by
        the job record's content as the lease read it (queued, attempts, last claim),
        which a list loaded again under the same name recreates exactly, so a lease
        still running after the drop would acknowledge (or its reaper claim) the new
        list's job of the same token. Leases past their time limit are forgotten
        here (no ack of theirs is admitted any more); others still held at the
        deadline raise `ListError`, the list left sealed and paused: drop it again.

        The list record is not deleted but made a tombstone (aq_list_v1.lua,
        `tombstone`), which every reader takes for a missing list: a node that missed
        the drop (frozen, cut off) brings its copies of the list's records back when
        it rejoins, and the tombstone, written after them, wins over its copy of the
        list record. The job records, index entries, chunks and bitmaps it brings
        back are deleted by the next drop of the name (which then raises
        `ListNotFound`) or the next create or load of it."""
        rec = self.backend.get(keys.LIST_SET, keys.check_list_name(name))
        if rec is not None and is_tombstone(rec.bins):
            gone = self._clear_tombstone(name, rec.bins)
            found = gone.jobs + gone.index + gone.id_chunks + gone.bitmaps
            raise ListNotFound(f"no job list named {name!r}" + (
                f" (dropped; {found:,} of its records, brought back by a node that missed the drop, deleted now)"
                if found else ""))
        head = self.header(name)
        if self._pending_ranges(head):
            raise ListError(
                f"list {name!r} has a load in progress ({len(self._pending_ranges(head))} range(s) allocated and not "
                "published, their lease not run out): stop the loader, or wait for it, then drop again"
            )
        # Marked first, then sealed: an unsealed list whose jobs are all done would
        # otherwise look complete (and a worker --until-complete exit) from the seal
        # until its bitmaps go. The mark (dropping = 2) deletes nothing, so loads in
        # flight still land and a resume gives the drop up (aq_list_v1.lua, set_flag).
        self._flag(name, "dropping", DROP_BEGUN)
        # Sealed: no new range; paused: no new reservation. The seal is never undone;
        # the pause only by a resume that gives up a drop failed before its deletes.
        self._flag(name, "sealed", 1)
        self._flag(name, "paused", 1)
        paused_at = time.monotonic()
        head = self.header(name)
        # A load that allocated between the check and the seal: let its range land
        # (no new one can start now) so that its job records are deleted below.
        deadline = time.monotonic() + load_wait_s
        while self._pending_ranges(head):
            if _drop_given_up(head):
                raise ListError(_given_up(name))
            if time.monotonic() >= deadline:
                raise ListError(f"list {name!r}: a load into it is still writing (it is now sealed and paused); "
                                "drop again once it has finished")
            time.sleep(0.1)
            head = self.header(name)
        # Leased jobs: acknowledged (or ended) before their records go. A resume meanwhile
        # gives the drop up (the step to dropping=1 below is refused then, too).
        self._await_leases(name, lease_wait_s, given_up=lambda: _drop_given_up(self.header(name)))
        # From here records go: a drop that stops half-way leaves a list that could never
        # complete, which `pause` will not resume (only a drop finishes it).
        self._flag(name, "dropping", 1)
        alloc, ranges = head["alloc"], head.get("seq", 0)
        jobs, index, id_chunks, bitmaps = self._delete_owned(name, alloc, ranges)
        # A reservation that took jobs just before the pause records its lease within
        # LEASE_WINDOW_S of its take (or claims them instead): one that landed after the
        # look above must end before the name can be loaded again, so the list record
        # (sealed: it takes no new job) stays until then. Looked at once the jobs are
        # gone, so that the list never looks complete meanwhile.
        time.sleep(max(0.0, LEASE_SETTLE_S - (time.monotonic() - paused_at)))
        self._await_leases(name, lease_wait_s)
        # A tombstone, not a delete: Community Edition's deletes leave nothing that
        # would stop a rejoining node's copy of the list record from coming back.
        # Its generation is past that copy's: the drop's mark, seal, pause and dropping
        # flags and the tombstone are at least four writes made since, and a node cut
        # off mid-write holds at most one its replica missed.
        self._list_udf(name, "tombstone")
        # An ack that landed before its job was deleted sets its bit a moment later
        # (bit buffers, the fail path's dead bit): that would recreate a bitmap chunk,
        # and a list loaded later under the same name would count it.
        if grace_s > 0:
            time.sleep(grace_s)
            transitions.flush_bits(self.backend)  # this process's own, if any
            # Only this list's chunks (its stamp, or none), not those of a list of the name
            # loaded during the grace: deleted, its done jobs were counted in flight until
            # a sweep recounted them. By identity, as stamps are compared everywhere.
            ours = exp.Or(exp.Not(exp.BinExists("c")), exp.Eq(exp.IntBin("c"), head["created"]))
            bitmaps += self._delete_all(keys.DONE_SET, _bitmap_names(name, alloc), only=ours.compile())
        return DropReport(name=name, jobs=jobs, index=index, id_chunks=id_chunks, bitmaps=bitmaps)

    def _await_leases(self, name: str, wait_s: float, given_up: Callable[[], bool] | None = None) -> None:
        """Wait until no session holds a lease on a job of list `name` that may still
        be acknowledged: each ends acknowledged or claimed (settled, then forgotten with
        its session's next heartbeat), reaped, or past its time limit (forgotten here).
        A dead session's lease waits for a reaper (`sessions.reap`: the CLI's drop runs
        one first); with none running it holds the drop until its time limit."""
        deadline = time.monotonic() + wait_s
        while True:
            held = 0
            for sid, leases in lease_entries.scan(self.backend):
                mine = lease_entries.on_list(leases, name)
                if not mine:
                    continue
                cutoff = retry_in_doubt(functools.partial(lease_entries.cutoff_ms, self.backend, sid))
                if cutoff is None:
                    continue  # the session is gone, and its leases with it
                over = lease_entries.overdue(mine, cutoff)
                if over:
                    retry_in_doubt(
                        functools.partial(transitions.sess_once, self.backend, sid, "unlease", list(over))
                    )
                held += sum(len(list(lease_entries.tokens(e))) for lid, e in mine.items() if lid not in over)
            if not held:
                return
            if given_up is not None and given_up():
                raise ListError(_given_up(name))
            if time.monotonic() >= deadline:
                raise ListError(
                    f"list {name!r}: sessions still hold leases on {held} of its jobs (it is now sealed and paused); "
                    "drop again once they are acknowledged or their time limit has passed (if their workers died, "
                    "`aeroqueue reap` ends their leases now)"
                )
            time.sleep(0.2)

    @staticmethod
    def _pending_ranges(head: dict[str, Any], *, expired: bool = False) -> list[Any]:
        """The load ranges whose loader still holds its lease; `expired`: those whose
        loader missed it (died), which `recover` finishes (aq_list_v1.expired)."""
        now_ms = time.time() * 1000
        # Lease expiry is the server's clock; a few seconds of skew only make the
        # check stricter or looser by that much, and the seal settles the rest.
        return [r for r in (head.get("pend") or {}).values()
                if r.get("real") is None and (r.get("exp", 0) <= now_ms) == expired]

    def _delete_owned(self, name: str, alloc: int, ranges: int, before: int | None = None) -> tuple[int, int, int, int]:
        """Delete the records list `name` owns, given its `alloc` and load `ranges`: job
        records, job-id index entries, ID store chunks, bitmaps. With `before` (server
        ms), only records last written before it. Returns how many of each existed
        (deleted, with `before`)."""
        only = None if before is None else _before(before).compile()
        # Block records first (not reported: they repeat what job records hold): a
        # reservation whose take came just before the pause must not pop the entries
        # of jobs whose records are gone (blocks.py).
        self._delete_all(keys.BLOCK_SET, blocks.names_upto(name, alloc), only=only)
        jobs = index = 0
        for lo in range(0, alloc, PAGE):
            names = [keys.job_name(name, t) for t in range(lo, min(lo + PAGE, alloc))]
            recs = retry_in_doubt(functools.partial(self.backend.batch_get, keys.JOB_SET, names, bins=["jid"]))
            present = [(n, r) for n, r in zip(names, recs, strict=True) if r is not None]
            # The index entries first: they are found through the job records, so a
            # drop interrupted here finds them again next time.
            jids = sorted({str(r.bins["jid"]) for _, r in present if r.bins.get("jid") is not None})
            index += self._delete_all(keys.JIDX_SET, [keys.jidx_name(name, j) for j in jids], only=only)
            jobs += self._delete_all(keys.JOB_SET, [n for n, _ in present], only=only)
        if jobs < alloc or before is not None:
            # Tokens without a job record: the sync's retention deleted them (keeping
            # their index entries, so that a repeated load adds nothing twice), or a
            # load died before writing them. Their entries are found by the list's name,
            # as are those a rejoining node brought back without their job record.
            index += self._delete_index_of(name, before)
        id_chunks = self._delete_all(keys.IDS_SET, [keys.chunk_name(name, c) for c in range(ranges)], only=only)
        bitmaps = self._delete_all(keys.DONE_SET, _bitmap_names(name, alloc), only=only)
        return jobs, index, id_chunks, bitmaps

    def _clear_tombstone(self, name: str, bins: dict[str, Any]) -> DropReport:
        """Delete what the tombstone of a dropped list names (its tokens, its ranges, its
        index entries by name) and was written before the drop: the records a node that
        missed the drop brought back when it rejoined. Records written since belong to
        a list loaded again under the name (a create running beside this one)."""
        jobs, index, id_chunks, bitmaps = self._delete_owned(
            name, int(bins.get("alloc") or 0), int(bins.get("seq") or 0), before=int(bins[DROPPED]))
        return DropReport(name=name, jobs=jobs, index=index, id_chunks=id_chunks, bitmaps=bitmaps)

    def _delete_index_of(self, name: str, before: int | None = None) -> int:
        """Delete the job-id index entries of list `name` still in the store (with
        `before`, server ms: only those last written before it), found by a scan of the
        index set filtered on their "l" bin (entries written before it have none), a
        PAGE at a time: a million of them are not held at once. Returns how many
        existed."""
        mine = exp.Eq(exp.StrBin("l"), name)
        old = None if before is None else _before(before)
        only = (mine if old is None else exp.And(mine, old)).compile()
        kept = None if old is None else old.compile()
        deleted, page = 0, []
        for n, _ in self.backend.scan(keys.JIDX_SET, expression=only, bins=["l"]):
            page.append(n)
            if len(page) == PAGE:
                deleted += self._delete_all(keys.JIDX_SET, page, only=kept)
                page = []
        return deleted + self._delete_all(keys.JIDX_SET, page, only=kept)

    def _delete_all(self, set_name: str, names: list[str], *, only: Any = None) -> int:
        """Delete records (batch deletes, PAGE at a time, repeated while in doubt), with
        `only` (a compiled filter expression) those it lets through; returns how many
        existed (and were deleted)."""
        deleted = 0
        policy = {"expressions": only} if only is not None else None
        # With the deadline of every write to these records: a stamp or time filter is
        # no guard against a late run, which reads the stale copy (`_load.InTime`).
        in_time = _load.InTime.of(self.backend)
        ops = [op.delete()] if in_time is None else [in_time.op, op.delete()]
        for lo in range(0, len(names), PAGE):
            page = names[lo : lo + PAGE]
            writes = [Write(self.backend.key(set_name, n), ops, policy=policy) for n in page]
            codes = self._batch_write(writes, f"drop {set_name}", in_time)
            # Filtered out: a record written since the drop (`only`); not found: gone already.
            failed = [c for c in codes if c not in (0, _load.NOT_FOUND, _load.FILTERED_OUT)]
            if failed:
                # Filtered (`only`): cleaning a dropped list's leftovers, before a create or
                # load of its name, or a drop of it again; else a drop under way.
                then = ("repeat the command: a load, create or drop of the name deletes them first"
                        if only is not None else "the list is sealed and paused: drop it again")
                raise ListError(f"deleting {len(failed)} record(s) of {set_name} failed (Aerospike codes "
                                f"{sorted(set(failed))}); {then}")
            deleted += sum(1 for c in codes if c == 0)
        return deleted



CREATE_TRIES = 5  # a create that finds its tombstone replaced by another that often gives up
# A dropped list's record (aq_list_v1.lua, tombstone): the server ms of the drop, and
# what finds the records it owned (its tokens, its ranges).
DROPPED = "dropped"
TOMBSTONE_BINS = [DROPPED, "alloc", "seq"]


def _before(dropped: int) -> Any:
    """A filter: records of a list of this name dropped at `dropped` (server ms), or
    before: last written before the drop, or stamped (bin "c", job records and index
    entries) by a list made before it, which a loader stopped past its lease and
    killed once it resumed may have written after the drop."""
    return exp.Or(exp.LT(exp.LastUpdateTime(), dropped * 1_000_000),
                  exp.And(exp.BinExists("c"), exp.LT(exp.IntBin("c"), dropped)))


def is_tombstone(bins: dict[str, Any]) -> bool:
    """Whether a list record's bins are a dropped list's tombstone: a missing list."""
    return bins.get(DROPPED) is not None


def backoff_of(head: dict[str, Any]) -> tuple[int, int]:
    """A list record's backoff (base, cap) in ms; a list made before the bins existed
    has the defaults."""
    return int(head.get("bo", DEFAULT_BACKOFF_S * 1000)), int(head.get("bo_max", DEFAULT_BACKOFF_MAX_S * 1000))


def new_list_policy(
    *, max_attempts: int = DEFAULT_MAX_ATTEMPTS, timeout_s: float | None = None, backoff_s: float | None = None,
    backoff_max_s: float | None = None, new: bool = True,
) -> dict[str, int]:
    """A list's policy as `create` takes it (None: the default), checked, as the list
    record's tlim / bo / bo_max (ms); with `new`, also against the defaults of what was
    not given. Raises `ConfigError` naming what is wrong: a loader calls it before it
    reads a file, not after checking a million lines."""
    max_attempts = whole("max_attempts", max_attempts)
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise ConfigError(f"max_attempts must be from 1 to {MAX_ATTEMPTS:,}, not {max_attempts}")
    opts = _policy_opts(timeout_s, backoff_s, backoff_max_s)
    lo, hi = opts.get("bo", round(DEFAULT_BACKOFF_S * 1000)), opts.get("bo_max", round(DEFAULT_BACKOFF_MAX_S * 1000))
    if new and hi < lo:
        raise ConfigError(f"the backoff cap ({hi / 1000:g} s) would be below its base ({lo / 1000:g} s)")
    return opts


def _given_up(name: str) -> str:
    return (f"list {name!r}: the drop was given up: the list was resumed (`aeroqueue pause --resume`, or the "
            "dashboard) before anything was deleted; nothing was deleted (the list stays sealed: no load adds to it)")


def _drop_given_up(head: dict[str, Any]) -> bool:
    """A drop that marked the list begun (DROP_BEGUN) and has deleted nothing finds it
    resumed since: the resume cleared the mark (aq_list_v1.set_flag)."""
    return head.get("dropping") != 1 and (head.get("dropping") != DROP_BEGUN or head.get("paused") != 1)


def _published(head: dict[str, Any], tokens: Iterable[int]) -> list[int]:
    """The tokens of published ranges (below `tail`) of the list `head` is of. A token
    the list never allocated holds no job: kicking it would write a bitmap chunk past
    the list's end, which nothing counts and `drop` never deletes. One of a range
    still loading is no job of the list yet: kicked, it ran, and the load run again
    (after its loader died) gave its id a token of its own."""
    return [t for t in tokens if 0 <= t < head["tail"]]


def _bitmap_names(name: str, alloc: int) -> list[str]:
    """The completion bitmap records that hold a list's `alloc` tokens, one a chunk."""
    return [keys.chunk_name(name, c) for c in range(-(-alloc // keys.BITS_PER_CHUNK))]


def _chunk_bits(rec: Any, bitmap: str) -> int:
    """One bitmap of a chunk record as an int, the chunk's first token the highest bit
    (0 for no record or no such bin)."""
    raw = rec.bins.get(bitmap) if rec is not None else None
    return int.from_bytes(bytes(raw or b"").ljust(keys.BITS_PER_CHUNK // 8, b"\0"), "big")


def _policy_opts(timeout_s: float | None, backoff_s: float | None, backoff_max_s: float | None) -> dict[str, int]:
    """The list record's tlim / bo / bo_max (ms) for the values given; checks them."""
    opts: dict[str, int] = {}
    if timeout_s is not None:
        if not 0 < seconds("timeout_s", timeout_s) <= MAX_SECONDS:  # NaN fails too
            raise ConfigError(f"time limit must be positive seconds up to {MAX_SECONDS:,}, not {timeout_s}")
        opts["tlim"] = max(1, round(timeout_s * 1000))
    if backoff_s is not None:
        if not 0 <= seconds("backoff_s", backoff_s) <= MAX_SECONDS:
            raise ConfigError(f"backoff must be from 0 to {MAX_SECONDS:,} seconds, not {backoff_s}")
        opts["bo"] = round(backoff_s * 1000)
    if backoff_max_s is not None:
        if not 0 <= seconds("backoff_max_s", backoff_max_s) <= MAX_SECONDS:
            raise ConfigError(f"backoff cap must be from 0 to {MAX_SECONDS:,} seconds, not {backoff_max_s}")
        opts["bo_max"] = round(backoff_max_s * 1000)
    if "bo" in opts and "bo_max" in opts and opts["bo_max"] < opts["bo"]:
        raise ConfigError(f"the backoff cap ({backoff_max_s:g} s) is below its base ({backoff_s:g} s)")
    return opts


class _Finished:
    """Which tokens of a list have their done or dead bit set (bits as one int a chunk,
    the first token the highest bit, as the bitmaps store them)."""

    _PER = keys.BITS_PER_CHUNK

    def __init__(self, maps: dict[int, int]) -> None:
        self._maps = maps

    def __call__(self, token: int) -> bool:
        chunk, bit = divmod(token, self._PER)
        return bool((self._maps.get(chunk, 0) >> (self._PER - 1 - bit)) & 1)

    def within(self, lo: int, hi: int) -> int:
        """How many tokens of [lo, hi) are finished."""
        n = 0
        for chunk in range(lo // self._PER, -(-hi // self._PER)):
            bits = self._maps.get(chunk, 0)
            if not bits:
                continue
            a, b = max(lo - chunk * self._PER, 0), min(hi - chunk * self._PER, self._PER)
            n += (bits >> (self._PER - b) & ((1 << (b - a)) - 1)).bit_count()
        return n


def is_complete(head: dict[str, Any], done: int, dead: int) -> bool:
    """A list is complete once sealed, with no load range unpublished, and every job
    done or dead; never while a drop of it is under way."""
    return (head["sealed"] == 1 and not head.get("pend") and done + dead == head["total"]
            and not head.get("dropping"))


def _finished_in(start: int, n: int, skip: dict[int, Any] | None, finished: _Finished) -> int:
    """Finished tokens of a delayed load's range [start, start + n), but those in its
    skip (counted where the skip sends them). A job buried (or done, once kicked
    elsewhere) before its range is handed out is finished there, not waiting."""
    gone = finished.within(start, start + n)
    if gone and skip:
        gone -= sum(1 for t in skip if start <= t < start + n and finished(t))
    return gone


def _pending_in(start: int, n: int, skip: dict[int, Any] | None, retry: set[int]) -> int:
    """Tokens of a range [start, start + n) that also wait in the retry store (`retry`:
    not finished), but those in its skip: a kick pushes its job there before it takes
    it out of the range (into the skip), so a kick cut short leaves it in both."""
    if not retry:
        return 0
    return sum(1 for t in retry if start <= t < start + n and not (skip and t in skip))


def _delayed(head: dict[str, Any], scheduled: int, finished: _Finished, retry: set[int] | None = None) -> tuple[int, int]:
    """(jobs waiting for their time, jobs of the token store held back by gates and
    timed jobs; ID mode: 0, status counts those in the chunks) from the list record's
    schedule, given how many of its single tokens still wait (`scheduled`: not
    finished, not also pending in the retry store). Each job is counted once (aq_list_v1.lua, header): a gate's `real`
    leaves out its jobs with a later run_at of their own (its `skip`), which sched
    holds, and neither a gate nor a sched range counts its finished jobs."""
    gates = head.get("gates") or {}
    retry = retry or set()
    ranges = sum(item[2] - _finished_in(item[0], item[1], item[3] if len(item) > 3 else None, finished)
                 - _pending_in(item[0], item[1], item[3] if len(item) > 3 else None, retry)
                 for items in (head.get("sched") or {}).values() for item in items if isinstance(item, list))
    delayed = sum(g["real"] - _finished_in(start, g["n"], g.get("skip"), finished)
                  - _pending_in(start, g["n"], g.get("skip"), retry) for start, g in gates.items())
    delayed += scheduled + ranges
    if head["mode"] == "ids":
        # What a gated chunk holds back is in the chunk itself (a kick takes its job
        # out): status counts it there.
        return delayed, 0
    # Only tokens the token store has not passed: a list record written before gates
    # kept their own skip may hold timed tokens behind `head`, which nothing skips any more.
    timed = sum(1 for t in (head.get("timed") or {}) if t >= head["head"])
    return delayed, sum(g["n"] for g in gates.values()) + timed


def _released(head: dict[str, Any], now_ms: float) -> dict[str, Any]:
    """The list record as a take at `now_ms` would leave what is due (aq_list_v1.lua:
    `release_due`, and the gates a take passes): the schedule's due tokens pushed to
    the retry store and its due ranges to `ready`; a due gate gone, its jobs with a
    later run_at of their own (its skip) held by `timed` (token mode) as the walk
    through it holds them. The record itself is not written: a read stays a read."""
    sched = head.get("sched") or {}
    gates = head.get("gates") or {}
    due_keys = [due for due in sched if due <= now_ms]
    open_gates = [start for start, g in gates.items() if g.get("due", 0) <= now_ms]
    if not due_keys and not open_gates:
        return head
    head = dict(head)
    retry, ready = list(head.get("retry") or []), list(head.get("ready") or [])
    for due in sorted(due_keys):
        for item in sched[due]:
            if isinstance(item, list):
                ready.append([item[0], item[1], item[3] if len(item) > 3 else None])
            else:
                retry.append(item)
    head["sched"] = {due: items for due, items in sched.items() if due > now_ms}
    head["retry"], head["ready"] = retry, ready
    if open_gates:
        head["gates"] = {start: g for start, g in gates.items() if start not in open_gates}
        if head["mode"] == "tokens":
            timed = dict(head.get("timed") or {})
            for start in open_gates:
                timed.update(gates[start].get("skip") or {})
            head["timed"] = timed
    return head


def _ready(item: list[Any], finished: _Finished) -> int:
    """Jobs a `ready` entry [start, n, skip?] will hand out: all but those it skips,
    and those finished meanwhile (buried)."""
    start, n = item[0], item[1]
    skip = item[2] if len(item) > 2 and item[2] else {}
    return n - sum(1 for t in skip if start <= t < start + n) - _finished_in(start, n, skip, finished)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
