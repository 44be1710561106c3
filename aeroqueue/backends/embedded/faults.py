"""Fault injection for the embedded backend, so retry and recovery paths get tested.

A fault matches a client call (``op``: "apply", "batch_apply", "operate",
"put", "get", ...; ``*`` for any), optionally a UDF function name and a
substring of the user key, or for operations, ``writes``: "bin=value", the
value one of its write ops gives a bin (a native job transition, e.g.
"state=done" for aeroqueue's native complete), and fires ``times`` times after letting ``skip``
matching calls through. It either raises an ``aerospike.exception`` class by
name (``RecordBusy``, ``TimeoutError``, ...) or kills the process with SIGKILL
(``crash=True``). ``when="before"`` fires before the call touches the store
(nothing happened); ``when="after"`` fires after the write committed (the
call happened, but the caller never hears so: the in-doubt case).

Faults can be set from Python (``client.faults.add(...)``) or, for a child
process, from the environment: ``AEROQUEUE_EMBEDDED_FAULTS`` holds a JSON list
of fault objects.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

ENV_FAULTS = "AEROQUEUE_EMBEDDED_FAULTS"

_CODES = {
    "RecordBusy": (14, "AEROSPIKE_ERR_RECORD_BUSY"),
    "TimeoutError": (9, "AEROSPIKE_ERR_TIMEOUT"),
    "ServerError": (1, "AEROSPIKE_ERR_SERVER"),
    "DeviceOverload": (18, "AEROSPIKE_ERR_DEVICE_OVERLOAD"),
    "ServerNotAvailable": (-8, "AEROSPIKE_ERR_SERVER_NOT_AVAILABLE"),
}


@dataclass
class Fault:
    op: str = "*"
    function: str | None = None
    key: str | None = None
    error: str | None = None
    crash: bool = False
    when: str = "before"
    times: int = 1  # -1: every matching call
    skip: int = 0
    writes: str | None = None  # "bin=value": only operations writing that value to that bin

    def __post_init__(self) -> None:
        if self.when not in ("before", "after"):
            raise ValueError(f"fault 'when' must be 'before' or 'after', not {self.when!r}")
        if not self.crash and self.error not in _CODES:
            raise ValueError(f"fault needs crash=True or an error among {sorted(_CODES)}, not {self.error!r}")


class Faults:
    """The faults armed on one client."""

    def __init__(self, faults: list[Fault] | None = None) -> None:
        self._faults = list(faults or [])
        self._lock = threading.Lock()
        self.fired = 0

    @classmethod
    def from_env(cls) -> Faults:
        text = os.environ.get(ENV_FAULTS)
        if not text:
            return cls()
        try:
            items = json.loads(text)
            return cls([Fault(**item) for item in items])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{ENV_FAULTS} is not a JSON list of faults: {e}") from None

    def add(self, **kwargs: Any) -> Fault:
        fault = Fault(**kwargs)
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def armed(self) -> bool:
        """Whether any fault is waiting (the fast paths then step aside)."""
        return bool(self._faults)

    def check(self, op: str, user_key: Any, function: str | None, when: str, ops: list[dict] | None = None) -> None:
        if not self._faults:  # the common case: nothing armed, no lock taken
            return
        with self._lock:
            fault = self._match(op, user_key, function, when, ops)
        if fault is None:
            return
        if fault.crash:
            os.kill(os.getpid(), signal.SIGKILL)
        from .operations import server_error

        code, text = _CODES[fault.error or ""]
        err = server_error(fault.error or "", code, text)
        err.in_doubt = when == "after"  # type: ignore[attr-defined]
        raise err

    def _match(self, op: str, user_key: Any, function: str | None, when: str, ops: list[dict] | None) -> Fault | None:
        for fault in self._faults:
            if fault.when != when or fault.op not in ("*", op):
                continue
            if fault.function is not None and fault.function != function:
                continue
            if fault.writes is not None and fault.writes not in _writes(ops):
                continue
            if fault.key is not None and fault.key not in str(user_key):
                continue
            if fault.skip > 0:
                fault.skip -= 1
                continue
            if fault.times == 0:
                continue
            if fault.times > 0:
                fault.times -= 1
            self.fired += 1
            return fault
        return None


def _writes(ops: list[dict] | None) -> set[str]:
    """"bin=value" for each plain write op."""
    import aerospike

    return {f"{o.get('bin')}={o.get('val')}" for o in ops or () if o.get("op") == aerospike.OPERATOR_WRITE}
