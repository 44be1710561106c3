"""A worker whose main thread takes SIGTERM while it holds its stop Event's lock, as
when the signal lands inside that Event's wait() or set(): Python runs the handler
on the main thread between two of its bytecodes, wherever that thread is. The worker
must still drain and exit 0; a handler that sets the Event waits for a lock its own
thread holds, for ever.

    python -m tests.sessions.signal_tripwire cli|api URL LIST
    python -m tests.sessions.signal_tripwire command ARGS...

cli: the worker command (its handlers installed for the life of the process);
api: `Worker.run()` (which installs them itself); command: any other command that
waits for a signal (`aeroqueue ARGS...`), through `aeroqueue.stopping.Stop`: its
first wait on the main thread takes SIGTERM under the Stop's event lock. Prints
"tripwire fired" when the signal was raised there, so that a test cannot pass
without it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from aeroqueue import worker as worker_module
from aeroqueue.queue import Job

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, what: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """This module run as a process with `args` (for a test): the test fails if it
    does not end within `timeout_s` of its SIGTERM (`what` it is, in the message), or
    if the signal was never raised under the lock."""
    import pytest

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.sessions.signal_tripwire", *args], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{what} never ended after its SIGTERM: its handler waits for a lock its own thread holds"
                    f"\n{err[-2000:]}")
    assert "tripwire fired" in out, f"the signal was never raised under the lock\n{err[-2000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def handle(job: Job) -> None:
    return None


def arm(w: worker_module.Worker) -> None:
    """The main thread's first wait on the stop Event raises SIGTERM under the Event's lock."""
    event = w._stopping
    plain_wait = event.wait
    fired = False

    def wait(timeout: float | None = None) -> bool:
        nonlocal fired
        if not fired and threading.current_thread() is threading.main_thread():
            fired = True
            with event._cond:  # the Event's own lock, held as inside its wait() or set()
                signal.raise_signal(signal.SIGTERM)  # the Python handler runs before this returns
            print("tripwire fired", flush=True)
        return plain_wait(timeout)

    event.wait = wait  # type: ignore[method-assign]


def arm_stops() -> None:
    """Every `Stop`'s first wait on the main thread raises SIGTERM under its event's lock."""
    from aeroqueue import stopping

    plain_wait = stopping.Stop.wait
    fired = False

    def wait(self: stopping.Stop, timeout: float | None = None) -> bool:
        nonlocal fired
        if not fired and threading.current_thread() is threading.main_thread():
            fired = True
            with self._event._cond:
                signal.raise_signal(signal.SIGTERM)
            print("tripwire fired", flush=True)
        return plain_wait(self, timeout)

    stopping.Stop.wait = wait  # type: ignore[method-assign]


def main() -> None:
    if sys.argv[1] == "command":
        arm_stops()
        from aeroqueue.cli import main as cli

        sys.argv = ["aeroqueue", *sys.argv[2:]]
        cli()
        return
    how, url, list_name = sys.argv[1:4]
    if how == "cli":
        init = worker_module.Worker.__init__

        def armed_init(self: worker_module.Worker, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **kwargs)
            arm(self)

        worker_module.Worker.__init__ = armed_init  # type: ignore[method-assign]
        from aeroqueue.cli import main as cli

        sys.argv = ["aeroqueue", "--url", url, "worker", "--handler", "tests.sessions.signal_tripwire:handle", "--list", list_name,
                    "--heartbeat", "0.1", "--expiry", "1", "--log-format", "json"]
        cli()
    else:
        from aeroqueue.backends import open_backend

        w = worker_module.Worker(open_backend(url), handle, [list_name], interval_s=0.1, expiry_s=1.0)
        arm(w)
        sys.exit(w.run())


if __name__ == "__main__":
    main()
