"""The filter-expression evaluator against what a real Aerospike 8.1 server answered.

Expressions are built and compiled with `aerospike_helpers.expressions`, as
callers (and ../shared/observed/observe.py) do.
"""

from __future__ import annotations

from typing import Any

import pytest
from aerospike import exception as ex
from aerospike_helpers import expressions as xp
from aerospike_helpers.expressions import arithmetic as ar
from aerospike_helpers.expressions import list as lx

from aeroqueue.backends.embedded.expressions import matches
from aeroqueue.backends.embedded.types import RecordView

NOW_MS = 1_700_000_010_000
LUT_MS = 1_700_000_000_000
DIGEST = bytes.fromhex("c7faae55b65eb397bec1a16c138428515d40632a")  # the observed "expr" record's


def record(bins: dict[str, Any], **meta: Any) -> RecordView:
    fields: dict[str, Any] = {
        "exists": True, "bins": bins, "gen": 1, "void_time_ms": 0, "last_update_ms": LUT_MS,
        "digest": DIGEST, "set_name": "obs", "user_key": None, "now_ms": NOW_MS,
    }
    fields.update(meta)
    return RecordView(**fields)


def check(expr: Any, bins: dict[str, Any], **meta: Any) -> bool:
    return matches(expr.compile(), record(bins, **meta))


MISSING = xp.Eq(xp.IntBin("nobin"), 1)  # unknown on every record below
TRUE = xp.Eq(xp.IntBin("a"), 1)
FALSE = xp.Eq(xp.IntBin("a"), 2)
BINS = {"a": 1}


# -- the observed "expressions" and "partition_query" scenarios ----------------------


def test_observed_expressions_scenario() -> None:
    room = xp.LT(xp.IntBin("head"), xp.IntBin("tail"))
    assert check(room, {"head": 1, "tail": 2, "state": "q"})  # increment where head < tail
    assert not check(room, {"head": 2, "tail": 2, "state": "q"})  # again (filtered out)
    assert not check(xp.Eq(xp.StrBin("state"), "x"), {"head": 2, "tail": 2, "state": "q"})
    assert check(xp.GE(xp.SinceUpdateTime(), 0), {"head": 2, "tail": 2, "state": "q"})
    assert not check(xp.Eq(xp.IntBin("nobin"), 1), {"head": 2, "tail": 2, "state": "q"})


def test_observed_partition_query_filter() -> None:
    even = xp.Eq(xp.IntBin("even"), 0).compile()
    kept = [i for i in range(50) if matches(even, record({"i": i, "even": i % 2}))]
    assert kept == list(range(0, 50, 2))


# -- three-valued logic ------------------------------------------------------------------


def test_not_of_unknown_is_still_unknown() -> None:
    assert not check(MISSING, BINS)
    assert not check(xp.Not(MISSING), BINS)
    assert not check(xp.Not(xp.Not(MISSING)), BINS)


@pytest.mark.parametrize(("expr", "expected"), [
    (xp.And(TRUE, MISSING), False),  # unknown -> filtered out
    (xp.Not(xp.And(TRUE, MISSING)), False),  # ... and its negation is unknown too
    (xp.And(FALSE, MISSING), False),
    (xp.Not(xp.And(FALSE, MISSING)), True),  # false wins over unknown in And
    (xp.Or(TRUE, MISSING), True),  # true wins over unknown in Or
    (xp.Or(MISSING, TRUE), True),
    (xp.Or(FALSE, MISSING), False),
    (xp.Not(xp.Or(FALSE, MISSING)), False),
    (xp.And(TRUE, TRUE, TRUE), True),
    (xp.Or(FALSE, FALSE), False),
    (xp.Exclusive(TRUE, FALSE), True),
    (xp.Exclusive(TRUE, TRUE), False),
    (xp.Exclusive(FALSE, FALSE), False),
    (xp.Not(xp.Exclusive(TRUE, MISSING)), False),  # unknown stops Exclusive
    (xp.Not(xp.Exclusive(TRUE, TRUE, MISSING)), True),  # ... unless two trues came first
    (xp.Not(xp.Unknown()), False),
])
def test_and_or_exclusive_with_unknown(expr: Any, expected: bool) -> None:
    assert check(expr, BINS) is expected


# -- typed bin reads ------------------------------------------------------------------------


BIN_VALUES = {"i": 7, "f": 2.5, "s": "text", "b": True, "by": b"\x00\x01", "l": [1, "two"], "m": {"x": 1}}


@pytest.mark.parametrize(("expr", "expected"), [
    (xp.Eq(xp.IntBin("i"), 7), True),
    (xp.Eq(xp.FloatBin("f"), 2.5), True),
    (xp.Eq(xp.StrBin("s"), "text"), True),
    (xp.Eq(xp.BoolBin("b"), True), True),
    (xp.Eq(xp.BlobBin("by"), bytearray(b"\x00\x01")), True),
    (xp.Eq(xp.ListBin("l"), [1, "two"]), True),
    (xp.Eq(xp.ListBin("l"), [1.0, "two"]), False),  # 1 and 1.0 are different values
    (xp.NE(xp.MapBin("m"), {"x": 2}), True),
    # A bin of another type than the read asks for is unknown, not a mismatch.
    (xp.Eq(xp.IntBin("s"), 7), False),
    (xp.Not(xp.Eq(xp.IntBin("s"), 7)), False),
    (xp.Eq(xp.IntBin("b"), 1), False),  # a bool bin is not an integer
    (xp.Eq(xp.IntBin("f"), 2), False),
    (xp.Not(xp.Eq(xp.FloatBin("i"), 7.0)), False),
])
def test_typed_bin_reads(expr: Any, expected: bool) -> None:
    assert check(expr, BIN_VALUES) is expected


@pytest.mark.parametrize(("expr", "expected"), [
    (xp.LT(xp.StrBin("s"), "texu"), True),
    (xp.GT(xp.StrBin("s"), "tex"), True),  # a longer string sorts after its prefix
    (xp.LT(xp.StrBin("s"), "é"), True),  # UTF-8 bytes order
    (xp.LE(xp.BlobBin("by"), b"\x00\x01"), True),
    (xp.GT(xp.BlobBin("by"), b"\x00"), True),
    (xp.GE(xp.FloatBin("f"), 2.5), True),
    (xp.NE(xp.IntBin("i"), 7), False),
])
def test_ordering_comparisons(expr: Any, expected: bool) -> None:
    assert check(expr, BIN_VALUES) is expected


@pytest.mark.parametrize("expr", [
    xp.Eq(xp.IntBin("i"), "7"),  # int against str
    xp.Eq(xp.IntBin("i"), 7.0),  # int against float: the server never converts
    xp.LT(xp.IntBin("i"), xp.FloatBin("f")),
    xp.And(xp.IntBin("i"), TRUE),  # And of a non-boolean
    xp.IntBin("i"),  # a filter must be boolean
    ar.Add(xp.IntBin("i"), 1.5),
])
def test_mistyped_expressions_are_refused_like_the_server_does(expr: Any) -> None:
    with pytest.raises(ex.InvalidRequest) as info:
        check(expr, BIN_VALUES)
    assert info.value.code == 4
    assert info.value.msg == "embedded:0 AEROSPIKE_ERR_REQUEST_INVALID"


def test_bin_exists_and_bin_type() -> None:
    assert check(xp.BinExists("i"), BIN_VALUES)
    assert not check(xp.BinExists("zz"), BIN_VALUES)
    assert check(xp.Not(xp.BinExists("zz")), BIN_VALUES)  # never unknown
    for name, particle in [("i", 1), ("f", 2), ("s", 3), ("by", 4), ("b", 17), ("m", 19), ("l", 20), ("zz", 0)]:
        assert check(xp.Eq(xp.BinType(name), particle), BIN_VALUES), name


# -- record metadata --------------------------------------------------------------------------


def test_update_times() -> None:
    assert check(xp.Eq(xp.LastUpdateTime(), LUT_MS * 1_000_000), {})  # nanoseconds
    assert check(xp.Eq(xp.SinceUpdateTime(), NOW_MS - LUT_MS), {})  # milliseconds
    assert check(xp.LT(xp.SinceUpdateTime(), 10_001), {})
    assert check(xp.Eq(xp.SinceUpdateTime(), 0), {}, last_update_ms=NOW_MS + 5)  # never negative


def test_void_time_and_ttl() -> None:
    assert check(xp.Eq(xp.VoidTime(), -1), {})
    assert check(xp.Eq(xp.TTL(), -1), {})
    void_ms = NOW_MS + 100_000
    assert check(xp.Eq(xp.VoidTime(), void_ms * 1_000_000), {}, void_time_ms=void_ms)
    assert check(xp.Eq(xp.TTL(), 100), {}, void_time_ms=void_ms)


def test_set_name_and_keys() -> None:
    assert check(xp.Eq(xp.SetName(), "obs"), {})
    assert check(xp.Eq(xp.SetName(), ""), {}, set_name="")
    assert not check(xp.KeyExists(), {})
    assert check(xp.KeyExists(), {}, user_key="job/1")
    assert check(xp.Eq(xp.KeyStr(), "job/1"), {}, user_key="job/1")
    assert check(xp.Eq(xp.KeyInt(), 42), {}, user_key=42)
    assert not check(xp.Not(xp.Eq(xp.KeyInt(), 42)), {}, user_key="42")  # mistyped key is unknown
    assert not check(xp.Not(xp.Eq(xp.KeyStr(), "x")), {})  # key not stored: unknown


def test_digest_modulo_uses_the_last_four_bytes_little_endian() -> None:
    value = int.from_bytes(DIGEST[16:20], "little")
    for mod in (2, 3, 7, 4096):
        assert check(xp.Eq(xp.DigestMod(mod), value % mod), {}), mod
    with pytest.raises(ex.InvalidRequest):
        check(xp.Eq(xp.DigestMod(0), 0), {})


# -- arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "expected"), [
    (ar.Add(xp.IntBin("i"), 3, -1), 9),
    (ar.Sub(xp.IntBin("i"), 10), -3),
    (ar.Sub(xp.IntBin("i")), -7),
    (ar.Mul(xp.IntBin("i"), 6), 42),
    (ar.Div(xp.IntBin("i"), 2), 3),
    (ar.Div(xp.IntBin("n"), 2), -3),  # truncates towards zero, as in C
    (ar.Div(100, xp.IntBin("i"), 2), 7),
    (ar.Mod(xp.IntBin("n"), 4), -3),  # the remainder takes the dividend's sign
    (ar.Abs(xp.IntBin("n")), 7),
    (ar.Add(xp.IntBin("max"), 1), -(2**63)),  # int64 wraps
    (ar.Min(xp.IntBin("i"), 3, 9), 3),
    (ar.Max(xp.IntBin("i"), 3, 9), 9),
])
def test_integer_arithmetic(expr: Any, expected: int) -> None:
    assert check(xp.Eq(expr, expected), {"i": 7, "n": -7, "max": 2**63 - 1})


def test_float_arithmetic() -> None:
    bins = {"f": 1.5}
    assert check(xp.Eq(ar.Div(xp.FloatBin("f"), 0.5), 3.0), bins)
    assert check(xp.Eq(ar.Floor(ar.Mul(xp.FloatBin("f"), 3.0)), 4.0), bins)
    assert check(xp.Eq(ar.ToInt(xp.FloatBin("f")), 1), bins)
    assert check(xp.Eq(ar.ToFloat(ar.Abs(-3)), 3.0), bins)


def test_division_by_zero_is_unknown() -> None:
    bins = {"i": 7, "z": 0}
    assert not check(xp.Eq(ar.Div(xp.IntBin("i"), xp.IntBin("z")), 0), bins)
    assert not check(xp.Not(xp.Eq(ar.Div(xp.IntBin("i"), xp.IntBin("z")), 0)), bins)
    assert not check(xp.Not(xp.Eq(ar.Mod(xp.IntBin("i"), xp.IntBin("z")), 0)), bins)


def test_arithmetic_on_a_missing_bin_is_unknown() -> None:
    assert not check(xp.Not(xp.Eq(ar.Add(xp.IntBin("zz"), 1), 1)), {})


# -- what is not implemented says so -------------------------------------------------------


def test_unsupported_ops_raise_not_implemented_with_their_name() -> None:
    with pytest.raises(NotImplementedError, match=r"expression op CMP_REGEX is not supported"):
        check(xp.CmpRegex(0, "^a", xp.StrBin("s")), {"s": "a"})
    size = lx.ListSize(None, xp.ListBin("l"))
    with pytest.raises(NotImplementedError, match=r"expression op OP_LIST_SIZE is not supported"):
        check(xp.Eq(size, 1), {"l": [1]})
    with pytest.raises(NotImplementedError, match=r"expression op 999 is not supported"):
        matches([(999, None, None, 0)], record({}))
