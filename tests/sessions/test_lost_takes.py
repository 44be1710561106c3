"""A take, or an ID-store pop, whose answer was lost (a timeout after the server
applied it) is not repeated: a second one would take other jobs. The jobs it took are
held by no one. With the regular sweep alone they waited up to --sweep-every plus
--sweep-grace (over 6 minutes with the defaults, which these tests keep); the lost
answer now leaves a mark in the store, and a worker sweeps soon after it, through
the sweep gate. Every job then runs exactly once, audited job by job.

Every test runs on both stores (AEROQUEUE_TEST_URL for the real server)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from aeroqueue import errors, keys
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue
from aeroqueue.sessions import Session, claim_sweep, lost_take_age_ms, mark_lost_take
from aeroqueue.worker import Worker
from tests.sessions.test_lost_pops import answer_lost
from tests.sessions.test_worker import running
from tests.waiting import wait_for

N = 8


def test_the_mark_is_due_until_a_sweep_through_the_gate_begins(registered, no_marks):
    assert lost_take_age_ms(registered) is None  # no answer lost
    mark_lost_take(registered)
    time.sleep(0.05)
    age = lost_take_age_ms(registered)
    assert age is not None and 0 <= age < 10_000, age
    time.sleep(0.01)
    assert claim_sweep(registered, 0, "s1")  # a sweep begins after the mark
    assert lost_take_age_ms(registered) is None
    time.sleep(0.01)
    mark_lost_take(registered)  # and an answer lost after that sweep began
    assert lost_take_age_ms(registered) is not None


@pytest.mark.parametrize("mode,count,lost", [("tokens", 1, (keys.LIST_MOD, "take")), ("ids", 3, (keys.IDS_MOD, "pop"))],
                         ids=["an API handler's take", "a batch's ID-store pop"])
def test_jobs_of_a_lost_take_answer_run_once_soon_with_the_default_sweep_settings(
    registered, lists: JobLists, queue: Queue, session: Session, list_name, no_marks, mode, count, lost
):
    lists.load(list_name, [JobSpec(f"j{i}", {"i": i}) for i in range(N)], mode=mode, chunk_size=4, seal=True)
    with answer_lost(registered, *lost) as taken, pytest.raises(errors.BackendTimeout):
        queue.reserve(list_name, session, count)
    took = taken[0]["n"] if mode == "tokens" else len(taken[0])
    assert took == count, taken  # it landed: those jobs are held by no one
    assert lost_take_age_ms(registered) is not None, "the lost answer left no mark"

    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def handle(job: Job) -> None:
        with lock:
            runs[job.jid] += 1

    # --sweep-every and --sweep-grace at their defaults (300 s, 60 s): only the mark
    # brings those jobs back within the wait below.
    w = Worker(registered, handle, [list_name], concurrency=2, interval_s=0.5, expiry_s=2.0)
    with running(w):
        wait_for("every job done", lambda: lists.status(list_name).complete, 60)
    assert runs == Counter({f"j{i}": 1 for i in range(N)}), runs
    for token in range(N):
        rec = registered.get(keys.JOB_SET, keys.job_name(list_name, token))
        assert rec is not None and (rec.bins["state"], rec.bins["att"]) == ("done", 1), rec
    st = lists.status(list_name)
    assert (st.done, st.dead, st.in_flight, st.reservable) == (N, 0, 0, 0), st
