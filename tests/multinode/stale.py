"""The stale client of the replayer processes (tests/multinode/*_replayer.py), in a
module of its own: replaying.py, the test side, imports the pytest conftest, which a
replayer process has no use for.

A client that has not learnt yet that a frozen node is gone: it learns the cluster's
partition map once, when it connects (all nodes up), and never tends again (an
hour), so its calls keep going to the node the map names, frozen or not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aerospike

from aeroqueue.backends import Backend, client_config
from aeroqueue.config import parse_url
from aeroqueue.errors import AeroqueueError


def stale_client(url: str) -> Any:
    """The raw client (`aerospike.Client`), connected."""
    return aerospike.client({**client_config(parse_url(url)), "tend_interval": 3_600_000}).connect()


def stale_backend(url: str) -> Backend:
    """`stale_client` as a `Backend`."""
    return Backend(stale_client(url), parse_url(url))


def in_doubt(call: Callable[[str, int], Any], names: Sequence[str], k: int) -> dict[str, list[int]]:
    """`call(name, i)` for every name and i < k, all at once (one attempt each: the
    stale client's calls to the frozen node wait there together); by name, the i whose
    call failed (in doubt: the frozen node was their master)."""
    def landed(name: str, i: int) -> bool:
        try:
            call(name, i)
            return True
        except AeroqueueError:
            return False

    every = [(name, i) for name in names for i in range(k)]
    with ThreadPoolExecutor(len(every)) as pool:
        ok = list(pool.map(lambda x: landed(*x), every))
    return {name: [i for (nm, i), fine in zip(every, ok, strict=True) if nm == name and not fine] for name in names}

