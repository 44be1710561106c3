"""UDF behaviours aeroqueue relies on (aerospike-facts.md, "Lua UDFs")."""

from __future__ import annotations

import pytest
from aerospike import exception as ex
from aerospike_helpers.operations import operations as op

from aeroqueue import errors
from aeroqueue.backends import Backend

from .conftest import MODULE


def test_udf_commits_once_and_rolls_back_on_error(client, ns, set_name):
    key = (ns, set_name, "u")
    assert client.apply(key, MODULE, "incr", ["n", 1]) == 1
    assert client.apply(key, MODULE, "incr", ["n", 1]) == 2
    _, meta, bins = client.get(key)
    assert (meta["gen"], bins) == (2, {"n": 2})
    with pytest.raises(ex.UDFError):
        client.apply(key, MODULE, "stage_then_fail", [99])
    _, meta, bins = client.get(key)
    assert (meta["gen"], bins) == (2, {"n": 2}), "a UDF that raised must write nothing"


def test_error_level_0_reaches_python_as_udf_error_code_100(client, ns, set_name):
    key = (ns, set_name, "e")
    client.put(key, {"a": 1})
    with pytest.raises(ex.UDFError) as e:
        client.apply(key, MODULE, "fail_with", ["claim lost"])
    assert e.value.code == 100
    # The client puts the node address in front: match the end, never the whole.
    assert e.value.msg.endswith("claim lost")
    with pytest.raises(ex.UDFError) as e:
        client.apply(key, MODULE, "fail_located", [])
    assert e.value.msg.endswith("located") and "aq_contract.lua:" in e.value.msg
    with pytest.raises(ex.UDFError) as e:
        client.apply(key, MODULE, "no_such_function", [])
    assert e.value.msg.endswith("function not found")


def test_backend_wraps_udf_errors_keeping_the_lua_message(backend: Backend, client, set_name):
    with pytest.raises(errors.UDFError) as e:
        backend.apply(set_name, "k", MODULE, "fail_with", "claim lost")
    assert "claim lost" in str(e.value)
    assert f"{MODULE}.fail_with" in str(e.value) and f"{set_name}/k" in str(e.value)


@pytest.mark.parametrize("n", [0, -1])
def test_list_take_returns_nil_for_n_at_most_zero(client, ns, set_name, n):
    assert client.apply((ns, set_name, "t"), MODULE, "take", [n]) == {"is_nil": True}


def test_list_take_past_the_end_takes_everything(client, ns, set_name):
    assert client.apply((ns, set_name, "t"), MODULE, "take", [5]) == {"is_nil": False, "taken": [1, 2, 3]}


def test_division_is_float_and_floor_division_integer(client, ns, set_name):
    key = (ns, set_name, "d")
    half = client.apply(key, MODULE, "divide", [10, 2])
    assert half == 5.0 and isinstance(half, float)
    floor = client.apply(key, MODULE, "idivide", [7, 2])
    assert floor == 3 and isinstance(floor, int)


def test_server_clock_and_last_update_time(client, ns, set_name):
    import time

    key = (ns, set_name, "clock")
    now = client.apply(key, MODULE, "now", [])
    assert isinstance(now, int) and abs(now - time.time() * 1000) < 60_000
    client.put(key, {"a": 1})
    lut = client.apply(key, MODULE, "lut", [])
    citrusleaf_epoch_ms = 1262304000000
    assert abs(lut + citrusleaf_epoch_ms - time.time() * 1000) < 60_000


def test_batch_apply_result_shapes(client, ns, set_name):
    keys = [(ns, set_name, f"b{i}") for i in range(4)]
    client.put(keys[0], {"state": "q"})
    client.put(keys[1], {"state": "c"})
    client.put(keys[3], {"state": "q"})
    out = client.batch_apply(keys, MODULE, "claim", ["w1"])
    assert out.result == 0
    got = [(br.result, br.record[1]["gen"], br.record[2]) for br in out.batch_records]
    assert got == [
        (0, 2, {"SUCCESS": "ok"}),
        (0, 1, {"SUCCESS": "taken"}),
        (0, 0, {"SUCCESS": "missing"}),  # the UDF ran on a missing record
        (0, 2, {"SUCCESS": "ok"}),
    ]
    assert [br.key[2] for br in out.batch_records] == ["b0", "b1", "b2", "b3"]
    failed = client.batch_apply(keys[:2], MODULE, "fail_with", ["nope"])
    assert failed.result != 0
    # One record's error never raises: its code survives, its text is lost.
    assert [(br.result, br.record) for br in failed.batch_records] == [(100, None), (100, None)]


def test_backend_batch_apply(backend: Backend, client, set_name):
    backend.put(set_name, "a", {"state": "q"})
    out = backend.batch_apply(set_name, ["a", "a", "z"], MODULE, "claim", "w")
    assert [(r.name, r.ok, r.value) for r in out] == [("a", True, "ok"), ("a", True, "taken"), ("z", True, "missing")]
    bad = backend.batch_apply(set_name, ["a"], MODULE, "fail_with", "x")
    assert [(r.ok, r.code) for r in bad] == [(False, 100)]


def test_batch_write_applies_a_udf_with_each_records_own_arguments(backend: Backend, client, set_name):
    for name in ("a", "b"):
        backend.put(set_name, name, {"state": "q"})
    out = backend.batch_udf(set_name, [("a", ["w1"]), ("b", ["w2"]), ("z", ["w3"])], MODULE, "claim")
    assert [(r.name, r.ok, r.value) for r in out] == [("a", True, "ok"), ("b", True, "ok"), ("z", True, "missing")]
    assert backend.get(set_name, "a").bins["who"] == "w1" and backend.get(set_name, "b").bins["who"] == "w2"
    bad = backend.batch_udf(set_name, [("a", ["boom"])], MODULE, "fail_with")
    assert [(r.ok, r.code) for r in bad] == [(False, 100)]


def test_maps_are_walked_and_returned_in_key_order(client, ns, set_name):
    """The server keeps a map's keys in order, integers then strings (bytewise), for
    a map from the client and one made in Lua alike, whatever the order they came
    in: map.pairs walks them so, and a map bin comes back so (nested ones too)."""
    got = client.apply((ns, set_name, "m"), MODULE, "map_keys", [{"z": 1, 9: 1, "B": 1, -3: 1, "a": 1}])
    assert got == [-3, 9, "B", "a", "z", 1, 2, 5, "a", "b"]
    client.put((ns, set_name, "m"), {"p": {"z": 1, 10: 1, "a": {"y": 1, "b": 2}, -3: 2, "L": [{"q": 1, "c": 2}]}})
    bins = client.get((ns, set_name, "m"))[2]
    assert list(bins["p"]) == [-3, 10, "L", "a", "z"]
    assert list(bins["p"]["a"]) == ["b", "y"] and list(bins["p"]["L"][0]) == ["c", "q"]


def test_a_nil_in_a_list_or_map_constructor_leaves_no_slot(client, ns, set_name):
    """list{1, nil, 3} is a list of two on the server (aq_list_v1 builds list{item[1],
    item[2], item[4]} from schedule entries that may lack an item), and map{x = nil}
    has no key x."""
    got = client.apply((ns, set_name, "h"), MODULE, "holes", [])
    assert got == {"a": [1, 3], "c": [2], "m": {"y": 1}}


def test_writing_nil_to_the_last_bin_deletes_the_record(client, ns, set_name):
    """A record left without bins by an operate is gone, on both stores."""
    key = (ns, set_name, "one")
    client.put(key, {"a": 1})
    client.operate(key, [op.write("a", None)])
    assert client.exists(key)[1] is None
