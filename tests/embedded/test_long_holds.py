"""A process stopped inside a write on the embedded store.

The embedded store's write lock is held by the client process (storage.py): one
stopped inside a write (SIGSTOP, Ctrl-Z) holds back every other writer,
heartbeats included, until it continues. Reads still go through, so a reaper
sees healthy sessions past their expiry and queues its ``alive -> reaping``
behind the stopped writer. The hold is credited to every live session when the
writer commits (backends.holds), and a write queued behind it runs at the
time it gets the lock, as on a server: the reaper's write then finds the session
changed, and the heartbeat lands with the time it landed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import aerospike
import pytest

from aeroqueue import keys, sessions, udfs
from aeroqueue.backends import open_backend
from aeroqueue.backends.embedded import EmbeddedClient
from aeroqueue.backends.embedded.client import ManualClock
from aeroqueue.backends.embedded.operations import server_error
from aeroqueue.backends.embedded.storage import LONG_HOLD_MS
from aeroqueue.sessions import Session
from tests.waiting import wait_for

INTERVAL_S, EXPIRY_S = 0.2, 1.0

_fork = multiprocessing.get_context("fork")


def _write_then_stop(url: str, ready, refused: bool = False) -> None:
    backend = open_backend(url)
    try:
        with backend.client._storage.write():
            ready.set()
            os.kill(os.getpid(), signal.SIGSTOP)
            if refused:  # what a create-only put, a generation or a filter refused does once it runs on
                raise server_error("RecordExistsError", 5, "AEROSPIKE_ERR_RECORD_EXISTS")
    except aerospike.exception.RecordExistsError:
        pass


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt"


class StoppedWriter:
    """A process stopped inside a write transaction of the store at `url`."""

    def __init__(self, url: str, *, refused: bool = False) -> None:
        ready = _fork.Event()
        self.proc = _fork.Process(target=_write_then_stop, args=(url, ready, refused), daemon=True)
        self.proc.start()
        assert ready.wait(20), "the writer took the store's lock"
        wait_for("the writer stopped", lambda: _stopped(self.proc.pid), 10)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.join(20)
        assert self.proc.exitcode == 0, "the writer ended its write and exited"


@pytest.fixture
def url(tmp_path: Path) -> str:
    url = f"embedded://{tmp_path / 's.db'}"
    udfs.register(open_backend(url))
    return url


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # the test reads it
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("refused", [False, True], ids=["committed", "refused"])
def test_a_reaper_queued_behind_a_stopped_writer_leaves_a_live_session_alone(url, refused):
    """Refused: the stopped write fails once it runs on (a create-only put, a
    generation or a filter that does not match, as the product's gates and
    compare-and-sets do): rolled back, its hold went uncredited."""
    backend = open_backend(url)
    # Its heartbeats are the test's to make: none can land while the writer is stopped.
    live = Session.open(backend, interval_s=INTERVAL_S, expiry_s=EXPIRY_S, heartbeat=False)
    writer = StoppedWriter(url, refused=refused)
    time.sleep(EXPIRY_S + 0.2)
    expired = [sid for sid, _ in backend.scan(keys.SESS_SET, expression=sessions._EXPIRED)]
    assert live.id in expired, "reads go through: the reaper sees the session past its expiry"
    reaper, out = _in_thread(lambda: sessions.reap(backend))
    time.sleep(0.3)
    assert reaper.is_alive(), "the reaper's write waits behind the stopped writer"
    writer.resume()
    reaper.join(20)
    assert "error" not in out, out
    assert out["value"].sessions == 0, "the session whose heartbeats were held back is not reaped"
    assert backend.get(keys.SESS_SET, live.id).bins["state"] == "alive"
    assert live.beat(), "and its next heartbeat keeps it"


def test_a_heartbeat_queued_behind_a_stopped_writer_lands_with_the_time_it_landed(url):
    backend = open_backend(url)
    live = Session.open(backend, interval_s=INTERVAL_S, expiry_s=EXPIRY_S, heartbeat=False)
    writer = StoppedWriter(url)
    beat, out = _in_thread(live.beat)
    time.sleep(0.5)
    assert beat.is_alive(), "the heartbeat waits behind the stopped writer"
    resumed_ms = time.time_ns() // 1_000_000
    writer.resume()
    beat.join(20)
    assert out.get("value") is True, out
    # A server reads its clock when it runs the call, not when the call was sent.
    assert backend.get(keys.SESS_SET, live.id).bins["beat"] >= resumed_ms


def test_a_dead_session_is_still_reaped_only_later_by_the_hold(url):
    backend = open_backend(url)
    dead = Session.open(backend, interval_s=INTERVAL_S, expiry_s=EXPIRY_S, heartbeat=False)
    opened = backend.get(keys.SESS_SET, dead.id).bins["beat"]
    writer = StoppedWriter(url)
    time.sleep(0.6)
    writer.resume()
    held_ms = backend.get(keys.SESS_SET, dead.id).bins["beat"] - opened
    assert held_ms >= 600, "the hold was credited"

    def reaped() -> bool:
        sessions.reap(backend)
        return backend.get(keys.SESS_SET, dead.id) is None

    wait_for("the dead session reaped", reaped, 10, step_s=0.02)
    assert time.time_ns() // 1_000_000 >= opened + held_ms + EXPIRY_S * 1000, "not before its credited expiry"


def test_a_write_that_times_out_behind_a_stopped_writer_names_the_store_the_holder_and_the_way_out(url, monkeypatch):
    """Every command and worker of the store stalls, and their errors are all the user
    sees: each must say which store, which process, and what to do. It said
    "embedded store locked for 60 s", naming none of them."""
    from aeroqueue import errors
    from aeroqueue.backends.embedded import storage

    backend = open_backend(url)
    writer = StoppedWriter(url)
    monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 0.5)
    try:
        with pytest.raises(errors.BackendTimeout) as e:
            backend.put("s", "k", {"a": 1})
    finally:
        writer.resume()
    path = url.removeprefix("embedded://")
    assert f"embedded store {path} locked for 0 s by process {writer.proc.pid}:" in str(e.value)
    assert "continue it (fg, kill -CONT) or end it" in str(e.value)
    backend.put("s", "k", {"a": 1})  # free again
    assert backend.get("s", "k").bins == {"a": 1}


def test_only_long_holds_are_reported_and_a_failing_report_does_not_fail_the_write(tmp_path):
    clock = ManualClock()
    client = EmbeddedClient(str(tmp_path / "s.db"), clock=clock)
    reported: list[int] = []
    client.on_long_hold = reported.append
    storage = client._storage
    with storage.write():
        clock.advance(LONG_HOLD_MS - 1)
    assert reported == []
    with storage.write():
        clock.advance(LONG_HOLD_MS + 50)
    assert reported == [LONG_HOLD_MS + 50]

    def fails(_ms: int) -> None:
        raise RuntimeError("boom")

    client.on_long_hold = fails
    key = ("test", "s", "k")
    with storage.write():
        client.put(key, {"a": 1})
        clock.advance(LONG_HOLD_MS)
    assert client.get(key)[2] == {"a": 1}, "the write that held the lock committed"


def test_every_embedded_backend_credits_its_long_holds(url):
    """Whatever process holds the lock (a worker, a load, the CLI) opened its store
    with open_backend: the credit must come from there, not from a worker only."""
    backend = open_backend(url)
    live = Session.open(backend, interval_s=INTERVAL_S, expiry_s=EXPIRY_S, heartbeat=False)
    before = backend.get(keys.SESS_SET, live.id).bins["beat"]
    other = open_backend(url)
    with other.client._storage.write():
        time.sleep(LONG_HOLD_MS / 1000 + 0.1)
    assert backend.get(keys.SESS_SET, live.id).bins["beat"] >= before + LONG_HOLD_MS + 100


def test_a_long_hold_is_credited_to_load_ranges_in_flight_too(url):
    """A live loader renews its ranges' leases; while another process held the store
    it could not, and a recovery after the hold would have voided its range."""
    from aeroqueue.lists import JobLists

    lists = JobLists(open_backend(url))
    lists.create("L")
    seq = lists._list_udf("L", "alloc", 5, 1000, "in-flight")["seq"]
    other = open_backend(url)
    with other.client._storage.write():
        time.sleep(1.3)  # past the range's lease
    assert lists._list_udf("L", "expired") == [], "its lease moved by the hold"
    assert lists._list_udf("L", "renew", [seq], 1000) == 1, "and its loader can renew it again"

