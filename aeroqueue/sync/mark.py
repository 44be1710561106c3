"""Marking: a job record says which version of it a target holds; and retention.

A mark is one bin per target (`Target.mark_bin`) holding the ``done_at`` of
the version that was committed there. It is written only after that commit,
in batches (never a call per record), update-only so that a job deleted in
between is not brought back as a husk. No check that the job is unchanged is
needed when the mark names the version it vouches for: a job that moved on
(kicked, processed again) still reads as unsynced.

Two ways to write it, the same mark either way:

- `mark_unchanged` (the fast path): one batch of the SAME operations for
  every record, ``mark = done_at`` computed on the server from the record's
  own bin, filtered to records not updated since a moment taken from the
  server's clock (`server_clock`) before the task's scan began. Such a record
  is exactly as the scan read it (nothing wrote it since), so its ``done_at``
  is the version that was committed: the mark names that version, as the
  slow path's does. The same operations for all records cost the client
  about half of what a write with its own value per record does (measured,
  benchmarks/RESULTS.md). A record the filter refuses (updated since: by a
  worker, a kick, or a write in the same millisecond as the clock) takes:
- `mark` (the exact path): each record gets the very ``done_at`` the scan read.

On a cluster the clock comes from one node and the records' update times from
their own nodes: the moment is then taken `CLUSTER_CLOCK_MARGIN_MS` earlier,
so that a node whose clock is behind by up to that much still never lets a
record changed after the scan take the fast path.

Marks and retention's deletes carry the deadline job transitions do
(`Backend.job_deadline`, in their filter). A node frozen past the heartbeat
timeout runs, once resumed, the calls that waited in its sockets on its stale
copy, where every other filter here still passes (it is the copy the scan
read), and its replica write replaces the newer record on the live nodes
(README: a frozen node replays the calls it was sent): a mark run that late
would bring back the old done job over the one an operator kicked and a worker
completed again, and a delete would delete it. Past its deadline a mark or
delete changes nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as eop
from aerospike_helpers.operations import operations as op

from .. import keys
from ..backends import Backend
from ..errors import BackendError, FilteredOut, GenerationConflict, RecordNotFound, SyncError
from ..hotpath import in_time
from .scan import PROCESSED, synced

NOT_FOUND = 2
RECORD_TOO_BIG = 13
FILTERED_OUT = 27
MARK_RETRIES = 3
# How far apart the clocks of a cluster's nodes may be for the fast path to stay exact.
CLUSTER_CLOCK_MARGIN_MS = 1000


class Marked(tuple):
    """(marked, vanished), and the records that cannot take a mark at all: a job
    whose record is at the namespace's max-record-size (a result that just fit)
    has no room for the mark bin (Aerospike code 13). Its row is committed; it
    stays unmarked, so every run copies it again (an upsert: harmless) and
    retention never deletes it. Retrying it, or failing the task for it, would
    stop the rest of the task's range for good."""

    too_big: tuple[str, ...]

    def __new__(cls, marked: int, vanished: int, too_big: Sequence[str] = ()) -> Marked:
        self = super().__new__(cls, (marked, vanished))
        self.too_big = tuple(too_big)
        return self


@dataclass(frozen=True)
class Clock:
    """A moment on the store's clock (Unix ns, as `LastUpdateTime` counts) and the
    nodes the store had then (a one-node store needs no margin)."""

    ns: int
    nodes: tuple[str, ...]


def _nodes(backend: Backend) -> tuple[str, ...]:
    if backend.is_embedded:
        return ("embedded",)
    return tuple(sorted(n["node_name"] for n in backend.client.get_node_names()))


FORBIDDEN = 22  # a write with a time to live, in a namespace whose nsup-period is 0


def put_sync_record(backend: Backend, name: str, bins: dict[str, Any]) -> None:
    """Write an aq_sync record with its time to live (`keys.SYNC_TTL_S`). A namespace
    without nsup-period (Aerospike's default) refuses any TTL: there it is written
    without one, as it always was, rather than fail a sync that needs no TTL."""
    try:
        backend.put(keys.SYNC_SET, name, bins, ttl=keys.SYNC_TTL_S)
    except BackendError as e:
        if e.code != FORBIDDEN:
            raise
        backend.put(keys.SYNC_SET, name, bins)


def server_clock(backend: Backend) -> Clock:
    """The store's now: the last-update time of a record written for the purpose
    (and removed). Every record written after this call has a later one."""
    name = f"clock/{uuid.uuid4().hex}"
    nodes = _nodes(backend)
    put_sync_record(backend, name, {"at": 1})
    try:
        got = backend.operate(keys.SYNC_SET, name, [eop.expression_read("lut", exp.LastUpdateTime().compile())])
        return Clock(int(got.bins["lut"]), nodes)
    finally:
        backend.remove(keys.SYNC_SET, name)


def _unchanged_since(clock: Clock, backend: Backend, deadline: int | None) -> Any:
    before = clock.ns
    if len(clock.nodes) != 1 or _nodes(backend) != clock.nodes:
        before -= CLUSTER_CLOCK_MARGIN_MS * 1_000_000
    # Strictly earlier: update times count whole milliseconds, and a record written
    # in the clock's own millisecond may have been written after it.
    conds = [PROCESSED, exp.BinExists("done_at"), exp.LT(exp.LastUpdateTime(), before)]
    return exp.And(*conds, *([] if deadline is None else [in_time(deadline)])).compile()


def mark_unchanged(
    backend: Backend, mark_bin: str, names: Sequence[str], versions: Sequence[Any], clock: Clock
) -> Marked:
    """Mark committed jobs the fast way where they are unchanged since `clock`
    (taken before the scan that read them), the exact way (`mark`) for the rest;
    (marked, vanished)."""
    ops = [eop.expression_write(mark_bin, exp.IntBin("done_at").compile())]
    codes = backend.batch_same_codes(
        keys.JOB_SET, list(names), ops, expression=_unchanged_since(clock, backend, backend.job_deadline())
    )
    marked = codes.count(0)
    vanished = codes.count(NOT_FOUND)
    rest_names, rest_versions = [], []
    if marked + vanished < len(codes):
        for name, version, code in zip(names, versions, codes, strict=True):
            # Changed since the scan or past the deadline (27), or failed: the exact path,
            # with its retries, each with a deadline of its own.
            if code not in (0, NOT_FOUND):
                rest_names.append(name)
                rest_versions.append(version)
    if rest_names:
        exact = mark(backend, mark_bin, rest_names, rest_versions)
        return Marked(marked + exact[0], vanished + exact[1], exact.too_big)
    return Marked(marked, vanished)


def mark(backend: Backend, mark_bin: str, names: Sequence[str], versions: Sequence[Any]) -> Marked:
    """Mark committed jobs with the version each was read at; (marked, vanished),
    and those too big to take a mark (`Marked`). A record that failed for another
    reason (a timeout, a busy key, its deadline passed before the server ran it) is
    tried again, with a fresh deadline; one that keeps failing fails the task, whose
    retry copies it again (harmless) and marks it. Refused past the deadline every
    time means the server's clock is ahead of this host's: left unmarked quietly,
    every job would be copied again on every run and never deleted by retention."""
    pending = list(zip(names, versions, strict=True))
    marked = vanished = 0
    too_big: list[str] = []
    for attempt in range(MARK_RETRIES):
        deadline = backend.job_deadline()
        codes = backend.batch_write_codes(
            keys.JOB_SET, [(n, [op.write(mark_bin, v)]) for n, v in pending],
            expression=None if deadline is None else in_time(deadline).compile(),
        )
        retry = []
        for item, code in zip(pending, codes, strict=True):
            if code == 0:
                marked += 1
            elif code == NOT_FOUND:
                vanished += 1
            elif code == RECORD_TOO_BIG:
                too_big.append(item[0])  # no room for the mark, now or on any retry
            else:
                retry.append((item, code))
        if not retry:
            return Marked(marked, vanished, too_big)
        pending = [item for item, _ in retry]
        time.sleep(0.05 * (attempt + 1))
    late = " (past its deadline: is the store's clock ahead of this host's?)" if retry[0][1] == FILTERED_OUT else ""
    raise SyncError(
        f"marking {len(pending)} copied job(s) failed (Aerospike code {retry[0][1]}{late}, e.g. {pending[0][0]}); "
        "they stay unsynced and the next attempt copies them again"
    )


def retain(backend: Backend, mark_bin: str, begin: int, count: int, grace_ms: int) -> int:
    """Delete the range's jobs that this target has held for at least `grace_ms`
    (by the server's clock: the record's last update is the mark or later).

    The delete is checked against the generation the scan read, so a job
    changed in between (kicked) is never deleted, and the scan's filter is asked
    again by the delete itself: a list dropped and loaded again under its name
    recreates its job records under the same names with generations from 1, so
    a new job can have the very generation the scan read. Jobs the target does
    not hold (rejects, newer versions) are never deleted. Returns how many went.
    A delete refused past its deadline is kept too: the next run deletes it.
    """
    old = exp.And(PROCESSED, synced(mark_bin), exp.GE(exp.SinceUpdateTime(), grace_ms))
    compiled = old.compile()
    deleted = 0
    for name, rec in backend.scan(keys.JOB_SET, begin=begin, count=count, expression=compiled, bins=["state"]):
        deadline = backend.job_deadline()
        try:
            backend.operate(keys.JOB_SET, name, [op.delete()], gen=rec.gen,
                            expression=compiled if deadline is None else exp.And(old, in_time(deadline)).compile())
            deleted += 1
        except (GenerationConflict, FilteredOut, RecordNotFound):
            pass  # changed since the scan (or gone), or past its deadline: keep it
    return deleted
