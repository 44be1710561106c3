"""Leases and the schedule: one sync per target at a time, run once or every so often.


Why a lease record in Aerospike rather than MySQL's GET_LOCK: a SQLite file
has no GET_LOCK, and the lease guards what two runs for one target would
race on, that target's marks in the store. There is one lease per target
(`Target.lease_name`): two databases may be synced at once, each marking its
own bin. It is built like every other cross-process step here: a create-only
write, generation checks, and liveness by the server's clock (the record's
last-update time), never by comparing client clocks. Losing the lease in the
middle of a run (a stalled driver) is harmless for the data: upserts are
idempotent, a mark names the version it vouches for, and an older copy of a
job never overwrites a newer one (the done_at guard in the upsert).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import operations as op

from .. import keys
from ..backends import Backend
from ..errors import (
    AeroqueueError,
    BackendError,
    FilteredOut,
    GenerationConflict,
    RecordExists,
    RecordNotFound,
    SparkDriverLost,
    SyncError,
)
from ..stopping import Stop
from .job import run_sync
from .options import SyncOptions, SyncReport
from .write import pid_alive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 60.0
SYNC_LOCK = "sync"



class Lease:
    """A named lease in set aq_lock: held while its owner renews it within its TTL."""

    def __init__(self, backend: Backend, name: str = SYNC_LOCK, ttl_s: float = DEFAULT_LEASE_S) -> None:
        if ttl_s <= 0:
            raise SyncError(f"the lease must last more than 0 seconds, not {ttl_s}")
        self.backend = backend
        self.name = name
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.owner = f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.gen: int | None = None
        self.holder: dict[str, Any] | None = None  # the other owner, when acquiring failed

    @property
    def held(self) -> bool:
        return self.gen is not None

    def _bins(self) -> dict[str, Any]:
        return {"owner": self.owner, "host": socket.gethostname()[:200], "pid": os.getpid(), "ttl_ms": self.ttl_ms}

    def acquire(self) -> bool:
        """Take the lease if it is free or its holder stopped renewing it; False if it is held."""
        b = self.backend
        for _ in range(5):
            with contextlib.suppress(RecordExists):
                b.put(keys.LOCK_SET, self.name, self._bins(), create_only=True)
            rec = b.get(keys.LOCK_SET, self.name)
            if rec is None:
                continue  # released in between: try to create it again
            if rec.bins.get("owner") == self.owner:
                self.gen, self.holder = rec.gen, None
                return True
            # Expired by the holder's own TTL, measured on the server's clock.
            expired = exp.GE(exp.SinceUpdateTime(), exp.IntBin("ttl_ms")).compile()
            try:
                got = b.operate(keys.LOCK_SET, self.name, [op.write(k, v) for k, v in self._bins().items()],
                                gen=rec.gen, expression=expired)
            except FilteredOut:
                self.holder = rec.bins
                return False
            except (GenerationConflict, RecordNotFound):
                continue  # someone else moved first: look again
            self.gen, self.holder = got.gen, None
            return True
        return False

    def renew(self) -> bool:
        """Extend the lease; False if it was lost (taken over after it expired)."""
        if self.gen is None:
            return False
        try:
            got = self.backend.operate(keys.LOCK_SET, self.name, [op.write("owner", self.owner)], gen=self.gen)
        except (GenerationConflict, RecordNotFound):
            # A renewal that timed out may still have landed: only the owner
            # writes its own name, so the record says whether it is still ours.
            rec = self.backend.get(keys.LOCK_SET, self.name)
            if rec is None or rec.bins.get("owner") != self.owner:
                self.gen = None
                return False
            self.gen = rec.gen
            return True
        self.gen = got.gen
        return True

    def release(self) -> None:
        if self.gen is None:
            return
        self.gen = None
        try:
            rec = self.backend.get(keys.LOCK_SET, self.name)
            if rec is not None and rec.bins.get("owner") == self.owner:
                self.backend.remove(keys.LOCK_SET, self.name, gen=rec.gen)
        except (GenerationConflict, BackendError):
            # Taken over or unreachable: it expires on its own.
            log.debug("releasing the %s lease failed", self.name, exc_info=True,
                      extra={"event": "lease_release_failed", "lease": self.name})

    def describe_holder(self) -> str:
        """Who holds the lease; said when its process is not running here any more (a
        sync killed outright: its lease holds until it runs out)."""
        h = self.holder or {}
        said = f"host {h.get('host', '?')} pid {h.get('pid', '?')}"
        pid = h.get("pid")
        if h.get("host") == socket.gethostname()[:200] and isinstance(pid, int) and pid > 0 and not pid_alive(pid):
            said += ", no longer running on this host (killed?)"
        return said



class LeaseKeeper:
    """Renews a held lease from a background thread, every third of its TTL."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"aeroqueue-lease-{lease.name}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        every = self.lease.ttl_ms / 3000
        while not self._stop.wait(every):
            try:
                ok = self.lease.renew()
            except BackendError as e:
                log.warning("renewing the %s lease failed: %s", self.lease.name, e,
                            extra={"event": "lease_renew_failed", "lease": self.lease.name})
                continue
            if not ok:
                log.warning("the %s lease was lost (another process took it over)", self.lease.name,
                            extra={"event": "lease_lost", "lease": self.lease.name})
                self.lost.set()
                return


@contextlib.contextmanager
def sync_lease(
    options: SyncOptions, backend: Backend, *, lease_s: float = DEFAULT_LEASE_S, lock: str | None = None,
) -> Iterator[Lease]:
    """The target's sync lease, taken (atomically: `Lease.acquire`) and renewed for
    the block, released after it; refused with a SyncError if another sync of the
    target holds it. Cheap (a write and a read of one record): a caller that must
    start something slow for its run (Spark's JVM, seconds) takes it first, so that
    a run another sync holds the lease for is refused at once, not after that."""
    lease = Lease(backend, lock or options.target.lease_name, ttl_s=lease_s)
    if not lease.acquire():
        ttl_ms = (lease.holder or {}).get("ttl_ms")
        expiry = f"{ttl_ms / 1000:g}s" if isinstance(ttl_ms, int) else "its TTL"
        raise SyncError(
            f"another sync to {options.target} is running on {backend.url} ({lease.describe_holder()}); "
            f"its lease runs out {expiry} after its holder stops renewing it"
        )
    try:
        with LeaseKeeper(lease):
            yield lease
    finally:
        lease.release()


def sync_once(
    options: SyncOptions, spark: SparkSession, backend: Backend, *, lease_s: float = DEFAULT_LEASE_S,
    lock: str | None = None, on_progress: Callable[[dict[str, int]], None] | None = None,
) -> SyncReport:
    """One run under the target's sync lease; refused if another sync of it holds it."""
    with sync_lease(options, backend, lease_s=lease_s, lock=lock):
        return run_sync(options, spark, backend, on_progress)


class Scheduler:
    """Runs a sync every `every_s` seconds while it holds the store's sync lease.

    It keeps the lease between runs, so a second scheduler waits on standby
    and takes over only once the first stops (or dies and its lease expires).
    A failed run is logged and the next one tries again, except when the Spark
    driver is gone (`SparkDriverLost`): that ends the schedule, raised from `run`.
    """

    def __init__(
        self,
        backend: Backend,
        every_s: float,
        run: Callable[[], Any],
        *,
        lease_s: float = DEFAULT_LEASE_S,
        on_error: Callable[[Exception], None] | None = None,
        lock: str = SYNC_LOCK,
        stop: Stop | None = None,
    ) -> None:
        if every_s <= 0:
            raise SyncError(f"the schedule interval must be more than 0 seconds, not {every_s}")
        self.backend = backend
        self.every_s = every_s
        self.run_once = run
        self.lease = Lease(backend, lock, ttl_s=lease_s)
        self.stop = stop or Stop()  # set by code, or by a signal handler (`Stop.on_signal`)
        self.on_error = on_error or self._run_failed
        self.runs = 0

    def _run_failed(self, e: Exception) -> None:
        if self.stop.is_set():  # a run the stop cut short: what was asked for, not news
            log.debug("sync run stopped: %s", e, extra={"event": "sync_stopped"})
        else:
            log.error("sync run failed: %s", e, extra={"event": "sync_failed"})

    def run(self, max_runs: int | None = None) -> int:
        """Run until `stop` is set (or `max_runs` runs); returns how many ran."""
        standby_said = False
        try:
            while not self.stop.is_set():
                if not self.lease.held and not self.lease.acquire():
                    if not standby_said:
                        log.info("another sync scheduler holds the lease (%s): standing by", self.lease.describe_holder(),
                                 extra={"event": "standing_by"})
                        standby_said = True
                    self.stop.wait(min(self.every_s, self.lease.ttl_ms / 3000))
                    continue
                standby_said = False
                with LeaseKeeper(self.lease) as keeper:
                    while not self.stop.is_set() and not keeper.lost.is_set():
                        started = time.monotonic()
                        try:
                            self.run_once()
                        except SparkDriverLost:
                            raise  # no later run has a driver to run on: the schedule ends (and says why)
                        except AeroqueueError as e:
                            self.on_error(e)
                        self.runs += 1
                        if max_runs is not None and self.runs >= max_runs:
                            return self.runs
                        self.stop.wait(max(0.0, self.every_s - (time.monotonic() - started)))
                if keeper.lost.is_set():
                    self.lease.gen = None
            return self.runs
        finally:
            self.lease.release()

