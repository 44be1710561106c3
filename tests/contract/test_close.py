"""Closing a store connection while other threads still use it.

The aerospike client crashes the process (SIGSEGV) when it is closed under a
call in flight; `Backend.close` waits for those calls (`backends.guard`), and
later calls raise `StoreClosed`. The crash case runs in a child process, so that
a crash fails the test instead of ending the test run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from aeroqueue.backends import open_backend
from aeroqueue.backends.guard import ClientGuard
from aeroqueue.errors import StoreClosed

CHILD = r"""
import json, sys, threading, time
from aeroqueue.backends import open_backend
from aeroqueue.errors import StoreClosed

backend = open_backend(sys.argv[1])
set_name = sys.argv[2]
names = [f"r{i}" for i in range(100)]
for n in names[:10]:
    backend.put(set_name, n, {"v": 1})
stop = threading.Event()
answered, refused, other = [0], [0], []

def loop():
    while not stop.is_set():
        try:
            got = backend.batch_bins(set_name, names, ["v"])
            assert len(got) == len(names)
            answered[0] += 1
        except StoreClosed:
            refused[0] += 1
            time.sleep(0.001)
        except Exception as e:
            other.append(repr(e))

threads = [threading.Thread(target=loop) for _ in range(4)]
for t in threads:
    t.start()
time.sleep(0.3)
backend.close()
time.sleep(0.2)
stop.set()
for t in threads:
    t.join()
print(json.dumps({"answered": answered[0], "refused": refused[0], "other": other[:5]}))
"""


def test_close_under_calls_in_flight_neither_crashes_nor_cuts_them(store_url: str, set_name: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, store_url, set_name], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"the process died (exit {out.returncode}): {out.stderr[-2000:]}"
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["other"] == [], seen
    assert seen["answered"] > 0 and seen["refused"] > 0, seen


class _Blocking:
    """A client whose `get` waits for an event: a call in flight for as long as a test wants."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed_at: float | None = None
        self.returned_at: float | None = None

    def get(self, key: Any) -> str:
        self.entered.set()
        self.release.wait(10)
        self.returned_at = time.monotonic()
        return "answer"

    def close(self) -> None:
        self.closed_at = time.monotonic()


def test_close_waits_for_the_call_in_flight_then_refuses_new_ones() -> None:
    raw = _Blocking()
    guard = ClientGuard(raw)
    answers: list[str] = []
    caller = threading.Thread(target=lambda: answers.append(guard.get("k")))
    caller.start()
    assert raw.entered.wait(5)
    closer = threading.Thread(target=guard.close, args=(10,))
    closer.start()
    time.sleep(0.2)
    assert raw.closed_at is None, "closed under a call in flight"
    assert closer.is_alive()
    raw.release.set()
    caller.join(5)
    closer.join(5)
    assert answers == ["answer"]
    assert raw.closed_at is not None and raw.returned_at is not None and raw.closed_at >= raw.returned_at
    with pytest.raises(StoreClosed, match="get: the store connection is closed"):
        guard.get("k")


def test_a_closed_backend_says_so(store_url: str) -> None:
    backend = open_backend(store_url)
    assert backend.client.is_connected()
    backend.close()
    assert not backend.client.is_connected(), "a local question, answered, not refused"
    with pytest.raises(StoreClosed, match="closed"):
        backend.get("aqt_closed", "r0")


def test_a_call_stuck_past_the_wait_leaves_the_client_open() -> None:
    raw = _Blocking()
    guard = ClientGuard(raw)
    caller = threading.Thread(target=guard.get, args=("k",))
    caller.start()
    assert raw.entered.wait(5)
    assert guard.close(0.1) is False
    assert raw.closed_at is None and guard.in_flight() == 1
    raw.release.set()
    caller.join(5)
    assert guard.in_flight() == 0


def test_a_query_from_the_guard_is_set_up_on_the_real_query() -> None:
    """A scan pages by the query's own attributes (max_records, paginate): set
    through the guard, they must land on the client's query object."""

    class Query:
        max_records = 0

        def results(self) -> list[int]:
            return list(range(self.max_records))

    class Raw:
        def query(self, ns: str, set_name: str) -> Query:
            return Query()

    query = ClientGuard(Raw()).query("ns", "set")
    query.max_records = 3
    assert query.raw.max_records == 3 and query.results() == [0, 1, 2]


def test_a_forked_child_starts_with_no_call_in_flight() -> None:
    """A lock another thread held at a fork would stay held in the child, and the
    parent's calls in flight are not the child's: the child's guard starts afresh."""
    raw = _Blocking()
    guard = ClientGuard(raw)
    caller = threading.Thread(target=guard.get, args=("k",))
    caller.start()
    assert raw.entered.wait(5)
    guard._state.lock.acquire()  # as if another thread were inside the guard at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: no call in flight, the lock free, close at once
            signal.alarm(5)  # a lock left held would hang it: it dies instead, and the test fails
            ok = guard.in_flight() == 0 and guard.close(0.5) and raw.closed_at is not None
            os._exit(0 if ok else 1)
    finally:
        guard._state.lock.release()
    _, status = os.waitpid(pid, 0)
    raw.release.set()
    caller.join(5)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"the child failed or hung (status {status})"
    assert guard.in_flight() == 0 and raw.closed_at is None, "the parent's guard is its own"
