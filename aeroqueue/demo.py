"""`make demo`: the whole mission on the embedded store, shown as it happens.

1. Two customer job lists from generated CSV files: one token store, one ID
   store (non-contiguous customer ids).
2. Worker processes with heartbeat sessions drain both lists.
3. Mid-way one worker is killed with SIGKILL; its claimed jobs come back
   when another worker reaps its session.
4. Every job is completed; the Spark job copies them to the sync target:
   the machine's MariaDB/MySQL when one answers on 127.0.0.1:3306 (as root
   without a password, database ``aeroqueue_demo``; ``AEROQUEUE_DEMO_MYSQL``
   names another), else the SQLite file var/demo/sync.db, and says which.
5. A summary: jobs, completions, recoveries, duplicates, rows synced, time.

Everything stays under var/demo/ for `aeroqueue status` and a SQL client; the
store remembers its target, so `aeroqueue --url embedded://$PWD/var/demo/store.db
sync` needs no --mysql.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from . import keys, lease_entries, udfs
from .backends import Backend, open_backend
from .config import parse_url
from .errors import SyncError
from .lists import JobLists
from .loading import Checked, read_file, validate
from .queue import Job
from .sync import Sink, parse_target, remember_demo_target

ROOT = Path("var/demo")
LISTS = {"acme-invoices": ("tokens", 4000), "globex-reminders": ("ids", 2000)}
WORKERS = 4
KILL_AT = 0.35  # share of the jobs done when a worker is killed


def handle(job: Job) -> dict:
    """The demo's handler: pretend to send a message, and log the execution."""
    log_dir = Path(os.environ.get("AEROQUEUE_DEMO_LOGS", "."))
    with open(log_dir / f"exec-{os.getpid()}.log", "a") as f:
        f.write(f"{job.list} {job.jid}\n")
    time.sleep(random.uniform(0.001, 0.003))
    return {"sent_to": job.payload.get("email"), "by": os.getpid()}


def _write_csv(path: Path, name: str, n: int, ids: bool) -> None:
    rng = random.Random(name)
    rows = ["id,email,amount"]
    used: set[int] = set()
    for i in range(n):
        if ids:  # an ID-store list: the customer's own, non-contiguous ids
            jid = rng.randrange(10**9)
            while jid in used:
                jid = rng.randrange(10**9)
            used.add(jid)
        else:
            jid = i
        rows.append(f"{name}-{jid},customer{i}@example.com,{rng.randrange(100, 99999) / 100}")
    path.write_text("\n".join(rows) + "\n")


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def _start_worker(url: str, logs: Path, n: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "aeroqueue", "--url", url, "worker", "--handler", "aeroqueue.demo:handle",
           *(arg for name in LISTS for arg in ("--list", name)), "--concurrency", "2", "--batch", "5",
           "--heartbeat", "0.5", "--expiry", "2", "--sweep-every", "10", "--until-complete", "--log-format", "json"]
    env = {**os.environ, "AEROQUEUE_DEMO_LOGS": str(logs)}
    with open(logs / f"worker-{n}.jsonl", "w") as err:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)


def _events(logs: Path) -> list[dict]:
    """The workers' JSON log events so far. A worker may be writing its last line as
    this reads: only whole lines count."""
    out = []
    for f in logs.glob("worker-*.jsonl"):
        for line in f.read_text().splitlines(keepends=True):
            if line.startswith("{") and line.endswith("\n"):
                out.append(json.loads(line))
    return out


def _done(lists: JobLists) -> int:
    return sum(lists.status(name).done for name in LISTS)


def main(root: Path = ROOT) -> None:
    console = Console()
    t0 = time.perf_counter()
    if root.exists():
        shutil.rmtree(root)
    logs = root / "logs"
    logs.mkdir(parents=True)
    store = (root / "store.db").resolve()
    url = f"embedded://{store}"
    backend = open_backend(url)
    udfs.register(backend)
    lists = JobLists(backend)
    total = sum(n for _, n in LISTS.values())
    console.rule("[bold]aeroqueue demo")

    # 1. two customer lists from CSV files
    with _progress(console) as progress:
        for name, (mode, n) in LISTS.items():
            path = root / f"{name}.csv"
            _write_csv(path, name, n, ids=mode == "ids")
            validate(functools.partial(read_file, path, max_payload=1 << 20), str(path))
            task = progress.add_task(f"loading {path.name} ({mode} store)", total=n)
            lists.load(name, Checked(read_file(path, max_payload=1 << 20)), mode=mode, seal=True,
                       progress=functools.partial(progress.advance, task))

    # 2 and 3. workers drain the lists; one is killed mid-way
    workers = [_start_worker(url, logs, n) for n in range(WORKERS)]
    victim_session, held, killed_at = _run_workers(console, backend, lists, workers, logs, total)

    # 4. the Spark sync
    target, why = _choose_target(root)
    console.print(why, highlight=False)
    remember_demo_target(parse_url(url), target)
    synced_rows, sync_note = _sync(console, url, target, {name: lists.status(name).created for name in LISTS})

    # 5. the summary
    elapsed = time.perf_counter() - t0
    events = _events(logs)
    acked = Counter(e["jid"] for e in events if e.get("event") == "job_done")
    executions = sum(1 for f in logs.glob("exec-*.log") for _ in f.read_text().splitlines())
    recovered = sum(e.get("released", 0) for e in events if e.get("event") == "reaped" and e.get("session") == victim_session)
    table = Table(title="aeroqueue demo: summary", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    done = 0
    for name in LISTS:
        st = lists.status(name)
        done += st.done
        table.add_row(f"{name} ({st.mode} store)", f"{st.done:,} of {st.total:,} done, complete: {'yes' if st.complete else 'no'}")
    table.add_row("jobs", f"{total:,}")
    # From the workers' logs: a killed worker's last accepted acks may never have been
    # logged, so this can be a few short of the done count above; the store is right.
    # Said on the row, or a reader takes the gap for lost jobs.
    unlogged = done - sum(acked.values())
    table.add_row("completions logged by workers", f"{sum(acked.values()):,}" + (
        f" ({unlogged:,} by the killed worker, not logged before it died)" if unlogged > 0 else ""))
    table.add_row("handler runs", f"{executions:,}")
    table.add_row("worker killed (SIGKILL)", f"holding {held} job(s), reaped in {killed_at:.1f}s")
    table.add_row("jobs recovered from it", f"{recovered:,}")
    swept = sum(e.get("requeued", 0) for e in events if e.get("event") == "swept")
    table.add_row("jobs it had taken, not yet claimed", f"{swept:,} (found by the sweep its reap set off)")
    table.add_row("duplicates", f"{sum(c - 1 for c in acked.values() if c > 1)}")
    table.add_row("not done", f"{total - sum(lists.status(name).done for name in LISTS)}")
    table.add_row("rows in the sync target", sync_note if synced_rows is None else f"{synced_rows:,}")
    table.add_row("elapsed", f"{elapsed:.1f}s")
    table.add_row("throughput", f"{total / elapsed:,.0f} jobs/s end to end")
    console.print(table)
    console.print(f"store:       {url}\n             aeroqueue --url {url} status {next(iter(LISTS))}", soft_wrap=True)
    _show_target(console, target)


def _show_target(console: Console, target: str) -> None:
    """Where the rows went and how to look, as str(Target) shows it: the URL may come
    from AEROQUEUE_DEMO_MYSQL with a password in it."""
    query = "select state, count(*) from aq_jobs group by state"
    t = parse_target(target)
    if t.dialect == "sqlite":
        look = f"sqlite3 {t.path} '{query}'"
    else:
        look = f"mariadb -h {t.host} -P {t.port} -u {t.user} {t.database} -e '{query}'"
    console.print(f"sync target: {t}\n             {look}", soft_wrap=True)


def _victim(backend: Backend, workers: list[subprocess.Popen], logs: Path,
            wait_s: float = 5.0) -> tuple[subprocess.Popen, str, int]:
    """The worker to kill, its session and how many jobs it holds, claimed or leased
    (a worker's batches are leased: no job record names their session): the first
    found holding some, waiting up to `wait_s` for one to. Handlers take a few ms and
    threads spend much of their time queued on the store's write lock holding
    nothing, so a kill at a random moment found one in three runs with nothing to
    give back; and a fixed worker may not have started yet on a loaded machine (a CI
    run killed one whose session it never saw, and showed no recovery)."""
    deadline = time.monotonic() + wait_s
    sessions: dict[int, str] = {}
    while True:
        if any(w.pid not in sessions for w in workers if w.poll() is None):  # the logs read again only then
            sessions = {int(e.get("pid") or 0): str(e.get("session") or "")
                        for e in _events(logs) if e.get("event") == "started"}
        running = [(w, sessions[w.pid]) for w in workers if w.poll() is None and sessions.get(w.pid)]
        for w, session in running:
            held = len(backend.find(keys.JOB_SET, "sess", session)) + _leased(backend, session)
            if held:
                return w, session, held
        if time.monotonic() >= deadline:
            w, session = running[0] if running else (workers[0], "")
            return w, session, 0
        time.sleep(0.005)


def _leased(backend: Backend, session: str) -> int:
    """How many jobs the session's leases hold not yet acknowledged (a lease's record
    keeps its tokens until all are settled: those still queued are the held ones)."""
    rec = backend.get(keys.SESS_SET, session, bins=["leases"])
    leases = lease_entries.of_record(rec.bins) if rec is not None else {}
    names = [keys.job_name(entry[0], t) for entry in leases.values() for t in lease_entries.tokens(entry)]
    recs = backend.batch_get(keys.JOB_SET, names) if names else []
    return sum(1 for r in recs if r is not None and r.bins.get("state") == "queued")


def _run_workers(
    console: Console, backend: Backend, lists: JobLists, workers: list[subprocess.Popen], logs: Path, total: int
) -> tuple[str, int, float]:
    victim_session, held, reaped_in = "", 0, 0.0
    with _progress(console) as progress:
        task = progress.add_task(f"{len(workers)} workers completing jobs", total=total)
        killed = False
        killed_time = 0.0
        while any(w.poll() is None for w in workers):
            done = _done(lists)
            progress.update(task, completed=done)
            if not killed and done >= total * KILL_AT:
                victim, victim_session, held = _victim(backend, workers, logs)
                victim.send_signal(signal.SIGKILL)
                victim.wait()
                killed, killed_time = True, time.perf_counter()
                progress.console.print(f"[red]SIGKILL[/] worker pid {victim.pid}: it held {held} claimed or leased job(s)")
            if killed and not reaped_in and victim_session and backend.get(keys.SESS_SET, victim_session) is None:
                reaped_in = time.perf_counter() - killed_time
                progress.console.print(f"[green]its session was reaped after {reaped_in:.1f}s: its jobs are back in the queue[/]")
            time.sleep(0.2)
        progress.update(task, completed=_done(lists))
    return victim_session, held, reaped_in


DEMO_DB = "aeroqueue_demo"
ENV_DEMO_MYSQL = "AEROQUEUE_DEMO_MYSQL"


def _choose_target(root: Path) -> tuple[str, str]:
    """The machine's MariaDB when it answers, else a SQLite file: (target URL, what to tell)."""
    url = os.environ.get(ENV_DEMO_MYSQL) or f"mysql://root@127.0.0.1:3306/{DEMO_DB}"
    target = parse_target(url)
    try:
        with Sink(replace(target, database="")) as admin:
            # A generated, checked name (parse_target allows [A-Za-z0-9_$] only): DDL takes no parameters.
            admin.execute(f"CREATE DATABASE IF NOT EXISTS {target.database} CHARACTER SET utf8mb4")
    except SyncError as e:
        fallback = f"sqlite://{(root / 'sync.db').resolve()}"
        return fallback, f"[yellow]no MySQL/MariaDB reachable[/] ({e}): falling back to the SQLite file {fallback}"
    return url, f"syncing into the machine's MariaDB/MySQL: {target} (set {ENV_DEMO_MYSQL} for another)"


def _sync(console: Console, url: str, target: str, stamps: dict[str, int]) -> tuple[int | None, str]:
    """Runs the sync; the rows the target holds of this run's lists (`stamps`: each
    list's stamp: the demo's database keeps the rows of earlier runs' lists too)."""
    if shutil.which("java") is None:
        return None, "skipped: Java 17 is needed for Spark"
    # The target through the environment (`sync --mysql` reads AEROQUEUE_MYSQL), not the
    # command line, which any user of the machine can read (ps) while Spark runs.
    cmd = [sys.executable, "-m", "aeroqueue", "--url", url, "sync", "--master", "local[2]", "--json"]
    with console.status("running the Spark sync (local mode)..."):
        out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "AEROQUEUE_MYSQL": target})
    if out.returncode != 0:
        console.print(f"[red]sync failed[/]: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}")
        return None, "sync failed"
    with Sink(parse_target(target)) as sink:
        ph = sink.dialect.placeholder
        rows = int(sink.execute(
            "SELECT count(*) FROM aq_jobs WHERE " + " OR ".join([f"(list = {ph} AND created = {ph})"] * len(stamps)),
            [v for item in stamps.items() for v in item],
        )[0][0])
    return rows, ""


if __name__ == "__main__":
    main()
