"""The chaos test's handler: logs every execution, then does a little work. Some
jobs fail their first attempt (a transient error: retried after the backoff), and
some hang past the time limit on their first attempt (the worker abandons them)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from aeroqueue.queue import Job

LOG_DIR = Path(os.environ.get("AEROQUEUE_CHAOS_LOG", "."))
HANG_S = float(os.environ.get("AEROQUEUE_CHAOS_HANG", "0"))


def fails_first(jid: str) -> bool:
    return jid.startswith("c") and int(jid[1:]) % 40 == 1


def hangs_first(jid: str) -> bool:
    return jid.startswith("c") and int(jid[1:]) % 500 == 7


def handle(job: Job) -> dict:
    # One line per execution, written before the work: a SIGKILL after this
    # line still shows that the handler ran.
    with open(LOG_DIR / f"exec-{os.getpid()}.log", "a") as f:
        f.write(f"{job.jid} {os.getpid()} {job.session} {job.attempt} {time.time():.3f}\n")
    if job.attempt == 1 and fails_first(job.jid):
        raise RuntimeError("a transient failure downstream")
    if job.attempt == 1 and hangs_first(job.jid) and HANG_S:
        time.sleep(HANG_S)
    time.sleep(random.uniform(0.001, 0.004))
    return {"pid": os.getpid(), "session": job.session}
