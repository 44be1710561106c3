"""The failover test's handler: logs every execution (before the work, so a run cut
short still shows) with its start time, then works for as long as the test's pace
file says.

The test paces the workers so that jobs are left for every phase of the run
(a node down, a node coming back) whatever the machine's speed.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from aeroqueue.queue import Job

LOG_DIR = Path(os.environ.get("AEROQUEUE_CHAOS_LOG", "."))
PACE = LOG_DIR / "pace-ms"


def handle(job: Job) -> dict:
    with open(LOG_DIR / f"exec-{os.getpid()}.log", "a") as f:
        f.write(f"{job.jid} {os.getpid()} {job.session} {time.time():.3f}\n")
    try:
        ms = float(PACE.read_text())
    except (OSError, ValueError):
        ms = 0.0
    time.sleep(ms / 1000 * random.uniform(0.5, 1.5))
    return {"pid": os.getpid(), "session": job.session}
