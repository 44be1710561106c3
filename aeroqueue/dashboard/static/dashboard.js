// aeroqueue dashboard: keep the counts live, and confirm the actions that need it.
// Served from the package (the Content Security Policy allows no inline script).
"use strict";

(function () {
  const live = document.getElementById("live");
  const every = live ? Number(live.dataset.refresh || 0) : 0;

  function busy() {
    // Never swap the page under someone using it: a focused field, a control the
    // pointer rests on (a click whose press lands on the old button and release on
    // the new one is lost), a <details> they opened, or a selection in progress.
    const active = document.activeElement;
    if (active && active !== document.body && live.contains(active)) return true;
    if (live.querySelector(":is(a, button, summary, input, select):hover")) return true;
    if (live.querySelector("details[open]:not([data-default-open])")) return true;
    const sel = window.getSelection();
    return sel && !sel.isCollapsed;
  }

  // While the refreshes fail, the counts shown are those of the last one that did
  // not: say so, with their time, rather than show them as if they were live.
  const stale = document.getElementById("stale");
  let shownAt = new Date();

  function clock(date) {
    return [date.getHours(), date.getMinutes(), date.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
  }

  // A page the store did not answer (a 503 for a GET) has no counts to keep: once its
  // address answers, the whole page is loaded, its title and crumbs too.
  const errorPage = live && live.hasAttribute("data-error-page");

  function notAnswered(why) {
    if (!stale) return;
    stale.textContent = errorPage
      ? why + ": tried again at " + clock(new Date()) + ", and every " + every + " s."
      : why + ": counts as of " + clock(shownAt) + ".";
    stale.hidden = false;
  }

  // One refresh at a time: while the store is slow to answer (a frozen node holds a
  // scan for 30 s) the timer would otherwise stack a request every few seconds,
  // each holding a server thread, and an older answer could land after a newer one.
  let pending = false;
  let pendingSince = 0;
  // A refresh that hangs (the dashboard stopped, its packets dropped) neither answers
  // nor fails: past `slowMs` the counts are said not live, and past `giveUpMs` the
  // request is given up, so that the next can try. Both are well past what a view
  // takes: its reads are bounded, and a store that does not answer is a quick 503.
  const slowMs = Math.max(2 * every, 5) * 1000;
  const giveUpMs = Math.max(4 * every, 60) * 1000;

  async function refresh() {
    if (pending) {
      if (Date.now() - pendingSince > slowMs) notAnswered("Dashboard not answering");
      return;
    }
    if (document.hidden || busy()) return;
    pending = true;
    pendingSince = Date.now();
    const abort = new AbortController();
    const timer = window.setTimeout(() => abort.abort(), giveUpMs);
    try {
      const resp = await fetch(window.location.href, {
        headers: { Accept: "text/html" }, cache: "no-store", signal: abort.signal,
      });
      if (!resp.ok) {
        // 503: the store did not answer (a page of which nothing could be read); the
        // error page's message says what failed. What is shown stays, marked stale.
        notAnswered(resp.status === 503
          ? "Store not answering (" + errorOf(await resp.text()) + ")"
          : "Not refreshed: the dashboard answered HTTP " + resp.status);
        return;
      }
      if (errorPage) {
        // Read whole first: a response left unread as the page goes is cut off (the
        // browser logs a reset). A GET of the address, never reload(), which after a
        // POST would post it again.
        await resp.text();
        window.location.replace(window.location.href);
        return;
      }
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (fresh && !busy()) {
        live.innerHTML = fresh.innerHTML;
        shownAt = new Date();
        if (stale) stale.hidden = true;
      }
    } catch (e) {
      // The dashboard is unreachable (stopped, or the network), or the request was
      // given up: keep what is shown, marked stale.
      notAnswered("Dashboard not answering");
    } finally {
      window.clearTimeout(timer);
      pending = false;
    }
  }

  function errorOf(text) {
    const doc = new DOMParser().parseFromString(text, "text/html");
    const message = doc.querySelector(".error-page p");
    return message && message.textContent.trim() ? message.textContent.trim() : "HTTP 503";
  }

  if (every > 0) window.setInterval(refresh, every * 1000);

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });
})();
