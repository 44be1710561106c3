"""A SIGTERM or SIGINT never hangs a command that waits for it (aeroqueue.stopping).

Python runs a signal handler on the main thread between two bytecodes, possibly
inside the very wait it should end, holding that event's lock: a handler that
sets the event there waits for its own thread for ever. Each command here is run
with its first wait armed to take SIGTERM at that moment
(tests/sessions/signal_tripwire.py), and must end as a signal ends it."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import uuid

import pytest

from aeroqueue import keys
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.stopping import Stop
from aeroqueue.sync import Scheduler
from tests.sessions import signal_tripwire


@pytest.fixture
def ready_store_url(registered, store_url: str) -> str:
    """A store the CLI opens as it is: the modules registered (an embedded file made)."""
    return store_url


def _tripwired(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return signal_tripwire.run("command", "--url", url, *args, what=f"`aeroqueue {' '.join(args)}`")


@pytest.mark.parametrize("command", [
    ("metrics", "--port", "0"),
    ("dashboard", "--port", "0"),
])
def test_a_server_command_stops_on_a_signal_inside_its_wait(ready_store_url, command):
    done = _tripwired(ready_store_url, *command)
    assert done.returncode == 0, done.stderr[-2000:]


def test_reserve_hold_releases_its_jobs_on_a_signal_inside_its_wait(ready_store_url):
    backend = open_backend(ready_store_url)
    name = f"t-{uuid.uuid4().hex[:12]}"
    JobLists(backend).load(name, [JobSpec("c0", {})])
    done = _tripwired(ready_store_url, "reserve", name, "--hold", "60")
    out = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    [job] = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert "released 1 job(s)" in done.stderr
    assert backend.get(keys.JOB_SET, keys.job_name(name, job["token"])).bins["state"] == "queued"


def test_a_sync_schedule_stops_on_a_signal_inside_its_wait(store_url):
    """`aeroqueue sync --every`'s scheduler, with its SIGTERM handler, in this process's main thread."""
    assert threading.current_thread() is threading.main_thread()
    runs: list[int] = []
    scheduler = Scheduler(open_backend(store_url), 3600, lambda: runs.append(1), lock=f"t-{uuid.uuid4().hex[:12]}")
    plain_wait = scheduler.stop.wait

    def wait(timeout: float | None = None) -> bool:
        with scheduler.stop._event._cond:  # as inside Event.wait()
            signal.raise_signal(signal.SIGTERM)
        return plain_wait(timeout)

    scheduler.stop.wait = wait  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGTERM, scheduler.stop.on_signal)
    try:
        assert scheduler.run() == 1, "one run, then the signal ended the hour's wait"
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert runs == [1]


def test_a_stop_asked_by_code_wakes_a_waiter_at_once():
    stop = Stop(tick_s=30)
    threading.Timer(0.05, stop.set).start()
    assert stop.wait(20) is True
    assert Stop().wait(0.01) is False
