"""Claim and complete as native operations: the batch path's common case, without Lua.

`aq_job_v1.claim` and `aq_job_v1.complete` decide every case of a job's claim
and acknowledgement. Almost every call is the plain one: a queued job claimed,
a claim acknowledged in time by its holder. For a batch of those, this module
sends one `batch_operate` whose filter expression admits exactly the records
the Lua function would change that way, and whose writes are that function's
writes, the server's clock read from the record's own metadata (last update
time + time since it). A record the filter turns away (claimed already by
this very request, delayed, done, late, not this session's, missing, kicked
once, whose end the Lua function times, or run past the request's deadline)
goes to the Lua function, which decides and
answers as always: the fast path never answers anything but 'ok'.

Why, measured on the real server (benchmarks/RESULTS.md, issue 14): in a batch
of 100 a claim costs about 4 us of server CPU per record as an operation
against about 17 us as a UDF, an ack about 6 us against 32 us, and the client
spends less too. For ONE record it does not pay: an operate with a dozen ops
and a filter costs the client ~40 us more CPU than the UDF call, more than the
server saves, so `Queue` sends single claims and acks to the UDF. The
single-record functions here stay for that comparison and for tests.

Both writes are idempotent under their request id: a claim repeated after a
lost answer finds the job claimed and goes to the UDF, which recognises the
request id; a repeated ack finds it done and the UDF answers 'again'.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from functools import lru_cache
from typing import Any

from aerospike_helpers import expressions as exp
from aerospike_helpers.expressions.resources import _ExprOp
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import operations as op

from . import keys
from .backends import IN_DOUBT, Backend
from .errors import AeroqueueError, BackendTimeout, FilteredOut, RecordNotFound, RecordTooBig

# Server ms now: the record's last update (ns) plus the ms since. The same clock
# as the Lua functions' aerospike:get_current_time().
SERVER_NOW = exp.Add(exp.Div(exp.LastUpdateTime(), 1_000_000), exp.SinceUpdateTime())
SERVER_NOW_COMPILED = SERVER_NOW.compile()


def in_time(deadline: int) -> Any:
    """True until the server's clock passes `deadline` (`Backend.job_deadline`): in a
    filter, a write that a frozen node runs after its sender gave up on it changes
    nothing (README: a frozen node replays the calls it was sent)."""
    return exp.LE(SERVER_NOW, deadline)


def until(deadline: int, value: Any) -> Any:
    """An expression worth `value` until the server's clock passes `deadline`, past it
    unknown: a write of it (or a read in a write's operations) then fails with code 26
    and the whole record is left as it was (a create made nowhere)."""
    return exp.Cond(in_time(deadline), value, exp.Unknown()).compile()


def stamped(created: int) -> Any:
    """A filter: a record stamped (bin "c") by the list of the name made at `created`."""
    return stamped_in_time(created, None)


# A batch record's codes for "the UDF decides": no record (2), filter false (27).
TO_UDF = (2, 27)

_CLAIM_READS = ("jid", "payload", "att", "token", "dl", "c")
_VAL = _ExprOp.VAL  # a compiled expression's value node: (VAL, None, {'val': v}, 0)

# Filters are compiled once with placeholders and bound per call: every
# reservation has its own request id and every call its own deadline, and
# compiling an expression each time cost more than the rest of an ack's Python.
_SESS, _RID, _DEADLINE = "\x00sess", "\x00rid", -0x7A7A7A7A7A7A


def _template(conds: list[Any], with_deadline: bool) -> list[tuple]:
    if with_deadline:
        # The request's deadline (Backend.job_deadline): a call the server runs after
        # its sender gave up on it changes nothing (aq_job_v1.lua, `stale`).
        conds = [*conds, exp.LE(SERVER_NOW, _DEADLINE)]
    return (conds[0] if len(conds) == 1 else exp.And(*conds)).compile()


def _bind(template: list[tuple], values: dict[Any, Any]) -> list[tuple]:
    out = list(template)
    for i, val in _values_of(template):
        if val in values:
            code, rt, _, n = out[i]
            out[i] = (code, rt, {"val": values[val]}, n)
    return out


# Each template's value nodes (str or int: where a placeholder may be), by the
# template's id, found once: a lease filter has some forty nodes, and scanning them
# all at each bind cost about 14 us a call (an ack call, a claim call).
_VALUES_OF: dict[int, tuple[list[tuple], list[tuple[int, Any]]]] = {}


def _values_of(template: list[tuple]) -> list[tuple[int, Any]]:
    known = _VALUES_OF.get(id(template))
    if known is not None and known[0] is template:
        return known[1]
    found = [
        (i, fixed["val"]) for i, (code, _rt, fixed, _n) in enumerate(template)
        if code == _VAL and type(fixed["val"]) in (str, int)
    ]
    _VALUES_OF[id(template)] = (template, found)  # the template kept: its id is never another's
    return found


_STAMP = -0x3C3C3C3C3C3C
# Of the take's list: a record without a stamp (written before stamps were), or with its
# stamp (aq_job_v1.lua, `claim`'s `created`).
_OF_LIST = exp.Or(exp.Not(exp.BinExists("c")), exp.Eq(exp.IntBin("c"), _STAMP))
_QUEUED = {
    (d, s): _template([exp.Eq(exp.StrBin("state"), "queued"), *([_OF_LIST] if s else [])], d)
    for d in (False, True) for s in (False, True)
}
_OURS = _template([_OF_LIST], False)


def ours(created: int) -> list[tuple]:
    """A filter: a record of the list made at `created`, by its stamp (bin "c"), as
    `keys.indexed_here` reads one (records written before stamps were have none).
    (A filter is not applied to a record the write creates.)"""
    return _bind(_OURS, {_STAMP: created})


_STAMPED = {d: _template([exp.Eq(exp.IntBin("c"), _STAMP)], d) for d in (False, True)}


def stamped_in_time(created: int, deadline: int | None) -> list[tuple]:
    """`stamped`, and with a deadline, before it by the server's clock (bound to a
    filter compiled once: this one is sent with every leased reservation)."""
    if deadline is None:
        return _bind(_STAMPED[False], {_STAMP: created})
    return _bind(_STAMPED[True], {_STAMP: created, _DEADLINE: deadline})


def _holder(with_rid: bool, with_deadline: bool) -> list[tuple]:
    conds = [
        exp.Eq(exp.StrBin("state"), "claimed"),
        exp.Eq(exp.StrBin("sess"), _SESS),
        exp.LE(exp.SinceUpdateTime(), exp.IntBin("tl")),
        # A job kicked once must end after its kick (aq_job_v1.lua, `ended_at`): the
        # UDF reckons that time. Kicks are rare; the native write keeps its plain clock.
        exp.Not(exp.BinExists("kicked")),
    ]
    if with_rid:
        conds.append(exp.Eq(exp.StrBin("rid"), _RID))
    return _template(conds, with_deadline)


_HOLDER = {(r, d): _holder(r, d) for r in (False, True) for d in (False, True)}


def queued_filter(deadline: int | None = None, created: int | None = None) -> list[tuple]:
    """True for a queued job (with a deadline, before it by the server's clock; with
    the take's list stamp `created`, of that list or unstamped)."""
    template = _QUEUED[deadline is not None, created is not None]
    if deadline is None and created is None:
        return template
    return _bind(template, {_DEADLINE: deadline, _STAMP: created})


def holder_filter(sess: str, rid: str, deadline: int | None = None) -> list[tuple]:
    """True for a job claimed by `sess` (under `rid`, unless it is empty) whose time
    limit has not run out: aq_job_v1's `holds` and not `late`. A claim or touch
    writes `tl` and sets the last update time, so SinceUpdateTime <= tl is the
    UDF's `now <= dl` on the server's clock. With a deadline, also before it. Never
    for a job kicked once: its completion is the UDF's."""
    return _bind(_HOLDER[bool(rid), deadline is not None], {_SESS: sess, _RID: rid, _DEADLINE: deadline})


@lru_cache(maxsize=64)
def _deadline(tlim: int) -> Any:
    return exp.Add(SERVER_NOW, tlim).compile()


def claim_ops(sess: str, rid: str, tlim: int) -> list[dict]:
    """aq_job_v1.claim on a queued job: claimed by `sess` under `rid`, att + 1, its
    time limit `tlim` ms from now; answers the bins the claim answers."""
    return [
        op.write("state", "claimed"),
        op.write("due", None),
        op.write("sess", sess),
        op.write("rid", rid),
        op.increment("att", 1),
        op.write("tl", tlim),
        eo.expression_write("claimed", SERVER_NOW_COMPILED),
        eo.expression_write("dl", _deadline(tlim)),
        *(op.read(b) for b in _CLAIM_READS),
    ]


def claimed(bins: dict[str, Any]) -> dict[str, Any]:
    """A native claim's answer, shaped as the UDF's."""
    return {"st": "ok", **{b: bins.get(b) for b in _CLAIM_READS}}


def complete_ops(sess: str, result: Any) -> list[dict]:
    """aq_job_v1.complete on a job `sess` holds: done, its result kept, the claim gone."""
    return [*_complete_common(sess), op.write("result", result)]


def _complete_common(sess: str) -> list[dict]:
    """`complete_ops` but the result: the same for every job a session acknowledges."""
    return [
        op.write("state", "done"),
        op.write("by", sess),
        op.write("sess", None),
        op.write("dl", None),
        op.write("tl", None),
        eo.expression_write("done_at", SERVER_NOW_COMPILED),
    ]


def claim(
    backend: Backend, list_name: str, token: int, sess: str, rid: str, tlim: int, deadline: int | None = None,
    created: int | None = None,
) -> dict[str, Any] | None:
    """The claim's answer, or None when the UDF must decide."""
    try:
        rec = backend.operate(
            keys.JOB_SET, keys.job_name(list_name, token), claim_ops(sess, rid, tlim),
            expression=queued_filter(deadline, created), update_only=True,
        )
    except (FilteredOut, RecordNotFound):
        return None
    return claimed(rec.bins)


def claim_many(
    backend: Backend, names: list[str], sess: str, rid: str, tlim: int, deadline: int | None = None,
    created: int | None = None,
) -> list[tuple[int, dict[str, Any] | None]]:
    """One batch call; per record (0, the bins a claim answers: `claimed` shapes them
    as the UDF's answer), or (its code, None): `TO_UDF`, the UDF decides; others, in
    doubt or busy, as for any batch. `created`: the take's list stamp (`queued_filter`)."""
    return backend.batch_same(
        keys.JOB_SET, names, claim_ops(sess, rid, tlim), expression=queued_filter(deadline, created)
    )


def complete(backend: Backend, name: str, sess: str, rid: str, result: Any, deadline: int | None = None) -> bool:
    """True once done; False when the UDF must decide (and answer why not)."""
    try:
        backend.operate(
            keys.JOB_SET, name, complete_ops(sess, result), expression=holder_filter(sess, rid, deadline),
            update_only=True,
        )
    except (FilteredOut, RecordNotFound):
        return False
    return True


# Up to this many groups of jobs that share their filter (one claim or lease), each
# group goes in a batch call of its own: one of the same operations when the group's
# jobs share one result object, else one of each record's own operations under the
# group's filter. Past it, one batch_write carries every record's own operations and
# filter. Measured on the client (benchmarks/RESULTS.md, 2026-11-27), a job: 24 to 32
# us in a filter-per-record batch, 3 to 4 in same-operation batches; with a result
# per job (`python -m benchmarks.acks`), 20 to 25 with a filter per record, 9 to 11
# with one per group. A worker's ack batch often holds several leases, and handlers'
# results are each their own.
GROUPS_MAX = 8


def _groups(group_keys: Iterable[Hashable]) -> list[list[int]]:
    """Indices grouped by key, groups in the order their first index comes."""
    out: dict[Hashable, list[int]] = {}
    for i, k in enumerate(group_keys):
        out.setdefault(k, []).append(i)
    return list(out.values())


def _send_group(
    backend: Backend, names: list[str], common: list[dict], results: list[Any], expression: Any
) -> list[int]:
    """One group's acks under its filter `expression`: `common` plus each job's result.
    Jobs sharing one result object share their operations too (the common batch)."""
    first = results[0]
    if all(r is first for r in results):
        return backend.batch_same_codes(keys.JOB_SET, names, [*common, op.write("result", first)], expression=expression)
    return backend.batch_write_codes(
        keys.JOB_SET, [(n, [*common, op.write("result", r)]) for n, r in zip(names, results, strict=True)],
        expression=expression,
    )


def _per_group(groups: list[list[int]], n: int, send: Callable[[list[int]], list[int]]) -> list[int]:
    """Each of `n` records' code, `send(indices)` answering those of one group. A group
    whose call is in doubt gets -1 each (in doubt, as a record's own code would say),
    and the other groups keep the codes they got: with several groups, a call that
    failed after others landed must not send those again as if unanswered. A call that
    fails plainly raises, its ``codes`` holding what the groups before it got (-1 for
    the rest): those acks landed, and the caller counts them (`until_decided`)."""
    codes = [-1] * n
    for idx in groups:
        try:
            out = send(idx)
        except IN_DOUBT:
            if len(groups) == 1:
                raise  # one call: in doubt as a whole, as before grouping
            out = [-1] * len(idx)
        except AeroqueueError as e:
            e.codes = list(codes)  # type: ignore[attr-defined]
            raise
        for i, code in zip(idx, out, strict=True):
            codes[i] = code
    return codes


def complete_many(backend: Backend, items: list[tuple[str, str, str, Any]], deadline: int | None = None) -> list[int]:
    """(name, sess, rid, result) each; each record's code (0: done; `TO_UDF`: the UDF
    decides). Jobs of one claim share their filter: up to `GROUPS_MAX` such groups, a
    batch call each (`_send_group`); more, one batch call with each record's own."""
    groups = _groups((s, r) for _, s, r, _ in items)
    if len(groups) <= GROUPS_MAX:

        def send(idx: list[int]) -> list[int]:
            _, sess, rid, _ = items[idx[0]]
            return _send_group(
                backend, [items[i][0] for i in idx], _complete_common(sess), [items[i][3] for i in idx],
                holder_filter(sess, rid, deadline),
            )

        return _per_group(groups, len(items), send)
    out = backend.batch_each(
        keys.JOB_SET, [(n, complete_ops(s, res), holder_filter(s, r, deadline)) for n, s, r, res in items]
    )
    return [r.code for r in out]


# -- leases: jobs held without a claim on their records -------------------------------
#
# A leased job (Queue.reserve(..., lease=True)) is read, not claimed: its record stays
# 'queued' and the session record lists the lease (aq_sess_v1.lease). What the read
# saw is the fence: any claim since (the holder's own, before a fail or a touch; the
# reaper's, for a dead or overdue lease) adds one to `att` and moves `claimed`, and a
# kick (after a bury) leaves `kicked`, so an ack admitted only while these are as read,
# the job is still queued and the lease's time limit has not run out is an ack of this
# lease and of nothing since. The list's stamp `c` (its `created`, on every job record
# a load writes) is part of it too: a list dropped and loaded again under the same
# name makes records a stale lease would otherwise take for its own (queued, attempt
# 0, never claimed), and a holder paused past its session's end, or a reaper stalled
# with the leases it read, would mark done, or claim, a job of the new list.

LEASE_READS = ("jid", "payload", "att", "token", "state", "claimed", "kicked", "c")
LEASE_READS_LIST = list(LEASE_READS)
_ATT, _CLAIMED_AT, _UNTIL, _CREATED = -0x5A5A5A5A5A5A, -0x6B6B6B6B6B6B, -0x7C7C7C7C7C7C, -0x4D4D4D4D4D4D

# (att, claimed, until, created) as a lease read them (`Job.lease`): `claimed` None when
# the job was never claimed, `created` None when its record has no stamp (a job written
# before stamps were: then the fence is the others alone).
LeaseFence = tuple[int, int | None, int, int | None]


def _lease_template(claimed_before: bool, with_until: bool, with_deadline: bool, stamped: bool) -> list[tuple]:
    conds = [
        exp.Eq(exp.StrBin("state"), "queued"),
        exp.Eq(exp.IntBin("att"), _ATT),
        exp.Eq(exp.IntBin("claimed"), _CLAIMED_AT) if claimed_before else exp.Not(exp.BinExists("claimed")),
        # Never kicked since the read (a lease is never made of a kicked job): buried and
        # kicked, a job is queued again with its attempts as the lease read them.
        exp.Not(exp.BinExists("kicked")),
    ]
    if stamped:
        conds.append(exp.Eq(exp.IntBin("c"), _CREATED))
    if with_until:
        conds.append(exp.LE(SERVER_NOW, _UNTIL))
    return _template(conds, with_deadline)


_LEASE = {
    (c, u, d, s): _lease_template(c, u, d, s)
    for c in (False, True) for u in (False, True) for d in (False, True) for s in (False, True)
}


def lease_filter(
    att: int, claimed: int | None, until: int | None = None, created: int | None = None, deadline: int | None = None
) -> list[tuple]:
    """True for a job as a lease read it (queued, `att`, `claimed` and the list's stamp
    `created` unchanged), and, with `until`, before the lease's time limit by the
    server's clock."""
    template = _LEASE[claimed is not None, until is not None, deadline is not None, created is not None]
    return _bind(template, {_ATT: att, _CLAIMED_AT: claimed, _UNTIL: until, _CREATED: created, _DEADLINE: deadline})


def lease_done_ops(sess: str, rid: str, result: Any) -> list[dict]:
    """aq_job_v1.complete's writes for a leased job: done, its result kept, the attempt
    counted, and `by` and `rid` as a claim's ack leaves them (so a repeated ack is
    recognised by the UDF: 'again')."""
    return [*_lease_done_common(sess, rid), op.write("result", result)]


def _lease_done_common(sess: str, rid: str) -> list[dict]:
    """`lease_done_ops` but the result: the same for every job of a lease."""
    return [
        op.write("state", "done"),
        op.write("by", sess),
        op.write("rid", rid),
        op.increment("att", 1),
        eo.expression_write("done_at", SERVER_NOW_COMPILED),
    ]


def complete_leased(
    backend: Backend, items: list[tuple[str, str, str, LeaseFence, Any]], deadline: int | None = None
) -> list[int]:
    """(name, sess, rid, fence (`LeaseFence`), result) each; each record's code
    (0: done; `TO_UDF`: not as leased any more, the UDF decides; any other: in doubt,
    which `until_decided` sends again). Jobs that share their lease and fence (a
    lease's jobs read together: the common batch) share their filter: up to
    `GROUPS_MAX` such groups, a batch call each (`_send_group`); more, one batch call
    with each record's own."""
    groups = _groups((s, r, f) for _, s, r, f, _ in items)
    if len(groups) <= GROUPS_MAX:

        def send(idx: list[int]) -> list[int]:
            _, sess, rid, fence, _ = items[idx[0]]
            return _send_group(
                backend, [items[i][0] for i in idx], _lease_done_common(sess, rid), [items[i][4] for i in idx],
                lease_filter(*fence, deadline=deadline),
            )

        return _per_group(groups, len(items), send)
    out = backend.batch_each(
        keys.JOB_SET,
        [(n, lease_done_ops(s, r, res), lease_filter(*f, deadline=deadline)) for n, s, r, f, res in items],
    )
    return [r.code for r in out]


def complete_leased_same(
    backend: Backend, names: list[str], sess: str, rid: str, fence: LeaseFence, result: Any,
    deadline: int | None = None,
) -> list[int]:
    """`complete_leased` of jobs that share their lease, fence and result: one batch of
    the same operations."""
    return backend.batch_same_codes(
        keys.JOB_SET, names, lease_done_ops(sess, rid, result), expression=lease_filter(*fence, deadline=deadline)
    )


def claim_leased(
    backend: Backend, names: list[str], sess: str, rid: str, tlim: int, att: int, claimed: int | None,
    deadline: int | None = None, *, until: int | None = None, created: int | None = None,
) -> list[int]:
    """Turn leased jobs still as the lease read them into claims of `sess` under `rid`
    (the lease's id) with a time limit of `tlim` ms: the holder's own before a fail or a
    touch, or the reaper's for a dead or overdue lease. With `until`, only before that
    server ms (the lease's end). Each record's code (0: claimed now; 2 or 27: gone, or
    not as leased any more, or run past `until` or `deadline`)."""
    return backend.batch_same_codes(
        keys.JOB_SET, names, claim_ops(sess, rid, tlim),
        expression=lease_filter(att, claimed, until=until, created=created, deadline=deadline),
    )


# The codes that decide a fenced write: done (0), no record (2), the filter false (27).
DECIDED = (0, *TO_UDF)


def until_decided(
    send: Callable[[list[int]], list[int]], n: int, deadline_s: float, what: str, *, too_big: bool = False
) -> list[int]:
    """Each of `n` fenced writes' deciding code, `send(indices)` answering the codes of
    those. A write whose answer was lost or busy (the whole call in doubt, or a
    record's code) is sent again until `deadline_s`, each time under a fresh request
    deadline; a 27 is sent once more, since a request the server ran past its deadline
    is refused by the same filter as a job that changed. A 13 (the record would be
    too big) is decided too: returned with `too_big`, else `RecordTooBig` is raised
    once the others are decided. Raises `BackendTimeout` for what stayed undecided:
    then nothing may be concluded of those; its ``codes`` holds the others' codes
    (-1 for those in doubt)."""
    codes = [-1] * n
    todo, refused_once = list(range(n)), set()
    give_up = time.monotonic() + deadline_s
    while todo:
        try:
            out = send(todo)
        except IN_DOUBT:
            out = [-1] * len(todo)
        except AeroqueueError as e:
            # Failed plainly part-way (`_per_group`): what landed before is decided all
            # the same, and the caller counts it; the rest is undecided (-1).
            decided = list(codes)
            for i, code in zip(todo, getattr(e, "codes", None) or [-1] * len(todo), strict=True):
                if code in DECIDED or code == 13:
                    decided[i] = code
            e.codes = decided  # type: ignore[attr-defined]
            raise
        again, unsure = [], False
        for i, code in zip(todo, out, strict=True):
            if code == 27 and i not in refused_once:
                refused_once.add(i)
                again.append(i)
            elif code in DECIDED or code == 13:
                codes[i] = code
            else:
                again.append(i)
                unsure = True
        todo = again
        if todo and time.monotonic() >= give_up:
            err = BackendTimeout(f"{what}: {len(todo)} of {n} stayed in doubt for {deadline_s:g} s")
            # What was decided (0: done) is decided all the same: the caller counts it.
            err.codes = [-1 if i in todo else c for i, c in enumerate(codes)]  # type: ignore[attr-defined]
            raise err
        if unsure:
            time.sleep(0.02)  # a busy key or a node going away: give it a moment
    if not too_big and 13 in codes:
        raise RecordTooBig(f"{what}: the record would exceed the namespace's max-record-size", code=13)
    return codes
