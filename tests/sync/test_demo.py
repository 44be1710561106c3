"""`make demo`, whole, as a user runs it: two lists loaded, workers drain them while
one is SIGKILLed, the Spark sync copies every job to MySQL, and a summary.

The summary is checked against the demo's own store and the MySQL rows, job by
job: a demo that showed "complete: yes" over a lost or doubled job would pass a
test of its table alone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from aeroqueue import demo
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists

from .helpers import root_connection

ROOT = Path(__file__).resolve().parents[2]
LISTS = {name: (mode, n // 10) for name, (mode, n) in demo.LISTS.items()}


def test_make_demo_drains_both_lists_through_a_killed_worker_and_syncs_each_job_once(
    tmp_path: Path, mysql_db: str, mysql_url: str, java: str
) -> None:
    env = {**os.environ, demo.ENV_DEMO_MYSQL: mysql_url, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    # The demo's own code, on a tenth of its jobs: whole, it takes over a minute here.
    run = f"from aeroqueue import demo; demo.LISTS = {LISTS!r}; demo.main()"
    # Run twice, as a user does: the second run's store is new (its lists another
    # stamp), its MySQL database is the first's. Its summary counted both runs' rows.
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    said = out.stdout

    # What the summary says.
    total = sum(n for _, n in LISTS.values())
    for name, (mode, n) in LISTS.items():
        assert re.search(rf"{name} \({mode} store\)\s*│\s*{n:,} of {n:,} done, complete: yes", said), said
    assert re.search(rf"rows in the sync target\s*│\s*{total:,}\s", said), said
    assert re.search(r"duplicates\s*│\s*0\s", said) and re.search(r"not done\s*│\s*0\s", said), said
    held = re.search(r"worker killed \(SIGKILL\)\s*│\s*holding (\d+) job", said)
    recovered = re.search(r"jobs recovered from it\s*│\s*(\d+)", said)
    # Not equal, necessarily: `held` is read a moment before the kill, and an ack or a
    # claim of the victim's can land in between.
    assert held and recovered and int(held[1]) > 0 and int(recovered[1]) > 0, said
    # Taken and never claimed: what only a sweep finds (one right after the reap).
    assert re.search(r"jobs it had taken, not yet claimed\s*│\s*\d+ \(found by the sweep its reap set off\)",
                     said), said

    # What the store holds: every job done, each list complete.
    lists = JobLists(open_backend(f"embedded://{tmp_path / 'var/demo/store.db'}"))
    for name, (_, n) in LISTS.items():
        st = lists.status(name)
        assert (st.done, st.total, st.complete) == (n, n, True), st

    # What MySQL holds of this run's lists: each job once, done, and a result written
    # by the handler; and as much of the first run's.
    conn = root_connection(mysql_db)
    try:
        cur = conn.cursor()
        stamps = [(name, lists.status(name).created) for name in LISTS]
        cur.execute("SELECT list, jid, state, result FROM aq_jobs WHERE "
                    + " OR ".join(["(list = %s AND created = %s)"] * len(stamps)), [v for s in stamps for v in s])
        rows = cur.fetchall()
        cur.execute("SELECT count(*) FROM aq_jobs")
        assert cur.fetchall() == [(2 * total,)], "the first run's rows stay beside them"
    finally:
        conn.close()
    assert len(rows) == total
    by_list: dict[str, set[str]] = {}
    for list_name, jid, state, result in rows:
        assert state == "done" and '"sent_to"' in str(result), (list_name, jid, state, result)
        by_list.setdefault(list_name, set()).add(bytes(jid).decode())
    assert {name: len(jids) for name, jids in by_list.items()} == {name: n for name, (_, n) in LISTS.items()}
