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


def connect(url: str | None = None) -> Backend:
    """Open the store (`url`, else AEROQUEUE_URL, else the embedded default) and make
    sure it runs this client's UDF modules: an embedded store registers them; a
    cluster without them is refused with the command that registers them."""
    from . import udfs

    backend = open_backend(url)
    udfs.ensure(backend)
    return backend


__all__ = [
    "AeroqueueError", "Backend", "Job", "Retry", "StoreURL", "connect", "open_backend", "parse_url", "resolve_url",
]
__version__ = "0.1.0"
