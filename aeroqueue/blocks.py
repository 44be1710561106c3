"""Block records: the ids and payloads of a run of fresh jobs, read in one record.

Keyspace: set aq_blk, key "<list>/<block>", block = token // BLOCK. Bins:
  c  the stamp (`created`) of the list whose loader wrote it, as on its job records
  j  map token -> [jid, payload]: jobs of that list loaded queued (not delayed), real
     (not a duplicate made void), whose token no leased reservation has taken yet

Why: a leased reservation (`Queue._lease`, the batch path) read every job record it
took, a record a job on the server on top of the ack's write. A block hands it a
hundred jobs in one record (benchmarks/RESULTS.md, 2026-11-29 07:55: the block floor).

The loader writes a block once a range's jobs are committed (their index entries)
and before it publishes the range (`load.write_blocks`); concurrent loaders share a
block's edges, hence a map that `map_put_items` merges. A leased reservation pops
the entries of the fresh tokens its take handed out (`pop`): one write answers them
and removes them, filtered on the stamp of the list the take read. The entry stands
in for the job record as the loader wrote it (queued, attempt 0, never claimed, the
list's stamp); the ack's filter checks the record itself, as for any lease.

A fresh token's job is still as its loader wrote it but in three cases, each of
which leaves no entry to trust:
- a job buried before anyone took it: `bury` removes its entry first (`forget`);
- a token handed out again by a take that a frozen node replayed on a stale copy
  of the list record (README, "A frozen node replays the calls it was sent"): the
  first lease popped its entry. (A job the first time handed out alone, to a single
  reserve, kept its entry: in that window it may run twice, as a leased job always
  could; its second ack is refused.)
- a list dropped and loaded again under its name: the stamp differs.
A token without an entry (the block missing, another list's, too big, or popped
already) is read from its job record, as before blocks. Entries popped by a
reservation whose lease then fails are not put back: its claims read the records.

Blocks whose entries are all popped stay, a stamp and an empty map, until the list
is dropped (a hundredth of a record a job).
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Any

import aerospike
from aerospike_helpers.operations import map_operations as mo

from . import keys
from .backends import Backend, retry_in_doubt
from .errors import AeroqueueError, FilteredOut, RecordNotFound, StaleRequest
from .hotpath import in_time, stamped_in_time

log = logging.getLogger(__name__)

BLOCK = 100  # tokens a block record covers: one lease of the batch path's usual size

_KV = aerospike.MAP_RETURN_KEY_VALUE


def block_of(token: int) -> int:
    return token // BLOCK


def name(list_name: str, block: int) -> str:
    return f"{list_name}/{block}"


def names_upto(list_name: str, alloc: int) -> list[str]:
    """Every block a list's tokens [0, alloc) may have."""
    return [name(list_name, b) for b in range(0, (alloc + BLOCK - 1) // BLOCK)]


def by_block(tokens: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = defaultdict(list)
    for t in tokens:
        out[t // BLOCK].append(t)
    return out


def pop(backend: Backend, list_name: str, created: int, tokens: list[int]) -> dict[int, list[Any]]:
    """Take the entries of `tokens` (fresh tokens of the list made at `created`) out of
    their blocks, in one round trip: token -> [jid, payload] for those that had one.
    Any failure answers nothing more: the records are read instead. An answer in
    doubt may have removed entries: those jobs are read from their records too."""
    groups = by_block(tokens)
    # With the deadline of a transition: a pop that a frozen node runs late, on its
    # stale copy, would put back the entries popped meanwhile (README, "A frozen node
    # replays the calls it was sent"); refused, it answers nothing, as any failure.
    only = stamped_in_time(created, backend.job_deadline())
    items = [(name(list_name, b), [mo.map_remove_by_key_list("j", toks, _KV)], only) for b, toks in groups.items()]
    try:
        answers = backend.batch_each(keys.BLOCK_SET, items)
    except AeroqueueError as e:
        log.debug("block pop failed: job records read instead", extra={
            "event": "block_pop_failed", "list": list_name, "error": str(e)})
        return {}
    got: dict[int, list[Any]] = {}
    for answer in answers:
        flat = answer.value.get("j") if answer.ok and answer.value else None
        if flat:
            it = iter(flat)
            got.update(zip(it, it, strict=True))
    return got


def forget(backend: Backend, list_name: str, token: int) -> None:
    """Remove a job's entry from its block (if any): before a transition that makes a
    job never handed out other than queued (`bury`), so that no reservation trusts
    the entry after it. Raises if the store cannot say it is gone: the caller stops."""
    ops = [mo.map_remove_by_key_list("j", [token], aerospike.MAP_RETURN_NONE)]

    def once() -> None:
        # The deadline as for `pop`; refused past it (only a call held up that long),
        # it is sent again with a new one.
        for _ in range(3):
            deadline = backend.job_deadline()
            try:
                backend.operate(keys.BLOCK_SET, name(list_name, block_of(token)), ops, update_only=True,
                                expression=None if deadline is None else in_time(deadline).compile())
                return
            except FilteredOut:
                continue
        raise StaleRequest(f"removing job token {token} from its block record of list {list_name!r} kept "
                           "running past its deadline; check the clocks of the client and the nodes")

    with contextlib.suppress(RecordNotFound):  # no block: nothing to trust
        retry_in_doubt(once)  # idempotent: repeated while in doubt
