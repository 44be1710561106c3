"""`make test`: the suite as two pytest processes side by side.

One runs the tests that use the shared real server (marked ``real_server`` by
tests/conftest.py), one after another as they always ran; the other runs the
rest, whose stores are their own. Most tests wait (on leases, heartbeats,
processes) more than they compute: in one process the suite took 626 s here,
its CPU time 270 s; as two, 360 s.

The rest prints as it runs; the real-server tests' output goes to a file and
is printed whole once both have ended (or the run is interrupted), so the two
never interleave. The exit code is the first failing one (a half left empty by
a selection is not a failure). Arguments go to both halves:
``python -m tests.run -x -k acks``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

NO_TESTS = 5  # pytest's exit code when a selection leaves nothing to run


def _end(proc: subprocess.Popen[bytes], *, stop: bool) -> None:
    """Wait up to 30 s for `proc` to end (asking it to first, with `stop`); kill it
    after that, with `stop`."""
    if proc.poll() is not None:
        return
    if stop:
        proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        if stop:
            proc.kill()
            proc.wait()


def main(args: list[str]) -> int:
    if any(a.startswith("-m") for a in args):
        print("tests.run chooses -m itself (real_server, then not real_server); for a marker of your own "
              "run python -m pytest -m ...", file=sys.stderr)
        return 4  # pytest's code for a usage error
    base = [sys.executable, "-m", "pytest", "-q", "-rfE", "--durations=15", *args]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aeroqueue-tests-") as tmp:
        log = Path(tmp) / "real_server.log"
        with open(log, "wb") as f:
            server = subprocess.Popen([*base, "-m", "real_server"], stdout=f, stderr=subprocess.STDOUT)
        print(f"tests: the real-server tests run in pid {server.pid} (their output follows at the end); "
              "the rest here", flush=True)
        rest_proc = subprocess.Popen([*base, "-m", "not real_server"])
        try:
            for proc in (rest_proc, server):
                proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached both halves too (one process group): let each print
            # its interrupted summary before the finally below ends it.
            for proc in (rest_proc, server):
                _end(proc, stop=False)
        finally:
            for proc in (rest_proc, server):  # anything else ended this run early
                _end(proc, stop=True)
            print(f"\n===== the real-server tests (-m real_server): exit {server.returncode} =====", flush=True)
            sys.stdout.buffer.write(log.read_bytes())
            sys.stdout.flush()
        rest = rest_proc.returncode
    codes = [server.returncode, rest]
    print(f"\ntests: real server exit {codes[0]}, the rest exit {codes[1]}, "
          f"{time.monotonic() - started:.0f} s in all", flush=True)
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
