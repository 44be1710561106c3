"""Partition scans and cross-process atomicity."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import time
from typing import Any

import aerospike
import pytest
from aerospike import exception as aex
from aerospike_helpers import expressions as xp
from aerospike_helpers.operations import operations as op

from aeroqueue import errors, keys
from aeroqueue.backends import Backend, open_backend

from .conftest import MODULE

N_PARTITIONS = 4096


def test_partition_ranges_return_each_record_exactly_once(backend: Backend, client, ns, set_name):
    names = [f"r{i}" for i in range(300)]
    for i, name in enumerate(names):
        backend.put(set_name, name, {"i": i, "odd": i % 2})
    seen: list[str] = []
    # Uneven ranges, as Spark tasks would cut them, covering 0..4095.
    bounds = [0, 1, 700, 2048, 2049, 4000, N_PARTITIONS]
    for begin, end in itertools.pairwise(bounds):
        seen.extend(name for name, _ in backend.scan(set_name, begin=begin, count=end - begin))
    assert sorted(seen) == sorted(names), "every record exactly once across all 4096 partitions"


def test_scan_reports_the_partition_the_digest_names(client, ns, set_name):
    client.put((ns, set_name, "job/1"), {"a": 1}, policy={"key": aerospike.POLICY_KEY_SEND})
    digest = aerospike.calc_digest(ns, set_name, "job/1")
    part = int.from_bytes(bytes(digest)[:2], "little") & (N_PARTITIONS - 1)
    got = []
    client.query(ns, set_name).foreach(lambda p, rec: got.append((p, rec[0][2])), {"partition_filter": {"begin": part, "count": 1}})
    assert got == [(part, "job/1")]


def test_scan_with_expression_filter(backend: Backend, client, set_name):
    for i in range(40):
        backend.put(set_name, f"r{i}", {"i": i, "state": "done" if i % 4 == 0 else "queued"})
    done = xp.Eq(xp.StrBin("state"), "done").compile()
    got = sorted(rec.bins["i"] for _, rec in backend.scan(set_name, expression=done))
    assert got == list(range(0, 40, 4))


def _incrementer(url: str, set_name: str, n: int) -> None:
    backend = open_backend(url)
    for _ in range(n):
        backend.apply(set_name, "counter", MODULE, "incr", "n", 1)
    backend.close()


def test_udf_increments_from_several_processes_lose_no_update(backend: Backend, client, store_url, set_name):
    procs, per_proc = 4, 150
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=_incrementer, args=(store_url, set_name, per_proc)) for _ in range(procs)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    rec = backend.get(set_name, "counter")
    assert rec is not None
    assert rec.bins["n"] == procs * per_proc
    assert rec.gen == procs * per_proc, "one generation per UDF write"


def test_secondary_index_finds_exactly_the_matching_records(backend: Backend, set_name):
    for i in range(30):
        backend.put(set_name, f"r{i}", {"owner": f"s{i % 3}", "n": i})
    assert backend.create_index(set_name, "owner", f"{set_name}_owner") is True
    assert backend.create_index(set_name, "owner", f"{set_name}_owner") is False  # already there, nothing sent

    for _ in range(50):  # a real server builds a new index in the background
        try:
            if len(backend.find(set_name, "owner", "s1")) == 10:
                break
        except errors.BackendError:
            pass
        time.sleep(0.1)
    assert sorted(n for n, _ in backend.find(set_name, "owner", "s1")) == sorted(f"r{i}" for i in range(1, 30, 3))
    backend.put(set_name, "r1", {"owner": "s2"})  # moves from s1 to s2
    backend.put(set_name, "r4", {"owner": None})  # leaves the index
    backend.remove(set_name, "r7")
    assert sorted(n for n, _ in backend.find(set_name, "owner", "s1")) == sorted(f"r{i}" for i in range(10, 30, 3))
    assert "r1" in {n for n, _ in backend.find(set_name, "owner", "s2")}
    small = xp.LT(xp.IntBin("n"), 20).compile()
    assert sorted(n for n, _ in backend.find(set_name, "owner", "s1", expression=small)) == ["r10", "r13", "r16", "r19"]


def test_a_numeric_index_finds_a_range_in_one_query(backend: Backend, set_name):
    """A numeric index holds a bin's integers only (a string, a missing bin: no entry);
    `find_between` takes both ends; a range with no such index is refused (201). What
    the dashboard counts every session's claims with (the claims' deadlines, `dl`)."""
    index = f"{set_name}_dl"
    for i, value in enumerate([-5, 0, 7, 10, 11, "10", None, 2**62]):
        backend.put(set_name, f"r{i}", {"dl": value, "sess": f"s{i % 2}"})
    with pytest.raises(errors.BackendError) as refused:
        backend.find_between(set_name, "dl", 0, 10)
    assert refused.value.code == 201, refused.value
    try:
        assert backend.create_index(set_name, "dl", index, kind="numeric") is True
        assert backend.create_index(set_name, "dl", index, kind="numeric") is False  # already there, nothing sent
        assert backend.indexes()[index] == (set_name, "dl", "numeric")

        def between(low: int, high: int, **kw: Any) -> list[str]:
            return sorted(n for n, _ in backend.find_between(set_name, "dl", low, high, **kw))

        for _ in range(50):  # a real server builds a new index in the background
            with contextlib.suppress(errors.BackendError):
                if between(*keys.INT64) == ["r0", "r1", "r2", "r3", "r4", "r7"]:
                    break
            time.sleep(0.1)
        assert between(*keys.INT64) == ["r0", "r1", "r2", "r3", "r4", "r7"]
        assert between(0, 10) == ["r1", "r2", "r3"], "both ends in; the string '10' is not indexed"
        assert between(-5, -5) == ["r0"] and between(12, 2**62 - 1) == []
        backend.put(set_name, "r2", {"dl": None})  # leaves the index
        backend.put(set_name, "r5", {"dl": 3})  # joins it
        even = xp.Eq(xp.StrBin("sess"), "s0").compile()
        assert between(0, 10) == ["r1", "r3", "r5"]
        assert between(*keys.INT64, expression=even) == ["r0", "r4"]
        got = dict(backend.find_between(set_name, "dl", 3, 3, bins=["sess"]))
        assert list(got) == ["r5"] and got["r5"].bins == {"sess": "s1"}
    finally:
        with contextlib.suppress(aex.AerospikeError):
            backend.client.index_remove(backend.namespace, index)


def test_a_set_index_is_made_on_the_server_and_nothing_on_the_embedded_store(backend: Backend, set_name, monkeypatch):
    """Without a set index a scan of a small set (the sessions: twice a reaper's pass)
    walks the whole namespace's primary index: 350 ms of server CPU a scan with 1M jobs
    in it, 3 ms with one. `create_index(kind="set")` makes one (8.1.2: `sindex-create`
    with `indextype=set`), listed as (set, "", "set"); the embedded store's records are
    indexed by set already. A server that refuses it gets enable-index node by node,
    and a server that refuses that too is only said in the log."""
    ns, index = backend.namespace, f"{set_name}_set"
    if backend.is_embedded:
        assert backend.create_index(set_name, "", index, kind="set") is False
        assert index not in backend.indexes()
        return
    try:
        assert backend.create_index(set_name, "", index, kind="set") is True
        assert backend.create_index(set_name, "", index, kind="set") is False  # already there, nothing sent
        assert backend.indexes()[index] == (set_name, "", "set")
        for _, text in backend.client.info_all(f"sets/{ns}/{set_name}").values():
            assert "enable-index=true" in text, text
        backend.client.info_all(f"sindex-delete:namespace={ns};indexname={index}")
        # A server that refuses the set index: enable-index instead; refusing that too, a log line.
        sent: list[str] = []
        real = backend.client

        class Refusing:
            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

            def info_all(self, command: str, *args: object, **kw: object) -> object:
                sent.append(command.partition(":")[0])
                if command.startswith(("sindex-create", "set-config")) and len(sent) > refuse_after:
                    return {"n1": (None, "ERROR::unknown command\n")}
                return real.info_all(command, *args, **kw)

        monkeypatch.setattr(backend, "client", Refusing())
        refuse_after = 1  # the index list, then refused
        assert backend.create_index(set_name, "", index, kind="set") is False
        assert sent == ["sindex-list", "sindex-create", "set-config"], sent
    finally:
        monkeypatch.undo()
        with contextlib.suppress(aex.AerospikeError):
            backend.client.info_all(f"sindex-delete:namespace={ns};indexname={index}")
            backend.client.info_all(f"set-config:context=namespace;id={ns};set={set_name};enable-index=false")


def test_index_creation_answers_as_the_server_does(backend: Backend, set_name):
    """8.1.2.0 with client 19.3: an identical create is OK, the same set/bin/type under a
    new name is OK and renames the index, the same name with another bin is refused."""
    ns, c = backend.namespace, backend.client
    first, second = f"{set_name}_a", f"{set_name}_b"
    try:
        assert c.index_single_value_create(ns, set_name, "b1", aerospike.INDEX_STRING, first) == 0
        assert c.index_single_value_create(ns, set_name, "b1", aerospike.INDEX_STRING, first) == 0
        assert backend.indexes()[first] == (set_name, "b1", "string")
        with pytest.raises(aex.IndexFoundError) as e:
            c.index_single_value_create(ns, set_name, "b2", aerospike.INDEX_STRING, first)
        assert e.value.code == 200
        assert "already exists with different definition" in e.value.msg
        assert c.index_single_value_create(ns, set_name, "b1", aerospike.INDEX_STRING, second) == 0
        now = backend.indexes()
        assert now.get(second) == (set_name, "b1", "string")
        assert first not in now, "the index carries the new name"
    finally:
        for name in (first, second):
            with contextlib.suppress(aex.AerospikeError):
                c.index_remove(ns, name)


def test_the_index_list_is_read_again_when_a_read_of_it_times_out(backend: Backend, monkeypatch):
    """A worker's start reads the index list (registering the modules): an answer that
    timed out (code 9, seen from a loaded machine) failed the start."""
    calls: list[str] = []

    class FirstTimesOut:
        def __init__(self, client: object) -> None:
            self.client = client

        def __getattr__(self, name: str) -> object:
            return getattr(self.client, name)

        def info_all(self, command: str, *args: object, **kwargs: object) -> object:
            calls.append(command)
            if len(calls) == 1:
                raise aex.TimeoutError(9, "timeout")
            return self.client.info_all(command, *args, **kwargs)  # type: ignore[attr-defined]

    monkeypatch.setattr(backend, "client", FirstTimesOut(backend.client))
    assert isinstance(backend.indexes(), dict)
    assert len(calls) == 2, calls


def test_get_returns_the_user_key_only_under_a_send_key_policy(backend: Backend, set_name):
    """The project's client sends keys (config policies.key = SEND), so `get` answers
    with the user key; a call with an explicit digest policy answers None."""
    backend.put(set_name, "k1", {"a": 1})
    key = backend.key(set_name, "k1")
    assert backend.client.get(key)[0][2] == "k1"
    assert backend.client.get(key, policy={"key": aerospike.POLICY_KEY_DIGEST})[0][2] is None
    assert backend.client.select(key, ["a"])[0][2] == "k1"


def test_secondary_index_follows_operate_writes_and_expiry(backend: Backend, set_name):
    """The index stays exact through the writes the queue makes: ops that leave the
    indexed bin alone, a batch that sets it, one that removes it, and a record that
    expired and was written again without it (its old entry must not come back)."""
    ns, c = backend.namespace, backend.client
    index = f"{set_name}_sess"
    keys = [(ns, set_name, f"j{i}") for i in range(4)]
    for i, key in enumerate(keys):
        c.put(key, {"state": "queued", "n": i})
    c.put((ns, set_name, "probe"), {"sess": "p"})
    try:
        assert backend.create_index(set_name, "sess", index) is True

        def held(sess: str) -> list[str]:
            return sorted(n for n, _ in backend.find(set_name, "sess", sess))

        for _ in range(100):  # a real server builds a new index in the background
            with contextlib.suppress(errors.BackendError):
                if held("p"):
                    break
            time.sleep(0.1)
        c.put((ns, set_name, "old"), {"sess": "s1", "n": 9}, policy={"ttl": 2})
        assert held("s1") == ["old"]
        out = c.batch_operate(keys[:3], [op.write("sess", "s1"), op.write("state", "claimed")])
        assert [r.result for r in out.batch_records] == [0, 0, 0]
        c.operate(keys[0], [op.increment("n", 1)])  # the indexed bin untouched
        c.operate(keys[1], [op.write("sess", "s2")])  # moved to another value
        out = c.batch_operate(
            keys, [op.write("sess", None), op.write("state", "done")],
            policy_batch={"expressions": xp.Eq(xp.StrBin("state"), "claimed").compile()},
        )
        assert [r.result for r in out.batch_records] == [0, 0, 0, 27]
        assert held("s1") == ["old"] and held("s2") == []
        c.operate(keys[3], [op.write("sess", "s1")])
        assert held("s1") == ["j3", "old"]
        time.sleep(3.2)  # "old" expires; written again without the bin
        c.put((ns, set_name, "old"), {"n": 10})
        assert held("s1") == ["j3"]
    finally:
        with contextlib.suppress(aex.AerospikeError):
            c.index_remove(ns, index)


def test_a_batch_record_too_big_fails_alone_and_leaves_its_record_unchanged(backend: Backend, set_name):
    """One record of a batch over the size limit answers 13 and keeps its old bins and
    generation; the others are written (each record succeeds or fails alone)."""
    ns, c = backend.namespace, backend.client
    small, large = (ns, set_name, "small"), (ns, set_name, "large")
    c.put(small, {"a": 1})
    c.put(large, {"a": 2, "blob": b"x" * (600 * 1024)})
    out = c.batch_operate([small, large], [op.write("more", b"y" * (600 * 1024)), op.increment("a", 10)])
    assert [r.result for r in out.batch_records] == [0, 13]
    assert c.get(small)[2]["a"] == 11
    _, meta, bins = c.get(large)
    assert bins["a"] == 2 and "more" not in bins and meta["gen"] == 1
