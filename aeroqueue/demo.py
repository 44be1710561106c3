"""`make demo`: aeroqueue's job lists on the embedded store, end to end.

Generates two customer job lists as CSV files (one token store, one ID store),
loads them, lets several worker processes reserve and complete every job, and
ends with a summary. The store stays at var/demo/store.db for
`aeroqueue --url embedded://$PWD/var/demo/store.db status demo-tokens`.
"""

from __future__ import annotations

import multiprocessing as mp
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from . import udfs
from .backends import open_backend
from .lists import JobLists
from .loading import read_file, validate
from .queue import Queue
from .sessions import Session

LISTS = {"demo-tokens": ("tokens", 3000), "demo-ids": ("ids", 2000)}
WORKERS = 4


def _worker(url: str, names: list[str], out: mp.Queue) -> None:
    backend = open_backend(url)
    queue = Queue(backend)
    done = 0
    with Session.open(backend) as session:
        for name in names:
            while jobs := queue.reserve(name, session, 20):
                queue.complete_many(jobs, [{"sent_to": j.payload["email"]} for j in jobs])
                done += len(jobs)
    out.put(done)


def main(root: Path = Path("var/demo")) -> None:
    console = Console()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    url = f"embedded://{(root / 'store.db').resolve()}"
    backend = open_backend(url)
    udfs.register(backend)
    lists = JobLists(backend)
    t0 = time.perf_counter()
    for name, (mode, n) in LISTS.items():
        path = root / f"{name}.csv"
        path.write_text("id,email\n" + "".join(f"{name}-{i},customer{i}@example.com\n" for i in range(n)))
        limit = 1024 * 1024
        validate(read_file(path, max_payload=limit), str(path))
        report = lists.load(name, read_file(path, max_payload=limit), mode=mode, seal=True)
        console.print(f"loaded {report.loaded:,} jobs into [bold]{name}[/] ({mode} mode) from {path}")
    results: mp.Queue = mp.get_context("spawn").Queue()
    procs = [mp.get_context("spawn").Process(target=_worker, args=(url, list(LISTS), results)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    completions = sum(results.get() for _ in procs)
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - t0
    table = Table(title="aeroqueue demo")
    for col in ("list", "mode", "total", "done", "dead", "in flight", "complete"):
        table.add_column(col)
    for name in LISTS:
        st = lists.status(name)
        table.add_row(name, st.mode, f"{st.total:,}", f"{st.done:,}", str(st.dead), str(st.in_flight), "yes" if st.complete else "no")
    console.print(table)
    total = sum(n for _, n in LISTS.values())
    console.print(f"{completions:,} completions by {WORKERS} worker processes for {total:,} jobs "
                  f"(duplicates: {completions - total}) in {elapsed:.1f}s")
    console.print(f"store: {url}")
    console.print("[dim]coming next: heartbeat sessions that bring back a SIGKILLed worker's jobs, "
                  "and the Spark sync to MySQL[/]")


if __name__ == "__main__":
    main()
