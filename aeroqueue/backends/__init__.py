"""Backends: where the records live. `open_backend(url)` picks one from the store URL."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..config import StoreURL, default_store_path, resolve_url
from ..errors import BackendError, ConfigError
from .base import Backend, BatchResult, Record, retry_busy, wrap

__all__ = ["Backend", "BatchResult", "Record", "open_backend", "retry_busy", "wrap"]


def open_backend(url: str | StoreURL | None = None, *, create: bool = True, **embedded_options: Any) -> Backend:
    """Connect to the store the URL names (see `aeroqueue.config`).

    An embedded store file that does not exist is created only with `create`
    (its directory must exist, except for the default store's, which is made).
    `embedded_options` (clock, faults, max_record_size) only apply to the
    embedded backend; they exist for tests.
    """
    parsed = url if isinstance(url, StoreURL) else resolve_url(url)
    import aerospike

    # No silent client retries of writes: take and alloc are not idempotent (a
    # retried take would hand out tokens twice). aeroqueue retries what is safe
    # itself (RecordBusy, and claims/acks whose answer was lost).
    no_retry = {"max_retries": 0, "key": aerospike.POLICY_KEY_SEND}
    policies: dict[str, Any] = {"key": aerospike.POLICY_KEY_SEND, "write": no_retry, "apply": no_retry, "operate": no_retry}
    if parsed.is_embedded:
        from .embedded import EmbeddedClient

        if create and parsed.path == str(default_store_path()):
            # A new user's first command: nobody typed this path, so no typo to catch.
            default_store_path().parent.mkdir(parents=True, exist_ok=True)

        max_size = parsed.option("max_record_size")
        if max_size is not None:
            if not max_size.isdigit():
                raise ConfigError(f"store URL option max_record_size={max_size!r} is not a number of bytes")
            embedded_options.setdefault("max_record_size", int(max_size))
        embedded = EmbeddedClient(parsed.path or ":memory:", parsed.namespace, policies=policies, create=create, **embedded_options)
        return Backend(embedded, parsed)
    if embedded_options:
        raise ConfigError(f"options {sorted(embedded_options)} only apply to the embedded backend")
    config: dict[str, Any] = {
        "hosts": list(parsed.hosts),
        "policies": policies,
        # udf_put leaves a copy of each module in the client's Lua user path, by
        # default the current directory, where it would litter the user's work
        # tree (and shadow modules for a server started there).
        "lua": {"user_path": lua_cache_dir()},
    }
    if parsed.user:
        config["user"] = parsed.user
        config["password"] = parsed.password or ""
    try:
        client = aerospike.client(config).connect()
    except aerospike.exception.AerospikeError as e:
        # str(parsed) masks the password: nothing secret reaches logs.
        err = BackendError(f"cannot connect to {parsed}: {getattr(e, 'msg', e)}", operation="connect")
        err.hint = "is the server running and reachable? check --url or AEROQUEUE_URL"
        raise err from e
    return Backend(client, parsed)


def lua_cache_dir() -> str:
    """A private directory for the client's copies of uploaded Lua modules."""
    path = os.path.join(tempfile.gettempdir(), f"aeroqueue-lua-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
