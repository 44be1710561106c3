"""ID mode: a pop of the ID store that landed but whose answer was lost (a timeout
after the server applied it; on either store, a reserver killed between its pop and
its claims). The pop is not repeated (a second pop takes other IDs), so its IDs have
left their chunk with nobody to claim them: the sweeper finds their jobs (`queued`,
in no chunk, not in the retry store) once untouched for its grace period and offers
them again. Every job then runs exactly once and the list completes.

Every test runs on both stores (AEROQUEUE_TEST_URL for the real server)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aeroqueue import errors, keys
from aeroqueue.backends import Backend
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.sessions import sweep
from tests.logs import whole_lines

ROOT = Path(__file__).resolve().parents[2]
# Each lost answer here leaves a mark that sets a later test's worker sweeping.
pytestmark = pytest.mark.usefixtures("no_marks")


def specs(n: int) -> list[JobSpec]:
    # Not "c<n>": the chaos handler fails or hangs some of those on purpose.
    return [JobSpec(f"p{i}", {"i": i}) for i in range(n)]


def in_chunks(lists: JobLists, name: str) -> set[int]:
    """The tokens still waiting in the list's chunks (from the cursor on)."""
    return set(lists.unpopped_ids(name, lists.header(name)))


@contextlib.contextmanager
def answer_lost(
    backend: Backend, module: str = keys.IDS_MOD, function: str = "pop", *, lands: bool = True
) -> Iterator[list[Any]]:
    """Within the block, `backend`'s first call of UDF `module.function` takes effect
    (unless not `lands`: it fails before it is sent) and its caller gets BackendTimeout
    instead of its answer; yields the list that collects that answer (None if it did
    not land)."""
    real_apply = backend.apply
    answers: list[Any] = []

    def apply(set_name: str, name: str, mod: str, fn: str, *args: Any) -> Any:
        if (mod, fn) == (module, function) and not answers:
            answers.append(real_apply(set_name, name, mod, fn, *args) if lands else None)
            raise errors.BackendTimeout(f"{function}: the answer was lost")
        return real_apply(set_name, name, mod, fn, *args)

    backend.apply = apply
    try:
        yield answers
    finally:
        del backend.apply
    assert len(answers) == 1, f"{function} was sent, and its answer lost"


def test_a_pop_whose_answer_was_lost_leaves_its_jobs_to_the_sweep_then_each_runs_once(
    registered, queue, lists, list_name, session
):
    lists.load(list_name, specs(6), mode="ids", chunk_size=3, seal=True)
    with answer_lost(registered) as taken, pytest.raises(errors.BackendTimeout):
        queue.reserve(list_name, session, 2)
    lost = set(taken[0])
    assert len(lost) == 2 and not lost & in_chunks(lists, list_name), "the pop landed: its IDs left the chunk"
    st = lists.status(list_name)
    assert (st.reservable, st.in_flight, st.complete) == (4, 2, False), st

    rest = queue.reserve(list_name, session, 10)
    assert len(rest) == 4 and not {j.token for j in rest} & lost
    queue.complete_many(rest)
    assert queue.reserve(list_name, session, 10) == [], "nothing hands them out but the sweep"
    assert not lists.status(list_name).complete

    # The grace counts from the job record's last write (its load here, a moment ago).
    sweep(registered, grace_ms=60_000)
    assert queue.reserve(list_name, session, 10) == [], "inside the grace period the sweep leaves them"
    sweep(registered, grace_ms=0)
    again = queue.reserve(list_name, session, 10)
    assert {j.token for j in again} == lost
    assert [j.attempt for j in again] == [1, 1], "never claimed before: no attempt used"
    queue.complete_many(again)
    st = lists.status(list_name)
    assert (st.done, st.in_flight, st.complete) == (6, 0, True), st


@pytest.mark.parametrize("lands", [False, True], ids=["pop-failed", "pop-in-doubt"])
def test_a_pop_that_fails_after_the_take_gave_retry_tokens_claims_those(
    registered, queue, lists, list_name, session, lands
):
    """The take hands out the retry store's tokens and the pops top them up. A pop that
    failed (outright, or in doubt) raised and dropped the tokens the take had removed
    from the retry store: those jobs waited for the sweeper too (a grace period, and
    the sweeps' interval in a worker)."""
    lists.load(list_name, specs(6), mode="ids", chunk_size=3, seal=True, backoff_s=0)
    (first,) = queue.reserve(list_name, session, 1)
    assert queue.fail(first, "boom") == "retry"  # onto the retry store
    with answer_lost(registered, lands=lands) as taken:
        got = queue.reserve(list_name, session, 3)
    popped = set(taken[0] or [])
    assert len(popped) == (2 if lands else 0)
    assert first.token in {j.token for j in got}, "the retried job is claimed, not dropped"
    assert first.token not in in_chunks(lists, list_name) | set(lists.header(list_name)["retry"])
    assert not popped & {j.token for j in got}, "what the lost answer took is the sweep's"
    queue.complete_many(got)
    while more := queue.reserve(list_name, session, 10):
        queue.complete_many(more)
    st = lists.status(list_name)
    assert (st.done, st.in_flight) == (6 - len(popped), len(popped)), st
    if lands:
        sweep(registered, grace_ms=0)
        again = queue.reserve(list_name, session, 10)
        assert {j.token for j in again} == popped
        queue.complete_many(again)
    st = lists.status(list_name)
    assert (st.done, st.complete) == (6, True), st


def test_an_advance_that_fails_after_a_pop_claims_what_the_pop_took(registered, queue, lists, list_name, session):
    """A pop that drained its chunk short of the count moves the cursor on (`advance`)
    and pops the next chunk. An advance that failed raised and dropped what the pop had
    taken: those jobs waited for the sweeper."""
    lists.load(list_name, specs(6), mode="ids", chunk_size=3, seal=True)
    with answer_lost(registered, keys.LIST_MOD, "advance", lands=False):
        got = queue.reserve(list_name, session, 4)
    # The reservation's next take moved the cursor on and topped the count up.
    assert sorted(j.token for j in got) == [0, 1, 2, 3], "the first chunk's jobs are claimed, not dropped"
    rest = queue.reserve(list_name, session, 10)
    assert sorted(j.token for j in rest) == [4, 5]
    queue.complete_many(got + rest)
    assert lists.status(list_name).complete, "no job was left to the sweeper"


# A worker killed (SIGKILL) right after its first pop landed, before any claim: it
# prints what the pop took, and nothing after that runs.
_POP_THEN_DIE = """
import os, signal, sys
from aeroqueue import transitions
from aeroqueue.cli import main

real_ids_once = transitions.ids_once

def ids_once(backend, chunk, function, *args, **kwargs):
    answer = real_ids_once(backend, chunk, function, *args, **kwargs)
    if function == "pop" and answer:
        print(" ".join(map(str, answer)), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    return answer

transitions.ids_once = ids_once
sys.argv = ["aeroqueue", *sys.argv[1:]]
main()
"""
N_JOBS = 20


def test_a_worker_killed_between_its_pop_and_its_claims_loses_no_job(
    registered, lists, list_name, store_url, tmp_path
):
    """Real processes: a worker is killed after its pop took IDs from a chunk and before
    it claimed them; a second worker, sweeping, runs every job (once) to completion."""
    lists.load(list_name, specs(N_JOBS), mode="ids", chunk_size=8, seal=True)
    logs = tmp_path / "logs"
    logs.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AEROQUEUE_CHAOS_LOG": str(logs)}
    worker = ["--url", store_url, "worker", "--handler", "tests.sessions.chaos_handler:handle", "--list", list_name,
              "--heartbeat", "0.25", "--expiry", "2", "--log-format", "json"]
    victim = subprocess.run([sys.executable, "-c", _POP_THEN_DIE, *worker, "--batch", "5"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert victim.returncode == -signal.SIGKILL, (victim.returncode, victim.stderr[-2000:])
    popped = {int(t) for t in victim.stdout.split()}
    assert popped and not popped & in_chunks(lists, list_name), "the pop landed: its IDs left the chunk"
    assert {lists.find_job(list_name, f"p{t}")["state"] for t in popped} == {"queued"}, "nobody claimed them"
    assert not list(logs.glob("exec-*.log")), "the victim ran nothing"
    st = lists.status(list_name)
    assert (st.in_flight, st.reservable, st.complete) == (len(popped), N_JOBS - len(popped), False), st

    # The rescuer's own sweeps (every second or so, for jobs untouched for a second)
    # must find them: --until-complete exits only once the list is complete.
    rescuer = subprocess.Popen(
        [sys.executable, "-m", "aeroqueue", *worker, "--until-complete", "--sweep-every", "1", "--sweep-grace", "1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        _, err = rescuer.communicate(timeout=120)  # a bound, not a measure: it takes seconds
    except subprocess.TimeoutExpired:
        rescuer.kill()
        rescuer.communicate()
        pytest.fail(f"the list never completed: {lists.status(list_name)}, popped {sorted(popped)}, "
                    f"in chunks {sorted(in_chunks(lists, list_name))}")
    assert rescuer.returncode == 0, (rescuer.returncode, err[-2000:])

    runs = Counter(line.split()[0] for log in logs.glob("exec-*.log") for line in whole_lines(log))
    assert runs == Counter({f"p{i}": 1 for i in range(N_JOBS)}), "every job ran exactly once"
    for i in range(N_JOBS):
        job = lists.find_job(list_name, f"p{i}")
        assert (job["state"], job["att"]) == ("done", 1), (i, job)
    st = lists.status(list_name)
    assert (st.done, st.dead, st.in_flight, st.complete) == (N_JOBS, 0, 0, True), st


def test_a_pop_during_a_sweeps_scan_is_not_taken_for_a_lost_one(registered, queue, lists, list_name, session,
                                                                  monkeypatch):
    """The sweep tells a lost ID-mode job (popped, never claimed) by its ID being in no
    chunk. It read the chunks after its scan: an ID a live reserver popped meanwhile,
    its claim a round trip away, was offered again, and waited in the retry store while
    it ran (a wasted claim later). The chunks are read with the heads, before the scan,
    as the token store's head is: what is popped after them is the poppers'."""
    from aeroqueue import transitions

    lists.load(list_name, specs(3), mode="ids", chunk_size=3, seal=True)
    real_scan = registered.scan
    popped: list[int] = []

    def scan(set_name: str, **kw: Any) -> Any:
        if set_name == keys.JOB_SET and not popped:
            # A reserver pops now, after the sweep read the heads; it claims later.
            popped.extend(transitions.ids_once(registered, keys.chunk_name(list_name, 0), "pop", 1))
        return real_scan(set_name, **kw)

    monkeypatch.setattr(registered, "scan", scan)
    sweep(registered, grace_ms=0)  # (on a shared server, other tests' lists too: its count is theirs as well)
    assert len(popped) == 1
    assert popped[0] not in (lists.header(list_name).get("retry") or []), \
        "the job a live reserver just popped was offered again"
