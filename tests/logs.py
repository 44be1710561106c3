"""Reading the logs of processes a test runs, while they write or after a kill.

Only whole lines count: a read while a process appends can catch a line half
copied, and a process SIGKILLed inside a write leaves its last line cut (the
kernel copies a write page by page and stops at a fatal signal; seen in CI as
a JSON line that ended inside a string). A cut line anywhere but at the end is
not dropped: it fails the parse, as it should."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def whole_lines(path: Path) -> list[str]:
    """The lines of `path` that end in a newline (none if it does not exist yet)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return text[: text.rfind("\n") + 1].splitlines()


def json_events(path: Path) -> list[dict[str, Any]]:
    """The JSON log records among `path`'s whole lines (other lines, such as a
    Python warning, are not records)."""
    return [json.loads(line) for line in whole_lines(path) if line.startswith("{")]
