"""The native claim and complete (aeroqueue/hotpath.py) against the Lua functions they
stand in for: the same record afterwards, the same cases left to the UDF, and the
queue really taking the native path. Every test runs on both backends."""

from __future__ import annotations

import time
from typing import Any

import pytest

from aeroqueue import hotpath, keys
from aeroqueue.backends import Backend
from aeroqueue.loading import JobSpec
from aeroqueue.queue import Job, Queue

# Bins whose values are the server's clock: compared as differences, not values.
CLOCK = ("claimed", "dl", "done_at")


def load(lists: Any, name: str, n: int, **kw: Any) -> None:
    lists.load(name, [JobSpec(f"j{i}", {"i": i}, None, None) for i in range(n)], **kw)


def bins(backend: Backend, name: str, token: int) -> dict[str, Any]:
    rec = backend.get(keys.JOB_SET, keys.job_name(name, token))
    assert rec is not None
    return dict(rec.bins)


def udf(backend: Backend, name: str, token: int, fn: str, *args: Any) -> Any:
    return backend.udf(keys.JOB_SET, keys.job_name(name, token), keys.JOB_MOD, fn, *args)


def same_but_clock(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert {k: v for k, v in a.items() if k not in CLOCK} == {k: v for k, v in b.items() if k not in CLOCK}
    assert a.keys() == b.keys()


def test_native_claim_and_complete_write_what_the_udfs_write(registered: Backend, lists: Any, list_name: str) -> None:
    load(lists, list_name, 2)
    t0 = int(time.time() * 1000)
    by_udf = udf(registered, list_name, 0, "claim", "s1", "r1", 60_000)
    by_native = hotpath.claim(registered, list_name, 1, "s1", "r1", 60_000)
    assert by_native is not None and by_udf["st"] == by_native["st"] == "ok"
    assert {k: v for k, v in by_native.items() if k not in ("dl", "jid", "payload", "token")} == {
        k: v for k, v in by_udf.items() if k not in ("dl", "jid", "payload", "token")
    }
    assert (by_native["jid"], by_native["payload"], by_native["token"]) == ("j1", {"i": 1}, 1)
    u, n = bins(registered, list_name, 0), bins(registered, list_name, 1)
    for b in (u, n):  # the server's clock, on both paths
        # (each reads the server's clock as it runs: a millisecond may pass between them)
        assert b["dl"] - b["claimed"] in (60_000, 60_001) and abs(b["claimed"] - t0) < 5_000
    u.pop("token"), n.pop("token"), u.pop("jid"), n.pop("jid"), u.pop("payload"), n.pop("payload")
    same_but_clock(u, n)

    assert udf(registered, list_name, 0, "complete", "s1", {0: {"ok": 1}}, "r1") == "ok"
    assert hotpath.complete(registered, keys.job_name(list_name, 1), "s1", "r1", {"ok": 1})
    u, n = bins(registered, list_name, 0), bins(registered, list_name, 1)
    assert n["state"] == "done" and n["by"] == "s1" and n["result"] == {"ok": 1} and "sess" not in n
    assert abs(n["done_at"] - u["done_at"]) < 5_000
    for b in (u, n):
        b.pop("token"), b.pop("jid"), b.pop("payload")
    same_but_clock(u, n)
    # A repeated ack after a native one is recognised by the UDF, as after its own.
    assert udf(registered, list_name, 1, "complete", "s1", {1: None}, "r1") == "again"


def test_the_fast_path_leaves_every_other_case_to_the_udf(registered: Backend, lists: Any, list_name: str) -> None:
    load(lists, list_name, 3, timeout_s=0.3)
    job0 = keys.job_name(list_name, 0)
    assert hotpath.claim(registered, list_name, 0, "s1", "r1", 300) is not None
    # Claimed already (even by this very request): the UDF decides.
    assert hotpath.claim(registered, list_name, 0, "s1", "r1", 300) is None
    assert udf(registered, list_name, 0, "claim", "s1", "r1", 300)["st"] == "ok"  # a repeat, recognised
    # Not the holder, not this claim: refused natively, and the UDF says why.
    assert not hotpath.complete(registered, job0, "s2", "r1", None)
    assert not hotpath.complete(registered, job0, "s1", "r2", None)
    assert udf(registered, list_name, 0, "complete", "s2", {0: None}, "r1") == "lost"
    # Past its time limit by the server's clock: refused, and the UDF says 'late'.
    time.sleep(0.6)
    assert not hotpath.complete(registered, job0, "s1", "r1", None)
    assert udf(registered, list_name, 0, "complete", "s1", {0: None}, "r1") == "late"
    assert bins(registered, list_name, 0)["state"] == "claimed"
    # A job that does not exist is left alone: no record is made for it.
    assert hotpath.claim(registered, list_name, 99, "s1", "r1", 300) is None
    assert not hotpath.complete(registered, keys.job_name(list_name, 99), "s1", "r1", None)
    assert registered.get(keys.JOB_SET, keys.job_name(list_name, 99)) is None
    # A call the server runs past its deadline (a frozen node resuming) changes nothing.
    past, future = int(time.time() * 1000) - 60_000, int(time.time() * 1000) + 60_000
    assert hotpath.claim(registered, list_name, 2, "s1", "r9", 300, deadline=past) is None
    assert bins(registered, list_name, 2)["state"] == "queued"
    got = hotpath.claim(registered, list_name, 2, "s1", "r9", 60_000, deadline=future)
    assert got is not None and got["jid"] == "j2"
    assert not hotpath.complete(registered, keys.job_name(list_name, 2), "s1", "r9", None, deadline=past)
    assert hotpath.complete(registered, keys.job_name(list_name, 2), "s1", "r9", None, deadline=future)
    # In a batch: the claimable one is claimed, the others say why not.
    out = hotpath.claim_many(
        registered, [keys.job_name(list_name, t) for t in (1, 0, 99)], "s3", "r3", 60_000
    )
    assert [code for code, _ in out] == [0, 27, 2] and all(code in hotpath.TO_UDF for code, _ in out[1:])
    assert [bins for _, bins in out[1:]] == [None, None]
    answer = hotpath.claimed(out[0][1])
    assert answer["st"] == "ok" and answer["jid"] == "j1" and answer["att"] == 1


class CountingBackend:
    """The store, counting which UDFs were called (by function name)."""

    def __init__(self, inner: Backend) -> None:
        self.inner, self.udfs = inner, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def udf(self, set_name: str, name: str, module: str, function: str, *args: Any, **kw: Any) -> Any:
        self.udfs.append(function)
        return self.inner.udf(set_name, name, module, function, *args, **kw)

    def apply(self, set_name: str, name: str, module: str, function: str, *args: Any) -> Any:
        self.udfs.append(function)
        return self.inner.apply(set_name, name, module, function, *args)

    def batch_apply(self, set_name: str, names: list[str], module: str, function: str, *args: Any) -> Any:
        self.udfs.extend([function] * len(names))
        return self.inner.batch_apply(set_name, names, module, function, *args)

    def batch_udf(self, set_name: str, calls: list, module: str, function: str) -> Any:
        self.udfs.extend([function] * len(calls))
        return self.inner.batch_udf(set_name, calls, module, function)


@pytest.mark.parametrize("count", [1, 3, 5])
def test_the_queue_claims_and_acks_natively(registered: Backend, lists: Any, list_name: str, count: int) -> None:
    """A plain batch reserve and ack calls no job UDF at all: only `take` on the list.
    Acks in a batch share one result (3: the cheaper form) or carry their own (5).
    One job at a time goes to the UDFs, which cost the client less (1)."""
    load(lists, list_name, 10)
    spy = CountingBackend(registered)
    q = Queue(spy)  # type: ignore[arg-type]
    got = q.reserve(list_name, "sess-a", count)
    assert len(got) == count
    if count == 1:
        q.complete(got[0], {"r": 0})
    else:
        results = [None] * count if count == 3 else [{"r": i} for i in range(count)]
        assert q.complete_many(got, results) == []
    q.flush()
    if count == 1:
        assert spy.udfs == ["take", "claim", "complete"], spy.udfs
    else:
        assert "claim" not in spy.udfs and "complete" not in spy.udfs, spy.udfs
    for i, job in enumerate(got):
        b = bins(registered, list_name, job.token)
        assert b["state"] == "done" and b["by"] == "sess-a"
        assert b.get("result") == ({"r": i} if count != 3 else None)
    assert lists.status(list_name).done == count


def test_the_queue_falls_back_to_the_udf_and_keeps_its_answers(registered: Backend, lists: Any, list_name: str) -> None:
    """A repeated ack, a lost claim and a late one go through the UDF, with its answers."""
    load(lists, list_name, 3, timeout_s=0.4)
    q = Queue(registered)
    a, b, c = q.reserve(list_name, "sess-b", 3)
    q.complete(a)
    q.complete(a)  # repeated: harmless ('again')
    stranger = Job(list=b.list, token=b.token, jid=b.jid, payload=b.payload, attempt=1, session="other", rid=b.rid)
    with pytest.raises(Exception, match="was lost"):
        q.complete(stranger)
    assert q.complete_many([a, b]) == []  # a again, b natively
    time.sleep(0.8)
    with pytest.raises(Exception, match="past its time limit"):
        q.complete(c)
    assert q.complete_many([a, c]) == [c]  # a again, c late
    q.flush()
    assert [bins(registered, list_name, t)["state"] for t in (a.token, b.token, c.token)] == ["done", "done", "claimed"]
