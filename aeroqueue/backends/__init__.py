"""Backends: where the records live. `open_backend(url)` picks one from the store URL."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..config import StoreURL, default_store_path, resolve_url
from ..errors import BackendError, ConfigError, StoreUnreachable
from .base import (
    FRESH_DEADLINE,
    IN_DOUBT,
    Backend,
    BatchResult,
    Record,
    retry_busy,
    retry_in_doubt,
    wrap,
)
from .holds import credit_hold

__all__ = [
    "FRESH_DEADLINE", "IN_DOUBT", "Backend", "BatchResult", "Record", "client_config", "open_backend", "retry_busy", "retry_in_doubt", "wrap",
]


def open_backend(url: str | StoreURL | None = None, *, create: bool = True, **embedded_options: Any) -> Backend:
    """Connect to the store the URL names (see `aeroqueue.config`).

    An embedded store file that does not exist is created only with `create`
    (its directory must exist, except for the default store's, which is made).
    `embedded_options` (clock, faults, max_record_size) only apply to the
    embedded backend; they exist for tests.
    """
    parsed = url if isinstance(url, StoreURL) else resolve_url(url)
    import aerospike

    if parsed.is_embedded:
        from .embedded import EmbeddedClient

        if create and parsed.path == str(default_store_path()):
            # A new user's first command: nobody typed this path, so no typo to catch.
            default_store_path().parent.mkdir(parents=True, exist_ok=True)

        max_size = parsed.option("max_record_size")  # checked where the URL was parsed
        if max_size is not None:
            embedded_options.setdefault("max_record_size", int(max_size))
        try:
            embedded = EmbeddedClient(
                parsed.path or ":memory:", parsed.namespace, policies=_base_policies(), create=create, **embedded_options
            )
        except aerospike.exception.AerospikeError as e:
            # Opening writes too (the schema, on a new file): a store locked by a
            # stopped process times out here as any write does, and says so.
            raise wrap(e, "open", str(parsed)) from e
        backend = Backend(embedded, parsed)
        embedded.on_long_hold = lambda held_ms: credit_hold(backend, held_ms)  # holds.py: why
        return backend
    if embedded_options:
        raise ConfigError(f"options {sorted(embedded_options)} only apply to the embedded backend")
    config = client_config(parsed)
    try:
        client = aerospike.client(config).connect()
        if not client.is_connected():
            # No seed answered. Ask again the strict way: its error says why
            # (refused, timed out, authentication, wrong cluster name...).
            client.close()
            client = aerospike.client({**config, "fail_if_not_connected": True}).connect()
    except aerospike.exception.AerospikeError as e:
        # str(parsed) masks the password: nothing secret reaches logs.
        seeds = "its seed" if len(parsed.hosts) == 1 else f"any of its {len(parsed.hosts)} seeds"
        why = getattr(e, "msg", e)
        hint = "is the server running and reachable? check --url or AEROQUEUE_URL"
        cluster = dict(parsed.options).get("cluster_name")
        if cluster is not None:
            # A seed of another cluster is refused with the same "Failed to connect".
            hint = (f"is the server running and reachable, and is its cluster name {cluster!r} (cluster_name)? "
                    "check --url or AEROQUEUE_URL")
        if isinstance(e, aerospike.exception.AdminError):
            # The client says only "Failed to connect" for a refused login too: the
            # server answered, so "is it running?" would send the user the wrong way.
            why = f"{why}: the server refused the login ({type(e).__name__}, code {e.code})"
            if isinstance(e, (aerospike.exception.SecurityNotSupported, aerospike.exception.SecurityNotEnabled)):
                hint = ("the server has no users to log in as (security is off; Community Edition has none): "
                        "remove user:password@ from --url or AEROQUEUE_URL")
            else:
                hint = "check the user name and password in --url or AEROQUEUE_URL"
        # Unreachable, or a login refused: a caller that waits for a server coming up
        # (the metrics exporter) waits only for the first. (A seed of another cluster,
        # or a TLS handshake that fails, the client reports as unreachable: so is it.)
        kind = BackendError if isinstance(e, aerospike.exception.AdminError) else StoreUnreachable
        err = kind(f"cannot connect to {parsed} through {seeds}: {why}", operation="connect")
        err.hint = hint
        raise err from e
    return Backend(client, parsed)


def _base_policies() -> dict[str, Any]:
    import aerospike

    # No silent client retries of writes: take and alloc are not idempotent (a
    # retried take would hand out tokens twice). aeroqueue retries what is safe
    # itself (RecordBusy, and claims/acks whose answer was lost).
    no_retry = {"max_retries": 0, "key": aerospike.POLICY_KEY_SEND}
    # Reads consult every copy of a record while partitions migrate (AP mode; no
    # cost otherwise). A node that rejoins with old copies (a frozen node that
    # resumed, a split healing) can be a partition's master before migrations
    # have merged them: with the default (one copy) `status` and job reads showed
    # jobs acknowledged seconds earlier as queued. Writes resolve duplicates on
    # the server already.
    all_copies = {"read_mode_ap": aerospike.POLICY_READ_MODE_AP_ALL}
    return {
        "key": aerospike.POLICY_KEY_SEND,
        "read": dict(all_copies),
        "batch": dict(all_copies),
        "write": dict(no_retry),
        "apply": dict(no_retry),
        "operate": {**no_retry, **all_copies},
    }


def client_config(url: StoreURL) -> dict[str, Any]:
    """The `aerospike.client` configuration for an aerospike:// URL and its options."""
    options = url.client_options()
    policies = _base_policies()
    commands = ("read", "write", "apply", "operate", "remove", "batch", "batch_parent_write")
    for name in ("total_timeout", "socket_timeout"):
        if name in options:
            for command in commands:
                policies.setdefault(command, {})[name] = options[name]
    if "total_timeout" in options:
        policies["info"] = {"timeout": options["total_timeout"]}
    tls_name = options.get("tls_name")
    config: dict[str, Any] = {
        "hosts": [(h, p, tls_name) if tls_name else (h, p) for h, p in url.hosts],
        "policies": policies,
        # Start with whichever seeds answer: one node down must not stop a process
        # from starting (the default refuses when any seed's peers are unreachable).
        "fail_if_not_connected": False,
        # udf_put leaves a copy of each module in the client's Lua user path, by
        # default the current directory, where it would litter the user's work
        # tree (and shadow modules for a server started there).
        "lua": {"user_path": lua_cache_dir()},
    }
    for name in ("connect_timeout", "min_conns_per_node", "max_conns_per_node", "use_services_alternate", "cluster_name"):
        if name in options:
            config[name] = options[name]
    if tls_name or "tls_cafile" in options:
        config["tls"] = {"enable": True, **({"cafile": options["tls_cafile"]} if "tls_cafile" in options else {})}
    if url.user:
        config["user"] = url.user
        config["password"] = url.password or ""
    return config


def lua_cache_dir() -> str:
    """A private directory for the client's copies of uploaded Lua modules."""
    path = os.path.join(tempfile.gettempdir(), f"aeroqueue-lua-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
