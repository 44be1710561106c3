// aeroqueue dashboard: keep the counts live, and confirm the actions that need it.
// Served from the package (the Content Security Policy allows no inline script).
"use strict";

(function () {
  const live = document.getElementById("live");
  const every = live ? Number(live.dataset.refresh || 0) : 0;

  function busy() {
    // Never swap the page under someone using it: a focused field, a <details>
    // they opened, or a selection in progress.
    const active = document.activeElement;
    if (active && active !== document.body && live.contains(active)) return true;
    if (live.querySelector("details[open]:not([data-default-open])")) return true;
    const sel = window.getSelection();
    return sel && !sel.isCollapsed;
  }

  // One refresh at a time: while the store is slow to answer (a frozen node holds a
  // scan for 30 s) the timer would otherwise stack a request every few seconds,
  // each holding a server thread, and an older answer could land after a newer one.
  let pending = false;

  async function refresh() {
    if (pending || document.hidden || busy()) return;
    pending = true;
    try {
      const resp = await fetch(window.location.href, { headers: { Accept: "text/html" }, cache: "no-store" });
      if (!resp.ok) return;
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.getElementById("live");
      if (fresh && !busy()) live.innerHTML = fresh.innerHTML;
    } catch (e) {
      // The dashboard or the store is unreachable for a moment: keep what is shown.
    } finally {
      pending = false;
    }
  }

  if (every > 0) window.setInterval(refresh, every * 1000);

  document.addEventListener("submit", function (event) {
    const form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });
})();
