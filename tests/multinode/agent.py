"""What multi-node tests run inside a cluster's namespace; each command prints JSON.

    python -m tests.multinode.agent audit URL LIST N     every job record and the list's status
    python -m tests.multinode.agent web URL LIST K       K requests through examples.webapp
    python -m tests.multinode.agent load URL LIST N [LEASE_MS]  load N jobs; the report, or the error
    python -m tests.multinode.agent nodes URL            the nodes the client sees
    python -m tests.multinode.agent frozen-write URL PID N SIGSTOP asd PID, write until a timeout
    python -m tests.multinode.agent work URL LIST K      reserve K jobs and complete them
    python -m tests.multinode.agent gone URL LIST N      how a dropped list looks, and what of it is left
    python -m tests.multinode.agent http [stop=PID] URL[|HOST] ...
                                                         GET the URLs (Host: HOST) at once when served, with the asd
                                                         PID stopped meanwhile if given: status, body, seconds each
    python -m tests.multinode.agent frozen-view URL PID LISTS URL...
                                                         open sessions (left open); SIGSTOP asd PID; GET the URLs
                                                         at once, then each again; which of LISTS (comma-separated)
                                                         and of the sessions a client can read; SIGCONT
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aerospike_helpers import expressions as exp

from aeroqueue import keys
from aeroqueue.backends import open_backend
from aeroqueue.errors import AeroqueueError, ListNotFound
from aeroqueue.lists import JobLists
from aeroqueue.queue import Queue


def audit(url: str, name: str, n: int) -> dict[str, Any]:
    """Every token's job record (void ones included), and the list's status."""
    backend = open_backend(url)
    head = backend.get(keys.LIST_SET, name)
    alloc = max(n, head.bins["alloc"] if head is not None else 0)
    names = [keys.job_name(name, t) for t in range(alloc)]
    jobs = []
    for lo in range(0, alloc, 1000):
        for rec in backend.batch_get(keys.JOB_SET, names[lo : lo + 1000]):
            jobs.append(None if rec is None else {k: rec.bins.get(k) for k in ("token", "jid", "state", "by", "sess", "rid", "att", "result")})
    return {"status": JobLists(backend).status(name).as_dict(), "jobs": jobs}


def web(url: str, name: str, k: int) -> dict[str, Any]:
    from examples.webapp import create_app, service

    app = create_app(url)
    answers = []
    with app.test_client() as client:
        for i in range(k):
            style = ("request", "shared")[i % 2]
            resp = client.post(f"/lists/{name}/next?session={style}")
            answers.append({"status": resp.status_code, "body": resp.get_json(silent=True)})
    service(app).close()
    return {"answers": answers}


def load(url: str, name: str, n: int, lease_ms: int = 120_000, marker: str | None = None) -> dict[str, Any]:
    """Load n jobs; with `marker`, that file is made once the first range has landed
    (a test waits for it to kill a node in the middle of the load, not before it)."""
    def landed(_: int) -> None:
        if marker is not None:
            Path(marker).touch()

    try:
        jobs = [(f"j{i}", {"i": i}) for i in range(n)]
        report = JobLists(open_backend(url)).load(name, jobs, seal=True, lease_ms=lease_ms, progress=landed)
    except AeroqueueError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    return {"loaded": report.loaded, "skipped": report.skipped, "voided": report.voided}


def nodes(url: str) -> dict[str, Any]:
    return {"nodes": sorted(n["node_name"] for n in open_backend(url).client.get_node_names())}


def frozen_write(url: str, pid: int, n: int) -> dict[str, Any]:
    """Connect, SIGSTOP the asd `pid`, write n keys until one times out on it (a write
    goes to the master only; a read would be retried on the replica); the error's text."""
    import os
    import signal

    from aeroqueue.backends import retry_in_doubt

    backend = open_backend(url)
    for i in range(n):  # connections made, partition map known
        # On a busy machine a warm-up write may outlast the URL's short timeout: that is
        # not what is tested, so it is repeated (a put is idempotent).
        retry_in_doubt(lambda i=i: backend.put("aq_probe", f"k{i}", {"v": 0}), deadline_s=20)
    os.kill(pid, signal.SIGSTOP)
    try:
        for i in range(n):
            try:
                backend.put("aq_probe", f"k{i}", {"v": 1})
            except AeroqueueError as e:
                return {"error": str(e), "type": type(e).__name__}
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"error": None}


def work(url: str, name: str, k: int) -> dict[str, Any]:
    """Reserve k jobs and complete them (their done bits written before it answers)."""
    from aeroqueue import transitions
    from aeroqueue.sessions import Session

    backend = open_backend(url)
    queue = Queue(backend)
    with Session.open(backend) as session:
        jobs = queue.reserve(name, session, count=k)
        lost = queue.complete_many(jobs)
    transitions.flush_bits(backend)
    return {"done": len(jobs) - len(lost)}


def gone(url: str, name: str, n: int) -> dict[str, Any]:
    """What a client sees of a dropped list (status, header, the list of names, a
    reservation), and what of its N jobs' records is still in the store."""
    backend = open_backend(url)
    lists = JobLists(backend)
    out: dict[str, Any] = {}
    for what, call in (("status", lambda: lists.status(name).as_dict()), ("header", lambda: lists.header(name))):
        try:
            out[what] = call()
        except ListNotFound:
            out[what] = "ListNotFound"
    out["listed"] = name in lists.names()
    try:
        out["reserved"] = [job.jid for job in Queue(backend).reserve(name, "probe", count=10)]
    except ListNotFound:
        out["reserved"] = "ListNotFound"
    names = [keys.job_name(name, t) for t in range(n)]
    out["job_records"] = sum(rec is not None for rec in backend.batch_get(keys.JOB_SET, names))
    only = exp.Eq(exp.StrBin("l"), name).compile()
    out["index_entries"] = sum(1 for _ in backend.scan(keys.JIDX_SET, expression=only, bins=["l"]))
    out["bitmaps"] = sum(rec is not None for rec in backend.batch_get(keys.DONE_SET, [keys.chunk_name(name, 0)]))
    return out


def http(specs: list[str]) -> dict[str, Any]:
    """GET each of `specs` ('URL' or 'URL|HOST', HOST sent as the Host header), each
    retried while nothing listens yet (a server starting), and how long each answer
    took; all at once, each in a thread of its own. With a first spec 'stop=PID', the
    asd PID is stopped (SIGSTOP) for the requests, and resumed after them whatever happens."""
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor

    stopped = int(specs.pop(0).removeprefix("stop=")) if specs and specs[0].startswith("stop=") else None
    if stopped is not None:
        os.kill(stopped, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(max(1, len(specs))) as pool:
            return {"answers": list(pool.map(lambda spec: _get(*spec.split("|", 1)), specs))}
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)


# Sessions on 3 nodes: some on the frozen one, and some not but for 1 run in 20,000.
FROZEN_VIEW_SESSIONS = 9


def frozen_view(url: str, pid: int, names: list[str], specs: list[str]) -> dict[str, Any]:
    """With the asd `pid` stopped: GET each of `specs` at once (their first views of
    the frozen node), then again (the views after), and read each list's status as a
    client can (within `Backend.bounded_reads`): the lists whose records the frozen
    node does not hold; the same of FROZEN_VIEW_SESSIONS sessions opened before the
    freeze, and left open (no heartbeat) for the pages after. The asd is resumed
    after, whatever happens."""
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from aeroqueue.sessions import Session

    backend = open_backend(url)  # connected, partition map known, before the freeze
    lists = JobLists(backend)
    for name in names:
        lists.status(name)
    sessions = [Session.open(backend, heartbeat=False).id for _ in range(FROZEN_VIEW_SESSIONS)]

    def answers(read: Callable[[], object]) -> bool:
        try:
            with backend.bounded_reads():
                read()
        except AeroqueueError:
            return False
        return True

    def readable(pool: ThreadPoolExecutor) -> tuple[list[str], list[str]]:
        # Every read at once: one after the other, the frozen node's each waited out
        # the 1 s limit (some 9 s for all), and the views after waited for them.
        lists_read = pool.map(lambda name: answers(lambda: lists.status(name)), names)
        sessions_read = pool.map(lambda sid: answers(lambda: backend.get(keys.SESS_SET, sid)), sessions)
        return ([n for n, ok in zip(names, lists_read, strict=True) if ok],
                [s for s, ok in zip(sessions, sessions_read, strict=True) if ok])

    os.kill(pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(len(specs) + 1) as pool, ThreadPoolExecutor(len(names) + len(sessions)) as probes:
            # Read while the first views are served, the same moments of the freeze; the
            # views after come at once, for the healthy nodes answer for some 10 s only:
            # with min-cluster-size 3 they then turn orphan and refuse every read
            # (ClusterChanging), as a CI run saw, its views after some 11 s into the freeze.
            reads = pool.submit(readable, probes)
            first = list(pool.map(_get, specs))
            again = list(pool.map(_get, specs))
            readable_lists, readable_sessions = reads.result()
            after, _ = readable(probes)  # for a failure's message: did the healthy nodes still answer?
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"first": first, "again": again, "readable": readable_lists, "sessions": sessions,
            "readable_sessions": readable_sessions, "readable_after": after}



def _get(url: str, host: str | None = None, wait_s: float = 60.0) -> dict[str, Any]:
    import http.client
    import time
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    give_up = time.monotonic() + wait_s
    while True:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=120)
        try:
            conn.connect()
        except ConnectionRefusedError:
            conn.close()
            if time.monotonic() > give_up:
                raise
            time.sleep(0.05)
            continue
        break
    try:
        started = time.monotonic()
        conn.putrequest("GET", parts.path or "/", skip_host=True)
        conn.putheader("Host", host or parts.netloc)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
        return {"status": resp.status, "seconds": time.monotonic() - started, "body": body}
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    cmd, *args = argv
    if cmd == "audit":
        out = audit(args[0], args[1], int(args[2]))
    elif cmd == "web":
        out = web(args[0], args[1], int(args[2]))
    elif cmd == "load":
        out = load(args[0], args[1], int(args[2]), *(int(a) for a in args[3:4]), *args[4:5])
    elif cmd == "frozen-write":
        out = frozen_write(args[0], int(args[1]), int(args[2]))
    elif cmd == "work":
        out = work(args[0], args[1], int(args[2]))
    elif cmd == "gone":
        out = gone(args[0], args[1], int(args[2]))
    elif cmd == "nodes":
        out = nodes(args[0])
    elif cmd == "http":
        out = http(args)
    elif cmd == "frozen-view":
        out = frozen_view(args[0], int(args[1]), args[2].split(","), args[3:])
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
