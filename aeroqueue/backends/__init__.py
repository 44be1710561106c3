"""Backends: where the records live. `open_backend(url)` picks one from the store URL."""

from __future__ import annotations

from typing import Any

from ..config import StoreURL, resolve_url
from ..errors import BackendError, ConfigError
from .base import Backend, BatchResult, Record, retry_busy, wrap

__all__ = ["Backend", "BatchResult", "Record", "open_backend", "retry_busy", "wrap"]


def open_backend(url: str | StoreURL | None = None, **embedded_options: Any) -> Backend:
    """Connect to the store the URL names (see `aeroqueue.config`).

    `embedded_options` (clock, faults, max_record_size) only apply to the
    embedded backend; they exist for tests.
    """
    parsed = url if isinstance(url, StoreURL) else resolve_url(url)
    if parsed.is_embedded:
        from .embedded import EmbeddedClient

        max_size = parsed.option("max_record_size")
        if max_size is not None:
            if not max_size.isdigit():
                raise ConfigError(f"store URL option max_record_size={max_size!r} is not a number of bytes")
            embedded_options.setdefault("max_record_size", int(max_size))
        embedded = EmbeddedClient(parsed.path or ":memory:", parsed.namespace, **embedded_options)
        return Backend(embedded, parsed)
    if embedded_options:
        raise ConfigError(f"options {sorted(embedded_options)} only apply to the embedded backend")
    import aerospike

    # No silent client retries of writes: take and alloc are not idempotent (a
    # retried take would hand out tokens twice). aeroqueue retries what is safe
    # itself (RecordBusy, and claims/acks whose answer was lost).
    no_retry = {"max_retries": 0, "key": aerospike.POLICY_KEY_SEND}
    config: dict[str, Any] = {
        "hosts": list(parsed.hosts),
        "policies": {"key": aerospike.POLICY_KEY_SEND, "write": no_retry, "apply": no_retry, "operate": no_retry},
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
