"""Plain data passed between the embedded store and its interpreters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Aerospike's "citrusleaf epoch": record.last_update_time() counts from here.
CITRUSLEAF_EPOCH_MS = 1262304000000
NEVER_EXPIRE = 0xFFFFFFFF  # what a client reads back as the ttl of a never-expiring record
MAX_BIN_NAME = 15


@dataclass
class RecordView:
    """One record as the store holds it, handed to a UDF, operate or expression."""

    exists: bool
    bins: dict[str, Any]  # decoded Python values: int, float, str, bool, bytes, list, dict
    gen: int  # 0 when the record does not exist
    void_time_ms: int  # unix ms at which the record expires; 0 = never
    last_update_ms: int  # unix ms; 0 when the record does not exist
    digest: bytes  # 20 bytes
    set_name: str
    user_key: Any | None  # stored only with POLICY_KEY_SEND
    now_ms: int  # the server's clock (injectable in the embedded backend)

    @property
    def ttl_seconds(self) -> int:
        """Remaining life in seconds, 0 for never-expiring or missing (record.ttl semantics)."""
        if not self.exists or not self.void_time_ms:
            return 0
        return max(1, -(-(self.void_time_ms - self.now_ms) // 1000))


@dataclass
class UdfOutcome:
    """What a UDF run asks the store to do."""

    result: Any  # the function's return value, converted to Python
    action: str = "none"  # "none" | "write" | "remove"
    bins: dict[str, Any] | None = None  # action == "write": the complete bins afterwards
    ttl: int | None = None  # set by record.set_ttl (seconds, Aerospike semantics), else None


class UdfFailure(Exception):
    """A UDF failed; `message` is exactly what the server puts after its node prefix."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class OperateOutcome:
    """What an operate() call asks the store to do, and what it answers."""

    results: list[tuple[str, Any]] = field(default_factory=list)  # (bin, value) in op order
    wrote: bool = False  # at least one write op ran: generation + 1, last-update time = now
    bins: dict[str, Any] = field(default_factory=dict)  # the complete bins afterwards
    touched: bool = False  # a touch op ran (rewrites metadata only)
    ttl: int | None = None  # a touch op's ttl (seconds), if it gave one


def key_order(k: Any) -> tuple:
    """Where a map key sorts on the server (docs: cdt-ordering): booleans, integers,
    strings (by code point, which is UTF-8's byte order), blobs, doubles."""
    kind = type(k)
    if kind is int:
        return (2, k, "")
    if kind is str:
        return (3, 0, k)
    if kind is bytes:
        return (5, 0, k)
    if kind is float:
        return (6, k, "")
    if kind is bool:
        return (1, int(k), "")
    return (4, 0, repr(k))


def key_ordered(d: dict) -> dict:
    """`d` with its keys in the server's order: a map comes back from the server
    sorted by key (nested ones too), whatever order it was written in."""
    keys = list(d)
    ordered = sorted(keys) if all(type(k) is str for k in keys) else sorted(keys, key=key_order)
    return d if ordered == keys else {k: d[k] for k in ordered}
