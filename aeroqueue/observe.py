"""What a worker reports as it works: the points an observer hears about.

The worker calls a `WorkerObserver` at a few named points and knows nothing
of what listens; this base class ignores them all. `aeroqueue.metrics` turns
them into Prometheus metrics. An observer is called from the worker's
threads (and the session's heartbeat thread), so it must be thread-safe and
quick: it runs on the hot path.

Every reserved job ends in exactly one of done, failed (put back for a
retry), snoozed, dead, timed out, released or lost, so the counts of a worker add up.
"""

from __future__ import annotations


class WorkerObserver:
    """No-op observer: subclass and override the points you want."""

    def following(self, lists: list[str]) -> None:
        """The lists the worker follows now: at its start, and each time a pattern's
        matches change (a list loaded, or one dropped)."""

    def reserve_latency(self, list_name: str, seconds: float) -> None:
        """One reservation call on a list took this long (also when it found nothing)."""

    def reserved(self, list_name: str, n: int) -> None:
        """n jobs of a list were reserved (claimed) by this worker."""

    def handler_duration(self, list_name: str, seconds: float) -> None:
        """A handler ran this long on a job, whatever its outcome."""

    def done(self, list_name: str) -> None:
        """A job was completed (acknowledged done)."""

    def failed(self, list_name: str) -> None:
        """A handler failed and the job was put back for another attempt."""

    def dead(self, list_name: str) -> None:
        """A handler failed or ran past the time limit on the job's last attempt: the job is dead."""

    def timed_out(self, list_name: str) -> None:
        """A handler ran past the job's time limit and the worker stopped waiting for it:
        the job was put back for another attempt (on its last attempt it is `dead`), or,
        when ending its claim failed, left to a reaper, which decides."""

    def snoozed(self, list_name: str) -> None:
        """A handler asked to run its job later (`Retry(after=...)`): not a failure."""

    def released(self, list_name: str, n: int = 1) -> None:
        """Jobs were given back unfinished (draining, or an acknowledgement that failed)."""

    def lost(self, list_name: str) -> None:
        """A job's outcome was not acknowledged: the claim was lost, or the session was."""

    def heartbeat(self, ok: bool) -> None:
        """The session heartbeat ran: ok, or failed/refused (the session may be lost)."""

    def outcome(self, list_name: str, outcome: str) -> None:
        """Dispatch one of `run_job`'s outcomes to its point."""
        if outcome == "done":
            self.done(list_name)
        elif outcome in ("retry", "delayed"):
            self.failed(list_name)
        elif outcome == "dead":
            self.dead(list_name)
        elif outcome == "timed_out":
            self.timed_out(list_name)
        elif outcome == "snoozed":
            self.snoozed(list_name)
        else:  # 'lost', 'unacked'
            self.lost(list_name)


NULL_OBSERVER = WorkerObserver()
