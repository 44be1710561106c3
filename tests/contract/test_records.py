"""Record-level behaviours aeroqueue relies on (aerospike-facts.md, "Client API used").

Written once, run on the embedded backend and on a real server alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
import warnings

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers import expressions as xp
from aerospike_helpers.batch.records import Apply, BatchRecords, Write
from aerospike_helpers.operations import bitwise_operations as bw
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import list_operations as lo
from aerospike_helpers.operations import map_operations as mo
from aerospike_helpers.operations import operations as op

from aeroqueue import errors
from aeroqueue.backends import Backend

GEN_EQ = {"gen": aerospike.POLICY_GEN_EQ}


def test_generation_check_refuses_a_stale_write(client, ns, set_name):
    key = (ns, set_name, "g")
    client.put(key, {"a": 1})
    _, meta, _ = client.get(key)
    assert meta["gen"] == 1
    client.put(key, {"a": 2}, meta={"gen": 1}, policy=GEN_EQ)
    with pytest.raises(ex.RecordGenerationError) as e:
        client.put(key, {"a": 3}, meta={"gen": 1}, policy=GEN_EQ)
    assert e.value.code == 3
    _, meta, bins = client.get(key)
    assert (meta["gen"], bins) == (2, {"a": 2})


def test_a_batch_write_checks_each_records_own_generation(client, ns, set_name):
    """A compare-and-set per record in one batch (Backend.batch_if_unchanged, the
    sweeper's fence): a record still at the generation given is written (0), one
    written since is refused (3) and left alone, a missing one is not created (2)."""
    keys = [(ns, set_name, f"cas{i}") for i in range(3)]
    for key in keys[:2]:
        client.put(key, {"state": "queued"})
    client.put(keys[1], {"state": "claimed"})  # generation 2: moved on since "the scan"
    policy = {"exists": aerospike.POLICY_EXISTS_UPDATE, **GEN_EQ}
    batch = BatchRecords([Write(key, [op.write("x", 1)], meta={"gen": 1}, policy=policy) for key in keys])
    out = client.batch_write(batch)
    assert [r.result for r in out.batch_records] == [0, 3, 2]
    assert [client.get(k)[1]["gen"] for k in keys[:2]] == [2, 2]
    assert [client.get(k)[2] for k in keys[:2]] == [{"state": "queued", "x": 1}, {"state": "claimed"}]
    with pytest.raises(ex.RecordNotFound):
        client.get(keys[2])


def test_create_only_put_refuses_an_existing_record(client, ns, set_name):
    key = (ns, set_name, "c")
    create = {"exists": aerospike.POLICY_EXISTS_CREATE}
    client.put(key, {"a": 1}, policy=create)
    with pytest.raises(ex.RecordExistsError) as e:
        client.put(key, {"a": 2}, policy=create)
    assert e.value.code == 5
    assert client.get(key)[2] == {"a": 1}


def test_missing_record_reads_raise_not_found_with_code_2(client, ns, set_name):
    key = (ns, set_name, "none")
    with pytest.raises(ex.RecordNotFound) as e:
        client.get(key)
    assert e.value.code == 2
    assert e.value.msg.endswith("AEROSPIKE_ERR_RECORD_NOT_FOUND")
    assert client.exists(key)[1] is None
    with pytest.raises(ex.RecordNotFound):
        client.remove(key)


def test_ttl_expires_the_record_on_read(client, ns, set_name):
    key = (ns, set_name, "ttl")
    client.put(key, {"a": 1}, policy={"ttl": 1})
    assert client.get(key)[1]["ttl"] in (1, 2)
    time.sleep(2.2)
    with pytest.raises(ex.RecordNotFound):
        client.get(key)
    client.put(key, {"a": 1}, policy={"ttl": aerospike.TTL_NEVER_EXPIRE})
    assert client.get(key)[1]["ttl"] == 0xFFFFFFFF


def test_bin_name_over_15_bytes_is_refused_by_the_client(client, ns, set_name):
    with pytest.raises(ex.BinNameError) as e:
        client.put((ns, set_name, "b"), {"x" * 16: 1})
    assert e.value.code == 21


def test_a_bin_name_over_15_bytes_is_refused_in_operations_and_filters(client, ns, set_name):
    """Not only in a put: the client refuses an operation on such a bin (a read too),
    in a batch for the whole call, and the server refuses a filter that names one. The
    stand-in had stored the bin, and taken the filter for false."""
    key = (ns, set_name, "long")
    client.put(key, {"v": 1})
    for call in (
        lambda: client.operate(key, [op.write("a" * 16, 1)]),
        lambda: client.operate(key, [op.read("a" * 16)]),
        lambda: client.batch_operate([key, (ns, set_name, "other")], [op.write("b" * 16, 1)]),
        lambda: client.batch_write(BatchRecords([Write(key, [op.write("c" * 16, 1)]), Write(key, [op.write("v", 2)])])),
    ):
        with pytest.raises(ex.BinNameError) as e:
            call()
        assert e.value.code == 21
    with pytest.raises(ex.InvalidRequest) as info:
        client.get(key, {"expressions": xp.BinExists("d" * 16).compile()})
    assert info.value.code == 4
    assert client.get(key)[2] == {"v": 1}, "a refused call wrote something"


def test_a_batch_filter_the_server_cannot_run_refuses_a_batch_of_several_whole(client, ns, set_name):
    """A batch's filter the server refuses (code 4: here a bin name over 15 bytes):
    with several records the batch answers 4 and every record -15, nothing written;
    with one, that record answers 4."""
    keys = [(ns, set_name, f"f{i}") for i in range(2)]
    for key in keys:
        client.put(key, {"v": 1})
    bad = {"expressions": xp.BinExists("d" * 16).compile()}
    for out in (
        client.batch_operate(keys, [op.write("x", 1)], bad),
        client.batch_read(keys, ["v"], bad),
        client.batch_write(BatchRecords([Write(key, [op.write("x", 1)]) for key in keys]), bad),
    ):
        assert (out.result, [(br.result, br.record) for br in out.batch_records]) == (4, [(-15, None)] * 2)
    alone = client.batch_read(keys[:1], ["v"], bad)
    assert [(br.result, br.record) for br in alone.batch_records] == [(4, None)]
    assert [client.get(key)[2] for key in keys] == [{"v": 1}] * 2


def test_a_batch_write_of_several_records_one_of_which_only_reads_fails_whole(client, ns, set_name):
    """A `Write` whose operations only read, among several records of a batch_write:
    the batch answers -2 and every record -15, and nothing is written (the other
    record's write neither). Alone in its batch it is a plain read."""
    a, b = (ns, set_name, "wa"), (ns, set_name, "wb")
    client.put(a, {"att": 1})
    client.put(b, {"att": 2})
    out = client.batch_write(BatchRecords([Write(a, [op.write("x", 1)]), Write(b, [op.read("att")])]))
    assert (out.result, [(br.result, br.record) for br in out.batch_records]) == (-2, [(-15, None)] * 2)
    assert client.get(a)[1]["gen"] == 1 and client.get(a)[2] == {"att": 1}, "the batch wrote its other record"
    one = client.batch_write(BatchRecords([Write(b, [op.read("att")])]))
    assert [(br.result, br.record[2]) for br in one.batch_records] == [(0, {"att": 2})]


def test_record_over_max_record_size_is_too_big(client, ns, set_name):
    with pytest.raises(ex.RecordTooBig) as e:
        client.put((ns, set_name, "big"), {"a": "x" * (9 * 1024 * 1024)})
    assert e.value.code == 13


# The largest value Aerospike CE 8.1.2.0 (max-record-size 1 MiB) stores in a record
# of this shape, key "k2" sent, in a set of a 5-character name (stored with the
# record): a record's size is the server's flat size (strings and blobs as bytes,
# lists and maps as msgpack), not what a value takes in Python.
_LARGEST = [
    ("one string bin", lambda n: {"s": "x" * n}, 1_048_519),
    ("three bins", lambda n: {"s": "x" * n, "a": "b", "c": 300}, 1_048_502),
    ("a blob", lambda n: {"b": b"x" * n}, 1_048_519),
    ("a list of small ints", lambda n: {"l": [1] * n}, 1_048_514),
    ("a map of short keys", lambda n: {"m": {f"k{i}": i for i in range(n)}}, 91_621),
    ("a job record", lambda n: {"list": "t-abc", "token": 5, "jid": "j5", "payload": {"x": "y" * n}, "state": "queued",
                                "att": 0, "max_att": 5}, 1_048_433),
]


@pytest.mark.parametrize(("shape", "make", "largest"), _LARGEST, ids=[s for s, _, _ in _LARGEST])
def test_a_record_is_too_big_where_the_server_says(backend, client, ns, shape, make, largest):
    """Within a few bytes of the server's own limit, whatever the shape: the embedded
    store once sized records by Python's own encoding (5 bytes an int), and refused
    lists of numbers a third the size the server stores."""
    if backend.max_record_size() != 1024 * 1024:
        pytest.skip("measured with max-record-size 1 MiB")
    key = (ns, f"s{uuid.uuid4().hex[:4]}", "k2")  # a set of its own, of the measured name's length
    policy = {"key": aerospike.POLICY_KEY_SEND, "exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE}
    try:
        client.put(key, make(largest - 4), policy=policy)
        with pytest.raises(ex.RecordTooBig):
            client.put(key, make(largest + 4), policy=policy)
    finally:
        client.remove(key)


def test_blobs_come_back_as_bytes_wherever_they_are(client, ns, set_name):
    key = (ns, set_name, "blobs")
    client.put(key, {"b": b"ab", "l": [b"x"], "m": {"k": b"y"}, "bits": bytearray(b"\x80")})
    bins = client.get(key)[2]
    assert [type(v) for v in (bins["b"], bins["l"][0], bins["m"]["k"], bins["bits"])] == [bytes] * 4
    _, _, got = client.operate(key, [op.read("b"), bw.bit_get("bits", 0, 8)])
    assert type(got["b"]) is bytes and type(got["bits"]) is bytes, got


def test_a_scan_leaves_out_records_without_any_bin_it_selects(backend: Backend, set_name):
    backend.put(set_name, "has", {"a": 1, "z": 2})
    backend.put(set_name, "lacks", {"a": 3})
    assert sorted((name, rec.bins) for name, rec in backend.scan(set_name, bins=["z"])) == [("has", {"z": 2})]


def test_a_paged_scan_selecting_a_bin_few_records_have_finds_every_one(backend: Backend, set_name):
    """The server counts a record without the selected bins towards a page it leaves
    it out of: the short page looked like the scan's end (on a server with more than
    a page of sessions, the sweep missed leases and offered leased jobs again)."""
    for i in range(60):
        backend.put(set_name, f"r{i}", {"a": i, **({"z": i} if i % 7 == 0 else {})})
    got = sorted(rec.bins["z"] for _, rec in backend.scan(set_name, bins=["z"], page_size=10))
    assert got == list(range(0, 60, 7))
    assert sum(1 for _ in backend.scan(set_name, bins=["a", "z"], page_size=10)) == 60


def test_a_value_repeated_by_reference_counts_each_time_towards_the_record_size(client, ns, set_name):
    """`[s] * n` is 2 MB on the server whether its items are one object or many: the
    embedded store sized records by an encoding that writes a repeated object once."""
    s = "x" * 1000
    same = [s] * 2000
    with pytest.raises(ex.RecordTooBig):
        client.put((ns, set_name, "p"), {"l": same})
    with pytest.raises(ex.RecordTooBig):
        client.operate((ns, set_name, "o"), [op.write("result", {"rows": [{"v": s}] * 2000})])
    out = client.batch_write(BatchRecords([
        Write((ns, set_name, "b"), [op.write("l", same)], policy={"exists": aerospike.POLICY_EXISTS_CREATE}),
    ]))
    assert out.batch_records[0].result == 13
    for name in ("p", "o", "b"):
        assert client.exists((ns, set_name, name))[1] is None


def test_a_short_blob_in_a_list_takes_as_little_room_as_a_short_string(client, ns, set_name):
    """The server packs a blob inside a list or map as it packs a string: a 2-byte blob
    takes 4 bytes (the largest list of them it takes under 1 MiB: 262,127). The
    embedded store counted 5 and refused a list of 250,000."""
    blobs = [bytes((i % 256, 1)) for i in range(250_000)]  # distinct objects
    client.put((ns, set_name, "l"), {"l": blobs})
    assert len(client.get((ns, set_name, "l"))[2]["l"]) == 250_000


# Each refusal in a process of its own (test_records.py, _SEND): the real client's heap
# may be corrupt after it refuses a value.
_REFUSE = """
import json, os, sys
import aerospike
from aerospike import exception as ex
from aerospike_helpers.batch.records import BatchRecords, Write
from aerospike_helpers.operations import operations as op
from aeroqueue.backends import open_backend
url, set_name, case = sys.argv[1], sys.argv[2], sys.argv[3]
backend = open_backend(url)
client, ns = backend.client, backend.namespace
key = (ns, set_name, "k")
client.put(key, {"a": 1})
create = {"exists": aerospike.POLICY_EXISTS_CREATE}
try:
    if case == "put":
        client.put(key, {"a": "file \\udcff"})
    elif case == "put map key":
        client.put(key, {"a": {"\\udcff": 1}})
    elif case == "apply":
        client.apply(key, "aq_contract", "fail_with", ["\\udcff"])
    elif case == "batch of creates":
        client.batch_write(BatchRecords([
            Write((ns, set_name, "n1"), [op.write("a", 1)], policy=create),
            Write((ns, set_name, "n2"), [op.write("a", 2**63)], policy=create),
        ]))
    out = ["sent", None]
except ex.AerospikeError as e:
    out = [type(e).__name__, e.code]
out += [client.get(key)[2], client.exists((ns, set_name, "n1"))[1] is None]
print(json.dumps(out), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize(("case", "refused"), [
    ("put", ["ClientError", -1]),
    ("put map key", ["ClientError", -1]),
    ("apply", ["ClientError", -1]),
    ("batch of creates", ["ParamError", -2]),
])
def test_the_client_refuses_a_lone_surrogate_and_a_bad_batch_value_for_the_whole_call(
    client, store_url, set_name, case, refused
):
    """A lone surrogate (a file name's undecodable byte) is not UTF-8: the client refuses
    the call (ClientError -1), whatever the call; a value it cannot send fails a whole
    batch_write of creates before anything is sent. The embedded store stored the
    surrogate (put), raised a UnicodeEncodeError (apply), or wrote the rest of the batch."""
    run = subprocess.run([sys.executable, "-c", _REFUSE, store_url, set_name, case],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout) == [*refused, {"a": 1}, True]


def test_every_write_op_of_a_batch_answers_nil_so_a_read_before_it_is_overwritten(client, ns, set_name):
    """The C client asks for respond-all-ops in batch writes: each write op answers
    nil under its bin (a delete under ''), after the reads before it, so the bins of
    a read-then-write come back None. The embedded store answered only the reads."""
    key = (ns, set_name, "a")
    client.put(key, {"n": 1, "s": "x"})
    out = client.batch_operate([key], [op.read("n"), op.write("n", 2)])
    assert out.batch_records[0].record[2] == {"n": None}
    out = client.batch_write(BatchRecords([Write(key, [op.read("s"), op.write("s", "y"), op.write("w", 1)])]))
    assert out.batch_records[0].record[2] == {"s": None, "w": None}
    out = client.batch_operate([key], [op.delete(), op.write("n", 3)])
    assert out.batch_records[0].record[2] == {"": None, "n": None}
    out = client.batch_write(BatchRecords([
        Write((ns, set_name, "new"), [op.write("a", 1)], policy={"exists": aerospike.POLICY_EXISTS_CREATE}),
    ]))
    assert out.batch_records[0].record[2] == {"a": None}
    assert client.get(key)[2] == {"n": 3}


def test_a_read_of_no_bins_is_refused_by_select_and_has_no_bins_item_in_a_batch(client, ns, set_name):
    """`select(key, [])` is an invalid request (4) on the server; `batch_read(keys, [])`
    answers each record as (key, meta), without a bins item (Backend.batch_get would
    fail on record[2]). The embedded store answered an empty dict for both."""
    key = (ns, set_name, "a")
    client.put(key, {"a": 1})
    with pytest.raises(ex.InvalidRequest):
        client.select(key, [])
    record = client.batch_read([key], []).batch_records[0].record
    assert len(record) == 2 and record[1]["gen"] == 1


def test_max_records_holds_without_paginate_and_in_foreach(client, ns, set_name):
    """The server sends at most `max_records` records whether or not the query is
    paginated, to `results` and to `foreach` alike; without `paginate()` each call
    starts again (which records it picks is the server's: two calls on one node gave
    [0, 2, 3, 4] and [0, 2, 4, 5]). The embedded store honoured it only in a
    paginated `results`."""
    for i in range(10):
        client.put((ns, set_name, f"r{i}"), {"i": i})
    query = client.query(ns, set_name)
    query.max_records = 4
    # Pages of 10 records would be 4, 4 and 2: each call starts again.
    assert [len(query.results()) for _ in range(3)] == [4, 4, 4]
    got: list[int] = []
    query = client.query(ns, set_name)
    query.max_records = 4
    query.paginate()
    query.foreach(lambda r: got.append(r[2]["i"]))
    assert len(got) == 4
    query.foreach(lambda r: got.append(r[2]["i"]))
    assert len(got) == 8 and len(set(got)) == 8


def test_a_udf_that_creates_then_removes_a_record_fails_with_not_found(client, ns, set_name):
    """On a missing record, create then remove in one UDF call: the server's delete
    finds nothing and the call fails with RecordNotFound (2); the embedded store
    answered remove's 0."""
    key = (ns, set_name, "cr")
    with pytest.raises(ex.RecordNotFound):
        client.apply(key, "aq_contract", "create_then_remove", [])
    assert client.exists(key)[1] is None


def test_udfs_have_utf8_coroutine_os_date_and_G(client, ns, set_name):
    """The server's Lua has the whole standard library; the embedded sandbox lacked the
    harmless `utf8`, `coroutine`, `os.date`/`os.difftime` and `_G`, so a UDF using them
    worked on the server and failed with 'attempt to index a nil value' here."""
    assert client.apply((ns, set_name, "s"), "aq_contract", "stdlib", []) == [5, 7, "number", True]


def test_operate_increment_read_and_list_ops(client, ns, set_name):
    key = (ns, set_name, "op")
    _, meta, bins = client.operate(key, [op.increment("n", 5), op.read("n")])
    assert (meta["gen"], bins) == (1, {"n": 5})
    assert client.operate(key, [lo.list_append_items("l", [1, 2, 3])])[2] == {"l": 3}
    assert client.operate(key, [lo.list_pop_range("l", 0, 2)])[2] == {"l": [1, 2]}
    with pytest.raises(ex.OpNotApplicable):
        client.operate(key, [lo.list_pop("l", 5)])
    _, _, ordered = client.operate_ordered(key, [op.increment("n", 1), op.read("n"), lo.list_size("l")])
    assert ordered == [("n", 6), ("l", 1)]



def test_map_put_items_and_remove_by_key_list_answer_as_the_server_does(client, ns, set_name):
    """The two map ops of the block records (aeroqueue/blocks.py), as observed on a server."""
    key = (ns, set_name, "map")
    kv, none, count = aerospike.MAP_RETURN_KEY_VALUE, aerospike.MAP_RETURN_NONE, aerospike.MAP_RETURN_COUNT
    client.put(key, {"c": 1})
    # No map bin yet: nil whatever the return type, nothing written.
    assert client.operate(key, [mo.map_remove_by_key_list("j", [1], kv)])[2] == {"j": None}
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [mo.map_remove_by_key_list("c", [1], kv)])
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [mo.map_put_items("c", {1: 1})])
    assert client.operate(key, [mo.map_put_items("j", {})])[2] == {"j": 0}
    assert client.operate(key, [mo.map_put_items("j", {5: ["a", {"p": 1}], 3: ["b", None], 9: ["c", "z"]})])[2] == {"j": 3}
    assert client.get(key)[2] == {"c": 1, "j": {3: ["b", None], 5: ["a", {"p": 1}], 9: ["c", "z"]}}
    # Removed and answered in key order, keys not in the map ignored.
    assert client.operate(key, [mo.map_remove_by_key_list("j", [5, 42, 3], kv)])[2] == {"j": [3, ["b", None], 5, ["a", {"p": 1}]]}
    assert client.operate(key, [mo.map_remove_by_key_list("j", [5], kv)])[2] == {"j": []}
    assert client.operate(key, [mo.map_put_items("j", {2: "x"}), mo.map_remove_by_key_list("j", [2, 9], count)])[2] == {"j": 2}
    _, meta, bins = client.operate(key, [mo.map_remove_by_key_list("j", [7], none)])
    assert (bins, meta["gen"]) == ({"j": None}, 8)  # every one a write, even when nothing goes
    assert client.get(key)[2] == {"c": 1, "j": {}}
    with pytest.raises(ex.RecordNotFound):
        client.operate((ns, set_name, "none"), [mo.map_remove_by_key_list("j", [1], kv)])
    with pytest.raises(ex.RecordNotFound):
        client.get((ns, set_name, "none"))


@pytest.mark.parametrize(("flags", "after"), [
    ("create_only", None),  # refused whole: ElementExistsError
    ("create_only|no_fail", {1: 0, 3: ["x"]}),  # none of them
    ("create_only|no_fail|partial", {1: 0, 2: ["b"], 3: ["x"]}),  # those not there
])
def test_map_put_items_create_only_keeps_the_entries_there(client, ns, set_name, flags, after):
    """How a loader's block write leaves a bury's marker alone (aeroqueue/blocks.py)."""
    key = (ns, set_name, f"map-{flags}")
    value = {"create_only": aerospike.MAP_WRITE_FLAGS_CREATE_ONLY, "no_fail": aerospike.MAP_WRITE_FLAGS_NO_FAIL,
             "partial": aerospike.MAP_WRITE_FLAGS_PARTIAL}
    policy = {"map_write_flags": sum(value[f] for f in flags.split("|"))}
    client.put(key, {"c": 1, "j": {1: 0, 3: ["x"]}})
    put = [mo.map_put_items("j", {1: ["a"], 2: ["b"]}, map_policy=policy)]
    if after is None:
        with pytest.raises(ex.ElementExistsError):
            client.operate(key, put)
        after = {1: 0, 3: ["x"]}
    else:
        assert client.operate(key, put)[2] == {"j": len(after)}
    assert client.get(key)[2] == {"c": 1, "j": after}
    # All new: every one is put, whatever the flags.
    client.put(key, {"c": 1, "j": {3: ["x"]}})
    assert client.operate(key, put)[2] == {"j": 3}
    assert client.get(key)[2]["j"] == {1: ["a"], 2: ["b"], 3: ["x"]}

def test_bitwise_set_is_idempotent_and_counts_exactly(client, ns, set_name):
    key = (ns, set_name, "bits")
    client.operate(key, [bw.bit_resize("b", 4)])
    one = bytearray([0x80])
    for bit in (0, 9, 9, 31, 0):  # repeats: a retried acknowledgement
        client.operate(key, [bw.bit_set("b", bit, 1, 1, one)])
    assert client.operate(key, [bw.bit_count("b", 0, 32)])[2] == {"b": 3}
    assert bytes(client.operate(key, [bw.bit_get("b", 8, 8)])[2]["b"]) == b"\x40"
    with pytest.raises(ex.OpNotApplicable):
        client.operate(key, [bw.bit_set("b", 40, 1, 1, one)])


def test_expression_filters_an_operation_out(client, ns, set_name):
    key = (ns, set_name, "x")
    client.put(key, {"head": 1, "tail": 2})
    room = xp.LT(xp.IntBin("head"), xp.IntBin("tail")).compile()
    assert client.operate(key, [op.increment("head", 1), op.read("head")], policy={"expressions": room})[2] == {"head": 2}
    with pytest.raises(ex.FilteredOut) as e:
        client.operate(key, [op.increment("head", 1)], policy={"expressions": room})
    assert e.value.code == 27
    # A missing bin makes the expression unknown: filtered out, never true.
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy={"expressions": xp.Eq(xp.IntBin("nobin"), 1).compile()})
    assert client.get(key)[2]["head"] == 2


def test_a_filter_is_not_applied_to_a_missing_record(client, ns, set_name):
    """A filtered write creates a missing record unless it is update-only (hotpath.py
    relies on update-only): the server answers the same in a batch."""
    queued = xp.Eq(xp.StrBin("state"), "queued").compile()
    client.operate((ns, set_name, "new"), [op.write("state", "x")], policy={"expressions": queued})
    assert client.get((ns, set_name, "new"))[2] == {"state": "x"}
    update = {"expressions": queued, "exists": aerospike.POLICY_EXISTS_UPDATE}
    with pytest.raises(ex.RecordNotFound):
        client.operate((ns, set_name, "none"), [op.write("state", "x")], policy=update)
    keys = [(ns, set_name, f"b{i}") for i in range(3)]
    client.put(keys[0], {"state": "queued"})
    client.put(keys[1], {"state": "done"})
    out = client.batch_operate(
        keys, [op.write("state", "claimed"), op.read("state")],
        policy_batch={"expressions": queued}, policy_batch_write={"exists": aerospike.POLICY_EXISTS_UPDATE},
    )
    assert [(r.result, r.record[2] if r.record else None) for r in out.batch_records] == [
        (0, {"state": "claimed"}), (27, None), (2, None)
    ]
    with pytest.raises(ex.RecordNotFound):
        client.get(keys[2])


def test_a_batch_writes_filter_applies_to_each_record_without_its_own(client, ns, set_name):
    """batch_write's batch policy filter is each record's unless the record's policy
    has a filter of its own (Backend.batch_write_codes sends one filter for all)."""
    queued = xp.Eq(xp.StrBin("state"), "queued").compile()
    done = xp.Eq(xp.StrBin("state"), "done").compile()
    keys = [(ns, set_name, f"w{i}") for i in range(6)]
    for i, key in enumerate(keys[:5]):
        client.put(key, {"state": "queued" if i % 2 else "done"})
    update = {"exists": aerospike.POLICY_EXISTS_UPDATE}
    own = {**update, "expressions": done}
    policies = [update, update, own, own, None, update]
    batch = BatchRecords([Write(key, [op.write("x", i)], policy=p) for i, (key, p) in enumerate(zip(keys, policies, strict=True))])
    out = client.batch_write(batch, {"expressions": queued})
    # 0 and 4: done, filtered by the batch's; 2: done, admitted by its own; 3: queued,
    # refused by its own; 1: queued, admitted; 5: missing and update-only.
    assert [r.result for r in out.batch_records] == [27, 0, 0, 27, 27, 2]
    assert [client.get(k)[2].get("x") for k in keys[:5]] == [None, 1, 2, None, None]
    with pytest.raises(ex.RecordNotFound):
        client.get(keys[5])
    # A UDF call in the batch: the same rule.
    calls = BatchRecords([Apply(keys[0], "aq_contract", "incr", ["n", 1]), Apply(keys[1], "aq_contract", "incr", ["n", 1]),
                          Apply(keys[0], "aq_contract", "incr", ["n", 10], policy={"expressions": done})])
    out = client.batch_write(calls, {"expressions": queued})
    assert [r.result for r in out.batch_records] == [27, 0, 0]
    assert [client.get(k)[2].get("n") for k in keys[:2]] == [10, 1]


def test_expression_ops_read_the_clock_and_the_bins(client, ns, set_name):
    """Expression writes and reads (hotpath.py's clock: last update + time since)."""
    key = (ns, set_name, "xw")
    client.put(key, {"state": "queued", "due": 3})
    now = xp.Add(xp.Div(xp.LastUpdateTime(), 1_000_000), xp.SinceUpdateTime())
    t0 = time.time() * 1000
    _, _, out = client.operate_ordered(key, [
        op.write("state", "claimed"), op.write("due", None), op.increment("att", 1),
        eo.expression_write("at", now.compile()), eo.expression_write("dl", xp.Add(now, 500).compile()),
        op.read("state"), eo.expression_read("gap", xp.Sub(xp.IntBin("dl"), xp.IntBin("at")).compile()),
    ])
    # An expression op makes every op answer, writes with nil. Each expression reads the
    # clock when it runs: the second may land a millisecond later (seen once in 900 runs).
    assert out[:6] == [("state", None), ("due", None), ("att", None), ("at", None), ("dl", None), ("state", "claimed")]
    assert out[6][0] == "gap" and out[6][1] in (500, 501)
    bins = client.get(key)[2]
    assert sorted(bins) == ["at", "att", "dl", "state"] and abs(bins["at"] - t0) < 5_000
    with pytest.raises(ex.OpNotApplicable) as e:  # an unknown value (a missing bin) fails the call
        client.operate(key, [eo.expression_write("y", xp.IntBin("nobin").compile())])
    assert e.value.code == 26


def test_a_batch_marks_records_unchanged_since_a_clock_with_their_own_bin(client, ns, set_name):
    """The sync's fast mark (sync/mark.py): the server's clock is a written record's
    LastUpdateTime; one batch of the same expression write (mark = done_at) with a
    filter "last update strictly before the clock" marks, update-only, exactly the
    records nothing wrote since: a record written after the clock, or in the clock's
    own millisecond, is filtered out (27), a missing one is not created (2)."""
    keys = [(ns, set_name, f"m{i}") for i in range(4)]
    client.put(keys[0], {"state": "done", "done_at": 111})
    client.put(keys[1], {"state": "dead", "done_at": 222})
    client.put(keys[2], {"state": "done", "done_at": 333})
    time.sleep(0.005)  # the clock is a later millisecond than the records before it
    clock_key = (ns, set_name, "clock")
    client.put(clock_key, {"at": 1})
    clock = client.operate(clock_key, [eo.expression_read("lut", xp.LastUpdateTime().compile())])[2]["lut"]
    assert clock % 1_000_000 == 0 and abs(clock / 1e6 - time.time() * 1000) < 5_000, "Unix ns, whole milliseconds"
    client.put(keys[2], {"done_at": 334})  # processed again after the clock (same millisecond or later)
    unchanged = xp.And(xp.BinExists("done_at"), xp.LT(xp.LastUpdateTime(), clock)).compile()
    out = client.batch_operate(
        keys, [eo.expression_write("mk", xp.IntBin("done_at").compile())],
        policy_batch={"expressions": unchanged}, policy_batch_write={"exists": aerospike.POLICY_EXISTS_UPDATE},
    )
    assert [r.result for r in out.batch_records] == [0, 0, 27, 2]
    assert [client.get(k)[2].get("mk") for k in keys[:3]] == [111, 222, None]
    with pytest.raises(ex.RecordNotFound):
        client.get(keys[3])
    # The mark is a write: the record's update time moves past the clock.
    with pytest.raises(ex.FilteredOut):
        client.get(keys[0], policy={"expressions": unchanged})


def test_since_update_time_is_measured_by_the_server(client, ns, set_name):
    key = (ns, set_name, "lut")
    client.put(key, {"a": 1})
    old = xp.GE(xp.SinceUpdateTime(), 60_000).compile()
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy={"expressions": old})
    fresh = xp.LT(xp.SinceUpdateTime(), 60_000).compile()
    assert client.get(key, policy={"expressions": fresh})[2] == {"a": 1}


def test_backend_wraps_errors_with_operation_and_key(backend: Backend, set_name):
    backend.put(set_name, "k", {"a": 1}, create_only=True)
    with pytest.raises(errors.RecordExists) as e:
        backend.put(set_name, "k", {"a": 1}, create_only=True)
    assert f"{set_name}/k" in str(e.value) and "put" in str(e.value)
    assert e.value.code == 5
    with pytest.raises(errors.GenerationConflict):
        backend.put(set_name, "k", {"a": 2}, gen=7)
    assert backend.get(set_name, "missing") is None
    assert backend.remove(set_name, "missing") is False
    rec = backend.get(set_name, "k")
    assert rec is not None and rec.gen == 1 and rec.ttl is None and rec.bins == {"a": 1}


def test_backend_remove_and_ttl_go_through_the_policy(backend: Backend, set_name):
    """Client 19 deprecates `meta` for a ttl and for remove's generation (the next
    major drops it): the backend passes both in the policy, without a warning, and
    the store honours them there."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        backend.put(set_name, "k", {"a": 1}, ttl=100)
        rec = backend.get(set_name, "k")
        assert rec is not None and rec.ttl is not None and 90 <= rec.ttl <= 100
        rec = backend.operate(set_name, "k", [op.write("b", 2)], ttl=50)
        assert rec.ttl is not None and 40 <= rec.ttl <= 50
        with pytest.raises(errors.GenerationConflict):
            backend.remove(set_name, "k", gen=rec.gen + 1)
        assert backend.get(set_name, "k") is not None, "a stale generation removes nothing"
        assert backend.remove(set_name, "k", gen=rec.gen) is True
    assert backend.get(set_name, "k") is None


@pytest.mark.parametrize("logic", ["And", "Or", "Exclusive"])
@pytest.mark.parametrize("operands", [0, 1])
def test_logic_of_fewer_than_two_operands_is_refused(client, ns, set_name, logic, operands):
    """The server refuses And, Or and Exclusive of one operand (sync --resync built
    one, and only the server failed): the stand-in must refuse it too."""
    key = (ns, set_name, "logic")
    client.put(key, {"a": 1})
    expr = getattr(xp, logic)(*[xp.Eq(xp.IntBin("a"), 1)] * operands).compile()
    with pytest.raises(ex.InvalidRequest) as info:
        client.get(key, {"expressions": expr})
    assert info.value.code == 4
    both = getattr(xp, logic)(xp.Eq(xp.IntBin("a"), 1), xp.Eq(xp.IntBin("a"), 2)).compile()
    if logic != "And":
        assert client.get(key, {"expressions": both})[2] == {"a": 1}


def test_a_string_ends_at_its_first_nul_in_values_map_keys_and_record_keys(client, ns, set_name):
    """The client sends a string up to its first NUL: 'a\\x00b' is stored as 'a', in a
    bin, a list, a map key, and a record key (whose digest is the key 'a''s)."""
    client.put((ns, set_name, "n\x00ul"), {"v": "a\x00b", "l": ["p\x00q", "r"], "m": {"k\x00z": "x\x00y"}})
    _, _, bins = client.get((ns, set_name, "n"))
    assert bins == {"v": "a", "l": ["p", "r"], "m": {"k": "x"}}
    client.operate((ns, set_name, "n"), [op.write("w", "c\x00d")])
    assert client.get((ns, set_name, "n\x00other"))[2]["w"] == "c"


def test_writes_the_client_or_server_refuse(client, ns, set_name):
    """What a real server (and its client) answers to writes aeroqueue's own code never
    makes, so that the embedded store cannot let such a write through unnoticed."""
    key = (ns, set_name, "w")
    with pytest.raises(ex.InvalidRequest):  # a write of no bins
        client.put(key, {})
    with pytest.raises(ex.RecordNotFound):  # only deletes, of a record that is not there
        client.put(key, {"a": None})
    with pytest.raises(ex.ParamError):
        client.put(key, {"n": 2**63})
    with pytest.raises(ex.ParamError):
        client.put(key, {"t": (1, 2)})
    client.put(key, {"n": 2**63 - 1, "m": -(2**63)})
    with pytest.raises(ex.ParamError):
        client.operate(key, [])
    for ttl in (10 * 365 * 86_400 + 1, -4):  # past ten years (a negative is a huge ttl on the wire)
        with pytest.raises(ex.InvalidRequest):
            client.put(key, {"a": 1}, meta={"ttl": ttl})
    client.operate(key, [op.touch(100)])
    assert 90 <= client.get(key)[1]["ttl"] <= 100, "a touch's ttl is the record's"
    client.put(key, {"a": 2}, meta={"ttl": 2**32})  # 0 on the wire: the namespace's default, never here
    assert client.get(key)[1]["ttl"] == aerospike.TTL_NEVER_EXPIRE & 0xFFFFFFFF
    assert client.get(key)[2] == {"n": 2**63 - 1, "m": -(2**63), "a": 2}


# Each refused value in a process of its own: once the real client (19.3) has refused
# a UDF argument it cannot serialize, its heap is corrupt, and a later call aborts the
# process ("malloc(): unaligned tcache chunk detected").
_SEND = """
import json, os, sys
from aerospike import exception as ex
from aerospike_helpers.operations import operations as op
from aeroqueue.backends import open_backend
url, set_name, call, value = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
backend = open_backend(url)
client, key = backend.client, (backend.namespace, set_name, "v")
client.put(key, {"a": 1})
try:
    if call == "operate":
        client.operate(key, [op.write("b", value)])
    elif call == "apply":
        client.apply(key, "aq_contract", "now", [value])
    elif call == "batch_apply":
        client.batch_apply([key], "aq_contract", "now", [value])
    elif call == "batch_operate":
        client.batch_operate([key], [op.write("b", value)])
    else:
        from aerospike_helpers.batch.records import Apply, BatchRecords, Write
        client.batch_write(BatchRecords([Write(key, [op.write("b", value)]), Apply(key, "aq_contract", "now", [1])]))
    out = ["sent", None]
except ex.AerospikeError as e:
    out = [type(e).__name__, e.code]
out.append(client.get(key)[2])
print(json.dumps(out), flush=True)
os._exit(0)
"""


@pytest.mark.parametrize("call", ["operate", "apply", "batch_apply", "batch_operate", "batch_write"])
@pytest.mark.parametrize(("value", "refused"), [
    ("(1, 2)", ["ClientError", -1]),
    ("{'k': {1}}", ["ClientError", -1]),
    ("[1, object()]", ["ClientError", -1]),
    ("2**64", ["ParamError", -2]),
])
def test_values_the_client_cannot_send_are_refused_before_anything_is_sent(
    client, store_url, set_name, call, value, refused
):
    """A tuple, a set or an object anywhere in a value, or an integer past 64 bits, in
    an operation or a UDF's arguments: the client refuses the call and sends nothing
    (the embedded store had stored a tuple as a list)."""
    run = subprocess.run([sys.executable, "-c", _SEND, store_url, set_name, call, value],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout) == [*refused, {"a": 1}]


_NAMES = """
import json, sys
from aeroqueue import keys
from aeroqueue.backends import open_backend
from aeroqueue.errors import InvalidText
backend = open_backend(sys.argv[1])
set_name = sys.argv[2]
calls = {
    "get": lambda: backend.get(set_name, "k\\udcff"),
    "put": lambda: backend.put(set_name, "k\\udcff", {"a": 1}),
    "apply": lambda: backend.apply(set_name, "\\udcff", keys.SESS_MOD, "beat", 1),
    "batch_bins": lambda: backend.batch_bins(set_name, ["ok", "k\\udcff"], ["a"]),
    "batch_same": lambda: backend.batch_same_codes(set_name, ["ok", "k\\udcff"], []),
}
out = {}
for what, call in calls.items():
    try:
        call()
        out[what] = "sent"
    except InvalidText as e:
        out[what] = str(e)
print(json.dumps(out))
"""


def test_a_record_name_that_is_not_utf8_is_refused_not_a_crash(store_url, set_name):
    """A name holding bytes of another encoding (a job id typed in a Latin-1 terminal
    reaches Python as lone surrogates) crashed the aerospike client's C code, on the
    server's client and the embedded store's alike: a segfault, the process gone with
    no word. Each way in refuses it, naming it; in a process of its own, so that a
    crash fails this test and not the suite."""
    run = subprocess.run([sys.executable, "-c", _NAMES, store_url, set_name], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, f"status {run.returncode}: {run.stderr[-2000:]}"
    refused = json.loads(run.stdout)
    assert set(refused) == {"get", "put", "apply", "batch_bins", "batch_same"}
    for what, said in refused.items():
        assert "is not valid UTF-8 text" in said and "udcff" in said and set_name in said, (what, said)
