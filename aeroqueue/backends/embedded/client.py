"""`EmbeddedClient`: the subset of `aerospike.Client` that aeroqueue calls.

It answers as a real Aerospike 8.1 server and the `aerospike` Python client
19.x do (../shared/observed/observed.json is the reference; the conformance
test replays it): same return shapes, same `aerospike.exception` classes and
codes, generations, TTLs honoured on read, last-update times, digests and
partition ids from `aerospike.calc_digest`, and UDFs run through lupa.

Anything outside that subset raises `NotImplementedError` naming the call or
option, so nothing silently behaves differently from a server.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import aerospike
from aerospike_helpers.batch.records import Apply, BatchRecord, BatchRecords, Write

from .expressions import matches, prepare, refused
from .faults import Faults
from .lua_runtime import LuaRuntime
from .operations import I64 as _I64
from .operations import READ_OPS, client_value, run_operations, server_error, utf8_text
from .storage import Row, Storage, decode, encode, too_big
from .types import MAX_BIN_NAME, NEVER_EXPIRE, RecordView, UdfFailure, key_ordered

N_PARTITIONS = 4096
DEFAULT_MAX_RECORD_SIZE = 1024 * 1024  # Aerospike's max-record-size default (1 MiB)
_MAX_GEN = 0xFFFF  # generations are 16-bit on the server and wrap past this
_TTL_NEVER = {-1, aerospike.TTL_NEVER_EXPIRE}
_TTL_KEEP = {-2, aerospike.TTL_DONT_UPDATE}
_TTL_DEFAULT = {0, -3, aerospike.TTL_CLIENT_DEFAULT, None}
_MAX_TTL_S = 10 * 365 * 86_400  # the server's max-ttl: ten years
# Policy keys that only tune the network round trip: meaningless here, accepted.
_TRANSPORT_POLICY = {
    "total_timeout", "socket_timeout", "max_retries", "sleep_between_retries", "timeout_delay",
    "compress", "replica", "read_mode_ap", "read_mode_sc", "read_touch_ttl_percent",
    "deserialize", "durable_delete", "commit_level", "concurrent", "allow_inline", "allow_inline_ssd",
    "respond_all_keys", "send_set_name", "max_concurrent_threads", "records_per_second",
    "expected_duration", "short_query", "fail_on_cluster_change", "include_bin_data", "txn",
}


class Clock:
    """The embedded server's clock, in unix milliseconds. Tests replace or advance it
    (`ManualClock`) so that expiry is driven without sleeping."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock(Clock):
    """A clock that moves only when told: `advance(ms)`."""

    def __init__(self, start_ms: int | None = None) -> None:
        self._now = start_ms if start_ms is not None else time.time_ns() // 1_000_000
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            return self._now

    def advance(self, ms: int) -> None:
        with self._lock:
            self._now += ms


def partition_id(digest: bytes) -> int:
    """Aerospike's partition of a digest: little-endian uint16 of its first two bytes, mod 4096."""
    return int.from_bytes(digest[:2], "little") & (N_PARTITIONS - 1)


def _not_found() -> Exception:
    return server_error("RecordNotFound", 2, "AEROSPIKE_ERR_RECORD_NOT_FOUND")


# Rows per SQLite read of a scan: what a scan holds at once.
_SCAN_PAGE = 500


class EmbeddedClient:
    """An Aerospike stand-in on one SQLite file (or ``:memory:``)."""

    def __init__(
        self,
        path: str,
        namespace: str = "test",
        *,
        clock: Clock | None = None,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        default_ttl: int = 0,
        faults: Faults | None = None,
        policies: dict[str, Any] | None = None,
        create: bool = True,
    ) -> None:
        self.namespace = namespace
        # The client config's default policies, as `aerospike.client({"policies": ...})`
        # takes them: the key policy decides what is stored and what `get` returns.
        self.policies = dict(policies or {})
        self.clock = clock or Clock()
        self.max_record_size = max_record_size
        self.default_ttl = default_ttl
        self.faults = faults if faults is not None else Faults.from_env()
        self._storage = Storage(path, create=create, now_ms=lambda: self.clock.now_ms())
        self._lua = LuaRuntime()
        self._connected = True

    @property
    def on_long_hold(self) -> Callable[[int], object] | None:
        """Called, inside the transaction, with the ms a write held the store's lock
        when that is long enough to have delayed others' heartbeats (storage.LONG_HOLD_MS)."""
        return self._storage.on_long_hold

    @on_long_hold.setter
    def on_long_hold(self, hook: Callable[[int], object] | None) -> None:
        self._storage.on_long_hold = hook

    # -- connection ----------------------------------------------------------

    def connect(self, *_: Any) -> EmbeddedClient:
        self._connected = True
        return self

    def is_connected(self) -> bool:
        return self._connected

    def close(self) -> None:
        self._connected = False
        self._storage.close()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the class does not define.
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotImplementedError(
            f"embedded backend: aerospike.Client.{name}() is not implemented "
            "(aeroqueue only uses a subset of the client; see aerospike-facts.md)"
        )

    # -- keys, metadata, policies -------------------------------------------

    def _key(self, key: tuple) -> tuple[str, str, Any, bytes]:
        if not isinstance(key, tuple) or len(key) < 3:
            raise server_error("ParamError", -2, f"key is invalid: {key!r}")
        ns, set_name, user_key = key[0], key[1] or "", key[2]
        if isinstance(user_key, str) and "\x00" in user_key:
            user_key = user_key.partition("\x00")[0]  # as the client sends it (and digests it)
        if ns != self.namespace:
            raise server_error("NamespaceNotFound", 20, "AEROSPIKE_ERR_NAMESPACE_NOT_FOUND")
        digest = key[3] if len(key) > 3 and key[3] else None
        if digest is None:
            if user_key is None:
                raise server_error("ParamError", -2, "key is invalid: no user key and no digest")
            digest = aerospike.calc_digest(ns, set_name, user_key)
        return ns, set_name, user_key, bytes(digest)

    def _now(self) -> int:
        return self.clock.now_ms()

    def _send_key(self, policy: dict, kind: str) -> bool:
        """Whether a call sends the user key: its own policy, else the config's policy
        for that kind of call, else the config's global key policy (the client's order)."""
        for source in (policy, self.policies.get(kind) or {}, self.policies):
            if "key" in source:
                return bool(source["key"] == aerospike.POLICY_KEY_SEND)
        return False

    @staticmethod
    def _check_policy(policy: dict | None, allowed: set[str], call: str) -> dict:
        policy = policy or {}
        unknown = set(policy) - allowed - _TRANSPORT_POLICY
        if unknown:
            raise NotImplementedError(
                f"embedded backend: {call}() policy option(s) {sorted(unknown)} are not implemented"
            )
        return policy

    def _meta(self, row: Row | None, now: int) -> dict[str, int]:
        if row is None:
            return {"gen": 0, "ttl": NEVER_EXPIRE}
        if not row.void_ms:
            return {"gen": row.gen, "ttl": NEVER_EXPIRE}
        return {"gen": row.gen, "ttl": max(1, -(-(row.void_ms - now) // 1000))}

    def _live(self, db: Any, ns: str, digest: bytes, now: int) -> Row | None:
        """The record, or None if it is missing or expired (expiry is honoured on read)."""
        row = Storage.load(db, ns, digest)
        if row is not None and row.void_ms and row.void_ms <= now:
            return None
        return row

    def _view(self, row: Row | None, set_name: str, user_key: Any, digest: bytes, now: int) -> RecordView:
        if row is None:
            return RecordView(False, {}, 0, 0, 0, digest, set_name, None, now)
        return RecordView(True, row.bins, row.gen, row.void_ms, row.lut_ms, digest, row.set_name, row.user_key, now)

    def _void_time(self, ttl: Any, old: Row | None, now: int) -> int:
        if ttl in _TTL_KEEP:
            return old.void_ms if old is not None else self._void_time(None, None, now)
        if ttl in _TTL_NEVER:
            return 0
        if ttl in _TTL_DEFAULT:
            return now + self.default_ttl * 1000 if self.default_ttl else 0
        if not isinstance(ttl, int):
            raise server_error("ParamError", -2, f"invalid ttl {ttl!r}")
        # The client sends 32 bits: 2**32 is 0 (the namespace's default), another
        # negative a huge ttl; the server refuses more than ten years (seen on 8.1).
        ttl &= 0xFFFFFFFF
        if ttl == 0:
            return self._void_time(None, None, now)
        if ttl in (0xFFFFFFFF, 0xFFFFFFFE):
            return self._void_time(ttl - 0x100000000, old, now)
        if ttl > _MAX_TTL_S:
            raise server_error("InvalidRequest", 4, "AEROSPIKE_ERR_REQUEST_INVALID")
        return now + ttl * 1000

    @staticmethod
    def _gen_check(meta: dict | None, policy: dict, row: Row | None) -> None:
        mode = policy.get("gen", aerospike.POLICY_GEN_IGNORE)
        if mode == aerospike.POLICY_GEN_IGNORE or not meta or "gen" not in meta:
            return
        current = row.gen if row is not None else 0
        ok = current == meta["gen"] if mode == aerospike.POLICY_GEN_EQ else current < meta["gen"]
        if not ok:
            raise server_error("RecordGenerationError", 3, "AEROSPIKE_ERR_RECORD_GENERATION")

    def _filter(self, policy: dict, view: RecordView) -> None:
        expr = policy.get("expressions")
        if expr is not None and view.exists and not matches(expr, view):
            raise server_error("FilteredOut", 27, "AEROSPIKE_FILTERED_OUT")

    def _commit(
        self,
        db: Any,
        ns: str,
        digest: bytes,
        set_name: str,
        user_key: Any,
        old: Row | None,
        bins: dict[str, Any],
        void_ms: int,
        now: int,
        send_key: bool,
    ) -> Row | None:
        """Write a record's new state as one more generation; a record left without bins is deleted."""
        if not bins:
            Storage.delete(db, ns, digest)
            return None
        stored_key = user_key if send_key else (old.user_key if old is not None else None)
        blob = encode(bins)
        if too_big(set_name, bins, stored_key, blob, self.max_record_size):
            raise server_error("RecordTooBig", 13, "AEROSPIKE_ERR_RECORD_TOO_BIG")
        gen = old.gen % _MAX_GEN + 1 if old is not None else 1
        row = Row(set_name, partition_id(digest), stored_key, bins, gen, void_ms, now)
        Storage.store(db, ns, digest, row, blob, old)
        return row

    # -- single-record calls -----------------------------------------------

    def put(self, key: tuple, bins: dict, meta: dict | None = None, policy: dict | None = None, serializer: Any = None) -> int:
        pol = self._check_policy(policy, {"key", "gen", "exists", "ttl", "expressions"}, "put")
        for name in bins:
            if len(name.encode()) > MAX_BIN_NAME:
                raise server_error("BinNameError", 21, "A bin name should not exceed 15 characters limit")
        ns, set_name, user_key, digest = self._key(key)
        self.faults.check("put", user_key, None, "before")
        with self._storage.write() as db:
            now = self._now()  # the store's now once the write holds the lock, as a server's
            old = self._live(db, ns, digest, now)
            exists_mode = pol.get("exists", aerospike.POLICY_EXISTS_IGNORE)
            if old is not None and exists_mode == aerospike.POLICY_EXISTS_CREATE:
                raise server_error("RecordExistsError", 5, "AEROSPIKE_ERR_RECORD_EXISTS")
            if old is None and exists_mode in (aerospike.POLICY_EXISTS_UPDATE, aerospike.POLICY_EXISTS_REPLACE):
                raise _not_found()
            self._gen_check(meta, pol, old)
            self._filter(pol, self._view(old, set_name, user_key, digest, now))
            if not bins:
                raise server_error("InvalidRequest", 4, "AEROSPIKE_ERR_REQUEST_INVALID")  # a write of nothing
            if old is None and all(v is None for v in bins.values()):
                raise _not_found()  # only deletes of bins it does not have
            replace = exists_mode in (aerospike.POLICY_EXISTS_REPLACE, aerospike.POLICY_EXISTS_CREATE_OR_REPLACE)
            new_bins = {} if (old is None or replace) else dict(old.bins)
            for name, value in bins.items():
                if value is None:
                    new_bins.pop(name, None)
                else:
                    new_bins[name] = _store_value(value)
            ttl = (meta or {}).get("ttl", pol.get("ttl"))
            self._commit(
                db, ns, digest, set_name, user_key, old, new_bins, self._void_time(ttl, old, now), now,
                self._send_key(pol, "write"),
            )
        self.faults.check("put", user_key, None, "after")
        return 0

    def _read(self, key: tuple, policy: dict | None, call: str) -> tuple[tuple, Row, int]:
        pol = self._check_policy(policy, {"expressions", "key"}, call)
        ns, set_name, user_key, digest = self._key(key)
        self.faults.check(call, user_key, None, "before")
        now = self._now()
        with self._storage.read() as db:
            row = self._live(db, ns, digest, now)
        if row is None:
            raise _not_found()
        self._filter(pol, self._view(row, set_name, user_key, digest, now))
        return (ns, set_name, user_key, bytearray(digest)), row, now

    def get(self, key: tuple, policy: dict | None = None) -> tuple:
        k, row, now = self._read(key, policy, "get")
        # The real client answers `get` with the user key it was given only when the
        # read sends the key (seen on 8.1 with client 19.3); select, exists and
        # operate always answer with it.
        shown = k[2] if self._send_key(policy or {}, "read") else None
        return (k[0], k[1], shown, k[3]), self._meta(row, now), _out_bins(row.bins)

    def select(self, key: tuple, bins: list[str], policy: dict | None = None) -> tuple:
        if not bins:
            raise server_error("InvalidRequest", 4, "AEROSPIKE_ERR_REQUEST_INVALID")  # a read of no bin (seen on 8.1)
        k, row, now = self._read(key, policy, "select")
        return k, self._meta(row, now), {b: _out(v) for b, v in row.bins.items() if b in bins}

    def exists(self, key: tuple, policy: dict | None = None) -> tuple:
        pol = self._check_policy(policy, {"expressions"}, "exists")
        ns, set_name, user_key, digest = self._key(key)
        now = self._now()
        with self._storage.read() as db:
            row = self._live(db, ns, digest, now)
        if row is not None:
            self._filter(pol, self._view(row, set_name, user_key, digest, now))
        return (ns, set_name, user_key, bytearray(digest)), (self._meta(row, now) if row else None)

    def remove(self, key: tuple, meta: dict | None = None, policy: dict | None = None) -> int:
        # Client 19 moved remove's expected generation from meta into the policy.
        pol = self._check_policy(policy, {"gen", "generation", "key", "expressions"}, "remove")
        if "generation" in pol:
            meta = {"gen": pol["generation"]}
        ns, set_name, user_key, digest = self._key(key)
        self.faults.check("remove", user_key, None, "before")
        with self._storage.write() as db:
            now = self._now()  # the store's now once the write holds the lock, as a server's
            old = self._live(db, ns, digest, now)
            if old is None:
                raise _not_found()
            self._gen_check(meta, pol, old)
            self._filter(pol, self._view(old, set_name, user_key, digest, now))
            Storage.delete(db, ns, digest)
        self.faults.check("remove", user_key, None, "after")
        return 0

    def operate(self, key: tuple, list_: list, meta: dict | None = None, policy: dict | None = None) -> tuple:
        _sendable(list_)
        k, m, results = self._operate(key, list_, meta, policy, "operate")
        out: dict[str, Any] = {}
        for name, value in results:
            out[name] = value
        return k, m, out

    def operate_ordered(self, key: tuple, list_: list, meta: dict | None = None, policy: dict | None = None) -> tuple:
        _sendable(list_)
        return self._operate(key, list_, meta, policy, "operate_ordered")

    def _operate(
        self, key: tuple, ops: list, meta: dict | None, policy: dict | None, call: str, respond_all: bool = False
    ) -> tuple:
        """`respond_all`: every op but touch answers, nil when it has no value (the C
        client asks for it in every batch write: a read before a write of the same bin
        answers None there, seen on 8.1 with client 19.3)."""
        pol = self._check_policy(policy, {"gen", "key", "exists", "ttl", "expressions"}, call)
        ns, set_name, user_key, digest = self._key(key)
        self.faults.check(call, user_key, None, "before", ops)
        # No savepoint: nothing is written before `_commit`, which fails before it writes.
        with self._storage.write(savepoint=False) as db:
            now = self._now()  # the store's now once the write holds the lock, as a server's
            old = self._live(db, ns, digest, now)
            if old is None and pol.get("exists") in (aerospike.POLICY_EXISTS_UPDATE, aerospike.POLICY_EXISTS_REPLACE):
                # Update-only: never creates the record, and the server answers so before
                # it runs any op (an expression write on a missing record is 2, not 26).
                raise _not_found()
            view = self._view(old, set_name, user_key, digest, now)
            self._gen_check(meta, pol, old)
            self._filter(pol, view)
            outcome = run_operations(view, ops, respond_all_ops=respond_all)
            if old is None and not outcome.wrote:
                raise _not_found()
            if old is not None and pol.get("exists") == aerospike.POLICY_EXISTS_CREATE and outcome.wrote:
                raise server_error("RecordExistsError", 5, "AEROSPIKE_ERR_RECORD_EXISTS")
            row = old
            if outcome.wrote or outcome.touched:
                ttl = (meta or {}).get("ttl", pol.get("ttl", outcome.ttl))
                row = self._commit(
                    db, ns, digest, set_name, user_key, old, outcome.bins,
                    self._void_time(ttl, old, now), now, self._send_key(pol, "operate"),
                )
        self.faults.check(call, user_key, None, "after", ops)
        results = [(name, _out(value)) for name, value in outcome.results]
        return (ns, set_name, user_key, bytearray(digest)), self._meta(row, now), results

    # -- UDFs ------------------------------------------------------------------

    def apply(self, key: tuple, module: str, function: str, args: list, policy: dict | None = None) -> Any:
        pol = self._check_policy(policy, {"key", "expressions", "ttl"}, "apply")
        client_value(args)
        ns, set_name, user_key, digest = self._key(key)
        self.faults.check("apply", user_key, function, "before")
        result, _row, _now = self._apply_one(ns, set_name, user_key, digest, module, function, args, pol)
        self.faults.check("apply", user_key, function, "after")
        return result

    def _apply_one(
        self, ns: str, set_name: str, user_key: Any, digest: bytes, module: str, function: str, args: list, pol: dict
    ) -> tuple[Any, Row | None, int]:
        with self._storage.write() as db:
            now = self._now()  # the store's now once the write holds the lock, as a server's
            source = db.execute("SELECT content, hash FROM udfs WHERE name = ?", (module + ".lua",)).fetchone()
            if source is None:
                raise _udf_error("UDF: Execution Error 1", module, function)
            old = self._live(db, ns, digest, now)
            view = self._view(old, set_name, user_key, digest, now)
            self._filter(pol, view)
            try:
                outcome = self._lua.call(module, source[0], source[1], function, view, list(args or []))
            except UdfFailure as failure:
                raise _udf_error(failure.message, module, function) from None
            row = old
            if outcome.action == "remove":
                if old is None:
                    # A record the UDF created and removed again: the server's delete
                    # finds nothing to delete and the call fails (seen on 8.1).
                    raise _not_found()
                Storage.delete(db, ns, digest)
                row = None
            elif outcome.action == "write":
                bins = {k: _store_value(v, cut=False) for k, v in (outcome.bins or {}).items() if v is not None}
                ttl = outcome.ttl if outcome.ttl is not None else pol.get("ttl")
                row = self._commit(
                    db, ns, digest, set_name, user_key, old, bins, self._void_time(ttl, old, now), now,
                    self._send_key(pol, "apply"),
                )
        return _out(outcome.result), row, now

    def batch_apply(
        self,
        keys: list[tuple],
        module: str,
        function: str,
        args: list,
        policy_batch: dict | None = None,
        policy_batch_apply: dict | None = None,
    ) -> BatchRecords:
        self._check_policy(policy_batch, set(), "batch_apply")
        pol = self._check_policy(policy_batch_apply, {"key", "ttl", "expressions"}, "batch_apply")
        client_value(args)
        records = []
        # One SQLite transaction for the batch, a savepoint per record: each record
        # still succeeds or fails alone, as on a server, at a fraction of the cost.
        with self._storage.write():
            for key in keys:
                records.append(self._batch_apply_one(key, module, function, args, pol))
        # The batch has committed: now the faults that make a record's answer in doubt.
        for br in records:
            if br.result == 0:
                try:
                    self.faults.check("batch_apply", br.key[2], function, "after")
                except aerospike.exception.AerospikeError as e:
                    br.result, br.record, br.in_doubt = e.code, None, True
        return _batch(records)

    def _batch_apply_one(self, key: tuple, module: str, function: str, args: list, pol: dict) -> BatchRecord:
        ns, set_name, user_key, digest = self._key(key)
        br = BatchRecord((ns, set_name, user_key, bytearray(digest)))
        try:
            self.faults.check("batch_apply", user_key, function, "before")
            result, row, now = self._apply_one(ns, set_name, user_key, digest, module, function, args, pol)
            br.result = 0
            br.record = (br.key, self._meta(row, now), {"SUCCESS": result})
        except aerospike.exception.AerospikeError as e:
            # batch_apply never raises for one record: the error text is lost,
            # only its code survives (as with the real client).
            br.result = e.code
            br.record = None
        return br

    def batch_operate(
        self,
        keys: list[tuple],
        ops: list[dict],
        policy_batch: dict | None = None,
        policy_batch_write: dict | None = None,
        ttl: int | None = None,
    ) -> BatchRecords:
        """The same operations on many records in one round trip. The batch policy's
        filter expression applies to each record (27 where it is false), the write
        policy's `exists` too; each record succeeds or fails on its own."""
        batch_pol = self._check_policy(policy_batch, {"expressions"}, "batch_operate")
        write_pol = self._check_policy(policy_batch_write, {"key", "exists"}, "batch_operate")
        pol = {**write_pol, **batch_pol}
        _sendable(ops)
        if len(keys) > 1 and pol.get("expressions") is not None and refused(pol["expressions"]):
            return self._refused([BatchRecord(key) for key in keys])
        # Parsed once for the batch, not once per record.
        if pol.get("expressions") is not None:
            pol["expressions"] = prepare(pol["expressions"])
        ops = [{**op, "expr": prepare(op["expr"])} if "expr" in op else op for op in ops]
        meta = {"ttl": ttl} if ttl is not None else None
        records = []
        with self._storage.write():
            for key in keys:
                br = BatchRecord(key)
                try:
                    k, m, results = self._operate(key, ops, meta, pol, "batch_operate", respond_all=True)
                    br.key = k
                    br.result, br.record = 0, (k, m, dict(results))
                except aerospike.exception.AerospikeError as e:
                    br.result, br.record = e.code, None
                    br.in_doubt = bool(getattr(e, "in_doubt", False))
                records.append(br)
        return _batch(records)

    def batch_write(self, batch_records: BatchRecords, policy_batch: dict | None = None) -> BatchRecords:
        """Write records (``Write`` entries with operations) in one round trip.

        Each record succeeds or fails on its own, as on a server; here they also
        share one SQLite transaction, which only makes the batch faster. The batch
        policy's filter expression applies to each record whose own policy has none
        (27 where it is false), as the server's does.
        """
        parent = self._check_policy(policy_batch, {"expressions"}, "batch_write").get("expressions")
        records = batch_records.batch_records
        if parent is not None:
            if len(records) > 1 and refused(parent):
                return self._refused(records, batch_records)
            parent = prepare(parent)  # parsed once for the batch, not once per record
        if len(records) > 1 and any(type(br) is Write and all(o.get("op") in READ_OPS for o in br.ops) for br in records):
            # What a real server (8.1) answers a batch of several records one of whose
            # Writes only reads: the batch fails whole (-2, each record -15), nothing
            # written (tests/contract/test_records.py, test_a_batch_write_of_several_
            # records_one_of_which_only_reads_fails_whole). Alone, it is a plain read.
            return self._refused(records, batch_records, -2)
        with self._storage.write() as db:
            plain = self._plain_writes(records) if parent is None else None
            if plain is not None:
                # A load's job records and index entries: new records made of plain
                # bin writes, stored with prepared statements in one go.
                self._write_new(db, records, plain)
                batch_records.result = _batch_status(records)
                return batch_records
            for br in records:
                if isinstance(br, Apply):
                    client_value(br.args)
                else:
                    _sendable(getattr(br, "ops", None) or [])
            for br in records:
                if isinstance(br, Apply):
                    # A UDF per record, each with its own arguments, in one round trip.
                    pol = self._check_policy(br.policy, {"key", "ttl", "expressions"}, "batch_write Apply")
                    done = self._batch_apply_one(
                        br.key, br.module, br.function, list(br.args or []), _filtered(pol, parent) or {}
                    )
                    br.result, br.record = done.result, done.record
                    continue
                if not isinstance(br, Write):
                    raise NotImplementedError(
                        f"embedded backend: batch_write supports Write and Apply records, not {type(br).__name__}"
                    )
                try:
                    key, meta, results = self._operate(
                        br.key, br.ops, br.meta, _filtered(br.policy, parent), "batch_write", respond_all=True
                    )
                    bins: dict[str, Any] = {}
                    for name, value in results:
                        bins[name] = value
                    br.result, br.record = 0, (key, meta, bins)
                except aerospike.exception.AerospikeError as e:
                    br.result, br.record = e.code, None
                    br.in_doubt = bool(getattr(e, "in_doubt", False))
        batch_records.result = _batch_status(batch_records.batch_records)
        return batch_records

    @staticmethod
    def _refused(records: list[BatchRecord], batch: BatchRecords | None = None, code: int = 4) -> BatchRecords:
        """A batch of several records the server refuses whole (the batch's filter one it
        cannot run: code 4; a Write that only reads among them: -2), as a real server
        (8.1) answers it: every record -15, nothing written or read (tests/contract).
        With one record, that record fails alone (4) or is a plain read."""
        for br in records:
            br.result, br.record = -15, None
        out = batch if batch is not None else BatchRecords(records)
        out.result = code
        return out

    def _plain_writes(self, records: list[BatchRecord]) -> list[tuple[Any, ...]] | None:
        """(ns, set, user key, digest, send key, bins) per record when every record is a
        create-only `Write` of plain bin values (no meta, no expression, no fault armed),
        the shape a load writes; else None, and the general path runs."""
        if self.faults.armed():
            return None
        out: list[tuple[Any, ...]] = []
        # A load shares one policy dict among its writes: judge each distinct one once.
        send_key_of: dict[int, bool] = {}
        write_op = aerospike.OPERATOR_WRITE
        calc = aerospike.calc_digest
        own_ns = self.namespace
        for br in records:
            if type(br) is not Write or br.meta:
                return None
            pol = br.policy or {}
            send_key = send_key_of.get(id(pol))
            if send_key is None:
                if pol.get("exists") != aerospike.POLICY_EXISTS_CREATE or not set(pol) <= {"exists", "key"}:
                    return None
                send_key = send_key_of[id(pol)] = self._send_key(pol, "operate")
            bins = {}
            for o in br.ops:
                name, value = o.get("bin"), o.get("val")
                if (o.get("op") != write_op or value is None or len(o) != 3
                        or type(name) is not str or len(name) > MAX_BIN_NAME or len(name.encode()) > MAX_BIN_NAME):
                    return None
                bins[name] = value
            key = br.key
            # The common key (namespace, set, user key) without `_key`'s checks and copies.
            if type(key) is tuple and len(key) == 3 and key[0] == own_ns and key[2] is not None:
                set_name = key[1] or ""
                out.append((own_ns, set_name, key[2], calc(own_ns, set_name, key[2]), send_key, bins))
            else:
                ns, set_name, user_key, digest = self._key(key)
                out.append((ns, set_name, user_key, digest, send_key, bins))
        return out

    def _write_new(self, db: Any, records: list[BatchRecord], plain: list[tuple[Any, ...]]) -> None:
        """Create-only writes, each succeeding or failing alone (5: exists, 13: too big),
        as `_operate` would answer them one by one, with a few statements per batch."""
        now = self._now()
        void_ms = now + self.default_ttl * 1000 if self.default_ttl else 0
        taken: set[bytes] = set()
        expired: list[tuple[str, bytes]] = []
        by_ns: dict[str, list[bytes]] = {}
        for ns, _, _, digest, _, _ in plain:
            by_ns.setdefault(ns, []).append(bytes(digest))
        for ns, digests in by_ns.items():
            for lo in range(0, len(digests), 500):
                part = digests[lo:lo + 500]
                rows = db.execute(
                    f"SELECT digest, void_ms FROM records WHERE ns = ? AND digest IN ({','.join('?' * len(part))})",
                    [ns, *part],
                ).fetchall()
                for d, v in rows:
                    if not v or v > now:
                        taken.add(bytes(d))
                    else:  # expired: gone for a create-only write too
                        expired.append((ns, bytes(d)))
        for ns, digest in expired:
            Storage.delete(db, ns, digest)
        new_rows = []
        indexed: dict[tuple[str, str], list[tuple[bytes, dict[str, Any]]]] = {}
        meta = self._meta(Row("", 0, None, {}, 1, void_ms, now), now)
        limit = self.max_record_size
        with_sindex = self._sets_with_sindex(db)
        for br, (ns, set_name, user_key, digest, send_key, bins) in zip(records, plain, strict=True):
            digest = bytes(digest)
            if digest in taken:
                br.result, br.record = 5, None
                continue
            # A value the client cannot send (an integer past 64 bits, a lone surrogate)
            # fails the whole call before anything is sent, as the client does: the
            # transaction is rolled back.
            stored = {k: _store_plain(v) for k, v in bins.items()}
            blob = encode(stored)
            if too_big(set_name, stored, user_key if send_key else None, blob, limit):
                br.result, br.record = 13, None
                continue
            taken.add(digest)
            ukey = encode(user_key) if send_key and user_key is not None else None
            new_rows.append((ns, digest, set_name, (digest[0] | digest[1] << 8) & 4095, ukey, blob, 1, void_ms, now))
            if (ns, set_name) in with_sindex:
                indexed.setdefault((ns, set_name), []).append((digest, stored))
            # Every write op answers nil in a batch (respond-all-ops).
            br.result, br.record = 0, ((ns, set_name, user_key, bytearray(digest)), meta.copy(), dict.fromkeys(bins))
        db.executemany(
            "INSERT INTO records (ns, digest, set_name, part, ukey, bins, gen, void_ms, lut_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            new_rows,
        )
        for (ns, set_name), rows in indexed.items():
            Storage.index_new(db, ns, set_name, rows)

    @staticmethod
    def _sets_with_sindex(db: Any) -> set[tuple[str, str]]:
        return {(ns, s) for ns, s in db.execute("SELECT DISTINCT ns, set_name FROM sindexes")}

    def batch_read(self, keys: list[tuple], bins: list[str] | None = None, policy: dict | None = None) -> BatchRecords:
        pol = dict(self._check_policy(policy, {"expressions"}, "batch_read"))  # the caller's is left as it is
        if pol.get("expressions") is not None:
            if len(keys) > 1 and refused(pol["expressions"]):
                return self._refused([BatchRecord(key) for key in keys])
            pol["expressions"] = prepare(pol["expressions"])
        now = self._now()
        records = []
        with self._storage.read() as db:
            for key in keys:
                ns, set_name, user_key, digest = self._key(key)
                br = BatchRecord((ns, set_name, user_key, bytearray(digest)))
                row = self._live(db, ns, digest, now)
                try:
                    kept = row is None or pol.get("expressions") is None or matches(
                        pol["expressions"], self._view(row, set_name, user_key, digest, now))
                except aerospike.exception.AerospikeError as e:  # a filter it cannot run: this record's error
                    br.result = e.code
                    records.append(br)
                    continue
                if row is None:
                    br.result = 2
                elif not kept:
                    br.result = 27
                elif bins is not None and not bins:
                    br.record = (br.key, self._meta(row, now))  # no bins asked: metadata only, no bins item
                else:
                    chosen = row.bins if bins is None else {b: v for b, v in row.bins.items() if b in bins}
                    br.record = (br.key, self._meta(row, now), _out_bins(chosen))
                records.append(br)
        return _batch(records)

    # -- UDF registry --------------------------------------------------------

    def udf_put(self, filename: str, udf_type: int = 0, policy: dict | None = None) -> int:
        if udf_type != aerospike.UDF_TYPE_LUA:
            raise server_error("ParamError", -2, "only Lua UDF modules are supported")
        with open(filename, encoding="utf-8") as f:
            content = f.read()
        name = os.path.basename(filename)
        digest = hashlib.sha1(content.encode()).hexdigest()
        with self._storage.write() as db:
            db.execute(
                "INSERT OR REPLACE INTO udfs (name, content, hash, type) VALUES (?, ?, ?, ?)",
                (name, content, digest, udf_type),
            )
        return 0

    def udf_list(self, policy: dict | None = None) -> list[dict]:
        with self._storage.read() as db:
            rows = db.execute("SELECT name, hash, type FROM udfs ORDER BY name").fetchall()
        return [{"name": n, "hash": bytearray(h.encode()), "type": t} for n, h, t in rows]

    def udf_get(self, module: str, language: int = 0, policy: dict | None = None) -> str:
        with self._storage.read() as db:
            row = db.execute("SELECT content FROM udfs WHERE name = ?", (module,)).fetchone()
        if row is None:
            raise server_error("UDFNotFound", 1301, "AEROSPIKE_ERR_UDF_NOT_FOUND")
        content: str = row[0]
        return content

    def udf_remove(self, module: str, policy: dict | None = None) -> int:
        with self._storage.write() as db:
            gone = db.execute("DELETE FROM udfs WHERE name = ?", (module,)).rowcount
        if not gone:
            raise server_error("UDFNotFound", 1301, "AEROSPIKE_ERR_UDF_NOT_FOUND")
        return 0

    # -- secondary indexes -------------------------------------------------------

    def index_string_create(self, ns: str, set_name: str, bin_name: str, index_name: str, policy: dict | None = None) -> int:
        return self._index_create(ns, set_name, bin_name, index_name, "string")

    def index_single_value_create(
        self, ns: str, set_name: str, bin_name: str, index_datatype: int, index_name: str, policy: dict | None = None
    ) -> int:
        kinds = {aerospike.INDEX_STRING: "string", aerospike.INDEX_NUMERIC: "numeric"}
        if index_datatype not in kinds:
            raise server_error("ParamError", -2, f"index datatype {index_datatype!r} is not supported here")
        return self._index_create(ns, set_name, bin_name, index_name, kinds[index_datatype])

    def index_integer_create(self, ns: str, set_name: str, bin_name: str, index_name: str, policy: dict | None = None) -> int:
        return self._index_create(ns, set_name, bin_name, index_name, "numeric")

    def _index_create(self, ns: str, set_name: str, bin_name: str, index_name: str, kind: str) -> int:
        """As the 8.1 server answers (aerospike-facts.md): the same definition again is
        OK; the same set/bin/type under a new name is OK and renames the index; the
        same name with another definition is refused."""
        if ns != self.namespace:
            raise server_error("NamespaceNotFound", 20, "AEROSPIKE_ERR_NAMESPACE_NOT_FOUND")
        with self._storage.write() as db:
            named = db.execute(
                "SELECT set_name, bin, type FROM sindexes WHERE ns = ? AND name = ?", (ns, index_name)
            ).fetchone()
            if named is not None:
                if tuple(named) == (set_name, bin_name, kind):
                    return 0
                raise server_error("IndexFoundError", 200, "'indexname' already exists with different definition")
            same = db.execute(
                "SELECT name FROM sindexes WHERE ns = ? AND set_name = ? AND bin = ? AND type = ?",
                (ns, set_name, bin_name, kind),
            ).fetchone()
            if same is not None:
                db.execute("UPDATE sindexes SET name = ? WHERE ns = ? AND name = ?", (index_name, ns, same[0]))
                db.execute("UPDATE sindex_entries SET name = ? WHERE ns = ? AND name = ?", (index_name, ns, same[0]))
                return 0
            db.execute(
                "INSERT INTO sindexes (ns, name, set_name, bin, type) VALUES (?, ?, ?, ?, ?)",
                (ns, index_name, set_name, bin_name, kind),
            )
            # Index what is already there, as the server builds a new index in the background.
            rows = db.execute("SELECT digest, bins FROM records WHERE ns = ? AND set_name = ?", (ns, set_name)).fetchall()
            for digest, blob in rows:
                Storage._reindex(db, ns, digest, set_name, decode(blob))
        return 0

    def index_remove(self, ns: str, index_name: str, policy: dict | None = None) -> int:
        with self._storage.write() as db:
            gone = db.execute("DELETE FROM sindexes WHERE ns = ? AND name = ?", (ns, index_name)).rowcount
            db.execute("DELETE FROM sindex_entries WHERE ns = ? AND name = ?", (ns, index_name))
        if not gone:
            raise server_error("IndexNotFound", 201, "AEROSPIKE_ERR_INDEX_NOT_FOUND")
        return 0

    def _index_name(self, set_name: str | None, predicate: tuple) -> tuple[str, Any]:
        """The index a predicate uses, and the value it looks up: an equality's
        (`predicates.equals`), or an integer range's (`predicates.between`: low, high)."""
        kind, bin_name = predicate[0], predicate[2]
        if kind == 0:
            value: Any = predicate[3]
            index_type = "string" if isinstance(value, str) else "numeric"
        elif kind == 1 and all(isinstance(v, int) and not isinstance(v, bool) for v in predicate[3:5]):
            value, index_type = (predicate[3], predicate[4]), "numeric"
        else:
            raise NotImplementedError("embedded backend: only predicates.equals and an integer predicates.between "
                                      "are implemented")
        with self._storage.read() as db:
            found = db.execute(
                "SELECT name FROM sindexes WHERE ns = ? AND set_name = ? AND bin = ? AND type = ?",
                (self.namespace, set_name or "", bin_name, index_type),
            ).fetchone()
        if found is None:
            raise server_error("IndexNotFound", 201, "AEROSPIKE_ERR_INDEX_NOT_FOUND")
        return found[0], value

    # -- scans and truncation --------------------------------------------------

    def query(self, namespace: str, set_name: str | None = None) -> EmbeddedQuery:
        if namespace != self.namespace:
            raise server_error("NamespaceNotFound", 20, "AEROSPIKE_ERR_NAMESPACE_NOT_FOUND")
        return EmbeddedQuery(self, set_name)

    def _scan(
        self, set_name: str | None, begin: int, count: int, expr: Any, bins: list[str] | None,
        predicate: tuple | None = None, after: tuple[int, bytes] | None = None,
    ) -> Iterator[tuple[int, tuple, dict, dict | None]]:
        """Records of partitions [begin, begin+count) in (partition, digest) order,
        after `after` (a resume point) when given; bins None for a record with none
        of the `bins` asked for (left out, counted towards a page). Streams: rows are read a page
        at a time (keyset pagination), and no read transaction stays open while
        the caller handles them (it may write, as a reaper does)."""
        end = begin + count
        columns = "r.digest, r.set_name, r.part, r.ukey, r.bins, r.gen, r.void_ms, r.lut_ms"
        if predicate is not None:
            # Through the secondary index: the cost follows the matches, not the set.
            index, value = self._index_name(set_name, predicate)
            source = "sindex_entries e JOIN records r ON r.ns = e.ns AND r.digest = e.digest"
            if isinstance(value, tuple):  # a range, both ends in (as the server's)
                where, params = "e.ns = ? AND e.name = ? AND e.value BETWEEN ? AND ?", [self.namespace, index, *value]
            else:
                where, params = "e.ns = ? AND e.name = ? AND e.value = ?", [self.namespace, index, value]
        else:
            source = "records r"
            where, params = "r.ns = ?", [self.namespace]
            if set_name is not None:
                where, params = where + " AND r.set_name = ?", [*params, set_name]
        cursor = after if after is not None else (begin, b"")
        while True:
            sql = (
                f"SELECT {columns} FROM {source} WHERE {where} AND r.part < ? "
                "AND (r.part, r.digest) > (?, ?) ORDER BY r.part, r.digest LIMIT ?"
            )
            with self._storage.read() as db:
                rows = db.execute(sql, [*params, end, cursor[0], cursor[1], _SCAN_PAGE]).fetchall()
            now = self._now()
            for digest, sname, part, ukey, blob, gen, void_ms, lut_ms in rows:
                if part < begin:
                    continue
                cursor = (part, digest)
                if void_ms and void_ms <= now:
                    continue
                row = Row(sname, part, decode(ukey) if ukey is not None else None, decode(blob), gen, void_ms, lut_ms)
                if expr is not None and not matches(expr, self._view(row, sname, row.user_key, digest, now)):
                    continue
                chosen = row.bins if not bins else {b: v for b, v in row.bins.items() if b in bins}
                key = (self.namespace, sname, row.user_key, bytearray(digest))
                if bins and not chosen:
                    # None of the bins asked for: the server leaves the record out, but
                    # counts it towards a page's max_records (bins None: not handed over).
                    yield part, key, self._meta(row, now), None
                    continue
                yield part, key, self._meta(row, now), _out_bins(chosen)
            if len(rows) < _SCAN_PAGE:
                return

    def truncate(self, namespace: str, set_name: str | None, nanos: int, policy: dict | None = None) -> int:
        if namespace != self.namespace:
            raise server_error("NamespaceNotFound", 20, "AEROSPIKE_ERR_NAMESPACE_NOT_FOUND")
        # Records last updated before the cut-off go; a record written in the same
        # instant may survive, as on the server.
        cutoff = nanos // 1_000_000 if nanos else self._now()
        with self._storage.write() as db:
            if set_name:
                db.execute("DELETE FROM records WHERE ns = ? AND set_name = ? AND lut_ms < ?", (namespace, set_name, cutoff))
            else:
                db.execute("DELETE FROM records WHERE ns = ? AND lut_ms < ?", (namespace, cutoff))
        return 0

    def info_all(self, command: str, policy: dict | None = None) -> dict:
        """The info commands aeroqueue sends, answered as a one-node cluster would:
        {node name: (error, response)}."""
        return {"embedded": (None, self._info(command) + "\n")}

    def info_random_node(self, command: str, policy: dict | None = None) -> str:
        return f"{command}\t{self._info(command)}\n"

    def _info(self, command: str) -> str:
        if command == "build":
            return "embedded"
        if command.startswith("sindex-list:ns="):
            ns = command.split("=", 1)[1]
            with self._storage.read() as db:
                rows = db.execute("SELECT name, set_name, bin, type FROM sindexes WHERE ns = ? ORDER BY name", (ns,)).fetchall()
            return ";".join(
                f"ns={ns}:indexname={n}:set={s}:bin={b}:type={t}:indextype=default:context=null:exp=null:state=RW"
                for n, s, b, t in rows
            )
        if command == f"namespace/{self.namespace}":
            return f"ns_cluster_size=1;replication-factor=1;max-record-size={self.max_record_size}"
        raise NotImplementedError(f"embedded backend: info command {command!r} is not implemented")


class EmbeddedQuery:
    """`client.query(ns, set)`: a scan of one set, optionally by partition range
    (`policy={'partition_filter': {'begin': b, 'count': c}}`) and expression, and
    paginated as the client does it: `max_records` per `results()` call after
    `paginate()`, resuming where the last page ended until `is_done()`."""

    def __init__(self, client: EmbeddedClient, set_name: str | None) -> None:
        self._client = client
        self._set = set_name
        self._bins: list[str] | None = None
        self._predicate: tuple | None = None
        self.max_records = 0
        self._paginate = False
        self._resume: tuple[int, bytes] | None = None
        self._done = False

    def select(self, *bins: str) -> None:
        self._bins = list(bins)

    def where(self, predicate: tuple, *rest: Any) -> None:
        """A predicate on a bin with a secondary index: `aerospike.predicates.equals`, or
        `predicates.between` on integers."""
        if rest:
            raise NotImplementedError("embedded backend: Query.where takes one predicate")
        self._predicate = predicate

    def paginate(self) -> None:
        self._paginate = True

    def is_done(self) -> bool:
        return self._done

    def get_partitions_status(self) -> dict:
        """Where a paginated scan stands: given back as the partition filter's
        ``partition_status``, a new query resumes there (an opaque token here)."""
        return {"resume": self._resume, "done": self._done}

    def _iterate(self, policy: dict | None) -> tuple[bool, Iterator[tuple[int, tuple, dict, dict | None]]]:
        pol = EmbeddedClient._check_policy(policy, {"partition_filter", "expressions"}, "query")
        pf = pol.get("partition_filter")
        begin, count = 0, N_PARTITIONS
        if pf is not None:
            extra = set(pf) - {"begin", "count", "partition_status"}
            if extra:
                raise NotImplementedError(f"embedded backend: partition_filter keys {sorted(extra)} are not implemented")
            begin, count = int(pf.get("begin", 0)), int(pf.get("count", N_PARTITIONS))
            if begin < 0 or count < 1 or begin + count > N_PARTITIONS:
                raise server_error("ParamError", -2, f"invalid partition filter begin={begin} count={count}")
            status = pf.get("partition_status")
            if status is not None and self._resume is None and not self._done:
                self._resume = status.get("resume")
        after = self._resume if self._paginate else None
        it = self._client._scan(self._set, begin, count, pol.get("expressions"), self._bins, self._predicate, after)
        return pf is not None, it

    def _page(self, it: Iterator[tuple[int, tuple, dict, dict | None]]) -> Iterator[tuple[int, tuple, dict, dict]]:
        """The records a call hands over. The server honours `max_records` with or
        without `paginate()` (seen on 8.1 with client 19.3): without it every call
        starts from the beginning again; with it the next call resumes where this
        one ended."""
        limit = self.max_records if self.max_records > 0 else None
        handed = 0
        for scanned, (part, key, meta, bins) in enumerate(it, 1):
            if bins is not None:
                handed += 1
                yield part, key, meta, bins
            if limit is not None and scanned >= limit:
                if self._paginate:
                    self._resume = (part, bytes(key[3]))  # only once the page is handed over
                    # The server stops at max_records counting the records it leaves out
                    # (none of the selected bins); the client takes a page shorter than
                    # max_records for the end of the query (seen on 8.1 with client 19.3):
                    # the rest of the set is never read.
                    if handed < limit:
                        self._done = True
                return
        self._done = True

    def results(self, policy: dict | None = None, options: dict | None = None) -> list[tuple]:
        _, it = self._iterate(policy)
        return [(key, meta, bins) for _, key, meta, bins in self._page(it)]

    def foreach(self, callback: Callable[..., Any], policy: dict | None = None, options: dict | None = None) -> None:
        with_partition, it = self._iterate(policy)
        for part, key, meta, bins in self._page(it):
            # With a partition filter the client calls back with the partition id too.
            stop = callback(part, (key, meta, bins)) if with_partition else callback((key, meta, bins))
            if stop is False:
                return


_SCALARS = frozenset({str, int, float, bool, bytes})


def _sendable(ops: list[dict]) -> None:
    """`client_value` of each operation's value, and its bin's name (15 bytes at most,
    a read's too): the client refuses the whole call before sending anything (a batch
    too, not record by record)."""
    for op in ops:
        name = op.get("bin")
        if type(name) is str and len(name.encode()) > MAX_BIN_NAME:
            raise server_error("BinNameError", 21, "A bin name should not exceed 15 characters limit")
        client_value(op.get("val"))


def _plain(v: Any) -> bool:
    """A scalar `_store_value` keeps as it is (a string with a NUL it cuts, an integer
    past 64 bits it refuses)."""
    kind = type(v)
    if kind is str:
        if "\x00" in v:
            return False
        if not v.isascii():
            try:
                utf8_text(v)
            except aerospike.exception.ClientError:
                return False
        return True
    if kind is int:
        return -_I64 <= v < _I64
    return kind in _SCALARS


def _store_plain(value: Any) -> Any:
    """`_store_value`, without its copy for what it would not change: scalars and maps or
    lists of them (a loaded payload, mostly). Only stored, never changed afterwards."""
    if _plain(value):
        return value
    kind = type(value)
    if kind is dict:
        if all(map(_plain, value.values())) and all(map(_plain, value)):
            return key_ordered(value)
    elif kind is list and all(map(_plain, value)):
        return value
    return _store_value(value)


def _store_value(value: Any, *, cut: bool = True) -> Any:
    """Normalise a bin value for storage (bytearray and bytes are both blobs). A string
    from the client ends at its first NUL, as the client sends it (values and map
    keys alike); `cut=False` for a UDF's own writes (Lua strings carry a length)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, str):
        if cut and not value.isascii():
            utf8_text(value)  # from the client, which refuses a lone surrogate
        return value.partition("\x00")[0] if cut else value
    if isinstance(value, list):
        return [_store_value(v, cut=cut) for v in value]
    if isinstance(value, dict):
        return key_ordered({(bytes(k) if isinstance(k, bytearray) else _store_value(k, cut=cut) if isinstance(k, str)
                              else k): _store_value(v, cut=cut) for k, v in value.items()})
    if isinstance(value, tuple):
        if cut:  # from the client, which serializes no tuple (a UDF's list is a list)
            raise server_error("ParamError", -2, "Cannot serialize: SERIALIZER_NONE selected")
        return [_store_value(v, cut=cut) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -_I64 <= value < _I64:
        raise server_error("ParamError", -2, "integer value exceeds sys.maxsize")
    if value is None or isinstance(value, (bool, int, float, bytes)):
        return value
    raise server_error("ParamError", -2, f"unsupported bin value type {type(value).__name__}")


def _out(value: Any) -> Any:
    """A stored value as the client returns it: blobs as bytes (client 19, server 8.1)."""
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, list):
        return [_out(v) for v in value]
    if isinstance(value, dict):
        return {k: _out(v) for k, v in value.items()}  # keys stay hashable bytes
    return value


def _out_bins(bins: dict[str, Any]) -> dict[str, Any]:
    return {k: _out(v) for k, v in bins.items()}


def _udf_error(message: str, module: str, function: str) -> Exception:
    err = server_error("UDFError", 100, message)
    err.module = module  # type: ignore[attr-defined]
    err.func = function  # type: ignore[attr-defined]
    return err


def _batch_status(records: list[BatchRecord]) -> int:
    # 0 unless some record failed for a reason other than not-found or filtered-out
    # (-16, AEROSPIKE_BATCH_FAILED), as the client documents BatchRecords.result.
    return -16 if any(r.result not in (0, 2, 27) for r in records) else 0


def _batch(records: list[BatchRecord]) -> BatchRecords:
    out = BatchRecords(records)
    out.result = _batch_status(records)
    return out


def _filtered(policy: dict | None, parent: Any) -> dict | None:
    """A batch record's policy with the batch's filter when it has none of its own."""
    if parent is None or (policy and policy.get("expressions") is not None):
        return policy
    return {**(policy or {}), "expressions": parent}
