"""Block records: the ids and payloads of a run of fresh jobs, read in one record.

Keyspace: set aq_blk, key "<list>/<block>", block = token // BLOCK. Bins:
  c  the stamp (`created`) of the list whose jobs it holds, as on its job records
  j  map token -> [jid, payload] | MARK: jobs of that list loaded queued (not
     delayed), real (not a duplicate made void), and not popped by a leased
     reservation yet; MARK for a job buried (`forget`)

Why: a leased reservation (`Queue._lease`, the batch path) read every job record it
took, a record a job on the server on top of the ack's write. A block hands it a
hundred jobs in one record (benchmarks/RESULTS.md, 2026-11-29 07:55: the block floor).

The loader writes its entries once a range's jobs are committed (their index
entries), before it publishes the range (`load.write_blocks`; a loader stopped past
its lease whose range a recovery published writes none: it renews the range's lease
first); concurrent loaders share a block's edges, hence a map that `map_put_items`
merges, create-only. A leased reservation pops the entries of the fresh tokens its
take handed out (`pop`):
one write answers them and removes them, filtered on the stamp of the list the take
read. An entry stands in for the job record as the loader wrote it (queued, attempt
0, never claimed, the list's stamp); the ack's filter checks the record itself, as
for any lease.

A fresh token's job is still as its loader wrote it but in these cases, none of
which leaves an entry to trust:
- a job buried before anyone took it: `bury` marks its entry (`forget`), creating
  the block if its loader has not written it yet, whose create-only entries then
  leave the mark alone;
- a list dropped and loaded again under its name: the stamp differs;
- a token handed out again by a take that a frozen node replayed on a stale copy
  of the list record (README, "A frozen node replays the calls it was sent"), if
  the first reservation was leased: it popped the entry. One that claimed instead
  (a single reserve, a small batch, `--no-lease`) left it: in that window such a job
  may run again, done or not, as a leased job always could; its second ack is
  refused.
A token without an entry (the block missing, another list's, too big, popped or
marked, or the entry bigger than its share of a block: `entry_room`) is read from
its job record, as before blocks. Entries popped by a reservation whose lease then
fails are not put back: its claims read the records.

The sweep deletes the blocks behind the block of each list's head (`clear_passed`),
whose entries no reservation reads (jobs claimed, not leased, leave theirs); a drop
deletes them all.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Any

import aerospike
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import map_operations as mo
from aerospike_helpers.operations import operations as op

from . import keys, transitions
from .backends import Backend, retry_in_doubt
from .backends.sizes import packed_size, record_size
from .errors import AeroqueueError, FilteredOut, ListNotFound, RecordNotFound, StaleRequest
from .hotpath import stamped, stamped_in_time, until

log = logging.getLogger(__name__)

BLOCK = 100  # tokens a block record covers: one lease of the batch path's usual size

_KV = aerospike.MAP_RETURN_KEY_VALUE
MARK = 0  # in place of an entry: the job was buried before anyone took it (`forget`)
PAST_DEADLINE = 26  # a write whose expression failed past its deadline: nothing written


def block_of(token: int) -> int:
    return token // BLOCK


# The widest block number (a list's tokens stay below 2**32) and server ms a block's
# own bytes are judged with.
_WIDEST_BLOCK, _WIDEST_MS = (2**32 - 1) // BLOCK, 2**41


def entry_room(list_name: str, max_record_size: int) -> int:
    """The most bytes one entry (its token and [jid, payload], packed) may take: a
    block's share of the store's record size, a hundredth each. An entry that takes
    more is left out (its job record is read instead), so a block never grows past
    the limit, whichever loaders write its entries.

    Why not fill a block up to the limit and let the store refuse the rest: Aerospike
    CE 8.1.2.0 crashed (SIGSEGV in the map sort of `map_put_items`, the node gone) on
    a batch of block writes each a few hundred kB over its max record size (loads of
    20 kB payloads, 2 of 2 runs); the same blocks within the limit were written."""
    empty = record_size(keys.BLOCK_SET, {"c": _WIDEST_MS, "j": {}}, name(list_name, _WIDEST_BLOCK))
    return max(0, (max_record_size - empty - 4) // BLOCK)  # 4: the map's header, 100 entries against none


def entry_fits(token: int, entry: list[Any], room: int) -> bool:
    """Whether an entry is within `entry_room`."""
    return packed_size(token) + packed_size(entry) <= room


def name(list_name: str, block: int) -> str:
    return f"{list_name}/{block}"


def names_between(list_name: str, lo: int, hi: int) -> list[str]:
    """The blocks of tokens [lo, hi)."""
    return [name(list_name, b) for b in range(lo // BLOCK, -(-hi // BLOCK))] if hi > lo else []


def names_upto(list_name: str, alloc: int) -> list[str]:
    """Every block record a list's tokens [0, alloc) may have, and its sweep's mark."""
    return [*names_between(list_name, 0, alloc), cleared_name(list_name)]


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
            got.update((t, e) for t, e in zip(it, it, strict=True) if type(e) is list)  # not a MARK
    return got


def forget(backend: Backend, list_name: str, token: int, created: int, *, fresh: bool) -> None:
    """Put a marker (`MARK`) in place of a job's entry: after a transition that leaves
    a job other than queued (`bury`), so that no reservation trusts an entry for it.
    `fresh`: its token is at or past the token store's head (never handed out): its
    block is created (stamped `created`) if no loader has written it yet, and a
    loader writes its entries create-only, so the marker stays (a bury between the
    loader's index commit and its blocks). Behind the head only a block still there
    is marked (its entry matters to a replayed take only). A block another list of
    the name left in the way is replaced, while `created` is still the list's.
    Raises if the store cannot say the marker is there: the caller stops."""
    key = name(list_name, block_of(token))
    put = mo.map_put_items("j", {token: MARK})

    def once() -> None:
        for _ in range(3):
            # The deadline as for `pop`, also on a create (which no filter stops: `c`
            # is written by an expression that fails past it, as a loader's job
            # creates are); refused past it (only a call held up that long), it is
            # sent again with a new one.
            deadline = backend.job_deadline()
            stamp = op.write("c", created) if deadline is None else eo.expression_write("c", until(deadline, created))
            try:
                backend.operate(keys.BLOCK_SET, key, [stamp, put], expression=stamped_in_time(created, deadline),
                                update_only=not fresh)
                return
            except FilteredOut:
                rec = backend.get(keys.BLOCK_SET, key, bins=["c"])
                other = None if rec is None else rec.bins.get("c")
                if other is not None and other != created:
                    if not transitions.list_is(backend, list_name, created):
                        raise ListNotFound(f"no job list named {list_name!r} (dropped meanwhile)") from None
                    transitions.delete_left_by(backend, keys.BLOCK_SET, key, other)
            except AeroqueueError as e:
                if getattr(e, "code", None) != PAST_DEADLINE:
                    raise
        raise StaleRequest(f"marking job token {token} in its block record of list {list_name!r} kept running "
                           "past its deadline; check the clocks of the client and the nodes")

    with contextlib.suppress(RecordNotFound):  # behind the head, and no block: nothing to mark
        retry_in_doubt(once)  # idempotent: repeated while in doubt


def cleared_name(list_name: str) -> str:
    """The record that says how far the sweep deleted a list's blocks (`clear_passed`)."""
    return f"{list_name}/cleared"


def clear_passed(lists: Any, list_name: str, head: dict[str, Any]) -> int:
    """Delete the blocks wholly behind the head's block (`head`, the list record as
    read): an entry is only read for a token handed out for the first time, and jobs
    reserved one at a time, or claimed, never take theirs out. The head's own block
    stays (a bury may mark, and a later load add, entries at or past the head), as
    does one a bury or a late loader writes behind the mark, until the list is
    dropped. The sweep calls it; record `cleared_name` (bins c, the list's stamp; b,
    blocks below it deleted) remembers how far it got, apart from the list record
    (hot, and every write of it carries a deadline): a mark lost or put back costs
    deletes repeated, nothing else. Returns how many blocks were deleted."""
    created = head.get("created")
    if head.get("mode") != "tokens" or created is None:
        return 0
    backend = lists.backend
    mark = backend.get(keys.BLOCK_SET, cleared_name(list_name))
    start = int(mark.bins.get("b") or 0) if mark is not None and mark.bins.get("c") == created else 0
    end = int(head.get("head") or 0) // BLOCK
    if end <= start:
        return 0
    gone = lists._delete_all(keys.BLOCK_SET, [name(list_name, b) for b in range(start, end)], only=stamped(created))
    backend.put(keys.BLOCK_SET, cleared_name(list_name), {"c": created, "b": end})
    return int(gone)
