"""How long the slow tests take, for tests/run.py's processes to end together.

The suite runs as several pytest processes side by side (tests/run.py), each a
share of the tests. Shared out one test in n, a few tests of a minute or more
(the demo, the chaos runs, the Spark cluster) landed together by chance: in one
CI run a real-server process ended at 800 s and its twin at 700 s. tests/conftest.py
shares them out by these figures instead, the longest first, each to the process
with the least so far (any test not listed counts `DEFAULT_S`).

``durations.json`` holds the wall time, setup and teardown included, of the tests
that took at least `KEEP_S` in a CI run. To measure them again::

    AEROQUEUE_TEST_DURATIONS_DIR=/tmp/d PYTEST_ADDOPTS="-p tests.durations" make test
    python -m tests.durations /tmp/d      # rewrites tests/durations.json

Figures from another machine serve as well: only their proportions matter.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Collection
from functools import cache
from pathlib import Path

import pytest

FILE = Path(__file__).with_name("durations.json")
KEEP_S = 2.0  # shorter tests count DEFAULT_S: a few hundred of them even out
DEFAULT_S = 0.3  # the shorter tests' mean in that run
ENV_DIR = "AEROQUEUE_TEST_DURATIONS_DIR"


@cache
def measured() -> dict[str, float]:
    """Seconds by test node id, as last measured (empty if the file is missing)."""
    try:
        return {k: float(v) for k, v in json.loads(FILE.read_text()).items()}
    except FileNotFoundError:
        return {}


def share(items: list[pytest.Item], parts: int, pinned: Collection[int] = ()) -> list[int]:
    """The part (0 to parts - 1) of each item: the longest first, each to the part with
    the least so far; the items whose id() is in `pinned` all go to part 0 (first)."""
    seconds = {id(item): measured().get(item.nodeid, DEFAULT_S) for item in items}
    load = [0.0] * parts
    where: dict[int, int] = {}
    for item in items:
        if id(item) in pinned:
            where[id(item)] = 0
            load[0] += seconds[id(item)]
    rest = [item for item in items if id(item) not in pinned]
    for item in sorted(rest, key=lambda it: -seconds[id(it)]):  # stable: ties keep their order
        part = min(range(parts), key=lambda p: (load[p], p))
        where[id(item)] = part
        load[part] += seconds[id(item)]
    return [where[id(item)] for item in items]


# As a plugin (-p tests.durations): each process writes its tests' times to a file of its own.
_started: dict[str, float] = {}
_taken: dict[str, float] = {}


def pytest_runtest_logstart(nodeid: str) -> None:
    _started[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str) -> None:
    if nodeid in _started:
        _taken[nodeid] = round(time.monotonic() - _started.pop(nodeid), 2)


def pytest_sessionfinish() -> None:
    where = os.environ.get(ENV_DIR)
    if where and _taken:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{os.getpid()}.json").write_text(json.dumps(_taken))


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(f"usage: python -m tests.durations DIR  (DIR: where a run with {ENV_DIR}=DIR wrote)", file=sys.stderr)
        return 2
    taken: dict[str, float] = {}
    for part in sorted(Path(argv[0]).glob("*.json")):
        taken.update(json.loads(part.read_text()))
    kept = {k: v for k, v in sorted(taken.items()) if v >= KEEP_S}
    FILE.write_text(json.dumps(kept, indent=0) + "\n")
    print(f"{FILE}: {len(kept)} of {len(taken)} tests took {KEEP_S:g} s or more")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
