"""The dashboard in a real headless Chromium (selenium): an operator kicks a dead
job and sees it queued; the page keeps its counts live; the Content Security
Policy lets every asset load (they ship in the package). On every backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from aeroqueue import keys
from aeroqueue.backends import Backend
from aeroqueue.dashboard import create_app
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from tests.observe.conftest import serving

pytestmark = pytest.mark.timeout(90)


def point_at(browser: Any, css: str, *, click: bool = False) -> None:
    """Move the pointer to where the element is (and click there), as a person does.

    By place, not by element: on a loaded machine every try of
    `find_element(...).click()` (two WebDriver calls, a second or more apart) found
    the element replaced by the page's live refresh in between, for 20 s (a CI
    run). The place is read in one script; the page does not refresh under a
    pointer resting on a control, so a press and its release land on one button."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    def place(drv: Any) -> tuple[int, int] | None:
        return drv.execute_script(  # type: ignore[no-any-return]
            "const e = document.querySelector(arguments[0]); if (!e) return null;"
            "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            "return [Math.round(r.left + r.width / 2), Math.round(r.top + r.height / 2)];", css)

    x, y = WebDriverWait(browser, 10).until(place, f"no {css!r} on the page")
    actions = ActionChains(browser)
    actions.w3c_actions.pointer_action.move_to_location(x, y)
    if click:
        actions.w3c_actions.pointer_action.click()
    actions.perform()


def click(browser: Any, css: str) -> None:
    point_at(browser, css, click=True)


def wait_text(browser: Any, css: str, expected: str, timeout: float = 10) -> None:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def seen(drv: Any) -> bool:
        try:
            return expected in drv.find_element("css selector", css).text
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    WebDriverWait(browser, timeout).until(seen, f"{css!r} never showed {expected!r}")


def test_kick_a_dead_job_from_the_browser(
    browser: Any, registered: Backend, list_name: str, screenshot_dir: Callable[[str], Path] | None,
) -> None:
    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"mail-{i}", {"to": f"u{i}@example.org"}) for i in range(8)], max_attempts=1, seal=True)
    with Session.open(registered, heartbeat=False) as session:
        for job in queue.reserve(list_name, session, 4):
            if job.token in (1, 2):
                queue.fail(job, f"SMTPError: mailbox {job.payload['to']} unreachable\nTraceback (most recent call last):\n  ...")
            else:
                queue.complete(job, {"sent": True})
    assert lists.status(list_name).dead == 2
    browser.get("about:blank")  # nothing of an earlier test's page runs on
    browser.get_log("browser")  # and what it logged is dropped

    with serving(create_app(registered, secret_key="browser-test", refresh_s=1)) as base:
        browser.get(f"{base}/lists/{list_name}")
        assert list_name in browser.title
        # Read in the page, at once: the live refresh (every second) replaces the rows, and
        # a row found first and read after it was stale (seen on a loaded machine).
        tokens = browser.execute_script("return [...document.querySelectorAll('tr.dead-job')].map(r => r.dataset.token)")
        assert sorted(tokens) == ["1", "2"], tokens
        wait_text(browser, 'tr.dead-job[data-token="2"]', "mailbox u2@example.org unreachable")
        # The stylesheet applied (served from the package, allowed by the CSP): the bar has colour.
        fill = browser.execute_script(
            "return getComputedStyle(document.querySelector('svg.bar rect.dead')).fill")
        assert fill == "rgb(214, 69, 69)", fill
        if screenshot_dir:
            browser.save_screenshot(str(screenshot_dir("list")))

        click(browser, 'tr.dead-job[data-token="2"] button.kick')
        wait_text(browser, "#job-state", "queued")
        assert browser.current_url.endswith(f"/lists/{list_name}/jobs/2")
        assert "kicked" in browser.find_element("css selector", ".flash").text
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, 2))
        assert rec is not None and rec.bins["state"] == "queued" and rec.bins["att"] == 0
        assert lists.status(list_name).dead == 1
        if screenshot_dir:
            browser.save_screenshot(str(screenshot_dir("job")))

        # The list page keeps itself current: a job dying elsewhere shows up without a reload.
        browser.get(f"{base}/lists/{list_name}")
        wait_text(browser, "dl.counts .dead dd", "1")
        with Session.open(registered, heartbeat=False) as session:
            for job in queue.reserve(list_name, session, 8):
                if job.token == 2:
                    queue.fail(job, "SMTPError: still unreachable")
                else:
                    queue.complete(job)
        wait_text(browser, "dl.counts .dead dd", "2")
        wait_text(browser, 'tr.dead-job[data-token="2"]', "still unreachable")
        severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        browser.get("about:blank")  # before the server goes: the page's refresh would fail

    assert not severe, f"the browser reported errors (a CSP violation?): {severe}"


def test_the_live_refresh_leaves_a_control_under_the_pointer_alone(browser: Any, registered: Backend, list_name: str) -> None:
    """A refresh that swapped the rows under a pointer resting on a kick button lost
    the click whose press landed on the old button and release on the new one (a CI
    run's kick never went out in 10 s of tries). While the pointer rests on a control,
    the page waits; once it leaves, the refreshes go on."""
    from selenium.webdriver.support.ui import WebDriverWait

    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec("a", 1), JobSpec("b", 2)], max_attempts=1, seal=True)
    with Session.open(registered, heartbeat=False) as session:
        for job in queue.reserve(list_name, session, 1):
            queue.fail(job, "boom")
    browser.get("about:blank")
    kick = 'tr.dead-job button.kick'
    marked = "const b = document.querySelector(arguments[0]); return !!(b && b.dataset.seen);"
    with serving(create_app(registered, secret_key="browser-test", refresh_s=0.2)) as base:
        browser.get(f"{base}/lists/{list_name}")
        WebDriverWait(browser, 10).until(lambda drv: drv.find_elements("css selector", kick), "no kick button")
        point_at(browser, kick)
        # Mark the button the pointer rests on, once it does: a refresh that swaps the
        # rows drops the mark.
        WebDriverWait(browser, 10).until(
            lambda drv: drv.execute_script(
                "const b = document.querySelector(arguments[0] + ':hover'); if (b) b.dataset.seen = '1'; return !!b;",
                kick),
            "the pointer never rested on a kick button")
        time.sleep(2.0)  # ten ticks of the refresh timer
        assert browser.execute_script(marked, kick), "the rows were swapped under the pointer"
        point_at(browser, "header.top")
        WebDriverWait(browser, 10).until(
            lambda drv: not drv.execute_script(marked, kick), "the page never refreshed once the pointer left")
        browser.get("about:blank")


def test_a_list_pages_dead_jobs_page_by_page(
    browser: Any, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
    screenshot_dir: Callable[[str], Path] | None,
) -> None:
    """A list page shows a page of its dead jobs at a time (DEAD_PAGE; 2 here), in token
    order, and says which of how many: "next" leads to the following ones, "first"
    back. An open page keeps its place at each refresh, and shows there a job that
    dies since."""
    from selenium.webdriver.support.ui import WebDriverWait

    from aeroqueue.dashboard import data as dashboard_data

    monkeypatch.setattr(dashboard_data, "DEAD_PAGE", 2)
    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(6)], max_attempts=1, seal=True)
    with Session.open(registered, heartbeat=False) as session:
        for job in queue.reserve(list_name, session, 5):
            queue.fail(job, f"RuntimeError: job {job.token} broke")
    tokens = "return [...document.querySelectorAll('tr.dead-job')].map(r => Number(r.dataset.token))"

    def rows(expected: list[int]) -> None:
        WebDriverWait(browser, 10).until(lambda drv: drv.execute_script(tokens) == expected,
                                         f"the rows never were those of tokens {expected}")

    browser.get("about:blank")
    browser.get_log("browser")
    with serving(create_app(registered, secret_key="browser-test", refresh_s=0.5)) as base:
        browser.get(f"{base}/lists/{list_name}")
        wait_text(browser, "#dead-pager", "Showing 2 of 5 dead jobs: tokens 0 to 1")
        rows([0, 1])
        assert not browser.find_elements("css selector", "#dead-first")
        click(browser, "#dead-next")
        rows([2, 3])
        assert browser.current_url.endswith(f"/lists/{list_name}?after=1"), browser.current_url
        wait_text(browser, 'tr.dead-job[data-token="3"]', "RuntimeError: job 3 broke")
        if screenshot_dir:
            browser.save_screenshot(str(screenshot_dir("list-page-2")))
        click(browser, "#dead-next")
        rows([4])
        assert not browser.find_elements("css selector", "#dead-next")
        # The last job dies meanwhile: the open page shows it in its place at a refresh
        # (once the pointer leaves the link it clicked: the page waits while it rests there).
        point_at(browser, "header.top")
        with Session.open(registered, heartbeat=False) as session:
            (job,) = queue.reserve(list_name, session, 1)
            queue.fail(job, "RuntimeError: the last one broke")
        rows([4, 5])
        wait_text(browser, "#dead-pager", "Showing 2 of 6 dead jobs: tokens 4 to 5")
        click(browser, "#dead-first")
        rows([0, 1])
        assert browser.current_url.endswith(f"/lists/{list_name}"), browser.current_url
        severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        browser.get("about:blank")
    assert not severe, f"the browser reported errors: {severe}"


def counting_pages(app: Any, hold: Callable[[int], None]) -> dict[str, int]:
    """Wrap `app` so that each page request (not its static files) is counted: how many
    so far ("seen"), at once now and at most; `hold(seen)` runs before it is answered
    (a slow store, a stopped dashboard)."""
    inner, lock = app.wsgi_app, threading.Lock()
    pages = {"now": 0, "most": 0, "seen": 0}

    def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["PATH_INFO"].startswith("/static/"):
            return inner(environ, start_response)
        with lock:
            pages["seen"] += 1
            pages["now"] += 1
            pages["most"] = max(pages["most"], pages["now"])
            seen = pages["seen"]
        try:
            hold(seen)
            return inner(environ, start_response)
        finally:
            with lock:
                pages["now"] -= 1

    app.wsgi_app = counted
    return pages


def stale_notice(drv: Any) -> str | None:
    """The page's not-refreshed notice while it is shown, else None."""
    return drv.execute_script(  # type: ignore[no-any-return]
        "const p = document.getElementById('stale'); return p && !p.hidden && p.offsetParent ? p.textContent : null;")


def test_a_slow_store_gets_one_refresh_at_a_time(browser: Any, registered: Backend) -> None:
    """A frozen node holds a scan for 30 s: the page must not stack a refresh on the
    next while one is still waiting (each holds a server thread and a store call)."""
    app = create_app(registered, secret_key="browser-test", refresh_s=0.3)
    release = threading.Event()
    # After the first page, the store answering slowly, as a refresh finds it.
    pages = counting_pages(app, lambda seen: seen == 1 or release.wait(2.0))
    browser.get("about:blank")
    with serving(app) as base:
        browser.get(f"{base}/")
        time.sleep(3.5)  # a dozen ticks of the refresh timer, a second answer or so
        browser.get("about:blank")
        release.set()
        deadline = time.monotonic() + 10
        while pages["now"] and time.monotonic() < deadline:
            time.sleep(0.05)
    assert pages["seen"] >= 2, "the page never refreshed"
    assert pages["most"] == 1, f"{pages['most']} page requests at once from one open page"


# The page's own script under test, whatever the store: on one backend (the suite's time).
@pytest.mark.parametrize("store_url", ["embedded"], indirect=True)
def test_a_refresh_with_no_answer_is_said_not_live_and_the_answer_clears_it(
    browser: Any, registered: Backend, list_name: str
) -> None:
    """The dashboard stopped (SIGSTOP) or cut off: a refresh neither answers nor fails,
    and the page kept showing its counts as if live, for good. Past twice the refresh
    interval (5 s at least) it says they are not, still one request at a time; the
    answer, when it comes, clears the notice."""
    from selenium.webdriver.support.ui import WebDriverWait

    JobLists(registered).load(list_name, [JobSpec("a", 1)], seal=True)
    app = create_app(registered, secret_key="browser-test", refresh_s=0.5)
    hanging, released = threading.Event(), threading.Event()
    # While `hanging`, a dashboard stopped, until it is continued (`released`).
    pages = counting_pages(app, lambda seen: not hanging.is_set() or released.wait(30))
    browser.get("about:blank")
    with serving(app) as base:
        browser.get(f"{base}/")
        wait_text(browser, f'tr.list-row[data-list="{list_name}"]', list_name)
        assert stale_notice(browser) is None
        hung_at = time.monotonic()
        hanging.set()
        WebDriverWait(browser, 20).until(stale_notice, "no notice while the refresh hangs")
        assert time.monotonic() - hung_at >= 4.5, "said before 5 s without an answer"
        assert "Dashboard not answering" in (stale_notice(browser) or "")
        assert pages["most"] == 1, "one request at a time, the hanging one included"
        hanging.clear()
        released.set()
        WebDriverWait(browser, 20).until(lambda drv: stale_notice(drv) is None, "the answer did not clear the notice")
        browser.get("about:blank")


def test_the_live_page_shows_a_partial_view_and_clears_it(
    browser: Any, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
    screenshot_dir: Callable[[str], Path] | None,
) -> None:
    """A node stops answering while the overview is open: the next refresh brings
    the partial notice in (a 200: on an error the page would keep showing the counts
    from before, as if nothing had happened), with the lists that answered and the
    one that did not marked; once the node answers again, the notice goes."""
    from aeroqueue.dashboard import data as dashboard_data
    from tests.observe.test_dashboard_partial import Frozen

    fine, frozen_name = f"{list_name}-fine", f"{list_name}-frozen"
    lists = JobLists(registered)
    lists.load(fine, [JobSpec(f"a{i}", i) for i in range(4)], seal=True)
    lists.load(frozen_name, [JobSpec(f"b{i}", i) for i in range(2)], seal=True)
    monkeypatch.setattr(dashboard_data, "SCAN_RETRY_S", 0.0)  # whole again at the first refresh after
    # A session of its own: the other nodes hand it over, so the section says it may
    # be incomplete whatever other tests left on a shared server (with no session at
    # all, nothing answered: "unavailable").
    session = Session.open(registered, heartbeat=False)
    frozen = Frozen(registered, monkeypatch, {frozen_name})
    browser.get("about:blank")
    browser.get_log("browser")

    with serving(create_app(registered, secret_key="browser-test", refresh_s=0.5)) as base:
        browser.get(f"{base}/")
        wait_text(browser, f'tr.list-row[data-list="{frozen_name}"]', frozen_name)
        assert not browser.find_elements("css selector", "#partial")
        frozen.on = True
        wait_text(browser, "#partial", "Partial view")
        wait_text(browser, f'tr.list-row.unread[data-list="{frozen_name}"]', "not read")
        # Read in one script: the page refreshes every 0.5 s, and an element found by one
        # call was replaced by the next (StaleElementReferenceException in a CI run).
        row, sessions, colour = browser.execute_script(
            "const q = (s) => document.querySelector(s);"
            "return [q(arguments[0]).textContent, q('[data-part=\"sessions\"]').textContent,"
            " getComputedStyle(q('#partial')).backgroundColor];",
            f'tr.list-row[data-list="{fine}"]',
        )
        assert "4" in row, row
        assert "Sessions: may be incomplete" in " ".join(sessions.split()), sessions
        # Styled from the package's stylesheet, like the rest of the page.
        assert colour == "rgb(251, 239, 213)", colour
        if screenshot_dir:
            browser.save_screenshot(str(screenshot_dir("partial")))

        frozen.on = False
        from selenium.webdriver.support.ui import WebDriverWait

        WebDriverWait(browser, 10).until(
            lambda drv: not drv.find_elements("css selector", "#partial, tr.list-row.unread"), "the notice stayed")
        severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
        browser.get("about:blank")
    session.close()
    assert not severe, f"the browser reported errors: {severe}"


def test_the_live_page_shows_the_sessions_that_answered_and_clears_the_notice(
    browser: Any, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
    screenshot_dir: Callable[[str], Path] | None,
) -> None:
    """A node stops answering while the overview is open: the next refresh shows the
    sessions the other nodes hold (it showed none: "Sessions: unavailable"), those
    whose claims were not read marked '?', and the section's notice; once the node
    answers again, the notice goes and the counts come back."""
    from selenium.webdriver.support.ui import WebDriverWait

    from tests.observe.test_dashboard_partial import Frozen

    lists, queue = JobLists(registered), Queue(registered)
    lists.load(list_name, [JobSpec(f"a{i}", i) for i in range(5)], seal=True)
    near, far = Session.open(registered, heartbeat=False), Session.open(registered, heartbeat=False)
    try:
        queue.reserve(list_name, near, 2)
        queue.reserve(list_name, far, 1)
        frozen = Frozen(registered, monkeypatch, set(), sessions={far.id})  # far's record is on the frozen node
        browser.get("about:blank")
        browser.get_log("browser")

        def claims(drv: Any) -> dict[str, str]:
            # In one script: the page refreshes every 0.5 s, replacing the rows.
            return dict(drv.execute_script(
                "return [...document.querySelectorAll('tr.session-row')]"
                ".map((tr) => [tr.querySelector('td.mono').title, tr.querySelectorAll('td.num')[1].textContent.trim()]);"))

        with serving(create_app(registered, secret_key="browser-test", refresh_s=0.5)) as base:
            browser.get(f"{base}/")
            wait_text(browser, f'tr.session-row td.mono[title="{far.id}"]', far.id[:12])
            got = claims(browser)
            assert (got[near.id], got[far.id]) == ("2", "1"), got
            frozen.on = True
            wait_text(browser, '[data-part="sessions"]', "may be incomplete")
            wait_text(browser, "#partial", "Partial view")
            WebDriverWait(browser, 10).until(lambda drv: claims(drv).get(near.id) == "?", "near's claims stayed shown")
            got = claims(browser)
            assert far.id not in got, got
            if screenshot_dir:
                browser.save_screenshot(str(screenshot_dir("partial-sessions")))

            frozen.on = False
            WebDriverWait(browser, 10).until(
                lambda drv: not drv.find_elements("css selector", '#partial, [data-part="sessions"], [data-part="claims"]'),
                "the notice stayed")
            WebDriverWait(browser, 10).until(lambda drv: claims(drv).get(far.id) == "1", "far never came back")
            assert claims(browser)[near.id] == "2"
            severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
            browser.get("about:blank")
        assert not severe, f"the browser reported errors: {severe}"
    finally:
        near.close()
        far.close()


def test_the_live_page_says_when_its_counts_are_not_refreshed(
    browser: Any, registered: Backend, list_name: str, monkeypatch: pytest.MonkeyPatch,
    screenshot_dir: Callable[[str], Path] | None,
) -> None:
    """Nothing answers while the overview is open: each refresh gets a 503. The page
    keeps the counts it shows, and says they are not live and since when (it kept
    them quietly, looking live); once the store answers, the notice goes."""
    import re

    from selenium.webdriver.support.ui import WebDriverWait

    from tests.observe.test_dashboard_partial import Frozen

    JobLists(registered).load(list_name, [JobSpec(f"a{i}", i) for i in range(3)], seal=True)
    frozen = Frozen(registered, monkeypatch, None)
    browser.get("about:blank")
    browser.get_log("browser")


    app = create_app(registered, secret_key="browser-test", refresh_s=0.5)
    inner, served = app.wsgi_app, [0]

    def counted(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/":
            served[0] += 1
        return inner(environ, start_response)

    app.wsgi_app = counted  # type: ignore[method-assign]
    with serving(app) as base:
        browser.get(f"{base}/")
        wait_text(browser, f'tr.list-row[data-list="{list_name}"]', list_name)
        assert stale_notice(browser) is None
        frozen.on = True
        WebDriverWait(browser, 10).until(stale_notice, "no notice of the failed refreshes")
        text = stale_notice(browser)
        assert text is not None and "Store not answering" in text and "timeout" in text, text
        as_of = re.search(r"counts as of (\d\d:\d\d:\d\d)\.$", text)
        assert as_of, text
        # The counts stay, with the notice; the time is that of the last refresh that
        # answered, not of each that failed: three more fail, over a second or more.
        failed = served[0]
        WebDriverWait(browser, 10).until(lambda drv: served[0] >= failed + 3, "the page stopped refreshing")
        again = stale_notice(browser)
        assert again is not None and again.endswith(f"counts as of {as_of.group(1)}."), (text, again)
        assert list_name in browser.find_element("css selector", f'tr.list-row[data-list="{list_name}"]').text
        colour = browser.execute_script("return getComputedStyle(document.getElementById('stale')).backgroundColor")
        assert colour == "rgb(251, 239, 213)", colour  # styled as the partial notice
        if screenshot_dir:
            browser.save_screenshot(str(screenshot_dir("stale")))

        frozen.on = False
        WebDriverWait(browser, 10).until(lambda drv: stale_notice(drv) is None, "the notice stayed")
        severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"
                  and "503" not in e.get("message", "")]  # the failed refreshes' own
        browser.get("about:blank")
    assert not severe, f"the browser reported errors: {severe}"


def test_a_link_from_another_site_leaves_the_open_pages_buttons_working(
    browser: Any, registered: Backend, list_name: str,
) -> None:
    """With a Strict session cookie, opening the dashboard from a link on another site
    (a runbook, a chat: localhost here, another site than 127.0.0.1) came without the
    cookie: the view made a new session and token, and the buttons of every page
    already open failed with "The CSRF tokens do not match" (a helper's audit)."""
    import http.server

    from tests.observe.conftest import free_port

    JobLists(registered).load(list_name, [JobSpec("a", {})], seal=True)
    browser.get("about:blank")
    with serving(create_app(registered, secret_key="browser-test", refresh_s=60)) as base:
        runbook = f'<!doctype html><a id="go" href="{base}/">the dashboard</a>'.encode()

        class Runbook(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(runbook)

            def log_message(self, *_: Any) -> None:
                pass

        other = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Runbook)
        threading.Thread(target=other.serve_forever, daemon=True).start()
        first = browser.current_window_handle
        try:
            browser.get(f"{base}/lists/{list_name}")  # the page an operator keeps open
            browser.switch_to.new_window("tab")
            browser.get(f"http://localhost:{other.server_port}/")
            click(browser, "#go")
            wait_text(browser, "header.top .brand", "aeroqueue")
            assert browser.current_url.startswith(base), browser.current_url
            browser.close()
            browser.switch_to.window(first)
            click(browser, 'form[action$="/pause"] button')
            wait_text(browser, ".flash", "paused")
            assert JobLists(registered).status(list_name).paused, browser.page_source[:2000]
        finally:
            other.shutdown()
            other.server_close()
            if browser.current_window_handle != first:
                browser.switch_to.window(first)
            browser.get("about:blank")


def test_an_id_that_reorders_its_text_is_shown_as_it_is_stored(browser: Any, registered: Backend, list_name: str) -> None:
    """A job id or error with a bidirectional override (a customer's file, a handler's
    message): raw, U+202E shows "invoice\u202egpj.exe" as "invoiceexe.jpg" in the
    page, as the live refresh redraws it too. The override is shown as its escape."""
    lists, queue = JobLists(registered), Queue(registered)
    jid = "invoice\u202egpj.exe"
    lists.load(list_name, [JobSpec(jid, 1)], max_attempts=1)
    with Session.open(registered, heartbeat=False) as session:
        queue.fail(queue.reserve(list_name, session)[0], "opened \u202etxt.exe\x1b[2J")
    browser.get("about:blank")
    browser.get_log("browser")
    with serving(create_app(registered, secret_key="browser-test", refresh_s=1)) as base:
        for path in (f"/lists/{list_name}", f"/lists/{list_name}/jobs/0", "/"):
            browser.get(base + path)
            wait_text(browser, "main", "invoice\\u202egpj.exe")
            text = browser.execute_script("return document.querySelector('main').innerText")
            assert "\u202e" not in text and "\x1b" not in text, repr(text)
            if path != f"/lists/{list_name}/jobs/0":
                assert "opened \\u202etxt.exe\\u001b[2J" in text, text
        time.sleep(1.5)  # a live refresh redraws the rows the same way
        text = browser.execute_script("return document.querySelector('main').innerText")
        assert "invoice\\u202egpj.exe" in text and "\u202e" not in text, repr(text)


def test_a_dashboard_started_before_its_store_says_why_then_shows_it(
    browser: Any, registered: Backend, list_name: str,
) -> None:
    """The page an operator opens while the dashboard waits for its store: the error
    and its hint in the page's own layout (the stylesheet loads under the CSP), which
    says it is tried again; the overview, title and all, once the store answers,
    without anyone reloading the page."""
    import logging

    from aeroqueue.backends.later import Later
    from aeroqueue.errors import StoreUnreachable

    JobLists(registered).load(list_name, [JobSpec("a", 1)])
    down = StoreUnreachable("cannot connect to aerospike://nowhere:3000/test through its seed: Failed to connect")
    down.hint = "is the server running and reachable?"
    up = threading.Event()

    def make(_failures: int) -> Backend:
        if not up.is_set():
            raise down
        return registered

    later = Later(make, down, retry_s=0.1, log=logging.getLogger("aeroqueue.dashboard"), meanwhile="a 503")
    browser.get("about:blank")
    browser.get_log("browser")
    try:
        with serving(create_app(later=later, secret_key="browser-test", refresh_s=1)) as base:
            browser.get(base + "/")
            wait_text(browser, "main", "Failed to connect (is the server running and reachable?)")
            assert "Store error" in browser.find_element("css selector", "main h2").text
            bg = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
            assert bg == "rgb(246, 247, 249)", f"the stylesheet applies: {bg}"
            wait_text(browser, "#stale", "tried again at")
            assert browser.title.startswith("Store error"), browser.title
            up.set()
            wait_text(browser, f'tr.list-row[data-list="{list_name}"]', list_name)
            assert not browser.title.startswith("Store error"), browser.title
            assert browser.find_elements("css selector", ".error-page") == []
            browser.get("about:blank")  # no refresh of the page left to meet the server stopping
    finally:
        later.close()
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE" and "503" not in e.get("message", "")]
    assert severe == [], severe


def test_the_overview_comes_compressed_and_still_renders_and_refreshes(
    browser: Any, registered: Backend, list_name: str,
) -> None:
    """The overview is compressed for a browser that accepts it (Chromium does): the
    page renders, and its live refresh (a fetch of the page every few seconds) swaps
    in what the store holds since, from compressed answers too."""
    from selenium.webdriver.support.ui import WebDriverWait

    lists = JobLists(registered)
    for i in range(20):
        lists.load(f"{list_name}-{i:02d}", [JobSpec("a", 1)], seal=True)
    browser.get("about:blank")
    sizes = ("return performance.getEntriesByType(arguments[0])"
             ".filter((e) => e.name.split('?')[0].endsWith('/')).map((e) => [e.encodedBodySize, e.decodedBodySize]);")
    with serving(create_app(registered, secret_key="browser-test", refresh_s=0.5)) as base:
        browser.get(f"{base}/")
        rows = browser.find_elements("css selector", f'tr.list-row[data-list^="{list_name}-"]')
        assert len(rows) == 20
        [(encoded, decoded)] = browser.execute_script(sizes, "navigation")
        assert 0 < encoded * 3 < decoded, (encoded, decoded)  # compressed on the wire
        lists.load(f"{list_name}-new", [JobSpec("b", 1)], seal=True)
        WebDriverWait(browser, 15).until(
            lambda drv: drv.find_elements("css selector", f'tr.list-row[data-list="{list_name}-new"]'),
            "the refresh never showed the new list")
        fetched = browser.execute_script(sizes, "resource")
        assert fetched and all(0 < e * 3 < d for e, d in fetched), fetched
        assert not browser.find_elements("css selector", "#stale:not([hidden])"), "a refresh failed"
        browser.get("about:blank")
