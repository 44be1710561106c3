"""The dashboard's Flask application: pages, and the operator's POST actions.

Pages: the lists with progress bars and counts, the live sessions with their
last heartbeat, the dead jobs of each list with their errors, and one job's
detail. While a node does not answer, the pages show what the others hold and
name what could not be read (data.PageReads): a partial page is a 200 with a
``#partial`` notice whose ``data-unread`` names the parts not read. An open page
whose refresh gets an error (a 503: nothing answered) keeps what it shows and says
since when, in ``#stale`` (dashboard.js). Actions (POST only, each form carrying a CSRF token checked by
Flask-WTF): pause or resume a list, kick one dead job, kick all dead jobs of a
list. ``read_only`` hides the buttons and refuses the POSTs (403).

Every asset ships in the package (templates/, static/); the Content Security
Policy allows nothing from elsewhere, and no inline script or style.
"""

from __future__ import annotations

import functools
import json
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast
from urllib.parse import urlsplit

from flask import Flask, abort, flash, redirect, render_template, request, url_for
from flask_compress import Compress
from flask_wtf.csrf import CSRFError, CSRFProtect
from werkzeug.wrappers import Response

from ..backends import Backend, open_backend
from ..backends.later import Later
from ..config import may_create
from ..errors import AeroqueueError, BackendError, ListNotFound, ListReplaced, StoreUnreachable
from ..hosts import TrustedHosts
from ..keys import INT64, InvalidName, check_list_name
from ..logs import visible
from .data import PageReads, Store, clip, format_ms, now_ms, tail

ENV_SECRET = "AEROQUEUE_DASHBOARD_SECRET"
REFRESH_S = 5.0  # the pages re-read the store this often (dashboard.js); 0: never

CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"


def create_app(
    store: Backend | str | None = None, *, read_only: bool = False, secret_key: str | None = None,
    refresh_s: float = REFRESH_S, trusted_hosts: Iterable[str] = (), later: Later[Backend] | None = None,
) -> Flask:
    """The dashboard app on a backend (or a store URL; default: AEROQUEUE_URL).

    `later` (the command's, when the store did not answer at its start): the
    backend once it answers; until then every page is a 503 naming the last error.

    `secret_key` signs the session cookie that holds the CSRF token; by default
    it is read from AEROQUEUE_DASHBOARD_SECRET, else made up for this process
    (set it when several processes serve the dashboard behind one address).

    Requests must name the dashboard by a loopback name, one of `trusted_hosts`
    (the names a proxy in front of it is reached by) or the address they came in
    at (when the WSGI server tells it) in their Host header; any other gets 400:
    a page of another site whose name resolves to the dashboard's address (DNS
    rebinding) could otherwise read its CSRF token and post actions (aeroqueue.hosts)."""
    # A store named by URL must exist, as for the CLI (config.may_create): a typo in
    # AEROQUEUE_URL is an error, not a dashboard of a new empty store.
    connected: Store | None = None
    if later is None:
        backend = store if isinstance(store, Backend) else open_backend(store, create=may_create(store))
        connected = Store(backend)
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or os.environ.get(ENV_SECRET) or secrets.token_hex(32),
        SESSION_COOKIE_HTTPONLY=True,
        # Lax, not Strict: a link from another site (a runbook, a chat) came without the
        # cookie, so the view made a new session and token, and every open tab's buttons
        # failed ("CSRF tokens do not match"). Posts from other sites still come without it.
        SESSION_COOKIE_SAMESITE="Lax",
        WTF_CSRF_TIME_LIMIT=None,  # valid for the life of the page's session cookie
        AEROQUEUE_READ_ONLY=read_only,
    )
    CSRFProtect(app)
    # Compressed when the client accepts it (gzip, br, zstd): the overview of hundreds
    # of lists is some hundreds of kB, fetched again every `refresh_s`. The overview
    # only, not every page: a compressed page that holds a secret (the forms' CSRF
    # token) and reflects a request's text (a list page's ?id= in its search box)
    # gives the secret away by its size, request after request (BREACH); the
    # overview reflects nothing of a request.
    app.config.update(COMPRESS_REGISTER=False)
    compress = Compress(app)
    trusted = TrustedHosts(trusted_hosts)

    @app.before_request
    def _trusted_host() -> None:
        host = request.headers.get("Host", "")
        if not trusted.allows(host, _local_address(request.environ)):
            abort(400, trusted.refusal(host, "this dashboard"))

    made = threading.Lock()

    def store_now() -> Store:
        nonlocal connected
        if connected is None:
            assert later is not None
            backend = later.value
            if backend is None:
                # A 503 (`_store_error`) that says why: a new error each time (one raised
                # again and again would keep every request's frames in its traceback).
                err = later.error
                fresh = (StoreUnreachable if isinstance(err, StoreUnreachable) else BackendError)(
                    str(err) if isinstance(err, AeroqueueError) else f"{type(err).__name__}: {err}")
                fresh.hint = getattr(err, "hint", None)
                raise fresh
            with made:
                if connected is None:
                    connected = app.extensions["aeroqueue"] = Store(backend)
        return connected

    # The pages' reads, on the store once it answers (`store_now`).
    data = cast(Store, _Deferred(store_now))
    app.extensions["aeroqueue"] = connected

    @app.context_processor
    def _globals() -> dict[str, Any]:
        return {"read_only": read_only, "now_ms": now_ms(), "refresh_s": refresh_s}

    # Every value a page shows, its controls and bidirectional marks as escapes
    # (`visible`): a job id or error with U+202E showed "gpj.exe" as "exe.jpg". Markup (a
    # macro's output, made of values shown so already) is left alone.
    app.jinja_env.finalize = _visible
    app.add_template_filter(format_ms, "time")
    app.add_template_filter(_percent, "percent")
    app.add_template_filter(_pretty, "pretty")
    app.add_template_filter(clip, "clip")
    app.add_template_filter(tail, "tail")

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers["Content-Security-Policy"] = CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["X-Frame-Options"] = "DENY"
        resp.headers["Referrer-Policy"] = "same-origin"
        if request.method == "GET" and not request.path.startswith("/static/"):
            resp.headers["Cache-Control"] = "no-store"  # live counts
        return resp

    @app.errorhandler(CSRFError)
    def _csrf_error(e: CSRFError) -> tuple[str, int]:
        return render_template("error.html", title="Refused", message=f"{e.description} Reload the page and try again."), 400

    @app.errorhandler(ListNotFound)
    @app.errorhandler(InvalidName)
    def _not_found(e: AeroqueueError) -> tuple[str, int]:
        return render_template("error.html", title="Not found", message=str(e)), 404

    @app.errorhandler(AeroqueueError)
    def _store_error(e: AeroqueueError) -> tuple[str, int]:
        # The page without the addresses the error names (the store's URL, a node's
        # host:port), the log with them (`Later` has said why already, once, while
        # not connected): the page goes to whoever reaches the dashboard, which asks
        # for no login, and what it tells of the store's network is no one's to see
        # there. The operator who can act on an address reads the log.
        if connected is not None:
            app.logger.warning("store error: %s", e, extra={"event": "store_error", "error": str(e)})
        message, hidden = without_addresses(str(e) + (f" ({e.hint})" if e.hint else ""))
        return render_template("error.html", title="Store error", message=message,
                               note=HIDDEN_NOTE if hidden else None, reload_when_up=request.method == "GET"), 503

    # -- pages -------------------------------------------------------------------

    @app.get("/")
    @compress.compressed()
    def index() -> str:
        # A node that does not answer costs the page what it holds, named on it, not
        # the page: an operator opens it exactly then. Nothing answered: 503.
        view = data.overview()
        if view.error is not None and not view.answered:
            raise view.error
        return render_template("index.html", view=view, lists=view.lists, sessions=view.sessions, dead=view.dead)

    @app.get("/lists/<name>")
    def list_page(name: str) -> str:
        row = data.list_row(name)  # the page's subject: if it does not answer, 503
        reads = PageReads(data.backend)
        # A page of the dead jobs at a time, past the token `after` (the "next" link's).
        dead = reads.read("dead jobs", functools.partial(data.dead_jobs, name, after=_after()))
        return render_template("list.html", row=row, dead=dead, searched=request.args.get("id", "")[:FIND_ID_SHOWN])

    @app.get("/lists/<name>/jobs/<int:token>")
    def job_page(name: str, token: int) -> str:
        job = data.job(name, token)
        if job is None:
            abort(404, f"list {name!r} has no job {token}")
        return render_template("job.html", job=job, fields=sorted(job.bins.items()))

    @app.get("/lists/<name>/find")
    def find_job(name: str) -> Response:
        # Ids loaded from JSON Lines or Python keep their blanks: the id as typed first,
        # then without the blanks a paste may have brought along.
        check_list_name(name)  # before anything of it is shown: a name is no text of a notice either
        jid = request.args.get("id", "")
        token = data.token_of(name, jid) if jid.strip() else None
        if token is None and jid.strip() and jid.strip() != jid:
            token = data.token_of(name, jid.strip())
        if token is None:
            # The id stays in the search box, not in the notice: any site can send an
            # operator here, and a text of its choosing read as the dashboard's own message.
            flash(f"list {name!r} has no job with the id searched for", "error")
            return redirect(url_for("list_page", name=name, id=jid[:FIND_ID_SHOWN]))
        return redirect(url_for("job_page", name=name, token=token))

    @app.errorhandler(404)
    def _404(e: Any) -> tuple[str, int]:
        return render_template("error.html", title="Not found", message=getattr(e, "description", "")), 404

    # -- actions -----------------------------------------------------------------

    def writable() -> None:
        if read_only:
            abort(403, "this dashboard is read-only")

    # The forms carry the list's stamp as the page showed it (`c`): a page shown before
    # the list was dropped and loaded again under its name would otherwise kick the new
    # list's jobs at the tokens it showed, or pause the new list.
    def set_paused(name: str, paused: bool) -> Response:
        writable()
        try:
            data.pause(name, paused, shown_stamp())
        except ListReplaced:
            flash(replaced(name, f"it was not {'paused' if paused else 'resumed'}"), "error")
        else:
            flash(f"list {name} paused: workers take nothing more from it" if paused else f"list {name} resumed", "ok")
        return back(url_for("list_page", name=name))

    @app.post("/lists/<name>/pause")
    def pause(name: str) -> Response:
        return set_paused(name, True)

    @app.post("/lists/<name>/resume")
    def resume(name: str) -> Response:
        return set_paused(name, False)

    @app.post("/lists/<name>/kick")
    def kick_all(name: str) -> Response:
        writable()
        try:
            n = data.kick_all(name, shown_stamp())
        except ListReplaced:
            flash(replaced(name, "nothing was kicked"), "error")
        else:
            flash(f"{n} dead job(s) of {name} put back in the queue", "ok")
        return back(url_for("list_page", name=name))

    @app.post("/lists/<name>/jobs/<int:token>/kick")
    def kick_job(name: str, token: int) -> Response:
        writable()
        try:
            kicked = data.kick_job(name, token, shown_stamp())
        except ListReplaced:
            flash(replaced(name, "nothing was kicked"), "error")
        else:
            if kicked:
                flash(f"job {name}/{token} kicked: queued again with fresh attempts", "ok")
            else:
                flash(f"job {name}/{token} is not dead: left as it is", "error")
        return redirect(url_for("job_page", name=name, token=token))

    @app.errorhandler(400)
    @app.errorhandler(403)
    def _refused(e: Any) -> tuple[str, int]:
        return render_template("error.html", title="Refused", message=getattr(e, "description", "")), e.code

    return app


# An address in an error's text: a URL (the store's; an embedded store's is a path),
# an IPv4 address or a bracketed IPv6 one, with a port or not, a host:port. Too much
# rather than too little: a list name with ':' and digits in a key goes too.
_ADDRESS = re.compile(
    r"[A-Za-z][A-Za-z0-9+.-]*://\S*"
    r"|\[[0-9A-Za-z:.%]+\](?::\d+)?"
    r"|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"
    r"|\b[A-Za-z0-9][A-Za-z0-9_.-]*:\d{1,5}\b"
)
HIDDEN = "[address]"
HIDDEN_NOTE = "The addresses of the store and its nodes are not shown here: the dashboard's log has them."


def without_addresses(text: str) -> tuple[str, bool]:
    """`text` with every address in it (`_ADDRESS`) as "[address]", and whether one was."""
    out, n = _ADDRESS.subn(HIDDEN, text)
    return out, n > 0


def _local_address(environ: dict[str, Any]) -> str | None:
    """The server's address of the request's connection, where Werkzeug's server (the
    `dashboard` command's) hands over the socket; other WSGI servers do not say."""
    sock = environ.get("werkzeug.socket")
    try:
        return str(sock.getsockname()[0]) if sock is not None else None
    except (OSError, AttributeError, IndexError, TypeError):
        return None


# A list stamp (`created`, server ms) as a form carries it: an integer within 64 bits
# (19 digits), which the store's records hold.
_STAMP = re.compile(r"-?[0-9]{1,19}")
FIND_ID_SHOWN = 200  # characters of a searched-for id put back in the search box


def _after() -> int | None:
    """The token a list page's dead jobs start past (`?after=`), None for the first
    page: also for a value that is no token (the page a link of another site asks
    for is the first, not an error)."""
    text = request.args.get("after", "")
    return int(text) if re.fullmatch(r"[0-9]{1,19}", text) and int(text) <= INT64[1] else None


def shown_stamp() -> int | None:
    """The list stamp a form carries (`c`), None without one (a form of a page served
    before forms carried it); one that is not an integer is refused (400)."""
    text = request.form.get("c", "")
    if not text:
        return None
    if not _STAMP.fullmatch(text) or not INT64[0] <= int(text) <= INT64[1]:  # 19 digits may pass 64 bits
        abort(400, "the form's list stamp (c) is not an integer")
    return int(text)


def replaced(name: str, outcome: str) -> str:
    """What an action from a page older than the list of its name says, `outcome`
    saying what it left undone."""
    return f"list {name} was dropped and loaded again since the page was shown: {outcome}"


def back(default: str) -> Response:
    """Redirect to the form's `next` (a path on this site only), else `default`."""
    target = request.form.get("next", "")
    parts = urlsplit(target)
    # urlsplit drops tabs and newlines, the Location header refuses them (a 500 after
    # the action was done): such a target is no path of this site's pages.
    if not target.startswith("/") or target.startswith(("//", "/\\")) or parts.scheme or parts.netloc \
            or not target.isprintable():
        target = default
    return redirect(target)


class _Deferred:
    """Attributes of what `get()` answers when asked: a `Store` made once the store
    answers, or the error that says why not yet."""

    def __init__(self, get: Callable[[], Any]) -> None:
        self._get = get

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)


def _visible(value: Any) -> Any:
    if type(value) is str:  # not Markup, a str subclass
        return visible(value, keep="\n\t")
    return value


def _percent(share: float) -> str:
    return f"{share * 100:.1f}"


def _pretty(value: Any) -> str:
    """A bin's value as indented JSON (bytes as hex); the template escapes it."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=_bytes_hex)


def _bytes_hex(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return repr(value)
