from __future__ import annotations

from collections.abc import Iterator

import pytest

from aeroqueue import keys
from aeroqueue.backends import Backend


@pytest.fixture
def no_marks(registered: Backend) -> Iterator[None]:
    """No lost-take mark (`sessions.mark_lost_take`) and no sweep gate, before and after
    the test. The real server is shared by the tests one after another: a mark left
    behind sets off a sweep in a later test's worker, and a gate left behind holds
    back the sweep a test waits for."""
    def clear() -> None:
        for name in (keys.LOST_TAKE_MARK, keys.SWEEP_GATE):
            registered.remove(keys.LOCK_SET, name)

    clear()
    yield
    clear()
