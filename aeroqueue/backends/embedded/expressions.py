"""Evaluate a compiled filter expression against one record, as an Aerospike 8.1 server does.

The input is what `aerospike_helpers.expressions` `.compile()` returns: a flat,
prefix-order list of `(op, result_type, fixed, n_children)` tuples, variadic ops
closed by an END_OF_VA_ARGS entry. It is parsed into a tree first, with the
type checks the server makes when it builds an expression (as/src/base/exp.c):
a mistyped expression fails the whole command with `InvalidRequest` (4), as it
does on a server, rather than filtering records out.

Evaluation is three-valued. A bin that is missing or of another type than the
expression asks for reads as *unknown*; unknown propagates through
comparisons, arithmetic and `Not`; `And` is false if any operand is false,
`Or` true if any is true, and otherwise unknown wins. A filter passes only on
*true*: unknown at the top filters the record out, as on the server once the
record is read from storage.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aerospike
from aerospike_helpers.expressions.resources import ResultType, _ExprOp

from .server_errors import server_error
from .types import MAX_BIN_NAME, RecordView

__all__ = ["UNKNOWN", "evaluate", "matches"]

# Static result types, numbered as ResultType (the server's result_type).
NIL = ResultType.NIL
BOOL = ResultType.BOOLEAN
INT = ResultType.INTEGER
STR = ResultType.STRING
LIST = ResultType.LIST
MAP = ResultType.MAP
BLOB = ResultType.BLOB
FLOAT = ResultType.FLOAT
GEO = ResultType.GEOJSON
HLL = ResultType.HLL
ANY = -1  # Unknown() fits wherever it is put

_TYPE_NAMES = {NIL: "nil", BOOL: "bool", INT: "int", STR: "str", LIST: "list", MAP: "map",
               BLOB: "blob", FLOAT: "float", GEO: "geojson", HLL: "hll", ANY: "any"}


class _Unknown:
    """The third truth value (AS_EXP_UNK)."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()

_OP_NAMES = {v: k for k, v in vars(_ExprOp).items() if isinstance(v, int) and not k.startswith("__")}
# List, map, bit and HLL expressions compile to their operation's code (>= 1000).
_OP_NAMES.update({
    v: k for k, v in vars(aerospike).items()
    if isinstance(v, int) and k.startswith(("OP_LIST_", "OP_MAP_", "OP_BIT_", "OP_HLL_"))
})

# Particle type ids as BinType() answers them (AS_BYTES_* in the client).
_PARTICLE = {
    bool: aerospike.AS_BYTES_BOOL, int: aerospike.AS_BYTES_INTEGER, float: aerospike.AS_BYTES_DOUBLE,
    str: aerospike.AS_BYTES_STRING, bytes: aerospike.AS_BYTES_BLOB, bytearray: aerospike.AS_BYTES_BLOB,
    list: aerospike.AS_BYTES_LIST, dict: aerospike.AS_BYTES_MAP,
}


def _invalid(why: str) -> Exception:
    # The server only logs the reason and the client sees a bare code 4; the
    # reason rides along as a note, for whoever debugs the expression.
    err = server_error("InvalidRequest", 4, "AEROSPIKE_ERR_REQUEST_INVALID")
    err.add_note(f"embedded backend: {why}")
    return err


def _unsupported(code: Any) -> NotImplementedError:
    return NotImplementedError(
        f"embedded backend: expression op {_OP_NAMES.get(code, code)} is not supported"
    )


def _type_of_value(value: Any) -> int:
    """The expression type of a Python value (a literal or a bin's contents)."""
    if value is None:
        return NIL
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT
    if isinstance(value, float):
        return FLOAT
    if isinstance(value, str):
        return STR
    if isinstance(value, (bytes, bytearray)):
        return BLOB
    if isinstance(value, list):
        return LIST
    if isinstance(value, dict):
        return MAP
    if isinstance(value, aerospike.GeoJSON):
        return GEO
    raise NotImplementedError(f"embedded backend: expression value of type {type(value).__name__}")


def _particle_type(value: Any) -> int:
    if isinstance(value, aerospike.GeoJSON):
        return aerospike.AS_BYTES_GEOJSON
    for cls in type(value).__mro__:
        if cls in _PARTICLE:
            return _PARTICLE[cls]
    raise NotImplementedError(f"embedded backend: bin value of type {type(value).__name__}")


# -- parsing -------------------------------------------------------------------


@dataclass
class _Node:
    op: int
    type: int
    fixed: dict[str, Any]
    children: list[_Node] = field(default_factory=list)
    eval: Callable[[_Node, RecordView], Any] | None = None


_END = _ExprOp._AS_EXP_CODE_END_OF_VA_ARGS


def _parse(compiled: Sequence[Sequence[Any]]) -> _Node:
    pos = 0

    def node() -> _Node | None:
        nonlocal pos
        if pos >= len(compiled):
            raise _invalid("expression ends early")
        op, rt, fixed, n_children = compiled[pos]
        pos += 1
        if op == _END:
            return None
        name = (fixed or {}).get("bin")
        if type(name) is str and len(name.encode()) > MAX_BIN_NAME:
            raise _invalid(f"bin name {name!r} is over {MAX_BIN_NAME} bytes")
        children = [c for c in (node() for _ in range(n_children)) if c is not None]
        builder = _BUILDERS.get(op)
        if builder is None:
            raise _unsupported(op)
        return builder(op, rt, dict(fixed or {}), children)

    root = node()
    if root is None or pos != len(compiled):
        raise _invalid("malformed expression")
    return root


def _expect(node: _Node, *types: int) -> None:
    if node.type != ANY and node.type not in types:
        wanted = "/".join(_TYPE_NAMES[t] for t in types)
        raise _invalid(f"operand of type {_TYPE_NAMES[node.type]} where {wanted} is expected")


def _arity(children: list[_Node], low: int, high: int | None = None) -> None:
    if len(children) < low or (high is not None and len(children) > high):
        raise _invalid("wrong number of operands")


def _same_numeric_type(children: list[_Node]) -> int:
    """Arithmetic operands are all int or all float; the result has their type."""
    kinds = {c.type for c in children} - {ANY}
    if len(kinds) > 1:
        raise _invalid("arithmetic on mixed types")
    kind = kinds.pop() if kinds else ANY
    if kind not in (INT, FLOAT, ANY):
        raise _invalid("arithmetic on a non-number")
    return kind


Builder = Callable[[int, Any, dict[str, Any], list[_Node]], _Node]
_BUILDERS: dict[int, Builder] = {}


def _builds(*ops: int) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        for op in ops:
            _BUILDERS[op] = fn
        return fn

    return register


@_builds(_ExprOp.VAL, _ExprOp._AS_EXP_CODE_AS_VAL)
def _build_value(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    value = fixed.get("val")
    return _Node(op, _type_of_value(value), {"val": value}, eval=lambda n, r: n.fixed["val"])


@_builds(_ExprOp._TRUE, _ExprOp._FALSE)
def _build_bool(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    value = op == _ExprOp._TRUE
    return _Node(op, BOOL, {}, eval=lambda n, r: value)


@_builds(_ExprOp.UNKNOWN)
def _build_unknown(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    return _Node(op, ANY, {}, eval=lambda n, r: UNKNOWN)


@_builds(_ExprOp.BIN)
def _build_bin(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    if rt not in (BOOL, INT, STR, LIST, MAP, BLOB, FLOAT):
        raise _unsupported(f"BIN of type {_TYPE_NAMES.get(rt, rt)}")

    def read(node: _Node, record: RecordView) -> Any:
        value = record.bins.get(node.fixed["bin"], None)
        # A typed read: a missing bin, or one of another type, is unknown.
        if value is None or _type_of_value(value) != node.type:
            return UNKNOWN
        return value

    return _Node(op, rt, fixed, eval=read)


@_builds(_ExprOp.BIN_TYPE)
def _build_bin_type(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    def read(node: _Node, record: RecordView) -> Any:
        value = record.bins.get(node.fixed["bin"])
        return aerospike.AS_BYTES_UNDEF if value is None else _particle_type(value)

    return _Node(op, INT, fixed, eval=read)


@_builds(_ExprOp.BIN_EXISTS)
def _build_bin_exists(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    # The client sends this as bin_type(name) != 0: never unknown.
    return _Node(op, BOOL, fixed, eval=lambda n, r: r.bins.get(n.fixed["bin"]) is not None)


@_builds(_ExprOp.REC_KEY)
def _build_rec_key(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    if rt not in (INT, STR, BLOB):
        raise _invalid("key of a type keys cannot have")

    def read(node: _Node, record: RecordView) -> Any:
        key = record.user_key  # only there when written with POLICY_KEY_SEND
        if key is None or _type_of_value(key) != node.type:
            return UNKNOWN
        return key

    return _Node(op, rt, fixed, eval=read)


def _meta(op: int, kind: int, read: Callable[[RecordView], Any]) -> None:
    _BUILDERS[op] = lambda op_, rt, fixed, children: _Node(op_, kind, fixed, eval=lambda n, r: read(r))


# LastUpdateTime and VoidTime are nanoseconds since 1970; the server keeps the
# void time in whole seconds, so it is truncated here to match.
_meta(_ExprOp.META_LAST_UPDATE_TIME, INT, lambda r: r.last_update_ms * 1_000_000)
_meta(_ExprOp.META_SINCE_UPDATE_TIME, INT, lambda r: max(0, r.now_ms - r.last_update_ms))
_meta(_ExprOp.META_VOID_TIME, INT,
      lambda r: -1 if not r.void_time_ms else (r.void_time_ms // 1000) * 1_000_000_000)
_meta(_ExprOp.META_TTL, INT, lambda r: -1 if not r.void_time_ms else r.ttl_seconds)
_meta(_ExprOp.META_SET_NAME, STR, lambda r: r.set_name or "")
_meta(_ExprOp.META_KEY_EXISTS, BOOL, lambda r: r.user_key is not None)


@_builds(_ExprOp.META_DIGEST_MOD)
def _build_digest_mod(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    mod = fixed.get("val")
    if not isinstance(mod, int) or isinstance(mod, bool) or mod == 0:
        raise _invalid("digest modulo by zero")
    # The server reads the digest's last 4 bytes as a native (little-endian)
    # uint32; the remainder of a non-negative dividend is non-negative in C.
    return _Node(op, INT, fixed,
                 eval=lambda n, r: int.from_bytes(r.digest[16:20], "little") % abs(mod))


# -- logic and comparison --------------------------------------------------------------


def _eval_and(node: _Node, record: RecordView) -> Any:
    result: Any = True
    for child in node.children:
        value = _eval(child, record)
        if value is False:
            return False
        if value is UNKNOWN:
            result = UNKNOWN
    return result


def _eval_or(node: _Node, record: RecordView) -> Any:
    result: Any = False
    for child in node.children:
        value = _eval(child, record)
        if value is True:
            return True
        if value is UNKNOWN:
            result = UNKNOWN
    return result


def _eval_not(node: _Node, record: RecordView) -> Any:
    value = _eval(node.children[0], record)
    return UNKNOWN if value is UNKNOWN else not value


def _eval_exclusive(node: _Node, record: RecordView) -> Any:
    # Exactly one true; the server stops at the first unknown or second true.
    seen_true = False
    for child in node.children:
        value = _eval(child, record)
        if value is UNKNOWN:
            return UNKNOWN
        if value is True:
            if seen_true:
                return False
            seen_true = True
    return seen_true


_LOGIC = {_ExprOp.AND: _eval_and, _ExprOp.OR: _eval_or, _ExprOp.EXCLUSIVE: _eval_exclusive}


@_builds(_ExprOp.AND, _ExprOp.OR, _ExprOp.EXCLUSIVE, _ExprOp.NOT)
def _build_logic(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    # And, Or and Exclusive of fewer than two operands: the server refuses them (8.1: code 4).
    _arity(children, 1, 1) if op == _ExprOp.NOT else _arity(children, 2)
    for child in children:
        _expect(child, BOOL)
    return _Node(op, BOOL, fixed, children, eval=_LOGIC.get(op, _eval_not))


_CMP: dict[int, Callable[[Any, Any], bool]] = {
    _ExprOp.EQ: lambda a, b: a == b,
    _ExprOp.NE: lambda a, b: a != b,
    _ExprOp.GT: lambda a, b: a > b,
    _ExprOp.GE: lambda a, b: a >= b,
    _ExprOp.LT: lambda a, b: a < b,
    _ExprOp.LE: lambda a, b: a <= b,
}


def _strictly_equal(a: Any, b: Any) -> bool:
    """Equality as msgpack sees it: 1, 1.0 and True are three different values."""
    if _type_of_value(a) != _type_of_value(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_strictly_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_strictly_equal(a[k], b[k]) for k in a)
    if isinstance(a, (bytes, bytearray)):
        return bytes(a) == bytes(b)
    return bool(a == b)


def _comparable(value: Any) -> Any:
    # Strings compare as their UTF-8 bytes, blobs as bytes (memcmp, then length).
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray):
        return bytes(value)
    return value


def _eval_compare(node: _Node, record: RecordView) -> Any:
    left = _eval(node.children[0], record)
    if left is UNKNOWN:
        return UNKNOWN
    right = _eval(node.children[1], record)
    if right is UNKNOWN:
        return UNKNOWN
    kind = _type_of_value(left)
    if kind != _type_of_value(right):
        return UNKNOWN  # only reachable through Unknown(), which fits any type
    if kind in (LIST, MAP):
        equal = _strictly_equal(left, right)
        if node.op == _ExprOp.EQ:
            return equal
        if node.op == _ExprOp.NE:
            return not equal
        raise NotImplementedError("embedded backend: ordering comparison of lists or maps")
    if kind == NIL:
        return node.op in (_ExprOp.EQ, _ExprOp.GE, _ExprOp.LE)
    return _CMP[node.op](_comparable(left), _comparable(right))


@_builds(*_CMP)
def _build_compare(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    _arity(children, 2, 2)
    left, right = children
    if ANY not in (left.type, right.type) and left.type != right.type:
        raise _invalid("comparison of different types")
    if {left.type, right.type} & {GEO, HLL}:
        raise _invalid("comparison of geojson or hll")
    return _Node(op, BOOL, fixed, children, eval=_eval_compare)


# -- arithmetic ------------------------------------------------------------------------
#
# Integers are the server's int64 (overflow wraps); division and remainder
# truncate towards zero as in C, and dividing by zero is unknown.

_INT64_MIN = -(1 << 63)


def _wrap64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _f_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _args(node: _Node, record: RecordView) -> list[Any] | None:
    values = []
    for child in node.children:
        value = _eval(child, record)
        if value is UNKNOWN:
            return None
        values.append(value)
    return values


def _eval_arith(node: _Node, record: RecordView) -> Any:
    values = _args(node, record)
    if values is None:
        return UNKNOWN
    first, rest = values[0], values[1:]
    is_int = isinstance(first, int)
    op = node.op
    # Folded left to right, as the server does: float rounding depends on it.
    if op == _ExprOp.ADD:
        total = first
        for v in rest:
            total += v
    elif op == _ExprOp.SUB:
        total = -first
        if rest:
            total = first
            for v in rest:
                total -= v
    elif op == _ExprOp.MUL:
        total = first
        for v in rest:
            total = _wrap64(total * v) if is_int else total * v
    elif op == _ExprOp.DIV:
        # One operand means 1 / x; several divide the first by their product.
        dividend, divisors = (1 if is_int else 1.0, [first]) if not rest else (first, rest)
        product: Any = 1 if is_int else 1.0
        for v in divisors:
            product = _wrap64(product * v) if is_int else product * v
        if is_int:
            if product == 0 or (dividend == _INT64_MIN and product == -1):
                return UNKNOWN
            return _c_div(int(dividend), product)
        return _f_div(dividend, product)
    elif op == _ExprOp.MIN:
        total = min(values)
    elif op == _ExprOp.MAX:
        total = max(values)
    else:
        raise _unsupported(op)
    return _wrap64(total) if is_int else total


def _eval_mod(node: _Node, record: RecordView) -> Any:
    values = _args(node, record)
    if values is None:
        return UNKNOWN
    a, b = values
    if b == 0 or (a == _INT64_MIN and b == -1):
        return UNKNOWN
    return a - b * _c_div(a, b)


def _eval_unary(node: _Node, record: RecordView) -> Any:
    value = _eval(node.children[0], record)
    if value is UNKNOWN:
        return UNKNOWN
    op = node.op
    if op == _ExprOp.ABS:
        # labs(INT64_MIN) stays INT64_MIN.
        return _wrap64(abs(value)) if isinstance(value, int) else abs(value)
    if op == _ExprOp.FLOOR:
        return float(math.floor(value)) if math.isfinite(value) else value
    if op == _ExprOp.CEIL:
        return float(math.ceil(value)) if math.isfinite(value) else value
    if op == _ExprOp.TO_INT:
        return _wrap64(int(value)) if math.isfinite(value) else UNKNOWN
    if op == _ExprOp.TO_FLOAT:
        return float(value)
    if op == _ExprOp.INT_NOT:
        return ~value
    if op == _ExprOp.INT_COUNT:
        return bin(value & ((1 << 64) - 1)).count("1")
    raise _unsupported(op)


def _eval_int_bits(node: _Node, record: RecordView) -> Any:
    values = _args(node, record)
    if values is None:
        return UNKNOWN
    result = values[0]
    for v in values[1:]:
        if node.op == _ExprOp.INT_AND:
            result &= v
        elif node.op == _ExprOp.INT_OR:
            result |= v
        else:
            result ^= v
    return result


@_builds(_ExprOp.ADD, _ExprOp.SUB, _ExprOp.MUL, _ExprOp.DIV, _ExprOp.MIN, _ExprOp.MAX)
def _build_arith(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    _arity(children, 1)
    return _Node(op, _same_numeric_type(children), fixed, children, eval=_eval_arith)


@_builds(_ExprOp.MOD)
def _build_mod(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    _arity(children, 2, 2)
    for child in children:
        _expect(child, INT)
    return _Node(op, INT, fixed, children, eval=_eval_mod)


_UNARY_TYPES = {
    # op: (operand types, result type; None = the operand's type)
    _ExprOp.ABS: ((INT, FLOAT), None),
    _ExprOp.FLOOR: ((FLOAT,), FLOAT),
    _ExprOp.CEIL: ((FLOAT,), FLOAT),
    _ExprOp.TO_INT: ((FLOAT,), INT),
    _ExprOp.TO_FLOAT: ((INT,), FLOAT),
    _ExprOp.INT_NOT: ((INT,), INT),
    _ExprOp.INT_COUNT: ((INT,), INT),
}


@_builds(*_UNARY_TYPES)
def _build_unary(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    _arity(children, 1, 1)
    operand_types, result = _UNARY_TYPES[op]
    _expect(children[0], *operand_types)
    return _Node(op, children[0].type if result is None else result, fixed, children, eval=_eval_unary)


@_builds(_ExprOp.INT_AND, _ExprOp.INT_OR, _ExprOp.INT_XOR)
def _build_int_bits(op: int, rt: Any, fixed: dict[str, Any], children: list[_Node]) -> _Node:
    _arity(children, 1)
    for child in children:
        _expect(child, INT)
    return _Node(op, INT, fixed, children, eval=_eval_int_bits)


# -- entry point -------------------------------------------------------------------------


def _eval(node: _Node, record: RecordView) -> Any:
    assert node.eval is not None
    return node.eval(node, record)


_PARSED: dict[str, _Node] = {}
_PARSED_MAX = 4096


class Parsed:
    """An expression parsed once for every record of a batch (`prepare`)."""

    __slots__ = ("node",)

    def __init__(self, node: _Node) -> None:
        self.node = node


def prepare(compiled: Any) -> Any:
    """`compiled` parsed once, for a batch that applies it to many records; as it is
    when it does not parse, so that each record fails as it would alone."""
    try:
        return Parsed(_parsed(compiled))
    except Exception:
        return compiled


def refused(compiled: Any) -> bool:
    """Whether the server refuses `compiled` (InvalidRequest, code 4): as a batch's
    filter, on more than one record, it fails the whole batch (`EmbeddedClient._refused`)."""
    try:
        _parsed(compiled)
    except aerospike.exception.InvalidRequest:
        return True
    except Exception:
        return False
    return False


def _parsed(compiled: list[tuple] | Parsed) -> _Node:
    """`_parse`, remembered: a queue sends the same few expressions again and again,
    and parsing one cost more than the rest of an operation. Nodes are never
    changed once built; the key is the expression's repr, which tells 1, True
    and '1' apart."""
    if isinstance(compiled, Parsed):
        return compiled.node
    key = repr(compiled)
    node = _PARSED.get(key)
    if node is None:
        node = _parse(compiled)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = node
    return node


def evaluate(compiled: list[tuple], record: RecordView) -> Any:
    """The value of expression `compiled` on `record` (an expression read or write
    op); `UNKNOWN` when the server could not compute it (a missing bin)."""
    return _eval(_parsed(compiled), record)


def matches(compiled: list[tuple], record: RecordView) -> bool:
    """True if the filter expression `compiled` is true for `record`.

    False when it is false or unknown. Raises `InvalidRequest` (4) for an
    expression the server would refuse to build (operands of mismatched
    types, a filter that is not boolean), and `NotImplementedError` naming
    the op for anything this interpreter does not cover.
    """
    root = _parsed(compiled)
    if root.type not in (BOOL, ANY):
        raise _invalid("a filter expression must be boolean")
    return _eval(root, record) is True
