"""Apply `operate()` op dicts to one record, answering as an Aerospike 8.1 server does.

The op dicts are the ones `aerospike_helpers.operations` builds. Semantics follow
the server source (as/src/transaction/write.c, base/particle_*.c, base/cdt.c)
and `../shared/observed/observed.json`; where they say nothing, the module
docstring of each helper says what was chosen.

Which ops answer is the server's rule, not a per-op one: the C client sets
"respond all ops" as soon as one bit (or map/HLL/expression) op is in the list,
and then every op except touch answers, with nil for those that have no value.
That is why `bit_resize` alone answers `{'bits': None}` while `list_pop` on a
missing bin answers nothing (observed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import aerospike

from .expressions import UNKNOWN, evaluate
from .server_errors import server_error
from .types import OperateOutcome, RecordView, key_ordered

__all__ = ["run_operations", "server_error"]

_TEXT = {
    2: ("RecordNotFound", "AEROSPIKE_ERR_RECORD_NOT_FOUND"),
    4: ("InvalidRequest", "AEROSPIKE_ERR_REQUEST_INVALID"),
    6: ("BinExistsError", "AEROSPIKE_ERR_BIN_EXISTS"),
    12: ("BinIncompatibleType", "AEROSPIKE_ERR_BIN_INCOMPATIBLE_TYPE"),
    17: ("BinNotFound", "AEROSPIKE_ERR_BIN_NOT_FOUND"),
    24: ("ElementExistsError", "AEROSPIKE_ERR_FAIL_ELEMENT_EXISTS"),
    26: ("OpNotApplicable", "AEROSPIKE_ERR_OP_NOT_APPLICABLE"),
}


def _err(code: int) -> Exception:
    name, text = _TEXT[code]
    return server_error(name, code, text)


_MISSING: Any = object()
_INT64_MASK = (1 << 64) - 1


def _wrap64(value: int) -> int:
    # The server adds in uint64 and stores int64: overflow wraps, it never fails.
    value &= _INT64_MASK
    return value - (1 << 64) if value >> 63 else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_blob(value: Any) -> bool:
    return isinstance(value, (bytes, bytearray))


# -- op codes ------------------------------------------------------------------

_READ = aerospike.OPERATOR_READ
_WRITE = aerospike.OPERATOR_WRITE
_INCR = aerospike.OPERATOR_INCR
_APPEND = aerospike.OPERATOR_APPEND
_PREPEND = aerospike.OPERATOR_PREPEND
_TOUCH = aerospike.OPERATOR_TOUCH
_DELETE = aerospike.OPERATOR_DELETE

_LIST_READS = {aerospike.OP_LIST_SIZE, aerospike.OP_LIST_GET, aerospike.OP_LIST_GET_RANGE}
_BIT_READS = {
    aerospike.OP_BIT_GET, aerospike.OP_BIT_COUNT, aerospike.OP_BIT_LSCAN,
    aerospike.OP_BIT_RSCAN, aerospike.OP_BIT_GET_INT,
}
_READ_OPS = {_READ} | _LIST_READS | _BIT_READS
_EXPR_READ = aerospike.OP_EXPR_READ
_EXPR_WRITE = aerospike.OP_EXPR_WRITE
_READ_OPS = _READ_OPS | {_EXPR_READ}
READ_OPS = frozenset(_READ_OPS)  # the ops that change nothing (the client's batch_write rule)
# Ops that only replace whole bins (or read them): see run_operations.
_SCALAR_OPS = frozenset({_READ, _WRITE, _INCR, _APPEND, _PREPEND, _TOUCH, _DELETE, _EXPR_READ, _EXPR_WRITE})
# Every bit op, read or modify, and every expression op makes the C client ask
# for an answer per op (observed: an expression write answers nil).
_RESPOND_ALL_OPS = {v for k, v in vars(aerospike).items() if k.startswith("OP_BIT_")} | {_EXPR_READ, _EXPR_WRITE}

_OP_NAMES = {
    v: k for k, v in vars(aerospike).items()
    if isinstance(v, int) and (k.startswith("OP_") or k.startswith("OPERATOR_"))
}

# Bit policy flags (as_bit_write_flags) and resize sub-flags.
_CREATE_ONLY = aerospike.BIT_WRITE_CREATE_ONLY
_UPDATE_ONLY = aerospike.BIT_WRITE_UPDATE_ONLY
_NO_FAIL = aerospike.BIT_WRITE_NO_FAIL
_PARTIAL = aerospike.BIT_WRITE_PARTIAL
_FROM_FRONT = aerospike.BIT_RESIZE_FROM_FRONT
_GROW_ONLY = aerospike.BIT_RESIZE_GROW_ONLY
_SHRINK_ONLY = aerospike.BIT_RESIZE_SHRINK_ONLY

# List write flags this interpreter implements.
_LIST_BOUNDED = aerospike.LIST_WRITE_INSERT_BOUNDED
_LIST_NO_FAIL = aerospike.LIST_WRITE_NO_FAIL


_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})


def _copy(value: Any) -> Any:
    """A value the record can keep without sharing it with the caller (or another
    record of the batch): immutable ones as they are, the rest deep-copied. A string
    ends at its first NUL, as the client sends it."""
    kind = type(value)
    if kind is str:
        return value.partition("\x00")[0] if "\x00" in value else value
    if kind in _IMMUTABLE:
        return value
    if kind is list:
        return [_copy(v) for v in value]
    if kind is dict:
        return key_ordered({(_copy(k) if type(k) is str else k): _copy(v) for k, v in value.items()})
    return copy.deepcopy(value)


I64 = 1 << 63  # integers the client sends: -I64 <= n < I64


def utf8_text(text: str) -> str:
    """`text` if the client can send it: a lone surrogate (a file name's undecodable
    byte, a JSON \\ud800 escape) is not UTF-8, and the client refuses the call with
    ClientError -1 (client 19.3, observed)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise server_error("ClientError", -1, "Unicode value not encoded in utf-8.") from None
    return text


def client_value(value: Any) -> Any:
    """`value` (an operation's value, a UDF's argument) if the client can send it; else
    the client's own error, raised before anything is sent: an integer outside 64
    bits is ParamError -2, any type but None, bool, int, float, str, bytes,
    bytearray, list and dict (a tuple, a set, an object) ClientError -1 (client 19.3,
    observed; the real client's heap is corrupt after that one, ours is not)."""
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is int:
            if not -I64 <= v < I64:
                raise server_error("ParamError", -2, "integer value exceeds sys.maxsize")
        elif kind is str:
            if not v.isascii():
                utf8_text(v)
        elif kind is list:
            stack.extend(v)
        elif kind is dict:
            stack.extend(v)
            stack.extend(v.values())
        elif kind not in _IMMUTABLE and kind is not bytearray:
            raise server_error("ClientError", -1, "Unable to serialize unknown Python native type.")
    return value


def _unsupported(what: Any) -> NotImplementedError:
    return NotImplementedError(f"embedded backend: operation {what} is not supported")


# -- the interpreter -------------------------------------------------------------


def run_operations(
    record: RecordView, ops: list[dict], *, respond_all_ops: bool = False
) -> OperateOutcome:
    """Apply `ops` in order to a copy of `record.bins`, as one server transaction.

    Raises `aerospike.exception` errors as the server would, with nothing
    applied (the input is never mutated). `respond_all_ops` mirrors the operate
    policy of that name; the client also turns it on by itself for bit ops.

    On the outcome: `wrote` is true for any list holding a write op, even one
    that turned out a no-op (the server still writes: generation + 1, observed
    for `list_pop` on a missing bin); a touch sets both `wrote` and `touched`
    (observed: generation + 1). `wrote` with empty `bins` on an existing record
    means the record must be deleted: the server deletes a record its ops leave
    without bins (that is also what the `delete()` op does). A missing record
    raises `RecordNotFound` when the ops only read, touch, or leave no bins.
    """
    if not ops:
        raise server_error("ParamError", -2, "No operations defined")  # the client's own check
    codes = []
    for op in ops:
        code = op.get("op", -1)
        if code not in _HANDLERS:
            raise _unsupported(_OP_NAMES.get(code, code))
        if op.get("ctx"):
            raise _unsupported(f"{_OP_NAMES.get(code, code)} with ctx (nested CDT)")
        codes.append(code)

    is_write = any(code not in _READ_OPS for code in codes)
    touched = _TOUCH in codes
    # A read transaction, and a touch (which may not create), need the record.
    if not record.exists and (not is_write or touched):
        raise _err(2)

    # Scalar ops replace a bin's value and never change one in place: a shallow copy
    # keeps the input intact for them. Collection ops edit lists and bytes in place.
    bins = dict(record.bins) if _SCALAR_OPS.issuperset(codes) else copy.deepcopy(record.bins)
    run = _Run(bins, respond_all_ops or any(c in _RESPOND_ALL_OPS for c in codes), record)
    for op, code in zip(ops, codes, strict=True):
        _HANDLERS[code](run, op)

    if is_write and not run.bins and not record.exists:
        raise _err(2)
    # op.touch(ttl)'s (deprecated) ttl is the record's new ttl, as on a server.
    touch_ttl = next((op["val"] for op, c in zip(ops, codes, strict=True) if c == _TOUCH and op.get("val") is not None), None)
    return OperateOutcome(results=run.results, wrote=is_write, bins=run.bins, touched=touched, ttl=touch_ttl)


class _Run:
    def __init__(self, bins: dict[str, Any], respond_all: bool, record: RecordView) -> None:
        self.bins = bins
        self.respond_all = respond_all
        self.results: list[tuple[str, Any]] = []
        self.record = record

    def view(self) -> RecordView:
        """The record as the ops so far left it (an expression op reads the bins
        written before it in the same call), with the record's metadata."""
        r = self.record
        return RecordView(
            r.exists, self.bins, r.gen, r.void_time_ms, r.last_update_ms, r.digest, r.set_name, r.user_key, r.now_ms
        )

    def answer(self, name: str, value: Any) -> None:
        self.results.append((name, value))

    def answer_nil(self, name: str) -> None:
        # Ops without a value of their own answer only when every op must.
        if self.respond_all:
            self.results.append((name, None))

    def get(self, name: str) -> Any:
        return self.bins.get(name, _MISSING)


# -- scalar ops ----------------------------------------------------------------------


def _op_read(run: _Run, op: dict) -> None:
    value = run.get(op["bin"])
    if value is _MISSING:
        run.answer_nil(op["bin"])
    else:
        run.answer(op["bin"], _copy(value))


def _op_write(run: _Run, op: dict) -> None:
    name, value = op["bin"], op.get("val")
    if value is None:
        run.bins.pop(name, None)
    else:
        run.bins[name] = _copy(value)
    run.answer_nil(name)


def _evaluate(compiled: list[tuple], view: RecordView) -> tuple[bool, Any]:
    """(known, value) of an expression op's expression."""
    value = evaluate(compiled, view)
    return value is not UNKNOWN, value


def _op_expr_read(run: _Run, op: dict) -> None:
    known, value = _evaluate(op["expr"], run.view())
    if not known:
        if op.get("expr_flags", 0) & aerospike.EXP_READ_EVAL_NO_FAIL:
            run.answer_nil(op["bin"])
            return
        raise _err(26)
    run.answer(op["bin"], _copy(value))


def _op_expr_write(run: _Run, op: dict) -> None:
    """Only the default flags: the value, when known, replaces the bin (observed:
    an unknown value, such as a missing bin's, fails the call with 26)."""
    if op.get("expr_flags", 0) != aerospike.EXP_WRITE_DEFAULT:
        raise _unsupported(f"expression write with flags {op.get('expr_flags')}")
    known, value = _evaluate(op["expr"], run.view())
    if not known:
        raise _err(26)
    if value is None:
        run.bins.pop(op["bin"], None)
    else:
        run.bins[op["bin"]] = _copy(value)
    run.answer_nil(op["bin"])


def _op_incr(run: _Run, op: dict) -> None:
    name, delta = op["bin"], op.get("val")
    if isinstance(delta, bool):
        delta = int(delta)  # the client packs a bool amount as an integer
    if not isinstance(delta, (int, float)):
        # Not pinned down: the server would reject a non-numeric wire type
        # against a numeric bin; reject it whatever the bin holds.
        raise _err(12)
    current = run.get(name)
    if current is _MISSING:
        run.bins[name] = _wrap64(delta) if isinstance(delta, int) else delta
    elif _is_int(current) and isinstance(delta, int):
        run.bins[name] = _wrap64(current + delta)
    elif isinstance(current, float) and isinstance(delta, float):
        run.bins[name] = current + delta
    else:
        # Integers and floats never mix (particle_integer.c / particle_float.c).
        raise _err(12)
    run.answer_nil(name)


def _concat(prepend: bool) -> Callable[[_Run, dict], None]:
    def handler(run: _Run, op: dict) -> None:
        name, value = op["bin"], op.get("val")
        current = run.get(name)
        if not isinstance(value, (str, bytes, bytearray)):
            raise _err(12)
        if current is _MISSING:
            run.bins[name] = value if isinstance(value, str) else bytes(value)
        elif isinstance(current, str) and isinstance(value, str):
            run.bins[name] = value + current if prepend else current + value
        elif _is_blob(current) and isinstance(value, (bytes, bytearray)):
            head, tail = (value, current) if prepend else (current, value)
            run.bins[name] = bytes(head) + bytes(tail)
        else:
            raise _err(12)
        run.answer_nil(name)

    return handler


def _op_touch(run: _Run, op: dict) -> None:
    # Metadata only: the server skips touch when building answers, even with
    # respond-all. A deprecated `val` (ttl) in the op is the store's business
    # (OperateOutcome.ttl).
    pass


def _op_delete(run: _Run, op: dict) -> None:
    # delete() empties the record; it is removed at the end unless later ops
    # add bins. It has no bin name: with respond-all it answers under '' (seen on 8.1).
    run.bins.clear()
    run.answer_nil("")


# -- list ops ------------------------------------------------------------------------


def _list_flags(op: dict) -> int:
    policy = op.get("list_policy") or {}
    if policy.get("list_order", aerospike.LIST_UNORDERED) != aerospike.LIST_UNORDERED:
        raise _unsupported("on an ordered list")
    flags = int(policy.get("write_flags", aerospike.LIST_WRITE_DEFAULT) or 0)
    if flags & ~(_LIST_BOUNDED | _LIST_NO_FAIL):
        raise _unsupported(f"with list write_flags {flags:#x}")
    return flags


def _existing_bin(run: _Run, name: str, kind: type) -> Any:
    """The bin's value, None when the bin is missing; one not of `kind` is an error."""
    value = run.get(name)
    if value is _MISSING:
        return None
    if not isinstance(value, kind):
        raise _err(12)
    return value


def _existing_list(run: _Run, name: str) -> list | None:
    """The bin's list, None when the bin is missing; a non-list bin is an error."""
    return _existing_bin(run, name, list)


def _list_for_insert(run: _Run, name: str) -> list:
    lst = _existing_list(run, name)
    if lst is None:
        # Appends and inserts create the bin, even when they end up a no-op.
        lst = run.bins[name] = []
    return lst


def _single_index(index: int, size: int) -> int:
    # cdt.c calc_index_count(), single-element form: out of range is an error.
    if index >= size or index + size < 0:
        raise _err(26)
    return index + size if index < 0 else index


def _range(index: int, count: int, size: int) -> tuple[int, int]:
    # cdt.c calc_index_count_multi(): clamp to the list, never fail.
    if count < 0:
        count += 1 << 64  # the client sends the count as uint64
    if index >= size:
        return size, 0
    if index < 0:
        index += size
        if index < 0:
            return 0, min(count + index, size) if -index < count else 0
    return index, min(count, size - index)


def _insert(lst: list, index: int, items: list, flags: int) -> None:
    """packed_list_insert(): nil-pad past the end unless the insert is bounded."""
    size = len(lst)
    if index < 0:
        index += size
        if index < 0:
            raise _err(26)
    if flags & _LIST_BOUNDED and index > size:
        if flags & _LIST_NO_FAIL:
            return
        raise _err(26)
    if index > size:
        lst.extend([None] * (index - size))
    lst[index:index] = copy.deepcopy(items)


def _op_list_append(run: _Run, op: dict) -> None:
    flags = _list_flags(op)
    lst = _list_for_insert(run, op["bin"])
    _insert(lst, len(lst), [op.get("val")], flags)
    run.answer(op["bin"], len(lst))


def _op_list_append_items(run: _Run, op: dict) -> None:
    flags = _list_flags(op)
    items = op.get("val")
    if not isinstance(items, list):
        raise _err(4)
    lst = _list_for_insert(run, op["bin"])
    _insert(lst, len(lst), items, flags)
    run.answer(op["bin"], len(lst))


def _op_list_insert(run: _Run, op: dict) -> None:
    flags = _list_flags(op)
    lst = _list_for_insert(run, op["bin"])
    _insert(lst, op["index"], [op.get("val")], flags)
    run.answer(op["bin"], len(lst))


def _op_list_insert_items(run: _Run, op: dict) -> None:
    flags = _list_flags(op)
    items = op.get("val")
    if not isinstance(items, list):
        raise _err(4)
    lst = _list_for_insert(run, op["bin"])
    if items:
        _insert(lst, op["index"], items, flags)
    run.answer(op["bin"], len(lst))


def _op_list_set(run: _Run, op: dict) -> None:
    flags = _list_flags(op)
    lst = _list_for_insert(run, op["bin"])
    index = op["index"]
    if index >= len(lst):
        _insert(lst, index, [op.get("val")], flags)
    else:
        lst[_single_index(index, len(lst))] = copy.deepcopy(op.get("val"))
    run.answer_nil(op["bin"])


def _op_list_pop(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])  # no-op on a missing bin (observed)
    run.answer(op["bin"], lst.pop(_single_index(op["index"], len(lst))))


def _op_list_remove(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    del lst[_single_index(op["index"], len(lst))]
    run.answer(op["bin"], 1)


def _op_list_pop_range(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    start, count = _range(op["index"], op["val"], len(lst))
    popped = lst[start:start + count]
    del lst[start:start + count]
    run.answer(op["bin"], popped)


def _op_list_remove_range(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    start, count = _range(op["index"], op["val"], len(lst))
    del lst[start:start + count]
    run.answer(op["bin"], count)


def _op_list_trim(run: _Run, op: dict) -> None:
    # The server runs trim as an inverted remove-by-index-range counting removals.
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    start, count = _range(op["index"], op["val"], len(lst))
    removed = len(lst) - count
    lst[:] = lst[start:start + count]
    run.answer(op["bin"], removed)


def _op_list_clear(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is not None:
        lst.clear()
    run.answer_nil(op["bin"])


def _op_list_size(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    run.answer(op["bin"], len(lst))


def _op_list_get(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    run.answer(op["bin"], copy.deepcopy(lst[_single_index(op["index"], len(lst))]))


def _op_list_get_range(run: _Run, op: dict) -> None:
    lst = _existing_list(run, op["bin"])
    if lst is None:
        return run.answer_nil(op["bin"])
    start, count = _range(op["index"], op["val"], len(lst))
    run.answer(op["bin"], copy.deepcopy(lst[start:start + count]))


# -- bit ops -----------------------------------------------------------------------
#
# A blob is handled as one big-endian integer: bit 0 is the most significant
# bit of byte 0, as the server numbers them. Checks run in the server's order
# (particle_blob.c): arguments, then bin existence and type, then range.

_RESIZE, _INSERT, _REMOVE, _SET, _OR, _XOR, _AND, _NOT, _LSHIFT, _RSHIFT = range(10)

_BIT_ALLOWED = {
    _RESIZE: _CREATE_ONLY | _UPDATE_ONLY | _NO_FAIL,
    _INSERT: _CREATE_ONLY | _UPDATE_ONLY | _NO_FAIL,
    _REMOVE: _UPDATE_ONLY | _NO_FAIL | _PARTIAL,
}
_BIT_RANGE_ALLOWED = _UPDATE_ONLY | _NO_FAIL | _PARTIAL


def _bit_flags(op: dict, kind: int) -> int:
    flags = int((op.get("policy") or {}).get("bit_write_flags", 0) or 0)
    if flags & ~_BIT_ALLOWED.get(kind, _BIT_RANGE_ALLOWED):
        raise _err(4)
    if flags & _CREATE_ONLY and flags & _UPDATE_ONLY:
        raise _err(4)
    return flags


def _value_buf(op: dict, bit_size: int | None = None) -> bytes:
    buf = op.get("value")
    if not _is_blob(buf) or not buf:
        raise _err(4)
    if bit_size is not None and len(buf) * 8 < bit_size:
        raise _err(4)
    return bytes(buf)


def _normalize(offset: int, size_bits: int, exists: bool) -> int:
    """A bit offset from the end becomes one from the start (bits_normalize_offset)."""
    if offset < 0:
        if not exists or -offset > size_bits:
            raise _err(4)
        offset += size_bits
    return offset


def _bits_get_region(blob: bytes, offset: int, size: int) -> int:
    total = len(blob) * 8
    return (int.from_bytes(blob, "big") >> (total - offset - size)) & ((1 << size) - 1)


def _bits_put_region(blob: bytes, offset: int, size: int, region: int) -> bytes:
    total = len(blob) * 8
    shift = total - offset - size
    mask = ((1 << size) - 1) << shift
    whole = (int.from_bytes(blob, "big") & ~mask) | ((region << shift) & mask)
    return whole.to_bytes(len(blob), "big")


def _bits_modify(kind: int) -> Callable[[_Run, dict], None]:
    def handler(run: _Run, op: dict) -> None:
        name = op["bin"]
        flags = _bit_flags(op, kind)
        args = _bit_args(op, kind)
        current = run.get(name)
        if current is not _MISSING:
            if flags & _CREATE_ONLY:
                if not flags & _NO_FAIL:
                    raise _err(6)
                return run.answer_nil(name)
            if not _is_blob(current):
                raise _err(12)
            blob: bytes | None = bytes(current)
        else:
            if kind not in (_RESIZE, _INSERT) or flags & _UPDATE_ONLY:
                if not flags & _NO_FAIL:
                    raise _err(17)
                return run.answer_nil(name)
            blob = None
        new = _BIT_APPLY[kind](blob, args, flags)
        if new is not None:
            run.bins[name] = new
        run.answer_nil(name)  # bit modify ops have no value of their own (observed)

    return handler


def _bit_args(op: dict, kind: int) -> dict[str, Any]:
    if kind == _RESIZE:
        sub = int(op.get("resize_flags", 0) or 0)
        if sub & ~(_FROM_FRONT | _GROW_ONLY | _SHRINK_ONLY) or (sub & _GROW_ONLY and sub & _SHRINK_ONLY):
            raise _err(4)
        if op["byte_size"] < 0:
            raise _err(4)
        return {"size": op["byte_size"], "sub": sub}
    if kind == _INSERT:
        return {"offset": op["byte_offset"], "value": _value_buf(op)}
    if kind == _REMOVE:
        if op["byte_size"] <= 0:
            raise _err(4)
        return {"offset": op["byte_offset"], "size": op["byte_size"]}
    size = op["bit_size"]
    if size <= 0:
        raise _err(4)
    args: dict[str, Any] = {"offset": op["bit_offset"], "size": size}
    if kind in (_SET, _OR, _XOR, _AND):
        args["value"] = _value_buf(op, size)
    elif kind in (_LSHIFT, _RSHIFT):
        if op["value"] < 0:
            raise _err(4)
        args["shift"] = op["value"]
    return args


def _apply_resize(blob: bytes | None, args: dict, flags: int) -> bytes | None:
    old = blob or b""
    new_size, sub = args["size"], args["sub"]
    if new_size == len(old):
        return None
    if new_size < len(old):
        if sub & _GROW_ONLY:
            if flags & _NO_FAIL:
                return None
            raise _err(4)
        return old[len(old) - new_size:] if sub & _FROM_FRONT else old[:new_size]
    if sub & _SHRINK_ONLY:
        if flags & _NO_FAIL:
            return None
        raise _err(4)
    pad = bytes(new_size - len(old))
    return pad + old if sub & _FROM_FRONT else old + pad


def _apply_insert(blob: bytes | None, args: dict, flags: int) -> bytes:
    old = blob or b""
    offset = _normalize(args["offset"] * 8, len(old) * 8, blob is not None) // 8
    if offset >= len(old):
        return old + bytes(offset - len(old)) + args["value"]
    return old[:offset] + args["value"] + old[offset:]


def _apply_remove(blob: bytes | None, args: dict, flags: int) -> bytes | None:
    assert blob is not None  # remove never creates
    offset = _normalize(args["offset"] * 8, len(blob) * 8, True) // 8
    size = args["size"]
    if offset >= len(blob):
        if flags & _NO_FAIL:
            return None
        raise _err(4)
    if offset + size > len(blob):
        if not flags & _PARTIAL:
            if flags & _NO_FAIL:
                return None
            raise _err(4)
        size = len(blob) - offset
    return blob[:offset] + blob[offset + size:]


def _apply_range(kind: int) -> Callable[[bytes | None, dict, int], bytes | None]:
    def apply(blob: bytes | None, args: dict, flags: int) -> bytes | None:
        assert blob is not None  # these never create
        total = len(blob) * 8
        offset = _normalize(args["offset"], total, True)
        size = args["size"]
        byte_offset, op_bytes = offset // 8, (offset % 8 + size + 7) // 8
        if byte_offset >= len(blob):
            if flags & _NO_FAIL:
                return None
            raise _err(26)
        if byte_offset + op_bytes > len(blob):
            if not flags & _PARTIAL:
                if flags & _NO_FAIL:
                    return None
                raise _err(26)
            size = total - offset
        old = _bits_get_region(blob, offset, size)
        mask = (1 << size) - 1
        if kind in (_SET, _OR, _XOR, _AND):
            value = args["value"]
            # The value's leading bits are the ones used (left-aligned, as the server reads it).
            operand = int.from_bytes(value, "big") >> (len(value) * 8 - size)
            new = {
                _SET: operand,
                _OR: old | operand,
                _XOR: old ^ operand,
                _AND: old & operand,
            }[kind]
        elif kind == _NOT:
            new = ~old & mask
        elif kind == _LSHIFT:
            new = (old << args["shift"]) & mask
        else:
            new = old >> args["shift"]
        return _bits_put_region(blob, offset, size, new)

    return apply


_BIT_APPLY: dict[int, Callable[[bytes | None, dict, int], bytes | None]] = {
    _RESIZE: _apply_resize,
    _INSERT: _apply_insert,
    _REMOVE: _apply_remove,
    **{k: _apply_range(k) for k in (_SET, _OR, _XOR, _AND, _NOT, _LSHIFT, _RSHIFT)},
}


def _bits_read(reader: Callable[[int, int, dict], Any], max_size: int | None = None) -> Callable[[_Run, dict], None]:
    def handler(run: _Run, op: dict) -> None:
        name, size = op["bin"], op["bit_size"]
        if size <= 0 or (max_size is not None and size > max_size):
            raise _err(4)
        current = run.get(name)
        if current is _MISSING:
            return run.answer_nil(name)
        if not _is_blob(current):
            raise _err(12)
        blob = bytes(current)
        offset = _normalize(op["bit_offset"], len(blob) * 8, True)
        byte_offset, op_bytes = offset // 8, (offset % 8 + size + 7) // 8
        # Reads carry no policy: out of range always fails.
        if byte_offset >= len(blob) or byte_offset + op_bytes > len(blob):
            raise _err(26)
        run.answer(name, reader(_bits_get_region(blob, offset, size), size, op))

    return handler


def _read_get(region: int, size: int, op: dict) -> bytearray:
    n_bytes = (size + 7) // 8
    return bytearray((region << (n_bytes * 8 - size)).to_bytes(n_bytes, "big"))


def _read_count(region: int, size: int, op: dict) -> int:
    return bin(region).count("1")


def _read_scan(from_left: bool) -> Callable[[int, int, dict], int]:
    def read(region: int, size: int, op: dict) -> int:
        bits = format(region, f"0{size}b")
        want = "1" if op.get("value") else "0"
        return bits.find(want) if from_left else bits.rfind(want)

    return read


def _read_get_int(region: int, size: int, op: dict) -> int:
    if op.get("sign") and region >> (size - 1):
        return region - (1 << size)
    return region



# -- map ops (the two the block records use: aeroqueue.blocks) --------------------------

_MAP_RETURN_NONE = aerospike.MAP_RETURN_NONE
_MAP_RETURN_COUNT = aerospike.MAP_RETURN_COUNT
_MAP_RETURN_KEY_VALUE = aerospike.MAP_RETURN_KEY_VALUE


def _existing_map(run: _Run, name: str) -> dict | None:
    """The bin's map, None when the bin is missing; a non-map bin is an error."""
    return _existing_bin(run, name, dict)


_MAP_CREATE_ONLY = aerospike.MAP_WRITE_FLAGS_CREATE_ONLY
_MAP_NO_FAIL = aerospike.MAP_WRITE_FLAGS_NO_FAIL
_MAP_PARTIAL = aerospike.MAP_WRITE_FLAGS_PARTIAL


def _op_map_put_items(run: _Run, op: dict) -> None:
    policy = dict(op.get("map_policy") or {})
    flags = policy.pop("map_write_flags", 0)
    if policy or flags & ~(_MAP_CREATE_ONLY | _MAP_NO_FAIL | _MAP_PARTIAL):
        raise _unsupported(f"map_put_items with map policy {op.get('map_policy')}")
    items = op.get("val")
    if not isinstance(items, dict):
        raise _err(4)
    m = _existing_map(run, op["bin"])
    merged = dict(m or {})
    new = {(_copy(k) if type(k) is str else k): _copy(v) for k, v in items.items()}
    if flags & _MAP_CREATE_ONLY:
        there = [k for k in new if k in merged]
        if there and not flags & _MAP_NO_FAIL:
            raise _err(24)
        if there and not flags & _MAP_PARTIAL:
            new = {}  # observed: no fail, not partial: none of them
        for k in there:
            new.pop(k, None)
    merged.update(new)
    # Put even when `items` is empty: the bin is created (observed: an empty map).
    run.bins[op["bin"]] = key_ordered(merged)
    run.answer(op["bin"], len(merged))


def _op_map_remove_by_key_list(run: _Run, op: dict) -> None:
    if op.get("inverted"):
        raise _unsupported("map_remove_by_key_list inverted")
    rt = op.get("return_type", _MAP_RETURN_NONE)
    if rt not in (_MAP_RETURN_NONE, _MAP_RETURN_COUNT, _MAP_RETURN_KEY_VALUE):
        raise _unsupported(f"map_remove_by_key_list with return type {rt}")
    name = op["bin"]
    m = _existing_map(run, name)
    if m is None:
        run.answer(name, None)  # observed: nil whatever the return type
        return
    # Answered in key order, as the server does (observed).
    gone = key_ordered({k: m[k] for k in op.get("val") or [] if k in m})
    if gone:
        run.bins[name] = {k: v for k, v in m.items() if k not in gone}
    if rt == _MAP_RETURN_NONE:
        run.answer(name, None)
    elif rt == _MAP_RETURN_COUNT:
        run.answer(name, len(gone))
    else:
        run.answer(name, [x for k, v in gone.items() for x in (k, _copy(v))])


_HANDLERS: dict[int, Callable[[_Run, dict], None]] = {
    _READ: _op_read,
    _WRITE: _op_write,
    _INCR: _op_incr,
    _APPEND: _concat(prepend=False),
    _PREPEND: _concat(prepend=True),
    _TOUCH: _op_touch,
    _DELETE: _op_delete,
    _EXPR_READ: _op_expr_read,
    _EXPR_WRITE: _op_expr_write,
    aerospike.OP_LIST_APPEND: _op_list_append,
    aerospike.OP_LIST_APPEND_ITEMS: _op_list_append_items,
    aerospike.OP_LIST_INSERT: _op_list_insert,
    aerospike.OP_LIST_INSERT_ITEMS: _op_list_insert_items,
    aerospike.OP_LIST_SET: _op_list_set,
    aerospike.OP_LIST_POP: _op_list_pop,
    aerospike.OP_LIST_REMOVE: _op_list_remove,
    aerospike.OP_LIST_POP_RANGE: _op_list_pop_range,
    aerospike.OP_LIST_REMOVE_RANGE: _op_list_remove_range,
    aerospike.OP_LIST_TRIM: _op_list_trim,
    aerospike.OP_LIST_CLEAR: _op_list_clear,
    aerospike.OP_LIST_SIZE: _op_list_size,
    aerospike.OP_LIST_GET: _op_list_get,
    aerospike.OP_LIST_GET_RANGE: _op_list_get_range,
    aerospike.OP_MAP_PUT_ITEMS: _op_map_put_items,
    aerospike.OP_MAP_REMOVE_BY_KEY_LIST: _op_map_remove_by_key_list,
    aerospike.OP_BIT_RESIZE: _bits_modify(_RESIZE),
    aerospike.OP_BIT_INSERT: _bits_modify(_INSERT),
    aerospike.OP_BIT_REMOVE: _bits_modify(_REMOVE),
    aerospike.OP_BIT_SET: _bits_modify(_SET),
    aerospike.OP_BIT_OR: _bits_modify(_OR),
    aerospike.OP_BIT_XOR: _bits_modify(_XOR),
    aerospike.OP_BIT_AND: _bits_modify(_AND),
    aerospike.OP_BIT_NOT: _bits_modify(_NOT),
    aerospike.OP_BIT_LSHIFT: _bits_modify(_LSHIFT),
    aerospike.OP_BIT_RSHIFT: _bits_modify(_RSHIFT),
    aerospike.OP_BIT_GET: _bits_read(_read_get),
    aerospike.OP_BIT_COUNT: _bits_read(_read_count),
    aerospike.OP_BIT_LSCAN: _bits_read(_read_scan(from_left=True)),
    aerospike.OP_BIT_RSCAN: _bits_read(_read_scan(from_left=False)),
    aerospike.OP_BIT_GET_INT: _bits_read(_read_get_int, max_size=64),
}
