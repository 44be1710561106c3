"""Sessions: every claim is made under one (design.md, flows heartbeat/reap).

A session record (set aq_sess, key = session id) says who holds claims:
state, host, pid, started. This module opens and closes sessions.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

from . import keys
from .backends import Backend


class Session:
    """A process's identity for claims."""

    def __init__(self, backend: Backend, session_id: str) -> None:
        self.backend = backend
        self.id = session_id
        self.closed = False

    @classmethod
    def open(cls, backend: Backend) -> Session:
        session_id = uuid.uuid4().hex
        backend.put(
            keys.SESS_SET,
            session_id,
            {"state": "alive", "host": socket.gethostname()[:200], "pid": os.getpid(), "started": int(time.time() * 1000)},
            create_only=True,
        )
        return cls(backend, session_id)

    def claim_id(self) -> str:
        """The id claims are made under."""
        return self.id

    def close(self) -> None:
        if not self.closed:
            self.backend.remove(keys.SESS_SET, self.id)
            self.closed = True

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
