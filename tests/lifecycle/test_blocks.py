"""Block records (aeroqueue/blocks.py): a leased reservation takes fresh jobs from
their block, a record per hundred jobs, and never trusts an entry that may no longer
say what the job record says. Every test runs on both backends and audits job by job."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from aerospike_helpers.operations import operations as op

from aeroqueue import blocks, keys
from aeroqueue import load as load_module
from aeroqueue.backends import Backend
from aeroqueue.backends.sizes import record_size
from aeroqueue.errors import BackendTimeout
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session, sweep


def load(lists: JobLists, name: str, n: int, tag: str = "", **kw: Any) -> None:
    lists.load(name, [JobSpec(f"j{i}", {"i": i, "tag": tag}, None, None) for i in range(n)], **kw)


def entries(backend: Backend, name: str, block: int) -> dict[int, Any] | None:
    rec = backend.get(keys.BLOCK_SET, blocks.name(name, block))
    return None if rec is None else dict(rec.bins.get("j") or {})


def states(backend: Backend, name: str, n: int) -> dict[str, str]:
    recs = backend.batch_get(keys.JOB_SET, [keys.job_name(name, t) for t in range(n)])
    return {r.bins["jid"]: r.bins["state"] for r in recs if r is not None}


def each_new_job_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, n: int, claimed: list[Any]
) -> None:
    """After a drop and a load of `n` jobs tagged "new": what a paused reservation got
    (`claimed`) and the list's own leased takes hand out each new job once, never an
    old one, and every one is acknowledged."""
    handed = list(claimed)
    while batch := queue.reserve(list_name, session, n, lease=True):
        handed += batch
    assert sorted((j.jid, j.payload["tag"]) for j in handed) == sorted((f"j{i}", "new") for i in range(n))
    assert queue.complete_many(handed) == []
    queue.flush()
    assert states(registered, list_name, n) == {f"j{i}": "done" for i in range(n)}
    assert lists.status(list_name).done == n


def all_but_j3_run(registered: Backend, queue: Queue, list_name: str, session: Session) -> None:
    """Of ten jobs j0..j9 with j3 buried: a leased batch hands out the nine others,
    each acknowledged once, and j3 stays dead."""
    jobs = queue.reserve(list_name, session, 10, lease=True)
    assert sorted(j.jid for j in jobs) == [f"j{i}" for i in range(10) if i != 3]
    assert queue.complete_many(jobs) == []
    queue.flush()
    assert states(registered, list_name, 10) == {f"j{i}": "dead" if i == 3 else "done" for i in range(10)}


def test_a_leased_batch_takes_its_jobs_from_their_blocks_and_each_is_acknowledged_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 250, seal=True)
    created = lists.header(list_name)["created"]
    for b, (lo, hi) in enumerate([(0, 100), (100, 200), (200, 250)]):
        rec = registered.get(keys.BLOCK_SET, blocks.name(list_name, b))
        assert rec is not None and rec.bins["c"] == created
        assert rec.bins["j"] == {t: [f"j{t}", {"i": t, "tag": ""}] for t in range(lo, hi)}
    trips = registered.round_trips
    jobs = queue.reserve(list_name, session, 150, lease=True)
    # The take, the pop of two blocks, the lease: no job record read.
    assert registered.round_trips - trips == 3
    assert [(j.token, j.jid, j.payload, j.attempt) for j in jobs] == [
        (t, f"j{t}", {"i": t, "tag": ""}, 1) for t in range(150)]
    assert all(j.lease == (0, None, jobs[0].lease[2], created) for j in jobs)
    assert entries(registered, list_name, 0) == {}
    assert sorted(entries(registered, list_name, 1) or {}) == list(range(150, 200))
    assert queue.complete_many(jobs) == []
    assert queue.complete_many(jobs[:10]) == []  # 'again': not counted twice
    rest = queue.reserve(list_name, session, 200, lease=True)
    assert [j.token for j in rest] == list(range(150, 250))
    assert queue.complete_many(rest) == []
    queue.flush()
    assert states(registered, list_name, 250) == {f"j{t}": "done" for t in range(250)}
    st = lists.status(list_name)
    assert (st.done, st.reservable, st.in_flight, st.complete) == (250, 0, 0, True)


def test_a_job_buried_before_anyone_took_it_is_not_handed_out_from_its_block(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 10)
    assert lists.bury(list_name, "j3", "not wanted") == "dead"
    assert (entries(registered, list_name, 0) or {})[3] == blocks.MARK
    all_but_j3_run(registered, queue, list_name, session)


def test_tokens_a_rolled_back_take_hands_out_again_are_read_from_their_records(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """A frozen node's replayed take puts the list record back, `head` included
    (README, "A frozen node replays the calls it was sent"): the tokens come out
    fresh again. Their entries left their blocks the first time, so the second
    reservation reads the records and hands out none of the jobs done meanwhile."""
    load(lists, list_name, 40)
    first = queue.reserve(list_name, session, 30, lease=True)
    assert queue.complete_many(first[:20]) == []
    registered.operate(keys.LIST_SET, list_name, [op.write("head", 0)])  # the rollback
    again = queue.reserve(list_name, session, 40, lease=True)
    # Leased still (queued, as their lease read them) and not yet acknowledged: handed
    # out again, as they were before block records (the ack fences them).
    assert sorted(j.token for j in again) == list(range(20, 40))
    assert queue.complete_many(again) == []
    assert queue.complete_many(first[20:]) == first[20:]  # the second holder's ack won
    queue.flush()
    assert states(registered, list_name, 40) == {f"j{i}": "done" for i in range(40)}


def test_a_block_another_list_of_the_name_left_is_replaced_or_never_trusted(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 5, tag="old")
    old = registered.get(keys.BLOCK_SET, blocks.name(list_name, 0))
    assert old is not None
    lists.drop(list_name, grace_s=0)
    assert registered.get(keys.BLOCK_SET, blocks.name(list_name, 0)) is None  # the drop deleted it

    def bring_back() -> None:  # as a node that missed the drop brings its copy back
        registered.put(keys.BLOCK_SET, blocks.name(list_name, 0), dict(old.bins))

    bring_back()
    load(lists, list_name, 5, tag="new")  # its loader replaces the old block
    created = lists.header(list_name)["created"]
    rec = registered.get(keys.BLOCK_SET, blocks.name(list_name, 0))
    assert rec is not None and rec.bins["c"] == created and rec.bins["c"] != old.bins["c"]
    assert {t: e[1]["tag"] for t, e in rec.bins["j"].items()} == {t: "new" for t in range(5)}
    bring_back()  # and once it is written: its stamp is not the list's
    jobs = queue.reserve(list_name, session, 5, lease=True)
    assert [(j.jid, j.payload["tag"], j.lease[3]) for j in jobs] == [(f"j{i}", "new", created) for i in range(5)]
    assert queue.complete_many(jobs) == []


def test_a_block_another_list_left_is_replaced_though_none_of_the_new_jobs_fit_in_it(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    """A loader whose jobs are all too big for a block (`blocks.entry_room`) still
    writes the block's stamp: one another list of the name left (a node that missed
    a drop) is replaced, not kept, with the old list's payloads, until a drop."""
    room = blocks.entry_room(list_name, registered.max_record_size())
    registered.put(keys.BLOCK_SET, blocks.name(list_name, 0), {"c": 12345, "j": {5: ["old", "x" * 1000]}})
    lists.load(list_name, [JobSpec(f"j{i}", {"d": "x" * (room + 1)}) for i in range(3)], seal=True)
    rec = registered.get(keys.BLOCK_SET, blocks.name(list_name, 0))
    assert rec is not None and rec.bins["c"] == lists.header(list_name)["created"]
    assert not rec.bins.get("j")
    jobs = queue.reserve(list_name, session, 3, lease=True)
    assert sorted(j.jid for j in jobs) == ["j0", "j1", "j2"]
    assert queue.complete_many(jobs) == []
    queue.flush()
    assert lists.status(list_name).complete


def test_delayed_jobs_have_no_block_entry_and_are_held_back(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    later = time.time() + 3600
    lists.load(list_name, [JobSpec(f"j{i}", {"i": i}, None, later if i % 2 else None) for i in range(10)])
    assert sorted(entries(registered, list_name, 0) or {}) == [0, 2, 4, 6, 8]
    jobs = queue.reserve(list_name, session, 10, lease=True)
    assert [j.jid for j in jobs] == ["j0", "j2", "j4", "j6", "j8"]
    assert queue.complete_many(jobs) == []
    queue.flush()
    assert states(registered, list_name, 10) == {f"j{i}": "delayed" if i % 2 else "done" for i in range(10)}


def test_a_list_loaded_with_a_delay_or_in_id_mode_writes_no_blocks(
    registered: Backend, lists: JobLists, list_name: str
) -> None:
    load(lists, list_name, 10, delay_s=3600)
    load(lists, list_name + "-ids", 10, mode="ids")
    assert entries(registered, list_name, 0) is None
    assert entries(registered, list_name + "-ids", 0) is None
    lists.drop(list_name + "-ids", grace_s=0)


def test_loaders_sharing_blocks_and_reservers_at_once_hand_out_each_job_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str
) -> None:
    """Two loads, each of ranges that straddle blocks (37 jobs a range, written by
    three threads), into one list while three reservers lease and acknowledge:
    every job is handed out with its own payload and acknowledged once."""
    lists.create(list_name)
    n_each = 600
    loads_done = threading.Event()
    errors: list[BaseException] = []
    handed: list[tuple[str, Any]] = []
    acked: list[str] = []
    lock = threading.Lock()

    def load_part(prefix: str) -> None:
        try:
            lists.load(list_name, [JobSpec(f"{prefix}{i}", {"id": f"{prefix}{i}"}) for i in range(n_each)],
                       chunk_size=37, workers=3)
        except BaseException as e:  # reported below
            errors.append(e)

    def reserve_loop() -> None:
        session = Session.open(registered)
        try:
            idle_after_loads = 0
            while idle_after_loads < 3:
                done_loading = loads_done.is_set()
                jobs = queue.reserve(list_name, session, 50, lease=True)
                if not jobs:
                    idle_after_loads += done_loading
                    time.sleep(0.01)
                    continue
                lost = queue.complete_many(jobs)
                with lock:
                    handed.extend((j.jid, j.payload) for j in jobs)
                    acked.extend(j.jid for j in jobs if j not in lost)
        except BaseException as e:  # reported below
            errors.append(e)
        finally:
            session.close()

    loaders = [threading.Thread(target=load_part, args=(p,)) for p in ("a", "b")]
    reservers = [threading.Thread(target=reserve_loop) for _ in range(3)]
    for t in loaders + reservers:
        t.start()
    for t in loaders:
        t.join(120)
    loads_done.set()
    for t in reservers:
        t.join(120)
    assert not errors, errors
    everyone = sorted(f"{p}{i}" for p in "ab" for i in range(n_each))
    assert sorted(jid for jid, _ in handed) == everyone  # each once
    assert all(payload == {"id": jid} for jid, payload in handed)
    assert sorted(acked) == everyone
    queue.flush()
    recs = registered.batch_get(keys.JOB_SET, [keys.job_name(list_name, t) for t in range(2 * n_each)])
    assert sorted((r.bins["jid"], r.bins["state"], r.bins["att"]) for r in recs if r is not None) == [
        (jid, "done", 1) for jid in everyone]
    st = lists.status(list_name)
    assert (st.done, st.reservable, st.in_flight) == (2 * n_each, 0, 0)


def test_jobs_too_big_for_their_share_of_a_block_are_read_from_their_records_and_no_block_is_oversized(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, caplog
) -> None:
    """A block holds the entries within a hundredth of the store's record size each
    (`blocks.entry_room`); bigger ones are read from their job records. A loader that
    sent whole blocks let the store refuse those over its limit: Aerospike CE 8.1.2.0
    crashed on such writes (loads of 20 kB payloads). Here every other job of a block
    is 14 kB (the block would be 1.1 MB) and the others 8 kB."""
    room = blocks.entry_room(list_name, registered.max_record_size())
    sizes = [14_000 if i % 2 else 8_000 for i in range(100)]
    assert 8_000 + 100 < room < 14_000 and sum(sizes) > registered.max_record_size()
    lists.load(list_name, [JobSpec(f"j{i}", {"d": "x" * n, "i": i}) for i, n in enumerate(sizes)], seal=True)
    assert sorted(entries(registered, list_name, 0) or {}) == list(range(0, 100, 2))
    assert not [r for r in caplog.records if getattr(r, "event", None) == "blocks_not_written"]
    jobs = queue.reserve(list_name, session, 100, lease=True)
    assert sorted((j.token, j.jid, j.payload["i"], len(j.payload["d"])) for j in jobs) == [
        (i, f"j{i}", i, n) for i, n in enumerate(sizes)]
    assert entries(registered, list_name, 0) == {}
    assert queue.complete_many(jobs) == []
    queue.flush()
    assert states(registered, list_name, 100) == {f"j{i}": "done" for i in range(100)}
    assert lists.status(list_name).complete


def test_a_full_block_stays_within_the_record_size_for_every_list_name_length() -> None:
    """`entry_room`'s arithmetic, whatever the list name's length (up to 64) and the
    store's record size: a hundred entries each at the room (the widest tokens), the
    block's stamp and its widest key come to the limit at most, and to within 110
    bytes of it (the hundredth's rounding)."""
    for limit in (1 << 20, 128 << 10):
        for length in range(1, 65):  # keys.check_list_name: 1 to 64 characters
            list_name = "L" * length
            room = blocks.entry_room(list_name, limit)
            token = 2**32 - 1
            fill = room - blocks.packed_size(token) - blocks.packed_size(["j" * 20, ""])
            while not blocks.entry_fits(token, ["j" * 20, "x" * fill], room):
                fill -= 1
            full = {token - i: ["j" * 20, "x" * fill] for i in range(blocks.BLOCK)}
            size = record_size(keys.BLOCK_SET, {"c": 2**41, "j": full}, blocks.name(list_name, token // blocks.BLOCK))
            assert limit - 110 < size <= limit, (limit, length, size)


def test_a_block_of_entries_each_at_its_share_is_within_the_stores_record_size(
    registered: Backend, lists: JobLists, list_name: str, caplog
) -> None:
    """`entry_room` is safe: a block of a hundred entries each as big as it allows is
    written whole (the sizes by aeroqueue/backends/sizes.py, calibrated on the server)."""
    room = blocks.entry_room(list_name, registered.max_record_size())
    specs = []
    for t in range(100):
        jid = f"j{t}"
        fill = room - blocks.packed_size(t) - blocks.packed_size([jid, ""])
        while not blocks.entry_fits(t, [jid, "x" * fill], room):
            fill -= 1
        assert blocks.entry_fits(t, [jid, "x" * fill], room) and not blocks.entry_fits(t, [jid, "x" * (fill + 1)], room)
        specs.append(JobSpec(jid, "x" * fill))
    lists.load(list_name, specs)
    assert not [r for r in caplog.records if getattr(r, "event", None) == "blocks_not_written"]
    assert sorted(entries(registered, list_name, 0) or {}) == list(range(100))
    # And close to the limit (a hundredth's rounding), for the widest block key and stamp.
    full = {t: [spec.jid, spec.payload] for t, spec in enumerate(specs)}
    widest = record_size(keys.BLOCK_SET, {"c": 2**41, "j": full}, blocks.name(list_name, (2**32 - 1) // blocks.BLOCK))
    assert registered.max_record_size() - 110 < widest <= registered.max_record_size()


def test_a_job_buried_before_its_loader_wrote_its_block_is_not_handed_out(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, monkeypatch
) -> None:
    """Its index committed, a job can be found and buried before its loader writes
    the blocks: the bury's marker stays, as the loader writes entries create-only."""
    real = load_module.commit_index

    def commit_then_bury(*args: Any, **kw: Any) -> list[int]:
        real_tokens = real(*args, **kw)
        assert JobLists(registered).bury(list_name, "j3", "not wanted") == "dead"
        return real_tokens

    monkeypatch.setattr(load_module, "commit_index", commit_then_bury)
    load(lists, list_name, 10)
    monkeypatch.undo()
    assert (entries(registered, list_name, 0) or {}).get(3) == blocks.MARK
    all_but_j3_run(registered, queue, list_name, session)


def test_the_sweep_deletes_the_blocks_behind_the_head_of_a_list_reserved_one_job_at_a_time(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 250, seal=True)
    for _ in range(150):  # claimed, not leased: nothing leaves the blocks
        [job] = queue.reserve(list_name, session, 1)
        queue.complete(job)
    assert [len(entries(registered, list_name, b) or {}) for b in range(3)] == [100, 100, 50]
    sweep(registered, grace_ms=60_000)
    assert [entries(registered, list_name, b) is None for b in range(3)] == [True, False, False]
    created = lists.header(list_name)["created"]

    def cleared() -> dict[str, Any]:
        rec = registered.get(keys.BLOCK_SET, blocks.cleared_name(list_name))
        return {} if rec is None else dict(rec.bins)

    assert cleared() == {"c": created, "b": 1}
    rest = queue.reserve(list_name, session, 100, lease=True)
    assert [(j.token, j.jid, j.lease[0]) for j in rest] == [(t, f"j{t}", 0) for t in range(150, 250)]
    assert queue.complete_many(rest) == []
    sweep(registered, grace_ms=60_000)  # the head's own block stays (a later load may add to it)
    assert [entries(registered, list_name, b) is None for b in range(3)] == [True, True, False]
    assert cleared() == {"c": created, "b": 2}
    sweep(registered, grace_ms=60_000)
    assert cleared() == {"c": created, "b": 2}
    st = lists.status(list_name)
    assert (st.done, st.complete) == (250, True)


def test_a_drop_deletes_the_blocks_before_the_job_records(
    registered: Backend, lists: JobLists, list_name: str, monkeypatch
) -> None:
    """A reservation whose take came just before the drop's pause pops nothing of jobs
    whose records are gone."""
    load(lists, list_name, 10)
    order: list[str] = []
    real = JobLists._delete_all

    def recorded(self: JobLists, set_name: str, names: list[str], **kw: Any) -> int:
        order.append(set_name)
        return real(self, set_name, names, **kw)

    monkeypatch.setattr(JobLists, "_delete_all", recorded)
    lists.drop(list_name, grace_s=0)
    assert order.index(keys.BLOCK_SET) < order.index(keys.JOB_SET)
    assert entries(registered, list_name, 0) is None


def test_a_sweep_that_read_the_head_before_a_load_leaves_a_burys_mark_in_the_heads_block(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, monkeypatch
) -> None:
    """The head's own block is never deleted: a sweep that read the head when every
    token was handed out would otherwise delete the mark a bury made meanwhile for a
    job of a load still writing, whose block write would then trust the job again."""
    load(lists, list_name, 150)
    for _ in range(150):
        [job] = queue.reserve(list_name, session, 1)
        queue.complete(job)
    read_before = lists.header(list_name)  # head == alloc == 150
    real = load_module.commit_index

    def commit_bury_and_sweep(*args: Any, **kw: Any) -> list[int]:
        real_tokens = real(*args, **kw)
        assert JobLists(registered).bury(list_name, "b10", "not wanted") == "dead"  # token 160
        blocks.clear_passed(lists, list_name, read_before)
        return real_tokens

    monkeypatch.setattr(load_module, "commit_index", commit_bury_and_sweep)
    lists.load(list_name, [JobSpec(f"b{i}", {"i": i}) for i in range(50)])
    monkeypatch.undo()
    assert entries(registered, list_name, 0) is None and (entries(registered, list_name, 1) or {})[160] == blocks.MARK
    jobs = queue.reserve(list_name, session, 50, lease=True)
    assert sorted(j.jid for j in jobs) == sorted(f"b{i}" for i in range(50) if i != 10)
    assert queue.complete_many(jobs) == []


def test_burying_a_job_already_done_writes_no_block(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session
) -> None:
    load(lists, list_name, 120)
    for _ in range(120):
        [job] = queue.reserve(list_name, session, 1)
        queue.complete(job)
    sweep(registered, grace_ms=60_000)
    assert entries(registered, list_name, 0) is None
    assert lists.bury(list_name, "j5", "too late") == "done"
    assert entries(registered, list_name, 0) is None


def test_a_bury_in_id_mode_writes_no_block(registered: Backend, lists: JobLists, list_name: str) -> None:
    load(lists, list_name, 10, mode="ids")
    assert lists.bury(list_name, "j3", "not wanted") == "dead"
    assert entries(registered, list_name, 0) is None


def test_a_leased_reservation_across_a_drop_and_a_load_hands_out_each_new_job_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, monkeypatch
) -> None:
    """A reservation paused between its take and its pop while the list is dropped and
    loaded again: the pop finds no entry of the take's list, and the records it read
    instead are the new list's. It leased them (or claimed them, its lease late) under
    the old take, and the new list's own takes, trusting their block entries, handed
    them out a second time. Now only the new list's takes hand them out: each once."""
    load(lists, list_name, 20, tag="old")
    real_pop = blocks.pop
    paused = []

    def dropped_and_loaded_first(*args: Any, **kwargs: Any) -> dict[int, list[Any]]:
        if not paused:
            paused.append(True)
            lists.drop(list_name, grace_s=0)
            load(lists, list_name, 20, tag="new")
        return real_pop(*args, **kwargs)

    monkeypatch.setattr(blocks, "pop", dropped_and_loaded_first)
    handed: list[Any] = []
    while batch := queue.reserve(list_name, session, 20, lease=True):
        handed += batch
    assert paused
    assert sorted((j.jid, j.payload["tag"]) for j in handed) == sorted((f"j{i}", "new") for i in range(20))
    assert queue.complete_many(handed) == []
    queue.flush()
    assert states(registered, list_name, 20) == {f"j{i}": "done" for i in range(20)}
    assert lists.status(list_name).done == 20


@pytest.mark.parametrize(("mode", "how", "after"), [
    ("tokens", "one", "take"), ("tokens", "batch", "take"), ("tokens", "batch with acks", "take"),
    # A take that answers a retry-store token too: claimed through the general loop, or
    # beside a lease's fresh tokens.
    ("tokens", "one after a retry", "take"), ("tokens", "lease after a retry", "take"),
    ("ids", "one", "take"), ("ids", "batch", "take"), ("ids", "batch with acks", "take"),
    # The old list's chunk drained by the pop, the cursor advanced on the new list.
    ("ids", "batch", "pop"),
])
def test_a_claiming_reservation_across_a_drop_and_a_load_hands_out_each_new_job_once(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, monkeypatch,
    mode: str, how: str, after: str,
) -> None:
    """A reservation that claims (one job; a batch without a lease; a batch sent with
    acks), paused after its take (or, in ID mode, its pop) while the list is dropped and
    loaded again: its claims found the new list's records queued at the tokens it took
    and claimed them, and the new list's leased reservations, trusting their block
    entries, handed them out a second time (their acks refused). In ID mode it popped
    the new list's chunk (or moved the new list's cursor past it) and its claims then
    refused those jobs: held by no one until a sweep. The claims, pops and advances
    carry the take's list stamp now, and each of the new list's jobs is handed out once."""
    n, count = 20, 25 if after == "pop" else 5
    load(lists, list_name, n, tag="old", mode=mode)
    other = f"{list_name}-acked"
    load(lists, other, 1)
    acks = [(queue.reserve(other, session)[0], "r")] if how == "batch with acks" else []
    if how.endswith("after a retry"):
        assert queue.release(queue.reserve(list_name, session)[0]) == "released"
    paused: list[str] = []

    def dropped_and_loaded_after(real: Any) -> Any:
        def call(set_name: str, name: str, module: str, function: str, *args: Any, **kw: Any) -> Any:
            out = real(set_name, name, module, function, *args, **kw)
            if function == after and name.startswith(list_name) and not name.startswith(other) and not paused:
                paused.append(function)
                lists.drop(list_name, grace_s=0)
                load(lists, list_name, n, tag="new", mode=mode)
            return out
        return call

    monkeypatch.setattr(registered, "apply", dropped_and_loaded_after(registered.apply))
    monkeypatch.setattr(registered, "udf", dropped_and_loaded_after(registered.udf))
    if how.startswith("one"):
        claimed = queue.reserve(list_name, session)
    elif how.startswith("lease"):
        claimed = queue.reserve(list_name, session, count, lease=True)
    else:
        claimed, lost = queue.complete_and_reserve(acks, list_name, session, count)
        assert lost == []
    assert paused
    # It took again, from the new list: an ID-mode pop that met the new list's chunk
    # and took nothing had returned nothing, though the list had jobs.
    assert claimed, "the paused reservation returned no job"
    assert how.startswith("lease") or all(j.lease is None for j in claimed)
    each_new_job_once(registered, queue, lists, list_name, session, n, claimed)
    if acks:
        assert states(registered, other, 1) == {"j0": "done"}


def test_a_lease_not_recorded_across_a_drop_and_a_load_claims_none_of_the_new_lists_jobs(
    registered: Backend, queue: Queue, lists: JobLists, list_name: str, session: Session, monkeypatch
) -> None:
    """A leased reservation whose lease was not recorded claims its jobs instead
    (`lease_fallback`). The list dropped and loaded again while the lease was on its
    way: those claims, with the take's stamp, refuse the new list's records at the
    tokens taken, which the new list's own takes hand out, each once."""
    n = 20
    load(lists, list_name, n, tag="old")
    real_lease = session.lease
    paused: list[bool] = []

    def dropped_and_loaded_then_refused(*args: Any, **kwargs: Any) -> Any:
        if paused:
            return real_lease(*args, **kwargs)
        paused.append(True)
        lists.drop(list_name, grace_s=0)
        load(lists, list_name, n, tag="new")
        raise BackendTimeout("the lease's answer was lost")

    monkeypatch.setattr(session, "lease", dropped_and_loaded_then_refused)
    claimed = queue.reserve(list_name, session, 5, lease=True)
    assert paused
    # Its claims refused the new list's records: it took again, from the new list.
    assert claimed, "the reservation returned no job"
    each_new_job_once(registered, queue, lists, list_name, session, n, claimed)
