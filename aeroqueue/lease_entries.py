"""The leases a session record holds: jobs the session took without a claim on
their records (`Queue.reserve(..., lease=True)`), in its `leases` bin
(aq_sess_v1.lua):

    {lease id: [list name, until (server ms), [[att, claimed, [token, ...], created], ...]]}

(`created`: the list's stamp the jobs' records had, `hotpath.LeaseFence`; a group
written before the stamp was part of the fence has three items.)

Read here for the sessions (the reaper, an operator's questions) and for a drop
(`lists`, which waits for the leases on its list), so that both decode an entry,
and judge a lease past its limit, the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from aerospike_helpers.operations import expression_operations as eo

from . import keys
from .backends import Backend
from .config import CLOCK_MARGIN_MS
from .errors import RecordNotFound
from .hotpath import SERVER_NOW_COMPILED

_SERVER_NOW = eo.expression_read("now", SERVER_NOW_COMPILED)

Entry = list[Any]  # [list name, until, groups]
Leases = dict[str, Entry]  # lease id -> entry


def cutoff_ms(backend: Backend, session_id: str) -> float | None:
    """A lease of session `session_id` whose end is before this (server ms) is past its
    limit: the server's clock, as the node holding that session's record reads it,
    less the margin the project allows between clocks, so that an ack a job record's
    node still admits lands first, or not at all. Never this host's clock: a reaper or
    a dropper whose clock ran ahead would end leases their holders may still
    acknowledge. None when the session record is gone (and its leases with it)."""
    now = server_now_ms(backend, session_id)
    return None if now is None else now - CLOCK_MARGIN_MS


def server_now_ms(backend: Backend, session_id: str) -> int | None:
    """The server's clock (ms), as the node holding session `session_id`'s record reads
    it; None when that record is gone."""
    try:
        rec = backend.operate(keys.SESS_SET, session_id, [_SERVER_NOW])
    except RecordNotFound:
        return None
    return int(rec.bins["now"])


def overdue(leases: Leases, cutoff: float) -> Leases:
    """The leases of `leases` past their limit by `cutoff` (`cutoff_ms`)."""
    return {lid: e for lid, e in leases.items() if e[1] < cutoff}


def on_list(leases: Leases, list_name: str) -> Leases:
    return {lid: e for lid, e in leases.items() if e[0] == list_name}


def groups(entry: Entry) -> Iterator[tuple[int, int | None, list[int], int | None]]:
    """(att, claimed, tokens, created) of each group of jobs a lease read alike."""
    for group in entry[2]:
        yield group[0], group[1], group[2], group[3] if len(group) > 3 else None


def tokens(entry: Entry) -> Iterator[int]:
    """The tokens (jobs of its list) a lease holds."""
    for group in entry[2]:
        yield from group[2]


def of_record(bins: dict[str, Any]) -> Leases:
    """The leases of a session record's bins (none when it holds none)."""
    return bins.get("leases") or {}


def scan(backend: Backend) -> Iterator[tuple[str, Leases]]:
    """(session id, its leases) of every session record: a scan, for a drop or an
    operator's question, not a hot path."""
    for sid, rec in backend.scan(keys.SESS_SET, bins=["leases"]):
        yield sid, of_record(rec.bins)
