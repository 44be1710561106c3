"""Job transitions, and the list calls workers make, carry a deadline: a call the
server runs after its sender gave up on it changes nothing ('stale'). On a cluster, a node frozen past the heartbeat
timeout runs, when it resumes, the calls that waited in its sockets, on its stale
copy, and Aerospike CE lets that stale result replace the newer record the rest of
the cluster made meanwhile (tests/multinode/test_replay.py shows it on a real
cluster). Here: the UDFs' side and the client's, on the embedded store (the ID store's
calls on the real server too, when there is one)."""

from __future__ import annotations

import time
import uuid

import pytest

from aeroqueue import errors, keys, udfs
from aeroqueue.backends import Backend, open_backend
from aeroqueue.backends.base import CLIENT_SOCKET_TIMEOUT_MS, CLIENT_TIMEOUT_MS, CLOCK_MARGIN_MS
from aeroqueue.config import parse_url
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Queue
from aeroqueue.sessions import Session

PAST = 1  # Unix ms: long gone by any clock
FUTURE = 2**53


@pytest.fixture
def backend(tmp_path):
    b = open_backend(f"embedded://{tmp_path / 's.db'}")
    udfs.register(b)
    JobLists(b).load("L", [JobSpec(f"j{i}", {}) for i in range(3)], seal=True)
    return b


def _job(backend: Backend, token: int):
    return backend.get(keys.JOB_SET, keys.job_name("L", token))


def _call(backend: Backend, token: int, function: str, *args):
    return backend.apply(keys.JOB_SET, keys.job_name("L", token), keys.JOB_MOD, function, *args)


CLAIMED_CALLS = [  # every transition of a claimed job, with its arguments up to the request id
    ("complete", ("s", {0: "r"}, "rid")),
    ("fail", ("s", "boom", 0, "rid")),
    ("expire", ("s", 0, "why", "rid")),
    ("release", ("s", 1, "why", "rid")),
    ("snooze", ("s", 1000, "rid")),
    ("touch", ("s", 60_000, "rid")),
]


@pytest.mark.parametrize(("function", "args"), CLAIMED_CALLS, ids=[f for f, _ in CLAIMED_CALLS])
def test_a_transition_past_its_deadline_changes_nothing(backend, function, args):
    assert _call(backend, 0, "claim", "s", "rid", 300_000, FUTURE)["st"] == "ok"
    before = _job(backend, 0)
    out = _call(backend, 0, function, *args, PAST)
    assert out == "stale" or out == {"st": "stale"}
    after = _job(backend, 0)
    assert (after.gen, after.bins) == (before.gen, before.bins), f"{function} past its deadline wrote"
    # Before its deadline (or with none: older clients) it acts as ever.
    assert _call(backend, 0, function, *args, FUTURE) not in ("stale", {"st": "stale"})
    if function != "expire":  # 'early': the claim's time limit has not run out
        assert _job(backend, 0).gen == before.gen + 1


OPERATOR_CALLS = [("bury", ("an operator",)), ("kick", ())]


@pytest.mark.parametrize(("function", "args"), OPERATOR_CALLS, ids=[f for f, _ in OPERATOR_CALLS])
def test_an_operators_call_past_its_deadline_changes_nothing(backend, function, args):
    """Replayed late by a frozen node on its stale copy (the job still dead there), a
    kick would bring back, queued with fresh attempts, a job the cluster has run again
    and completed since, its result lost; a bury would bury a job kicked since."""
    if function == "kick":
        assert _call(backend, 0, "bury", "an operator", FUTURE) == "dead"
    before = _job(backend, 0)
    assert _call(backend, 0, function, *args, PAST) == "stale"
    after = _job(backend, 0)
    assert (after.gen, after.bins) == (before.gen, before.bins), f"{function} past its deadline wrote"
    assert _call(backend, 0, function, *args, FUTURE) == ("ok" if function == "kick" else "dead")
    assert _job(backend, 0).gen == before.gen + 1
    # No deadline (an older client): as ever.
    assert _call(backend, 1, "bury", "an operator") == "dead" and _call(backend, 1, "kick") == "ok"


def test_a_job_call_given_too_many_arguments_is_refused_before_it_is_sent(backend):
    """The deadline follows a fixed number of arguments: one too many would take its
    place, and the UDF would read the extra argument as its deadline."""
    from aeroqueue import transitions

    with pytest.raises(TypeError, match="bury takes 1 argument"):
        transitions.job_once(backend, keys.job_name("L", 0), "bury", "why", "one too many")
    assert _job(backend, 0).bins["state"] == "queued"


def test_a_claim_past_its_deadline_takes_nothing(backend):
    before = _job(backend, 1)
    assert _call(backend, 1, "claim", "s", "rid", 300_000, PAST) == {"st": "stale"}
    assert _job(backend, 1).gen == before.gen and _job(backend, 1).bins["state"] == "queued"
    assert _call(backend, 1, "claim", "s", "rid", 300_000)["st"] == "ok", "no deadline: as before"


def test_a_session_call_past_its_deadline_changes_nothing(backend, monkeypatch):
    """aq_sess_v1's open, beat and unlease (tests/multinode/test_sess_replay.py shows the
    replay they are kept from: a late beat took back the leases recorded since). The
    client's heartbeat refused so is a failed one, not a lost session: the next goes."""
    with Session.open(backend, heartbeat=False) as s:
        jobs = Queue(backend).reserve("L", s, 2, lease=True)
        assert jobs[0].lease is not None
        before = backend.get(keys.SESS_SET, s.id)
        [lid] = before.bins["leases"]
        for function, args in (("beat", (None,)), ("unlease", ([lid],))):
            assert backend.apply(keys.SESS_SET, s.id, keys.SESS_MOD, function, *args, PAST) == "stale", function
        after = backend.get(keys.SESS_SET, s.id)
        assert (after.gen, after.bins) == (before.gen, before.bins)
        monkeypatch.setattr(backend, "job_deadline", lambda: PAST)
        with pytest.raises(errors.StaleRequest):
            s.beat()
        assert not s.lost
        monkeypatch.undo()
        assert s.beat()
        Queue(backend).complete_many(jobs)
    assert backend.apply(keys.SESS_SET, "late", keys.SESS_MOD, "open", "host", 1, 5000, PAST) == "stale"
    assert backend.get(keys.SESS_SET, "late") is None


def test_the_deadline_is_the_clients_timeout_plus_a_margin():
    def deadline(url: str) -> int | None:
        return Backend(client=None, url=parse_url(url)).job_deadline()

    now = time.time() * 1000
    got = deadline("aerospike://10.0.0.1:3000/test")
    assert got is not None and -1 <= got - now - (CLIENT_TIMEOUT_MS + CLOCK_MARGIN_MS) < 1000
    got = deadline("aerospike://10.0.0.1:3000/test?total_timeout=300")
    assert got is not None and -1 <= got - now - (300 + CLOCK_MARGIN_MS) < 1000
    got = deadline("aerospike://10.0.0.1:3000/test?total_timeout=0&socket_timeout=200")
    assert got is not None and -1 <= got - now - (200 + CLOCK_MARGIN_MS) < 1000
    # total_timeout=0 alone: the client still gives a call up after its own socket
    # timeout (30 s), so a late run of it is refused past that (README: "socket_timeout
    # when that is 0"), not let through with no deadline at all.
    got = deadline("aerospike://10.0.0.1:3000/test?total_timeout=0")
    assert got is not None and -1 <= got - now - (CLIENT_SOCKET_TIMEOUT_MS + CLOCK_MARGIN_MS) < 1000
    assert deadline("aerospike://10.0.0.1:3000/test?total_timeout=0&socket_timeout=0") is None, "no limit: no deadline"
    assert deadline("embedded:///tmp/x.db") is None, "one process, no replicas: nothing to replay"


def test_a_refused_transition_is_sent_again_with_a_new_deadline(backend, monkeypatch):
    """A 'stale' answer that reaches the client (the call waited in a queue past its
    deadline) did nothing: the client repeats it, with a fresh deadline."""
    queue = Queue(backend, busy_deadline_s=2.0)
    given: list[int | None] = []

    def deadline() -> int | None:
        given.append(PAST if len(given) in (1, 2) else FUTURE)  # the take's passes, the claim's does not
        return given[-1]

    with Session.open(backend, heartbeat=False) as s:
        monkeypatch.setattr(backend, "job_deadline", deadline)
        [job] = queue.reserve("L", s)  # claimed after two refusals
        queue.complete(job, "ok")
        monkeypatch.undo()
    assert given == [FUTURE, PAST, PAST, FUTURE, FUTURE]  # take, claim (three times), complete
    assert _job(backend, job.token).bins["state"] == "done"


def test_a_transition_refused_until_the_end_says_why(backend, monkeypatch):
    queue = Queue(backend, busy_deadline_s=0.3)
    with Session.open(backend, heartbeat=False) as s:
        [job] = queue.reserve("L", s)
        monkeypatch.setattr(backend, "job_deadline", lambda: PAST)
        with pytest.raises(errors.StaleRequest, match=r"complete on aq_job/L/\d+: the server ran it after the deadline"):
            queue.complete(job, "ok")
        monkeypatch.undo()
        assert _job(backend, job.token).bins["state"] == "claimed", "nothing was done"


def _list(backend: Backend, name: str = "L"):
    return backend.get(keys.LIST_SET, name)


def _list_call(backend: Backend, function: str, *args, name: str = "L"):
    return backend.apply(keys.LIST_SET, name, keys.LIST_MOD, function, *args)


LIST_CALLS = [  # every list call that writes, with its arguments before the deadline
    ("take", ("L", 2)),
    ("advance", ("I", 0)),
    ("push_retry", ("L", [0], 1000, 0)),
    ("schedule", ("L", [1], 1000, 1000, 0)),
    ("unschedule", ("L", [1])),
    ("reopen", ("L",)),
    ("tune", ("L", {"tlim": 5000})),
    ("set_flag", ("L", "paused", 1)),
    ("mark_complete", ("L", 0)),
    ("tombstone", ("L",)),
    ("create", ("N", "tokens", 3, {}, 0)),
    ("alloc", ("O", 5, 60_000, "rid", None)),
]


@pytest.mark.parametrize(("function", "args"), LIST_CALLS, ids=[f for f, _ in LIST_CALLS])
def test_a_list_call_past_its_deadline_changes_nothing(backend, function, args):
    """Run late by a frozen node that resumed, a list call would replace the list record
    the cluster made meanwhile with its stale copy: `head` goes back, and the token
    store hands out again what it handed out, which a leased job (its record stays
    queued while it runs) would run twice."""
    JobLists(backend).load("I", [JobSpec(f"i{i}", {}) for i in range(3)], mode="ids", seal=True)
    JobLists(backend).create("O")
    if function == "schedule" or function == "unschedule":
        _list_call(backend, "schedule", [1], 1000, 1000, 0, FUTURE)
    name, *rest = args
    before = _list(backend, name)
    assert _list_call(backend, function, *rest, PAST, name=name) in ("stale", {"st": "stale"})
    after = _list(backend, name)
    assert (after and (after.gen, after.bins)) == (before and (before.gen, before.bins)), f"{function} past its deadline wrote"
    # Before its deadline (or with none: older clients) it acts as ever.
    assert _list_call(backend, function, *rest, FUTURE, name=name) not in ("stale", {"st": "stale"})
    assert _list(backend, name).gen == (before.gen if before else 0) + 1, f"{function} before its deadline wrote nothing"


@pytest.mark.parametrize("count", [1, 3], ids=["one job", "a batch"])
def test_a_refused_take_is_sent_again_with_a_new_deadline(backend, monkeypatch, count):
    queue = Queue(backend, busy_deadline_s=2.0)
    given: list[int | None] = []

    def deadline() -> int | None:
        given.append(PAST if len(given) < 2 else FUTURE)
        return given[-1]

    monkeypatch.setattr(backend, "job_deadline", deadline)
    with Session.open(backend, heartbeat=False) as s:
        jobs = queue.reserve("L", s, count)
    assert len(jobs) == count and given[:3] == [PAST, PAST, FUTURE]
    assert _list(backend).bins["head"] == count, "one take landed"


def test_a_refused_push_is_sent_again_and_one_refused_until_the_end_says_why(backend, monkeypatch):
    from aeroqueue import transitions

    given: list[int | None] = []

    def deadline() -> int | None:
        given.append(PAST if len(given) < 2 else FUTURE)
        return given[-1]

    monkeypatch.setattr(backend, "job_deadline", deadline)
    assert transitions.push_retry(backend, "L", [2]) == 1
    assert given == [PAST, PAST, FUTURE] and _list(backend).bins["retry"] == [2], "pushed once"
    monkeypatch.setattr(backend, "job_deadline", lambda: PAST)
    with pytest.raises(errors.StaleRequest, match=r"push_retry on aq_list/L: the server ran it after the deadline"):
        transitions.push_retry(backend, "L", [1])
    assert _list(backend).bins["retry"] == [2], "nothing was done"


def test_a_list_call_that_leaves_optional_arguments_out_gets_its_deadline_in_its_own_place(backend, monkeypatch):
    """alloc's `created` is optional: given after the arguments a caller gave, the
    deadline would land in it, and the list would look made again ('missing')."""
    lists = JobLists(backend)
    lists.create("P")
    monkeypatch.setattr(backend, "job_deadline", lambda: FUTURE)
    got = lists._list_udf("P", "alloc", 5, 60_000, "rid")  # no `created`
    assert got["st"] == "ok" and got["start"] == 0
    monkeypatch.setattr(backend, "job_deadline", lambda: PAST)
    with pytest.raises(errors.StaleRequest, match="alloc on aq_list/P"):
        lists._list_udf("P", "alloc", 5, 60_000, "rid2")
    with pytest.raises(TypeError, match="takes 4 argument"):
        lists._list_udf("P", "alloc", 5, 60_000, "rid", None, "one too many")


def test_a_busy_key_is_retried_with_a_fresh_deadline_each_time(backend, monkeypatch):
    """A hot list record answers KEY_BUSY for a while: retried with the deadline
    taken once, every retry after it ran out would be refused ('stale')."""
    from aeroqueue import transitions

    deadlines: list[int] = []
    monkeypatch.setattr(backend, "job_deadline", lambda: deadlines.append(FUTURE + len(deadlines)) or deadlines[-1])
    real_apply, seen = backend.apply, []

    def busy_twice(*args):
        seen.append(args[-1])
        if len(seen) <= 2:
            raise errors.RecordBusy("hot key", operation="apply", key=args[1])
        return real_apply(*args)

    monkeypatch.setattr(backend, "apply", busy_twice)
    assert transitions.push_retry(backend, "L", [2]) == 1
    assert seen == deadlines == [FUTURE, FUTURE + 1, FUTURE + 2], "a deadline of its own for each attempt"


# -- the ID store (aq_ids_v1), on both stores -----------------------------------


@pytest.fixture
def store(store_url):
    b = open_backend(store_url)
    udfs.register(b)
    yield b
    b.close()


def _ids_list(store: Backend, n: int = 3) -> tuple[str, str]:
    """A sealed ID-mode list of `n` jobs in one chunk: its name and its chunk's."""
    name = f"t-{uuid.uuid4().hex[:12]}"  # a shared server: a list of its own
    JobLists(store).load(name, [JobSpec(f"i{i}", {}) for i in range(n)], mode="ids", seal=True)
    return name, keys.chunk_name(name, 0)


def _chunk(store: Backend, chunk: str):
    return store.get(keys.IDS_SET, chunk)


IDS_CALLS = [("pop", (2,)), ("remove", ([1],))]  # every ID store call (all write), its arguments before the deadline


@pytest.mark.parametrize(("function", "args"), IDS_CALLS, ids=[f for f, _ in IDS_CALLS])
def test_an_id_store_call_past_its_deadline_changes_nothing(store, function, args):
    """Run late by a frozen node that resumed, a pop or a remove would replace the chunk
    the cluster wrote meanwhile with its stale copy: IDs popped since are handed out
    again, a kicked job's ID comes back."""
    _, chunk = _ids_list(store)
    before = _chunk(store, chunk)
    assert store.apply(keys.IDS_SET, chunk, keys.IDS_MOD, function, *args, PAST) == "stale"
    after = _chunk(store, chunk)
    assert (after.gen, after.bins) == (before.gen, before.bins), f"{function} past its deadline wrote"
    # Before its deadline (or with none: older clients) it acts as ever.
    assert store.apply(keys.IDS_SET, chunk, keys.IDS_MOD, function, *args, FUTURE) in ([0, 1], 1)
    assert _chunk(store, chunk).gen == before.gen + 1
    assert store.apply(keys.IDS_SET, chunk, keys.IDS_MOD, "pop", 1) == ([2] if function == "pop" else [0])
    with pytest.raises(TypeError, match=f"{function} takes 1 argument"):
        from aeroqueue import transitions

        transitions.ids_once(store, chunk, function, *args, "one too many")


def test_a_refused_pop_is_sent_again_with_a_new_deadline(store, monkeypatch):
    name, chunk = _ids_list(store)
    queue = Queue(store, busy_deadline_s=2.0)
    given: list[int | None] = []

    def deadline() -> int | None:
        given.append(PAST if len(given) in (1, 2) else FUTURE)  # the take's passes, the pop's does not
        return given[-1]

    with Session.open(store, heartbeat=False) as s:
        monkeypatch.setattr(store, "job_deadline", deadline)
        [job] = queue.reserve(name, s)
        monkeypatch.undo()
        queue.complete(job, "ok")
    assert given == [FUTURE, PAST, PAST, FUTURE, FUTURE]  # take, pop (three times), claim
    assert job.token == 0 and _chunk(store, chunk).bins["ids"] == [1, 2], "popped once"


def test_a_pop_refused_until_the_end_says_why_and_took_nothing(store, monkeypatch):
    name, chunk = _ids_list(store)
    before = _chunk(store, chunk)
    queue = Queue(store, busy_deadline_s=0.3)
    given: list[int | None] = []
    with Session.open(store, heartbeat=False) as s:
        monkeypatch.setattr(store, "job_deadline", lambda: given.append(PAST if given else FUTURE) or given[-1])
        with pytest.raises(errors.StaleRequest, match=rf"pop on aq_ids/{name}/0: the server ran it after the deadline"):
            queue.reserve(name, s)
        monkeypatch.undo()
    assert len(given) > 2 and _chunk(store, chunk).gen == before.gen, "nothing was popped"


def test_a_refused_unchunk_is_sent_again_with_a_new_deadline(store, monkeypatch):
    """A kick takes the job's ID out of the chunk not popped yet (`_unchunk`)."""
    from aeroqueue import transitions

    name, chunk = _ids_list(store)
    given: list[int | None] = []

    def deadline() -> int | None:
        given.append(PAST if len(given) < 2 else FUTURE)
        return given[-1]

    created = store.get(keys.LIST_SET, name).bins["created"]
    monkeypatch.setattr(store, "job_deadline", deadline)
    transitions._unchunk(store, name, [1], created)
    assert given == [PAST, PAST, FUTURE] and _chunk(store, chunk).bins["ids"] == [0, 2], "removed once"
