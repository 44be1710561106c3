"""Every log line of the package carries an ``event`` field (aeroqueue/logs.py's
promise): a log shipper filters on it, and a test that counts a worker's events
by name met a line without one (a sweep's warning) and could not sort them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "aeroqueue"
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def calls_without_event(source: str) -> list[int]:
    """Lines of `log.<level>(...)` calls whose `extra` is missing, or is a dict
    written out without an "event" key (an `extra` passed on by name is the
    caller's to fill)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS):
            continue
        target = node.func.value  # log.warning, logger.warning, app.logger.warning
        if not ((isinstance(target, ast.Name) and target.id in ("log", "logger"))
                or (isinstance(target, ast.Attribute) and target.attr == "logger")):
            continue
        extra = next((k.value for k in node.keywords if k.arg == "extra"), None)
        if extra is None or (isinstance(extra, ast.Dict) and not any(
                isinstance(k, ast.Constant) and k.value == "event" for k in extra.keys)):
            lines.append(node.lineno)
    return lines


def test_every_log_call_of_the_package_names_its_event():
    missing = [f"{path.relative_to(PACKAGE.parent)}:{line}"
               for path in sorted(PACKAGE.rglob("*.py")) for line in calls_without_event(path.read_text())]
    assert not missing, f"log calls without an event field: {missing}"


def test_the_check_sees_a_call_without_an_event():
    source = (
        'log.warning("a", extra={"event": "e"})\n'
        'log.warning("b %s", 1)\n'
        'log.error("c", extra={"list": "L"})\n'
        'log.info("d", extra=fields)\n'
        'app.logger.warning("e %s", 1)\n'
    )
    assert calls_without_event(source) == [2, 3, 5]
