"""The client half of tests/multinode/test_ids_replay.py, inside the cluster's namespace.

    python -m tests.multinode.ids_replayer URL LIVE_URL K

Four ID-mode lists of K chunks of C IDs each: "pg", "pb" (popped), "rg", "rb" (an
ID removed, as a kick does); "*g" get the call with its deadline
(`Backend.job_deadline`), "*b" without one, as before the ID store had one (the
control). One command per line on stdin, one JSON answer per line on stdout:

    prep    (all nodes up) load the lists
    stale   (node 0 frozen, dropped by the others) one attempt per chunk, all at once:
            pop 1 from every chunk of "p*", remove its last ID from every chunk of
            "r*". The chunks whose call failed (in doubt: their master is the frozen
            node), by list
    live    through a new client seeded with LIVE_URL (the live nodes), for each of
            those chunks the call did not reach: the call again, then a worker pops
            one more ID. The chunks so popped, by list, with what is left in each
    read    every chunk's IDs, by list
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aeroqueue import keys
from aeroqueue.backends import Backend, open_backend, retry_in_doubt
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec

from .stale import in_doubt, stale_backend

LISTS = ("pg", "pb", "rg", "rb")
C = 4  # IDs per chunk


def call(backend: Backend, name: str, c: int, deadline: int | None) -> Any:
    chunk = keys.chunk_name(name, c)
    if name.startswith("p"):
        return backend.apply(keys.IDS_SET, chunk, keys.IDS_MOD, "pop", 1, deadline)
    return backend.apply(keys.IDS_SET, chunk, keys.IDS_MOD, "remove", [c * C + C - 1], deadline)


def ids(backend: Backend, name: str, c: int) -> list[int]:
    rec = retry_in_doubt(lambda: backend.get(keys.IDS_SET, keys.chunk_name(name, c)), deadline_s=30)
    return list(rec.bins["ids"])


def redo(live: Backend, name: str, c: int) -> list[int] | None:
    """The call again on the live nodes, where it did not land, then one more pop.
    What is left in the chunk; None: the call had landed."""
    if len(ids(live, name, c)) < C:
        return None  # it landed (its master lives; the frozen node held its replica)
    call(live, name, c, None)
    live.apply(keys.IDS_SET, keys.chunk_name(name, c), keys.IDS_MOD, "pop", 1)
    return ids(live, name, c)


def main(url: str, live_url: str, k: int) -> None:
    # Learns the partition map once (no tending for an hour): its calls go to the
    # frozen node, as those of a client that has not learnt yet that it is gone.
    backend = stale_backend(url)
    doubted: dict[str, list[int]] = {}
    live: Backend | None = None
    out: Any
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "prep":
            for name in LISTS:
                JobLists(backend).load(name, [JobSpec(f"{name}-{i}", i) for i in range(k * C)], mode="ids",
                                       chunk_size=C, seal=True)
                assert [ids(backend, name, c) for c in range(k)] == [list(range(c * C, c * C + C)) for c in range(k)]
            out = "ok"
        elif cmd == "stale":
            doubted = in_doubt(
                lambda name, c: call(backend, name, c, backend.job_deadline() if name.endswith("g") else None), LISTS, k)
            out = doubted
        elif cmd == "live":
            live = open_backend(live_url)
            calls = [(live, name, c) for name in LISTS for c in doubted[name]]
            with ThreadPoolExecutor(16) as pool:
                left = list(pool.map(lambda x: redo(*x), calls))
            out = {name: {c: got for (_, nm, c), got in zip(calls, left, strict=True) if nm == name and got is not None}
                   for name in LISTS}
        elif cmd == "read":
            assert live is not None
            out = {name: {c: ids(live, name, c) for c in range(k)} for name in LISTS}
        else:
            raise SystemExit(f"unknown command {cmd!r}")
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
