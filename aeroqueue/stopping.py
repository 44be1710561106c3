"""A stop that a SIGTERM/SIGINT handler may ask for without hanging its process.

Python runs a signal handler on the main thread between two of its bytecodes,
wherever that thread is: possibly inside `threading.Event.wait()` or `.set()`
of the very event the handler would set, holding the event's lock. That lock is
not reentrant, so a handler calling `event.set()` there waits for its own thread
for ever (the worker hung so after SIGTERM: tests/sessions/signal_tripwire.py).
A handler may only assign: `Stop.on_signal` does, and `Stop.wait` looks at the
assignment every `tick_s`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

TICK_S = 0.2


class Stop:
    """`threading.Event`'s `set`, `is_set` and `wait`, plus `on_signal`: a signal
    handler that asks for the stop, seen by `wait` within `tick_s`."""

    def __init__(self, tick_s: float = TICK_S) -> None:
        self._event = threading.Event()
        self._signalled = False
        self.tick_s = tick_s

    def on_signal(self, signum: int, frame: Any = None) -> None:
        self._signalled = True  # only an assignment: no lock, no I/O (module docstring)

    def set(self) -> None:
        """Stop, from code (never from a signal handler: `on_signal`)."""
        self._event.set()

    def is_set(self) -> bool:
        return self._signalled or self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Until stopped or `timeout` seconds have passed; whether stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = self.tick_s if deadline is None else min(self.tick_s, deadline - time.monotonic())
            if left <= 0:
                break
            self._event.wait(left)
        return self.is_set()
