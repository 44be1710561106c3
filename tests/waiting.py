"""Polling in tests: wait until a condition holds, or fail saying what never came."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
