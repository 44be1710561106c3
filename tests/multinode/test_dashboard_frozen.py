"""The dashboard with one node of three frozen (SIGSTOP): the overview must still
answer 200, quickly, with the counts of the lists whose records the other nodes
hold, and the sessions they hold, and name what it could not read (the list of
lists and the sessions, whose scans need every node; the sessions' claims, whose
index queries do too; the frozen node's lists); once the node resumes, the page
is whole again. Before, it answered 503 for as long as the node stayed frozen: the
scan of the list set, and of the sessions, needs every node; then it showed no
session at all while one node was frozen.

The cluster has min-cluster-size 3: the two others then form no cluster without
the frozen node, and its partitions stay its own, unanswered, for as long as it is
frozen (what a node in trouble that still holds its partitions looks like to
clients: a stalled disk, a long pause). They answer for their own for some 10 s:
then they turn orphan and refuse every read, so every view comes before that. With the tests' usual majority of 2, they
drop it within 1.5 s and clients learn the new map 3 to 5 s after the freeze.

Two dashboards run: one has shown the lists before the freeze, the other serves
its first page during it (it finds the lists only on the nodes that answer)."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import Cluster
from tests.multinode.conftest import agent, in_namespace
from tests.multinode.test_observe_frozen import get, serve, stop
from tests.observe.test_dashboard_partial import session_claims, unread

pytestmark = pytest.mark.timeout(300)

LISTS = [f"df-{i}" for i in range(9)]
WARM_PORT, COLD_PORT = 8431, 8432
# A frozen node costs a first view the scan of the list set's limit (5 s) and 2 s of
# short reads at most; the views after (the scans held back 10 s) a record read's
# limit (1 s) and the 2 s. Room for a loaded machine on top.
FIRST_VIEW_LIMIT_S = 10.0
LATER_VIEW_LIMIT_S = 5.0


def expected(i: int) -> list[str]:
    """List i's row as the page shows it: total, queued, delayed, claimed, done, dead."""
    total, done = i + 2, i % 3
    return [str(total), str(total - done), "0", "0", str(done), "0"]


def rows(page: str) -> dict[str, list[str] | None]:
    """Each list row of the overview: its counts, or None where it says it was not read."""
    out: dict[str, list[str] | None] = {}
    for cls, name, body in re.findall(r'<tr class="list-row( unread)?" data-list="([^"]+)">(.*?)</tr>', page, re.S):
        out[name] = None if cls else re.findall(r'<td class="num[^"]*">([\d,]+)</td>', body)
    return out


def test_a_frozen_node_costs_the_overview_only_what_it_holds(
    clusters: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = clusters(3, min_cluster_size=3)
    url = cluster.url()
    load = (
        "from tests.multinode.agent import load, work\n"
        f"for i, name in enumerate({LISTS!r}):\n"
        f"    print(load({url!r}, name, i + 2))\n"
        f"    if i % 3: print(work({url!r}, name, i % 3))\n"
    )
    out = cluster.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=180, **in_namespace(cluster))
    assert out.returncode == 0 and "error" not in out.stdout, out.stdout + out.stderr
    logs = {port: tmp_path / f"dashboard-{port}.log" for port in (WARM_PORT, COLD_PORT)}
    servers = [serve(cluster, logs[port], "dashboard", "--port", str(port), "--read-only") for port in (WARM_PORT, COLD_PORT)]
    warm, cold = (f"http://127.0.0.1:{port}/" for port in (WARM_PORT, COLD_PORT))
    want = {name: expected(i) for i, name in enumerate(LISTS)}
    try:
        session = agent(cluster, "http", warm)["answers"][0]  # the warm one has seen every list
        assert session["status"] == 200, logs[WARM_PORT].read_text()[-3000:]
        healthy = unescape(session["body"])
        assert rows(healthy) == want and unread(healthy) == []

        view = agent(cluster, "frozen-view", url, str(cluster.pid(0)), ",".join(LISTS), warm, cold, timeout=120)
        readable = set(view["readable"])
        sessions, sessions_readable = set(view["sessions"]), set(view["readable_sessions"])
        print(f"\nnode 0 frozen: {len(readable)} of {len(LISTS)} lists, {len(sessions_readable)} of "
              f"{len(sessions)} sessions readable; first views "
              f"{[round(a['seconds'], 2) for a in view['first']]} s, then {[round(a['seconds'], 2) for a in view['again']]} s")
        assert 0 < len(readable) < len(LISTS), f"node 0 should hold some lists, not all: {sorted(readable)}"
        for which, answer, limit in (
            ("warm", view["first"][0], FIRST_VIEW_LIMIT_S), ("cold", view["first"][1], FIRST_VIEW_LIMIT_S),
            ("warm, again", view["again"][0], LATER_VIEW_LIMIT_S), ("cold, again", view["again"][1], LATER_VIEW_LIMIT_S),
        ):
            assert answer["status"] == 200, (which, answer["status"], answer["body"][-2000:])
            assert answer["seconds"] < limit, f"{which}: the page took {answer['seconds']:.1f} s"
            page = unescape(answer["body"])
            shown = rows(page)
            # The lists that answered, with their counts; the others named as not read.
            # On failure, what the dashboard said of its reads (page_partial: the first read
            # that did not answer, after which the others get 250 ms within a 2 s budget), as text:
            # a tuple's repr is cut short in pytest's report.
            log_tail = logs[WARM_PORT if which.startswith("warm") else COLD_PORT].read_text()[-3000:]
            read = {n for n, r in shown.items() if r is not None}
            said = (f"{which}: shown {shown}\nnot read: {unread(page)}\nlists a client read after the views: "
                    f"{view['readable_after']}\nthe dashboard's log:\n{log_tail}")
            if which.endswith("again"):
                # A view after a timeout gives every read 250 ms within 2 s from its first
                # timeout: on a loaded host a healthy node's list can take longer (a full
                # one-server run: 2 of 7 healthy lists read). Some shown, none of the
                # frozen node's, and every healthy one not shown named as not read.
                assert read and read <= readable, said
                assert {f"list {n}" for n in readable - read} <= set(unread(page)), said
            else:
                assert read == readable, said
            assert all(shown[n] == want[n] for n in read), (which, shown)
            # The sessions the other nodes hold (their scan needs every node), without
            # their claims (each one's index query needs every node too).
            assert "sessions" in unread(page) and "Sessions: may be incomplete — a node did not answer" in page, which
            claims = session_claims(page)
            if which.endswith("again"):
                # With the short scan limit a view gets after a timeout (1 s: the frozen
                # node's part would take the full 5 s again), a healthy node's part can
                # come too late on a loaded host (CI: 2 of its 4 sessions): some shown.
                assert claims and set(claims) <= sessions_readable, (which, claims, sessions_readable)
            else:
                assert set(claims) == sessions_readable, (which, claims, sessions_readable)
            assert set(claims.values()) == {"?"}, (which, claims)
            assert "the list of lists" in unread(page), which
            if which.startswith("warm"):
                # Every list it saw before is on it: those of the frozen node as not read.
                assert set(shown) == set(LISTS), (which, shown)
                assert {f"list {n}" for n in set(LISTS) - readable} <= set(unread(page)), (which, unread(page))
            else:
                assert set(shown) <= set(LISTS), (which, shown)

        # Resumed: whole again (the scans held back after a timeout are tried again within 10 s).
        deadline = time.monotonic() + 60
        while True:
            answers: list[dict[str, Any]] = get(cluster, warm, cold)
            pages = [unescape(a["body"]) for a in answers]
            if all(a["status"] == 200 and rows(p) == want and not unread(p)
                   and session_claims(p) == dict.fromkeys(sessions, "0") for a, p in zip(answers, pages, strict=True)):
                break
            assert time.monotonic() < deadline, f"not whole 60 s after SIGCONT: {[unread(p) for p in pages]}"
            time.sleep(1)
    finally:
        stop(*servers)
    for port, proc in zip((WARM_PORT, COLD_PORT), servers, strict=True):
        assert proc.returncode == 0, logs[port].read_text()[-3000:]
