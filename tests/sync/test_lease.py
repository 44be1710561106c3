"""The sync lease: two schedulers never run at once; a dead holder's lease is taken over."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest

from aeroqueue.backends import open_backend
from aeroqueue.errors import AeroqueueError, SparkDriverLost, SyncError
from aeroqueue.keys import LOCK_SET
from aeroqueue.sync import Lease, LeaseKeeper, Scheduler, sync_once

from .helpers import options


@pytest.fixture
def lock() -> str:
    """A lease of its own per test, so tests never meet on a shared server."""
    return f"t-{uuid.uuid4().hex[:12]}"


def test_two_schedulers_never_run_at_once(store_url, lock):
    runs: list[tuple[str, float, float]] = []
    busy = threading.Lock()

    def fake_run(who: str):
        def run() -> None:
            # A second run inside this one would find the lock taken.
            assert busy.acquire(blocking=False), f"{who} ran while another run was under way"
            start = time.monotonic()
            time.sleep(0.05)
            runs.append((who, start, time.monotonic()))
            busy.release()
        return run

    a = Scheduler(open_backend(store_url), 0.1, fake_run("A"), lease_s=1.0, lock=lock)
    b = Scheduler(open_backend(store_url), 0.1, fake_run("B"), lease_s=1.0, lock=lock)
    ta = threading.Thread(target=a.run, kwargs={"max_runs": 6})
    ta.start()
    while not runs:
        time.sleep(0.01)
    tb = threading.Thread(target=b.run, kwargs={"max_runs": 3})
    tb.start()
    ta.join(30)
    tb.join(30)
    assert not ta.is_alive() and not tb.is_alive()
    order = [who for who, _, _ in runs]
    assert order == ["A"] * 6 + ["B"] * 3, "B stood by while A held the lease, then took over"
    ends_of_a = max(end for who, _, end in runs if who == "A")
    assert min(start for who, start, _ in runs if who == "B") >= ends_of_a
    assert open_backend(store_url).get(LOCK_SET, lock) is None, "released on the way out"


def test_a_one_shot_sync_is_refused_while_the_lease_is_held(store_url, lock, tmp_path):
    holder = Lease(open_backend(store_url), lock, ttl_s=30)
    assert holder.acquire()
    try:
        with pytest.raises(SyncError) as e:
            sync_once(options(store_url, f"sqlite://{tmp_path / 'c.db'}"), None, open_backend(store_url), lock=lock)  # type: ignore[arg-type]
        assert "another sync to sqlite://" in str(e.value) and "is running" in str(e.value) and f"pid {holder._bins()['pid']}" in str(e.value)
        assert "runs out 30s after" in str(e.value), "the holder's own lease length"
        assert "no longer running" not in str(e.value), "its holder runs"
    finally:
        holder.release()
    assert Lease(open_backend(store_url), lock).acquire(), "free again once released"


def test_a_refusal_says_when_the_leases_holder_on_this_host_was_killed(store_url, lock, tmp_path):
    """A sync killed outright holds its lease until it runs out: the next run was told
    "another sync ... is running (pid N)" of a process that was gone."""
    take = (f"from aeroqueue.backends import open_backend; from aeroqueue.sync import Lease; "
            f"import sys; assert Lease(open_backend({store_url!r}), {lock!r}, ttl_s=30).acquire(); "
            f"print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", take], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(SyncError) as e:
        sync_once(options(store_url, f"sqlite://{tmp_path / 'c.db'}"), None, open_backend(store_url), lock=lock)  # type: ignore[arg-type]
    assert f"pid {proc.pid}, no longer running on this host (killed?)" in str(e.value)
    assert "runs out 30s after" in str(e.value)


def test_a_dead_holders_lease_is_taken_over_once_it_expires(store_url, lock):
    dead = Lease(open_backend(store_url), lock, ttl_s=1.0)
    assert dead.acquire()  # ... and never renews it again
    other = Lease(open_backend(store_url), lock, ttl_s=5.0)
    assert not other.acquire() and other.holder and other.holder["owner"] == dead.owner
    time.sleep(1.2)
    assert other.acquire(), "expired by the server's clock"
    assert not dead.renew(), "the old holder learns it lost the lease"
    assert other.renew()


def test_a_renewed_lease_is_kept(store_url, lock):
    lease = Lease(open_backend(store_url), lock, ttl_s=0.6)
    assert lease.acquire()
    with LeaseKeeper(lease) as keeper:
        time.sleep(1.5)
        assert not Lease(open_backend(store_url), lock).acquire()
        assert not keeper.lost.is_set()
    lease.release()


def test_a_failed_run_does_not_stop_the_scheduler(store_url, lock):
    errors: list[Exception] = []
    calls = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise SyncError("MySQL is down")

    s = Scheduler(open_backend(store_url), 0.05, flaky, lease_s=2.0, on_error=errors.append, lock=lock)
    assert s.run(max_runs=3) == 3
    assert len(calls) == 3 and [str(e) for e in errors] == ["MySQL is down"]
    assert isinstance(errors[0], AeroqueueError)


def test_a_lost_spark_driver_ends_the_schedule(store_url, lock):
    """Every later run would fail the same way with its JVM gone: the schedule ends,
    raising it for the command to say (status 1), its lease released."""
    errors: list[Exception] = []
    calls = []

    def lost() -> None:
        calls.append(1)
        raise SparkDriverLost("the Spark driver (its JVM, pid 1) ended during the run, killed by SIGKILL")

    s = Scheduler(open_backend(store_url), 0.05, lost, lease_s=2.0, on_error=errors.append, lock=lock)
    with pytest.raises(SparkDriverLost):
        s.run(max_runs=3)
    assert len(calls) == 1 and errors == []
    assert open_backend(store_url).get(LOCK_SET, lock) is None, "released on the way out"


def test_a_bare_py4j_error_as_the_jvm_dies_is_the_driver_lost(monkeypatch):
    """py4j answers a call whose connection broke with a bare "An error occurred while
    calling o22.getLocalProperty" (its network error logged, not chained). Seen in CI: the
    JVM SIGKILLed, not yet reaped when the error was looked at, the run failed as an
    ordinary one and the schedule went on. A real process stands for the JVM, killed a
    moment after the error is looked at."""
    from py4j.protocol import Py4JError

    from aeroqueue.sync import job

    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(job, "_driver_process", lambda: jvm)
    try:
        # An error the JVM answered (its trace) says nothing of its end: no wait, not lost.
        answered = Py4JError("An error occurred while calling o22.sql. Trace:\njava.lang.Exception: bad\n")
        assert job.driver_lost(answered, "during the run") is None
        threading.Timer(0.3, jvm.kill).start()
        lost = job.driver_lost(Py4JError("An error occurred while calling o22.getLocalProperty"), "during the run")
    finally:
        jvm.kill()
        jvm.wait()
    assert isinstance(lost, SparkDriverLost)
    assert str(lost) == f"the Spark driver (its JVM, pid {jvm.pid}) ended during the run, killed by SIGKILL"
