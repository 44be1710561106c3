"""Seeing the queue: `metrics` (a Prometheus exporter) and `dashboard` (a web UI).

Both serve HTTP until SIGTERM/SIGINT, on 127.0.0.1 unless told otherwise:
neither has a login, so another address belongs behind a proxy that has one.
(`aeroqueue worker --metrics-port` serves a worker's own metrics: worker_cmd.)
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
from typing import Any

import click

from ..backends.later import Later
from ..errors import ConfigError, StoreUnreachable
from ..hosts import is_wildcard, url_host
from ..keys import check_list_name
from ..logs import command_info, json_lines, request_lines
from ..stopping import Stop
from .context import Context, check_bind_host, err_console, option, seconds, usage_check

METRICS_PORT = 9420
DASHBOARD_PORT = 8420

HOST_HELP = "Address to bind. Nothing here asks for a login: bind another address only behind a proxy that does."
METRICS_TRUSTED_HELP = (
    "A host name Prometheus (or a proxy) may reach the metrics by (repeatable; env: space-separated), such as the "
    "name in a scrape target. Ports, case and a trailing dot are ignored. Loopback names, the bound address and, "
    "with a wildcard bind (0.0.0.0, ::), the address a request came in at are always served; any other Host is "
    "refused (400), so that no other site's page can read the metrics by DNS rebinding."
)


@click.command()
@option("--port", env="METRICS_PORT", type=click.IntRange(0, 65535), default=METRICS_PORT, help="Port serving /metrics.")
@option("--host", env="METRICS_HOST", default="127.0.0.1", callback=usage_check(check_bind_host), help=HOST_HELP)
@option("--list", "lists", env="METRICS_LISTS", multiple=True, callback=usage_check(check_list_name),
        help="Export only this list (repeatable; env: space-separated): no scan at all. Default: every list.")
@option("--discover-every", env="METRICS_DISCOVER_EVERY", type=seconds(1), default=60.0,
        help="Without --list: seconds between scans of the list set for new lists (never one per scrape).")
@option("--trusted-host", "trusted_hosts", env="METRICS_TRUSTED_HOSTS", multiple=True, help=METRICS_TRUSTED_HELP)
@option("--connect-every", env="METRICS_CONNECT_EVERY", type=seconds(1), default=10.0,
        help="While the store does not answer (it did not at the start): seconds between attempts to connect, "
             "meanwhile serving aeroqueue_store_up 0.")
@click.pass_obj
def metrics(
    obj: Context, port: int, host: str, lists: tuple[str, ...], discover_every: float, trusted_hosts: tuple[str, ...],
    connect_every: float,
) -> None:
    """Export every list's counts to Prometheus: total, queued, delayed, claimed, done,
    dead and completion, read from the store at each scrape (a few reads per list:
    its header and completion bitmaps, never a scan of its jobs).

    A store that does not answer at the start (a server still coming up) is no
    reason to stop: the exporter serves aeroqueue_store_up 0 and tries again every
    --connect-every seconds."""
    from prometheus_client import CollectorRegistry

    from ..metrics import ListNames, StoreCollector, StoreLater, serve

    stop = _stop_on_signals()

    def collector(errors: int = 0) -> StoreCollector:
        backend = obj.backend()
        return StoreCollector(backend, ListNames(backend, lists, discover_every_s=discover_every), errors=errors)

    registry = CollectorRegistry()
    try:
        registry.register(collector())
    except StoreUnreachable as e:
        command_info("aeroqueue.metrics")  # it says when the store answers
        registry.register(StoreLater(collector, e, retry_s=connect_every))
    server = serve(registry, port, host, trusted_hosts)
    _say_serving("aeroqueue.metrics", "serving metrics on", f"http://{url_host(host)}:{server.server_port}/metrics")
    _serve_until(stop, server)


@click.command()
@option("--port", env="DASHBOARD_PORT", type=click.IntRange(0, 65535), default=DASHBOARD_PORT, help="Port serving the dashboard.")
@option("--host", env="DASHBOARD_HOST", default="127.0.0.1", callback=usage_check(check_bind_host), help=HOST_HELP)
@option("--read-only", env="DASHBOARD_READ_ONLY", is_flag=True, help="Show, but offer no actions (pause, resume, kick), and refuse them.")
@option("--trusted-host", "trusted_hosts", env="DASHBOARD_TRUSTED_HOSTS", multiple=True,
        help="A host name requests may reach the dashboard by (repeatable; env: space-separated): the name of a "
             "proxy in front of it. Ports, case and a trailing dot are ignored. Loopback names, the --host address and, "
             "with a wildcard --host (0.0.0.0, ::), the address a request came in at are always served; any other Host "
             "is refused, so that no other site's page can reach it by DNS rebinding.")
@option("--connect-every", env="DASHBOARD_CONNECT_EVERY", type=seconds(1), default=10.0,
        help="While the store does not answer (it did not at the start): seconds between attempts to connect, "
             "meanwhile answering every page with a 503 that says why.")
@click.pass_obj
def dashboard(
    obj: Context, port: int, host: str, read_only: bool, trusted_hosts: tuple[str, ...], connect_every: float,
) -> None:
    """Serve the web dashboard: lists with progress and counts, live sessions, dead
    jobs with their errors, each job's detail; pause/resume a list, kick dead jobs.

    The CSRF tokens of its forms are signed with AEROQUEUE_DASHBOARD_SECRET when
    set (needed when several processes serve one address), else a key made up
    for this process. A store that does not answer at the start is tried again
    every --connect-every seconds; meanwhile each page says why it cannot show."""
    try:
        from werkzeug.serving import make_server

        from ..dashboard.app import create_app
    except ImportError as e:
        raise ConfigError(f"the dashboard needs Flask, Flask-WTF and Flask-Compress ({e.name} is missing): pip install 'aeroqueue[dashboard]'") from None
    stop = _stop_on_signals()
    # The bound address itself is a name it is reached by (a wildcard is not).
    bound = () if is_wildcard(host) else (host,)
    try:
        app = create_app(obj.backend(), read_only=read_only, trusted_hosts=(*bound, *trusted_hosts))
    except StoreUnreachable as e:
        log = logging.getLogger("aeroqueue.dashboard")
        command_info(log.name)  # it says when the store answers
        later = Later(lambda _failures: obj.backend(), e, retry_s=connect_every, log=log,
                      meanwhile="answering every page with a 503")
        app = create_app(read_only=read_only, trusted_hosts=(*bound, *trusted_hosts), later=later)
    request_lines()  # werkzeug's, as JSON lines in a JSON log
    listener = _dashboard_socket(host, port)
    try:
        # werkzeug takes a duplicate of the descriptor: ours is closed either way.
        server = make_server(host, port, app, threaded=True, fd=listener.fileno(),
                             request_handler=None if sys.stderr.isatty() else _plain_log_handler())
    finally:
        listener.close()
    threading.Thread(target=server.serve_forever, name="dashboard", daemon=True).start()
    _say_serving("aeroqueue.dashboard", "dashboard on", f"http://{url_host(host)}:{server.port}/",
                 " (read-only)" if read_only else "")
    _serve_until(stop, server)


def _say_serving(logger: str, what: str, url: str, more: str = "") -> None:
    """Where it serves: a line on stderr, or in a JSON log an info line of `logger` (a
    text line among JSON lines is one a log pipeline cannot parse)."""
    if json_lines():
        command_info(logger)
        logging.getLogger(logger).info(f"{what} {url}{more}", extra={"event": "serving", "url": url})
    else:
        err_console.print(f"{what} {url}{more}", highlight=False)


def _plain_log_handler() -> type:
    """werkzeug's request handler, logging each request without the terminal colour
    codes werkzeug adds whatever stderr is: a log file or journal gets plain lines."""
    from werkzeug.serving import WSGIRequestHandler
    from werkzeug.urls import uri_to_iri

    class PlainLog(WSGIRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            try:
                line = f"{self.command} {uri_to_iri(self.path)} {self.request_version}"
            except AttributeError:  # a request line too bad to parse
                line = self.requestline
            self.log("info", '"%s" %s %s', line.translate(self._control_char_table), code, size)

    return PlainLog


def _dashboard_socket(host: str, port: int) -> socket.socket:
    """The dashboard's listening socket, bound here: werkzeug, binding it itself, answers
    a port in use or an address this host lacks with two lines of its own and an exit,
    naming neither the address nor the port, and no "error:" as the other commands say."""
    from werkzeug.serving import LISTEN_QUEUE, get_sockaddr, select_address_family

    family = select_address_family(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As werkzeug's server does: a dashboard restarted at once gets its port back.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(get_sockaddr(host, port, family))
        sock.listen(LISTEN_QUEUE)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {e.strerror or e}") from None
    return sock


def _stop_on_signals() -> Stop:
    """A stop SIGTERM/SIGINT ask for: installed before anything is served, so a signal
    that comes early still ends the command cleanly."""
    stop = Stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop.on_signal)
    return stop


def _serve_until(stop: Stop, server: Any) -> None:
    """Wait for the signal, then stop the server (it serves from its own thread)."""
    while not stop.wait(1.0):
        pass
    server.shutdown()
    server.server_close()
