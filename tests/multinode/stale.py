"""The stale client of the replayer processes (tests/multinode/*_replayer.py), in a
module of its own: replaying.py, the test side, imports the pytest conftest, which a
replayer process has no use for.

A client that has not learnt yet that a frozen node is gone: it learns the cluster's
partition map once, when it connects (all nodes up), and never tends again (an
hour), so its calls keep going to the node the map names, frozen or not.
"""

from __future__ import annotations

from typing import Any

import aerospike

from aeroqueue.backends import Backend, client_config
from aeroqueue.config import parse_url


def stale_client(url: str) -> Any:
    """The raw client (`aerospike.Client`), connected."""
    return aerospike.client({**client_config(parse_url(url)), "tend_interval": 3_600_000}).connect()


def stale_backend(url: str) -> Backend:
    """`stale_client` as a `Backend`."""
    return Backend(stale_client(url), parse_url(url))
