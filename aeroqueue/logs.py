"""Log lines for workers and commands: JSON objects (for log shippers) or plain text.

Every event is logged with an ``event`` field and its context as extra fields
(list, token, jid, session...), so a JSON line can be filtered without parsing
its message.
"""

from __future__ import annotations

import json
import logging
import sys

from rich.console import Console

_STANDARD_LOG_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonLines(logging.Formatter):
    """One JSON object per log line: time, level, message and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": round(record.created, 3), "level": record.levelname.lower(), "msg": record.getMessage()}
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD_LOG_ATTRS})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextLines(logging.Formatter):
    """A plain line: time, level, message, then the record's extra fields as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={v}" for k, v in vars(record).items() if k not in _STANDARD_LOG_ATTRS)
        return f"{self.formatTime(record)} {record.levelname.lower()} {record.getMessage()}" + (f" {extras}" if extras else "")


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (as logging's last resort does), so a
    command run in-process with its streams swapped still reaches them."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> object:
        return sys.stderr


def default_command_logging() -> None:
    """Warnings and errors as text lines (time, level, message, fields) for a command
    that sets up no logging of its own: without a handler, Python prints the bare
    message, with neither its level nor the job it names. Leaves alone a process where
    anyone configured logging already (an embedding app, a test runner, the worker)."""
    root = logging.getLogger("aeroqueue")
    if root.handlers or logging.getLogger().handlers:
        return
    handler = _Stderr()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(TextLines())
    root.addHandler(handler)


def configure_logging(fmt: str, level: str = "info", *, live: bool = False) -> None:
    handler: logging.Handler
    if live:  # print above the live counters instead of through them
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines() if fmt == "json" else TextLines())
    root = logging.getLogger("aeroqueue")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
