"""Handlers for the metrics tests' worker processes: the payload says how a job goes."""

from __future__ import annotations

import time
from typing import Any

from aeroqueue.queue import Job


def scripted(job: Job) -> Any:
    """payload {"fail_until": n, "sleep": s}: fail attempts 1..n, then succeed."""
    payload = job.payload or {}
    time.sleep(float(payload.get("sleep", 0)))
    if job.attempt <= int(payload.get("fail_until", 0)):
        raise RuntimeError(f"scripted failure of {job.jid} on attempt {job.attempt}")
    return {"attempt": job.attempt}
