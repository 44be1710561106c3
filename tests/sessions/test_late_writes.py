"""The release pass's offer mark and the sweep's fence carry a deadline: run late by
a node frozen past the heartbeat timeout, each passes its checks on the node's stale
copy (the released or lost job, at the generation the sweep read), and its replica
write replaces the job claimed and completed since on the live nodes (README: a
frozen node replays the calls it was sent). Past its deadline it writes nothing and
offers nothing (the sweep offers the job later), on either store."""

from __future__ import annotations

from aeroqueue import keys, sessions
from aeroqueue.loading import JobSpec

PAST = 1  # Unix ms: a deadline long gone by any clock


def test_an_offer_mark_past_its_deadline_changes_nothing(registered, lists, list_name, monkeypatch):
    lists.load(list_name, [JobSpec("j0", {})])
    name = keys.job_name(list_name, 0)
    before = registered.get(keys.JOB_SET, name)
    monkeypatch.setattr(registered, "job_deadline", lambda: PAST)
    assert sessions._offer(registered, list_name, [0], "tx1") == []
    after = registered.get(keys.JOB_SET, name)
    assert (after.gen, after.bins) == (before.gen, before.bins)
    monkeypatch.undo()
    assert sessions._offer(registered, list_name, [0], "tx1") == [0], "in time, as ever"


def test_a_sweeps_fence_past_its_deadline_changes_nothing(registered, lists, list_name, monkeypatch, caplog):
    lists.load(list_name, [JobSpec("j0", {})])
    name = keys.job_name(list_name, 0)
    before = registered.get(keys.JOB_SET, name)
    found = [sessions._Found(name, before.gen, before.bins)]
    monkeypatch.setattr(registered, "job_deadline", lambda: PAST)
    assert sessions._fence(registered, found, 1) == []
    # A sweep that does nothing every time (a store's clock ahead) says why.
    assert any("past its deadline" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), caplog.text
    after = registered.get(keys.JOB_SET, name)
    assert (after.gen, after.bins) == (before.gen, before.bins)
    monkeypatch.undo()
    assert sessions._fence(registered, found, 1) == [0], "in time, as ever"


def test_a_reapers_take_past_its_deadline_changes_nothing_and_says_why(registered, monkeypatch, caplog):
    """The take (alive -> reaping), run late on a frozen node's stale copy, would put
    back the session as that copy had it, the leases recorded since gone. Past its
    deadline it writes nothing, and a reaper that never reaps says why."""
    from aeroqueue.sessions import Session

    s = Session.open(registered, heartbeat=False)
    try:
        rec = registered.get(keys.SESS_SET, s.id)
        monkeypatch.setattr(registered, "job_deadline", lambda: PAST)
        assert not sessions._take_for_reaping(registered, s.id, rec.gen)
        after = registered.get(keys.SESS_SET, s.id)
        assert (after.gen, after.bins) == (rec.gen, rec.bins)
        assert any("past its deadline" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records), caplog.text
        monkeypatch.undo()
        assert sessions._take_for_reaping(registered, s.id, rec.gen), "in time, as ever"
        assert registered.get(keys.SESS_SET, s.id).bins["state"] == "reaping"
    finally:
        s.close()
