"""`make test`: the suite as pytest processes side by side.

The tests that use a real server (marked ``real_server`` by tests/conftest.py)
run one after another on it, since a reaper or sweep of one test must not act
on another's expired claims. ``AEROQUEUE_TEST_URL`` may name several separate
servers, separated by blanks (.ci/run starts two nodes): the real-server tests
are then split into one process per server (``AEROQUEUE_TEST_SHARD=i/n``).
Alone, on one server, they took 393 s here, 36% of it CPU time: they wait on
leases, heartbeats and processes far more than they compute. The rest, whose
stores are their own, runs as more processes: the multi-node tests, the Spark
tests that share one SparkSession (both marked ``apart``) and the embedded
store's own tests (which wait on nodes, heartbeats and Spark; given several
servers, the embedded store's are split among the real-server processes
instead) beside everything else, itself in `REST_PARTS` processes
(``AEROQUEUE_TEST_REST_SHARD=i/n``). Every split shares the tests out by their
measured times (tests/durations.py).

The last group prints as it runs; the others' output goes to files and is
printed whole once all have ended (or the run is interrupted), so they never
interleave. The exit code is the first failing one (a group left empty by a
selection is not a failure). Arguments go to every group:
``python -m tests.run -x -k acks``; with a test path among them, the rest is
not split (a path would otherwise run in two groups).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aeroqueue.config import mask_url

NO_TESTS = 5  # pytest's exit code when a selection leaves nothing to run

# The rest's own processes: the multi-node and Spark tests (marked `apart`) and the
# embedded store's (`embedded_own`), and everything else (the embedded store's tests
# moved over when the rest alone took 615 s of a CI run and these 464 s). Given
# several servers, the embedded store's tests go to the real-server processes
# instead: with the multi-node replay tests added, their group was the run's long
# pole (521 s against 439 s for each real-server part, in CI). The sync tests that
# start Spark in processes of their own are in the rest: in the multi-node and sync
# tests' process, they made it the long pole again (771 s of an 802 s CI run).
# The rest, in this many processes: alone it was the run's long pole (853 s of an
# 856 s CI run, the other groups done by 732 s), a thousand tests one after another
# that mostly wait on processes and heartbeats.
REST_PARTS = 2


Group = tuple[str, list[str], dict[str, str]]  # name, pytest arguments, environment


def groups(args: list[str], servers: list[str]) -> list[Group]:
    """The processes to start, given the real servers' URLs; the last one prints as it runs."""
    env = dict(os.environ)
    if len(servers) <= 1:
        plan: list[Group] = [("the real-server tests (-m real_server)", ["-m", "real_server"], env)]
    else:
        plan = [
            (f"the real-server tests and the embedded store's, part {i + 1} of {len(servers)} "
             f"(-m 'real_server or embedded_own', {mask_url(url)})",
             ["-m", "real_server or embedded_own"],
             {**env, "AEROQUEUE_TEST_URL": url, "AEROQUEUE_TEST_SHARD": f"{i}/{len(servers)}"})
            for i, url in enumerate(servers)
        ]
    if any(not a.startswith("-") and Path(a.split("::")[0]).exists() for a in args):
        rest = "not real_server" if len(servers) <= 1 else "not real_server and not embedded_own"
        return [*plan, ("the rest", ["-m", rest], env)]
    if len(servers) <= 1:
        split: list[Group] = [("the multi-node, Spark and embedded-store tests",
                               ["-m", "not real_server and (apart or embedded_own)"], env)]
    else:
        split = [("the multi-node and Spark tests", ["-m", "not real_server and not embedded_own and apart"], env)]
    rest = ["-m", "not real_server and not embedded_own and not apart"]
    return [*plan, *split, *(
        (f"the rest, part {i + 1} of {REST_PARTS}", rest, {**env, "AEROQUEUE_TEST_REST_SHARD": f"{i}/{REST_PARTS}"})
        for i in range(REST_PARTS))]


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
    plan = groups(args, os.environ.get("AEROQUEUE_TEST_URL", "").split())
    procs: list[tuple[str, subprocess.Popen[bytes], Path | None]] = []
    with tempfile.TemporaryDirectory(prefix="aeroqueue-tests-") as tmp:
        for i, (name, extra, env) in enumerate(plan):
            if i < len(plan) - 1:
                log = Path(tmp) / f"group{i}.log"
                with open(log, "wb") as f:
                    proc = subprocess.Popen([*base, *extra], stdout=f, stderr=subprocess.STDOUT, env=env)
                print(f"tests: {name} run in pid {proc.pid} (their output follows at the end)", flush=True)
            else:
                print(f"tests: {name} here", flush=True)
                log, proc = None, subprocess.Popen([*base, *extra], env=env)
            procs.append((name, proc, log))
        try:
            for _, proc, _ in reversed(procs):
                proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached every group too (one process group): let each print
            # its interrupted summary before the finally below ends it.
            for _, proc, _ in procs:
                _end(proc, stop=False)
        finally:
            for _, proc, _ in procs:  # anything else ended this run early
                _end(proc, stop=True)
            for name, proc, log in procs:
                if log is not None:
                    print(f"\n===== {name}: exit {proc.returncode} =====", flush=True)
                    sys.stdout.buffer.write(log.read_bytes())
                    sys.stdout.flush()
    codes = [proc.returncode for _, proc, _ in procs]
    summary = ", ".join(f"{name} exit {code}" for (name, _, _), code in zip(procs, codes, strict=True))
    print(f"\ntests: {summary}; {time.monotonic() - started:.0f} s in all", flush=True)
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
