"""An embedded store's long holds, credited to the live sessions they held back.

The embedded store's writes hold its lock in the client process (embedded/storage.py):
one stopped inside a write (SIGSTOP, Ctrl-Z) or just long holds every other writer
back, heartbeats included, while reads go through. A reaper would then see healthy
sessions past their expiry, and its ``alive -> reaping``, queued behind the hold,
would land before their heartbeats. So every embedded backend (`open_backend`)
credits each hold of ``storage.LONG_HOLD_MS`` or more to the live sessions, inside
the holding transaction: their last heartbeat (``beat``, aq_sess_v1.lua) moves that
much later, as if the time had not passed for them. Loaders renew their load
ranges' leases the same way, so those still running when the hold began move later
too (aq_list_v1.credit, which keeps the credit apart from the loader's renewals). A
real server holds its locks itself: nothing to credit there.

Here and not in `aeroqueue.sessions`, which builds on this package: every process
that writes credits its holds, whatever it runs (a worker, a load, the CLI).
"""

from __future__ import annotations

from aerospike_helpers import expressions as xp
from aerospike_helpers.operations import operations as ops

from .. import keys
from ..errors import FilteredOut, RecordNotFound
from .base import Backend

# An alive session with a heartbeat to move (every session has one from its open).
_BEATING = xp.And(xp.Eq(xp.StrBin("state"), "alive"), xp.BinExists("beat")).compile()


def credit_hold(backend: Backend, held_ms: int) -> int:
    """Move each live session's last heartbeat `held_ms` later: no heartbeat could
    land while the store was held. The write changes the session's generation, so a
    reaper's ``alive -> reaping`` made from an earlier read fails. Runs inside the
    holding transaction (its writes are savepoints of it); returns the sessions
    credited. Dead sessions are reaped as before, later by the hold."""
    credited = 0
    for session_id, _rec in backend.scan(keys.SESS_SET, bins=["state"], expression=_BEATING):
        try:
            backend.operate(
                keys.SESS_SET, session_id, [ops.increment("beat", held_ms)], expression=_BEATING, update_only=True
            )
            credited += 1
        except (FilteredOut, RecordNotFound):
            pass  # being reaped or gone: nothing to keep alive
    for list_name, rec in backend.scan(keys.LIST_SET, bins=["pend"]):
        if rec.bins.get("pend"):  # ranges allocated and not yet published
            backend.apply(keys.LIST_SET, list_name, keys.LIST_MOD, "credit", held_ms)
    return credited
