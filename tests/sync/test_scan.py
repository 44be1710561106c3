"""Scans stream: a page at a time, whatever the size of the partitions scanned."""

from __future__ import annotations

import math

from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import operations as op


def test_a_scan_reads_one_page_at_a_time(backend, set_name):
    n = 60
    codes = backend.batch_operate(set_name, [(f"r{i}", [op.write("i", i), op.write("odd", i % 2)]) for i in range(n)])
    assert codes == [0] * n
    try:
        before = backend.round_trips
        records = backend.scan(set_name, page_size=7)
        first = next(records)
        assert backend.round_trips - before == 1, "the first record came with the first page only"
        rest = list(records)
        pages = backend.round_trips - before
        assert sorted(r.bins["i"] for _, r in [first, *rest]) == list(range(n))
        assert math.ceil(n / 7) <= pages <= math.ceil(n / 7) + 1, "pages of at most 7 records"
        odd = exp.Eq(exp.IntBin("odd"), 1).compile()
        got = list(backend.scan(set_name, begin=1000, count=2000, expression=odd, page_size=3))
        assert all(r.bins["odd"] == 1 for _, r in got)
        assert {name for name, _ in got} <= {f"r{i}" for i in range(1, n, 2)}
    finally:
        backend.batch_operate(set_name, [(f"r{i}", [op.delete()]) for i in range(n)])


def test_batch_operate_update_only_never_creates(backend, set_name):
    backend.put(set_name, "here", {"v": 1})
    assert backend.batch_operate(set_name, [("here", [op.write("m", 5)]), ("gone", [op.write("m", 5)])],
                                 update_only=True) == [0, 2]
    assert backend.get(set_name, "gone") is None
    assert backend.get(set_name, "here").bins == {"v": 1, "m": 5}
    backend.remove(set_name, "here")


def test_a_page_that_fails_is_asked_again_without_skipping_or_repeating(backend, set_name, monkeypatch):
    from aerospike import exception as aex

    n = 40
    backend.batch_operate(set_name, [(f"r{i}", [op.write("i", i)]) for i in range(n)])
    real_query = backend.client.query
    calls = {"n": 0}

    class Flaky:
        """The client's query, whose third page fails as a migrating partition would."""

        def __init__(self, query):
            self._q = query

        def __getattr__(self, name):
            return getattr(self._q, name)

        def __setattr__(self, name, value):
            if name == "_q":
                object.__setattr__(self, name, value)
            else:
                setattr(self._q, name, value)

        def results(self, policy=None):
            calls["n"] += 1
            got = self._q.results(policy)  # the failed call may still move the query's resume points
            if calls["n"] == 3:
                error = aex.ServerError()
                error.code, error.msg = 11, "partition unavailable"
                raise error
            return got

    class Client:
        def __init__(self, client):
            self._c = client

        def __getattr__(self, name):
            return getattr(self._c, name)

        def query(self, ns, s):
            return Flaky(real_query(ns, s))

    monkeypatch.setattr(backend, "client", Client(backend.client))
    try:
        got = [r.bins["i"] for _, r in backend.scan(set_name, page_size=6)]
    finally:
        monkeypatch.undo()
        backend.batch_operate(set_name, [(f"r{i}", [op.delete()]) for i in range(n)])
    assert calls["n"] > 3, "the failed page was asked for again"
    assert sorted(got) == list(range(n)), "nothing skipped, nothing twice"
