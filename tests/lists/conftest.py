"""Job-list fixtures: a Queue on each backend, with the packaged UDFs registered."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from aeroqueue import udfs
from aeroqueue.backends import Backend
from aeroqueue.lists import JobLists
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session


@pytest.fixture
def registered(backend: Backend) -> Backend:
    udfs.register(backend)
    return backend


@pytest.fixture
def queue(registered: Backend) -> Queue:
    return Queue(registered)


@pytest.fixture
def lists(registered: Backend) -> JobLists:
    return JobLists(registered)


@pytest.fixture
def list_name() -> str:
    """A list of its own per test, so tests never meet on a shared server."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def session(registered: Backend) -> Iterator[Session]:
    s = Session.open(registered)
    yield s
    s.close()
