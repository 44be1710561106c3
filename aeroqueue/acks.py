"""The worker's acknowledgements, sent in batches (issue 14).

A worker thread that finished a job hands its ack to `AckBatcher` and goes on
to the next job; a thread of the batcher's own sends what has gathered as one
`Queue.complete_many` (one round trip of native operations, `hotpath`) once
`max_jobs` are waiting, the oldest has waited `linger_s`, or a pending ack's
claim nears its deadline (`add(..., by=)`), and at `flush`.
One ack at a time is a UDF call per job: measured on the real server (README,
Benchmarks), batching them is what lets the worker path keep up with
beanstalkd on the same machine.

What it changes, and what it does not:

- Exactly-once acknowledgement holds as before: the server accepts an ack only
  from the claim's holder, under the claim's request id, within its time
  limit (`hotpath.holder_filter`, else the Lua function decides), and each
  refused one is reported as ``lost``.
- An ack waits up to `linger_s` before it is sent. A worker killed in that
  window leaves those jobs claimed by its session, and they run again once the
  session is reaped: exactly what a worker killed a moment before a
  synchronous ack would leave. Handlers run at least once, as always.
- A session found lost sends nothing (its claims may be someone else's now):
  the pending acks end ``unacked``, as a synchronous ack would.
- `linger_s` = 0 turns batching off: the worker then acknowledges each job
  itself before it takes the next.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import AeroqueueError, ClaimLost, JobNotFound, RecordTooBig
from .queue import Job, Queue
from .results import too_big_to_store

log = logging.getLogger("aeroqueue.acks")

DEFAULT_LINGER_S = 0.005
DEFAULT_MAX_JOBS = 100

# (job, outcome, the pending ack's own context): 'done', 'lost', 'unacked', or
# 'failed' (the store failed: the ack may or may not have landed).
Outcome = Callable[[Job, str, Any], None]


# A pending ack: (job, result, the caller's context). A plain tuple: one is made per
# job, and a class's constructor cost more than the rest of `add`.
_Pending = tuple[Job, Any, Any]

# An ack due by a claim's deadline leaves this much before it (at most a quarter of
# the time limit): the server must have it before the claim ends, or it refuses it. A
# tenth (0.2 s of a 2 s limit) was too little on a machine loaded to 10 runnable
# threads a core: the ack thread woke and wrote late, and 9 acks of 10 were refused.
ACK_MARGIN_S = 0.5


class AckBatcher:
    """Acks of finished jobs, sent in batches by a thread of its own."""

    def __init__(
        self,
        queue: Queue,
        on_outcome: Outcome,
        *,
        linger_s: float = DEFAULT_LINGER_S,
        max_jobs: int = DEFAULT_MAX_JOBS,
        lost: Callable[[], bool] = lambda: False,
        too_big: Callable[[Job, str, Any], None] | None = None,
    ) -> None:
        if linger_s <= 0 or max_jobs < 1:
            raise ValueError("linger_s must be positive and max_jobs at least 1")
        self.queue = queue
        self.on_outcome = on_outcome
        self.linger_s = linger_s
        self.max_jobs = max_jobs
        self.lost = lost  # the session's state: a lost session acknowledges nothing
        self.too_big = too_big  # a result the store refuses as too big: the caller fails the job instead
        self._pending: list[_Pending] = []
        # Monotonic time the pending batch is due: its oldest ack's add plus the
        # linger, or sooner for a claim's deadline; -inf while a flush waits.
        self._due = 0.0
        self._by: list[float] = []  # each pending ack's deadline (inf: none given), in step with _pending
        self._sending = 0  # acks taken from `_pending` whose outcome is not reported yet
        # A plain lock under the condition: `add`, once per job, takes it directly (a
        # C call) rather than through Condition's Python-level __enter__.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="aeroqueue-acks", daemon=True)
        self._thread.start()

    def add(self, job: Job, result: Any, context: Any = None, *, by: float | None = None) -> bool:
        """Acknowledge `job` as done with `result`, in the next batch: within the
        linger, and before `by` (monotonic time: the claim's deadline) less a margin,
        whichever comes first. False once closed: the caller acknowledges it itself."""
        with self._lock:
            if self._closed:
                return False
            pending = self._pending
            pending.append((job, result, context))
            wake = len(pending) >= self.max_jobs
            if len(pending) == 1:
                # The first pending ack wakes the thread (asleep until one comes), due
                # after the linger, or at once while a flush has marked it so.
                if self._due != -math.inf:
                    self._due = time.monotonic() + self.linger_s
                wake = True
            if by is None:
                self._by.append(math.inf)
            else:
                by -= min(ACK_MARGIN_S, job.timeout_s / 4)
                self._by.append(by)
                if by < self._due:
                    self._due = by
                    wake = True
            if wake:
                self._cond.notify_all()
        return True

    def waiting(self) -> int:
        """Acks added and not yet reported."""
        with self._cond:
            return len(self._pending) + self._sending

    def flush(self, timeout_s: float | None = None) -> bool:
        """Send what is pending now, and wait until every ack added so far is
        reported. False if `timeout_s` passed first."""
        give_up = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._due = -math.inf  # due at once
            self._cond.notify_all()
            while self._pending or self._sending:
                left = None if give_up is None else give_up - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            # Nothing is left for the flush: later acks wait their linger again (left
            # at -inf, each would go at once, a round trip apiece).
            self._due = 0.0
        return True

    def close(self, timeout_s: float | None = None) -> bool:
        """Flush, then stop the sending thread."""
        done = self.flush(timeout_s)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        return done

    # -- the sending thread ----------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._pending:
                        due = self._due - time.monotonic()
                        if len(self._pending) >= self.max_jobs or due <= 0:
                            break
                        self._cond.wait(due)
                    else:
                        self._cond.wait()
                if self._closed and not self._pending:
                    return
                batch, self._pending = self._pending[: self.max_jobs], self._pending[self.max_jobs :]
                self._by = self._by[self.max_jobs :]
                if not self._pending:
                    self._due, self._by = 0.0, []
                elif self._due != -math.inf:  # not while a flush waits: the rest is due too
                    # The rest waits a linger more, but not past its earliest deadline.
                    self._due = min(time.monotonic() + self.linger_s, min(self._by))
                self._sending += len(batch)
            try:
                self._send(batch)
            finally:
                with self._cond:
                    self._sending -= len(batch)
                    self._cond.notify_all()

    def _send(self, batch: list[_Pending]) -> None:
        if self.lost():
            self._report(batch, "unacked")
            return
        try:
            refused = self.queue.complete_many([p[0] for p in batch], [p[1] for p in batch])
        except RecordTooBig as e:
            if not hasattr(e, "too_big"):  # not complete_many's account of the batch
                for p in batch:
                    self._send_one(p)
                return
            # Every other ack is decided (complete_many says which): only the too-big
            # ones go alone, where each ends as its caller decides (`too_big`).
            too_big, lost = {id(j) for j in e.too_big}, {id(j) for j in getattr(e, "lost", [])}
            for p in batch:  # the decided ones first: a failing callback below must not hold them back
                if id(p[0]) not in too_big:
                    self._report([p], "lost" if id(p[0]) in lost else "done")
            for p in batch:
                if id(p[0]) in too_big:
                    self._send_one(p)
            return
        except Exception as e:
            # The batch as a whole failed (or one member raised on its own retry):
            # each ack again alone, so that one job's trouble is that job's only. Any
            # error, not only ours: one the store did not translate (sqlite3's "disk
            # is full") killed this thread, and every ack after it waited for ever.
            if not isinstance(e, AeroqueueError):
                log.error("acknowledging a batch failed", exc_info=True,
                          extra={"event": "ack_failed", "jobs": len(batch), "error": repr(e)})
            for p in batch:
                self._send_one(p)
            return
        if not refused:
            self._report(batch, "done")
            return
        lost = {id(j) for j in refused}
        for p in batch:
            self._report([p], "lost" if id(p[0]) in lost else "done")

    def _send_one(self, p: _Pending) -> None:
        job, result, context = p
        if self.lost():
            self._report([p], "unacked")
            return
        try:
            self.queue.complete(job, result)
        except (ClaimLost, JobNotFound):
            outcome = "lost"
        except RecordTooBig:
            if self.too_big is None:
                outcome = "failed"
            else:
                try:
                    self.too_big(job, too_big_to_store(result, self.queue.backend.max_record_size(),
                                                       "the handler's result"), context)
                except Exception:  # a bug in the callback must not stop the sending thread
                    log.exception("too-big callback failed", extra={"event": "ack_callback_failed", "jid": job.jid})
                    outcome = "failed"
                else:
                    return
        except Exception as e:  # the store's, or one it did not translate: this job's failure, not the thread's end
            log.error("acknowledgement failed", exc_info=not isinstance(e, AeroqueueError),
                      extra={"event": "ack_failed", "jid": job.jid, "error": str(e) or repr(e)})
            outcome = "failed"
        else:
            outcome = "done"
        self._report([p], outcome)

    def _report(self, batch: list[_Pending], outcome: str) -> None:
        on_outcome = self.on_outcome
        for job, _, context in batch:
            try:
                on_outcome(job, outcome, context)
            except Exception:  # a bug in the callback must not stop every later ack
                log.exception("ack outcome callback failed", extra={"event": "ack_callback_failed", "jid": job.jid})
