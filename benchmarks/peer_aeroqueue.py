"""aeroqueue itself, the baseline every peer is compared with.

Without a URL each run gets a fresh scratch embedded store (one SQLite file
in a temporary directory), so one run's leftovers never slow the next and the
user's own store is never touched. With a URL (a real server, or an embedded
file the user chose) each run loads its own list and removes it afterwards.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import aerospike
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import operations as op

import aeroqueue
from aeroqueue import blocks as blocks_module
from aeroqueue import hotpath, keys, udfs
from aeroqueue.acks import DEFAULT_LINGER_S, AckBatcher
from aeroqueue.backends import Backend, base, open_backend
from aeroqueue.config import parse_url
from aeroqueue.errors import AeroqueueError, ClaimLost
from aeroqueue.lists import JobLists
from aeroqueue.loading import Checked, JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import Session
from aeroqueue.worker import LEASE_MIN, PREFETCH_HOLD_S, PREFETCH_MAX, handler_pace, prefetch_for

from .harness import Peer, PeerInfo, PeerUnavailable, PipelinedWorker, Prepared, Worker

LOAD_CHUNK = 1000  # jobs per load range: the CLI's default


class AeroqueueWorker(Worker):
    """The API handler's path: reserve (take + claim), then ack (complete)."""

    lease = False

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.backend = open_backend(config["url"])
        self.queue = Queue(self.backend)
        self.session = Session.open(self.backend)
        self.list = config["list"]

    def round_trips(self) -> int:
        # Counted at the backend boundary: every call that reaches the store,
        # RecordBusy retries included, so it is the figure a server would see.
        # The busy retries themselves (a hot list's key queue full) are reported
        # as the run's retries: aeroqueue absorbs them, callers never see one.
        self.retries = base.busy_retries
        return self.backend.round_trips

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        return [(int(job.jid), job) for job in self.queue.reserve(self.list, self.session, n, lease=self.lease)]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        if len(jobs) == 1:
            number, job = jobs[0]
            try:
                self.queue.complete(job, "ok")
            except ClaimLost:
                self.lost += 1
                return []
            return [number]
        lost: list[Job] = self.queue.complete_many([job for _, job in jobs], ["ok"] * len(jobs))
        return self._accepted(jobs, lost)

    def _accepted(self, jobs: list[tuple[int, Any]], lost: list[Job]) -> list[int]:
        self.lost += len(lost)
        refused = {job.token for job in lost}
        return [number for number, job in jobs if job.token not in refused]

    def close(self) -> None:
        try:
            self.queue.flush()
            self.session.close()
        finally:
            self.backend.close()


class AeroqueuePrefetchWorker(AeroqueueWorker, PipelinedWorker):
    """The worker's path (`aeroqueue worker`), built from the worker's own parts: it
    reserves as many jobs at a time as the handlers' pace calls for
    (`worker.prefetch_for`), hands them out one by one, and its acks go out in
    batches (`acks.AckBatcher`, the worker's default linger). A job counts as acked
    once the server accepted its ack."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.waiting: list[Job] = []
        self.confirmed: list[int] = []  # appended by the batcher's thread, taken by this one
        self._confirmed_lock = threading.Lock()
        self.handed_at = 0.0
        self.handler_s: float | None = None
        self.acks = AckBatcher(self.queue, self._outcome)

    def _outcome(self, job: Job, outcome: str, number: int) -> None:
        if outcome == "done":
            with self._confirmed_lock:
                self.confirmed.append(number)
        else:
            self.lost += 1

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        if len(self.waiting) < n:
            want = max(n, prefetch_for(self.handler_s)) - len(self.waiting)
            # Leased from LEASE_MIN jobs up, as the worker does.
            self.waiting += self.queue.reserve(self.list, self.session, want, lease=want >= LEASE_MIN)
        got, self.waiting = self.waiting[:n], self.waiting[n:]
        self.handed_at = time.perf_counter()
        return [(int(job.jid), job) for job in got]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        # The time since the hand-out is what the handler took: the worker's pace.
        self.handler_s = handler_pace(self.handler_s, time.perf_counter() - self.handed_at)
        for number, job in jobs:
            self.acks.add(job, "ok", number)
        return self._take_confirmed()

    def ack_and_reserve(self, jobs: list[tuple[int, Any]], n: int) -> tuple[list[int], list[tuple[int, Any]]]:
        done = self.ack(jobs)
        got = self.reserve(n)
        if not got:  # the list is drained: every ack must be confirmed before the run ends
            done += self.flush()
        return done, got

    def unconfirmed(self) -> int:
        return self.acks.waiting()

    def flush(self) -> list[int]:
        self.acks.flush()
        return self._take_confirmed()

    def _take_confirmed(self) -> list[int]:
        # Under the lock: an append that had looked up the old list before the swap
        # would otherwise land in a list already handed to the harness, and be lost.
        with self._confirmed_lock:
            done, self.confirmed = self.confirmed, []
        return done

    def close(self) -> None:
        self.acks.close()
        super().close()


class AeroqueueLeaseWorker(AeroqueueWorker):
    """The API handler's path with `reserve(..., lease=True)`: batches leased, not claimed."""

    lease = True


class AeroqueueLeaseRecordsWorker(AeroqueueLeaseWorker):
    """`AeroqueueLeaseWorker` that reads every leased job from its record, as before
    block records (aeroqueue/blocks.py): the same code but for the pop, which finds
    nothing, so that one run measures what the blocks save."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        blocks_module.pop = lambda *_args, **_kw: {}  # this client process only


class BareWorker(Worker):
    """No aeroqueue: the same Lua modules called from a plain loop, as a script would,
    with no session, no request id and no completion bits. The floor the API path's
    reserve is compared with: take + claim for a reserve, complete for an ack."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.backend = open_backend(config["url"])
        self.client = self.backend.client.raw  # the bare client: none of aeroqueue's code on the path
        self.ns, self.list = self.backend.namespace, config["list"]

    def _take(self, n: int) -> list[int]:
        """Up to n tokens: the list's retry store, then its token store."""
        out = self.client.apply((self.ns, keys.LIST_SET, self.list), keys.LIST_MOD, "take", [n])
        self.calls += 1
        return [*out["retry"], *range(out["start"], out["start"] + out["n"])]

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        tokens = self._take(n)
        if not tokens:
            return []
        self.calls += 1
        if len(tokens) == 1:
            answers = [self.client.apply(self._key(tokens[0]), keys.JOB_MOD, "claim", ["bare", None])]
        else:
            out = self.client.batch_apply([self._key(t) for t in tokens], keys.JOB_MOD, "claim", ["bare", None])
            answers = [br.record[2]["SUCCESS"] for br in out.batch_records if br.record]
        return [(int(a["jid"]), a["token"]) for a in answers if a and a.get("st") == "ok"]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        self.calls += 1
        if len(jobs) == 1:
            number, token = jobs[0]
            return [number] if self.client.apply(self._key(token), keys.JOB_MOD, "complete", ["bare", {}]) == "ok" else []
        out = self.client.batch_apply([self._key(t) for _, t in jobs], keys.JOB_MOD, "complete", ["bare", {}])
        return [number for (number, _), br in zip(jobs, out.batch_records, strict=True)
                if br.record and br.record[2].get("SUCCESS") == "ok"]

    def _key(self, token: int) -> tuple[str, str, str]:
        return (self.ns, keys.JOB_SET, keys.job_name(self.list, token))

    def close(self) -> None:
        self.backend.close()


class LeaseFloorWorker(BareWorker):
    """Not a queue: the floor of a lease design (issue 14, item 3b), the calls it would
    make with nothing around them. A reserve takes tokens and reads their job records
    (the lease itself, one more write per batch on the session record, is left out); an
    ack is one filtered write per job, admitted while the job is still queued with the
    attempt count it was read with and before the lease's end by the server's clock,
    as a lease's ack would be. No session, no request id, no completion bits, no
    recovery: the figure says what such a design could reach on this machine at best."""

    LEASE_MS = 300_000
    _READS = ("jid", "token", "payload", "att", "state")
    _DONE: ClassVar[list[dict]] = [
        op.write("state", "done"), op.increment("att", 1), op.write("by", "lease-floor"), op.write("result", "ok"),
        eo.expression_write("done_at", hotpath.SERVER_NOW_COMPILED),
    ]

    def _lease(self, n: int) -> tuple[list[int], int]:
        """Up to n tokens taken, and the lease's end by the client's clock."""
        tokens = self._take(n)
        if tokens:
            self.calls += 1  # the read that follows
        return tokens, int(time.time() * 1000) + self.LEASE_MS

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        tokens, until = self._lease(n)
        if not tokens:
            return []
        got = self.client.batch_read([self._key(t) for t in tokens], list(self._READS))
        bins = [br.record[2] for br in got.batch_records if br.result == 0 and br.record]
        return [(int(b["jid"]), (b["token"], b["att"], until)) for b in bins if b.get("state") == "queued"]

    def ack(self, jobs: list[tuple[int, Any]]) -> list[int]:
        self.calls += 1
        acked = []
        # One write per group of jobs leased with the same attempt count and lease end.
        groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for number, (token, att, until) in jobs:
            groups.setdefault((att, until), []).append((number, token))
        for (att, until), group in groups.items():
            still = exp.And(
                exp.Eq(exp.StrBin("state"), "queued"), exp.Eq(exp.IntBin("att"), att),
                exp.LE(hotpath.SERVER_NOW, until),
            ).compile()
            out = self.client.batch_operate(
                [self._key(t) for _, t in group], self._DONE, {"expressions": still},
                {"exists": aerospike.POLICY_EXISTS_UPDATE},
            )
            acked += [number for (number, _), br in zip(group, out.batch_records, strict=True) if br.result == 0]
        return acked


class BlockFloorWorker(LeaseFloorWorker):
    """Not a queue: the lease floor with each 100 tokens' job ids and payloads also kept
    in one record (issue 14, item 3b: "a batch's jobs in one record"). A reserve takes
    tokens and reads the one or two block records that cover them instead of a record a
    job; the ack is the lease floor's, filtered on the job record still queued with the
    attempt count a fresh token has (0). Measures what that data model could reach."""

    BLOCK = 100

    def reserve(self, n: int) -> list[tuple[int, Any]]:
        tokens, until = self._lease(n)
        if not tokens:
            return []
        blocks = sorted({t // self.BLOCK for t in tokens})
        got = self.client.batch_read([self._block_key(b) for b in blocks], ["p"])
        held = {b: br.record[2]["p"] for b, br in zip(blocks, got.batch_records, strict=True) if br.result == 0}
        out = []
        for t in tokens:
            jid, _payload = held[t // self.BLOCK][t % self.BLOCK]
            out.append((int(jid), (t, 0, until)))
        return out

    def _block_key(self, block: int) -> tuple[str, str, str]:
        return (self.ns, BLOCK_SET, f"{self.list}/{block}")


BLOCK_SET = "aq_bench_blk"


def write_blocks(backend: Backend, list_name: str, n_jobs: int) -> None:
    """The block floor's records: [jid, payload] of each token at index token % 100."""
    client, ns, size = backend.client.raw, backend.namespace, BlockFloorWorker.BLOCK
    for start in range(0, n_jobs + size, size * 10):
        tokens = list(range(start, start + size * 10))
        got = client.batch_read([(ns, keys.JOB_SET, keys.job_name(list_name, t)) for t in tokens], ["jid", "payload"])
        blocks: dict[int, list[Any]] = {}
        for t, br in zip(tokens, got.batch_records, strict=True):
            if br.result == 0 and br.record:
                blocks.setdefault(t // size, [None] * size)[t % size] = [br.record[2]["jid"], br.record[2]["payload"]]
        for b, items in blocks.items():
            client.put((ns, BLOCK_SET, f"{list_name}/{b}"), {"p": items})


def drop_blocks(backend: Backend, list_name: str, n_jobs: int) -> None:
    """Remove what `write_blocks` wrote (a block never written is no error)."""
    client, ns, size = backend.client.raw, backend.namespace, BlockFloorWorker.BLOCK
    keys_ = [(ns, BLOCK_SET, f"{list_name}/{b}") for b in range(n_jobs // size + 2)]
    client.batch_remove(keys_)


PATHS = {
    # name: (worker class, batch form, recipe)
    "aeroqueue": (
        AeroqueuePrefetchWorker,
        "reserve(list, session, 100, lease=True): one take UDF + one pop of the block records + one lease UDF; "
        "acks: one batch",
        f"worker path: reserve as many jobs at a time as the handlers' pace calls for (about "
        f"{PREFETCH_HOLD_S * 1000:g} ms of work, at most {PREFETCH_MAX}: take on the list record, then from "
        f"{LEASE_MIN} jobs up one pop of their block records and the lease on the session record, below that one batch "
        "of claims), hand them out one at a time; acks go out in batches within "
        f"{DEFAULT_LINGER_S * 1000:g} ms (native operations, refused unless the job is still as leased or the "
        "session still holds the claim); completion bits written in bulk",
    ),
    "aeroqueue-api": (
        AeroqueueWorker,
        "reserve(list, session, 100): one take UDF + one batch claim UDF; complete_many: one batch",
        "API handler path: reserve = take (list record) + claim (job record); ack = complete UDF; "
        "completion bits written in bulk",
    ),
    "aeroqueue-api-lease": (
        AeroqueueLeaseWorker,
        "reserve(list, session, 100, lease=True): one take UDF + one pop of the block records + one lease UDF; "
        "complete_many: one batch",
        "API handler path, batches leased (reserve(..., lease=True)): take + pop of the jobs' block records (a record "
        "per 100 jobs) + the lease on the session record; acks filtered on the job still as leased; single jobs as "
        "aeroqueue-api",
    ),
    "api-lease-records": (
        AeroqueueLeaseRecordsWorker,
        "aeroqueue-api-lease with every job read from its record: one take UDF + one batch read + one lease UDF",
        "aeroqueue-api-lease with the block records left unread (every leased job read from its job record, as "
        "before blocks): what the blocks save, in the same run",
    ),
    "lease-floor": (
        LeaseFloorWorker,
        "take(100) + batch read; acks: one filtered batch write",
        "not a queue: a lease design's floor (take + batch read of the jobs; ack = a write filtered on still "
        "queued, the attempt count read, and the lease's end), no lease record, sessions, request ids, "
        "completion bits or recovery",
    ),
    "block-floor": (
        BlockFloorWorker,
        "take(100) + read of the 1-2 block records; acks: one filtered batch write",
        "not a queue: the lease floor with each 100 jobs' ids and payloads in one block record, read at the reserve "
        "instead of the job records (the job records stay, written at the ack)",
    ),
    "bare-udf": (
        BareWorker,
        "take(100) + batch claim + batch complete, no session",
        "not a queue: the same Lua modules from a plain loop (take + claim + complete UDF calls), no "
        "sessions, request ids or completion bits: the floor for the API path's reserve",
    ),
}


class AeroqueuePeer(Peer):
    name = "aeroqueue"
    batch_form = PATHS["aeroqueue"][1]
    trips_source = "backend.round_trips"

    def __init__(self, url: str | None, path: str = "aeroqueue") -> None:
        self.name = path
        self.worker_cls, self.batch_form, self.recipe = PATHS[path]
        self.url = url
        self._scratch: Path | None = None
        self._backends: dict[str, Backend] = {}
        self._label: str | None = None

    @property
    def embedded(self) -> bool:
        return self.url is None or parse_url(self.url).is_embedded

    def label(self) -> str:
        """The backend, for the table title: never a password. Stable after `stop`."""
        if self._label is not None:
            return self._label
        if self.url is None:
            where = self._scratch or Path(tempfile.gettempdir())
            return f"embedded (scratch SQLite store per run in {where})"
        parsed = parse_url(self.url)
        return f"{'embedded store' if parsed.is_embedded else 'Aerospike server'} {parsed}"

    def start(self) -> PeerInfo:
        if self.url is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="aeroqueue-peers-"))
        else:
            # Fail here, with the backend's own message, rather than in every client.
            try:
                backend = open_backend(self.url)
                try:
                    udfs.register(backend) if backend.is_embedded else udfs.verify(backend)
                    version = _server_version(backend)
                    durability = _server_durability(backend)
                finally:
                    backend.close()
            except AeroqueueError as e:
                raise PeerUnavailable(str(e)) from e
        if self.embedded:
            version = f"aeroqueue {aeroqueue.__version__}, embedded store"
            durability = (
                "SQLite WAL, synchronous=NORMAL: every write survives a process crash; "
                "an OS crash or power loss can drop the last commits"
            )
        self._label = self.label()
        return PeerInfo(
            name=self.name,
            version=version,
            target=self._label,
            recipe=self.recipe,
            durability=durability,
        )

    def prepare(self, n_jobs: int) -> Prepared:
        name = f"bench-{uuid.uuid4().hex[:10]}"
        if self.url is None:
            assert self._scratch is not None, "start() first"
            url = f"embedded://{self._scratch / (name + '.db')}"
        else:
            url = self.url
        backend = open_backend(url)
        self._backends[name] = backend
        if self.url is None:
            udfs.register(backend)
        JobLists(backend).load(
            name, Checked(JobSpec(str(i), {"i": i}) for i in range(n_jobs)), seal=True, chunk_size=LOAD_CHUNK
        )
        if self.name == "block-floor":
            write_blocks(backend, name, n_jobs)
        return Prepared(self.worker_cls, {"url": url, "list": name}, n_jobs)

    def verify(self, prepared: Prepared, acked: int) -> str | None:
        lists = JobLists(self._backends[prepared.config["list"]])
        if self.name in ("bare-udf", "lease-floor", "block-floor"):  # no completion bits: count the job records
            done = sum(1 for _ in lists.jobs(prepared.config["list"], "done"))
            return None if done == acked else f"{done} jobs done, {acked} acked"
        status = lists.status(prepared.config["list"])
        problems = []
        if status.done != acked:
            problems.append(f"{status.done} jobs done, {acked} acked")
        if status.dead:
            problems.append(f"{status.dead} dead")
        if acked == prepared.jobs and status.in_flight:
            problems.append(f"{status.in_flight} still in flight")
        return "; ".join(problems) or None

    def discard(self, prepared: Prepared) -> None:
        name = prepared.config["list"]
        backend = self._backends.pop(name)
        try:
            if self.url is not None:
                # Every client has flushed its acks and closed: no bit can land late.
                JobLists(backend).drop(name, grace_s=0)
                if self.name == "block-floor":
                    drop_blocks(backend, name, prepared.jobs)
        finally:
            backend.close()
        if self.url is None:
            assert self._scratch is not None
            for suffix in (".db", ".db-wal", ".db-shm"):
                (self._scratch / (name + suffix)).unlink(missing_ok=True)

    def stop(self) -> None:
        for backend in self._backends.values():
            backend.close()
        self._backends.clear()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _info(backend: Backend, command: str) -> str:
    """One node's answer to an info command ('' when it cannot be had)."""
    try:
        answers = backend.client.info_all(command)
    except Exception:
        return ""
    for answer in (answers or {}).values():
        if answer and not answer[0] and answer[1]:
            text = str(answer[1])
            return text.split("\t", 1)[-1].strip()
    return ""


def _server_version(backend: Backend) -> str:
    build = _info(backend, "build")
    edition = _info(backend, "edition")
    return f"Aerospike {edition or ''} {build or '(version unknown)'}".replace("  ", " ")


def _server_durability(backend: Backend) -> str:
    """The namespace's storage engine and commit-to-device, as the server reports them."""
    settings = dict(
        item.split("=", 1) for item in _info(backend, f"namespace/{backend.namespace}").split(";") if "=" in item
    )
    engine = settings.get("storage-engine")
    if not engine:
        return "see the namespace's storage-engine configuration (not readable through info)"
    commit = settings.get("storage-engine.commit-to-device", settings.get("commit-to-device", "false"))
    replication = settings.get("replication-factor", "?")
    return f"namespace {backend.namespace}: storage-engine {engine}, commit-to-device {commit}, replication-factor {replication}"
