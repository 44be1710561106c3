"""aeroqueue: a job queue on Aerospike.

O(1) reservation from job lists, heartbeat sessions that bring back the jobs
of workers that died, exactly-once acknowledgement, and a PySpark sync of
processed jobs to MySQL.
"""

from typing import TYPE_CHECKING, Any

from .backends import Backend, open_backend
from .config import StoreURL, parse_url, resolve_url
from .errors import AeroqueueError

if TYPE_CHECKING:
    from .queue import Job, Retry


def __getattr__(name: str) -> Any:
    # The handler's API, imported on first use: `import aeroqueue.<module>` (a sync
    # executor, the CLI) does not pay for the queue's imports.
    if name in ("Job", "Retry"):
        from . import queue

        return getattr(queue, name)
    raise AttributeError(f"module 'aeroqueue' has no attribute {name!r}")


def connect(url: str | None = None, *, create: bool | None = None) -> Backend:
    """Open the store (`url`, else AEROQUEUE_URL, else the embedded default) and make
    sure it runs this client's UDF modules: an embedded store registers them; a
    cluster without them is refused with the command that registers them.

    An embedded store file that does not exist is made as the CLI makes it
    (`config.may_create`: the default store, or AEROQUEUE_CREATE), unless
    `create` says otherwise."""
    from . import udfs
    from .config import may_create

    backend = open_backend(url, create=may_create(url) if create is None else create)
    udfs.ensure(backend)
    return backend


__all__ = [
    "AeroqueueError", "Backend", "Job", "Retry", "StoreURL", "connect", "open_backend", "parse_url", "resolve_url",
]
__version__ = "0.1.0"
