"""`worker --until-complete` on a list loaded without --seal: it waits for the seal,
and says so once instead of waiting in silence."""

from __future__ import annotations

import logging
import threading

from aeroqueue.loading import JobSpec
from aeroqueue.worker import EXIT_OK, Worker
from tests.waiting import wait_for


def test_an_unsealed_list_with_every_job_processed_is_named_once_then_the_seal_ends_the_run(
        registered, lists, list_name, caplog):
    lists.load(list_name, [JobSpec(f"u{i}", {}) for i in range(3)])  # not sealed
    w = Worker(registered, lambda job: None, [list_name], interval_s=0.1, expiry_s=2.0, idle_s=0.05,
               reap_every_s=0.1, until_complete=True)
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(w.run(install_signals=False)), daemon=True)
    with caplog.at_level(logging.WARNING, logger="aeroqueue.worker"):
        t.start()
        try:
            def told() -> list[logging.LogRecord]:
                return [r for r in caplog.records if getattr(r, "event", "") == "list_unsealed"]

            wait_for("the worker to say the list waits for its seal", lambda: told())
            assert lists.status(list_name).done == 3
            threading.Event().wait(0.5)  # several more checks, 0.1 s apart
            assert t.is_alive(), "an unsealed list is not complete"
            assert len(told()) == 1 and told()[0].list == list_name, "said once, naming the list"
            lists.seal(list_name)
            t.join(30)
        finally:
            w.request_stop()
            t.join(30)
    assert out == [EXIT_OK]


def test_a_named_list_dropped_while_the_worker_waits_is_named_once_not_once_a_second(
        registered, lists, list_name, caplog):
    """Dropped (or not loaded yet), the list is not complete: the worker waits for a
    load, and says so once, instead of a maintenance failure in its log each check."""
    lists.load(list_name, [JobSpec("d0", {})])  # not sealed: the worker waits on
    # A session expiry a loaded machine's heartbeats keep up with (2 s did not, once: the
    # worker exited, its session lost, before the check below).
    w = Worker(registered, lambda job: None, [list_name], interval_s=0.1, expiry_s=6.0, idle_s=0.05,
               reap_every_s=0.1, until_complete=True)
    t = threading.Thread(target=lambda: w.run(install_signals=False), daemon=True)
    with caplog.at_level(logging.WARNING, logger="aeroqueue.worker"):
        t.start()
        try:
            wait_for("the job done", lambda: lists.status(list_name).done == 1)
            lists.drop(list_name, grace_s=0)
            threading.Event().wait(1.5)  # more than one check a second apart
            events = [getattr(r, "event", "") for r in caplog.records]
            assert t.is_alive(), f"a dropped list is not complete (the worker's warnings: {events})"
            assert "maintenance_failed" not in events, events
            assert events.count("list_missing") == 1, events
        finally:
            w.request_stop()
            t.join(30)


def test_a_pattern_that_matches_no_list_is_named_once(registered, list_name, caplog):
    """--until-complete with a pattern that matches nothing waits for a list to be
    loaded: it says so once, naming the pattern, not in silence."""
    w = Worker(registered, lambda job: None, [f"{list_name}-nothing-*"], interval_s=0.1, expiry_s=2.0, idle_s=0.05,
               reap_every_s=0.1, until_complete=True)
    t = threading.Thread(target=lambda: w.run(install_signals=False), daemon=True)
    with caplog.at_level(logging.WARNING, logger="aeroqueue.worker"):
        t.start()
        try:
            wait_for("the worker to name the pattern", lambda: any(
                getattr(r, "event", "") == "pattern_unmatched" for r in caplog.records))
            threading.Event().wait(1.5)  # more checks
            told = [r for r in caplog.records if getattr(r, "event", "") == "pattern_unmatched"]
            assert len(told) == 1 and told[0].pattern == f"{list_name}-nothing-*"
            assert t.is_alive()
        finally:
            w.request_stop()
            t.join(30)


def test_the_completion_check_reads_no_id_chunks_while_jobs_wait(registered, list_name, monkeypatch):
    """--until-complete looks once a second: it reads the list record and the done and
    dead bitmaps, not the ID store's chunks that `status` reads for its waiting count
    (a million-job list in ID mode: every unread ID, once a second, in every worker)."""
    from aeroqueue import keys
    from aeroqueue.lists import JobLists
    from aeroqueue.loading import JobSpec
    from aeroqueue.worker import Worker

    lists = JobLists(registered)
    lists.load(list_name, [JobSpec(f"j{i}", {}) for i in range(50)], mode="ids", chunk_size=10, seal=True)
    w = Worker(registered, lambda job: "ok", [list_name], until_complete=True)
    w.selector.refresh()
    read: list[str] = []
    real = registered.batch_get

    def spy(set_name, names, *args, **kwargs):
        read.append(set_name)
        return real(set_name, names, *args, **kwargs)

    monkeypatch.setattr(registered, "batch_get", spy)
    assert w._all_complete(lists) is False
    assert keys.IDS_SET not in read and keys.DONE_SET in read, read
