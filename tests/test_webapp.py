"""examples/webapp.py over real HTTP: one job per request, completed within it,
under both session styles, on every backend (a real server with AEROQUEUE_TEST_URL)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from werkzeug.serving import make_server

from aeroqueue import keys
from aeroqueue.backends import Backend
from aeroqueue.errors import StoreNotFound
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import Session
from examples.webapp import build_response, create_app, service

pytestmark = pytest.mark.timeout(60)

N_JOBS = 8


@contextmanager
def serving(store_url: str, work: Callable[[Job], Any] = build_response) -> Iterator[tuple[str, str]]:
    """The app on 127.0.0.1 (a free port), in a thread; yields (base URL, shared session id)."""
    app = create_app(store_url, work=work)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="webapp", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", service(app).shared.get().id
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
        service(app).close()


def post(url: str) -> tuple[int, Any]:
    """POST with no body; (status, parsed JSON or None), 4xx/5xx included."""
    req = urllib.request.Request(url, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    return status, json.loads(body) if body else None


def job_records(backend: Backend, list_name: str, n: int) -> list[dict[str, Any]]:
    recs = backend.batch_get(keys.JOB_SET, [keys.job_name(list_name, t) for t in range(n)])
    assert all(r is not None for r in recs)
    return [r.bins for r in recs if r is not None]


def test_each_job_is_completed_once_through_both_session_styles(
    store_url: str, registered: Backend, lists: JobLists, list_name: str
) -> None:
    lists.load(list_name, [JobSpec(f"c{i}", {"name": f"customer {i}"}) for i in range(N_JOBS)], seal=True)

    with serving(store_url) as (base, shared_id):
        answers: dict[str, list[dict[str, Any]]] = {"shared": [], "request": []}
        for i in range(N_JOBS):
            style = ("shared", "request")[i % 2]
            status, body = post(f"{base}/lists/{list_name}/next?session={style}")
            assert status == 200, body
            answers[style].append(body)
        # Drained: both styles say so without an error.
        for style in ("shared", "request"):
            status, body = post(f"{base}/lists/{list_name}/next?session={style}")
            assert (status, body) == (204, None)

    served = [a for style in answers.values() for a in style]
    assert sorted(a["job"] for a in served) == sorted(f"c{i}" for i in range(N_JOBS))  # each job once
    records = {r["jid"]: r for r in job_records(registered, list_name, N_JOBS)}
    for a in served:
        rec = records[a["job"]]
        assert rec["token"] == a["token"]
        assert rec["state"] == "done"
        assert rec["att"] == 1  # claimed once: nothing was handed out twice
        assert rec["result"] == a["result"] == build_response(
            Job(list_name, a["token"], a["job"], {"name": f"customer {a['job'][1:]}"}, 1, "")
        )
    # Shared style: one session for the whole process; request style: one per request.
    assert {records[a["job"]]["by"] for a in answers["shared"]} == {shared_id}
    per_request = [records[a["job"]]["by"] for a in answers["request"]]
    assert len(set(per_request)) == len(per_request) and shared_id not in per_request

    st = lists.status(list_name)
    assert (st.done, st.dead, st.in_flight, st.retry_pending, st.reservable) == (N_JOBS, 0, 0, 0, 0)
    assert st.complete


@pytest.mark.parametrize("style", ["shared", "request"])
def test_a_lost_claim_answers_409_and_records_nothing(
    store_url: str, registered: Backend, lists: JobLists, list_name: str, style: str
) -> None:
    """While the request works, its claim goes to another session (what happens when
    its session expired and the reaper gave the job away): the completion is refused."""
    lists.load(list_name, [JobSpec("only", {"name": "Ada"})], seal=True)
    queue = Queue(registered)
    rival = Session.open(registered)
    taken: list[Job] = []

    def work_while_the_claim_is_taken(job: Job) -> Any:
        assert queue.release(job, "expired (test)") == "released"
        taken.extend(queue.reserve(list_name, rival, 1))
        return build_response(job)

    try:
        with serving(store_url, work_while_the_claim_is_taken) as (base, _):
            status, body = post(f"{base}/lists/{list_name}/next?session={style}")
            assert status == 409, body
            assert body["job"] == "only" and body["token"] == 0
            assert "claim was lost" in body["error"] and "not recorded" in body["error"]
            assert [j.jid for j in taken] == ["only"]

            queue.complete(taken[0], {"by": "rival"})
            assert post(f"{base}/lists/{list_name}/next?session={style}") == (204, None)
    finally:
        rival.close()

    (rec,) = job_records(registered, list_name, 1)
    assert (rec["state"], rec["by"], rec["result"]) == ("done", rival.id, {"by": "rival"})
    st = lists.status(list_name)
    assert (st.done, st.in_flight, st.complete) == (1, 0, True)


def test_errors_are_json(store_url: str, registered: Backend, lists: JobLists, list_name: str) -> None:
    lists.load(list_name, [JobSpec("bad", {"name": "Bob"})], max_attempts=1, seal=True)

    def failing(job: Job) -> Any:
        raise RuntimeError("the customer's upstream is down")

    with serving(store_url, failing) as (base, _):
        status, body = post(f"{base}/lists/{list_name}/next?session=sideways")
        assert status == 400 and "shared, request" in body["error"]
        status, body = post(f"{base}/lists/no-such-{list_name}/next")
        assert status == 404 and "no job list" in body["error"]
        status, body = post(f"{base}/lists/{list_name}/next")
        assert status == 500 and body["outcome"] == "dead" and "upstream is down" in body["error"]
    st = lists.status(list_name)
    assert (st.done, st.dead, st.complete) == (0, 1, True)


def test_a_store_path_with_a_typo_is_an_error_not_a_new_store(tmp_path, monkeypatch) -> None:
    """As the CLI, connect() and the dashboard: the app copied from here must not serve
    from a fresh empty file because AEROQUEUE_URL named a path that does not exist."""
    monkeypatch.delenv("AEROQUEUE_CREATE", raising=False)
    typo = tmp_path / "stroe.db"
    monkeypatch.setenv("AEROQUEUE_URL", f"embedded://{typo}")
    with pytest.raises(StoreNotFound):
        create_app()
    with pytest.raises(StoreNotFound):
        create_app(f"embedded://{typo}")
    assert not typo.exists()
