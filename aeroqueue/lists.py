"""Job lists: create, load, seal, status, export, kick.

Loading (design.md, flows "load"; invariant 4) goes range by range:

1. skip jobs whose id is already indexed (a re-run of the same load);
2. ``alloc``: the list record hands out a token range and a sequence number;
3. write the job records, create-only (a failure means a recovery already
   finished this range: the load is told to run again);
4. write the job-id index, create-only: the index entry is the commit point
   of a job. A job whose id another loader indexed first becomes ``void``;
5. ID mode: write the range's chunk of the ID store;
6. ``publish``: ranges become reservable strictly in sequence order.

A loader that dies between 2 and 6 leaves a pending range; once its lease
has run out, `recover` finishes it with the same rules (index first wins,
unwritten tokens become void), so loads are resumable and never expose an
unwritten token.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import aerospike
from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.operations import operations as op

from . import keys, transitions
from .backends import IN_DOUBT, Backend, retry_in_doubt, wrap
from .errors import (
    ListModeMismatch,
    ListNotFound,
    ListSealed,
    LoadAbandoned,
    LoadError,
    RecordExists,
)
from .loading import RECORD_OVERHEAD, JobSpec, from_iterable

MODES = ("tokens", "ids")
DEFAULT_CHUNK = 1000
DEFAULT_LEASE_MS = 120_000
DEFAULT_MAX_ATTEMPTS = 5
PAGE = 1000  # records per batch read when walking a list
RECORD_EXISTS = 5  # Aerospike's code for a create-only write on an existing record
# Per-record codes of a batch write that did not land, or may have: repeated.
IN_DOUBT_CODES = frozenset({-15, -10, -8, 7, 9, 11, 14, 18})


@dataclass(frozen=True)
class LoadReport:
    loaded: int  # new jobs that became reservable
    skipped: int  # already loaded (same job id)
    voided: int  # tokens left void (another loader indexed the id first)


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

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def max_payload(backend: Backend) -> int:
    limit = getattr(backend.client, "max_record_size", None) or 1024 * 1024
    return int(limit) - RECORD_OVERHEAD


class JobLists:
    """Job lists in one store."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        # How long a load repeats batch writes whose answer was lost or that a
        # changing cluster could not serve (a node died, migrations) before it gives up.
        self.write_retry_s = 10.0

    # -- small helpers ---------------------------------------------------------

    def _list_udf(self, name: str, function: str, *args: Any) -> Any:
        def call() -> Any:
            return self.backend.udf(keys.LIST_SET, name, keys.LIST_MOD, function, *args)

        # Every list call here is safe to repeat after a lost answer (a node died
        # mid-call) except alloc: a repeat would allocate a second range.
        return call() if function == "alloc" else retry_in_doubt(call)

    def header(self, name: str) -> dict[str, Any]:
        rec = self.backend.get(keys.LIST_SET, keys.check_list_name(name))
        if rec is None:
            raise ListNotFound(f"no job list named {name!r}")
        return rec.bins

    # -- create, seal, pause ---------------------------------------------------

    def create(self, name: str, *, mode: str = "tokens", max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> bool:
        """Create a list (True), or check an existing one has the same mode (False)."""
        keys.check_list_name(name)
        if mode not in MODES:
            raise ListModeMismatch(f"unknown mode {mode!r}: use 'tokens' or 'ids'")
        if max_attempts < 1:
            raise ListModeMismatch(f"max_attempts must be at least 1, not {max_attempts}")
        out = self._list_udf(name, "create", mode, max_attempts)
        if out["st"] == "exists" and out["mode"] != mode:
            raise ListModeMismatch(f"list {name!r} exists in {out['mode']!r} mode, not {mode!r}")
        return bool(out["st"] == "created")

    def seal(self, name: str) -> None:
        """Loading is finished: refuse further loads; the list can now become complete."""
        self._flag(name, "sealed", 1)

    def pause(self, name: str, paused: bool = True) -> None:
        self._flag(name, "paused", 1 if paused else 0)

    def _flag(self, name: str, flag: str, value: int) -> None:
        st = self._list_udf(keys.check_list_name(name), "set_flag", flag, value)
        if st == "missing":
            raise ListNotFound(f"no job list named {name!r}")
        if st != "ok":
            raise ListSealed(f"list {name!r}: cannot set {flag}={value} ({st})")

    def names(self) -> list[str]:
        return sorted(name for name, _ in self.backend.scan(keys.LIST_SET, bins=["mode"]))

    # -- load --------------------------------------------------------------------

    def load(
        self,
        name: str,
        jobs: Iterable[Any],
        *,
        mode: str = "tokens",
        seal: bool = False,
        chunk_size: int = DEFAULT_CHUNK,
        lease_ms: int = DEFAULT_LEASE_MS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        progress: Callable[[int], None] | None = None,
    ) -> LoadReport:
        """Load jobs into a list, creating it if needed.

        `jobs` yields `JobSpec`s already checked (the CLI checks a whole file
        first), or plain items, `(id, payload)` pairs or `{"id", "payload"}`
        dicts, which are checked whole here before anything is written."""
        if chunk_size < 1:
            raise LoadError(f"chunk size must be at least 1, not {chunk_size}")
        jobs = _specs(jobs, max_payload(self.backend))
        self.create(name, mode=mode, max_attempts=max_attempts)
        head = self.header(name)
        if head["sealed"] == 1:
            raise ListSealed(f"list {name!r} is sealed: nothing more can be loaded into it")
        self.recover(name)
        loaded = skipped = voided = 0
        batch: list[JobSpec] = []
        for spec in jobs:
            batch.append(spec)
            if len(batch) == chunk_size:
                a, b, c = self._load_range(name, head, batch, lease_ms)
                loaded, skipped, voided = loaded + a, skipped + b, voided + c
                if progress:
                    progress(len(batch))
                batch = []
        if batch:
            a, b, c = self._load_range(name, head, batch, lease_ms)
            loaded, skipped, voided = loaded + a, skipped + b, voided + c
            if progress:
                progress(len(batch))
        if seal:
            self.seal(name)
        return LoadReport(loaded, skipped, voided)

    def _load_range(self, name: str, head: dict[str, Any], batch: list[JobSpec], lease_ms: int) -> tuple[int, int, int]:
        b = self.backend
        indexed = b.batch_get(keys.JIDX_SET, [keys.jidx_name(name, s.jid) for s in batch])
        new = [s for s, rec in zip(batch, indexed, strict=True) if rec is None]
        if not new:
            return 0, len(batch), 0
        got = self._list_udf(name, "alloc", len(new), lease_ms)
        if got["st"] == "sealed":
            raise ListSealed(f"list {name!r} was sealed during the load")
        if got["st"] != "ok":
            raise ListNotFound(f"no job list named {name!r}")
        seq, start = got["seq"], got["start"]
        tokens = list(range(start, start + len(new)))
        # 3. job records, create-only: tokens are fresh, so a conflict means a
        # recovery voided this range after our lease ran out.
        job_writes = [
            Write(
                b.key(keys.JOB_SET, keys.job_name(name, t)),
                [op.write(k, v) for k, v in _job_bins(name, t, s, head["max_att"]).items()],
                policy={"exists": 1, "key": 1},  # POLICY_EXISTS_CREATE, POLICY_KEY_SEND
            )
            for t, s in zip(tokens, new, strict=True)
        ]
        codes = self._batch_write(job_writes, "write jobs")
        # RecordExists is this load's own write when it was repeated after a lost
        # answer (by the client, or by _batch_write): the record then holds our job.
        exists = [i for i, code in enumerate(codes) if code == RECORD_EXISTS]
        if exists:
            recs = retry_in_doubt(lambda: b.batch_get(keys.JOB_SET, [keys.job_name(name, tokens[i]) for i in exists]))
            for i, rec in zip(exists, recs, strict=True):
                if rec is not None and rec.bins.get("state") != "void" and rec.bins.get("jid") == new[i].jid:
                    codes[i] = 0
            if any(codes[i] == RECORD_EXISTS for i in exists):
                raise LoadAbandoned(
                    f"list {name!r}: load range {seq} outlived its lease ({lease_ms / 1000:g} s) and was finished by "
                    "a recovery before its jobs were written; run the load again"
                )
        if any(codes):
            raise LoadAbandoned(
                f"list {name!r}: writing the jobs of load range {seq} failed ({_describe(codes)}); "
                "run the load again once the cluster is healthy (the range stays pending: "
                f"a later load or `aeroqueue sweep` finishes it after its lease of {lease_ms / 1000:g} s)"
            )
        # 4. the index: the commit point of each job.
        real = self._commit_index(name, list(zip(tokens, [s.jid for s in new], strict=True)))
        self._finish_range(name, head, seq, real)
        return len(real), len(batch) - len(new), len(new) - len(real)

    def _batch_write(self, writes: list[Write], what: str) -> list[int]:
        """Each write's result code. Writes whose answer was lost or that the cluster could
        not serve just now (a node died, migrations: `IN_DOUBT_CODES`) are repeated for
        `write_retry_s`; every write here is create-only or idempotent, and a create-only
        repeat of a write that did land answers RecordExists, which the callers check."""
        b = self.backend
        codes = [-1] * len(writes)
        todo = list(range(len(writes)))
        give_up = time.monotonic() + self.write_retry_s
        while True:
            b.round_trips += 1
            try:
                out = b.client.batch_write(BatchRecords([writes[i] for i in todo]))
                for i, br in zip(todo, out.batch_records, strict=True):
                    codes[i] = br.result
            except aerospike.exception.AerospikeError as e:
                err = wrap(e, f"batch_write ({what})", f"[{len(todo)} records]")
                if not isinstance(err, IN_DOUBT) or time.monotonic() >= give_up:
                    raise err from e
                for i in todo:
                    codes[i] = err.code if isinstance(err.code, int) else -1
            todo = [i for i in todo if codes[i] in IN_DOUBT_CODES]
            if not todo or time.monotonic() >= give_up:
                return codes
            time.sleep(0.1)

    def _commit_index(self, name: str, pairs: list[tuple[int, str]]) -> list[int]:
        """Index each (token, jid) create-only; the tokens whose index is theirs are real,
        the others are made void. Returns the real tokens, in order."""
        b = self.backend
        writes = [
            Write(b.key(keys.JIDX_SET, keys.jidx_name(name, jid)), [op.write("tok", t)], policy={"exists": 1, "key": 1})
            for t, jid in pairs
        ]
        codes = self._batch_write(writes, "index job ids")
        if any(code not in (0, RECORD_EXISTS) for code in codes):
            # Not a clash but a failure: leave the range pending, so that a re-run or a
            # recovery decides these tokens from the index alone, never by guess.
            raise LoadAbandoned(f"list {name!r}: indexing job ids failed (codes {sorted(set(codes))}); run the load again")
        clashes = [(t, jid) for (t, jid), code in zip(pairs, codes, strict=True) if code == RECORD_EXISTS]
        owners: dict[str, int] = {}
        if clashes:
            recs = b.batch_get(keys.JIDX_SET, [keys.jidx_name(name, jid) for _, jid in clashes])
            owners = {jid: r.bins["tok"] for (_, jid), r in zip(clashes, recs, strict=True) if r is not None}
            if len(owners) != len(clashes):
                raise LoadAbandoned(f"list {name!r}: a job id index vanished while loading; run the load again")
        voids = [t for t, jid in clashes if owners[jid] != t]
        if voids:
            # Unpublished tokens: nobody can hold them, so overwriting is safe.
            void_writes = [
                Write(b.key(keys.JOB_SET, keys.job_name(name, t)), [op.write("state", "void")], policy={"key": 1})
                for t in voids
            ]
            if any(code != 0 for code in self._batch_write(void_writes, "void duplicate jobs")):
                raise LoadAbandoned(f"list {name!r}: voiding duplicate jobs failed; run the load again")
        void_set = set(voids)
        return [t for t, _ in pairs if t not in void_set]

    def _finish_range(self, name: str, head: dict[str, Any], seq: int, real: list[int]) -> None:
        if head["mode"] == "ids":
            with contextlib.suppress(RecordExists):  # a recovery wrote the same chunk
                self.backend.put(keys.IDS_SET, keys.chunk_name(name, seq), {"ids": real}, create_only=True)
        out = self._list_udf(name, "publish", seq, len(real))
        if out["st"] != "ok":
            raise LoadAbandoned(f"list {name!r}: range {seq} is unknown to the list record")

    def recover(self, name: str) -> int:
        """Finish load ranges whose loader missed its lease (it died). Returns how many."""
        b = self.backend
        head = self.header(name)
        ranges = self._list_udf(name, "expired")
        for r in ranges:
            tokens = list(range(r["start"], r["start"] + r["n"]))
            recs = b.batch_get(keys.JOB_SET, [keys.job_name(name, t) for t in tokens])
            missing = [t for t, rec in zip(tokens, recs, strict=True) if rec is None]
            if missing:
                writes = [
                    Write(b.key(keys.JOB_SET, keys.job_name(name, t)), [op.write("state", "void")], policy={"exists": 1, "key": 1})
                    for t in missing
                ]
                if any(code != 0 for code in self._batch_write(writes, "void unwritten tokens")):
                    # The loader is alive after all and wrote some: start over next time.
                    continue
            present = [
                (t, rec.bins["jid"]) for t, rec in zip(tokens, recs, strict=True)
                if rec is not None and rec.bins.get("state") != "void"
            ]
            real = self._commit_index(name, present)
            self._finish_range(name, head, r["seq"], real)
        return len(ranges)

    # -- status ------------------------------------------------------------------

    def status(self, name: str) -> ListStatus:
        transitions.flush_bits(self.backend)  # this process's acks count at once
        head = self.header(name)
        done, dead = self._bit_counts(name, head["alloc"])
        retry = len(head.get("retry") or [])
        if head["mode"] == "ids":
            reservable = len(self.unpopped_ids(name, head))
        else:
            reservable = head["tail"] - head["head"]
        total = head["total"]
        pending = len(head.get("pend") or {})
        sealed = head["sealed"] == 1
        complete = sealed and pending == 0 and done + dead == total
        completed_at = head.get("done_at")
        if complete and completed_at is None:
            completed_at = self._list_udf(name, "mark_complete")
        return ListStatus(
            name=name,
            mode=head["mode"],
            total=total,
            reservable=reservable,
            # Reserved and not yet acknowledged: whatever is neither waiting nor finished.
            in_flight=max(0, total - reservable - retry - done - dead),
            retry_pending=retry,
            done=done,
            dead=dead,
            sealed=sealed,
            complete=complete,
            paused=head["paused"] == 1,
            pending_ranges=pending,
            max_attempts=head["max_att"],
            created=head["created"],
            completed_at=completed_at,
        )

    def unpopped_ids(self, name: str, head: dict[str, Any]) -> list[int]:
        """ID mode: the tokens still waiting in the published chunks from the cursor on."""
        chunks = self.backend.batch_get(
            keys.IDS_SET, [keys.chunk_name(name, c) for c in range(head["cursor"], head["pubs"])], bins=["ids"]
        )
        return [t for c in chunks if c is not None for t in (c.bins.get("ids") or [])]

    def _bit_counts(self, name: str, alloc: int) -> tuple[int, int]:
        n_chunks = -(-alloc // keys.BITS_PER_CHUNK)
        recs = self.backend.batch_get(keys.DONE_SET, [keys.chunk_name(name, c) for c in range(n_chunks)])
        done = dead = 0
        for rec in recs:
            if rec is None:
                continue
            done += int.from_bytes(bytes(rec.bins.get("done") or b""), "big").bit_count()
            dead += int.from_bytes(bytes(rec.bins.get("dead") or b""), "big").bit_count()
        return done, dead

    # -- walking a list ----------------------------------------------------------

    def jobs(self, name: str, state: str | None = None) -> Iterator[dict[str, Any]]:
        """Every job record of a list, in token order (batch reads, O(list size))."""
        head = self.header(name)
        for lo in range(0, head["alloc"], PAGE):
            names = [keys.job_name(name, t) for t in range(lo, min(lo + PAGE, head["alloc"]))]
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

    def kick(self, name: str, tokens: Iterable[int] | None = None) -> int:
        """Put dead jobs back in the queue with fresh attempts: all of the list's, or
        only these tokens (a token that is not dead is left alone). Returns how many."""
        if tokens is None:
            tokens = [job["token"] for job in self.jobs(name, "dead")]
        else:
            self.header(name)  # a clear error for a missing list
        return transitions.kick(self.backend, name, list(tokens))


def _describe(codes: list[int]) -> str:
    """'3 records: Aerospike code 9 (timeout)' for the codes that are not 0."""
    counts = collections.Counter(code for code in codes if code != 0)
    return ", ".join(
        f"{n} record{'s' if n > 1 else ''}: Aerospike code {code}{f' ({_CODE_NAMES[code]})' if code in _CODE_NAMES else ''}"
        for code, n in sorted(counts.items())
    )


_CODE_NAMES = {
    -15: "no response from the node", -10: "node unreachable", -8: "no node for the partition",
    7: "cluster changing", 9: "timeout", 11: "partition unavailable", 13: "record too big",
    14: "key busy", 18: "device overload", 22: "forbidden",
}


def _specs(jobs: Iterable[Any], limit: int) -> Iterable[JobSpec]:
    """JobSpecs pass through lazily; any other item means the Python API: check all first."""
    it = iter(jobs)
    first = next(it, None)
    if first is None:
        return []
    if isinstance(first, JobSpec):
        return itertools.chain([first], it)
    return from_iterable(itertools.chain([first], it), max_payload=limit)


def _job_bins(name: str, token: int, spec: JobSpec, max_att: int) -> dict[str, Any]:
    return {
        "list": name,
        "token": token,
        "jid": spec.jid,
        "payload": spec.payload,
        "state": "queued",
        "att": 0,
        "max_att": max_att,
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
