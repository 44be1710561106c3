"""A job's result as it will be stored: a plain JSON value.

The sync copies results to MySQL as JSON, and the Aerospike client takes no
other types: a tuple, a set or an object in a UDF's arguments makes it raise,
and leaves its heap corrupt, so that a later call aborts the process
(``malloc(): unaligned tcache chunk detected``, client 19.3 against the 8.1
server). Every way a result reaches the store goes through here first: the
worker (a handler's result), ``aeroqueue complete --result``, and the API
handler's own `Queue.complete`, `complete_many` and `complete_and_reserve`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import ResultNotStorable
from .keys import INT64
from .loading import MAX_DEPTH, NUL_WHY, holds_nul, too_deep

__all__ = ["ResultNotStorable", "checked_result", "result_size", "storable_result", "too_big_to_store"]


def storable_result(value: Any, what: str = "the handler's result") -> Any:
    """The result as it will be stored: plain JSON values (tuples become lists, keys
    strings; no NaN or infinity, integers within 64 bits), or `ResultNotStorable`
    saying why not (of `what`)."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # a lone surrogate passes json.dumps, not a database
        stored = json.loads(text, parse_int=_int64)
    except (TypeError, ValueError, RecursionError) as e:
        raise ResultNotStorable(f"{what} cannot be stored as JSON: {e}") from None
    if too_deep(stored, text):
        raise ResultNotStorable(f"{what} cannot be stored as JSON: nested more than {MAX_DEPTH} deep "
                                "(MariaDB's JSON limit, where the sync copies it)")
    if "\\u0000" in text and holds_nul(stored):
        raise ResultNotStorable(f"{what} cannot be stored: {NUL_WHY}")
    return stored


def too_big_to_store(value: Any, max_record_size: int, what: str = "the result") -> str:
    """Why the store refused `value` (already storable) as too big for its job's record,
    with the sizes and what to do instead: the store's own answer named neither."""
    n = result_size(value)
    size = "" if n is None else f"it is {n:,} bytes of JSON, "
    return (f"{what} is too big to store: {size}more than its job's record can hold (the store's max-record-size "
            f"is {max_record_size:,} bytes, for the whole record); store big results elsewhere (a file, an "
            "object store) and return a reference to them")


def result_size(value: Any) -> int | None:
    """Bytes of `value`'s compact JSON (UTF-8); None if it is not a JSON value."""
    try:
        return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError):
        return None


def checked_result(value: Any, what: str = "the result") -> Any:
    """`storable_result`, without its JSON round trip for a value already stored as it
    is (the worker's results have had it; most results are None or small maps)."""
    return value if value is None or _plain(value) else storable_result(value, what)


def _plain(value: Any) -> bool:
    """Whether `value` is stored exactly as it is: only JSON's own types, string keys,
    valid Unicode strings without NUL, 64-bit integers, finite floats, within MAX_DEPTH. False
    means "not known to be": `storable_result` then converts it or says why not."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        kind = type(v)
        if kind is str:
            if "\x00" in v or not (v.isascii() or _utf8(v)):
                return False
        elif kind is int:
            if not INT64[0] <= v <= INT64[1]:
                return False
        elif kind is float:
            if not math.isfinite(v):
                return False
        elif kind is dict or kind is list:
            if depth > MAX_DEPTH:
                return False
            if kind is dict:
                for k in v:
                    if type(k) is not str or "\x00" in k or not (k.isascii() or _utf8(k)):
                        return False
                v = v.values()
            stack.extend((x, depth + 1) for x in v)
        elif v is not None and kind is not bool:
            return False
    return True


def _utf8(text: str) -> bool:
    """Whether `text` is valid Unicode (no lone surrogate), as a store and MySQL need."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _int64(text: str) -> int:
    n = int(text)
    if not INT64[0] <= n <= INT64[1]:
        raise ValueError(f"integer {text} does not fit in 64 bits")
    return n
