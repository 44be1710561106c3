"""LuaRuntime against what a real Aerospike 8.1 server answered (observed.json),
plus the runtime's own guarantees: isolation, caching, conversions, threads.

The observed file and the probe module obs.lua live in ../shared/observed
(next to the repository) or in $AEROQUEUE_OBSERVED_DIR; the tests that need
them skip when they are missing.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from aeroqueue.backends.embedded.lua_runtime import LuaRuntime
from aeroqueue.backends.embedded.types import (
    CITRUSLEAF_EPOCH_MS,
    RecordView,
    UdfFailure,
    UdfOutcome,
)

NOW = 1_750_000_000_000
DIGEST = bytes(range(20))


def _observed_dir() -> Path | None:
    candidates = [os.environ.get("AEROQUEUE_OBSERVED_DIR"), Path(__file__).resolve().parents[3] / "shared" / "observed"]
    for c in candidates:
        if c and (Path(c) / "observed.json").exists() and (Path(c) / "obs.lua").exists():
            return Path(c)
    return None


OBSERVED_DIR = _observed_dir()
needs_observed = pytest.mark.skipif(OBSERVED_DIR is None, reason="observed.json / obs.lua not found")


@pytest.fixture(scope="module")
def rt() -> LuaRuntime:
    return LuaRuntime()


@pytest.fixture(scope="module")
def obs() -> str:
    assert OBSERVED_DIR is not None
    return (OBSERVED_DIR / "obs.lua").read_text()


@pytest.fixture(scope="module")
def observed() -> dict[tuple[str, str], dict]:
    assert OBSERVED_DIR is not None
    data = json.loads((OBSERVED_DIR / "observed.json").read_text())
    return {(name, s["step"]): s for name, steps in data["scenarios"].items() for s in steps}


def rec(bins: dict | None = None, *, exists: bool = True, gen: int = 1, void_time_ms: int = 0,
        key: Any = None, set_name: str = "obs", now: int = NOW) -> RecordView:
    return RecordView(
        exists=exists, bins=dict(bins or {}) if exists else {}, gen=gen if exists else 0,
        void_time_ms=void_time_ms if exists else 0, last_update_ms=now - 1000 if exists else 0,
        digest=DIGEST, set_name=set_name, user_key=key, now_ms=now,
    )


def missing() -> RecordView:
    return rec(exists=False)


def norm(v: Any) -> Any:
    """observe.py's normalisation of client results to JSON."""
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": bytes(v).hex()}
    if isinstance(v, dict):
        return {str(k): norm(x) for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))}
    if isinstance(v, (list, tuple)):
        return [norm(x) for x in v]
    if isinstance(v, float):
        return {"float": v}
    return v


def server_message(msg: str) -> str:
    """The observed message without the node prefix and the server's Lua directory."""
    msg = re.sub(r"^\S+:\d+ ", "", msg)
    return re.sub(r"\S*/(?=obs\.lua:)", "", msg)


def run(rt: LuaRuntime, src: str, function: str, record: RecordView, *args: Any, module: str = "obs") -> UdfOutcome:
    return rt.call(module, src, f"hash-{module}-{hash(src)}", function, record, list(args))


def expect_result(observed: dict, scenario: str, step: str) -> Any:
    entry = observed[(scenario, step)]
    assert "result" in entry, entry
    return entry["result"]


def expect_failure(observed: dict, scenario: str, step: str) -> str:
    entry = observed[(scenario, step)]
    assert entry["raised"]["code"] == 100, entry
    return server_message(entry["raised"]["msg"])


def observed_bins(observed: dict, scenario: str, step: str) -> dict:
    return expect_result(observed, scenario, step)["bins"]


# ---------------------------------------------------------------------------
# Values, errors and record semantics as the server answered them

VALUE_STEPS = [
    ("10 / 2", "div", (10, 2)),
    ("7 // 2", "idiv", (7, 2)),
    ("types", "types", ()),
    ("nil", "ret_nil", ()),
    ("lua table", "ret_table", ()),
    ("map", "ret_map", ()),
    ("bytes", "ret_bytes", ()),
    ("take/drop 0", "take_drop", (0,)),
    ("take/drop 2", "take_drop", (2,)),
    ("take/drop 5", "take_drop", (5,)),
    ("list ops", "list_ops", ()),
    ("map nil vs remove", "map_nil", ()),
    ("server time", "now", ()),
    ("libs", "libs", ()),
    ("float arg", "div", (1.5, 0.5)),
]


@needs_observed
@pytest.mark.parametrize(("step", "function", "args"), VALUE_STEPS)
def test_values_match_the_server(rt, obs, observed, step, function, args):
    out = run(rt, obs, function, rec({"l": [1, 2]}), *args)
    assert norm(out.result) == expect_result(observed, "udf_values", step)
    assert out.action == "none"


ERROR_STEPS = [
    ("udf_errors", "error level 0", "err_level0", ()),
    ("udf_errors", "error level 1", "err_level1", ()),
    ("udf_errors", "error with a table", "err_table", ()),
    ("udf_errors", "unknown function", "no_such_function", ()),
    ("udf_errors", "assign a Lua table to a bin", "bad_bin_value", ()),
    ("udf_values", "string arg / number", "div", ("a", 2)),
]


@needs_observed
@pytest.mark.parametrize(("scenario", "step", "function", "args"), ERROR_STEPS)
def test_errors_match_the_server(rt, obs, observed, scenario, step, function, args):
    with pytest.raises(UdfFailure) as failure:
        run(rt, obs, function, rec({"a": 1}), *args)
    assert failure.value.message == expect_failure(observed, scenario, step)


@needs_observed
def test_meta_of_a_record_stored_with_its_key(rt, obs, observed):
    out = run(rt, obs, "meta", rec({"a": 1}, gen=1, key="sendkey"))
    assert norm(out.result) == expect_result(observed, "send_key", "udf meta")


@needs_observed
def test_meta_of_a_record_stored_without_its_key(rt, obs, observed):
    out = run(rt, obs, "meta", rec({"l": [1, 2]}, gen=2))
    assert norm(out.result) == expect_result(observed, "udf_values", "meta")


@needs_observed
def test_apply_on_a_missing_record_sees_exists_false(rt, obs, observed):
    out = run(rt, obs, "exists", missing())
    assert out.result is expect_result(observed, "missing_record", "apply on missing, exists()")
    assert out.action == "none"


@needs_observed
def test_commit_and_rollback(rt, obs, observed):
    scenario = "udf_commit_rollback"
    created = run(rt, obs, "set_and_update", missing(), "a", 1)
    assert created.result == expect_result(observed, scenario, "set_and_update on missing (creates)")
    assert (created.action, norm(created.bins)) == ("write", observed_bins(observed, scenario, "get"))

    stored = rec({"a": 1})
    staged_only = run(rt, obs, "set_no_update", stored, "a", 2)
    assert staged_only.result == expect_result(observed, scenario, "set_no_update")
    assert staged_only.action == "none"

    with pytest.raises(UdfFailure) as failure:
        run(rt, obs, "set_then_error", stored, "a", 3)
    assert failure.value.message == expect_failure(observed, scenario, "set_then_error")

    many = run(rt, obs, "gen_after_many_updates", stored)
    assert many.result == expect_result(observed, scenario, "gen_after_many_updates")
    assert (many.action, norm(many.bins)) == ("write", observed_bins(observed, scenario, "get (gen +1 once)"))


@needs_observed
def test_create_update_remove_outcomes(rt, obs, observed):
    scenario = "udf_create_then_error"
    with pytest.raises(UdfFailure) as failure:
        run(rt, obs, "create_then_error", missing(), "a", 1)
    assert failure.value.message == expect_failure(observed, scenario, "create_then_error")

    twice = run(rt, obs, "create_twice", missing())
    assert twice.result == expect_result(observed, scenario, "create_twice")
    assert (twice.action, twice.bins) == ("write", {"a": 1})

    upd = run(rt, obs, "update_missing", missing())
    assert upd.result == expect_result(observed, scenario, "update_missing")
    assert upd.action == "none"

    assert run(rt, obs, "exists", rec({"a": 1})).result is expect_result(observed, scenario, "exists")

    removed = run(rt, obs, "remove", rec({"a": 1}))
    assert removed.result == expect_result(observed, scenario, "remove")
    assert (removed.action, removed.bins) == ("remove", None)


@needs_observed
def test_long_bin_name_is_dropped(rt, obs, observed):
    out = run(rt, obs, "long_bin_name", rec({"a": 1}))
    assert out.result == expect_result(observed, "udf_errors", "16-char bin name in UDF")
    assert (out.action, norm(out.bins)) == ("write", observed_bins(observed, "udf_errors", "get"))


@needs_observed
def test_in_place_list_change_is_not_written(rt, obs, observed):
    out = run(rt, obs, "inplace_list", rec({"l": [1, 2]}))
    assert out.result == expect_result(observed, "udf_values", "in-place list change, no reassign")
    # update() with nothing staged still writes (a touch): generation + 1, same bins
    assert out.action == "write"
    assert norm(out.bins) == observed_bins(observed, "udf_values", "get (list bin after in-place change)")


@needs_observed
def test_set_ttl(rt, obs, observed):
    out = run(rt, obs, "set_ttl", rec({"a": 1}), 100)
    assert out.result == expect_result(observed, "ttl", "udf set_ttl 100")
    assert (out.action, out.ttl) == ("write", expect_result(observed, "ttl", "get meta ttl after udf"))


@needs_observed
def test_claim_as_in_the_batch_scenarios(rt, obs, observed):
    batch = expect_result(observed, "batch_apply", "claim over q, c, missing, q")["records"]
    answers = [r["record"]["bins"]["SUCCESS"] for r in batch]
    records = [rec({"state": "q"}), rec({"state": "c"}), missing(), rec({"state": "q"})]
    outcomes = [run(rt, obs, "claim", r, "s1") for r in records]
    assert [o.result for o in outcomes] == answers
    assert [o.action for o in outcomes] == ["write", "none", "none", "write"]
    assert outcomes[0].bins == {"state": "c", "sess": "s1"}

    on_missing = expect_result(observed, "batch_missing", "batch_apply on missing (claim)")["records"]
    assert run(rt, obs, "claim", missing(), "s").result == on_missing[0]["record"]["bins"]["SUCCESS"]
    exists = expect_result(observed, "batch_missing", "batch_apply on missing (exists)")["records"]
    assert run(rt, obs, "exists", missing()).result is exists[0]["record"]["bins"]["SUCCESS"]


# ---------------------------------------------------------------------------
# Record semantics from the server's source (udf_record.c, udf_aerospike.c)

REC_UDFS = """
function staged_after_update(rec)
  rec['a'] = 1
  aerospike:update(rec)
  rec['b'] = 2          -- staged after the last update: not written
  return record.numbins(rec)
end
function numbins_counts_written_bins_only(rec)
  rec['new'] = 1
  local before = record.numbins(rec)
  aerospike:update(rec)
  return list{before, record.numbins(rec)}
end
function delete_bin(rec, name)
  rec[name] = nil
  aerospike:update(rec)
  return rec[name] == nil
end
function read_twice(rec)
  local l1 = rec['l']
  list.append(l1, 3)
  return list.size(rec['l'])
end
function snapshot_at_update(rec)
  local l = list{1}
  rec['l'] = l
  aerospike:update(rec)
  list.append(l, 2)      -- after update: the record keeps [1]
  return list.size(rec['l'])
end
function remove_then_exists(rec)
  aerospike:remove(rec)
  return list{aerospike:exists(rec), record.numbins(rec), rec['a'] == nil}
end
function remove_then_write(rec)
  aerospike:remove(rec)
  rec['z'] = 9
  aerospike:update(rec)
  return 0
end
function create_existing(rec)
  rec['x'] = 1
  return aerospike:create(rec)
end
function meta_values(rec)
  return list{record.gen(rec), record.ttl(rec), record.last_update_time(rec),
              aerospike:get_current_time(), record.setname(rec), record.key(rec),
              record.digest(rec)}
end
function names(rec)
  local out = list()
  for _, n in ipairs(record.bin_names(rec)) do list.append(out, n) end
  return out
end
function ttl_of(rec, t)
  record.set_ttl(rec, t)
  return 0
end
function long_name_read(rec)
  return rec['abcdefghijklmnop'] == nil
end
function numeric_bin_name(rec)
  rec[7] = 'seven'
  aerospike:update(rec)
  return rec['7']
end
function nil_and_missing(rec, a, b, c)
  return list{a == nil, b == nil, c == nil}
end
function echo(rec, v)
  return v
end
function copy_bin(rec, from, to)
  rec[to] = rec[from]
  aerospike:update(rec)
  return rec[to]
end
"""


def test_staged_writes_after_the_last_update_are_not_written(rt):
    out = run(rt, REC_UDFS, "staged_after_update", rec({"k": 0}), module="recs")
    assert out.result == 2
    assert out.bins == {"k": 0, "a": 1}


def test_numbins_counts_bins_written_by_update(rt):
    out = run(rt, REC_UDFS, "numbins_counts_written_bins_only", rec({"k": 0}), module="recs")
    assert out.result == [1, 2]


def test_nil_deletes_a_bin(rt):
    out = run(rt, REC_UDFS, "delete_bin", rec({"a": 1, "b": 2}), "a", module="recs")
    assert out.result is True
    assert (out.action, out.bins) == ("write", {"b": 2})


def test_deleting_the_last_bin_removes_the_record(rt):
    out = run(rt, REC_UDFS, "delete_bin", rec({"a": 1}), "a", module="recs")
    assert (out.action, out.bins) == ("remove", None)


def test_a_read_is_cached_for_the_call(rt):
    # udf_record_get caches what it read: the second read sees the change
    out = run(rt, REC_UDFS, "read_twice", rec({"l": [1, 2]}), module="recs")
    assert out.result == 3
    assert out.action == "none"


def test_written_value_is_a_copy_taken_at_update(rt):
    out = run(rt, REC_UDFS, "snapshot_at_update", rec({"k": 1}), module="recs")
    assert out.result == 2  # the cached Lua object changed...
    assert out.bins == {"k": 1, "l": [1]}  # ...the record did not


def test_remove_deletes_the_bins_and_the_record_after_the_call(rt):
    out = run(rt, REC_UDFS, "remove_then_exists", rec({"a": 1, "b": 2}), module="recs")
    assert out.result == [True, 0, True]
    assert out.action == "remove"


def test_bins_written_after_remove_keep_the_record(rt):
    out = run(rt, REC_UDFS, "remove_then_write", rec({"a": 1}), module="recs")
    assert (out.action, out.bins) == ("write", {"z": 9})


def test_create_on_an_existing_record_returns_1_and_writes_nothing(rt):
    out = run(rt, REC_UDFS, "create_existing", rec({"a": 1}), module="recs")
    assert (out.result, out.action) == (1, "none")


def test_record_metadata(rt):
    r = rec({"a": 1}, gen=7, void_time_ms=NOW + 90_500, key="k1", set_name="aq_job")
    out = run(rt, REC_UDFS, "meta_values", r, module="recs")
    assert out.result == [7, 91, NOW - 1000 - CITRUSLEAF_EPOCH_MS, NOW, "aq_job", "k1", bytearray(DIGEST)]


def test_record_metadata_of_a_missing_record(rt):
    out = run(rt, REC_UDFS, "meta_values", missing(), module="recs")
    # list{...} skips the nils of setname and key, as the server's does
    assert out.result == [0, 0, 0, NOW, bytearray(DIGEST)]


def test_bytes_user_key(rt):
    out = run(rt, REC_UDFS, "meta_values", rec({"a": 1}, key=b"\x00\xffk"), module="recs")
    assert out.result[5] == bytearray(b"\x00\xffk")


def test_bin_names(rt):
    out = run(rt, REC_UDFS, "names", rec({"b": 1, "a": 2}), module="recs")
    assert out.result == ["b", "a"]
    assert run(rt, REC_UDFS, "names", missing(), module="recs").result == []


@pytest.mark.parametrize(("given", "ttl"), [(100, 100), (-1, -1), (-2, -2), (0xFFFFFFFF, -1), (0, 0)])
def test_set_ttl_values(rt, given, ttl):
    assert run(rt, REC_UDFS, "ttl_of", rec({"a": 1}), given, module="recs").ttl == ttl


def test_no_set_ttl_leaves_ttl_none(rt):
    assert run(rt, REC_UDFS, "echo", rec({"a": 1}), 1, module="recs").ttl is None


def test_long_bin_names_read_as_nil(rt):
    out = run(rt, REC_UDFS, "long_name_read", rec({"abcdefghijklmnop": 1}), module="recs")
    assert out.result is True


def test_numeric_bin_name_is_a_string(rt):
    out = run(rt, REC_UDFS, "numeric_bin_name", rec({"a": 1}), module="recs")
    assert (out.result, out.bins) == ("seven", {"a": 1, "7": "seven"})


def test_missing_args_are_nil(rt):
    assert run(rt, REC_UDFS, "nil_and_missing", rec({"a": 1}), 1, module="recs").result == [False, True, True]
    assert run(rt, REC_UDFS, "nil_and_missing", rec({"a": 1}), 1, None, 3, module="recs").result == [False, True, False]


# ---------------------------------------------------------------------------
# Conversions

NESTED = {
    "i": -7, "f": 2.5, "whole_float": 5.0, "s": "h\u00e9llo", "t": True, "n": None,
    "l": [1, "two", [3, [4.0]], None, b"\x00\xff"],
    "m": {"x": 1, 2: [{"deep": b"AB"}], 2.5: "float key", b"\x01": "bytes key"},
}


def test_nested_list_and_map_round_trip_through_an_arg(rt):
    out = run(rt, REC_UDFS, "echo", rec({"a": 1}), NESTED, module="recs")
    expected = dict(NESTED)
    expected["l"] = [1, "two", [3, [4.0]], None, bytearray(b"\x00\xff")]
    expected["m"] = {"x": 1, 2: [{"deep": bytearray(b"AB")}], 2.5: "float key", b"\x01": "bytes key"}
    assert out.result == expected
    assert isinstance(out.result["whole_float"], float)


def test_nested_bins_round_trip_through_a_write(rt):
    bins = {"l": [1, [2, {"k": [3]}], "x"], "m": {"a": {"b": [1, 2]}, 1: None}}
    for name in bins:
        out = run(rt, REC_UDFS, "copy_bin", rec(bins), name, name + "2", module="recs")
        assert out.result == bins[name]
        assert out.bins == {**bins, name + "2": bins[name]}


def test_bytes_round_trip(rt):
    blob = bytes(range(256)) * 3
    out = run(rt, REC_UDFS, "copy_bin", rec({"b": blob}), "b", "c", module="recs")
    assert out.result == bytearray(blob)
    assert isinstance(out.result, bytearray)
    assert out.bins["c"] == bytearray(blob)
    utf8_blob = "héllo".encode()
    assert run(rt, REC_UDFS, "echo", rec({"a": 1}), utf8_blob, module="recs").result == bytearray(utf8_blob)


def test_large_lists_round_trip(rt):
    ids = [f"job-{i}" for i in range(20_000)]
    mixed = [i if i % 3 else str(i) for i in range(10_000)]
    out = run(rt, REC_UDFS, "copy_bin", rec({"ids": ids, "mixed": mixed}), "ids", "copy", module="recs")
    assert out.bins["copy"] == ids
    assert run(rt, REC_UDFS, "echo", rec({"a": 1}), mixed, module="recs").result == mixed


def test_strings_end_at_nul(rt):
    assert run(rt, REC_UDFS, "echo", rec({"a": 1}), "ab\x00cd", module="recs").result == "ab"


def test_non_utf8_strings_reach_python_replaced(rt):
    src = "function f(rec) return list{string.char(104, 255, 105)} end"
    assert run(rt, src, "f", rec({"a": 1}), module="bad_utf8").result == ["h\ufffdi"]


def test_unsupported_python_value_is_a_type_error(rt):
    with pytest.raises(TypeError):
        run(rt, REC_UDFS, "echo", rec({"a": 1}), {1, 2}, module="recs")


# ---------------------------------------------------------------------------
# list, map and bytes

API_UDFS = """
function list_edges(rec)
  local l = list{1, 2, 3}
  l[6] = 6                       -- grows with nil slots
  local grown = list.size(l)
  list.remove(l, 10)             -- out of range: no-op
  list.insert(l, 1, 'first')
  local l2 = list.merge(l, list{7})
  list.concat(l, list{8})
  local c = list.clone(l)
  list.append(c, 'only in clone')
  local seen = list()
  for v in list.iterator(list{'a', 'b'}) do list.append(seen, v) end
  return map{grown = grown, l = l, merged = l2, n = #l, clone_n = #c, seen = seen,
             str = tostring(list{1, 'a', 2.5, true}), created = list.create(3) ~= nil,
             typ = type(l), oob = l[100], zero = l[0], take_nil = list.take(l, -1) == nil}
end

function map_edges(rec)
  local m = map{a = 1}
  m[1] = 'int'
  m[1.5] = 'float'
  m[bytes(0)] = 'empty bytes key'
  m.gone = 1
  m.gone = {}                   -- a value Aerospike cannot hold removes the key
  local keys, values, pairs_n = list(), 0, 0
  for k in map.keys(m) do list.append(keys, k) end
  for v in map.values(m) do values = values + 1 end
  for k, v in map.pairs(m) do pairs_n = pairs_n + 1 end
  local merged = map.merge(map{a = 1, b = 2}, map{b = 10, c = 3}, function(x, y) return x + y end)
  local diff = map.diff(map{a = 1, b = 2}, map{b = 9, c = 3})
  return map{size = map.size(m), len = #m, keys = keys, values = values, pairs_n = pairs_n,
             merged = merged, diff = diff, str = tostring(map{a = 1}), typ = type(m),
             int_is_not_float = m[1] ~= m[1.0] or m[1] == 'int'}
end

function bytes_edges(rec)
  local b = bytes(8)
  local empty_size = bytes.size(b)
  bytes.set_int16(b, 1, -2)
  bytes.set_int32_le(b, 3, 0x01020304)
  bytes.append_byte(b, 255)
  local vi = bytes.append_var_int(b, 300)
  local v, used = bytes.get_var_int(b, 8)
  b[12] = 7
  return map{empty_size = empty_size, size = bytes.size(b), i16 = bytes.get_int16(b, 1),
             i32le = bytes.get_int32_le(b, 3), i32be = bytes.get_int32(b, 3), last = b[12],
             past_end = b[13] == nil, vi = vi, v = v, used = used, len_op = #b,
             str = tostring(bytes.get_bytes(b, 1, 2)), blob = b, typ = type(b),
             bad = bytes.set_byte(b, 1, 256), i64 = bytes.get_int64(b, 1)}
end

function sandbox(rec)
  return map{load = type(load), require = type(require), io = type(io), package = type(package),
             dofile = type(dofile), loadstring = type(loadstring), unpack = type(unpack),
             os_exit = type(os.exit), os_time = type(os.time), info = type(info), trace = type(trace),
             warn = type(warn), setmetatable_on_list = pcall(setmetatable, list(), {}),
             next_on_map = pcall(next, map()), logged = debug('%s %d', 'x', 1) == nil,
             gvar = type(helper_global)}
end
"""


def test_list_api(rt):
    r = run(rt, API_UDFS, "list_edges", rec({"a": 1}), module="api").result
    assert r["grown"] == 6
    assert r["l"] == ["first", 1, 2, 3, None, None, 6, 8]
    assert r["merged"] == ["first", 1, 2, 3, None, None, 6, 7]
    assert (r["n"], r["clone_n"]) == (8, 9)
    assert r["seen"] == ["a", "b"]
    assert r["str"] == '[1, "a", 2.5, true]'
    assert r["created"] is True
    assert r["typ"] == "userdata"
    assert "oob" not in r and "zero" not in r
    assert r["take_nil"] is True


def test_map_api(rt):
    r = run(rt, API_UDFS, "map_edges", rec({"a": 1}), module="api").result
    assert (r["size"], r["len"], r["values"], r["pairs_n"]) == (4, 4, 4, 4)
    assert r["keys"] == [1, "a", bytearray(), 1.5]  # key order: integer, string, bytes, double
    assert r["merged"] == {"a": 1, "b": 12, "c": 3}
    assert r["diff"] == {"a": 1, "c": 3}
    assert r["str"] == '{"a":1}'
    assert r["typ"] == "userdata"
    assert r["int_is_not_float"] is True


def test_bytes_api(rt):
    r = run(rt, API_UDFS, "bytes_edges", rec({"a": 1}), module="api").result
    assert r["empty_size"] == 0  # bytes(n) only reserves capacity
    assert r["size"] == 12
    assert (r["i16"], r["i32le"], r["i32be"]) == (-2, 0x01020304, 0x04030201)
    assert (r["last"], r["past_end"]) == (7, True)
    assert (r["vi"], r["v"], r["used"]) == (2, 300, 2)
    assert r["len_op"] == 0  # the server's __len quirk: use bytes.size
    assert r["str"] == "FF FE"
    assert r["blob"] == bytearray(b"\xff\xfe\x04\x03\x02\x01\xff\xac\x02\x00\x00\x07")
    assert r["typ"] == "userdata"
    assert r["bad"] is False
    assert r["i64"] == int.from_bytes(b"\xff\xfe\x04\x03\x02\x01\xff\xac", "big", signed=True)


def test_sandbox(rt):
    r = run(rt, API_UDFS, "sandbox", rec({"a": 1}), module="api").result
    for name in ("load", "require", "io", "package", "dofile", "loadstring", "unpack", "os_exit", "gvar"):
        assert r[name] == "nil", name
    for name in ("os_time", "info", "trace", "warn"):
        assert r[name] == "function", name
    assert r["setmetatable_on_list"] is False
    assert r["next_on_map"] is False
    assert r["logged"] is True


def test_list_index_errors_point_at_the_udf(rt):
    src = "function f(rec)\n  local l = list()\n  return l.x\nend"
    with pytest.raises(UdfFailure) as failure:
        run(rt, src, "f", rec({"a": 1}), module="idx")
    assert failure.value.message == "idx.lua:3: bad argument #2 to 'index' (number expected, got string)"


def test_wrong_object_argument(rt):
    # (not in a tail call: that would drop the UDF's frame and its position)
    src = "function f(rec)\n  local n = list.size(map())\n  return n\nend"
    with pytest.raises(UdfFailure) as failure:
        run(rt, src, "f", rec({"a": 1}), module="wrongarg")
    assert failure.value.message == "wrongarg.lua:2: bad argument #1 to 'size' (List expected, got Map)"


# ---------------------------------------------------------------------------
# Modules: isolation, caching, compile errors


def test_modules_do_not_share_globals(rt):
    one = "counter = 0\nfunction f(rec) counter = counter + 1; string.mine = 1; return counter end"
    two = "counter = 100\nfunction f(rec) return list{counter, string.mine == nil} end"
    assert run(rt, one, "f", rec({"a": 1}), module="one").result == 1
    assert run(rt, one, "f", rec({"a": 1}), module="one").result == 2
    assert run(rt, two, "f", rec({"a": 1}), module="two").result == [100, True]


def test_a_new_hash_recompiles_the_module(rt):
    r = rec({"a": 1})
    assert rt.call("cached", "function f(rec) return 1 end", "v1", "f", r, []).result == 1
    # same hash: the compiled module is reused
    assert rt.call("cached", "function f(rec) return 2 end", "v1", "f", r, []).result == 1
    assert rt.call("cached", "function f(rec) return 2 end", "v2", "f", r, []).result == 2


def test_syntax_error(rt):
    with pytest.raises(UdfFailure) as failure:
        rt.call("broken", "function f(rec)\n  return +\nend", "b1", "f", rec({"a": 1}), [])
    assert failure.value.message.startswith("broken.lua:2:")
    assert rt.compile_error("broken", "function f(rec)\n  return +\nend").startswith("broken.lua:2:")
    assert rt.compile_error("fine", "function f(rec) return 1 end") is None


def test_error_while_loading_the_module(rt):
    with pytest.raises(UdfFailure) as failure:
        rt.call("loadfail", "error('boom')", "l1", "f", rec({"a": 1}), [])
    assert failure.value.message == "loadfail.lua:1: boom"


def test_local_functions_are_not_udfs(rt):
    with pytest.raises(UdfFailure) as failure:
        rt.call("locals", "local function f(rec) return 1 end", "l1", "f", rec({"a": 1}), [])
    assert failure.value.message == "function not found"


# ---------------------------------------------------------------------------
# Threads


def test_threads_calling_at_once(rt):
    src = """
    function bump(rec, by)
      local n = rec['n'] + by
      rec['n'] = n
      aerospike:update(rec)
      return list{n, rec['tag']}
    end
    """
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(300):
                out = run(rt, src, "bump", rec({"n": i, "tag": f"t{t}"}), t, module="threads")
                assert out.result == [i + t, f"t{t}"]
                assert out.bins == {"n": i + t, "tag": f"t{t}"}
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
