"""`make test`: the suite as two pytest processes side by side.

One runs the tests that use the shared real server (marked ``real_server`` by
tests/conftest.py), one after another as they always ran; the other runs the
rest, whose stores are their own. Most tests wait (on leases, heartbeats,
processes) more than they compute: run in one process, the suite took 626 s
here with its CPU time at 270 s.

Each half's output goes to a file and is printed, whole, when that half ends;
the exit code is the first failing one (a half left empty by a selection is
not a failure). Arguments are passed to both halves
(``python -m tests.run -x -k acks``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HALVES = (("real server", "real_server"), ("the rest", "not real_server"))


def main(args: list[str]) -> int:
    base = [sys.executable, "-m", "pytest", "-q", "-rfE", "--durations=15", *args]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aeroqueue-tests-") as tmp:
        running = []
        for name, expr in HALVES:
            out = Path(tmp) / f"{expr.replace(' ', '_')}.log"
            with open(out, "wb") as f:
                proc = subprocess.Popen([*base, "-m", expr], stdout=f, stderr=subprocess.STDOUT, env=os.environ)
            running.append((name, expr, proc, out))
        print(f"tests: {' and '.join(f'{name} (-m {expr!r}, pid {p.pid})' for name, expr, p, _ in running)}", flush=True)
        codes = {}
        try:
            while running:
                for entry in list(running):
                    name, expr, proc, out = entry
                    if proc.poll() is None:
                        continue
                    running.remove(entry)
                    codes[name] = proc.returncode
                    print(f"\n===== {name}: -m {expr!r}, exit {proc.returncode}, "
                          f"{time.monotonic() - started:.0f} s =====", flush=True)
                    sys.stdout.buffer.write(out.read_bytes())
                    sys.stdout.flush()
                time.sleep(0.5)
        finally:
            for _, _, proc, _ in running:  # interrupted: no half outlives the run
                proc.terminate()
                proc.wait(60)
    print(f"\ntests: {', '.join(f'{name} exit {code}' for name, code in codes.items())}, "
          f"{time.monotonic() - started:.0f} s in all", flush=True)
    # 5 is "no tests collected": a selection (`-k`, a path) may leave a half empty.
    failed = [code for code in codes.values() if code not in (0, 5)]
    if failed:
        return failed[0]
    return 5 if codes and all(code == 5 for code in codes.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
