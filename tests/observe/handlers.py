"""Handlers for the metrics tests' worker processes: the payload says how a job goes."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from typing import Any

from aeroqueue.queue import Job


def scripted(job: Job) -> Any:
    """payload {"fail_until": n, "sleep": s}: fail attempts 1..n, then succeed."""
    payload = job.payload or {}
    time.sleep(float(payload.get("sleep", 0)))
    if job.attempt <= int(payload.get("fail_until", 0)):
        raise RuntimeError(f"scripted failure of {job.jid} on attempt {job.attempt}")
    return {"attempt": job.attempt}


SECRET = "hunter2-not-for-logs"


def chatty(job: Job) -> Any:
    """Logs as a handler does, through logging of its own: its module's logger, the
    root logger, a warning of Python's and a traceback; one line quotes a URL with
    its password (`SECRET`)."""
    log = logging.getLogger(__name__)
    log.info("handling %s", job.jid)
    log.warning("charging through https://billing:%s@billing.invalid/charge", SECRET)
    logging.getLogger().error("a line of the root logger for %s", job.jid)
    warnings.warn(f"a deprecated call in {job.jid}", UserWarning, stacklevel=1)
    try:
        raise ValueError(f"no invoice for mysql://app:{SECRET}@db.invalid/billing")
    except ValueError:
        log.exception("recovered")
    return "ok"


def leaves_a_thread_dying(job: Job) -> Any:
    """Starts a thread of its own that raises, uncaught (waited for): its traceback is
    printed by threading's hook, not by the handler's logging."""
    thread = threading.Thread(target=_raise, args=(job.jid,), name=f"side-{job.jid}")
    thread.start()
    thread.join()
    return "ok"


def _raise(jid: str) -> None:
    raise LookupError(f"no price for {jid} at https://billing:{SECRET}@billing.invalid/")
