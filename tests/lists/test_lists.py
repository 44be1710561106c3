"""Job lists: load, reserve, acknowledge, status (design.md invariants 1, 2, 4)."""

from __future__ import annotations

import contextlib
import io
import json
import threading
import time
from collections.abc import Iterator

import pytest

from aeroqueue import errors, keys
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session
from tests.waiting import wait_for


def specs(n: int, start: int = 0) -> list[JobSpec]:
    return [JobSpec(f"job-{i}", {"n": i}) for i in range(start, start + n)]


def drain(queue: Queue, name: str, session: Session, count: int = 1) -> list:
    got = []
    while batch := queue.reserve(name, session, count):
        got.extend(batch)
    return got


@pytest.mark.parametrize("count", [1, 3], ids=["one-at-a-time", "in-batches"])
def test_load_reserve_complete_in_order(queue, lists, list_name, session, count):
    report = lists.load(list_name, specs(5), seal=True)
    assert (report.loaded, report.skipped, report.voided) == (5, 0, 0)
    # One at a time the claim is the UDF's; in a batch, native operations (`hotpath`),
    # whose jobs are built from the bins the batch read: both must hand out the same.
    jobs = drain(queue, list_name, session, count)
    assert [j.jid for j in jobs] == [f"job-{i}" for i in range(5)]
    assert [j.payload for j in jobs] == [{"n": i} for i in range(5)]
    assert all(j.attempt == 1 for j in jobs)
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.in_flight, st.done, st.complete) == (5, 0, 5, 0, False)
    for j in jobs:
        queue.complete(j, {"ok": j.jid})
    st = lists.status(list_name)
    assert (st.in_flight, st.done, st.dead, st.complete) == (0, 5, 0, True)
    assert st.completed_at is not None


def test_batch_reserve_never_passes_the_tail(queue, lists, list_name, session):
    lists.load(list_name, specs(7))
    first = queue.reserve(list_name, session, 5)
    second = queue.reserve(list_name, session, 5)
    assert (len(first), len(second)) == (5, 2)
    assert queue.reserve(list_name, session, 5) == []
    assert sorted(j.token for j in first + second) == list(range(7))
    lost = queue.complete_many(first + second, [j.jid for j in first + second])
    assert lost == []
    assert lists.status(list_name).done == 7


def test_reload_is_idempotent_by_job_id(queue, lists, list_name, session):
    lists.load(list_name, specs(30), chunk_size=7)
    again = lists.load(list_name, specs(40), chunk_size=7)  # 30 old + 10 new
    assert (again.loaded, again.skipped) == (10, 30)
    jobs = drain(queue, list_name, session, 8)
    assert sorted(j.jid for j in jobs) == sorted(f"job-{i}" for i in range(40))
    assert lists.status(list_name).total == 40


def test_sealed_list_refuses_loads(lists, list_name):
    lists.load(list_name, specs(3), seal=True)
    with pytest.raises(errors.ListSealed):
        lists.load(list_name, specs(1, start=100))
    # Which job, not only how many (the first found, by id and place).
    with pytest.raises(errors.ListSealed, match=r"2 of these 5 jobs are not in it and cannot be added, the first job "
                                                 r"'job-100' \(line 4\)"):
        lists.load(list_name, specs(3) + specs(2, start=100))
    assert lists.status(list_name).total == 3


def test_complete_is_exactly_once(queue, lists, list_name, session, registered):
    lists.load(list_name, specs(1))
    [job] = queue.reserve(list_name, session)
    queue.complete(job, "first")
    queue.complete(job, "again")  # a retried ack from the same session: harmless
    rec = registered.get(keys.JOB_SET, job.name)
    assert rec.bins["state"] == "done" and rec.bins["result"] == "first"
    other = Session.open(registered)
    with pytest.raises(errors.ClaimLost):
        queue.complete(job.__class__(**{**job.__dict__, "session": other.id}), "thief")
    assert lists.status(list_name).done == 1
    other.close()


def test_complete_from_a_session_that_lost_the_claim(queue, lists, list_name, session, registered):
    lists.load(list_name, specs(1))
    [job] = queue.reserve(list_name, session)
    # The claim is released (as a reaper would) and another session takes the job.
    assert queue.release(job) == "released"
    other = Session.open(registered)
    [again] = queue.reserve(list_name, other)
    assert again.token == job.token
    with pytest.raises(errors.ClaimLost):
        queue.complete(job, "late")
    queue.complete(again, "on time")
    assert registered.get(keys.JOB_SET, job.name).bins["result"] == "on time"
    other.close()


def test_an_earlier_claim_of_the_same_session_cannot_acknowledge_again(queue, lists, list_name, session, registered):
    """A session's claim is released while one of its threads still holds the job (an
    orphan release, a release after an acknowledgement in doubt), and the session claims
    it again: the job runs twice, and only the claim that holds it may acknowledge. The
    stale claim's complete used to answer 'again' (done by this session), so the job was
    acknowledged twice (the failover test's "acknowledged 2 times")."""
    lists.load(list_name, specs(1))
    [first] = queue.reserve(list_name, session)
    assert queue.release(first, "orphaned claim released", refund=False) == "released"
    [second] = queue.reserve(list_name, session)
    assert (second.token, second.session) == (first.token, first.session)
    queue.complete(second, "second")
    with pytest.raises(errors.ClaimLost):
        queue.complete(first, "first")
    assert queue.complete_many([first], ["first"]) == [first]
    assert queue.complete_and_reserve([(first, "first")], list_name, session) == ([], [first])
    queue.complete(second, "second")  # a repeat of the acknowledgement that held: harmless
    rec = registered.get(keys.JOB_SET, first.name)
    assert (rec.bins["state"], rec.bins["result"]) == ("done", "second")
    assert lists.status(list_name).done == 1


def test_failures_retry_first_then_dead_then_kick(queue, lists, list_name, session):
    lists.load(list_name, specs(3), max_attempts=2, backoff_s=0)
    a, b, c = queue.reserve(list_name, session, 3)
    assert queue.fail(b, "boom 1") == "retry"
    [again] = queue.reserve(list_name, session)
    assert again.token == b.token and again.attempt == 2, "the retry store is served first"
    assert queue.fail(again, "boom 2") == "dead"
    st = lists.status(list_name)
    assert (st.dead, st.reservable, st.retry_pending) == (1, 0, 0)
    buf = io.StringIO()
    assert lists.export(list_name, buf, state="dead") == 1
    dead = json.loads(buf.getvalue())
    assert (dead["jid"], dead["err"], dead["att"]) == (b.jid, "boom 2", 2)
    assert lists.kick(list_name) == 1
    assert lists.status(list_name).dead == 0
    [kicked] = queue.reserve(list_name, session)
    assert kicked.token == b.token and kicked.attempt == 1
    for j in (a, c, kicked):
        queue.complete(j)
    lists.seal(list_name)
    assert lists.status(list_name).complete


def test_id_store_spans_several_chunks(queue, lists, list_name, session, registered):
    n, chunk = 53, 10
    lists.load(list_name, specs(n), mode="ids", chunk_size=chunk, seal=True)
    head = lists.header(list_name)
    assert head["pubs"] == 6 and head["mode"] == "ids"
    chunk_sizes = [len(registered.get(keys.IDS_SET, keys.chunk_name(list_name, c)).bins["ids"]) for c in range(6)]
    assert chunk_sizes == [10, 10, 10, 10, 10, 3]
    assert lists.status(list_name).reservable == n
    got = []
    for count in (1, 7, 15, 4, 30):  # batches that straddle chunk boundaries
        got += queue.reserve(list_name, session, count)
    assert sorted(j.jid for j in got) == sorted(s.jid for s in specs(n))
    assert queue.reserve(list_name, session, 5) == []
    assert lists.header(list_name)["cursor"] == 6, "the cursor only moves forward, to the end"
    queue.complete_many(got)
    st = lists.status(list_name)
    assert (st.done, st.reservable, st.complete) == (n, 0, True)


def test_mode_mismatch_is_refused(lists, list_name):
    lists.create(list_name, mode="ids")
    with pytest.raises(errors.ListModeMismatch):
        lists.load(list_name, specs(1), mode="tokens")


def test_unknown_list(queue, lists, session):
    with pytest.raises(errors.ListNotFound):
        queue.reserve("no-such-list", session)
    with pytest.raises(errors.ListNotFound):
        lists.status("no-such-list")


def test_paused_list_reserves_nothing(queue, lists, list_name, session):
    lists.load(list_name, specs(2))
    lists.pause(list_name)
    assert queue.reserve(list_name, session) == []
    lists.pause(list_name, False)
    assert len(queue.reserve(list_name, session, 2)) == 2


def test_concurrent_loaders_never_expose_an_unwritten_token(queue, lists, list_name, registered):
    """Invariant 4: while loaders run, every token a reserver gets has its job record."""
    lists.create(list_name)
    stop = threading.Event()
    problems: list[str] = []
    seen: list[str] = []
    reserver_session = Session.open(registered)

    def reserver() -> None:
        while True:
            jobs = queue.reserve(list_name, reserver_session, 3)
            for job in jobs:
                if job.payload is None or job.jid is None:
                    problems.append(f"token {job.token} had no job")
                seen.append(job.jid)
            if not jobs and stop.is_set():
                return

    def loader(k: int) -> None:
        lists.load(list_name, [JobSpec(f"L{k}-{i}", {"k": k}) for i in range(120)], chunk_size=9)

    threads = [threading.Thread(target=reserver)] + [threading.Thread(target=loader, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join()
    stop.set()
    threads[0].join()
    seen += [j.jid for j in drain(queue, list_name, reserver_session, 10)]
    assert problems == []
    assert sorted(seen) == sorted(f"L{k}-{i}" for k in range(3) for i in range(120))
    assert lists.status(list_name).total == 360
    reserver_session.close()


def test_concurrent_loaders_of_the_same_file_load_each_job_once(queue, lists, list_name, session):
    jobs = specs(200)
    threads = [threading.Thread(target=lists.load, args=(list_name, jobs), kwargs={"chunk_size": 13}) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = drain(queue, list_name, session, 25)
    assert sorted(j.jid for j in got) == sorted(s.jid for s in jobs), "each job id exactly once"
    assert lists.status(list_name).total == 200


def test_a_dead_loaders_range_is_recovered(queue, lists, list_name, session, registered):
    """A loader that allocated a range and died (no publish) blocks nothing for long:
    the next load finishes its range once the lease has run out."""
    lists.load(list_name, specs(4))
    # A loader allocates tokens 4..9, writes three of its six jobs and its index, then dies.
    got = registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "alloc", 6, 0)
    assert got["st"] == "ok" and got["start"] == 4
    for i, t in enumerate(range(4, 7)):
        spec = JobSpec(f"dead-{i}", {"d": i})
        registered.put(keys.JOB_SET, keys.job_name(list_name, t), {
            "list": list_name, "token": t, "jid": spec.jid, "payload": spec.payload, "state": "queued", "att": 0, "max_att": 5,
        })
    registered.put(keys.JIDX_SET, keys.jidx_name(list_name, "dead-0"), {"tok": 4})
    # A later load (or re-run) recovers the expired range, then loads its own jobs after it.
    report = lists.load(list_name, [JobSpec("dead-1", {"d": 1}), JobSpec("new", {})])
    assert report.loaded == 1 and report.skipped == 1
    jobs = drain(queue, list_name, session, 4)
    assert sorted(j.jid for j in jobs) == sorted([*(s.jid for s in specs(4)), "dead-0", "dead-1", "dead-2", "new"])
    st = lists.status(list_name)
    assert st.total == 8 and st.pending_ranges == 0


@pytest.mark.parametrize(("mode", "chunk"), [("tokens", False), ("ids", False), ("ids", True)],
                         ids=["tokens", "ids", "ids-after-its-chunk"])
def test_a_dead_loaders_delayed_jobs_stay_delayed_once_recovered(queue, lists, list_name, session, registered, mode, chunk):
    """The dead loader's jobs with a later run_at (or of a delayed load) are held back
    by their records' due once recovered: counted delayed, not reservable, and not
    handed out before then. In ID mode the loader may have died after writing its
    chunk, whose `due` names only jobs with a run_at past the load's delay: the
    recovery's, which names every delayed job, replaces it."""
    lists.load(list_name, specs(2), mode=mode)
    got = registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "alloc", 3, 0)
    later = (time.time() + 3600) * 1000
    tokens = list(range(got["start"], got["start"] + 3))
    for i, t in enumerate(tokens):
        timed = {"state": "delayed", "due": round(later)} if i < 2 else {"state": "queued"}
        registered.put(keys.JOB_SET, keys.job_name(list_name, t), {
            "list": list_name, "token": t, "jid": f"dead-{i}", "payload": {}, "att": 0, "max_att": 5, **timed,
        })
        registered.put(keys.JIDX_SET, keys.jidx_name(list_name, f"dead-{i}"), {"tok": t})
    if chunk:  # a --delay load: its gate, not the chunk, was to hold these back
        registered.put(keys.IDS_SET, keys.chunk_name(list_name, got["seq"]), {"ids": tokens})
    assert lists.recover(list_name) == 1
    st = lists.status(list_name)
    assert (st.total, st.reservable, st.delayed) == (5, 3, 2), st
    jobs = drain(queue, list_name, session, 10)
    assert sorted(j.jid for j in jobs) == ["dead-2", "job-0", "job-1"]
    st = lists.status(list_name)
    assert (st.reservable, st.delayed, st.in_flight) == (0, 2, 3), st


def test_an_alloc_repeated_under_its_id_answers_the_same_range(lists, list_name, registered):
    """A loader repeats an alloc whose answer was lost under the range's id: it gets the
    range it already has, not a second one left pending for nobody to publish."""
    lists.create(list_name)

    def alloc(n: int, rid: str | None, lease_ms: int = 60_000) -> dict:
        return registered.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "alloc", n, lease_ms, rid)

    first = alloc(5, "range-a")
    again = alloc(5, "range-a")
    assert (again["st"], again["seq"], again["start"], again["now"]) == ("ok", first["seq"], first["start"], first["now"])
    other = alloc(3, "range-b")
    assert (first["seq"], first["start"], other["seq"], other["start"]) == (0, 0, 1, 5)
    assert alloc(2, None)["start"] == 8, "without an id, every call is a new range"
    # Once its lease ran out (recovery may be voiding it), a repeat gets a new range.
    lapsed = alloc(1, "range-c", lease_ms=0)
    time.sleep(0.01)
    assert (lapsed["start"], alloc(1, "range-c", lease_ms=0)["start"]) == (10, 11)
    head = lists.header(list_name)
    assert (head["alloc"], head["seq"], len(head["pend"])) == (12, 5, 5)


def test_python_api_loads_plain_items_checked_whole_first(queue, lists, list_name, session):
    report = lists.load(list_name, [("a", {"n": 1}), {"id": "b", "payload": [2]}, ("c", "three")])
    assert report.loaded == 3
    assert [(j.jid, j.payload) for j in drain(queue, list_name, session, 5)] == [("a", {"n": 1}), ("b", [2]), ("c", "three")]
    other = f"{list_name}-x"
    with pytest.raises(errors.LoadError, match="duplicate job id 'x'"):
        lists.load(other, (item for item in [("x", 1), ("y", 2), ("x", 3)]))
    assert other not in lists.names(), "nothing written, not even the list"


def test_a_token_twice_in_the_retry_store_is_handed_out_once(lists, queue, session, list_name):
    """A job can come back twice (a reaper and a sweeper both push it): one reservation
    taking both copies must claim it once, or its handler would run twice."""
    from aeroqueue import transitions

    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    first = queue.reserve(list_name, session, 1)[0]
    queue.release(first, refund=True)  # back onto the retry store
    transitions.push_retry(queue.backend, list_name, [first.token])  # and once more
    got = queue.reserve(list_name, session, 3)
    assert sorted(j.token for j in got) == [0, 1, 2]
    assert len(got) == 3, "each job once"


def test_a_duplicate_retry_entry_of_a_finished_job_is_not_pending(queue, lists, list_name, session, registered):
    """A release or requeue repeated after a lost answer can leave a token twice in the
    retry store (transitions.push_retry): the job runs once, and the second entry may
    still be there when the list completes. It is pending nothing: status counts the
    jobs of the retry store that are not finished, each once."""
    from aeroqueue import transitions

    lists.load(list_name, specs(4), seal=True)
    jobs = queue.reserve(list_name, session, 3)
    queue.complete(jobs[0], "ok")
    transitions.push_retry(registered, list_name, [jobs[0].token])  # the duplicate of a job already done
    st = lists.status(list_name)
    assert (st.retry_pending, st.in_flight, st.reservable, st.complete) == (0, 2, 1, False)
    queue.release(jobs[1])  # back to the retry store, unfinished: pending
    transitions.push_retry(registered, list_name, [jobs[1].token])  # and pushed twice: still one job
    st = lists.status(list_name)
    assert (st.retry_pending, st.in_flight) == (1, 1)
    [again, last] = queue.reserve(list_name, session, 3)
    assert (again.token, last.token) == (jobs[1].token, 3)
    queue.complete_many([jobs[2], again, last], ["ok", "ok", "ok"])
    st = lists.status(list_name)
    assert (st.done, st.retry_pending, st.in_flight, st.reservable, st.complete) == (4, 0, 0, 0, True)
    # Taking what is left later changes nothing: the claim refuses a job that is done.
    assert queue.reserve(list_name, session, 2) == []
    assert lists.status(list_name).done == 4


def test_a_python_payload_with_tuples_and_integer_keys_loads_on_either_store(queue, lists, list_name, session):
    """The real client refuses a tuple in a bin ('Cannot serialize'): the Python API
    loads tuples as lists, and keeps integer map keys, on a server as on the stand-in."""
    lists.load(list_name, [("j", {"t": (1, (2, 3)), 7: "seven"})])
    (job,) = queue.reserve(list_name, session, 1)
    assert job.payload == {7: "seven", "t": [1, [2, 3]]}


@contextlib.contextmanager
def _first_answer_lost(backend, function: str) -> Iterator[list]:
    """Within the block, `backend`'s first call of list UDF `function` takes effect and
    its answer is lost (BackendTimeout); yields the list that collects that answer."""
    real_apply = backend.apply
    lost: list = []

    def apply(set_name, name, module, fn, *args):
        answer = real_apply(set_name, name, module, fn, *args)
        if fn == function and not lost:
            lost.append(answer)
            raise errors.BackendTimeout(f"{function}: the answer was lost")
        return answer

    backend.apply = apply
    try:
        yield lost
    finally:
        del backend.apply
    assert lost == [1], "the first call landed, and its answer was lost"


def test_a_failure_whose_push_answer_was_lost_waits_once(queue, lists, list_name, session, registered):
    """The push onto the retry store landed, its answer did not, and it was repeated:
    the job is in the store once, not counted waiting twice while it runs again."""
    lists.load(list_name, specs(2), max_attempts=3, backoff_s=0)
    [job] = queue.reserve(list_name, session)
    with _first_answer_lost(registered, "push_retry"):
        assert queue.fail(job, "boom") == "retry"
    assert lists.header(list_name)["retry"] == [job.token]
    st = lists.status(list_name)
    assert (st.retry_pending, st.in_flight) == (1, 0)
    again = queue.reserve(list_name, session, 5)
    assert sorted(j.jid for j in again) == ["job-0", "job-1"]
    st = lists.status(list_name)
    assert (st.retry_pending, st.reservable, st.in_flight) == (0, 0, 2), "nothing left waiting for a running job"


def test_a_backoff_whose_schedule_answer_was_lost_is_scheduled_once(queue, lists, list_name, session, registered):
    lists.load(list_name, specs(1), max_attempts=3, backoff_s=0.3, backoff_max_s=0.3)
    [job] = queue.reserve(list_name, session)
    with _first_answer_lost(registered, "schedule"):
        assert queue.fail(job, "boom") == "delayed"
    head = lists.header(list_name)
    scheduled = [t for items in head["sched"].values() for t in items if not isinstance(t, list)]
    assert scheduled == [job.token] and head["nsch"] == 1
    [again] = wait_for("the job back after its backoff", lambda: queue.reserve(list_name, session, 5), 10)
    assert again.attempt == 2
    assert lists.header(list_name)["retry"] == [], "no second copy came due behind it"
    st = lists.status(list_name)
    assert (st.delayed, st.retry_pending, st.in_flight) == (0, 0, 1)


def test_a_push_repeated_into_a_full_retry_store_counts_the_tokens_it_finds_there(lists, list_name, registered):
    """The first push filled the store and its answer was lost: the repeat finds its
    tokens there and answers they fit (the sweep counts them offered), adding none."""
    lists.load(list_name, specs(3))

    def push(tokens: list[int], *again: int) -> int:
        return int(registered.udf(keys.LIST_SET, list_name, keys.LIST_MOD, "push_retry", tokens, 2, *again))

    assert push([0, 1]) == 2
    assert push([0, 1], 1) == 2
    assert push([1, 2], 1) == 1, "one there already; the other finds no room"
    assert lists.header(list_name)["retry"] == [0, 1]
