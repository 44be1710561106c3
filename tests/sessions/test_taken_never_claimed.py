"""A reserver SIGKILLed between its take and its claim: the jobs it took are held by
no session, so its reap gives nothing back and only a sweep finds them. A worker
that reaps such a session sweeps at once, and the jobs run within seconds, not
after --sweep-every plus --sweep-grace (over 6 minutes with the defaults, which
this test keeps). Real processes on both stores; the run is audited job by job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job

ROOT = Path(__file__).resolve().parents[2]
N = 20
EXPIRY_S = 2.0  # the victim's
WORKER_EXPIRY_S = 12.0

# The reserver: a session heartbeated by its own thread, one take of 5 tokens, and no
# claim: it waits there to be killed.
VICTIM = """
import json, sys, time
from aeroqueue import transitions
from aeroqueue.backends import open_backend
from aeroqueue.sessions import Session
b = open_backend(sys.argv[1])
Session.open(b, interval_s=0.25, expiry_s=float(sys.argv[3]))
print(json.dumps(transitions.list_udf(b, sys.argv[2], "take", 5)), flush=True)
time.sleep(600)
"""


def handle(job: Job) -> None:
    with open(os.environ["TAKEN_TEST_RUNS"], "a") as f:
        f.write(f"{job.jid}\n")


def test_a_worker_that_reaps_a_reserver_killed_before_its_claim_runs_what_it_took(
    registered, store_url, list_name, tmp_path
):
    lists = JobLists(registered)
    lists.load(list_name, [JobSpec(f"j{i}", {"i": i}) for i in range(N)], seal=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TAKEN_TEST_RUNS": str(tmp_path / "runs.log")}

    victim = subprocess.Popen([sys.executable, "-c", VICTIM, store_url, list_name, str(EXPIRY_S)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert victim.stdout is not None
        took = json.loads(victim.stdout.readline())
        assert (took["st"], took["n"]) == ("ok", 5), took
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait()

    # The defaults for sweeps (every 300 s, jobs untouched for 60 s): only the sweep
    # that the reap sets off can find the taken jobs in time. The worker's own expiry
    # is longer than the victim's: the jobs are younger than it when the first reap
    # runs (3 to 6 s in), so that sweep finds them only by the dead session's expiry.
    started = time.monotonic()
    worker = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler",
         "tests.sessions.test_taken_never_claimed:handle", "--list", list_name, "--heartbeat", "1",
         "--expiry", str(WORKER_EXPIRY_S), "--until-complete", "--log-format", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    took_s = time.monotonic() - started
    assert worker.returncode == 0, worker.stderr
    events = [json.loads(line) for line in worker.stderr.splitlines() if line.startswith("{")]
    swept = [e for e in events if e.get("event") == "swept"]
    assert sum(e["requeued"] for e in swept) >= 5, (took_s, worker.stderr)

    # Every job ran once, the five taken ones included, and the list is complete.
    runs = Counter((tmp_path / "runs.log").read_text().split())
    assert runs == Counter(f"j{i}" for i in range(N)), runs
    st = lists.status(list_name)
    assert (st.done, st.complete) == (N, True), st
