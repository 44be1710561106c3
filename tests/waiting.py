"""Polling in tests: wait until a condition holds, or fail saying what never came;
and a module's clock to hold still or to watch its sleeps (`ModuleTime`), for a
test whose case needs "within N s" to hold or that asks whether code waited."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T], timeout_s: float = 30.0, *, step_s: float = 0.05) -> T:
    """`check()`'s first truthy answer, asked every `step_s`; an AssertionError that
    names `what` (the awaited state) if none comes within `timeout_s`. The check is
    asked once more after the time is up, so a slow last step still counts."""
    give_up = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < give_up, f"{what}: not within {timeout_s:g} s"
        time.sleep(step_s)


class ModuleTime:
    """A stand-in for a module's `time` (``monkeypatch.setattr(module, "time", clock)``),
    the rest of it the real module's. Its `monotonic` stands still within `held()`: a
    window the code measures with it cannot close while held, however slow a loaded
    machine makes the steps in between. Its `sleep` sleeps, and records how long in
    `slept`: whether the code waited is seen, not guessed from how long it took."""

    def __init__(self) -> None:
        self._at: float | None = None
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return time.monotonic() if self._at is None else self._at

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        time.sleep(seconds)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self._at = time.monotonic()
        try:
            yield
        finally:
            self._at = None

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
