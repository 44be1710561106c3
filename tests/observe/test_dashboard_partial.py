"""The dashboard while part of the store does not answer (a frozen node of several:
its records time out, and every scan, which needs every node, with them), on
every backend: the overview still answers 200, shows what answered with the
right counts, and names what it could not read; a store of which nothing answers
is still a 503. The failures are injected where the store's reads raise them
(tests/multinode/test_dashboard_frozen.py freezes a real node)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask

from aeroqueue import keys
from aeroqueue.backends import Backend
from aeroqueue.backends.base import BOUNDED_SCAN_MS
from aeroqueue.dashboard import create_app
from aeroqueue.dashboard import data as dashboard_data
from aeroqueue.errors import BackendTimeout
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from tests.observe.test_metrics import ReadSpy

pytestmark = pytest.mark.timeout(60)


def timed_out(what: str) -> BackendTimeout:
    return BackendTimeout(f"{what} failed: timeout (Aerospike code 9)", operation="get", key=what)


class Frozen:
    """What a frozen node does to the store's reads, for the records it holds: the
    lists in `lists` (their header; None: every record) and the sessions in
    `sessions`, the scans (all of them), the index queries (with `queries`: each,
    the query of every session's claims too; or, if it is a set, those of the
    sessions in it, one by one, without the claims index)."""

    def __init__(
        self, backend: Backend, monkeypatch: pytest.MonkeyPatch, lists: set[str] | None,
        sessions: set[str] = frozenset(), queries: bool | set[str] = True,
    ) -> None:
        self.lists = lists
        self.sessions = sessions
        self.queries = queries
        self.scans: list[str] = []
        self.statuses: list[str] = []  # the lists read while on, in order
        self.on = False
        real_status, real_scan, real_scan_answered, real_find, real_find_between = (
            JobLists.status, backend.scan, backend.scan_answered, backend.find, backend.find_between)

        def status(jl: JobLists, name: str, *args: Any, **kw: Any) -> Any:
            if self.on:
                self.statuses.append(name)
            if self.on and (self.lists is None or name in self.lists):
                raise timed_out(f"read of aq_list/{name}")
            return real_status(jl, name, *args, **kw)

        def scan(set_name: str, **kw: Any) -> Any:
            if self.on:
                self.scans.append(set_name)
                raise timed_out(f"scan on {set_name}")
            return real_scan(set_name, **kw)

        def scan_answered(set_name: str, **kw: Any) -> Any:
            recs, error = real_scan_answered(set_name, **kw)
            if not self.on:
                return recs, error
            self.scans.append(set_name)
            # The other nodes hand over their records; the frozen one's never come.
            held = [] if self.lists is None else [(n, r) for n, r in recs if n not in self.lists | self.sessions]
            return held, timed_out(f"scan on {set_name}")

        def find(set_name: str, bin_name: str, value: str, **kw: Any) -> Any:
            if self.on and (self.queries is True or (isinstance(self.queries, set) and value in self.queries)):
                raise timed_out(f"query on {set_name} where {bin_name} = {value}")
            return real_find(set_name, bin_name, value, **kw)

        def find_between(set_name: str, bin_name: str, *args: Any, **kw: Any) -> Any:
            if self.on and self.queries is True:
                raise timed_out(f"query on {set_name} where {bin_name} in a range")
            return real_find_between(set_name, bin_name, *args, **kw)

        real_prefetch = JobLists.prefetch

        def prefetch(jl: JobLists, names: list[str]) -> Any:
            # One batch call for every list: a frozen node holding any of them fails it whole.
            if self.on and (self.lists is None or self.lists & set(names)):
                raise timed_out("batch read of aq_list")
            return real_prefetch(jl, names)

        monkeypatch.setattr(JobLists, "status", status)
        monkeypatch.setattr(JobLists, "prefetch", prefetch)
        monkeypatch.setattr(backend, "scan", scan)
        monkeypatch.setattr(backend, "scan_answered", scan_answered)
        monkeypatch.setattr(backend, "find", find)
        monkeypatch.setattr(backend, "find_between", find_between)


@pytest.fixture
def three_lists(registered: Backend, list_name: str) -> Iterator[tuple[list[str], Session]]:
    """Three lists: the first with 2 dead jobs of 4, the second with 3 queued jobs
    (its node will be frozen), the third with 5 jobs, 2 done; one live session."""
    names = [f"{list_name}-a", f"{list_name}-frozen", f"{list_name}-c"]
    lists, queue = JobLists(registered), Queue(registered)
    for name, n in zip(names, (4, 3, 5), strict=True):
        lists.load(name, [JobSpec(f"j{i}", {"i": i}) for i in range(n)], max_attempts=1, seal=True)
    session = Session.open(registered, heartbeat=False)
    for job in queue.reserve(names[0], session, 2):
        queue.fail(job, f"RuntimeError: job {job.token} broke")
    for job in queue.reserve(names[2], session, 2):
        queue.complete(job)
    yield names, session
    session.close()


@pytest.fixture
def app(registered: Backend) -> Flask:
    return create_app(registered, secret_key="test-secret")


def page_text(resp: Any) -> str:
    return html.unescape(resp.get_data(as_text=True))


def row_numbers(page: str, name: str) -> list[str] | None:
    """The counts of a list's row (total, queued, delayed, claimed, done, dead), or None if not shown read."""
    row = re.search(rf'<tr class="list-row" data-list="{re.escape(name)}">(.*?)</tr>', page, re.S)
    return re.findall(r'<td class="num[^"]*">([\d,]+)</td>', row.group(1)) if row else None


def unread(page: str) -> list[str]:
    found = re.search(r'id="partial"[^>]*data-unread="([^"]*)"', page)
    return found.group(1).split("; ") if found else []


CLAIMS = "claims of the sessions"  # the part that reads every session's claims (one query)


def unread_parts(page: str) -> set[str]:
    """The parts named not read, but the claims of sessions (one query for all, or,
    without the claims index, one a session: on a shared server those of the
    sessions other tests left are named too)."""
    return {part for part in unread(page) if part != CLAIMS and not part.startswith("claims of session ")}


def session_claims(page: str) -> dict[str, str]:
    """Each session row's claims, by session id: the count, or '?' where not read."""
    out = {}
    for body in re.findall(r'<tr class="session-row"[^>]*>(.*?)</tr>', page, re.S):
        sid = re.search(r'<td class="mono" title="([^"]+)">', body)
        _pid, claims, _leased = re.findall(r'<td class="num[^"]*"[^>]*>([^<]*)</td>', body)
        out[sid.group(1) if sid else "?"] = claims
    return out


def _budget_for_every_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """The view reads every list of the store within the budget that starts at its
    first timeout (test_after_a_timeout_the_views_reads_are_short_and_scans_wait is
    the budget's test). On a shared server thousands of lists earlier tests left
    are read too, sorted among this test's: a 2 s budget ran out before some of
    them (6,000 lists here), which then showed as not read. Each read gets 5 s, not
    100 ms: the nodes these tests freeze (`Frozen`) fail their reads at once, and on
    a loaded machine a real read took more than 100 ms (seen: lists shown as not
    read in a one-server run beside other work)."""
    monkeypatch.setattr(dashboard_data, "AFTER_TIMEOUT_BUDGET_S", 120.0)
    monkeypatch.setattr(dashboard_data, "AFTER_TIMEOUT_MS", 5000)


def test_a_node_that_does_not_answer_costs_the_overview_only_what_it_holds(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    names, session = three_lists
    a, frozen_name, c = names
    monkeypatch.setattr(dashboard_data, "SCAN_RETRY_S", 0.0)  # the scans are tried at every view here
    _budget_for_every_list(monkeypatch)
    client = app.test_client()
    whole = page_text(client.get("/"))  # the dashboard has seen every list once
    assert unread(whole) == [] and 'id="partial"' not in whole
    assert row_numbers(whole, frozen_name) == ["3", "3", "0", "0", "0", "0"]
    assert session_claims(whole)[session.id] == "0"

    frozen = Frozen(registered, monkeypatch, {frozen_name})
    frozen.on = True
    resp = client.get("/")
    assert resp.status_code == 200
    page = page_text(resp)
    # What answered, with its counts.
    assert row_numbers(page, a) == ["4", "2", "0", "0", "0", "2"]
    assert row_numbers(page, c) == ["5", "3", "0", "0", "2", "0"]
    assert "RuntimeError: job 1 broke" in page  # the dead jobs of a list that answered
    # What did not, named: the frozen node's list (found by the earlier view), the
    # list of lists (its scan needs every node), the sessions (theirs too), and the
    # claims of the sessions the other nodes handed over (their index query needs every node).
    assert row_numbers(page, frozen_name) is None
    assert re.search(rf'<tr class="list-row unread" data-list="{re.escape(frozen_name)}">.*?not read', page, re.S)
    assert unread_parts(page) == {"the list of lists", f"list {frozen_name}", "sessions"}, unread(page)
    assert CLAIMS in unread(page)
    assert "Sessions: may be incomplete — a node did not answer" in page and session_claims(page)[session.id] == "?"
    assert "The list of lists may be incomplete" in page

    frozen.on = False  # the node answers again: so does the whole page
    again = page_text(client.get("/"))
    assert unread(again) == [] and "unread" not in again
    assert row_numbers(again, frozen_name) == ["3", "3", "0", "0", "0", "0"]
    assert session_claims(again)[session.id] == "0" and "may be incomplete" not in again


def test_a_dashboard_that_never_saw_the_lists_shows_those_the_other_nodes_hold(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started while the node is frozen: the scan of the list set fails, yet the
    records the other nodes handed over before it did name their lists."""
    names, _ = three_lists
    a, frozen_name, c = names
    _budget_for_every_list(monkeypatch)
    Frozen(registered, monkeypatch, {frozen_name}).on = True
    resp = app.test_client().get("/")
    assert resp.status_code == 200
    page = page_text(resp)
    assert row_numbers(page, a) == ["4", "2", "0", "0", "0", "2"]
    assert row_numbers(page, c) == ["5", "3", "0", "0", "2", "0"]
    assert frozen_name not in page  # never seen, on no node that answered
    assert unread_parts(page) == {"the list of lists", "sessions"}


def test_after_a_timeout_the_views_reads_are_short_and_so_are_the_scans_until_one_answers(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the first read that timed out, the view's other reads get a short limit
    within a budget (a frozen node costs a view one limit and the budget, not one
    limit per part). The views of the next SCAN_RETRY_S give their scans the short
    limit from the start (at the full one each would wait out the scan's 5 s), yet
    still try them: for what the other nodes hold, and so that the first view after
    the node is back is whole (they were skipped: whole again only 10 s later)."""
    names, session = three_lists
    client = app.test_client()
    client.get("/")
    frozen = Frozen(registered, monkeypatch, {names[1]})
    frozen.on = True
    clock = [1000.0]
    monkeypatch.setattr(dashboard_data.time, "monotonic", lambda: clock[0])
    _budget_for_every_list(monkeypatch)  # the clock stands still here: only the test's own budget runs out
    # The short limits, made long enough for a loaded machine's healthy reads: what is
    # checked is that the reads get them, not how fast they are.
    monkeypatch.setattr(dashboard_data, "AFTER_TIMEOUT_MS", 1500)
    monkeypatch.setattr(dashboard_data, "AFTER_TIMEOUT_SCAN_MS", 1700)
    spy = ReadSpy(registered.client)
    monkeypatch.setattr(registered, "client", spy)
    full_scan = BOUNDED_SCAN_MS

    def limits(*calls: str) -> list[int | None]:
        return [ms for call, _, ms in spy.seen if call in calls]

    records = ("get", "select", "batch_read")
    assert client.get("/").status_code == 200
    # The list set's scan, in full, timed out first; every read after it is short.
    assert limits("scan") == [full_scan, 1700], limits("scan")
    assert limits(*records) and set(limits(*records)) == {1500}, limits(*records)
    assert frozen.scans == [keys.LIST_SET, keys.SESS_SET]

    spy.seen.clear()
    clock[0] += dashboard_data.SCAN_RETRY_S - 1
    page = page_text(client.get("/"))  # within SCAN_RETRY_S: scanned, with the short limit at once
    assert frozen.scans == [keys.LIST_SET, keys.SESS_SET] * 2
    assert limits("scan") == [1700, 1700], limits("scan")
    assert set(limits(*records)) == {1500}, limits(*records)
    assert row_numbers(page, names[0]) == ["4", "2", "0", "0", "0", "2"]
    assert unread_parts(page) == {"the list of lists", f"list {names[1]}", "sessions"}
    assert session_claims(page)[session.id] == "?"  # handed over by the nodes that answered

    spy.seen.clear()
    clock[0] += 2
    client.get("/")  # SCAN_RETRY_S since the full scan: in full again, still failing (held again)
    assert limits("scan") == [full_scan, 1700], limits("scan")

    spy.seen.clear()
    clock[0] += 1
    frozen.on = False  # the node answers again, within SCAN_RETRY_S: the next view is whole
    page = page_text(client.get("/"))
    assert limits("scan") == [1700, full_scan], limits("scan")  # the first answered whole: the wait is over
    assert unread(page) == [] and session_claims(page)[session.id] == "0"
    assert [row_numbers(page, n) is not None for n in names] == [True] * 3

    frozen.on = True
    client.get("/")  # frozen again: the full scan times out, and the views after scan short
    monkeypatch.setattr(dashboard_data, "AFTER_TIMEOUT_BUDGET_S", 0.0)  # spent at once: nothing more is read
    clock[0] += dashboard_data.SCAN_RETRY_S - 1
    page = page_text(client.get("/"))
    # The list set's scan (short, and failing) is the view's first read: after it,
    # no list is read, each one named.
    assert [row_numbers(page, n) for n in names] == [None] * 3
    assert {f"list {n}" for n in names} | {"the list of lists", "sessions"} <= set(unread(page))


def test_the_lists_that_did_not_answer_are_read_after_the_others_at_the_next_view(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Read in their order, a frozen node's lists each waited out the short limit and
    spent the budget before the healthy lists after them were tried: on a loaded
    host (3 nodes, one frozen) a view showed none of the 9 lists, healthy ones
    included. The next view reads those that did not answer last; the page still
    shows the lists by name."""
    names, _ = three_lists
    first = names[0]  # first by name of this test's lists: its node is frozen
    client = app.test_client()
    client.get("/")
    frozen = Frozen(registered, monkeypatch, {first})
    frozen.on = True
    _budget_for_every_list(monkeypatch)
    page = page_text(client.get("/"))
    mine = [n for n in frozen.statuses if n in names]
    assert mine == sorted(names), mine  # by name while every list answered before
    assert row_numbers(page, first) is None and row_numbers(page, names[2]) is not None

    frozen.statuses.clear()
    page = page_text(client.get("/"))
    mine = [n for n in frozen.statuses if n in names]
    assert mine == [*sorted(set(names) - {first}), first], mine
    shown = re.findall(r'<tr class="list-row(?: unread)?" data-list="([^"]+)">', page)
    assert [n for n in shown if n in names] == sorted(names), shown
    assert f"list {first}" in unread(page)

    frozen.on = False  # answered again: read in its place at the view after
    client.get("/")
    frozen.on, frozen.lists = True, set()
    client.get("/")
    assert [n for n in frozen.statuses if n in names][-3:] == sorted(names), frozen.statuses


def _job_reads_unanswered(registered: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch reads of the job set time out (the dead jobs' reads); the rest answers."""
    real_batch_get = registered.batch_get

    def batch_get(set_name: str, *args: Any, **kw: Any) -> Any:
        if set_name == keys.JOB_SET:
            raise timed_out("batch read of aq_job")
        return real_batch_get(set_name, *args, **kw)

    monkeypatch.setattr(registered, "batch_get", batch_get)


def test_the_dead_jobs_of_a_list_that_do_not_answer_are_named_on_the_overview(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    names, _ = three_lists
    _budget_for_every_list(monkeypatch)
    _job_reads_unanswered(registered, monkeypatch)
    page = page_text(app.test_client().get("/"))
    assert row_numbers(page, names[0]) == ["4", "2", "0", "0", "0", "2"]
    assert f"dead jobs of {names[0]}" in unread(page)
    notice = re.search(r'data-part="dead jobs">Dead jobs of ([^<]*): not read', page)
    assert notice and names[0] in notice.group(1).split(", ")


def test_the_sessions_section_shows_the_sessions_and_claims_that_answered(
    app: Flask, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sessions section while a node does not answer: the sessions the other
    nodes hand over are shown, with their claims if their index query answered
    (one for all of them); what was not read is named, in the section and in the
    notice. It was all or nothing: "Sessions: unavailable" for one session not read."""
    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"j{i}", i) for i in range(6)], seal=True)
    near, far, slow = (Session.open(registered, heartbeat=False) for _ in range(3))
    try:
        for session, n in ((near, 2), (far, 1), (slow, 3)):
            assert len(queue.reserve(list_name, session, n)) == n
        monkeypatch.setattr(dashboard_data, "SCAN_RETRY_S", 0.0)  # the scans are tried in full at every view
        _budget_for_every_list(monkeypatch)
        client = app.test_client()
        whole = page_text(client.get("/"))
        assert unread(whole) == []
        assert [session_claims(whole)[s.id] for s in (near, far, slow)] == ["2", "1", "3"]

        # `far`'s record is on the frozen node; the query of the claims answers (as if in time).
        frozen = Frozen(registered, monkeypatch, set(), sessions={far.id}, queries=False)
        frozen.on = True
        resp = client.get("/")
        assert resp.status_code == 200
        page = page_text(resp)
        claims = session_claims(page)
        assert claims[near.id] == "2" and claims[slow.id] == "3", claims
        assert far.id not in claims and far.id[:12] not in page
        assert unread_parts(page) == {"the list of lists", "sessions"} == set(unread(page)), unread(page)
        assert "Sessions: may be incomplete" in page and 'data-part="claims"' not in page
        assert row_numbers(page, list_name) == ["6", "0", "0", "6", "0", "0"]  # the rest of the page as it is

        frozen.queries = True  # an index query needs every node: none answers
        page = page_text(client.get("/"))
        claims = session_claims(page)
        # Every session shown, ours and those other tests left on a shared server.
        assert claims[near.id] == claims[slow.id] == "?" and set(claims.values()) == {"?"}, claims
        assert f"Claims of {len(claims)} session(s)" in page and CLAIMS in unread(page)

        frozen.on = False
        again = page_text(client.get("/"))
        assert unread(again) == [] and "may be incomplete" not in again and 'data-part="claims"' not in again
        assert [session_claims(again)[s.id] for s in (near, far, slow)] == ["2", "1", "3"]
    finally:
        for session in (near, far, slow):
            session.close()


def test_a_store_of_which_nothing_answers_is_an_error(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = app.test_client()
    client.get("/")
    Frozen(registered, monkeypatch, None).on = True
    resp = client.get("/")
    assert resp.status_code == 503
    assert "Store error" in page_text(resp) and "timeout" in page_text(resp)


def test_a_list_page_whose_dead_jobs_do_not_answer_shows_the_counts(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = three_lists[0][0]
    _job_reads_unanswered(registered, monkeypatch)
    resp = app.test_client().get(f"/lists/{name}")
    assert resp.status_code == 200
    page = page_text(resp)
    assert re.search(r'<div class="dead"><dt>dead</dt><dd>2</dd>', page)
    assert unread(page) == ["dead jobs"] and "Dead jobs: not read" in page


def test_a_store_of_which_nothing_answers_stays_an_error_while_its_scans_wait(
    app: Flask, registered: Backend, three_lists: tuple[list[str], Session], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started while nothing answers: no list known yet. The views after the first,
    whose scans get the short limit (SCAN_RETRY_S), read nothing at all; they were a
    200 'Partial view' showing no list, as if the store were empty, and not the 503
    every other view of a store that does not answer is."""
    Frozen(registered, monkeypatch, None).on = True
    client = app.test_client()
    assert client.get("/").status_code == 503
    resp = client.get("/")  # the scans wait: nothing is read
    assert resp.status_code == 503, page_text(resp)
    assert "Store error" in page_text(resp) and "timeout" in page_text(resp)
