"""The operate() interpreter against what a real Aerospike 8.1 server answered.

Op dicts are built with `aerospike_helpers`, exactly as callers (and
../shared/observed/observe.py) build them.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import warnings
from pathlib import Path
from typing import Any

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers.operations import bitwise_operations as bw
from aerospike_helpers.operations import list_operations as lo
from aerospike_helpers.operations import operations as op

from aeroqueue.backends.embedded.operations import run_operations, server_error
from aeroqueue.backends.embedded.types import OperateOutcome, RecordView

OBSERVED = Path(__file__).resolve().parents[3] / "shared" / "observed"

# bit_set/bit_insert/bit_or warn (at the caller's line) that value_byte_size is deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:value_byte_size is deprecated:DeprecationWarning")


def view(bins: dict[str, Any] | None = None, *, exists: bool = True) -> RecordView:
    return RecordView(
        exists=exists, bins=bins if bins is not None else {}, gen=1 if exists else 0,
        void_time_ms=0, last_update_ms=1_700_000_000_000 if exists else 0,
        digest=bytes(range(20)), set_name="obs", user_key=None, now_ms=1_700_000_001_000,
    )


def run(bins: dict[str, Any] | None, ops: list[dict], **kw: Any) -> OperateOutcome:
    return run_operations(view(bins), ops, **kw)


def answers(bins: dict[str, Any] | None, ops: list[dict]) -> dict[str, Any]:
    """What client.operate() would return as bins: the last answer per bin wins."""
    return dict(run(bins, ops).results)


def raises(code: int, cls: type[Exception], bins: dict[str, Any] | None, ops: list[dict]) -> Exception:
    with pytest.raises(cls) as info:
        run(bins, ops)
    assert info.value.code == code  # type: ignore[attr-defined]
    return info.value


# -- the observed "operate" scenario, step by step ------------------------------------

with warnings.catch_warnings():  # the op dicts are built at import time, outside the pytestmark
    warnings.simplefilter("ignore", DeprecationWarning)
    SCENARIO: list[tuple[str, list[dict], Any]] = [
        ("increment missing bin creates record", [op.increment("n", 5), op.read("n")], {"n": 5}),
        ("list append items", [lo.list_append_items("l", [1, 2, 3, 4])], {"l": 4}),
        ("list_pop index 1", [lo.list_pop("l", 1)], {"l": 2}),
        ("list_pop out of range", [lo.list_pop("l", 10)], (ex.OpNotApplicable, 26)),
        ("list_pop_range past end", [lo.list_pop_range("l", 1, 10)], {"l": [3, 4]}),
        ("list_pop on missing bin", [lo.list_pop("nol", 0)], {}),
        ("list_size", [lo.list_size("l")], {"l": 1}),
        ("operate_ordered", [op.increment("n", 1), op.read("n"), lo.list_size("l")], [("n", 6), ("l", 1)]),
        ("bit_resize 4", [bw.bit_resize("bits", 4)], {"bits": None}),
        ("bit_set 3 bits at 4", [bw.bit_set("bits", 4, 3, 1, bytearray([0xFF]))], {"bits": None}),
        ("bit_count", [bw.bit_count("bits", 0, 32)], {"bits": 3}),
        ("bit_set past end", [bw.bit_set("bits", 40, 1, 1, bytearray([0x80]))], (ex.OpNotApplicable, 26)),
        ("bit_get", [bw.bit_get("bits", 0, 8)], {"bits": bytearray(b"\x0e")}),
        ("touch", [op.touch()], {}),
    ]

# Whether each step bumps the generation (observed: gen 1, 2, 3, -, 4, 5, 5, 6, 7, 8, 8, -, 8, 9).
WROTE = [True, True, True, None, True, True, False, True, True, True, False, None, False, True]


def test_observed_operate_scenario_step_by_step() -> None:
    record = view({}, exists=False)
    for (step, ops, expected), wrote in zip(SCENARIO, WROTE, strict=True):
        if isinstance(expected, tuple):
            cls, code = expected
            with pytest.raises(cls) as info:
                run_operations(record, ops)
            assert info.value.code == code, step
            assert info.value.msg == "embedded:0 AEROSPIKE_ERR_OP_NOT_APPLICABLE", step
            continue
        outcome = run_operations(record, ops)
        got = outcome.results if isinstance(expected, list) else dict(outcome.results)
        assert got == expected, step
        assert outcome.wrote is wrote, step
        record = view(outcome.bins)
    assert record.bins == {"n": 6, "l": [1], "bits": b"\x0e\x00\x00\x00"}


def test_observed_operate_scenario_read_on_missing_record() -> None:
    with pytest.raises(ex.RecordNotFound) as info:
        run_operations(view({}, exists=False), [op.read("n")])
    assert info.value.code == 2
    assert info.value.msg == "embedded:0 AEROSPIKE_ERR_RECORD_NOT_FOUND"


def test_agrees_with_observed_json() -> None:
    """Cross-check against the recording itself, normalised as observe.py does."""
    path = OBSERVED / "observed.json"
    if not path.exists():
        pytest.skip(f"{path} not present")
    spec = importlib.util.spec_from_file_location("observe", OBSERVED / "observe.py")
    assert spec is not None and spec.loader is not None
    observe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(observe)
    steps = json.loads(path.read_text())["scenarios"]["operate"]
    record = view({}, exists=False)
    for (name, ops, _), want in zip(SCENARIO, steps, strict=False):
        assert want["step"] == name
        if "raised" in want:
            with pytest.raises(ex.AerospikeError) as info:
                run_operations(record, ops)
            assert [type(info.value).__name__, info.value.code] == [want["raised"]["error"], want["raised"]["code"]]
            continue
        outcome = run_operations(record, ops)
        shaped = list(outcome.results) if name == "operate_ordered" else dict(outcome.results)
        assert observe.norm(shaped) == want["result"]["bins"], name
        record = view(outcome.bins)


# -- server_error ---------------------------------------------------------------------------


def test_server_error_is_shaped_like_the_clients() -> None:
    err = server_error("OpNotApplicable", 26, "AEROSPIKE_ERR_OP_NOT_APPLICABLE")
    assert isinstance(err, ex.OpNotApplicable)
    assert (err.code, err.msg, err.file, err.line, err.in_doubt) == (
        26, "embedded:0 AEROSPIKE_ERR_OP_NOT_APPLICABLE", None, None, False)
    assert err.args[:2] == (26, "embedded:0 AEROSPIKE_ERR_OP_NOT_APPLICABLE")


# -- transaction semantics -----------------------------------------------------------------


def test_input_record_is_not_mutated() -> None:
    bins = {"l": [1, 2, 3], "n": 1, "b": b"\x00"}
    before = copy.deepcopy(bins)
    record = view(bins)
    run_operations(record, [lo.list_pop("l", 0), op.increment("n", 1), bw.bit_set("b", 0, 1, 1, b"\x80")])
    assert record.bins == before


def test_a_failing_op_applies_nothing() -> None:
    record = view({"l": [1], "n": 1})
    with pytest.raises(ex.OpNotApplicable):
        run_operations(record, [op.increment("n", 1), lo.list_pop("l", 5)])
    assert record.bins == {"l": [1], "n": 1}


def test_results_are_snapshots_not_aliases() -> None:
    results = run({"l": [1]}, [op.read("l"), lo.list_append("l", 2), op.read("l")]).results
    assert results == [("l", [1]), ("l", 2), ("l", [1, 2])]


def test_write_and_write_none() -> None:
    outcome = run({"a": 1, "b": 2}, [op.write("a", [1, {"x": b"y"}]), op.write("b", None)])
    assert outcome.bins == {"a": [1, {"x": b"y"}]}
    assert outcome.results == [] and outcome.wrote


def test_ops_that_leave_no_bins_mean_delete() -> None:
    outcome = run({"a": 1}, [op.write("a", None)])
    assert outcome.wrote and outcome.bins == {}


def test_delete_op_then_write_keeps_only_new_bins() -> None:
    assert run({"a": 1, "b": 2}, [op.delete()]).bins == {}
    assert run({"a": 1, "b": 2}, [op.delete(), op.write("c", 3)]).bins == {"c": 3}


def test_missing_record_with_writes_that_leave_no_bins_is_not_found() -> None:
    for ops in ([op.delete()], [lo.list_pop("l", 0)], [op.write("a", None)]):
        with pytest.raises(ex.RecordNotFound):
            run_operations(view({}, exists=False), ops)


def test_touch_is_a_write_without_answers() -> None:
    outcome = run({"a": 1}, [op.touch(), op.read("a")])
    assert outcome.touched and outcome.wrote
    assert outcome.results == [("a", 1)]
    with pytest.raises(ex.RecordNotFound):
        run_operations(view({}, exists=False), [op.touch(), op.write("a", 1)])


def test_read_of_missing_bin_has_no_entry() -> None:
    assert run({"a": 1}, [op.read("zz")]).results == []


def test_bit_ops_make_every_op_answer() -> None:
    # The client asks for respond-all-ops when a bit op is present: nil answers appear.
    results = run({"n": 1, "b": b"\xff"}, [op.increment("n", 1), op.read("zz"), bw.bit_count("b", 0, 8)]).results
    assert results == [("n", None), ("zz", None), ("b", 8)]
    assert run({"n": 1}, [op.increment("n", 1)]).results == []
    assert run({"n": 1}, [op.increment("n", 1)], respond_all_ops=True).results == [("n", None)]
    assert run({"n": 1}, [op.touch(), bw.bit_resize("b", 1)]).results == [("b", None)]


# -- increment, append, prepend ------------------------------------------------------------


def test_increment_ints_and_floats() -> None:
    assert run({"n": 1}, [op.increment("n", -3)]).bins == {"n": -2}
    assert run({}, [op.increment("f", 1.5)]).bins == {"f": 1.5}
    assert run({"f": 1.5}, [op.increment("f", 0.25)]).bins == {"f": 1.75}
    assert run({"n": 2**63 - 1}, [op.increment("n", 1)]).bins == {"n": -(2**63)}


@pytest.mark.parametrize(("bins", "amount"), [
    ({"n": 1}, 1.5), ({"f": 1.5}, 1), ({"s": "x"}, 1), ({"l": []}, 1), ({"b": True}, 1), ({"n": 1}, "x"),
])
def test_increment_type_mismatch_is_incompatible(bins: dict, amount: Any) -> None:
    err = raises(12, ex.BinIncompatibleType, bins, [op.increment(next(iter(bins)), amount)])
    assert err.msg == "embedded:0 AEROSPIKE_ERR_BIN_INCOMPATIBLE_TYPE"  # type: ignore[attr-defined]


def test_append_and_prepend() -> None:
    assert run({"s": "b"}, [op.append("s", "c"), op.prepend("s", "a")]).bins == {"s": "abc"}
    assert run({"b": b"b"}, [op.append("b", b"c"), op.prepend("b", bytearray(b"a"))]).bins == {"b": b"abc"}
    assert run({}, [op.append("s", "x")]).bins == {"s": "x"}
    raises(12, ex.BinIncompatibleType, {"s": "x"}, [op.append("s", b"y")])
    raises(12, ex.BinIncompatibleType, {"n": 1}, [op.append("n", "y")])


# -- lists -------------------------------------------------------------------------------


def test_list_negative_indexes() -> None:
    assert answers({"l": [1, 2, 3]}, [lo.list_pop("l", -1)]) == {"l": 3}
    assert answers({"l": [1, 2, 3]}, [lo.list_get("l", -3)]) == {"l": 1}
    raises(26, ex.OpNotApplicable, {"l": [1, 2, 3]}, [lo.list_pop("l", -4)])
    raises(26, ex.OpNotApplicable, {"l": []}, [lo.list_pop("l", 0)])
    # A range that starts before the list keeps only what overlaps it.
    outcome = run({"l": [1, 2, 3]}, [lo.list_pop_range("l", -5, 3)])
    assert outcome.results == [("l", [1])] and outcome.bins == {"l": [2, 3]}
    assert answers({"l": [1, 2, 3]}, [lo.list_pop_range("l", -2, 5)]) == {"l": [2, 3]}
    assert answers({"l": [1, 2, 3]}, [lo.list_pop_range("l", 3, 5)]) == {"l": []}


def test_list_append_insert_and_set() -> None:
    outcome = run({}, [lo.list_append("l", "a"), lo.list_insert("l", 0, "z"), lo.list_insert("l", 4, "p")])
    assert outcome.results == [("l", 1), ("l", 2), ("l", 5)]
    assert outcome.bins == {"l": ["z", "a", None, None, "p"]}  # inserting past the end pads with nil
    assert answers({"l": [1, 2]}, [lo.list_insert("l", -1, 9)]) == {"l": 3}
    assert run({"l": [1, 2]}, [lo.list_insert("l", -1, 9)]).bins == {"l": [1, 9, 2]}
    raises(26, ex.OpNotApplicable, {"l": [1, 2]}, [lo.list_insert("l", -3, 9)])
    assert run({"l": [1]}, [lo.list_set("l", 0, 5), lo.list_set("l", 2, 7)]).bins == {"l": [5, None, 7]}


def test_list_insert_bounded() -> None:
    bounded = {"write_flags": aerospike.LIST_WRITE_INSERT_BOUNDED}
    raises(26, ex.OpNotApplicable, {"l": [1]}, [lo.list_insert("l", 3, 9, bounded)])
    no_fail = {"write_flags": aerospike.LIST_WRITE_INSERT_BOUNDED | aerospike.LIST_WRITE_NO_FAIL}
    outcome = run({"l": [1]}, [lo.list_insert("l", 3, 9, no_fail)])
    assert outcome.results == [("l", 1)] and outcome.bins == {"l": [1]}


def test_list_ranges_trim_remove_clear() -> None:
    outcome = run({"l": [0, 1, 2, 3, 4]}, [lo.list_get_range("l", 1, 2), lo.list_remove_range("l", 3, 10)])
    assert outcome.results == [("l", [1, 2]), ("l", 2)] and outcome.bins == {"l": [0, 1, 2]}
    outcome = run({"l": [0, 1, 2, 3, 4]}, [lo.list_trim("l", 1, 2)])
    assert outcome.results == [("l", 3)] and outcome.bins == {"l": [1, 2]}
    outcome = run({"l": [0, 1, 2]}, [lo.list_trim("l", 5, 1)])
    assert outcome.results == [("l", 3)] and outcome.bins == {"l": []}
    outcome = run({"l": [0, 1]}, [lo.list_remove("l", 0), lo.list_clear("l")])
    assert outcome.results == [("l", 1)] and outcome.bins == {"l": []}


def test_list_ops_on_missing_bin() -> None:
    outcome = run({"a": 1}, [lo.list_size("l"), lo.list_get("l", 0), lo.list_clear("l"), lo.list_trim("l", 0, 1)])
    assert outcome.results == [] and outcome.bins == {"a": 1}
    with pytest.raises(ex.RecordNotFound):
        run_operations(view({}, exists=False), [lo.list_size("l")])


@pytest.mark.parametrize("make", [
    lambda: lo.list_append("s", 1), lambda: lo.list_pop("s", 0), lambda: lo.list_size("s"),
    lambda: lo.list_append_items("s", [1]), lambda: lo.list_get_range("s", 0, 1), lambda: lo.list_clear("s"),
])
def test_list_ops_on_non_list_bin_are_incompatible(make: Any) -> None:
    raises(12, ex.BinIncompatibleType, {"s": "text"}, [make()])


# -- bits --------------------------------------------------------------------------------


def test_bit_set_and_get_across_a_byte_boundary() -> None:
    outcome = run({"b": b"\x00\x00"}, [bw.bit_set("b", 6, 4, 1, bytearray([0b1011_0000]))])
    assert outcome.bins == {"b": bytes([0b0000_0010, 0b1100_0000])}
    got = answers({"b": bytes([0b0000_0010, 0b1100_0000])}, [bw.bit_get("b", 6, 4)])
    assert got == {"b": bytearray([0b1011_0000])}  # left-aligned, tail zeroed
    assert answers({"b": b"\xff\xff\xff"}, [bw.bit_count("b", 4, 13)]) == {"b": 13}
    assert answers({"b": b"\x00\x80"}, [bw.bit_get("b", -8, 8)]) == {"b": bytearray(b"\x80")}


def test_bit_set_value_uses_its_leading_bits() -> None:
    assert run({"b": b"\x00"}, [bw.bit_set("b", 0, 4, 2, bytearray(b"\xa5\xff"))]).bins == {"b": b"\xa0"}


def test_bit_or_xor_and_not_shifts() -> None:
    base = {"b": bytes([0b1100_1100])}
    assert run(base, [bw.bit_or("b", 0, 4, 1, bytearray([0b0011_0000]))]).bins == {"b": bytes([0b1111_1100])}
    assert run(base, [bw.bit_xor("b", 4, 4, 1, bytearray([0b1111_0000]))]).bins == {"b": bytes([0b1100_0011])}
    assert run(base, [bw.bit_and("b", 0, 8, 1, bytearray([0b1010_1010]))]).bins == {"b": bytes([0b1000_1000])}
    assert run(base, [bw.bit_not("b", 2, 4)]).bins == {"b": bytes([0b1111_0000])}
    assert run(base, [bw.bit_lshift("b", 0, 4, 1)]).bins == {"b": bytes([0b1000_1100])}
    assert run(base, [bw.bit_rshift("b", 4, 4, 2)]).bins == {"b": bytes([0b1100_0011])}


def test_bit_scans_and_get_int() -> None:
    blob = {"b": bytes([0b0001_0100, 0xFF])}
    assert answers(blob, [bw.bit_lscan("b", 0, 8, True)]) == {"b": 3}
    assert answers(blob, [bw.bit_rscan("b", 0, 8, True)]) == {"b": 5}
    assert answers(blob, [bw.bit_lscan("b", 8, 8, False)]) == {"b": -1}
    assert answers(blob, [bw.bit_get_int("b", 8, 8, False)]) == {"b": 255}
    assert answers(blob, [bw.bit_get_int("b", 8, 8, True)]) == {"b": -1}
    assert answers(blob, [bw.bit_get_int("b", 3, 3, False)]) == {"b": 0b101}


def test_bit_resize_variants() -> None:
    assert run({"b": b"\x01\x02"}, [bw.bit_resize("b", 4)]).bins == {"b": b"\x01\x02\x00\x00"}
    front = aerospike.BIT_RESIZE_FROM_FRONT
    assert run({"b": b"\x01\x02"}, [bw.bit_resize("b", 3, resize_flags=front)]).bins == {"b": b"\x00\x01\x02"}
    assert run({"b": b"\x01\x02\x03"}, [bw.bit_resize("b", 1, resize_flags=front)]).bins == {"b": b"\x03"}
    assert run({"b": b"\x01\x02\x03"}, [bw.bit_resize("b", 1)]).bins == {"b": b"\x01"}
    raises(4, ex.InvalidRequest, {"b": b"\x01\x02"}, [bw.bit_resize("b", 1, resize_flags=aerospike.BIT_RESIZE_GROW_ONLY)])
    raises(4, ex.InvalidRequest, {"b": b"\x01"}, [bw.bit_resize("b", 2, resize_flags=aerospike.BIT_RESIZE_SHRINK_ONLY)])
    raises(12, ex.BinIncompatibleType, {"b": "str"}, [bw.bit_resize("b", 2)])


def test_bit_insert_and_remove() -> None:
    assert run({"b": b"\x01\x02"}, [bw.bit_insert("b", 1, 1, b"\xff")]).bins == {"b": b"\x01\xff\x02"}
    assert run({"b": b"\x01"}, [bw.bit_insert("b", 3, 1, b"\xff")]).bins == {"b": b"\x01\x00\x00\xff"}
    assert run({}, [bw.bit_insert("b", 0, 1, b"\xff")]).bins == {"b": b"\xff"}
    assert run({"b": b"\x01\x02\x03"}, [bw.bit_remove("b", 1, 1)]).bins == {"b": b"\x01\x03"}
    raises(4, ex.InvalidRequest, {"b": b"\x01\x02"}, [bw.bit_remove("b", 1, 5)])
    partial = {"bit_write_flags": aerospike.BIT_WRITE_PARTIAL}
    assert run({"b": b"\x01\x02"}, [bw.bit_remove("b", 1, 5, partial)]).bins == {"b": b"\x01"}


def test_bit_set_on_missing_bin_and_write_flags() -> None:
    # particle_blob.c: only resize and insert may create the bin.
    err = raises(17, ex.BinNotFound, {"a": 1}, [bw.bit_set("b", 0, 1, 1, b"\x80")])
    assert err.msg == "embedded:0 AEROSPIKE_ERR_BIN_NOT_FOUND"  # type: ignore[attr-defined]
    no_fail = {"bit_write_flags": aerospike.BIT_WRITE_NO_FAIL}
    outcome = run({"a": 1}, [bw.bit_set("b", 0, 1, 1, b"\x80", no_fail)])
    assert outcome.bins == {"a": 1} and outcome.results == [("b", None)] and outcome.wrote
    assert run({"b": b"\x00"}, [bw.bit_set("b", 4, 8, 1, b"\xff", no_fail)]).bins == {"b": b"\x00"}
    partial = {"bit_write_flags": aerospike.BIT_WRITE_PARTIAL}
    assert run({"b": b"\x00"}, [bw.bit_set("b", 4, 8, 1, b"\xff", partial)]).bins == {"b": b"\x0f"}
    raises(26, ex.OpNotApplicable, {"b": b"\x00"}, [bw.bit_set("b", 4, 8, 1, b"\xff")])
    create_only = {"bit_write_flags": aerospike.BIT_WRITE_CREATE_ONLY}
    raises(6, ex.BinExistsError, {"b": b"\x00"}, [bw.bit_resize("b", 2, create_only)])
    update_only = {"bit_write_flags": aerospike.BIT_WRITE_UPDATE_ONLY}
    raises(17, ex.BinNotFound, {}, [bw.bit_resize("b", 2, update_only)])


def test_bit_reads_out_of_range_or_mistyped() -> None:
    raises(26, ex.OpNotApplicable, {"b": b"\x00"}, [bw.bit_get("b", 4, 8)])
    raises(26, ex.OpNotApplicable, {"b": b"\x00"}, [bw.bit_count("b", 8, 1)])
    raises(4, ex.InvalidRequest, {"b": b"\x00"}, [bw.bit_get("b", -9, 1)])
    raises(12, ex.BinIncompatibleType, {"b": 7}, [bw.bit_count("b", 0, 1)])
    assert run({"a": 1}, [bw.bit_get("b", 0, 8)]).results == [("b", None)]


# -- what is not implemented says so -----------------------------------------------------


def test_unsupported_op_raises_not_implemented_with_its_name() -> None:
    with pytest.raises(NotImplementedError, match=r"operation OP_LIST_SORT is not supported"):
        run({"l": [2, 1]}, [lo.list_sort("l")])
    with pytest.raises(NotImplementedError, match=r"operation OP_BIT_ADD is not supported"):
        run({"b": b"\x00"}, [bw.bit_add("b", 0, 8, 1, False, aerospike.BIT_OVERFLOW_FAIL)])
    with pytest.raises(NotImplementedError, match=r"operation 4242 is not supported"):
        run({}, [{"op": 4242, "bin": "x"}])


def test_nested_context_and_ordered_lists_are_not_implemented() -> None:
    from aerospike_helpers import cdt_ctx

    with pytest.raises(NotImplementedError, match="ctx"):
        run({"l": [[1]]}, [lo.list_append("l", 2, ctx=[cdt_ctx.cdt_ctx_list_index(0)])])
    with pytest.raises(NotImplementedError, match="ordered"):
        run({}, [lo.list_append("l", 2, {"list_order": aerospike.LIST_ORDERED})])
