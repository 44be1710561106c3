"""The bytes the server gives a record: what the embedded store refuses as too big,
and what a load checks a payload against before it writes anything.

Aerospike's flat record: a header, the set's name, the stored key, and per bin its
name, a length and type, and the value after a 4-byte length: a string or blob as
its bytes, a list or map as msgpack (strings and blobs in it with one more byte,
their particle type). Calibrated on Aerospike CE 8.1 with max-record-size 1 MiB (the largest value it took, by shape:
tests/contract/test_records.py): the embedded store refuses what it refuses, give
or take a few bytes, and never a payload the server stores.
"""

from __future__ import annotations

import marshal
from typing import Any

_RECORD_BASE = 40


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))  # a lone surrogate is stored as the client sends it


def packed_size(value: Any) -> int:
    """`value`'s msgpack size inside a list or map, as the server packs it."""
    kind = type(value)
    if value is None or kind is bool:
        return 1
    if kind is int:
        if -32 <= value < 128:
            return 1
        if -128 <= value < 256:
            return 2
        if -32768 <= value < 65536:
            return 3
        if -(2**31) <= value < 2**32:
            return 5
        return 9
    if kind is float:
        return 9
    if kind is str or kind is bytes or kind is bytearray:
        n = (_utf8_len(value) if kind is str else len(value)) + 1  # + the particle type
        if n < 32:  # a blob too (server 8.1 packs it as msgpack str, with its particle type)
            return 1 + n
        return n + (2 if n < 256 else 3 if n < 65536 else 5)
    if kind is list or kind is tuple:
        return _header(len(value)) + sum(map(packed_size, value))
    if kind is dict:
        return _header(len(value)) + sum(packed_size(k) + packed_size(v) for k, v in value.items())
    return len(marshal.dumps(value))  # no other type reaches a record (the client refuses them)


def _header(n: int) -> int:
    return 1 if n < 16 else 3 if n < 65536 else 5


def bin_size(value: Any) -> int:
    """The bytes a bin holding `value` takes in a record, its name aside."""
    kind = type(value)
    if kind is str:
        n = _utf8_len(value)
    elif kind is bytes or kind is bytearray:
        n = len(value)
    elif kind is list or kind is tuple or kind is dict:
        n = packed_size(value)
    else:
        return packed_size(value)  # an integer, a float, a bool: fixed, small
    return 4 + n  # a 4-byte length


def record_size(set_name: str, bins: dict[str, Any], user_key: Any = None) -> int:
    """The bytes the server would give a record of these bins (and stored key) in
    this set (the set's name is stored with the record too)."""
    key = 0 if user_key is None else packed_size(user_key) + 2
    return _RECORD_BASE + len(set_name) + key + sum(len(name) + 2 + bin_size(v) for name, v in bins.items())
