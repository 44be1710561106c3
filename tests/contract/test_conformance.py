"""Replay every step a real Aerospike 8.1 server answered (../shared/observed/observed.json)
and fail on any difference."""

from __future__ import annotations

import json
import sys

import pytest

from aeroqueue.backends import Backend

from ..conftest import SHARED

OBSERVED = SHARED / "observed"


@pytest.mark.slow
def test_backend_reproduces_the_recorded_server(backend: Backend):
    if not (OBSERVED / "observed.json").exists():
        pytest.fail(f"{OBSERVED}/observed.json is missing: the repository expects ../shared beside it")
    sys.path.insert(0, str(OBSERVED))
    try:
        import observe
    finally:
        sys.path.remove(str(OBSERVED))
    expected = json.loads((OBSERVED / "observed.json").read_text())["scenarios"]
    actual = json.loads(json.dumps(observe.record_all(backend.client, backend.namespace)))
    assert observe.compare(expected, actual) == []
