"""The client half of tests/multinode/test_chunk_replay.py, inside the cluster's namespace.

    python -m tests.multinode.chunk_replayer URL LIVE_URL K

ID-mode lists of K load ranges of C jobs each, so K ID-store chunks. "cg" and "cb"
test the loader's create of each chunk (load.finish_range); "dg" and "db" a
recovery's write of a chunk's `due` (finish_range, `recovered`). "*g" are written
with the loader's deadline (`Backend.job_deadline`), "*b" without one, as before the
chunk writes had one (the control: this client gives them none, as the embedded
store does). Prints "ready" once its stale client is connected (all nodes
up), then answers one command per line on stdin with one JSON line on stdout:

    prep    (all nodes up) "dg" and "db": a load whose loader dies before it
            publishes its ranges (its chunks written, a job of each with a run_at
            a day away), with no lease: recovery may finish them at once
    load    (node 0 frozen, dropped by the others) load "cg" and "cb", each
            range's chunk create sent first through the stale client, which sends
            those mastered by the frozen node there, where they wait; the loader
            repeats them through a live client, as one that has caught up does
    recover (node 0 frozen) recover "dg" and "db" the same way: each chunk's
            `due` write first through the stale client
            Then a worker (live client) reserves every job of their lists and
            completes it, which pops every chunk empty (the delayed jobs' claims
            refuse them, and they go on the schedule). Both answer the chunks
            whose write through the stale client failed (in doubt), by list, the
            jobs completed, and the seconds since the last write through the
            stale client was sent
    read    (the lists of the last load or recover) every chunk's IDs, each job's
            (state, att), the list's status; by list
    again   what the chunks still hold is handed out again, as a worker's pop does
            once the list's cursor is on such a chunk: popped, and each job
            claimed through the claim a reservation sends. Its answers, by list
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import aerospike

from aeroqueue import keys
from aeroqueue.backends import Backend, Record, open_backend, retry_in_doubt
from aeroqueue.config import parse_url
from aeroqueue.errors import BackendTimeout
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session

from .stale import stale_client

C = 4  # jobs per range: IDs per chunk
CREATES, DUES = ("cg", "cb"), ("dg", "db")
# The create of a chunk is the loader's first write to it; a recovery's `due` write
# its second, after its create found the dead loader's chunk.
NTH = {"cg": 1, "cb": 1, "dg": 2, "db": 2}
ANSWER_S = 0.1  # how long a write through the stale client is waited for: a live master answers in far less


class _Died(Exception):
    """A loader killed between writing a range's chunk and publishing the range."""


class _Routing:
    """A raw client for one list's load or recovery: the `nth` write of each of its ID
    store chunks (a put, an operate) goes through `stale` (the partition map of
    before the freeze), every other call through `live`. `dies`: publishing a range
    raises `_Died`, once `dies` chunks have been written (every range's: raised at the
    first publish, a loader's threads that had not yet begun their ranges on a loaded
    host never did, and the recovery found fewer than the test's K)."""

    def __init__(self, stale: Any, live: Any, nth: int, dies: int = 0) -> None:
        self.stale, self.live, self.nth, self.dies = stale, live, nth, dies
        self._lock = threading.Lock()
        self._writes: Counter[str] = Counter()
        self.in_doubt: list[str] = []  # chunks whose write through `stale` failed
        self._pool = ThreadPoolExecutor(32)  # the writes through `stale` in flight
        self.last_sent = 0.0  # time.monotonic() of the last write through `stale`

    def __getattr__(self, name: str) -> Any:
        return getattr(self.live, name)

    def put(self, key: tuple, *args: Any, **kw: Any) -> Any:
        return self._write("put", key, *args, **kw)

    def operate(self, key: tuple, *args: Any, **kw: Any) -> Any:
        return self._write("operate", key, *args, **kw)

    def apply(self, key: tuple, module: str, function: str, *args: Any, **kw: Any) -> Any:
        if self.dies and function == "publish":
            give_up = time.monotonic() + 60
            while len(self._writes) < self.dies and time.monotonic() < give_up:
                time.sleep(0.01)
            raise _Died(key[2])
        return self.live.apply(key, module, function, *args, **kw)

    def _write(self, method: str, key: tuple, *args: Any, **kw: Any) -> Any:
        if key[1] == keys.IDS_SET:
            with self._lock:
                self._writes[key[2]] += 1
                stale = self._writes[key[2]] == self.nth
                if stale:
                    self.last_sent = time.monotonic()
            if stale:
                # Not waited for past a live master's answer: a recovery writes its
                # chunks one after another, and the frozen node runs on resuming only
                # the calls it got in the last 3 s or so (replaying.past_deadline).
                # Given up as a timeout would be, it is in doubt, and repeated.
                sent = self._pool.submit(getattr(self.stale, method), key, *args, **kw)
                try:
                    return sent.result(timeout=ANSWER_S)
                except FutureTimeout:
                    with self._lock:
                        self.in_doubt.append(key[2])
                    raise BackendTimeout(f"{method} on {key[2]} through the stale client: no answer yet", code=9) from None
                except aerospike.exception.AerospikeError:
                    with self._lock:
                        self.in_doubt.append(key[2])
                    raise
        return getattr(self.live, method)(key, *args, **kw)


def routed(url: str, stale: Any, live: Backend, name: str, nth: int, dies: int = 0) -> tuple[JobLists, _Routing]:
    """The JobLists of list `name`'s load or recovery, and its client (`_Routing`);
    "*b" lists without a deadline."""
    client = _Routing(stale, live.client.raw, nth, dies)
    backend = Backend(client, parse_url(url))
    if name.endswith("b"):
        backend.job_deadline = lambda: None  # type: ignore[method-assign]
    return JobLists(backend), client


def specs(name: str, k: int) -> list[JobSpec]:
    # "d*": the last job of each range runs in a day (a `due` for the recovery to write).
    later = time.time() + 86_400
    return [JobSpec(f"{name}-{i}", {"i": i}, run_at=later if name.startswith("d") and i % C == C - 1 else None)
            for i in range(k * C)]


def chunk(backend: Backend, name: str, c: int) -> list[int]:
    rec = retry_in_doubt(lambda: backend.get(keys.IDS_SET, keys.chunk_name(name, c)), deadline_s=30)
    return list(rec.bins["ids"]) if rec is not None else []


def finish(cmd: str, name: str, lists: JobLists, k: int) -> None:
    """Load list `name` ("load"), or recover its ranges ("recover")."""
    if cmd == "load":
        lists.load(name, specs(name, k), mode="ids", chunk_size=C, workers=k)
    else:
        assert lists.recover(name) == k


def job(live: Backend, name: str, t: int) -> Record | None:
    return retry_in_doubt(lambda: live.get(keys.JOB_SET, keys.job_name(name, t)), deadline_s=30)


def work(live: Backend, names: tuple[str, ...]) -> dict[str, list[str]]:
    """Every job of the lists reserved and completed: their chunks popped empty."""
    queue = Queue(live, busy_deadline_s=30)
    sess = Session.open(live, heartbeat=False, interval_s=10, expiry_s=600)
    done: dict[str, list[str]] = {}
    for name in names:
        done[name] = []
        while jobs := queue.reserve(name, sess, 100):
            for job in jobs:
                queue.complete(job, "ok")
                done[name].append(job.jid)
    return done


def main(url: str, live_url: str, k: int) -> None:
    stale = stale_client(url)  # its map names node 0, which is up
    print(json.dumps("ready"), flush=True)
    live: Backend | None = None
    names: tuple[str, ...] = ()  # the lists of the last "load" or "recover"
    for line in sys.stdin:
        cmd = line.strip()
        out: Any
        if cmd == "prep":
            for name in DUES:
                lists, _ = routed(url, stale, open_backend(live_url), name, 0, dies=k)  # nothing through `stale`
                try:
                    lists.load(name, specs(name, k), mode="ids", chunk_size=C, workers=k, lease_ms=0)
                    raise AssertionError(f"the loader of {name!r} published a range")
                except _Died:
                    pass
            out = "ok"
        elif cmd in ("load", "recover"):
            # Seeded with the live nodes only, after the freeze: its map never names the frozen node.
            live = open_backend(live_url)
            names = CREATES if cmd == "load" else DUES
            runs = [routed(url, stale, live, name, NTH[name]) for name in names]

            with ThreadPoolExecutor(len(names)) as pool:
                list(pool.map(finish, [cmd] * len(names), names, [lists for lists, _ in runs], [k] * len(names)))
            done = work(live, names)
            out = {"in_doubt": {name: sorted(int(c.rsplit("/", 1)[1]) for c in client.in_doubt)
                                for name, (_, client) in zip(names, runs, strict=True)},
                   "since_sent_s": time.monotonic() - max(client.last_sent for _, client in runs), "done": done}
        elif cmd == "read":
            assert live is not None
            out = {}
            for name in names:
                jobs = [job(live, name, t) for t in range(k * C)]
                st = JobLists(live).status(name)
                out[name] = {"chunks": [chunk(live, name, c) for c in range(k)],
                             "jobs": [[r.bins.get("state"), r.bins.get("att")] if r else None for r in jobs],
                             "status": [st.total, st.done, st.complete]}
        elif cmd == "again":
            assert live is not None
            sess = Session.open(live, heartbeat=False, interval_s=10, expiry_s=600)
            out = {}
            for name in names:
                answers: Counter[str] = Counter()
                for c in range(k):
                    got = live.apply(keys.IDS_SET, keys.chunk_name(name, c), keys.IDS_MOD, "pop", C,
                                     live.job_deadline())
                    for t in got:
                        claim = live.apply(keys.JOB_SET, keys.job_name(name, t), keys.JOB_MOD, "claim", sess.id,
                                           uuid.uuid4().hex, 300_000, live.job_deadline())
                        answers[claim["st"]] += 1
                out[name] = dict(answers)
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
