"""What the dashboard shows, read from the store (no Flask here).

Reads stay cheap whatever a list's size: a list's counts are `JobLists.status`
(its header and completion bitmaps); its dead jobs are found from the dead
bitmap (one bit per job) and only those job records are read, a page of them
at a time; sessions are the (small) session set, and their claims come from
one query of the claims index (the claimed jobs' deadlines, ``dl``), whatever
the number of sessions. Kicking every dead job of a list walks the list's job
records (`JobLists.kick`): an operator's action, not a page view.

The page views' reads are bounded in time (`Backend.bounded_reads`): a frozen or
unreachable store makes a page a quick error (503), not a 30 s wait. The actions
are not: a kick's walk of a big list may take longer than a page view's scan.

A frozen node of several holds only some records, yet every scan and every
index query needs every node: the overview (`Store.overview`) reads each part on
its own (`PageReads`), shows those that answered, and names those that did not,
as a scrape does (aeroqueue.metrics): once a read has not answered in time, the
view's other reads get short limits within a budget. The scans of the list set
and of the sessions show the records the other nodes handed over; sessions
whose claims (an index query) did not answer are shown without them. Only a view
of which nothing answered is an error.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aerospike_helpers import expressions as xp

from .. import keys, lease_entries
from ..backends import Backend, Record
from ..backends.base import AFTER_TIMEOUT_BUDGET_S, AFTER_TIMEOUT_MS, NO_INDEX, UnansweredLast
from ..errors import BackendError, BackendTimeout, ClusterChanging, JobNotFound, ListNotFound
from ..lists import DROPPED, JobLists, ListStatus, is_tombstone
from ..sessions import claims_by_session

log = logging.getLogger("aeroqueue.dashboard")

# Dead jobs shown per list page, in token order; the page links to the next ones
# (`dead_jobs`' `after`). It showed 100, each with its whole error history: 1 MB
# a page for a list whose jobs died of 5 attempts' tracebacks, fetched again at
# every refresh (5 s) of every open page.
DEAD_PAGE = 50
DEAD_CHUNKS_READ = 4  # dead bitmap chunks (8 KiB each) read a call while looking for dead jobs
# Bins that may hold a job's earlier errors (newest last), besides `err` (the last one).
HISTORY_BINS = ("errs", "errors", "err_hist")
# What a dead job's row shows (_macros.html, dead_row), on the overview and the list
# pages alike: its last error, never its history (up to 10 errors of 4 KB: the job
# page shows it), nor the payload or the result, which may fill the record. Each
# open page reads these again every few seconds. The overview ranks up to 20 dead
# jobs of every list by their time of death from two bins (DEAD_RANK_BINS), then
# reads the rows of the 50 it shows: read whole, 300 lists' histories of 4 KB errors
# took half a gigabyte a view (a helper's audit).
# The stamp ("c") goes into each row's kick form (a page older than a drop and a load).
DEAD_ROW_BINS = ["state", "jid", "att", "max_att", "done_at", "err", "c"]
DEAD_RANK_BINS = ["state", "done_at"]

# What a node that does not answer (frozen, overloaded, cut off) makes a read raise:
# the view goes on without that part. Other errors still make the page an error.
UNANSWERED = (BackendTimeout, ClusterChanging)
# After a read of a view did not answer in time, as after one of a scrape
# (aeroqueue.metrics): each further record read gets AFTER_TIMEOUT_MS and a scan
# AFTER_TIMEOUT_SCAN_MS, and the parts left once AFTER_TIMEOUT_BUDGET_S is spent are
# not read (backends.base says why). A frozen node costs a view one read's limit (a
# scan's 5 s at most) and the budget, whatever the number of lists.
AFTER_TIMEOUT_SCAN_MS = 1000
# After a scan that timed out, the views of the next SCAN_RETRY_S give their scans
# and index queries the short limits (AFTER_TIMEOUT_SCAN_MS) from the start: every
# scan needs every node, so while one is frozen each attempt at the full limit
# waits out the scan's 5 s, and the page refreshes every few seconds. They are
# still tried, for what the other nodes hold (the sessions, the lists), and a scan
# that answers whole ends the wait: the page is whole again at the first view
# after the node is back. Only an attempt at the full limit starts the wait again
# (a healthy scan slower than the short limit is not held to it for good).
SCAN_RETRY_S = 10.0
# A store without the claims index (`keys.CLAIMS_INDEX`: registered before it; `udf
# register` creates it) gets a query per session, as it did: it is asked for again
# this long after.
CLAIMS_INDEX_RETRY_S = 60.0

T = TypeVar("T")

_CLAIMED = xp.Eq(xp.StrBin("state"), "claimed").compile()


@dataclass(frozen=True)
class ListRow:
    status: ListStatus
    queued: int
    delayed: int
    claimed: int

    @property
    def name(self) -> str:
        return self.status.name

    def share(self, count: int) -> float:
        """count as a fraction of the list's total (0 for an empty list)."""
        return count / self.status.total if self.status.total else 0.0

    @property
    def finished_share(self) -> float:
        return self.share(self.status.done + self.status.dead)


@dataclass(frozen=True)
class UnreadRow:
    """A list whose counts the store did not answer for in time."""

    name: str
    unread: bool = True


@dataclass(frozen=True)
class SessionRow:
    id: str
    state: str
    host: str
    pid: int | None
    started: int | None
    beat: int | None
    expiry_ms: int
    claims: int | None  # None: not read (its index query did not answer in time)
    leased: int = 0  # jobs of its leases not yet settled (acked ones count until their batch is)

    def beat_age_s(self, now_ms: int) -> float | None:
        """Seconds since the last heartbeat, by this process's clock: for display only
        (liveness is judged by the server's clock, by the reaper)."""
        return None if self.beat is None else max(0.0, (now_ms - self.beat) / 1000)

    def overdue(self, now_ms: int) -> bool:
        age = self.beat_age_s(now_ms)
        return self.state != "alive" or (age is not None and age * 1000 > self.expiry_ms)


@dataclass(frozen=True)
class ErrorEntry:
    message: str
    at: int | None = None
    traceback: str | None = None


@dataclass(frozen=True)
class JobView:
    list_name: str
    token: int
    bins: dict[str, Any]
    errors: list[ErrorEntry] = field(default_factory=list)

    @property
    def state(self) -> str:
        return str(self.bins.get("state", "?"))

    @property
    def jid(self) -> str:
        return str(self.bins.get("jid", ""))

    @property
    def last_error(self) -> ErrorEntry | None:
        return self.errors[-1] if self.errors else None

    @property
    def attempts(self) -> int:
        att = self.bins.get("att")
        return att if isinstance(att, int) and not isinstance(att, bool) else 0


def now_ms() -> int:
    return int(time.time() * 1000)


def format_ms(ms: Any) -> str:
    """Server milliseconds as an ISO 8601 UTC time; '' when unset."""
    if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


# A dead job's row shows its last error's message and the end of its traceback, no
# more (the job page shows each error whole): an error may hold 4 KB, and a page
# 50 rows, re-read every few seconds.
ROW_MESSAGE_CHARS = 300
ROW_TRACEBACK_CHARS = 1200


def clip(text: str, limit: int = ROW_MESSAGE_CHARS) -> str:
    """`text`'s first `limit` characters, and an ellipsis if it is longer."""
    return text if len(text) <= limit else text[:limit].rstrip() + " …"


def tail(text: str, limit: int = ROW_TRACEBACK_CHARS) -> str:
    """The last whole lines of `text` that fit in `limit` characters (its last line
    cut to them if it alone does not), after a line saying how many lines are left
    out: a traceback's end, where it says what failed."""
    if len(text) <= limit:
        return text
    lines = text.splitlines()
    kept: list[str] = []
    size = 0
    for line in reversed(lines):
        if kept and size + len(line) + 1 > limit:
            break
        kept.append(line if len(line) <= limit else "…" + line[-limit:])
        size += len(line) + 1
    return f"[{len(lines) - len(kept)} earlier line(s): the job's page shows them]\n" + "\n".join(reversed(kept))


def split_error(text: str) -> tuple[str, str | None]:
    """'Type: message\\nTraceback ...' (how the worker records a failure) -> (message, traceback)."""
    head, sep, rest = text.partition("\n")
    return (head, rest.strip() or None) if sep else (text, None)


def error_history(bins: dict[str, Any]) -> list[ErrorEntry]:
    """A job's errors, oldest first: an error-history bin if the job has one (entries
    given as maps with a message and maybe a time and traceback, or as strings),
    then its last error (`err`) unless the history already ends with it."""
    out: list[ErrorEntry] = []
    for name in HISTORY_BINS:
        history = bins.get(name)
        if not isinstance(history, list):
            continue
        for entry in history:
            if isinstance(entry, dict):
                text = str(entry.get("err") or entry.get("msg") or entry.get("message") or entry.get("error") or "")
                message, tb = split_error(text)
                tb = entry.get("tb") or entry.get("traceback") or tb
                at = entry.get("at") or entry.get("time") or entry.get("t")
                out.append(ErrorEntry(message, at if isinstance(at, int) else None, str(tb) if tb else None))
            elif entry is not None:
                message, tb = split_error(str(entry))
                out.append(ErrorEntry(message, None, tb))
        break
    err = bins.get("err")
    if isinstance(err, str) and err:
        message, tb = split_error(err)
        if not out or out[-1].message != message:
            out.append(ErrorEntry(message, None, tb))
    return out


def _bounded(read: Callable[..., T]) -> Callable[..., T]:
    """A page view's read of the `Store`, made within `Backend.bounded_reads` (those
    of an enclosing block, if any: a `PageReads`' short limits after a timeout)."""

    @functools.wraps(read)
    def bounded(self: Store, *args: Any, **kwargs: Any) -> T:
        if self.backend.reads_bounded():
            return read(self, *args, **kwargs)
        with self.backend.bounded_reads():
            return read(self, *args, **kwargs)

    return bounded


class PageReads:
    """One page view's reads, part by part: a part the store does not answer for in
    time is noted (`unread`) and the view goes on; after the first such part the
    others get short limits, and none is read once the budget is spent."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.unread: list[str] = []  # the parts not read, as the page names them
        self.answered = 0  # parts read
        self.error: BackendError | None = None  # the first part's that did not answer
        self.last_error: BackendError | None = None  # the last `read`'s, if it did not answer
        self._budget_end: float | None = None

    def read(self, part: str, fn: Callable[[], T], *, short: bool = False, shown: bool = True) -> T | None:
        """fn()'s answer, or None (and `part` noted unread) if the store did not answer.
        `short`: with the short limits even before a read of this view timed out (a
        scan or index query while an earlier view's scan timed out: SCAN_RETRY_S).
        `shown` False: a read the page does without (its parts are read again on their
        own), noted nowhere if it does not answer, but the short limits start."""
        now = time.monotonic()
        self.last_error = None
        if self._budget_end is not None and now >= self._budget_end:
            self.unread.append(part)
            return None
        try:
            if self._budget_end is None and short:
                with self.backend.bounded_reads(record_ms=AFTER_TIMEOUT_MS, scan_ms=AFTER_TIMEOUT_SCAN_MS):
                    out = fn()
            elif self._budget_end is None:
                with self.backend.bounded_reads():
                    out = fn()
            else:
                left_ms = max(1, int((self._budget_end - now) * 1000))
                with self.backend.bounded_reads(
                    record_ms=min(AFTER_TIMEOUT_MS, left_ms), scan_ms=min(AFTER_TIMEOUT_SCAN_MS, left_ms)
                ):
                    out = fn()
        except UNANSWERED as e:
            self.failed(part, e, shown=shown)
            return None
        self.answered += 1
        return out

    def failed(self, part: str, error: BackendError, *, shown: bool = True) -> None:
        """`part` did not answer (`error`): noted (if `shown`), and the short limits start."""
        if shown:
            self.unread.append(part)
        self.last_error = error
        if self._budget_end is None:
            self._budget_end = time.monotonic() + AFTER_TIMEOUT_BUDGET_S
            self.error = error
            log.warning(f"{part}: not read; the page's other reads get {AFTER_TIMEOUT_MS} ms each",
                        extra={"event": "page_partial", "error": str(error)})


@dataclass(frozen=True)
class DeadPage:
    """One page of a list's dead jobs, in token order (`Store.dead_jobs`)."""

    jobs: list[JobView]  # fewer than `limit` when a job's dead bit lags its kick
    limit: int  # dead jobs a page
    after: int | None  # the page holds the dead jobs past this token (None: from the first)
    next_after: int | None  # the next page's `after`; None: no dead job past this page's


@dataclass
class Overview:
    """The index page's reads: what answered, and what did not (`unread`)."""

    lists: list[ListRow | UnreadRow]
    lists_whole: bool  # the scan of the list set answered: no list may be missing
    sessions: list[SessionRow] | None  # None: not read
    sessions_whole: bool  # their scan answered: no session may be missing
    dead: list[JobView]
    dead_unread: list[str]  # the lists whose dead jobs were not read
    dead_total: int  # the dead jobs of the lists read, by their counts: more than `dead` may show
    dead_per_list: int  # at most this many of each list's are read (its lowest tokens)
    unread: list[str]
    answered: int
    error: BackendError | None

    @property
    def partial(self) -> bool:
        return bool(self.unread)

    @property
    def dead_total_partial(self) -> bool:
        """Lists may be missing from `dead_total`: a list not read, or the list scan cut short."""
        return not self.lists_whole or any(isinstance(row, UnreadRow) for row in self.lists)

    @property
    def claims_unread(self) -> list[SessionRow]:
        """The sessions shown whose claims were not read."""
        return [s for s in self.sessions or [] if s.claims is None]


class Store:
    """The dashboard's reads and the operator's actions, on one backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.lists = JobLists(backend)
        self._lock = threading.Lock()
        self._known: set[str] = set()  # the lists the views have found
        self._scan_again_at = float("-inf")  # after a scan that timed out (SCAN_RETRY_S)
        self._read_order = UnansweredLast()  # a frozen node's lists read after the others
        self._no_claims_index_until = float("-inf")  # the store had no claims index (CLAIMS_INDEX_RETRY_S)

    # -- the overview --------------------------------------------------------------

    def overview(self, dead_per_list: int = 20, dead_shown: int = 50) -> Overview:
        """The index page: each list's counts, the latest dead jobs, the sessions; each
        read on its own (`PageReads`), those that did not answer named. The lists are
        those the scan of the list set finds; when a node does not answer, those the
        other nodes hand over and those found by earlier views."""
        reads = PageReads(self.backend)
        names, whole = self._list_names(reads)
        got: dict[str, ListRow | UnreadRow] = {}
        # Every list's records in two batch calls (`JobLists.prefetch`), not two round
        # trips a list at every refresh; if they do not answer, each list is read on
        # its own, within the short limits, and shown unread if it does not answer.
        together = reads.read("the lists together", functools.partial(self.lists.prefetch, names),
                              shown=False) if names else None
        for name in self._read_order.order(names):
            try:
                row = reads.read(f"list {name}", functools.partial(self.list_row, name, (together or {}).get(name)))
            except ListNotFound:
                with self._lock:
                    self._known.discard(name)
                continue  # dropped meanwhile
            if row is not None or reads.last_error is not None:  # else not tried: the budget was spent
                self._read_order.note(name, row is not None)
            got[name] = row if row is not None else UnreadRow(name)
        rows = [got[name] for name in names if name in got]  # shown by name, whatever the order read
        dead, dead_unread = self._latest_dead(reads, rows, dead_per_list, dead_shown)
        sessions, sessions_whole = self._sessions(reads)
        dead_total = sum(row.status.dead for row in rows if isinstance(row, ListRow))
        return Overview(rows, whole, sessions, sessions_whole, dead, dead_unread, dead_total, dead_per_list,
                        reads.unread, reads.answered, reads.error)

    def _latest_dead(
        self, reads: PageReads, rows: list[ListRow | UnreadRow], per_list: int, shown: int,
    ) -> tuple[list[JobView], list[str]]:
        """The overview's dead jobs: the `shown` latest deaths among up to `per_list` of
        each list (with many lists, those an operator opens the page for, not those of
        the lists first by name), and the lists whose dead jobs were not read."""
        ranked: list[tuple[int, str, int]] = []  # (died at, list, token)
        unread: list[str] = []
        for row in rows:
            if not (isinstance(row, ListRow) and row.status.dead):
                continue
            part = f"dead jobs of {row.name}"
            try:
                got = reads.read(part, functools.partial(self.dead_ranked, row.name, per_list))
            except ListNotFound:
                continue
            if got is None:
                unread.append(row.name)
            else:
                ranked += [(at, row.name, token) for at, token in got]
        ranked.sort(key=lambda r: r[0], reverse=True)
        chosen: dict[str, list[int]] = defaultdict(list)
        for _, name, token in ranked[:shown]:
            chosen[name].append(token)
        dead: list[JobView] = []
        for name, tokens in chosen.items():
            jobs = reads.read(f"dead jobs of {name}", functools.partial(self.dead_rows, name, tokens))
            if jobs is None:
                unread.append(name)
            else:
                dead += jobs
        dead.sort(key=lambda job: job.bins.get("done_at") or 0, reverse=True)
        return dead, unread

    def _list_names(self, reads: PageReads) -> tuple[list[str], bool]:
        """The lists to show, and whether that is all of them (the scan answered)."""
        got = self._scanned(reads, "the list of lists", keys.LIST_SET, ["mode", DROPPED])
        with self._lock:
            known = set(self._known)
        if got is None:
            return sorted(known), False
        recs, whole = got
        found = {name for name, rec in recs if not is_tombstone(rec.bins)}
        if not whole:  # some nodes answered: their lists, and those found before
            with self._lock:
                self._known |= found
            return sorted(found | known), False
        with self._lock:
            self._known = set(found)
        return sorted(found), True

    def _sessions(self, reads: PageReads) -> tuple[list[SessionRow] | None, bool]:
        """The sessions to show (None: none read), and whether that is all of them:
        those the nodes that answered the scan hold, with their claims if the query
        of the claims index answered (a query needs every node too). One query for
        all of them: it was one a session, 50 queries a view with 50 workers."""
        got = self._scanned(reads, "sessions", keys.SESS_SET, None)
        if got is None:
            return None, False
        recs, whole = got
        sessions = dict(recs)  # a record that migrates during the scan may come twice (`scan_answered`)
        short = self._scans_held()
        claimed: dict[str, int] | None = {}
        if sessions:
            held = reads.read("claims of the sessions", lambda: (self._all_claims(),), short=short)
            if held is None and reads.last_error is not None and not short:
                self._scan_failed(reads.last_error)  # a query needs every node, as a scan does
                short = True
            claimed = None if held is None else held[0]
            if held is not None and claimed is None:  # no claims index: a query a session
                return self._sessions_one_by_one(reads, sessions, short), whole
        rows = [_session_row(sid, rec.bins, None if claimed is None else claimed.get(sid, 0))
                for sid, rec in sessions.items()]
        return _sessions_order(rows), whole

    def _sessions_one_by_one(self, reads: PageReads, sessions: dict[str, Record], short: bool) -> list[SessionRow]:
        """The sessions' rows, each with its claims read by an index query of its own
        (a store without the claims index)."""
        rows = []
        for sid, rec in sessions.items():
            claims = reads.read(f"claims of session {sid[:12]}", functools.partial(self._claims, sid), short=short)
            if reads.last_error is not None and not short:
                self._scan_failed(reads.last_error)
                short = True
            rows.append(_session_row(sid, rec.bins, claims))
        return _sessions_order(rows)

    def _scanned(
        self, reads: PageReads, part: str, set_name: str, bins: list[str] | None,
    ) -> tuple[list[tuple[str, Record]], bool] | None:
        """The records of a small set that the nodes handed over (`Backend.scan_answered`)
        and whether that is all of them, or None if none answered; `part` is named
        unread unless all answered. While a scan timed out in the last SCAN_RETRY_S,
        with the short limits."""
        def scan() -> tuple[list[tuple[str, Record]], BackendError | None]:
            recs, error = self.backend.scan_answered(set_name, bins=bins)
            if error is not None and (not recs or not isinstance(error, UNANSWERED)):
                raise error  # nothing answered (or not for want of a node): as any read's error
            return recs, error

        held = self._scans_held()
        got = reads.read(part, scan, short=held)
        if got is None:  # nothing answered, or not tried (the view's budget spent)
            if reads.last_error is not None and not held:
                self._scan_failed(reads.last_error)
            return None
        recs, error = got
        if error is not None:  # some nodes answered: their records
            reads.failed(part, error)
            if not held:
                self._scan_failed(error)
            return recs, False
        with self._lock:
            self._scan_again_at = float("-inf")  # answered whole: the node is back
        return recs, True

    def _scans_held(self) -> bool:
        with self._lock:
            return time.monotonic() < self._scan_again_at

    def _scan_failed(self, error: BackendError) -> None:
        # Only a timeout is worth waiting out: a cluster that is changing refuses at once.
        if isinstance(error, BackendTimeout):
            with self._lock:
                self._scan_again_at = time.monotonic() + SCAN_RETRY_S

    # -- reads ---------------------------------------------------------------------

    @_bounded
    def list_rows(self) -> list[ListRow]:
        rows = []
        for name in self.lists.names():
            try:
                rows.append(self.list_row(name))
            except ListNotFound:
                continue  # dropped meanwhile
        return rows

    @_bounded
    def list_row(self, name: str, read: tuple[dict[str, Any], list[Any]] | None = None) -> ListRow:
        """A list's row; `read`: its records as `JobLists.prefetch` read them."""
        st = self.lists.status(name, read=read)
        return ListRow(st, queued=st.reservable + st.retry_pending, delayed=st.delayed, claimed=st.in_flight)

    @_bounded
    def sessions(self) -> list[SessionRow]:
        """Every session with its claims, or an error if any did not answer (the
        overview reads them part by part: `_sessions`)."""
        recs = list(self.backend.scan(keys.SESS_SET))
        claimed = self._all_claims() if recs else {}
        return _sessions_order([
            _session_row(sid, rec.bins, claimed.get(sid, 0) if claimed is not None else self._claims(sid))
            for sid, rec in recs
        ])

    def _all_claims(self) -> dict[str, int] | None:
        """How many jobs each session holds claimed (those holding none left out), in one
        query: every claimed job, through the claims index (a job has a deadline,
        ``dl``, only while claimed). None if the store has no claims index (then
        `_claims`, a query a session), which is asked for again CLAIMS_INDEX_RETRY_S later."""
        with self._lock:
            if time.monotonic() < self._no_claims_index_until:
                return None
        try:
            found = claims_by_session(self.backend, _CLAIMED, ["sess"])
        except BackendError as e:
            if e.code not in NO_INDEX:
                raise
            with self._lock:
                said = self._no_claims_index_until != float("-inf")
                self._no_claims_index_until = time.monotonic() + CLAIMS_INDEX_RETRY_S
            if not said:
                log.warning(f"the store has no claims index ({keys.CLAIMS_INDEX}: {e}): the sessions' claims are read "
                            "with a query a session; `aeroqueue udf register` creates it",
                            extra={"event": "claims_index_missing", "error": str(e)})
            return None
        return {sess: len(claims) for sess, claims in found.items()}

    def _claims(self, sid: str) -> int:
        """How many jobs a session holds claimed (the secondary index on ``sess``)."""
        return len(self.backend.find(keys.JOB_SET, "sess", sid, expression=_CLAIMED, bins=["state"]))

    @_bounded
    def dead_ranked(self, name: str, limit: int) -> list[tuple[int, int]]:
        """(died at, token) of up to `limit` dead jobs of a list, two small bins a job."""
        dead = self._dead(name, self._dead_tokens(name, limit), DEAD_RANK_BINS)
        return [(int(bins.get("done_at") or 0), t) for t, bins in dead]

    @_bounded
    def dead_rows(self, name: str, tokens: list[int]) -> list[JobView]:
        """The rows of those of these jobs of a list that are dead (`DEAD_ROW_BINS`)."""
        return [JobView(name, t, got, error_history(got)) for t, got in self._dead(name, tokens, DEAD_ROW_BINS)]

    @_bounded
    def dead_jobs(self, name: str, limit: int | None = None, after: int | None = None) -> DeadPage:
        """Up to `limit` (DEAD_PAGE) dead jobs of a list past token `after` (None: from
        the first), in token order, found from its dead bitmap: one page of them, and
        where the next starts. What a page costs follows `limit`, not the list's size."""
        limit = DEAD_PAGE if limit is None else limit
        tokens = self._dead_tokens(name, limit + 1, after)  # one more: is there a next page?
        shown = tokens[:limit]
        return DeadPage(self.dead_rows(name, shown), limit, after,
                        shown[-1] if len(tokens) > limit else None)

    def _dead_tokens(self, name: str, limit: int, after: int | None = None) -> list[int]:
        head = self.lists.header(name)
        return dead_tokens(self.backend, name, head["alloc"], limit, head["created"], after)

    def _dead(self, name: str, tokens: list[int], bins: list[str]) -> list[tuple[int, dict[str, Any]]]:
        """(token, bins) of those of these jobs that are dead: a bitmap's bit may lag a
        kick, and a job ranked dead may have been kicked since."""
        recs = self.backend.batch_get(keys.JOB_SET, [keys.job_name(name, t) for t in tokens], bins=bins)
        return [(t, rec.bins) for t, rec in zip(tokens, recs, strict=True)
                if rec is not None and rec.bins.get("state") == "dead"]

    @_bounded
    def job(self, name: str, token: int) -> JobView | None:
        keys.check_list_name(name)
        rec = self.backend.get(keys.JOB_SET, keys.job_name(name, token))
        if rec is None or rec.bins.get("state") == "void":
            return None
        return JobView(name, token, rec.bins, error_history(rec.bins))

    @_bounded
    def token_of(self, name: str, jid: str) -> int | None:
        """The token of a job by its id (the load's job-id index), or None."""
        keys.check_list_name(name)
        try:
            return int(self.lists.find_job(name, jid)["token"])
        except (ListNotFound, JobNotFound):
            return None

    # -- actions -------------------------------------------------------------------

    def pause(self, name: str, paused: bool, created: int | None = None) -> None:
        # `created`: the list stamp the page was shown with (`ListReplaced` for another
        # list of the name).
        self.lists.pause(name, paused, created=created)

    def kick_job(self, name: str, token: int, created: int | None = None) -> bool:
        # The page offers a kick of a dead job: one delayed by the time the button is
        # pressed (kicked by another since, failed again) keeps its wait. `created`: the
        # list stamp the page was shown with (`ListReplaced` for another list of the name).
        return self.lists.kick(name, [token], dead_only=True, created=created) == 1

    def kick_all(self, name: str, created: int | None = None) -> int:
        return self.lists.kick(name, created=created)


def _session_row(sid: str, b: dict[str, Any], claims: int | None) -> SessionRow:
    leased = sum(len(list(lease_entries.tokens(lease))) for lease in (b.get("leases") or {}).values())
    return SessionRow(
        id=sid, state=str(b.get("state", "?")), host=str(b.get("host", "")), pid=b.get("pid"),
        started=b.get("started"), beat=b.get("beat"), expiry_ms=int(b.get("exp") or 0), claims=claims,
        leased=leased,
    )


def _sessions_order(rows: list[SessionRow]) -> list[SessionRow]:
    return sorted(rows, key=lambda r: (r.host, r.started or 0, r.id))


def dead_tokens(
    backend: Backend, name: str, alloc: int, limit: int, created: int | None = None, after: int | None = None,
) -> list[int]:
    """Tokens whose bit is set in a list's dead bitmap, lowest first, at most `limit`,
    past token `after` if given (in the chunks of the list made at `created`:
    `keys.bitmap_of`). The chunks are read a few at a time, from the one that holds
    `after`, until `limit` are found: the overview asks this of every list with
    dead jobs, and a list of a million jobs has 16 chunks."""
    n_chunks = -(-alloc // keys.BITS_PER_CHUNK)
    start = 0 if after is None else max(0, after + 1)
    out: list[int] = []
    for first in range(start // keys.BITS_PER_CHUNK, n_chunks, DEAD_CHUNKS_READ):
        chunks = range(first, min(n_chunks, first + DEAD_CHUNKS_READ))
        recs = backend.batch_get(keys.DONE_SET, [keys.chunk_name(name, c) for c in chunks], bins=["dead", "c"])
        for chunk, rec in zip(chunks, (keys.bitmap_of(r, created) for r in recs), strict=True):
            data = bytes(rec.bins.get("dead") or b"") if rec is not None else b""
            base = chunk * keys.BITS_PER_CHUNK
            for i in range(max(0, start - base) // 8, len(data)):
                byte = data[i]
                if not byte:
                    continue
                for bit in range(8):
                    token = base + i * 8 + bit
                    if byte & (0x80 >> bit) and token >= start:
                        out.append(token)
                        if len(out) >= limit:
                            return out
    return out
