"""The API-handler path: a Flask app that reserves ONE job per customer request
and completes it within the request.

    POST /lists/<name>/next?session=shared    reserve, work, complete: 200 {"job", "token", "result"}
    POST /lists/<name>/next?session=request   the same, under a session of its own
    GET  /lists/<name>                        the list's counts
    GET  /healthz                             200 while the process's shared session is alive

Answers: 204 when the list has nothing to give (empty, drained or paused);
404 for an unknown list; 409 when the claim was lost before the completion
(the job went to another session: this request's result is not recorded);
500 when the work raised (the job is failed: retried, or dead after the
list's max attempts); 503 when the store is unavailable or overloaded.

Two session styles, both correct; pick one per deployment:

- shared (the default): one heartbeat session per process, opened when the
  app starts and closed at exit. A request costs the reservation and the
  completion only; the process costs one heartbeat write per interval.
  A process that dies leaves its claims to the reaper (after the expiry).
- request: a session opened and closed around each request. No background
  thread outlives the request and nothing is left behind, at the price of
  three more round trips per request (open, find what is held, delete).

Run it::

    AEROQUEUE_URL=aerospike://127.0.0.1:3000/test flask --app examples.webapp run --port 8000
    gunicorn -w 4 --threads 8 'examples.webapp:create_app()'    # one shared session per worker process

The store URL comes from ``AEROQUEUE_URL`` (the embedded store when unset).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, jsonify, request
from flask.typing import ResponseReturnValue

from aeroqueue import connect
from aeroqueue.backends import Backend
from aeroqueue.errors import AeroqueueError, BackendError, ListNotFound, SessionLost
from aeroqueue.keys import InvalidName, check_list_name
from aeroqueue.lists import JobLists
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import DEFAULT_EXPIRY_S, DEFAULT_INTERVAL_S, Session
from aeroqueue.worker import process_one

log = logging.getLogger("aeroqueue.examples.webapp")

Work = Callable[[Job], Any]
STYLES = ("shared", "request")
EXTENSION = "aeroqueue"


def build_response(job: Job) -> dict[str, Any]:
    """The example's work: the customer's response, built from the job's payload."""
    payload = job.payload if isinstance(job.payload, dict) else {"value": job.payload}
    name = payload.get("name") or "customer"
    return {"message": f"Hello, {name}!", "payload": payload, "attempt": job.attempt}


class SharedSession:
    """One heartbeat session per process, shared by every request thread."""

    def __init__(self, backend: Backend, *, interval_s: float, expiry_s: float) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self.expiry_s = expiry_s
        self._lock = threading.Lock()
        self._session: Session | None = None
        self._pid = 0

    def get(self) -> Session:
        """The live session, opening a new one when there is none, it was lost, or the
        process forked (a forked child does not inherit the heartbeat thread, so the
        parent's session would expire under the child's claims)."""
        with self._lock:
            current = self._session
            ours = current is not None and self._pid == os.getpid()
            if current is not None and ours and not current.lost and not current.closed:
                return current
            if current is not None and ours and current.lost:
                # Its claims are the reaper's to give back now: release nothing.
                current.close(release=False)
            self._session = Session.open(self.backend, interval_s=self.interval_s, expiry_s=self.expiry_s)
            self._pid = os.getpid()
            log.info("shared session opened", extra={"event": "session_opened", "session": self._session.id})
            return self._session

    def close(self) -> None:
        """Give back whatever is still held and delete the session (this process's only)."""
        with self._lock:
            if self._session is not None and self._pid == os.getpid():
                self._session.close()
            self._session = None


class QueueService:
    """What the routes share: the store, the queue, the shared session and the work."""

    def __init__(self, backend: Backend, work: Work, *, interval_s: float, expiry_s: float) -> None:
        self.backend = backend
        self.queue = Queue(backend)
        self.lists = JobLists(backend)
        self.work = work
        self.interval_s = interval_s
        self.expiry_s = expiry_s
        self.shared = SharedSession(backend, interval_s=interval_s, expiry_s=expiry_s)
        self._closed = False

    def next_shared(self, list_name: str) -> ResponseReturnValue:
        try:
            return self.next_job(list_name, self.shared.get())
        except SessionLost:
            # Refused before anything was reserved (the heartbeat found the session
            # gone): a fresh session can safely take the request.
            return self.next_job(list_name, self.shared.get())

    def next_per_request(self, list_name: str) -> ResponseReturnValue:
        with Session.open(self.backend, interval_s=self.interval_s, expiry_s=self.expiry_s) as session:
            return self.next_job(list_name, session)

    def next_job(self, list_name: str, session: Session) -> ResponseReturnValue:
        """Reserve one job, do the work, acknowledge it: all within this request."""
        seen: dict[str, Any] = {}

        def handler(job: Job) -> Any:
            seen["job"] = job
            try:
                seen["result"] = self.work(job)
            except Exception as e:
                seen["error"] = f"{type(e).__name__}: {e}"
                raise
            return seen["result"]

        try:
            # process_one is the library's own step: the same acknowledgement rules
            # as the workers (fail on an exception, refuse to ack for a lost session).
            outcome = process_one(self.queue, list_name, session, handler)
        except Exception:
            if "job" in seen:
                self._give_back(seen["job"])
            raise
        if outcome is None:
            return Response(status=204)
        job: Job = seen["job"]
        if outcome == "done":
            return jsonify(job=job.jid, token=job.token, result=seen["result"])
        if outcome in ("lost", "unacked"):
            why = (
                "the claim was lost before the job was completed (the session expired or was reaped, "
                "and the job went to another session)"
                if outcome == "lost"
                else "the session was lost while the job was worked on, so the job was not acknowledged"
            )
            return _error(409, f"job {job.jid!r} (token {job.token}) of list {list_name!r}: {why}; "
                               "the result was not recorded", job=job.jid, token=job.token)
        return _error(500, f"job {job.jid!r} (token {job.token}) failed: {seen.get('error', 'unknown error')}",
                      job=job.jid, token=job.token, outcome=outcome)

    def _give_back(self, job: Job) -> None:
        # The store failed mid-request: a job claimed under the shared session would
        # otherwise stay claimed as long as the process lives (the session is alive,
        # so neither the reaper nor the sweeper takes it back). Release only acts on
        # a claim still held, so a completion that did land is left alone.
        try:
            self.queue.release(job, "request failed")
        except AeroqueueError as e:
            log.warning("could not give back a job after a failed request",
                        extra={"event": "release_failed", "list": job.list, "token": job.token, "error": str(e)})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self.shared.close()
        finally:
            self.backend.close()


def _error(status: int, message: str, **extra: Any) -> tuple[Response, int]:
    return jsonify(error=message, **extra), status


def service(app: Flask) -> QueueService:
    """The app's `QueueService` (to close it, or reach its shared session)."""
    svc: QueueService = app.extensions[EXTENSION]
    return svc


def create_app(
    url: str | None = None,
    *,
    work: Work = build_response,
    interval_s: float = DEFAULT_INTERVAL_S,
    expiry_s: float = DEFAULT_EXPIRY_S,
) -> Flask:
    """The app, with its shared session already open (so a bad store URL or missing
    UDF modules stop it at start, not at the first customer request).

    `url` defaults to ``AEROQUEUE_URL``; `work` turns a reserved job into the
    response's result. The shared session is closed at interpreter exit, or by
    ``service(app).close()``.
    """
    # connect(), not open_backend(): an embedded store named by a URL with a typo in
    # its path is an error here too, not a new empty store the app serves from.
    backend = connect(url)
    try:
        svc = QueueService(backend, work, interval_s=interval_s, expiry_s=expiry_s)
        svc.shared.get()
    except BaseException:
        backend.close()
        raise
    atexit.register(svc.close)

    app = Flask(__name__)
    app.extensions[EXTENSION] = svc

    @app.post("/lists/<name>/next")
    def next_job(name: str) -> ResponseReturnValue:
        style = request.args.get("session", "shared")
        if style not in STYLES:
            return _error(400, f"session must be one of {', '.join(STYLES)}, not {style!r}")
        check_list_name(name)
        return svc.next_shared(name) if style == "shared" else svc.next_per_request(name)

    @app.get("/lists/<name>")
    def list_status(name: str) -> ResponseReturnValue:
        return jsonify(svc.lists.status(check_list_name(name)).as_dict())

    @app.get("/healthz")
    def healthz() -> ResponseReturnValue:
        return jsonify(session=svc.shared.get().id)

    @app.errorhandler(InvalidName)
    def invalid_name(e: InvalidName) -> ResponseReturnValue:
        return _error(400, str(e))

    @app.errorhandler(ListNotFound)
    def list_not_found(e: ListNotFound) -> ResponseReturnValue:
        return _error(404, str(e))

    @app.errorhandler(BackendError)
    @app.errorhandler(SessionLost)
    def unavailable(e: AeroqueueError) -> ResponseReturnValue:
        # Busy hot key, timeout, store down: worth retrying shortly, so say so.
        log.warning("store unavailable", extra={"event": "unavailable", "error": str(e)})
        body, status = _error(503, str(e))
        return body, status, {"Retry-After": "1"}

    @app.errorhandler(AeroqueueError)
    def failed(e: AeroqueueError) -> ResponseReturnValue:
        log.error("request failed", extra={"event": "request_failed", "error": str(e)})
        return _error(500, str(e))

    return app


def main() -> None:
    """``python -m examples.webapp``: the development server on HOST:PORT (127.0.0.1:8000)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # SIGTERM (docker stop, systemd) would end the process without running atexit:
    # turn it into an ordinary exit so the shared session is closed, not left to expire.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = create_app()
    app.run(host=os.environ.get("HOST", "127.0.0.1"), port=int(os.environ.get("PORT", "8000")), threaded=True)


if __name__ == "__main__":
    main()
