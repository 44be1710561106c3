"""Where the records live: one URL, parsed once.

- ``aerospike://[user:password@]host:3000[,host2:3000]/namespace[?option=value&...]``:
  a real server or cluster. Every host is a seed: the client starts with
  whichever of them answer. The options are the client settings a cluster
  needs (`CLIENT_OPTIONS`); an unknown option or a bad value is refused.
- ``embedded:///abs/path/store.db``: the embedded stand-in, a SQLite file
  shared by every process on the machine.
- ``embedded://:memory:``: a private in-process store (unit tests).

With no URL at all (neither ``--url`` nor ``AEROQUEUE_URL``) the embedded
store at :func:`default_store_path` is used.
"""

from __future__ import annotations

import operator
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from .errors import InvalidURL
from .hosts import url_host

ENV_URL = "AEROQUEUE_URL"
ENV_CREATE = "AEROQUEUE_CREATE"  # as --create: a named embedded store file may be made
# The longest time limit, backoff, delay or grace accepted: ten years. Longer is a
# mistake, and past about 2^63 ms it no longer fits a record's integer.
MAX_SECONDS = 10 * 365 * 86_400
# How far apart this host's clock and the server's may be (the fast sync mark assumes
# the same): a lease is judged past its limit only this long after it by our clock.
CLOCK_MARGIN_MS = 1000
# How long after reading the stores' heads a sweep (or a drop) reads the sessions'
# leases: a reservation that took jobs before that has recorded its lease by then.
LEASE_SETTLE_S = 1.0
MAX_ATTEMPTS = 1_000_000  # the most attempts a list may give a job
DEFAULT_NAMESPACE = "test"
DEFAULT_PORT = 3000
MEMORY = ":memory:"

# Aerospike namespace names: at most 31 bytes, no dots or colons.
_NAMESPACE = re.compile(r"^[A-Za-z0-9_-]{1,31}$")
_HOST = re.compile(r"^[A-Za-z0-9._-]+$|^\[[0-9A-Fa-f:.]+\]$")
# A number in a URL: ASCII digits only (isdigit() takes '²', which int() refuses), nine at most.
_DIGITS = re.compile(r"[0-9]{1,9}")
# A number as a person writes one: ASCII digits, a sign, a point, an exponent. float()
# takes more that nobody means as a time: '1_000', ' 12 ', Arabic-Indic or fullwidth
# digits, 'nan', 'inf', 'Infinity'.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
PLAIN_NUMBER = "digits 0-9, with a '.' or an exponent if need be"


def plain_number(text: str) -> float | None:
    """`text` as a float if it is a number as people write one (`PLAIN_NUMBER`), else None."""
    return float(text) if _DECIMAL.fullmatch(text) else None

# Client options an aerospike:// URL may carry, each with what its value must be.
# Timeouts are in milliseconds and apply to every command (0: no limit).
CLIENT_OPTIONS: dict[str, str] = {
    "connect_timeout": "milliseconds, more than 0: how long to wait for each seed at start-up",
    "total_timeout": "milliseconds: the whole of one command, retries included (0: no limit)",
    "socket_timeout": "milliseconds: one attempt's idle socket (0: no limit)",
    "min_conns_per_node": "a count: connections opened to each node up front",
    "max_conns_per_node": "a count, more than 0: the most connections to one node",
    "use_services_alternate": "true or false: connect to the nodes' alternate-access-address (NAT, containers)",
    "tls_name": "the nodes' TLS name: turns TLS on",
    "tls_cafile": "path of the CA certificate file that signs the nodes' certificates: turns TLS on",
    "cluster_name": "the cluster-name the nodes must have",
}
CLIENT_MAX_CONNS = 100  # the client's default max_conns_per_node
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def whole(what: str, value: Any) -> int:
    """`value` as an int, checked to be a whole number (an int, or one that says it is
    one: numpy's; not a bool, nor a float): what a count or a limit must be before it
    reaches a store. A float count taken by the list's Lua left a float in the list
    record, and every read of the list failed after."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {value!r}") from None


def seconds(what: str, value: Any) -> float:
    """`value`, checked to be a number of seconds: any real number (an int, a float, a
    Decimal, numpy's), not a bool or a string."""
    if isinstance(value, bool | str | bytes) or value is None:
        raise TypeError(f"{what} must be a number of seconds, not {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a number of seconds, not {value!r}") from None


def flag(what: str, value: Any) -> bool:
    """`value` as a bool; a string is refused ("no" would be true)."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{what} must be True or False, not {value!r}")
    return bool(value)


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

    def client_options(self) -> dict[str, Any]:
        """The aerospike:// options, checked and typed (`CLIENT_OPTIONS`)."""
        return _client_options(str(self), self.options)

    def __str__(self) -> str:
        if self.is_embedded:
            # An absolute path brings the third slash: embedded:///abs/path.db
            return f"embedded://{self.path}"
        # The user as a URL holds it ("us%3Aer", not "us:er", which read as user "us" and
        # a password); '***' only for a password there is.
        who = f"{quote(self.user, safe='')}{':***' if self.password else ''}@" if self.user else ""
        hosts = ",".join(f"{url_host(h)}:{p}" for h, p in self.hosts)  # an IPv6 address in brackets
        # Encoded again as parsed: a decoded '&' or '#' in a value would end it early
        # (and what follows would show as another option, unmasked in an error).
        query = "&".join(f"{quote(k, safe='')}={quote(v, safe='/:,')}" for k, v in self.options)
        return f"aerospike://{who}{hosts}/{self.namespace}" + (f"?{query}" if query else "")


def default_store_path() -> Path:
    """The embedded store used when no URL is configured:
    ``$XDG_DATA_HOME/aeroqueue/store.db`` (``~/.local/share/aeroqueue/store.db``).
    A relative XDG_DATA_HOME is ignored, as the XDG Base Directory spec says: it
    would name a store that moves with the working directory (and a URL, which
    needs an absolute path, refuses it)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(Path.home(), ".local", "share")
    return Path(base) / "aeroqueue" / "store.db"


def may_create(url: str | None = None) -> bool:
    """Whether opening the store (`url`, else AEROQUEUE_URL) may make its embedded
    file: only the default store (nobody typed its path, so no typo to catch), or
    with AEROQUEUE_CREATE set as click reads a flag (1, true, yes, on). Anyone
    else's path must exist: a typo is an error, not a new empty store."""
    if url is None and os.environ.get(ENV_URL) is None:
        # Made on first use; an empty file there is no first use but a store emptied by
        # accident, refused as a named one is (`init` or --create makes it).
        try:
            return default_store_path().stat().st_size > 0
        except OSError:
            return True  # not there yet
    return os.environ.get(ENV_CREATE, "").strip().lower() in ("1", "true", "t", "yes", "y", "on")


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
    if scheme == "aerospike" and unencoded_in_credentials(text):
        raise InvalidURL(f"store URL {_safe(text)!r}: {CREDENTIALS_ENCODING}")
    rest, _, query = rest.partition("?")
    try:
        options = tuple(parse_qsl(query, keep_blank_values=True, strict_parsing=True)) if query else ()
    except ValueError:
        # A password's '?' may have cut it: not shown; else with its values masked.
        shown = "" if "@" in query else f" {_masked_values(query)!r}"
        raise InvalidURL(f"store URL {_safe(text)!r}: malformed query string{shown}") from None
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
        # Percent-encoding lets a password hold ':', '/', '@', '?' or '&'.
        try:
            user, password = decoded_credential(user, "user name"), decoded_credential(password, "password")
        except ValueError as e:
            raise InvalidURL(f"store URL {_safe(text)!r}: {e}") from None
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
    url = StoreURL(
        scheme="aerospike",
        namespace=namespace,
        hosts=tuple(hosts),
        user=user,
        password=password or None,
        options=options,
    )
    url.client_options()  # refuse an unknown option or a bad value now, not at connect time
    return url


def _client_options(where: str, options: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    where = mask_url(where)  # the URL as an error quotes it: an unknown option's value may be a secret
    out: dict[str, Any] = {}
    for name, value in options:
        what = CLIENT_OPTIONS.get(name)
        if what is None:
            raise InvalidURL(
                f"store URL {where!r}: unknown option {name!r}; the options are {', '.join(sorted(CLIENT_OPTIONS))}"
            )
        if name in out:
            raise InvalidURL(f"store URL {where!r}: option {name!r} is given twice")
        bad = InvalidURL(f"store URL {where!r}: option {name}={value!r} is not valid; it takes {what}")
        if name.endswith("_timeout") or name.endswith("_per_node"):
            if not _DIGITS.fullmatch(value):
                raise bad
            number = int(value)
            if number == 0 and name in ("connect_timeout", "max_conns_per_node"):
                raise bad
            out[name] = number
        elif name == "use_services_alternate":
            if value.lower() not in _TRUE + _FALSE:
                raise bad
            out[name] = value.lower() in _TRUE
        elif name == "tls_cafile":
            if not value or not os.path.isfile(value):
                raise InvalidURL(f"store URL {where!r}: option tls_cafile={value!r}: no such file")
            out[name] = value
        else:
            if not value or any(c.isspace() for c in value):
                raise bad
            out[name] = value
    low, high = out.get("min_conns_per_node", 0), out.get("max_conns_per_node", CLIENT_MAX_CONNS)
    if low > high:
        raise InvalidURL(f"store URL {where!r}: min_conns_per_node={low} is more than max_conns_per_node={high}")
    return out


def _split_host_port(text: str, part: str) -> tuple[str, int]:
    if not part:
        raise InvalidURL(f"store URL {_safe(text)!r}: empty host in the host list")
    if part.startswith("["):  # [ipv6]:port
        host, bracket, tail = part.partition("]")
        host += "]"
        if not bracket or (tail and not tail.startswith(":")):
            raise InvalidURL(f"store URL {_safe(text)!r}: host {part!r} is not [IPv6 address] or [IPv6 address]:port")
        port_text = tail[1:]
    else:
        host, _, port_text = part.partition(":")
    if not _HOST.match(host):
        raise InvalidURL(f"store URL {_safe(text)!r}: host {host!r} is not a valid host name")
    if not port_text:
        return host.strip("[]"), DEFAULT_PORT
    if not _DIGITS.fullmatch(port_text) or not 0 < int(port_text) < 65536:
        raise InvalidURL(f"store URL {_safe(text)!r}: port {port_text!r} of host {host!r} is not a number from 1 to 65535")
    return host.strip("[]"), int(port_text)


# What an embedded URL takes after '?': the namespace its records are kept under, and
# the record size it refuses past (a server's max-record-size, for tests of loading).
EMBEDDED_OPTIONS = ("max_record_size", "namespace")
MAX_RECORD_SIZE_LIMIT = 8 * 1024 * 1024  # the largest max-record-size a server takes
# The smallest aeroqueue works with (a server takes 64 bytes): a job's failures (the last
# error and ten before, 4,000 bytes each) and bins beside its payload (RECORD_OVERHEAD,
# 64 KiB), and a completion bitmap record's 8 KiB bitmaps. Below it an ack wrote the job
# done and not its bit (the list was never complete), and a fail past the room left a
# job that could never go dead.
MIN_RECORD_SIZE_LIMIT = 128 * 1024


def _parse_embedded(text: str, rest: str, options: tuple[tuple[str, str], ...]) -> StoreURL:
    seen: set[str] = set()
    for name, _ in options:
        # A typo such as ?namespce=prod would otherwise use namespace `test`, unsaid.
        if name not in EMBEDDED_OPTIONS:
            raise InvalidURL(f"store URL {_safe(text)!r}: unknown option {name!r} for an embedded store; "
                             f"the options are {', '.join(EMBEDDED_OPTIONS)}")
        if name in seen:
            raise InvalidURL(f"store URL {_safe(text)!r}: option {name!r} is given twice")
        seen.add(name)
    namespace = dict(options).get("namespace", DEFAULT_NAMESPACE)
    if not _NAMESPACE.match(namespace):
        raise InvalidURL(f"store URL {_safe(text)!r}: namespace {namespace!r} is not a valid Aerospike namespace")
    size = dict(options).get("max_record_size")
    # Refused here, not at the first write: 0 made every write fail with a bare RECORD_TOO_BIG.
    if size is not None and not (_DIGITS.fullmatch(size)
                                 and MIN_RECORD_SIZE_LIMIT <= int(size) <= MAX_RECORD_SIZE_LIMIT):
        raise InvalidURL(f"store URL {_safe(text)!r}: option max_record_size={size!r} is not valid; it takes a number "
                         f"of bytes from {MIN_RECORD_SIZE_LIMIT} (the least aeroqueue works with) to {MAX_RECORD_SIZE_LIMIT} "
                         "(the most a server takes)")
    if rest == MEMORY:
        return StoreURL(scheme="embedded", namespace=namespace, path=MEMORY, options=options)
    if not rest.startswith("/") or rest == "/":
        raise InvalidURL(
            f"store URL {_safe(text)!r}: the embedded store needs an absolute file path "
            "(embedded:///abs/path/store.db) or :memory: (embedded://:memory:)"
        )
    if rest.endswith("/"):
        raise InvalidURL(f"store URL {_safe(text)!r}: path {_safe(rest)!r} names a directory, not a store file")
    return StoreURL(scheme="embedded", namespace=namespace, path=rest, options=options)


# user:password@ in a URL: the password runs to the last '@' before a blank, so a
# password holding an unencoded '/' or '@' (which the URL then parses wrongly) is
# still masked whole. Masking too much (a later '@' in the path) is the safe error.
_PASSWORD_IN_URL = re.compile(r"(://[^:/\s]*:)\S*@")  # a user name may hold '@' (Azure: user@server)


# A query parameter that names a secret (?password=..., &api_key=...): no URL here takes
# one (credentials go before the host), but one given anyway is quoted by the error.
_SECRET_IN_QUERY = re.compile(
    r"([?&][^=&\s#'\"]*(?:pass|pw|secret|token|key|auth|sig|credential)[^=&\s#'\"]*=)"
    r"(?:'[^']*'|\"[^\"]*\"|[^&\s#'\"]*)", re.I)


def mask_passwords(text: str) -> str:
    """`text` with the password of every user:password@ URL in it masked, and the value
    of every query parameter that names a secret."""
    return _SECRET_IN_QUERY.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", text))


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/{0,2}")


def mask_url(url: str) -> str:
    """One URL given whole (an option's value), its password masked however it is
    malformed: a blank in the password, ':/' or ':' for '://'. Everything from the
    first ':' of the credentials to the last '@' goes; a scheme without '://' is
    taken for one only if credentials with a ':' follow it. Masks too much rather
    than too little: the text is for an error message."""
    at = url.rfind("@")
    if at < 0:
        return _mask_query(url)
    start = 0
    if (sep := url.find("://", 0, at)) >= 0:
        start = sep + 3
    elif (m := _SCHEME.match(url)) and ":" in url[m.end():at]:
        start = m.end()
    colon = url.find(":", start, at)
    return _mask_query(url if colon < 0 else f"{url[:colon + 1]}***{url[at:]}")


def _mask_query(url: str) -> str:
    """The values after '?' masked, but those of the options a store URL takes (none a
    secret): `?password=...` given by mistake is refused with the URL quoted. Only in
    a URL (with '://'): a file name or a job id holding '?' is shown as it is."""
    base, sep, query = url.partition("?")
    if not sep or "://" not in base:
        return url
    query, hash_sep, fragment = query.partition("#")
    return f"{base}?{_masked_values(query)}" + (f"{hash_sep}***" if fragment else hash_sep)


def _masked_values(query: str) -> str:
    """A query string with the values of all but a store URL's options masked."""
    shown = []
    for item in query.split("&"):
        name, eq, _ = item.partition("=")
        shown.append(item if not eq or name in CLIENT_OPTIONS or name in EMBEDDED_OPTIONS else f"{name}=***")
    return "&".join(shown)


def unencoded_in_credentials(url: str) -> bool:
    """A user name or password holding '/', '?' or '#' not percent-encoded, which no
    parser reads as meant (the rest of the password would become the path, query
    or port): the authority (up to the first of those) ends before an '@' that
    follows in the path, or in the query or fragment while the authority does not
    end in a port (an '@' in a query of a plain host:port URL is the query's)."""
    rest = url.partition("://")[2]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, after = rest[:end], rest[end:]
    if "@" in authority or "@" not in after:
        return False
    path = after.partition("?")[0].partition("#")[0]
    if "@" in path:
        return True
    _, colon, port = authority.rpartition(":")
    return bool(colon) and not port.isdigit() and not authority.endswith("]")


CREDENTIALS_ENCODING = ("a user name or password holding '/', '@', '?' or '#' must be percent-encoded "
                        "(%2F, %40, %3F, %23)")

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def decoded_credential(raw: str, what: str) -> str:
    """A URL's user name or password (`what`), percent-decoded. Raises ValueError, its
    message never quoting the value, for what no server would take as meant: a '%'
    that starts no escape (decoded as itself, it left '%41' and '%zz' to mean two
    things), an escape of a NUL (the client cuts the value there: another password),
    or escapes that are not UTF-8 (decoded as U+FFFD: another password again)."""
    if _BAD_ESCAPE.search(raw):
        raise ValueError(f"the {what} holds a '%' that starts no percent-escape: write a '%' itself as %25")
    try:
        value = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise ValueError(f"the {what}'s percent-escapes are not UTF-8") from None
    if "\x00" in value:
        raise ValueError(f"the {what} holds a NUL (%00), which the client would cut it at")
    return value


def _safe(text: str) -> str:
    """The URL with any password masked, for error messages."""
    return mask_url(text)
