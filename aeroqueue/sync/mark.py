"""Marking: a job record says which version of it a target holds; and retention.

A mark is one bin per target (`Target.mark_bin`) holding the ``done_at`` of
the version that was committed there. It is written only after that commit,
in batches (one `batch_write` per upsert batch, never a call per record),
update-only so that a job deleted in between is not brought back as a husk.
No check that the job is unchanged is needed: a mark names the version it
vouches for, so a job that moved on (kicked, processed again) still reads as
unsynced. And it is no state change: the job UDFs keep `state` to themselves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import operations as op

from .. import keys
from ..backends import Backend
from ..errors import GenerationConflict, SyncError
from .scan import PROCESSED, synced

NOT_FOUND = 2
MARK_RETRIES = 3


def mark(backend: Backend, mark_bin: str, names: Sequence[str], versions: Sequence[Any]) -> tuple[int, int]:
    """Mark committed jobs; (marked, vanished). A record that failed for another
    reason (a timeout, a busy key) is tried again; one that keeps failing fails
    the task, whose retry copies it again (harmless) and marks it."""
    pending = list(zip(names, versions, strict=True))
    marked = vanished = 0
    for attempt in range(MARK_RETRIES):
        codes = backend.batch_operate(
            keys.JOB_SET, [(n, [op.write(mark_bin, v)]) for n, v in pending], update_only=True
        )
        retry = []
        for item, code in zip(pending, codes, strict=True):
            if code == 0:
                marked += 1
            elif code == NOT_FOUND:
                vanished += 1
            else:
                retry.append((item, code))
        if not retry:
            return marked, vanished
        pending = [item for item, _ in retry]
        time.sleep(0.05 * (attempt + 1))
    raise SyncError(
        f"marking {len(pending)} copied job(s) failed (Aerospike code {retry[0][1]}, e.g. {pending[0][0]}); "
        "they stay unsynced and the next attempt copies them again"
    )


def retain(backend: Backend, mark_bin: str, begin: int, count: int, grace_ms: int) -> int:
    """Delete the range's jobs that this target has held for at least `grace_ms`
    (by the server's clock: the record's last update is the mark or later).

    The delete is checked against the generation the scan read, so a job
    changed in between (kicked) is never deleted. Jobs the target does not hold
    (rejects, newer versions) are never deleted. Returns how many went.
    """
    old = exp.And(PROCESSED, synced(mark_bin), exp.GE(exp.SinceUpdateTime(), grace_ms)).compile()
    deleted = 0
    for name, rec in backend.scan(keys.JOB_SET, begin=begin, count=count, expression=old, bins=["state"]):
        try:
            if backend.remove(keys.JOB_SET, name, gen=rec.gen):
                deleted += 1
        except GenerationConflict:
            pass  # changed since the scan: keep it
    return deleted
