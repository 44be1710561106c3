"""The regular sweep is the store's, not each worker's: one worker at a time wins the
sweep gate (`sessions.claim_sweep`), so the job set is scanned about once per
--sweep-every whatever the number of workers. Without it, 100 workers on a million
jobs scanned the store every 3 s. On both stores."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from aeroqueue import keys
from aeroqueue import worker as worker_module
from aeroqueue.backends import open_backend
from aeroqueue.loading import JobSpec
from aeroqueue.sessions import (
    Session,
    SweepReport,
    claim_sweep,
    claim_sweep_after,
    reap,
    sweep_gate_wait,
)
from aeroqueue.worker import EXIT_OK, POST_REAP_SETTLE_S, Worker
from tests.sessions.test_worker import running
from tests.waiting import wait_for

THREADS = 8
TRIES = 20  # claims each thread sends in a round


def _race(store_url: str, gate: str, every_s: float) -> list[str]:
    """THREADS threads, each on a connection of its own as separate workers are, all
    claiming the gate TRIES times as fast as they can: the holders of the wins."""
    backends = [open_backend(store_url) for _ in range(THREADS)]
    start = threading.Barrier(THREADS)
    wins: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(i: int) -> None:
        try:
            start.wait(10)
            for _ in range(TRIES):
                if claim_sweep(backends[i], every_s, f"t{i}", gate=gate):
                    with lock:
                        wins.append(f"t{i}")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for b in backends:
            b.close()
    assert not errors, errors
    return wins


def test_the_sweep_gate_is_won_once_an_interval_under_concurrency(registered, store_url):
    gate = f"test-{uuid.uuid4().hex[:12]}"  # not the workers' gate: another test's workers never touch it
    every_s = 2.0
    try:
        # A missing gate is created by one claim; the others find it too young.
        first = _race(store_url, gate, every_s)
        assert len(first) == 1, f"{len(first)} winners of one interval: {first}"
        rec = registered.get(keys.LOCK_SET, gate)
        assert rec is not None and rec.gen == 1 and rec.bins["sess"] == first[0], rec
        # Closed for the rest of the interval, by the server's clock.
        wait = sweep_gate_wait(registered, every_s, gate=gate)
        assert 0 < wait <= every_s, wait
        time.sleep(wait + 0.05)
        # Open again: one winner again, out of THREADS * TRIES claims.
        second = _race(store_url, gate, every_s)
        assert len(second) == 1, f"{len(second)} winners of one interval: {second}"
        assert registered.get(keys.LOCK_SET, gate).gen == 2
    finally:
        registered.remove(keys.LOCK_SET, gate)


WORKERS = 5
EVERY_S = 1.0
RUN_S = 5.0


def test_workers_sweep_the_store_about_once_an_interval_not_once_each(registered, store_url, lists, list_name,
                                                                       monkeypatch):
    """WORKERS workers sweeping every second, for RUN_S seconds: a sweep gated per store
    runs about RUN_S times in all (at most one a second, by the gate's own check; a
    reap that ends some other test's dead session on the shared server adds one); a
    sweep per worker ran about WORKERS * RUN_S times (25 here)."""
    real_sweep = worker_module.sweep
    swept: list[float] = []
    count_lock = threading.Lock()

    def counting_sweep(*args: Any, **kwargs: Any) -> SweepReport:
        with count_lock:
            swept.append(time.monotonic())
        return real_sweep(*args, **kwargs)

    monkeypatch.setattr(worker_module, "sweep", counting_sweep)
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    backends = [open_backend(store_url) for _ in range(WORKERS)]
    workers = [
        Worker(b, lambda job: None, [list_name], interval_s=0.2, expiry_s=2.0, idle_s=0.05, sweep_every_s=EVERY_S)
        for b in backends
    ]
    codes: list[int] = []
    threads = [threading.Thread(target=lambda w=w: codes.append(w.run(install_signals=False))) for w in workers]
    try:
        for t in threads:
            t.start()
        time.sleep(RUN_S)
    finally:
        for w in workers:
            w.request_stop()
        for t in threads:
            t.join(30)
        for b in backends:
            b.close()
    assert codes == [EXIT_OK] * WORKERS, codes
    # Wide margins: about 5 expected, 25 without the gate.
    assert 2 <= len(swept) <= 9, f"{len(swept)} sweeps by {WORKERS} workers in {RUN_S:g} s, every {EVERY_S:g} s"


def test_a_sweep_after_a_reap_is_served_by_one_begun_since_with_no_longer_a_grace(registered):
    """`claim_sweep_after`: the sweep a reap sets off is needed unless a sweep through
    the gate began after the reap, with a grace no longer than its own (a shorter grace
    finds more)."""
    gate = f"test-gate-{uuid.uuid4().hex[:8]}"
    try:
        assert claim_sweep_after(registered, 60_000, 2_000, "a", gate=gate)  # no gate yet: needed
        # A sweep with grace 2 s began just now, after a reap 60 s ago:
        assert not claim_sweep_after(registered, 60_000, 2_000, "b", gate=gate)  # same grace: served
        assert not claim_sweep_after(registered, 60_000, 5_000, "b", gate=gate)  # longer: served
        assert claim_sweep_after(registered, 60_000, 1_000, "b", gate=gate)  # shorter: needed, and now the gate's
        assert registered.get(keys.LOCK_SET, gate).bins["grace"] == 1_000
        time.sleep(0.05)
        assert claim_sweep_after(registered, 0, 1_000, "c", gate=gate)  # the reap ended after that sweep began
        # The regular sweep's claim records its grace too.
        time.sleep(0.01)
        assert claim_sweep(registered, 0, "d", grace_ms=60_000, gate=gate)
        assert claim_sweep_after(registered, 60_000, 30_000, "e", gate=gate)
        # A gate written by a release before grace bins: its grace is unknown.
        registered.remove(keys.LOCK_SET, gate)
        registered.put(keys.LOCK_SET, gate, {"sess": "old"})
        assert claim_sweep_after(registered, 60_000, 60_000, "f", gate=gate)
    finally:
        registered.remove(keys.LOCK_SET, gate)


@contextlib.contextmanager
def reaping_a_dead_session(registered: Any, lists: Any, list_name: str) -> Iterator[None]:
    """Inside the block a worker runs on a list of one job, and has reaped a session
    with a 1 s expiry that never beat (the sweep after that reap: half of it, 500 ms)."""
    lists.load(list_name, [JobSpec("j", {})], seal=True)
    dead = Session.open(registered, heartbeat=False, interval_s=0.25, expiry_s=1.0)
    w = Worker(registered, lambda job: None, [list_name], interval_s=0.5, expiry_s=2.0)
    with running(w):
        wait_for("the dead session reaped", lambda: registered.get(keys.SESS_SET, dead.id) is None, 20)
        yield


@pytest.mark.parametrize("theirs_ms,expected", [(500, 0), (600_000, 1)],
                         ids=["no longer a grace: served", "a longer grace (the control): swept"])
def test_a_workers_sweep_after_a_reap_is_skipped_when_another_began_since(registered, lists, list_name, monkeypatch,
                                                                          no_marks, theirs_ms, expected):
    """A host's processes dying together are reaped by several workers, each of which
    swept right after: as many scans of the store. Here another worker's sweep begins
    just after this worker's reap (written on the gate as it would be): with a grace no
    longer than this one's it serves it, and this worker does not scan; with a longer
    one (the control) this worker sweeps."""
    real_reap = worker_module.Worker._reap
    swept: list[int] = []
    others: list[int] = []

    def counting_sweep(*_: Any, grace_ms: int, **__: Any) -> SweepReport:
        swept.append(grace_ms)
        return SweepReport(0, 0, 0, 0)

    def reap_then_another_sweeps(self: Worker, *args: Any, **kwargs: Any) -> Any:
        out = real_reap(self, *args, **kwargs)
        if out[0].ended:
            # Begun well after the reap: the claim's own way to the store (a loaded
            # machine's, seconds) makes the reap look that much older.
            time.sleep(0.5)
            assert claim_sweep(registered, 0, "another worker", grace_ms=theirs_ms)
            others.append(theirs_ms)
        return out

    monkeypatch.setattr(worker_module, "sweep", counting_sweep)
    monkeypatch.setattr(worker_module.Worker, "_reap", reap_then_another_sweeps)
    with reaping_a_dead_session(registered, lists, list_name):
        wait_for("the other worker's sweep", lambda: others, 10)
        time.sleep(POST_REAP_SETTLE_S + 1.5)
    # Half the dead session's expiry, below this worker's own grace: the reap's sweep.
    assert swept == [500] * expected, swept


def test_the_sweep_after_a_reap_survives_a_failed_orphan_check(registered, lists, list_name, monkeypatch, no_marks):
    """The orphan check runs after the reap in the reaper's thread (`Worker._reap`): a
    query of the session's claims, which the store refuses now and then while partitions
    migrate. Raising there failed the whole task, and the reap's report with it: the
    session it ended was never swept after, and its process's taken, never claimed jobs
    waited for the regular sweep (minutes)."""
    swept: list[int] = []

    def counting_sweep(*_: Any, grace_ms: int, **__: Any) -> SweepReport:
        swept.append(grace_ms)
        return SweepReport(0, 0, 0, 0)

    def failing_check(self: Worker, session: Session) -> None:
        raise worker_module.AeroqueueError("partition unavailable (a test's orphan check)")

    monkeypatch.setattr(worker_module, "sweep", counting_sweep)
    monkeypatch.setattr(worker_module.Worker, "_release_orphans", failing_check)
    with reaping_a_dead_session(registered, lists, list_name):
        wait_for("the sweep after the reap", lambda: swept, POST_REAP_SETTLE_S + 5)
    assert swept[0] == 500, swept  # half the dead session's expiry


def refuse_recount_after_the_first(monkeypatch: pytest.MonkeyPatch, dead: list[Session], error: Exception) -> None:
    """Of the `dead` sessions, a reap ends whichever it reaches first; the recount of
    any other raises `error`. Other sessions (other tests' on a shared server) are
    recounted as usual. Undone by `monkeypatch`."""
    import aeroqueue.sessions as sessions_mod

    ours, first = {d.id for d in dead}, []
    recount = sessions_mod.recount_session

    def refused_after_the_first(b: Any, session_id: str) -> None:
        if session_id in ours:
            first[:] = first or [session_id]
            if session_id != first[0]:
                raise error
        recount(b, session_id)

    monkeypatch.setattr(sessions_mod, "recount_session", refused_after_the_first)


def test_the_sweep_after_a_reap_that_failed_part_way(registered, lists, list_name, monkeypatch, no_marks):
    """A reap that fails after it ended a session (here: the next session's recount,
    refused): that session is gone, so no later reap sets off its sweep, and its
    process's taken, never claimed jobs waited for the regular sweep (minutes)."""
    swept: list[int] = []

    def counting_sweep(*_: Any, grace_ms: int, **__: Any) -> SweepReport:
        swept.append(grace_ms)
        return SweepReport(0, 0, 0, 0)

    lists.load(list_name, [JobSpec("j", {})], seal=True)
    dead = [Session.open(registered, heartbeat=False, interval_s=0.25, expiry_s=1.0) for _ in range(2)]
    refuse_recount_after_the_first(monkeypatch, dead, worker_module.AeroqueueError("partition unavailable (a test's recount)"))
    monkeypatch.setattr(worker_module, "sweep", counting_sweep)
    w = Worker(registered, lambda job: None, [list_name], interval_s=0.5, expiry_s=2.0)
    try:
        with running(w):
            wait_for("a dead session reaped", lambda: any(registered.get(keys.SESS_SET, d.id) is None for d in dead), 20)
            wait_for("the sweep after the reap", lambda: swept, POST_REAP_SETTLE_S + 5)
        assert swept[0] == 500, swept  # half the dead session's expiry
        assert sum(registered.get(keys.SESS_SET, d.id) is not None for d in dead) == 1, "the other left to a later reap"
    finally:
        # None left behind for a later test's reap to end (its sweep's grace would be ours).
        monkeypatch.undo()
        reap(registered)
