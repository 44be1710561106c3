"""Contract fixtures: the raw client (real or embedded) with the contract UDF module registered."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from aeroqueue.backends import Backend

MODULE = "aq_contract"
LUA = Path(__file__).parent / "lua" / f"{MODULE}.lua"


@pytest.fixture
def client(backend: Backend) -> Any:
    """The backend's client with the contract module registered (and served)."""
    c = backend.client
    source = LUA.read_text()
    registered = any(e["name"] == f"{MODULE}.lua" for e in c.udf_list()) and c.udf_get(f"{MODULE}.lua") == source
    if registered:  # udf_put blocks ~2 s on the real client: only when it changed
        return c
    c.udf_put(str(LUA))
    # A real cluster serves a new module after a short delay.
    for _ in range(50):
        if any(e["name"] == f"{MODULE}.lua" for e in c.udf_list()) and c.udf_get(f"{MODULE}.lua") == source:
            break
        time.sleep(0.1)
    return c


@pytest.fixture
def ns(backend: Backend) -> str:
    return backend.namespace
