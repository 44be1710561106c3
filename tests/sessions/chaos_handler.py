"""The chaos test's handler: logs every execution, then does a little work."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from aeroqueue.queue import Job

LOG_DIR = Path(os.environ.get("AEROQUEUE_CHAOS_LOG", "."))


def handle(job: Job) -> dict:
    # One line per execution, written before the work: a SIGKILL after this
    # line still shows that the handler ran.
    with open(LOG_DIR / f"exec-{os.getpid()}.log", "a") as f:
        f.write(f"{job.jid} {os.getpid()} {job.session}\n")
    time.sleep(random.uniform(0.001, 0.004))
    return {"pid": os.getpid(), "session": job.session}
