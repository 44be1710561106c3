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


def click(browser: Any, css: str) -> None:
    """Click the element, again if the live refresh replaced it meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def attempt(drv: Any) -> bool:
        try:
            drv.find_element("css selector", css).click()
            return True
        except StaleElementReferenceException:
            return False

    WebDriverWait(browser, 10).until(attempt)


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
        rows = browser.find_elements("css selector", "tr.dead-job")
        assert sorted(r.get_attribute("data-token") for r in rows) == ["1", "2"]
        assert "mailbox u2@example.org unreachable" in browser.find_element("css selector", 'tr.dead-job[data-token="2"]').text
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


def test_a_slow_store_gets_one_refresh_at_a_time(browser: Any, registered: Backend) -> None:
    """A frozen node holds a scan for 30 s: the page must not stack a refresh on the
    next while one is still waiting (each holds a server thread and a store call)."""
    app = create_app(registered, secret_key="browser-test", refresh_s=0.3)
    inner, lock, release = app.wsgi_app, threading.Lock(), threading.Event()
    pages = {"now": 0, "most": 0, "seen": 0}

    def slow(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["PATH_INFO"].startswith("/static/"):
            return inner(environ, start_response)
        with lock:
            pages["seen"] += 1
            pages["now"] += 1
            pages["most"] = max(pages["most"], pages["now"])
            first = pages["seen"] == 1
        try:
            if not first:
                release.wait(2.0)  # the store answering slowly, as a refresh finds it
            return inner(environ, start_response)
        finally:
            with lock:
                pages["now"] -= 1

    app.wsgi_app = slow  # type: ignore[method-assign]
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
        assert "Sessions: unavailable" in " ".join(sessions.split()), sessions
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
    assert not severe, f"the browser reported errors: {severe}"
