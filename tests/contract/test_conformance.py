"""Replay every step a real Aerospike 8.1 server answered (../shared/observed/observed.json)
and fail on any difference."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from aeroqueue.backends import lua_cache_dir
from aeroqueue.backends.embedded import EmbeddedClient
from aeroqueue.config import parse_url

from ..conftest import SHARED

OBSERVED = SHARED / "observed"


def plain_client(store_url: str) -> Any:
    """A client configured as the recording's was: default policies (digest-only keys),
    not the project's (which send keys, so `get` would answer with the user key)."""
    url = parse_url(store_url)
    if url.is_embedded:
        return EmbeddedClient(url.path or ":memory:", url.namespace)
    import aerospike

    return aerospike.client({"hosts": list(url.hosts), "lua": {"user_path": lua_cache_dir()}}).connect()


@pytest.mark.slow
def test_backend_reproduces_the_recorded_server(store_url: str):
    if not (OBSERVED / "observed.json").exists():
        pytest.fail(f"{OBSERVED}/observed.json is missing: the repository expects ../shared beside it")
    sys.path.insert(0, str(OBSERVED))
    try:
        import observe
    finally:
        sys.path.remove(str(OBSERVED))
    expected = json.loads((OBSERVED / "observed.json").read_text())["scenarios"]
    client = plain_client(store_url)
    try:
        actual = json.loads(json.dumps(observe.record_all(client, parse_url(store_url).namespace)))
    finally:
        client.close()
    assert observe.compare(expected, actual) == []
