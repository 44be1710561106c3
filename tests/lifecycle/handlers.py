"""Handlers for the lifecycle tests that run in child processes (--pool process):
importable by name, as a spawned process needs."""

from __future__ import annotations

import os
import time

from aeroqueue.queue import Job


def hang_or_double(job: Job) -> dict:
    if job.payload.get("hang"):
        time.sleep(60)
    if job.payload.get("touch"):
        for _ in range(3):
            time.sleep(0.4)
            job.touch()
    return {"double": job.payload["n"] * 2, "pid": os.getpid()}
