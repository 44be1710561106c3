"""A client whose calls `Backend.close` waits for.

The aerospike client crashes the whole process (SIGSEGV) when it is closed while
another thread has a call in flight on it: measured with client 19.3, four
threads looping batch reads and a close, three crashes in three runs. An
application that shuts down while its request threads still run would die that
way, so every call goes through `ClientGuard`, which counts the calls in flight;
`close` refuses new calls, waits for the running ones, and only then closes the
client. A call after close raises `StoreClosed` (nothing was sent).

The cost is a Python frame and two uncontended lock round trips per call, well
under a microsecond against the hundred or more of a round trip.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import StoreClosed, StoreForked

# Client calls that hand back an object whose own calls reach the server later
# (a query's results, foreach, paginate): that object is guarded too.
_DEFERRED = frozenset({"query", "scan"})
# Client calls that never reach the server (and `is_connected` answers False once closed).
_LOCAL = frozenset({"is_connected", "get_key_partition_id", "get_policies", "get_expression_base64", "get_cdtctx_base64"})


class _InFlight:
    """The calls in flight on one client, and whether it is closing."""

    def __init__(self, fork_safe: bool = True) -> None:
        self.closed = False
        self.fork_safe = fork_safe
        self.forked = False  # this process is a fork of the one that opened the client
        self._fresh()
        _STATES.add(self)

    def _fresh(self) -> None:
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)
        self.count = 0


_STATES: weakref.WeakSet[_InFlight] = weakref.WeakSet()


_FORKED = " ".join((StoreForked.__doc__ or "").split())


def _after_fork() -> None:
    # A forked child has none of its parent's calls in flight, and a lock another
    # thread held at the fork would stay held in the child for ever.
    for state in list(_STATES):
        state._fresh()
        state.forked = not state.fork_safe


os.register_at_fork(after_in_child=_after_fork)


class ClientGuard:
    """Passes every attribute of `raw` through; its methods are counted while they run."""

    def __init__(self, raw: Any, state: _InFlight | None = None, *, fork_safe: bool = True) -> None:
        object.__setattr__(self, "raw", raw)  # for a caller that must measure the client alone (benchmarks)
        object.__setattr__(self, "_state", state or _InFlight(fork_safe))

    def __setattr__(self, name: str, value: Any) -> None:
        # A query is set up by its attributes (max_records, paginate's state): they are the raw object's.
        setattr(self.raw, name, value)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.raw, name)
        if not callable(attr) or name.startswith("__") or name in _LOCAL:
            return attr
        guarded = self._guarded(attr, name)
        # Kept on the instance: later lookups find it without coming here again.
        self.__dict__[name] = guarded
        return guarded

    def _guarded(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        state = self._state
        deferred = name in _DEFERRED

        def call(*args: Any, **kwargs: Any) -> Any:
            with state.lock:  # looked up each time: a forked child gets a new one
                if state.closed:
                    raise StoreClosed(f"{name}: the store connection is closed")
                if state.forked:
                    # Shared with the parent, its sockets carried both processes' calls:
                    # answers crossed (a session 'already exists', another call's reply).
                    raise StoreForked(f"{name}: {_FORKED}")
                state.count += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                with state.lock:
                    state.count -= 1
                    if state.closed and not state.count:
                        state.idle.notify_all()
            return ClientGuard(out, state) if deferred else out

        call.__name__ = name
        return call

    def in_flight(self) -> int:
        with self._state.lock:
            return self._state.count

    def close(self, wait_s: float) -> bool:
        """Refuse new calls, wait up to `wait_s` for those in flight, then close the
        client. False, and the client left open, if calls were still running then:
        closing it under them would crash the process, leaving it open only holds
        its sockets until the process ends."""
        state = self._state
        give_up = time.monotonic() + wait_s
        with state.lock:
            state.closed = True
            while state.count:
                left = give_up - time.monotonic()
                if left <= 0:
                    return False
                state.idle.wait(left)
        if state.forked:
            return True  # the parent's client: its close (its threads are not here) is the parent's to make
        self.raw.close()
        return True
