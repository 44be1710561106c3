"""Which Host headers the HTTP servers answer: the dashboard and the metrics ports.

DNS rebinding: a page of another site whose name is made to resolve to the
address a server listens on is same-origin with that server for the browser,
so its scripts can read what the server answers (the dashboard's CSRF token,
the exporter's list names and counts). The browser still sends that site's
name as the Host header, so a server that answers only the names it is known
by is out of reach.

A server answers a Host that names a loopback name, the address it binds
(unless a wildcard: 0.0.0.0, ::), one of the names it is told to trust, or the
very address the request's connection came in at. Prometheus sends its target
as the Host (``10.0.0.5:9100``, a pod address found by service discovery), which
is always the address it connected to; a page can never make a browser send an
address of the server as the Host, only a name of its own. Ports, case and a
fully qualified name's trailing dot are ignored.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def host_name(host: str) -> str:
    """A Host header's (or a trusted name's) name: without its port, brackets, case
    and the trailing dot of a fully qualified name ('[::1]:8420' -> '::1',
    'Proxy.Example.:443' -> 'proxy.example'); an IP address in its one canonical
    form ('[0:0::1]' -> '::1'; '::ffff:10.0.0.5', as a dual-stack socket gives an
    IPv4 peer's address, -> '10.0.0.5')."""
    host = host.strip()
    if host.startswith("["):
        name = host[1:].partition("]")[0]
    elif host.count(":") > 1:
        name = host  # a bare IPv6 address, as a trusted name may be given
    else:
        name = host.partition(":")[0]
    name = name.lower().removesuffix(".")
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return name
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)


def url_host(address: str) -> str:
    """A bind address as a URL's host: an IPv6 address in brackets ('::1' ->
    '[::1]'), or 'http://::1:9420/' is no URL a browser or curl takes."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def is_wildcard(address: str) -> bool:
    """Whether a bind address means every address of the machine (0.0.0.0, ::, '')."""
    name = host_name(address)
    if not name:
        return True
    try:
        return ipaddress.ip_address(name).is_unspecified
    except ValueError:
        return False


class TrustedHosts:
    """The Host names a server answers (module docstring): loopback names, `names`,
    and `bound`, the address it binds, unless that is a wildcard. `option` is the
    command-line option that adds a name, for the refusal to name."""

    def __init__(self, names: Iterable[str] = (), *, bound: str | None = None, option: str = "--trusted-host") -> None:
        given = [*LOOPBACK_HOSTS, *names]
        if bound is not None and not is_wildcard(bound):
            given.append(bound)
        self.names = frozenset(host_name(h) for h in given if h.strip())
        self.option = option

    def allows(self, host: str, local_address: str | None = None) -> bool:
        """Whether to answer a request with this Host header, which came in at
        `local_address` (the server's end of the connection, when the server knows it)."""
        name = host_name(host)
        if not name:
            return False
        return name in self.names or (local_address is not None and name == host_name(local_address))

    def refusal(self, host: str, what: str) -> str:
        """The 400 answer's text: `what` ("this dashboard") is not served under that name."""
        return (f"{what} is not served as {host[:100]!r}: start it with {self.option} NAME "
                "for a name a proxy or scraper reaches it by (refused so that no other site's page "
                "can read it through DNS rebinding)")
