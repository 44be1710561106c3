"""Log lines for workers and commands: JSON objects (for log shippers) or plain text.

Every event is logged with an ``event`` field and its context as extra fields
(list, token, jid, session...), so a JSON line can be filtered without parsing
its message.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from typing import Any

from rich.console import Console

from .config import mask_passwords

_PACKAGE = "aeroqueue"

_STANDARD_LOG_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


# What a terminal acts on, or what reorders the text shown: C0 controls, DEL and C1
# controls, the bidirectional marks, embeddings, overrides and isolates, and the
# line and paragraph separators. Not other format characters or spaces: the zero
# width joiner of an emoji sequence, a no-break or ideographic space, are shown.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def visible(text: str, *, keep: str = "") -> str:
    """`text` for a terminal or a log line: every character a terminal acts on, or that
    reorders the text shown (`_UNSAFE`: ESC, CR, BEL, DEL, U+202E and the other
    bidirectional controls, line separators) written as its JSON escape (\\u001b,
    \\u202e), the characters in `keep` (a traceback's newlines; with them, a CRLF line
    end is one) and all others as they are. Job ids, payloads and handler errors
    come from customers' files and handlers: printed raw, "\\u001b]52;..." would set
    an operator's clipboard, "\\r" overwrite the line before, and U+202E show
    "invoice\\u202egpj.exe" as "invoiceexe.jpg"."""
    if "\n" in keep:
        text = text.replace("\r\n", "\n")
    if not _UNSAFE.search(text):
        return text
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escaped(m.group()), text)


def _escaped(c: str) -> str:
    return f"\\u{ord(c):04x}"  # all of `_UNSAFE` is in the BMP


class JsonLines(logging.Formatter):
    """One JSON object per log line: time, level, message and the record's extra fields;
    ``logger``, the logger's name, for a line not of the package (a handler's own, a
    library's), which has no ``event``. The password of a URL in any text is masked
    (config.mask_passwords): every logger's lines come here, a handler's and a
    library's too, whose messages the package does not write."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": round(record.created, 3), "level": record.levelname.lower(),
                               "msg": mask_passwords(record.getMessage())}
        if not record.name.startswith(_PACKAGE):
            out["logger"] = record.name
        out.update({k: _masked(v) for k, v in vars(record).items() if k not in _STANDARD_LOG_ATTRS})
        if record.exc_info:
            out["exc"] = mask_passwords(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = mask_passwords(self.formatStack(record.stack_info))
        return json.dumps(out, default=lambda v: mask_passwords(str(v)))


def _masked(value: Any) -> Any:
    return mask_passwords(value) if isinstance(value, str) else value


class TextLines(logging.Formatter):
    """A plain line: time, level, message, then the record's extra fields as key=value
    (logfmt: a value with a blank, a quote or '=' in it is quoted), then the
    traceback of a logged exception on the lines below. `stamp=False` leaves out
    time and level, for a handler that shows them itself (rich's, above the live
    counters)."""

    def __init__(self, *, stamp: bool = True) -> None:
        super().__init__()
        self.stamp = stamp

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(f"{k}={_logfmt(v)}" for k, v in vars(record).items() if k not in _STANDARD_LOG_ATTRS)
        line = (f"{self.formatTime(record)} {record.levelname.lower()} " if self.stamp else "") + record.getMessage()
        if extras:
            line += f" {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        # The message and a traceback may quote a job's id or error too, and a
        # handler's or a library's line a URL with its password.
        return visible(mask_passwords(line), keep="\n")


def _logfmt(value: object) -> str:
    text = str(value)
    if text and not _UNSAFE.search(text) and not any(c in text for c in ' "='):
        return text
    # JSON escapes the C0 controls; `format` the rest (DEL, C1, format characters).
    return json.dumps(text, ensure_ascii=False)


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (as logging's last resort does), so a
    command run in-process with its streams swapped still reaches them."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> object:
        return sys.stderr


ENV_LOG_FORMAT = "AEROQUEUE_LOG_FORMAT"

# Set on each handler the package installs, so that a later set-up replaces it and
# leaves alone those of anyone else (an embedding app's, a test runner's).
_OURS = "_aeroqueue_handler"


def _ours(handler: logging.Handler) -> bool:
    return bool(getattr(handler, _OURS, False))


def _json_env() -> bool:
    return os.environ.get(ENV_LOG_FORMAT, "").strip().lower() == "json"


def _log_thread_exceptions() -> None:
    """An exception no thread caught (a thread a handler started, a library's) as a log
    line of the process's format: threading's own hook printed its traceback as text,
    a line a JSON log pipeline cannot parse. Installed once per process; it hands the
    exception to the hook it replaced (threading's: a traceback on stderr) whenever
    the process does not log JSON lines (`json_lines`), and for a thread's sys.exit()."""
    if getattr(threading.excepthook, _OURS, False):
        return
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if issubclass(args.exc_type, SystemExit) or not json_lines():
            previous(args)
            return
        name = args.thread.name if args.thread is not None else None
        logging.getLogger(f"{_PACKAGE}.threads").error(
            "uncaught exception in thread %s: %s", name, args.exc_type.__name__, exc_info=args.exc_value,
            extra={"event": "thread_exception", "thread_name": name})

    setattr(hook, _OURS, True)
    threading.excepthook = hook


def default_command_logging() -> None:
    """Warnings and errors as text lines (time, level, message, fields) for a command
    that sets up no logging of its own: without a handler, Python prints the bare
    message, with neither its level nor the job it names. JSON lines when
    AEROQUEUE_LOG_FORMAT says json, as for the worker: the compose stack sets it for
    every service, and the exporter's, the dashboard's and the sync's lines reached a
    JSON log pipeline as text. In JSON, the lines of every logger (the root's
    handler): a library's text line in the stream (werkzeug's request lines, which
    it prints itself when the root has no handler) is one a JSON pipeline cannot
    parse. Leaves alone a process where anyone configured logging already (an
    embedding app, a test runner, the worker)."""
    pkg = logging.getLogger(_PACKAGE)
    if pkg.handlers or logging.getLogger().handlers:
        return
    handler = _Stderr()
    setattr(handler, _OURS, True)
    handler.setLevel(logging.WARNING)
    if _json_env():
        handler.setFormatter(JsonLines())
        logging.getLogger().addHandler(handler)
        logging.captureWarnings(True)  # a warnings.warn's text, as a JSON line too
        _log_thread_exceptions()
    else:
        handler.setFormatter(TextLines())
        pkg.addHandler(handler)


def command_info(name: str) -> None:
    """Info lines of logger `name` (and its children) too, through the handler
    `default_command_logging` installs, in its format: a second handler of their
    own printed each line twice. Leaves alone a process where anyone else
    configured logging."""
    pkg, root = logging.getLogger(_PACKAGE), logging.getLogger()
    if any(not _ours(h) for h in (*root.handlers, *pkg.handlers)):
        return
    default_command_logging()  # called in-process, without the command line's start
    for handler in (*root.handlers, *pkg.handlers):
        handler.setLevel(logging.INFO)
    logging.getLogger(name).setLevel(logging.INFO)


def request_lines(logger: str = "werkzeug") -> None:
    """A web server's request lines (logged at info by `logger`) as JSON lines with the
    others, when AEROQUEUE_LOG_FORMAT says json; in text, werkzeug prints them itself,
    as it always did."""
    if any(_ours(h) for h in logging.getLogger().handlers):
        command_info(logger)


def json_lines() -> bool:
    """The process logs JSON lines through a handler of the package (`default_command_logging`
    or `configure_logging` with "json")."""
    return any(_ours(h) and isinstance(h.formatter, JsonLines)
               for h in (*logging.getLogger().handlers, *logging.getLogger(_PACKAGE).handlers))


def configure_logging(fmt: str, level: str = "info", *, live: bool = False) -> None:
    """The worker's logging: every logger's lines (the root's handler), in one format.
    A handler's own `logging` calls and the libraries' printed text lines into a
    stream of JSON lines, or nothing below warning, through Python's last resort."""
    handler: logging.Handler
    if live:  # print above the live counters instead of through them
        from rich.logging import RichHandler

        handler = RichHandler(console=Console(stderr=True), show_path=False, markup=False)
        handler.setFormatter(TextLines(stamp=False))  # its fields too: rich shows time and level
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLines() if fmt == "json" else TextLines())
    setattr(handler, _OURS, True)
    root, pkg = logging.getLogger(), logging.getLogger(_PACKAGE)
    root.handlers[:] = [h for h in root.handlers if not _ours(h)] + [handler]
    root.setLevel(level.upper())
    pkg.handlers[:] = [h for h in pkg.handlers if not _ours(h)]
    pkg.setLevel(level.upper())
    pkg.propagate = True
    logging.captureWarnings(True)
    _log_thread_exceptions()
    global _configured
    _configured = ("text" if live else fmt, level)  # a handler process has no live display


_configured: tuple[str, str] | None = None  # what `configure_logging` was last given


def configured() -> tuple[str, str] | None:
    """(format, level) of `configure_logging` in this process, for a handler process
    to log as its worker does (`configure_logging(*configured())`), None without it."""
    return _configured
