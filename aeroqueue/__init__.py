"""aeroqueue: a job queue on Aerospike.

O(1) reservation from job lists, heartbeat sessions that bring back the jobs
of workers that died, exactly-once acknowledgement, and a PySpark sync of
processed jobs to MySQL.
"""

# The package's first lines import nothing, not even `typing` or `__future__`: a
# Ctrl-C while they ran (an import is milliseconds on a busy machine) came out as a
# traceback through this file, before `__main__.main` could turn it into one line.
# mypy reads a name TYPE_CHECKING as true wherever it is defined.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from .backends import Backend, open_backend
    from .config import StoreURL, parse_url, resolve_url
    from .errors import AeroqueueError
    from .queue import Job, Retry

# Every name of the API, imported on first use: `import aeroqueue.<module>` (a sync
# executor, the CLI) does not pay for the queue's imports, and the `aeroqueue`
# command imports nothing before its Ctrl-C handling is in place (`__main__`).
_LAZY = {
    "Backend": "backends", "open_backend": "backends", "StoreURL": "config", "parse_url": "config",
    "resolve_url": "config", "AeroqueueError": "errors", "Job": "queue", "Retry": "queue",
}


def __getattr__(name: str) -> "Any":
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'aeroqueue' has no attribute {name!r}")


def connect(url: "str | None" = None, *, create: "bool | None" = None) -> "Backend":
    """Open the store (`url`, else AEROQUEUE_URL, else the embedded default) and make
    sure it runs this client's UDF modules: an embedded store registers them; a
    cluster without them is refused with the command that registers them.

    An embedded store file that does not exist is made as the CLI makes it
    (`config.may_create`: the default store, or AEROQUEUE_CREATE), unless
    `create` says otherwise."""
    from . import udfs
    from .backends import open_backend
    from .config import may_create

    backend = open_backend(url, create=may_create(url) if create is None else create)
    udfs.ensure(backend)
    return backend


__all__ = [
    "AeroqueueError", "Backend", "Job", "Retry", "StoreURL", "connect", "open_backend", "parse_url", "resolve_url",
]
__version__ = "0.1.0"
