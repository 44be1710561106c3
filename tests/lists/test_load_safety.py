"""Loading with several ranges in flight stays as safe as one at a time (design.md
invariant 4, issue 19): a killed loader leaves no reservable job unwritten, a
re-run adds nothing twice, a failed range is left for recovery."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from aeroqueue import errors, keys, load, sessions, udfs
from aeroqueue.backends import open_backend
from aeroqueue.cli import main
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from tests.waiting import ModuleTime, wait_for

_REGISTERED: set[str] = set()


@pytest.fixture
def env(store_url):
    """(backend, lists, queue, session), the modules registered once per run on a real server."""
    b = open_backend(store_url)
    if b.is_embedded or store_url not in _REGISTERED:
        udfs.register(b)
        _REGISTERED.add(store_url)
    s = Session.open(b, heartbeat=False)
    yield b, JobLists(b), Queue(b), s
    s.close()
    b.close()


def specs(n: int, prefix: str = "j") -> list[JobSpec]:
    return [JobSpec(f"{prefix}{i}", {"i": i}) for i in range(n)]


def drain_all(queue: Queue, name: str, session: Session) -> list:
    got = []
    while batch := queue.reserve(name, session, 200):
        got.extend(batch)
    return got


def test_ranges_in_flight_publish_every_job_once(env, list_name):
    _, lists, queue, session = env
    report = lists.load(list_name, specs(700), chunk_size=9, workers=4)
    assert (report.loaded, report.skipped, report.voided) == (700, 0, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (700, 700, 0)
    head = lists.header(list_name)
    assert head["tail"] == head["alloc"] == 700
    jobs = drain_all(queue, list_name, session)
    by_token = [j.jid for j in sorted(jobs, key=lambda j: j.token)]
    assert by_token == [s.jid for s in specs(700)], "tokens follow the input's order, whatever the threads"
    assert all(j.payload == {"i": int(j.jid[1:])} for j in jobs)
    # A re-run, also with ranges in flight, adds nothing.
    again = lists.load(list_name, specs(700), chunk_size=9, workers=4)
    assert (again.loaded, again.skipped) == (0, 700)
    assert lists.status(list_name).total == 700


def test_a_failed_range_among_many_is_left_for_recovery(tmp_path, list_name):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(backend)
    lists, queue = JobLists(backend), Queue(backend)
    lists.write_retry_s = 0.3  # a failure that lasts: the index write of one job keeps timing out
    backend.client.faults.add(op="batch_write", key=f"{list_name}/j57", error="TimeoutError", times=-1)
    with pytest.raises(errors.LoadAbandoned):
        lists.load(list_name, specs(200), chunk_size=10, workers=3, lease_ms=0)
    backend.client.faults.clear()
    session = Session.open(backend, heartbeat=False)
    # Whatever was published before the failure is whole: each reservable token has its job.
    early = drain_all(queue, list_name, session)
    assert all(j.jid is not None and j.payload is not None for j in early)
    lists.load(list_name, specs(200), chunk_size=10, workers=3, lease_ms=0)  # recovers, then loads the rest
    jobs = early + drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(s.jid for s in specs(200)), "every job exactly once"
    st = lists.status(list_name)
    assert (st.total, st.pending_ranges) == (200, 0)


_LOADER = """
import sys
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
b = open_backend(sys.argv[1])
jobs = (JobSpec(f"k{i}", {"i": i}) for i in range(int(sys.argv[3])))
JobLists(b).load(sys.argv[2], jobs, chunk_size=int(sys.argv[5]) if len(sys.argv) > 5 else 50, workers=4,
                 lease_ms=int(sys.argv[4]))
"""


@pytest.mark.slow
def test_a_killed_loader_exposes_nothing_unwritten_and_a_rerun_adds_nothing_twice(env, list_name):
    backend, lists, queue, session = env
    n, lease_ms = 20_000, 1500
    proc = subprocess.Popen([sys.executable, "-c", _LOADER, str(backend.url), list_name, str(n), str(lease_ms)],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rec = backend.get(keys.LIST_SET, list_name)
            if rec is not None and rec.bins["tail"] >= 2000:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the loader published nothing in 60 s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    head = lists.header(list_name)
    assert head["tail"] < n, "killed mid-load"
    # Every token reservable now has its job record.
    early = drain_all(queue, list_name, session)
    assert early, "what was published before the kill is reservable"
    assert all(j.jid is not None and j.payload == {"i": int(j.jid[1:])} for j in early)
    # Run again at once: the dead loader's ranges are recovered as their leases run
    # out (the re-run's own ranges wait behind them), and the re-run returns with
    # every job reservable, not "loaded" and held back for a lease's length.
    report = lists.load(list_name, (JobSpec(f"k{i}", {"i": i}) for i in range(n)), chunk_size=500, workers=4,
                        lease_ms=lease_ms)
    assert report.loaded + report.skipped >= n - report.voided
    assert report.waiting == 0
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (n, n - len(early), 0)
    jobs = early + drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(f"k{i}" for i in range(n)), "every job exactly once"
    st = lists.status(list_name)
    assert (st.total, st.pending_ranges) == (n, 0)
    # Acknowledged in batches: closing the session would give back 20,000 claims one
    # by one (a minute of the suite on a loaded machine).
    for i in range(0, n, 1000):
        assert queue.complete_many(jobs[i:i + 1000]) == []


# A loader that stops once its range's job records are written, before their index:
# the test SIGKILLs it there. Its jobs are delayed a moment (wide enough for a loaded
# machine to write them before they are due), so a sweep soon finds them due.
_STOPS_BEFORE_INDEX = """
import sys, time
from aeroqueue import load
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec

def stop_here(*args, **kwargs):
    print("written", flush=True)
    time.sleep(600)

load.commit_index = stop_here
due = time.time() + float(sys.argv[3])
JobLists(open_backend(sys.argv[1])).load(
    sys.argv[2], [JobSpec(f"d{i}", {"i": i}, None, due) for i in range(4)], lease_ms=int(sys.argv[4]))
"""


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_a_sweep_never_offers_delayed_jobs_of_a_range_not_yet_published(env, list_name, mode):
    """A loader SIGKILLed after writing delayed jobs, before their index: the range is
    not published, so those records are no jobs of the list yet. Once they are due, a
    sweep (here with a short grace, as after a reap) must leave them alone: offered,
    they ran, the load run again gave each id a token of its own, which ran too, and
    the recovered range voided the first while its holder still ran it."""
    backend, lists, queue, session = env
    lists.create(list_name, mode=mode)
    # Due a while after the loader's alloc, its lease (from that alloc) 3 s after that:
    # the sweep looks at them due, the range still unpublished.
    due_in_s, lease_ms = 1.5, 4500
    proc = subprocess.Popen([sys.executable, "-c", _STOPS_BEFORE_INDEX, str(backend.url), list_name, str(due_in_s),
                             str(lease_ms)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "written\n", "the loader did not get to its index"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    written = backend.batch_get(keys.JOB_SET, [keys.job_name(list_name, t) for t in range(4)])
    assert [r.bins["state"] if r else None for r in written] == ["delayed"] * 4, "the test needs delayed records"
    due_s = max(r.bins["due"] for r in written) / 1000
    time.sleep(max(0.0, due_s - time.time()) + 0.4)
    sessions.sweep(backend, grace_ms=300)  # (on a shared store, other tests' lists too)
    # (Its lease run out before the sweep got to the list, the sweep recovers the range:
    # its jobs are the list's then, and handed out. Not what this test is about.)
    assert lists.status(list_name).pending_ranges == 1, "the test needs the range unpublished after the sweep"
    assert not lists.header(list_name).get("retry"), "the sweep offered jobs of an unpublished range"
    assert queue.reserve(list_name, session, 10) == [], "a job of an unpublished range was handed out"
    # Run again (the dead loader's range recovered once its lease runs out): each job once.
    lists.load(list_name, [JobSpec(f"d{i}", {"i": i}) for i in range(4)], lease_ms=lease_ms)
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(f"d{i}" for i in range(4)), "every job exactly once"
    assert queue.complete_many(jobs) == []
    lists.seal(list_name)
    st = lists.status(list_name)
    assert (st.done, st.total, st.complete) == (4, 4, True), st


def test_a_kick_leaves_alone_a_delayed_job_of_a_range_not_yet_published(env, list_name):
    """An operator's kick of a token (or of a job id already indexed) of a range still
    loading: no job of the list yet, so it is left alone, as a token never allocated."""
    backend, lists, queue, session = env
    lists.load(list_name, specs(2, "a"))
    # A loader's range of 3, written as delayed jobs, not published (its lease long).
    assert lists._list_udf(list_name, "alloc", 3, 60_000, "stopped-loader")["st"] == "ok"
    later = int(time.time() * 1000) + 60_000
    for t in range(2, 5):
        backend.put(keys.JOB_SET, keys.job_name(list_name, t),
                    {"list": list_name, "token": t, "jid": f"d{t}", "state": "delayed", "due": later, "att": 0})
    assert lists.kick(list_name, [2, 3, 4]) == 0
    # By its job id, once the loader indexed it.
    created = lists.header(list_name)["created"]
    backend.put(keys.JIDX_SET, keys.jidx_name(list_name, "d2"), {"tok": 2, "c": created, "l": list_name})
    assert lists.kick_job(list_name, "d2") is False
    assert not lists.header(list_name).get("retry")
    assert [j.jid for j in queue.reserve(list_name, session, 10)] == ["a0", "a1"]


def test_export_leaves_out_the_records_of_a_range_not_yet_published(env, list_name):
    """A killed loader's range, written and not published: its records are no jobs of
    the list (a load run again writes the same ids at tokens of their own), so an
    export shows the list's jobs once each, as many as its status counts."""
    backend, lists, _, _ = env
    lists.load(list_name, specs(2, "a"))
    assert lists._list_udf(list_name, "alloc", 3, 60_000, "killed-loader")["st"] == "ok"
    for t, jid in zip(range(2, 5), ["a0", "x1", "x2"], strict=True):
        backend.put(keys.JOB_SET, keys.job_name(list_name, t),
                    {"list": list_name, "token": t, "jid": jid, "state": "queued", "att": 0})
    out = io.StringIO()
    assert lists.export(list_name, out) == 2
    exported = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(j["jid"], j["token"]) for j in exported] == [("a0", 0), ("a1", 1)]
    assert lists.status(list_name).total == len(exported)


def test_void_tokens_are_not_counted_as_reservable(env, list_name):
    """A loader that died before writing its range leaves tokens that a recovery makes
    void: the token store still hands them out (their claim refuses them), but no job
    waits there, and `status` must not count one (it did: reservable 15 of 10 jobs)."""
    _, lists, queue, session = env
    lists.load(list_name, specs(3, "a"))
    # A loader that took a range of 5 and died before writing any of it (lease: 0 ms).
    assert lists._list_udf(list_name, "alloc", 5, 0, "dead-loader")["st"] == "ok"
    report = lists.load(list_name, specs(10))  # recovers the dead range first: 5 void tokens
    assert report.loaded == 10
    # Stamped with the list, as the loader's creates are (with their deadline, on a server).
    voids = lists.backend.batch_get(keys.JOB_SET, [keys.job_name(list_name, t) for t in range(3, 8)])
    created = lists.header(list_name)["created"]
    assert [(r.bins["state"], r.bins.get("c")) for r in voids] == [("void", created)] * 5  # type: ignore[union-attr]
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.in_flight, st.pending_ranges) == (13, 13, 0, 0)
    got = queue.reserve(list_name, session, 6)  # the 3 jobs of "a", then 5 voids skipped, then 3 more
    assert [j.jid for j in got] == ["a0", "a1", "a2", "j0", "j1", "j2"]
    st = lists.status(list_name)
    assert (st.reservable, st.in_flight) == (7, 6)
    queue.complete_many(got, ["ok"] * 6)
    st = lists.status(list_name)
    assert (st.reservable, st.in_flight, st.done) == (7, 0, 6)


def test_tokens_of_ids_another_loader_indexed_first_are_not_counted_as_reservable(env, list_name):
    """Two loaders of the same ids at once: the second's tokens whose id the first
    indexed first are made void (load.commit_index), as a racing load makes them."""
    backend, lists, _, _ = env
    lists.load(list_name, specs(3, "a"))
    start = lists._list_udf(list_name, "alloc", 3, 60_000, "second-loader")["start"]
    pairs = [(start, "a0"), (start + 1, "a1"), (start + 2, "b0")]
    for t, jid in pairs:
        backend.put(keys.JOB_SET, keys.job_name(list_name, t), {"list": list_name, "token": t, "jid": jid, "state": "queued"})
    real = load.commit_index(lists, list_name, lists.header(list_name)["created"], pairs)
    assert real == [start + 2]
    load.finish_range(lists, list_name, "tokens", lists.header(list_name)["seq"] - 1, real)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.in_flight, st.pending_ranges) == (4, 4, 0, 0)


def test_a_load_behind_a_dead_loaders_range_finishes_it_and_returns_reservable(env, list_name):
    _, lists, _, _ = env
    # A loader that took a range and died: its lease (1.5 s) is never renewed.
    lists.create(list_name)
    assert lists._list_udf(list_name, "alloc", 5, 1500, "dead")["st"] == "ok"
    t0 = time.monotonic()
    report = lists.load(list_name, specs(10))
    waited = time.monotonic() - t0
    assert (report.loaded, report.waiting) == (10, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (10, 10, 0)
    assert waited >= 1.0, "it waited for the dead loader's lease, not less"


class _DiesBeforePublishing(BaseException):
    """A kill: not an error the loader handles (it would give its range's lease up,
    `_RangeLoader._release`), a stop that runs none of its code."""


def _indexed_not_published(lists: JobLists, name: str, jobs: list[JobSpec], lease_ms: int, monkeypatch) -> None:
    """A loader that wrote and indexed `jobs` (committed) and died before publishing them."""
    real = JobLists._list_udf

    def udf(self: JobLists, list_name: str, function: str, *args, **kw):
        if function == "publish":
            raise _DiesBeforePublishing
        return real(self, list_name, function, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(JobLists, "_list_udf", udf)
        with pytest.raises(_DiesBeforePublishing):
            lists.load(name, jobs, lease_ms=lease_ms, workers=1)


def test_a_load_whose_jobs_a_dead_loader_indexed_waits_for_them_to_be_reservable(env, list_name, monkeypatch):
    """Run again after loaders killed past their index writes, a load found every job
    indexed, loaded none, and returned (and sealed) at once while the dead loader's
    ranges, their leases still running, held the jobs unpublished: 86,000 of 200,000
    reservable (a helper's crash audit). It waits for them as for its own."""
    _, lists, _, _ = env
    lists.create(list_name)
    _indexed_not_published(lists, list_name, specs(10), 1500, monkeypatch)
    st = lists.status(list_name)
    assert (st.total, st.pending_ranges) == (0, 1), "the test needs the jobs indexed, not published"
    # Whether a load waited a step for a range is seen, not guessed from how long it
    # took (on a loaded machine, a load with nothing to wait for may take over a second).
    clock = ModuleTime()
    monkeypatch.setattr(load, "time", clock)
    t0 = time.monotonic()
    report = lists.load(list_name, specs(10), seal=True)
    assert (report.loaded, report.skipped, report.waiting) == (0, 10, 0)
    assert time.monotonic() - t0 >= 1.0 and load.AWAIT_STEP_S in clock.slept, "it waited for the dead loader's lease"
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges, st.sealed) == (10, 10, 0, True)
    # Run again once they are: nothing to wait for.
    clock.slept.clear()
    assert lists.load(list_name, specs(10)).skipped == 10
    assert clock.slept == [], "it waited"


def test_a_load_whose_jobs_a_live_loader_indexed_reports_them_waiting(env, list_name, monkeypatch):
    _, lists, _, _ = env
    lists.create(list_name)
    lease_ms = 1200
    _indexed_not_published(lists, list_name, specs(4), lease_ms, monkeypatch)
    with _renewed(lists, list_name, next(iter(lists.header(list_name)["pend"])), lease_ms):
        report = lists.load(list_name, specs(10), lease_ms=lease_ms)
    assert (report.loaded, report.skipped, report.waiting) == (6, 4, 10), "all ten behind the live range"


@contextlib.contextmanager
def _renewed(lists: JobLists, name: str, seq: int, lease_ms: int) -> Iterator[None]:
    """Range `seq`'s lease renewed as its loader would, every quarter lease: a live loader."""
    stop = threading.Event()

    def live_loader() -> None:
        while not stop.wait(lease_ms / 4000):
            lists._list_udf(name, "renew", [seq], lease_ms)

    t = threading.Thread(target=live_loader, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def test_a_hold_credited_while_a_load_waits_for_a_dead_loaders_range_is_no_renewal(env, list_name):
    """An embedded store's long hold (250 ms or more, common on a loaded machine) moves
    every unpublished lease later (aq_list_v1 `credit`). The load waiting behind a dead
    loader took that move for the loader's renewal, gave up on it, and reported its
    own jobs waiting (seen in CI)."""
    _, lists, _, _ = env
    lists.create(list_name)
    dead = lists._list_udf(list_name, "alloc", 5, 3000, "dead")["seq"]
    moved: list[int] = []

    def hold_credited() -> None:
        # Once the load's own range is written and waits behind the dead one: the hold
        # credited as backends.holds does, to every lease still running.
        wait_for("the load's range written", lambda: any(
            seq != dead and r.get("real") is not None for seq, r in lists.header(list_name)["pend"].items()), 10)
        moved.append(lists._list_udf(list_name, "credit", 300))
        # Again, a look of the load's later (it looks every 0.25 s): the first may have
        # landed before its first look, which would then see no move at all.
        time.sleep(load.AWAIT_STEP_S * 2)
        moved.append(lists._list_udf(list_name, "credit", 300))

    t = threading.Thread(target=hold_credited)
    t.start()
    try:
        report = lists.load(list_name, specs(10))
    finally:
        t.join()
    assert moved == [1, 1], "the dead loader's lease was not running any more, or the load's was still in flight"
    assert (report.loaded, report.waiting) == (10, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (10, 10, 0)


def test_a_hold_credits_no_lease_that_ran_out_before_it(env, list_name):
    """A loader whose lease ran out before the store was held was not held back by it:
    its range stays with recovery."""
    _, lists, _, _ = env
    lists.create(list_name)
    seq = lists._list_udf(list_name, "alloc", 5, 100, "dead")["seq"]
    live = lists._list_udf(list_name, "alloc", 5, 60_000, "live")["seq"]
    time.sleep(0.5)  # the first lease ran out 400 ms before a hold of 300 ms began
    assert lists._list_udf(list_name, "credit", 300) == 1
    assert [r["seq"] for r in lists._list_udf(list_name, "expired")] == [seq]
    pend = lists.header(list_name)["pend"]
    assert pend[live]["cr"] == 300 and "cr" not in pend[seq]


def test_a_load_behind_a_live_loaders_range_reports_its_jobs_waiting(env, list_name):
    _, lists, _, _ = env
    lists.create(list_name)
    lease_ms = 1200
    seq = lists._list_udf(list_name, "alloc", 5, lease_ms, "live")["seq"]
    with _renewed(lists, list_name, seq, lease_ms):
        time.sleep(lease_ms / 1000 + 0.3)  # past the lease it was allocated with: only renewals keep it
        report = lists.load(list_name, specs(10), lease_ms=lease_ms)
        assert (report.loaded, report.waiting) == (10, 10), "not recovered: its loader lives"
        st = lists.status(list_name)
        assert (st.reservable, st.pending_ranges) == (0, 2)


def test_a_loader_keeps_its_ranges_in_flight_leased(env, list_name):
    """A range in flight longer than its lease (a slow store) is renewed, never handed
    to recovery while its loader lives; once given up, it is not renewed any more."""
    _, lists, _, _ = env
    lists.create(list_name)
    lease_ms = 800
    loader = load._RangeLoader(lists, list_name, lists.header(list_name), lease_ms, check_index=False)
    seq = lists._list_udf(list_name, "alloc", 3, lease_ms, "slow")["seq"]
    loader._flying.add(seq)
    renewer = load._Renewer(loader)
    renewer.start()
    try:
        time.sleep(3 * lease_ms / 1000)
        assert lists._list_udf(list_name, "expired") == [], "renewed while in flight"
        loader._flying.discard(seq)
        time.sleep(2 * lease_ms / 1000)
        assert [r["seq"] for r in lists._list_udf(list_name, "expired")] == [seq], "not once given up"
    finally:
        renewer.stop()


def test_renew_extends_only_a_live_lease(env, list_name):
    _, lists, _, _ = env
    lists.create(list_name)
    a = lists._list_udf(list_name, "alloc", 3, 60_000, "a")["seq"]
    b = lists._list_udf(list_name, "alloc", 3, 0, "b")["seq"]  # its lease ran out at once
    before = lists.header(list_name)["pend"]
    assert lists._list_udf(list_name, "renew", [a, b, 99], 120_000) == 1
    after = lists.header(list_name)["pend"]
    assert after[a]["exp"] > before[a]["exp"] + 50_000 and after[b]["exp"] == before[b]["exp"]
    assert [r["seq"] for r in lists._list_udf(list_name, "expired")] == [b], "recovery still gets the lapsed one"


def test_default_range_sizes_follow_the_store_and_the_mode(env, list_name):
    """Ranges of 10,000 jobs on the embedded store (fewer page writes per job), 1,000 on a
    server; a list in ID mode keeps 1,000 everywhere (a range is also an ID-store chunk,
    rewritten whole at every pop)."""
    backend, lists, queue, session = env
    lists.load(list_name, specs(2500))
    assert lists.header(list_name)["seq"] == (1 if backend.is_embedded else 3)
    lists.load(f"{list_name}-ids", specs(2500), mode="ids")
    assert lists.header(f"{list_name}-ids")["seq"] == 3
    assert len(drain_all(queue, f"{list_name}-ids", session)) == 2500


# A loader that stops itself (SIGSTOP, as Ctrl-Z does) once it has allocated its fifth
# range and before it writes any of it: outside any write, so an embedded store is not
# held meanwhile.
_STOPPING_LOADER = """
import json, os, signal, sys
from aeroqueue import load
from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
write_range = load._RangeLoader._write_range
def stop_at_fifth(self, batch, new, got):
    if got["seq"] == 4:
        os.kill(os.getpid(), signal.SIGSTOP)
    return write_range(self, batch, new, got)
load._RangeLoader._write_range = stop_at_fifth
b = open_backend(sys.argv[1])
jobs = (JobSpec(f"k{i}", {"v": 1}) for i in range(int(sys.argv[3])))
try:
    JobLists(b).load(sys.argv[2], jobs, chunk_size=50, workers=1, lease_ms=500)
except Exception as e:
    print(json.dumps({"err": type(e).__name__, "msg": str(e)}))
else:
    print(json.dumps({"ok": True}))
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@contextlib.contextmanager
def _loader_stopped_past_its_lease(backend, list_name: str, n: int) -> Iterator[subprocess.Popen[str]]:
    """A loader of `n` jobs (_STOPPING_LOADER) stopped mid-load, past its lease once
    this yields (a drop no longer waits for it); killed at the end if still running."""
    proc = subprocess.Popen([sys.executable, "-c", _STOPPING_LOADER, str(backend.url), list_name, str(n)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _stopped(proc.pid):
            assert proc.poll() is None and time.monotonic() < deadline, "the loader never stopped"
            time.sleep(0.01)
        time.sleep(1.0)  # past its lease
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow
def test_a_loader_resumed_after_its_list_was_dropped_and_loaded_again_adds_nothing_to_the_new_list(env, list_name):
    """A loader stopped past its lease, its list dropped (nothing stops a drop then) and
    loaded again from a changed file, then resumed: it took the new list for its own,
    loaded the rest of its old file into it (1,800 of 2,000 jobs twice, with the old
    payload) and replaced the new list's job-id index entries with its own (a reload
    of the new file added 1,850 again)."""
    backend, lists, queue, session = env
    n = 2000
    with _loader_stopped_past_its_lease(backend, list_name, n) as proc:
        lists.drop(list_name, grace_s=0)
        report = lists.load(list_name, (JobSpec(f"k{i}", {"v": 2}) for i in range(n)), chunk_size=50)
        assert (report.loaded, report.voided) == (n, 0)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    lists.recover(list_name)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (n, n, 0)
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(f"k{i}" for i in range(n)), "every job of the new list exactly once"
    assert all(j.payload == {"v": 2} for j in jobs), "the new file's payloads"
    assert all(lists.find_job(list_name, f"k{i}")["payload"] == {"v": 2} for i in range(0, n, 97))
    again = lists.load(list_name, (JobSpec(f"k{i}", {"v": 2}) for i in range(n)), chunk_size=50)
    assert (again.loaded, again.skipped) == (0, n), "the new list's index is its own: a reload adds nothing"
    assert lists.status(list_name).total == n
    assert '"err"' in out, f"the old loader must fail, not load into the new list: {out}"



def _loses_the_seal_race(backend, lists: JobLists, name: str, winner: list[JobSpec]) -> tuple[JobLists, list]:
    """A JobLists whose first range allocation comes just after another loader has
    loaded `winner` into `name` and sealed it; and that loader's report, once it ran."""
    late = JobLists(backend)
    real_udf = late._list_udf
    won: list[load.LoadReport] = []

    def udf(list_name, function, *args, **kw):
        if function == "alloc" and not won:
            won.append(lists.load(name, winner, seal=True, chunk_size=10))
        return real_udf(list_name, function, *args, **kw)

    late._list_udf = udf  # type: ignore[method-assign]
    return late, won


def test_two_sealing_loads_of_the_same_jobs_at_once_both_succeed(env, list_name):
    """Two `load --seal` of one file at once: the one that finds the list sealed
    between reading its header and allocating a range finds its jobs there, and
    succeeds as a rerun would; a job the sealed list lacks is still refused."""
    backend, lists, queue, session = env
    lists.create(list_name)
    late, won = _loses_the_seal_race(backend, lists, list_name, specs(40))
    report = late.load(list_name, specs(40), seal=True, chunk_size=10)
    assert (won[0].loaded, won[0].skipped) == (40, 0)
    assert (report.loaded, report.skipped, report.voided) == (0, 40, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges, st.sealed) == (40, 40, 0, True)
    jobs = drain_all(queue, list_name, session)
    assert sorted(j.jid for j in jobs) == sorted(s.jid for s in specs(40)), "each job once"

    other = f"{list_name}-b"
    lists.create(other)
    late, won = _loses_the_seal_race(backend, lists, other, specs(40))
    with pytest.raises(errors.ListSealed, match=r"sealed during the load: 1 of the 10 jobs of load range 1 are not"):
        late.load(other, [*specs(9), JobSpec("extra", {})], seal=True, chunk_size=10)
    assert lists.status(other).total == 40


def _records_of(backend, name: str) -> dict[str, list]:
    """Every job record and job-id index entry of list `name` in the store (bins)."""
    prefix = f"{name}/"
    return {s: [rec.bins for n, rec in backend.scan(s) if n.startswith(prefix)] for s in (keys.JOB_SET, keys.JIDX_SET)}


@pytest.mark.slow
@pytest.mark.parametrize("then", ["dropped", "made again"])
def test_a_loader_resumed_after_a_drop_leaves_nothing_behind(env, list_name, then):
    """A loader stopped past its lease (a drop does not wait for it) between allocating
    a range and writing it, resumed after the drop: it wrote that range's 50 job records
    and index entries into the dropped list, which no drop could delete any more (they
    were written after it). Under a list made again from a smaller file, the next load
    of a bigger one met them on its tokens: it failed, and a recovery of its ranges
    served the dropped list's jobs instead of its own."""
    backend, lists, queue, session = env
    with _loader_stopped_past_its_lease(backend, list_name, 2000) as proc:
        lists.drop(list_name, grace_s=0)
        if then == "made again":
            assert lists.load(list_name, (JobSpec(f"n{i}", {"v": 2}) for i in range(100)), chunk_size=50).loaded == 100
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    left = _records_of(backend, list_name)
    if then == "dropped":
        assert left == {keys.JOB_SET: [], keys.JIDX_SET: []}, "the fenced loader takes back what it wrote"
        assert '"err": "LoadAbandoned"' in out and "dropped during the load" in out, out
        with pytest.raises(errors.ListNotFound):
            lists.drop(list_name, grace_s=0)
        return
    assert sorted(r["jid"] for r in left[keys.JOB_SET]) == sorted(f"n{i}" for i in range(100)), "only the new list's jobs"
    assert sorted(r["tok"] for r in left[keys.JIDX_SET]) == list(range(100))
    assert '"err": "LoadAbandoned"' in out and "dropped during the load and made again" in out, out
    # The new list grows over the tokens the old loader held: every job its own.
    report = lists.load(list_name, (JobSpec(f"m{i}", {"v": 3}) for i in range(400)), chunk_size=50)
    assert (report.loaded, report.voided) == (400, 0)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (500, 500, 0)
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter([*(f"n{i}" for i in range(100)), *(f"m{i}" for i in range(400))])
    assert all(j.payload == {"v": 2 if j.jid[0] == "n" else 3} for j in jobs)
    lists.drop(list_name, grace_s=0)
    assert _records_of(backend, list_name) == {keys.JOB_SET: [], keys.JIDX_SET: []}


def _leave_a_fenced_loaders_range(backend, name: str, created: int, start: int, seq: int, mode: str) -> None:
    """What a loader of a list of `name` made at `created` leaves when it is fenced out
    (its list dropped while it was stopped past its lease) and killed before it takes
    its writes back: 50 job records from token `start`, their index entries and, in ID
    mode, the chunk of range `seq`, stamped with its list's `created`."""
    for i in range(50):
        jid = f"old{i}"
        backend.put(keys.JOB_SET, keys.job_name(name, start + i), {
            "token": start + i, "jid": jid, "payload": {"v": 0}, "list": name, "att": 0, "max_att": 5,
            "state": "queued", "c": created})
        backend.put(keys.JIDX_SET, keys.jidx_name(name, jid), {"tok": start + i, "c": created, "l": name})
    if mode == "ids":
        backend.put(keys.IDS_SET, keys.chunk_name(name, seq), {"ids": list(range(start, start + 50)), "c": created})


@pytest.mark.parametrize("mode", ["tokens", "ids"])
def test_what_a_killed_fenced_loader_left_is_never_taken_for_a_later_lists_jobs(env, list_name, mode):
    """A loader fenced out of a dropped list can be killed before it deletes what it
    wrote. Those records carry the dropped list's stamp: a drop of the name deletes
    them, and a later list of the name that meets them on its tokens (a load, or a
    recovery of a dead loader's range) replaces them instead of serving them, or
    failing on them."""
    backend, lists, queue, session = env
    lists.load(list_name, (JobSpec(f"n{i}", {"v": 2}) for i in range(50)), mode=mode, chunk_size=50)
    dropped_created = lists.header(list_name)["created"]
    lists.drop(list_name, grace_s=0)
    _leave_a_fenced_loaders_range(backend, list_name, dropped_created, 0, 0, mode)
    with pytest.raises(errors.ListNotFound):
        lists.drop(list_name, grace_s=0)
    assert _records_of(backend, list_name) == {keys.JOB_SET: [], keys.JIDX_SET: []}, "written after the drop, but stamped by the dropped list: deleted by a drop of its name"
    assert not [n for n, _ in backend.scan(keys.IDS_SET) if n.startswith(f"{list_name}/")]

    # A list made again: its load meets them on range 1, a recovery on range 2.
    lists.load(list_name, (JobSpec(f"n{i}", {"v": 2}) for i in range(50)), mode=mode, chunk_size=50)
    _leave_a_fenced_loaders_range(backend, list_name, dropped_created, 50, 1, mode)
    report = lists.load(list_name, (JobSpec(f"m{i}", {"v": 3}) for i in range(50)), chunk_size=50)
    assert (report.loaded, report.voided) == (50, 0)
    got = lists._list_udf(list_name, "alloc", 50, 0, "dead loader", lists.header(list_name)["created"])
    _leave_a_fenced_loaders_range(backend, list_name, dropped_created, got["start"], got["seq"], mode)
    assert lists.recover(list_name) == 1
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (100, 100, 0)
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter([*(f"n{i}" for i in range(50)), *(f"m{i}" for i in range(50))])
    assert all(j.payload == {"v": 2 if j.jid[0] == "n" else 3} for j in jobs)


@pytest.mark.parametrize("check", [1, 2, 3], ids=["before the job writes", "before the index", "after publishing"])
def test_a_fence_check_that_times_out_is_asked_again_not_a_failed_load(tmp_path, check):
    """Each range reads its list record three times (`_RangeLoader._fence`): a read that
    timed out once (a node leaving, a cluster changing) failed the whole load, the third
    after its range was already published."""
    backend = open_backend(f"embedded://{tmp_path / 'f.db'}")
    udfs.register(backend)
    lists = JobLists(backend)
    # The list record's reads with bins: create's, then the range's three checks.
    backend.client.faults.add(op="select", key="F", error="TimeoutError", times=1, skip=check)
    report = lists.load("F", (JobSpec(f"j{i}", {}) for i in range(10)), chunk_size=10)
    assert backend.client.faults.fired == 1
    assert (report.loaded, report.voided) == (10, 0)
    st = lists.status("F")
    assert (st.total, st.reservable, st.pending_ranges) == (10, 10, 0)
    backend.close()


def test_job_writes_run_past_their_deadline_create_nothing_and_are_repeated(env, list_name, monkeypatch):
    """A job record's create carries the loader's deadline (load._Stamp): the server
    refuses it past then (as a node frozen and resumed would run it late: see
    tests/multinode/test_load_replay.py), and the load repeats it with a fresh
    deadline."""
    b, lists, queue, session = env
    if b.job_deadline() is None:
        pytest.skip("the embedded store has no replicas: its job writes carry no deadline")
    real = b.job_deadline
    attempts: list[load._Stamp] = []  # the job writes' stamp, at each attempt
    late = [False]  # the job writes' deadline past (only theirs: the list's calls have deadlines too)
    refresh = load._Stamp.refresh

    def counted(self: load._Stamp) -> None:
        if attempts and self is not attempts[0]:  # another write's (the blocks', after the jobs')
            return refresh(self)
        attempts.append(self)
        with monkeypatch.context() as m:
            if late[0] or len(attempts) == 1:
                m.setattr(b, "job_deadline", lambda: real() - 60_000)
            refresh(self)

    monkeypatch.setattr(load._Stamp, "refresh", counted)
    # Every attempt's deadline past when sent: nothing is created, the load gives up.
    late[0] = True
    lists.write_retry_s = 0.3
    with pytest.raises(errors.LoadAbandoned, match="past its deadline"):
        lists.load(list_name, specs(40), seal=True)
    assert len(attempts) > 1
    assert b.batch_get(keys.JOB_SET, [keys.job_name(list_name, t) for t in range(40)]) == [None] * 40
    # Only the first attempt's past: the second, with a fresh deadline, writes them.
    other = f"{list_name}-2"
    attempts.clear()
    late[0] = False
    try:
        report = lists.load(other, specs(40), seal=True)
        assert (report.loaded, report.skipped, report.voided) == (40, 0, 0)
        assert len(attempts) == 2, attempts
        assert sorted(j.jid for j in drain_all(queue, other, session)) == sorted(s.jid for s in specs(40))
    finally:
        lists.drop(other)


def test_chunk_writes_run_past_their_deadline_write_nothing_and_are_repeated(env, list_name, monkeypatch):
    """An ID-store chunk's create, and a recovery's write of its `due`, carry the
    loader's deadline (load._write_chunk): the server refuses them past then (as a
    node frozen and resumed would run them late, bringing back a chunk popped since:
    see tests/multinode/test_chunk_replay.py), and they are repeated with a fresh
    deadline."""
    b, lists, _, _ = env
    if b.job_deadline() is None:
        pytest.skip("the embedded store has no replicas: its chunk writes carry no deadline")
    real = b.job_deadline
    past = 1  # Unix ms: a deadline long gone by any clock
    chunk = keys.chunk_name(list_name, 0)
    lists.write_retry_s = 0.3
    try:
        # Every attempt's deadline past when sent: nothing is written, the write gives up.
        monkeypatch.setattr(b, "job_deadline", lambda: past)
        with pytest.raises(errors.LoadAbandoned, match="past its deadline"):
            load._write_chunk(lists, list_name, 0, {"ids": [0, 1, 2], "c": 7}, create=True)
        assert b.get(keys.IDS_SET, chunk) is None
        # Only the first attempt's past: the second, with a fresh deadline, writes it.
        # The first ask is InTime.of's (is there a deadline at all?), not an attempt's:
        # past there, the attempt itself had a fresh one and nothing was repeated.
        given: list[int] = []
        monkeypatch.setattr(b, "job_deadline", lambda: given.append(past if len(given) == 1 else real()) or given[-1])
        load._write_chunk(lists, list_name, 0, {"ids": [0, 1, 2], "c": 7}, create=True)
        assert len(given) == 3, "asked once to learn of a deadline, then once for each of two attempts"
        assert b.get(keys.IDS_SET, chunk).bins == {"ids": [0, 1, 2], "c": 7}
        with pytest.raises(errors.RecordExists):  # create-only, deadline or not
            load._write_chunk(lists, list_name, 0, {"ids": [5], "c": 7}, create=True)
        # A recovery's `due`, the same way; the `ids` popped since stay as they are.
        b.apply(keys.IDS_SET, chunk, keys.IDS_MOD, "pop", 1, real())
        monkeypatch.setattr(b, "job_deadline", lambda: past)
        with pytest.raises(errors.LoadAbandoned, match="past its deadline"):
            load._write_chunk(lists, list_name, 0, {"due": {2: 5}}, create=False)
        assert b.get(keys.IDS_SET, chunk).bins == {"ids": [1, 2], "c": 7}
        given.clear()
        monkeypatch.setattr(b, "job_deadline", lambda: given.append(past if len(given) == 1 else real()) or given[-1])
        load._write_chunk(lists, list_name, 0, {"due": {2: 5}}, create=False)
        assert len(given) == 3
        assert b.get(keys.IDS_SET, chunk).bins == {"ids": [1, 2], "c": 7, "due": {2: 5}}
    finally:
        b.remove(keys.IDS_SET, chunk)


def test_a_recoverys_due_write_does_not_bring_back_a_chunk_deleted_since(env, list_name):
    """The `due` a recovery writes into a chunk that exists (it found RecordExists) is
    an update: if the chunk is gone by then (the list dropped), it is not made again,
    holding a `due` and nothing else, left behind by a list that no longer exists."""
    b, lists, _, _ = env
    chunk = keys.chunk_name(list_name, 0)
    with pytest.raises(errors.RecordNotFound):
        load._write_chunk(lists, list_name, 0, {"due": {2: 5}}, create=False)
    assert b.get(keys.IDS_SET, chunk) is None


def test_status_names_the_loads_whose_loader_died_and_sweep_finishes_them(registered, lists, list_name, store_url):
    """A range whose loader died (its lease ran out) keeps a list short of complete
    until it is finished; `status` said only "loads in progress", alike for a live
    loader's range, and the list's workers waited for a sweep without a word why."""
    lists.load(list_name, [JobSpec(f"j{i}", i) for i in range(3)])
    created = lists.status(list_name).created
    assert registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "alloc", 2, 0, None, created)["st"] == "ok"
    assert registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "alloc", 2, 600_000, None, created)["st"] == "ok"
    st = lists.status(list_name)
    assert (st.pending_ranges, st.stalled_ranges) == (2, 1)

    def status(*args: str) -> str:
        out = CliRunner().invoke(main, ["--url", store_url, "status", list_name, *args])
        assert out.exit_code == 0, out.output
        return out.output

    assert json.loads(status("--json"))["loads_in_progress"] == 2 and json.loads(status("--json"))["loads_stalled"] == 1
    assert "loads stalled" in status() and "aeroqueue sweep" in status()
    swept = CliRunner().invoke(main, ["--url", store_url, "sweep", "--json"])
    assert swept.exit_code == 0 and json.loads(swept.output)["ranges"] >= 1, swept.output
    st = lists.status(list_name)
    assert (st.pending_ranges, st.stalled_ranges) == (1, 0)  # the live loader's range is left alone
    assert "loads stalled" not in status()


def _pend_sizes(lists: JobLists, name: str, monkeypatch) -> list[int]:
    """The number of entries of the list record's `pend` after each publish: what every
    later call on the list record reads."""
    sizes: list[int] = []
    real = JobLists._list_udf

    def udf(self: JobLists, list_name: str, function: str, *args, **kw):
        out = real(self, list_name, function, *args, **kw)
        if function == "publish" and list_name == name:
            sizes.append(len(lists.header(name)["pend"]))
        return out

    monkeypatch.setattr(JobLists, "_list_udf", udf)
    return sizes


def test_ranges_written_behind_a_dead_loaders_range_keep_the_list_record_small(env, list_name, monkeypatch):
    """Behind a killed loader's range, each written range kept an entry of `pend` until
    the dead one was recovered; every call on the list record (alloc, renew, publish,
    take) reads it whole: a load of 3,000 ranges of one job behind it took minutes, as
    each call cost in proportion to the ranges before it. Written ranges next to each
    other share one entry now."""
    _, lists, queue, session = env
    lists.create(list_name)
    lists._list_udf(list_name, "alloc", 1, 60_000, "dead")  # killed: never renewed, never published
    sizes = _pend_sizes(lists, list_name, monkeypatch)
    n = 120
    report = lists.load(list_name, specs(n), chunk_size=1, workers=4, lease_ms=300)
    assert (report.loaded, report.waiting) == (n, n), "behind the dead range, whose lease runs on"
    assert len(sizes) == n
    # The dead range, and the ranges in flight (4 and one queued) with a run of written
    # ones after each, whatever n (one entry per range before: n + 1 at the end).
    assert max(sizes) <= 2 + 2 * 5, sizes
    assert len(lists.header(list_name)["pend"]) == 2
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (0, 0, n + 1), "every range still counted pending"
    # The dead loader's range recovered: the run publishes whole, every job once.
    head = lists.header(list_name)
    lists._list_udf(list_name, "renew", list(head["pend"]), 0)  # its lease runs out now (a renewal to 0 ms)
    time.sleep(0.05)
    assert load.recover(lists, list_name) == 1
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (n, n, 0)
    head = lists.header(list_name)
    assert (head["pubs"], head["tail"], head["pend"]) == (n + 1, n + 1, {})
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(s.jid for s in specs(n)), "every job exactly once"


def test_a_load_of_one_job_ranges_behind_a_killed_loader_reads_a_few_entries_a_call(env, list_name, monkeypatch):
    """The case as it was met: a loader of one-job ranges SIGKILLed, the same load run
    again at once. Its ranges wait behind the dead ones for their lease; the list
    record holds a few entries meanwhile, not one per range. Then every job is there
    once, reservable."""
    backend, lists, queue, session = env
    n, lease_ms = 400, 1500
    proc = subprocess.Popen([sys.executable, "-c", _LOADER, str(backend.url), list_name, str(n), str(lease_ms), "1"],
                            start_new_session=True)
    try:
        wait_for("the loader's first ranges published", lambda: (
            (rec := backend.get(keys.LIST_SET, list_name)) is not None and rec.bins["tail"] >= 20), 60)

        def stopped_in_a_range() -> bool:
            # Killed between two ranges, it would leave none in flight: stopped first,
            # and killed only while one is (else let go again).
            os.killpg(proc.pid, signal.SIGSTOP)
            if any(r.get("real") is None for r in lists.header(list_name)["pend"].values()):
                return True
            os.killpg(proc.pid, signal.SIGCONT)
            return False

        wait_for("the loader stopped with a range in flight", stopped_in_a_range, 60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    head = lists.header(list_name)
    dead = [seq for seq, r in head["pend"].items() if r.get("real") is None]
    assert head["tail"] < n and dead, "killed mid-load, ranges in flight"
    sizes = _pend_sizes(lists, list_name, monkeypatch)
    report = lists.load(list_name, (JobSpec(f"k{i}", {"i": i}) for i in range(n)), chunk_size=1, workers=4,
                        lease_ms=lease_ms)
    assert report.waiting == 0 and report.loaded + report.skipped == n
    assert len(sizes) > n / 2, "most ranges were the re-run's"
    # The dead ranges, each maybe with a run of written ones after it, and the re-run's
    # ranges in flight with theirs: one entry per range before (hundreds).
    assert max(sizes) <= 2 * len(dead) + 2 * 5 + 1, sizes
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (n, n, 0)
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(f"k{i}" for i in range(n)), "every job exactly once"
    assert all(j.payload == {"i": int(j.jid[1:])} for j in jobs)
    assert queue.complete_many(jobs) == []


def test_publishing_out_of_order_merges_written_ranges_and_stays_idempotent(env, list_name):
    _, lists, _, _ = env
    lists.create(list_name)
    assert [lists._list_udf(list_name, "alloc", 2, 60_000, f"r{i}")["seq"] for i in range(6)] == list(range(6))
    pub = functools.partial(lists._list_udf, list_name, "publish")
    for seq in (2, 4, 3, 1):  # 0 unwritten; 5 unwritten
        assert pub(seq, 2, 0, {}, 10)["st"] == "ok"
    pend = lists.header(list_name)["pend"]
    assert sorted(pend) == [0, 1, 5] and (pend[1]["start"], pend[1]["n"], pend[1]["k"]) == (2, 8, 4)
    # A publish repeated after a lost answer, of a range merged into another: ok, nothing changes.
    assert pub(3, 2, 0, {}, 10) == {"st": "ok", "tail": 0, "total": 0}
    assert lists.header(list_name)["pend"] == pend
    assert pub(0, 1, 0, {}, 10) == {"st": "ok", "tail": 10, "total": 9}
    head = lists.header(list_name)
    assert (head["pubs"], sorted(head["pend"])) == (5, [5])
    assert pub(5, 2, 0, {}, 10) == {"st": "ok", "tail": 12, "total": 11}
    assert pub(99, 2, 0, {}, 10)["st"] == "gone"


def test_a_failed_loads_range_is_finished_by_the_same_load_run_again_at_once(env, list_name, monkeypatch, tmp_path):
    """A load that failed in a range (here its index writes) left that range pending
    on its full lease, which nobody renewed: the same load run again at once waited 15 s
    for it. The loader knows it writes no more of the range: it gives the lease up as
    soon as no write of the range can land any more (at once on the embedded store, past
    the writes' deadline on a server), and the load run again, a process of its own,
    finishes it at once."""
    backend, lists, queue, session = env
    n = 100
    path = tmp_path / "jobs.jsonl"
    path.write_text("".join(json.dumps({"id": f"j{i}", "payload": {"i": i}}) + "\n" for i in range(n)))
    real = load.commit_index

    def failing(lists_: JobLists, name: str, created: int, pairs: list[tuple[int, str]]) -> list[int]:
        if any(jid == "j55" for _, jid in pairs):
            raise errors.LoadAbandoned(f"list {name!r}: indexing job ids failed (codes [9]); run the load again")
        return real(lists_, name, created, pairs)

    with monkeypatch.context() as m:
        m.setattr(load, "commit_index", failing)
        with pytest.raises(errors.LoadAbandoned, match="indexing job ids failed"):
            lists.load(list_name, specs(n), chunk_size=10, workers=2)  # the default lease, 15 s
    failed = [seq for seq, r in lists.header(list_name)["pend"].items() if r.get("real") is None]
    assert len(failed) == 1, "the test needs the failed range pending"
    wait_for("the failed range's lease given up", lambda: [r["seq"] for r in lists._list_udf(
        list_name, "expired")] == failed, 5)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "aeroqueue", "--url", str(backend.url), "load", list_name, str(path),
                          "--chunk-size", "10", "--seal", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["loaded"] + report["skipped"], report["waiting"], report["sealed"]) == (n, 0, True), report
    assert time.monotonic() - t0 < load.DEFAULT_LEASE_MS / 1000, "it did not wait out the lease"
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.pending_ranges) == (n, n, 0)
    jobs = drain_all(queue, list_name, session)
    assert Counter(j.jid for j in jobs) == Counter(f"j{i}" for i in range(n)), "every job exactly once"
    assert all(j.payload == {"i": int(j.jid[1:])} for j in jobs)
    assert queue.complete_many(jobs) == []
    assert lists.status(list_name).complete


def test_publishes_in_any_order_each_twice_match_a_model_of_the_list(env, list_name):
    """Merged `pend` entries (aq_list_v1 publish) against a model: ranges published in
    any order, each twice (a loader and a recovery, or a publish repeated after a lost
    answer), some delayed (a gate each, never merged), a renewal of every range after
    each publish. pubs, tail, total, the gates and the pending count stay what one
    entry per range gave, and only unwritten ranges are renewed."""
    import random

    _, lists, _, _ = env
    for trial in range(25):
        rnd = random.Random(trial)
        name = f"{list_name}-{trial}"
        lists.create(name)
        n = rnd.randint(2, 8)
        sizes = [rnd.randint(1, 3) for _ in range(n)]
        starts = [lists._list_udf(name, "alloc", sizes[i], 600_000, f"r{i}")["start"] for i in range(n)]
        delayed = {i for i in range(n) if rnd.random() < 0.25}
        reals = [rnd.randint(0, sizes[i]) for i in range(n)]
        order = list(range(n)) * 2
        rnd.shuffle(order)
        written: set[int] = set()
        for seq in order:
            due = int(time.time() * 1000) + 3_600_000 if seq in delayed else 0
            assert lists._list_udf(name, "publish", seq, reals[seq], due, {}, 10)["st"] == "ok"
            written.add(seq)
            assert lists._list_udf(name, "renew", list(range(n)), 600_000) == n - len(written), (trial, order)
            pubs = 0
            while pubs in written:
                pubs += 1
            head = lists.header(name)
            tail = starts[pubs - 1] + sizes[pubs - 1] if pubs else 0
            assert (head["pubs"], head["tail"], head["total"]) == (pubs, tail, sum(reals[:pubs])), (trial, order)
            assert set(head.get("gates") or {}) == {starts[i] for i in delayed if i < pubs}, (trial, order)
            assert lists.status(name).pending_ranges == n - pubs, (trial, order)
