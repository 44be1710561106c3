"""Where the records live: one URL, parsed once.

- ``aerospike://host:3000[,host2:3000]/namespace``: a real server or cluster.
- ``embedded:///abs/path/store.db``: the embedded stand-in, a SQLite file
  shared by every process on the machine.
- ``embedded://:memory:``: a private in-process store (unit tests).

With no URL at all (neither ``--url`` nor ``AEROQUEUE_URL``) the embedded
store at :func:`default_store_path` is used.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

from .errors import InvalidURL

ENV_URL = "AEROQUEUE_URL"
DEFAULT_NAMESPACE = "test"
DEFAULT_PORT = 3000
MEMORY = ":memory:"

# Aerospike namespace names: at most 31 bytes, no dots or colons.
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,31}$")
_HOST = re.compile(r"^[A-Za-z0-9._-]+$|^\[[0-9A-Fa-f:.]+\]$")


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL. ``str()`` never shows credentials."""

    scheme: str  # "aerospike" or "embedded"
    namespace: str
    hosts: tuple[tuple[str, int], ...] = ()
    path: str | None = None  # embedded: file path or ":memory:"
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    options: tuple[tuple[str, str], ...] = ()

    @property
    def is_embedded(self) -> bool:
        return self.scheme == "embedded"

    def option(self, name: str, default: str | None = None) -> str | None:
        return dict(self.options).get(name, default)

    def __str__(self) -> str:
        if self.is_embedded:
            # An absolute path brings the third slash: embedded:///abs/path.db
            return f"embedded://{self.path}"
        who = f"{self.user}:***@" if self.user else ""
        hosts = ",".join(f"{h}:{p}" for h, p in self.hosts)
        return f"aerospike://{who}{hosts}/{self.namespace}"


def default_store_path() -> Path:
    """The embedded store used when no URL is configured:
    ``$XDG_DATA_HOME/aeroqueue/store.db`` (``~/.local/share/aeroqueue/store.db``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "aeroqueue" / "store.db"


def resolve_url(url: str | None = None) -> StoreURL:
    """The URL given, else ``$AEROQUEUE_URL``, else the default embedded store.

    An empty URL (``--url ''``, or ``AEROQUEUE_URL`` set but empty) is an error,
    not the default: a variable meant to point somewhere and left empty by a
    broken script must not send the work to another store."""
    text = url if url is not None else os.environ.get(ENV_URL)
    if text is None:
        return StoreURL(scheme="embedded", namespace=DEFAULT_NAMESPACE, path=str(default_store_path()))
    if not text.strip():
        where = "--url" if url is not None else ENV_URL
        raise InvalidURL(
            f"{where} is set but empty; unset it to use the default store ({default_store_path()}), "
            "or give a store URL"
        )
    return parse_url(text)


def parse_url(text: str) -> StoreURL:
    """Parse a store URL, or raise `InvalidURL` naming the part that is wrong."""
    if "://" not in text:
        raise InvalidURL(
            f"store URL {_safe(text)!r}: missing scheme; expected aerospike://host:3000/namespace "
            "or embedded:///path/store.db"
        )
    scheme, rest = text.split("://", 1)
    rest, _, query = rest.partition("?")
    try:
        options = tuple(parse_qsl(query, strict_parsing=True)) if query else ()
    except ValueError:
        raise InvalidURL(f"store URL {_safe(text)!r}: malformed query string {query!r}") from None
    if scheme == "aerospike":
        return _parse_aerospike(text, rest, options)
    if scheme == "embedded":
        return _parse_embedded(text, rest, options)
    raise InvalidURL(
        f"store URL {_safe(text)!r}: unknown scheme {scheme!r}; expected 'aerospike' or 'embedded'"
    )


def _parse_aerospike(text: str, rest: str, options: tuple[tuple[str, str], ...]) -> StoreURL:
    authority, slash, namespace = rest.partition("/")
    user = password = None
    if "@" in authority:
        creds, authority = authority.rsplit("@", 1)
        user, _, password = creds.partition(":")
        if not user:
            raise InvalidURL(f"store URL {_safe(text)!r}: empty user name before '@'")
    if not authority:
        raise InvalidURL(f"store URL {_safe(text)!r}: no host; expected aerospike://host:3000/namespace")
    hosts = []
    for part in authority.split(","):
        host, port = _split_host_port(text, part)
        hosts.append((host, port))
    if not slash or not namespace:
        raise InvalidURL(f"store URL {_safe(text)!r}: no namespace; expected aerospike://host:3000/namespace")
    if not _NAMESPACE.match(namespace):
        raise InvalidURL(
            f"store URL {_safe(text)!r}: namespace {namespace!r} is not a valid Aerospike namespace "
            "(1 to 31 letters, digits, '_' or '-')"
        )
    return StoreURL(
        scheme="aerospike",
        namespace=namespace,
        hosts=tuple(hosts),
        user=user,
        password=password or None,
        options=options,
    )


def _split_host_port(text: str, part: str) -> tuple[str, int]:
    if not part:
        raise InvalidURL(f"store URL {_safe(text)!r}: empty host in the host list")
    if part.startswith("["):  # [ipv6]:port
        host, _, tail = part.partition("]")
        host += "]"
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = part.partition(":")
    if not _HOST.match(host):
        raise InvalidURL(f"store URL {_safe(text)!r}: host {host!r} is not a valid host name")
    if not port_text:
        return host.strip("[]"), DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidURL(f"store URL {_safe(text)!r}: port {port_text!r} of host {host!r} is not a number from 1 to 65535")
    return host.strip("[]"), int(port_text)


def _parse_embedded(text: str, rest: str, options: tuple[tuple[str, str], ...]) -> StoreURL:
    namespace = dict(options).get("namespace", DEFAULT_NAMESPACE)
    if not _NAMESPACE.match(namespace):
        raise InvalidURL(f"store URL {_safe(text)!r}: namespace {namespace!r} is not a valid Aerospike namespace")
    if rest == MEMORY:
        return StoreURL(scheme="embedded", namespace=namespace, path=MEMORY, options=options)
    if not rest.startswith("/") or rest == "/":
        raise InvalidURL(
            f"store URL {text!r}: the embedded store needs an absolute file path "
            "(embedded:///abs/path/store.db) or :memory: (embedded://:memory:)"
        )
    if rest.endswith("/"):
        raise InvalidURL(f"store URL {text!r}: path {rest!r} names a directory, not a store file")
    return StoreURL(scheme="embedded", namespace=namespace, path=rest, options=options)


def _safe(text: str) -> str:
    """The URL with any password masked, for error messages."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", text)
