"""The heartbeat thread outlives what is not the store's doing: an observer's error, an
error the store did not translate. On every backend.

Both ended the thread (it caught only `BackendError`), found by a read of the worker's
threads: with an observer that raises, a beat that landed was undone and no other
was sent, so the session was reaped while its worker went on; with an untranslated
error, the session was never known lost, and its worker went on claiming under an id
no reaper looks at."""

from __future__ import annotations

import time
from typing import Any

import pytest

from aeroqueue import keys, transitions
from aeroqueue.backends import Backend
from aeroqueue.sessions import Session, reap


def _until(condition: Any, timeout_s: float) -> bool:
    give_up = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.02)
    return True


def test_an_observer_that_raises_neither_undoes_a_beat_nor_stops_the_heartbeat(registered: Backend) -> None:
    told: list[bool] = []

    def observer(ok: bool) -> None:
        told.append(ok)
        raise RuntimeError("a bug in the observer")

    session = Session.open(registered, interval_s=0.1, expiry_s=1.0, on_beat=observer)
    try:
        assert _until(lambda: len(told) >= 15, 10), f"{len(told)} heartbeats in 10 s: the thread stopped"
        assert all(told) and not session.lost
        reap(registered)  # 1.5 s and more since the session opened: past its expiry unless it beat
        rec = registered.get(keys.SESS_SET, session.id)
        assert rec is not None and rec.bins.get("state") == "alive", rec
    finally:
        session.close()


def test_a_heartbeat_error_that_is_not_the_stores_still_ends_in_a_lost_session(
    registered: Backend, monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = transitions.sess_once

    def broken(backend: Backend, sid: str, function: str, *args: Any, **kw: Any) -> Any:
        if function == "beat":
            raise TypeError("an error the store's wrapper did not translate")
        return real(backend, sid, function, *args, **kw)

    session = Session.open(registered, interval_s=0.1, expiry_s=1.0)
    try:
        monkeypatch.setattr(transitions, "sess_once", broken)
        # Unconfirmed for a whole expiry: lost, as after the store's own errors.
        assert _until(lambda: session.lost, 5), "never known lost: the heartbeat thread died at the first error"
    finally:
        monkeypatch.undo()
        session.close()


def test_a_session_paused_past_its_heartbeat_asks_the_server_before_it_reserves(
    registered: Backend, lists: Any, list_name: str,
) -> None:
    """A worker resumed after a pause (SIGSTOP, a suspended VM) reserved before its
    heartbeat thread ran, under a session a reaper had deleted meanwhile: claims no
    reaper looks at, which the close then gave back with an attempt charged (with one
    allowed: dead, never run). Unconfirmed for half its expiry, a session asks the
    server before it reserves: reaped, nothing is claimed; alive, the reserve goes on."""
    from aeroqueue.errors import SessionLost
    from aeroqueue.loading import JobSpec
    from aeroqueue.queue import Queue

    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(4)], max_attempts=1, seal=True)
    queue = Queue(registered)
    alive = Session.open(registered, interval_s=5.0, expiry_s=11.0)
    reaped = Session.open(registered, interval_s=5.0, expiry_s=11.0)
    try:
        for session in (alive, reaped):
            session._last_ok -= 6.0  # as after a pause of 6 s: no beat confirmed since
        stale = alive._last_ok
        registered.remove(keys.SESS_SET, reaped.id)  # a reaper's work meanwhile
        with pytest.raises(SessionLost):
            queue.reserve(list_name, reaped, 2)
        assert reaped.lost
        assert lists.status(list_name).reservable == 4, "nothing was claimed under the reaped session"
        got = queue.reserve(list_name, alive, 2)
        assert len(got) == 2 and alive._last_ok > stale, "asked the server, and went on"
        queue.complete_many(got)
    finally:
        alive.close()
        reaped.close()
