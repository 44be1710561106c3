"""Weighted lists in a real worker, with real threads, on every backend: proportions,
paused and empty lists skipped without spinning, patterns that follow new lists."""

from __future__ import annotations

import threading
import time
from collections import Counter

from aeroqueue.loading import JobSpec
from aeroqueue.observe import WorkerObserver
from aeroqueue.worker import EXIT_OK, Worker
from tests.waiting import wait_for


class Recorder(WorkerObserver):
    """Every reservation call and every job reserved, in the order the worker saw them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.jobs: list[str] = []

    def reserve_latency(self, list_name: str, seconds: float) -> None:
        with self.lock:
            self.calls[list_name] += 1

    def reserved(self, list_name: str, n: int) -> None:
        with self.lock:
            self.jobs.extend([list_name] * n)


def start(w: Worker) -> threading.Thread:
    t = threading.Thread(target=lambda: setattr(w, "code", w.run(install_signals=False)), daemon=True)
    t.start()
    return t


def jobs(prefix: str, n: int) -> list[JobSpec]:
    return [JobSpec(f"{prefix}{i}", {"i": i}) for i in range(n)]


def test_jobs_are_taken_in_proportion_to_the_weights(registered, lists, list_name):
    a, b = f"{list_name}-a", f"{list_name}-b"
    lists.load(a, jobs("a", 200), seal=True)
    lists.load(b, jobs("b", 200), seal=True)
    rec = Recorder()
    w = Worker(registered, lambda job: None, [f"{a}=3", (b, 1)], concurrency=3, batch=2, interval_s=0.1,
               expiry_s=2.0, idle_s=0.05, until_complete=True, observer=rec)
    assert w.run(install_signals=False) == EXIT_OK
    assert lists.status(a).done == lists.status(b).done == 200
    # While both lists have jobs, every pick reserves a full batch (2), and the picks
    # are a deterministic a,a,b,a cycle: the first 120 jobs (a runs out only after
    # 200 of a and ~67 of b) hold exactly 90 of a, give or take the reservations the
    # 3 threads had in flight when the order was recorded (a few batches). +/-15 is
    # several times that, and a weighted-random or round-robin choice (60) is far off.
    first = Counter(rec.jobs[:120])
    assert 75 <= first[a] <= 105, first


def test_a_paused_list_is_skipped_without_spinning_and_taken_up_when_resumed(registered, lists, list_name):
    urgent, bulk = f"{list_name}-urgent", f"{list_name}-bulk"
    lists.load(urgent, jobs("u", 20), seal=True)
    lists.load(bulk, jobs("b", 30), seal=True)
    lists.pause(urgent)
    rec = Recorder()
    w = Worker(registered, lambda job: time.sleep(0.01), [f"{urgent}=5", f"{bulk}=1"], concurrency=2, batch=1,
               interval_s=0.1, expiry_s=2.0, idle_s=0.05, idle_max_s=0.4, until_complete=True, observer=rec)
    began = time.monotonic()
    t = start(w)
    try:
        wait_for("the bulk list done", lambda: lists.status(bulk).done == 30)
        st = lists.status(urgent)
        assert (st.done, st.reservable) == (0, 20), "nothing taken from a paused list"
        # bulk took ~0.5 s or more; a paused list is polled at most once per backoff
        # pause (0.025 s, then doubling to 0.2-0.4 s) whatever the concurrency.
        with rec.lock:
            polled = rec.calls[urgent]
        assert polled <= 4 + 5 * (time.monotonic() - began), polled
        lists.pause(urgent, False)
        t.join(30)
        assert not t.is_alive()
        assert w.code == EXIT_OK
        assert lists.status(urgent).done == 20
    finally:
        w.request_stop()
        t.join(10)


def test_an_empty_list_is_not_polled_in_a_loop(registered, lists, list_name):
    lists.create(list_name)
    rec = Recorder()
    w = Worker(registered, lambda job: None, [list_name], concurrency=4, interval_s=0.1, expiry_s=2.0,
               idle_s=0.05, idle_max_s=0.4, observer=rec)
    t = start(w)
    time.sleep(2.0)
    w.request_stop()
    t.join(10)
    # Without backoff 4 threads polling every 0.05 s would make ~160 calls. With it,
    # one probe at a time after pauses of at least 0.025, 0.05, 0.1, then 0.2 s:
    # over 2 s (and a scheduling slack) no more than ~16, fewer on a slow machine.
    assert 1 <= rec.calls[list_name] <= 20, rec.calls


def test_a_pattern_follows_a_list_loaded_after_the_worker_started(registered, lists, list_name):
    a, b, other = f"{list_name}-a", f"{list_name}-b", f"{list_name}x-c"
    lists.load(other, jobs("o", 5), seal=True)
    w = Worker(registered, lambda job: job.list, [f"{list_name}-*=2"], concurrency=2, interval_s=0.1, expiry_s=2.0,
               idle_s=0.05, idle_max_s=0.2, refresh_lists_s=0.2, reap_every_s=0.2, until_complete=True)
    t = start(w)
    try:
        time.sleep(0.6)
        assert t.is_alive(), "--until-complete waits while a pattern matches no list"
        lists.load(a, jobs("a", 10))  # not sealed: the worker cannot be done yet
        wait_for(f"{a} done", lambda: lists.status(a).done == 10)
        lists.load(b, jobs("b", 10), seal=True)
        wait_for(f"{b} done", lambda: lists.status(b).done == 10)
        assert t.is_alive(), f"{a} is not sealed, so not complete"
        lists.seal(a)
        t.join(30)
        assert not t.is_alive() and w.code == EXIT_OK
        assert lists.status(other).done == 0, "a list the pattern does not match is left alone"
        assert sorted(w.selector.followed()) == [a, b]
    finally:
        w.request_stop()
        t.join(10)
