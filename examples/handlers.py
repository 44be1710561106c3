"""Worker handlers for the examples and the docker-compose stack.

Run one with::

    aeroqueue worker --handler examples.handlers:send_email --list emails

A handler gets a reserved `Job` and returns a JSON-able result, stored on
the job record when it is acknowledged. Raising fails the job: it is
retried until the list's max attempts, then dead.

aeroqueue acknowledges each job exactly once, but a handler can run more
than once for one job (its worker died or paused past its session's expiry
mid-job, and the job came back). Side effects must therefore be idempotent:
here the message id is derived from the job, so the mail provider can drop
a second send of the same message.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from aeroqueue.queue import Job

log = logging.getLogger("aeroqueue.examples.handlers")

# Fixed namespace for message ids: the same job always yields the same id.
_MESSAGE_NS = uuid.UUID("5b0d1c8e-7f43-4d8a-9a57-3f0f5c2d7e11")


def message_id(job: Job) -> str:
    """A stable id for the message a job sends (its idempotency key)."""
    return str(uuid.uuid5(_MESSAGE_NS, f"{job.list}/{job.jid}"))


def send_email(job: Job) -> dict[str, Any]:
    """Pretend to send the e-mail a job describes: ``{"to": ..., "subject": ..., "body": ...}``.

    A payload without a recipient is a permanent error; raising lets the
    queue record it (and, after the list's max attempts, mark the job dead)
    instead of acknowledging a message that was never sent.
    """
    payload = job.payload if isinstance(job.payload, dict) else {}
    to = payload.get("to")
    if not isinstance(to, str) or "@" not in to:
        raise ValueError(f"job {job.jid!r} has no valid recipient ('to': {to!r})")
    subject = str(payload.get("subject", ""))
    mid = message_id(job)
    # A real handler calls the mail provider here, passing `mid` as its
    # idempotency key (e.g. a Message-ID header).
    log.info("email sent", extra={"event": "email_sent", "list": job.list, "jid": job.jid, "to": to, "message_id": mid})
    return {"to": to, "subject": subject, "message_id": mid, "attempt": job.attempt}
