"""One job at a time from a shell: reserve, complete, fail.

`reserve` holds its jobs under a session that must stay alive until they are
acknowledged: either its own (``--hold SECONDS``: it heartbeats while it
waits, ends as soon as every job it printed is acknowledged, and releases what
is left when it ends), or one a program keeps alive (``--session``).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from typing import Any

import click

from .. import keys
from ..backends import Backend
from ..errors import ClaimLost, ConfigError, JobNotFound, SessionLost
from ..lists import JobLists
from ..queue import Job, Queue
from ..results import ResultNotStorable, storable_result
from ..sessions import Session, lease_holder, lease_of
from ..stopping import Stop
from .context import (
    EXPIRY_OPT,
    HEARTBEAT_OPT,
    JSON_OPT,
    LIST_ARG,
    TEXT,
    Context,
    check_session_timing,
    err_console,
    option,
    seconds,
    server_time,
    usage_check,
)


def job_json(job: Job) -> dict[str, Any]:
    """One line of `reserve`'s output (JSON Lines, with or without --json). `claim`: the
    reservation's request id, which `complete --claim` and `fail --claim` check, so that
    an acknowledgement is of this claim and not of a later one of the same session."""
    return {"list": job.list, "token": job.token, "id": job.jid, "payload": job.payload, "attempt": job.attempt,
            "session": job.session, "claim": job.rid}


@click.command()
@LIST_ARG
@option("--count", "-n", env="COUNT", type=click.IntRange(1, 10_000), default=1, help="How many jobs to reserve.")
@option("--hold", "hold_s", env="HOLD", type=seconds(0, min_open=True), default=None, metavar="SECONDS",
        help="Keep the session alive (heartbeating) up to SECONDS after printing the jobs; end as soon as each is "
             "acknowledged with `aeroqueue complete/fail --session`, then close the session, releasing the rest. "
             "Needed unless --session is given.")
@option("--session", env="SESSION", type=TEXT, default=None,
        help="Reserve under this live session, which your program opened and heartbeats; reserve does not close it "
             "(with --hold it also heartbeats it while holding).")
@HEARTBEAT_OPT
@EXPIRY_OPT
@JSON_OPT
@click.pass_obj
def reserve(obj: Context, list_name: str, count: int, hold_s: float | None, session: str | None, interval_s: float,
            expiry_s: float, as_json: bool) -> None:
    """Reserve up to N jobs of LIST and print them as JSON Lines, one job a line:
    {"list", "token", "id", "payload", "attempt", "session", "claim"} (--json changes
    nothing: this is always the output). Pass "claim" to `complete --claim` and `fail
    --claim`: only this reservation's claim is then acknowledged.

    The claims live as long as their session. Without --session, reserve opens
    one and needs --hold: for example

    \b
      aeroqueue reserve L -n 10 --hold 300 | while read -r job; do
        ...; aeroqueue complete L "$(jq .token <<<"$job")" --session "$(jq -r .session <<<"$job")" \\
              --claim "$(jq -r .claim <<<"$job")"
      done

    The session is heartbeated until reserve exits: when every job is
    acknowledged, after --hold seconds, or on SIGTERM/SIGINT, whichever comes
    first. On exit the jobs not acknowledged are released at once (their
    attempt refunded) for others to take, and stderr says how many.
    """
    if session is None and hold_s is None:
        raise click.UsageError(
            "reserve needs --hold SECONDS (keep its own session alive while you acknowledge the jobs) or "
            "--session ID (a session your program keeps alive): a session that ended with the command "
            "would give the jobs away before you could complete them"
        )
    check_session_timing(interval_s, expiry_s)
    backend = obj.backend()
    queue = Queue(backend)
    own = session is None
    if own:
        sess = Session.open(backend, interval_s=interval_s, expiry_s=expiry_s)
    else:
        assert session is not None
        _check_alive(backend, session)
        sess = Session(backend, session, interval_s=interval_s, expiry_s=expiry_s)
    released = 0
    jobs: list[Job] = []
    try:
        jobs = queue.reserve(list_name, sess, count)
        for job in jobs:
            click.echo(json.dumps(job_json(job)))
        if not jobs:
            paused = JobLists(backend).header(list_name)["paused"] == 1
            err_console.print(f"{list_name} is paused: `aeroqueue pause {list_name} --resume` resumes it" if paused
                              else f"no job to reserve in {list_name}", highlight=False)
        elif hold_s is not None:
            _hold(backend, sess, jobs, hold_s, heartbeat=not own)
    finally:
        if own:
            released = sess.close(release=True)
    if released:
        err_console.print(f"released {released} job(s) not acknowledged before reserve ended", highlight=False)
    if sess.lost:
        raise SessionLost(f"session {sess.id} was lost while holding: the jobs may be someone else's now")


def _check_alive(backend: Backend, session_id: str) -> None:
    rec = backend.get(keys.SESS_SET, session_id)
    if rec is None or rec.bins.get("state") != "alive":
        raise SessionLost(
            f"session {session_id} does not exist or is not alive (expired, reaped or closed): "
            "claims under it would not be held"
        )


def _hold(backend: Backend, sess: Session, jobs: list[Job], hold_s: float, *, heartbeat: bool) -> None:
    """Wait until every job is acknowledged, the time is up, a signal comes, or the session is lost.
    With `heartbeat`, beat the (borrowed) session here; an own session beats in its thread."""
    stop = Stop()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stop.on_signal)
    names = [j.name for j in jobs]
    rids = {j.rid for j in jobs}
    claim = rids.pop() if len(rids) == 1 else "CLAIM"
    err_console.print(
        f"holding {len(jobs)} job(s) under session {sess.id} for up to {hold_s:g} s: acknowledge each with "
        f"`aeroqueue complete {jobs[0].list} TOKEN --session {sess.id} --claim {claim}` (or `fail`); Ctrl-C "
        "releases them",
        highlight=False, soft_wrap=True,  # one line: a command cut in two does not paste
    )
    try:
        deadline = time.monotonic() + hold_s
        next_beat = time.monotonic() + sess.interval_s
        while not stop.is_set() and not sess.lost and time.monotonic() < deadline:
            if heartbeat and time.monotonic() >= next_beat:
                sess.beat()
                next_beat = time.monotonic() + sess.interval_s
            recs = backend.batch_get(keys.JOB_SET, names, bins=["state", "sess"])
            if not any(r is not None and r.bins.get("state") == "claimed" and r.bins.get("sess") == sess.id for r in recs):
                return
            stop.wait(min(0.2, sess.interval_s, max(0.0, deadline - time.monotonic())))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _held_job(backend: Backend, list_name: str, token: int, session: str, claim: str | None) -> Job:
    """The job as the CLI names it (list and token), with its real id from the record,
    and, when the session holds it by a lease (a worker's batch) rather than a claim,
    that lease: the acknowledgement is then the lease's. `claim` (the request id
    `reserve` printed): only that reservation's claim or lease is acknowledged; without
    it, any of the session's, even a later one of the same token (a list dropped and
    loaded again under the name, a job that came back to the session)."""
    rec = backend.get(keys.JOB_SET, keys.job_name(keys.check_list_name(list_name), token))
    if rec is None or rec.bins.get("state") == "void":
        JobLists(backend).header(list_name)  # no such list: say that instead
        raise JobNotFound(f"list {list_name!r} has no job with token {token}")
    job = Job(list=list_name, token=token, jid=str(rec.bins.get("jid")), payload=None, attempt=rec.bins.get("att", 0),
              session=session, rid=claim or "", created=rec.bins.get("c"))
    leased = lease_of(backend, session, list_name, token) if rec.bins.get("state") == "queued" else None
    if leased is None or (claim is not None and leased[0] != claim):
        # Another lease of the session than the one named is not acknowledged through
        # it: as a claim, the UDF finds the job not claimed under `claim` and refuses it.
        return job
    lid, fence = leased
    return dataclasses.replace(job, attempt=fence[0] + 1, rid=lid, lease=fence)


_TOO_LATE = ("too late to acknowledge: the reaper, `aeroqueue reap` or any worker's, ends the claim as timed out "
             "and retries the job, or marks it dead if it has no attempts left")


def _ran_out(server_ms: Any) -> str:
    """' ran out at <when> by the server's clock', or ' ran out' when the time is not known."""
    when = server_time(server_ms) if isinstance(server_ms, int) else None
    return f" ran out at {when} by the server's clock" if when else " ran out"


def _refusal(backend: Backend, job: Job, what: str) -> ClaimLost:
    """Why `session` cannot acknowledge the job, from the job record as it is now."""
    rec = backend.get(keys.JOB_SET, job.name)
    bins = rec.bins if rec is not None else {}
    state, holder, by = bins.get("state"), bins.get("sess"), bins.get("by")
    who = f"job {job.jid!r} ({job.list}/{job.token})"
    lessee = lease_holder(backend, job.list, job.token) if state == "queued" else None
    if job.rid and job.lease is None and job.session in (holder if state == "claimed" else None, lessee) \
            and not (state == "claimed" and bins.get("rid") == job.rid):
        # The session holds the job, but under a later reservation than the claim named
        # (the list dropped and loaded again, or the job back and reserved again): that
        # claim ended, and its acknowledgement must not be taken for the new one's.
        text = f"{who} is held by session {job.session} under another reservation, not claim {job.rid}"
        hint = "that claim ended: this acknowledgement is stale; the later reservation's holder acknowledges the job"
    elif state == "claimed" and holder == job.session:
        # Its own claim, refused: too late (the UDF's 'late'). Still claimed until a reaper ends it.
        tl = bins.get("tl")
        limit = f" ({tl / 1000:g} s)" if isinstance(tl, int) and tl > 0 else ""
        text, hint = f"{who}: the time limit{limit} of its claim by session {holder}{_ran_out(bins.get('dl'))}", _TOO_LATE
    elif state == "claimed":
        # Not the holder's id: it is all that `complete` and `fail` ask, so quoting it to
        # whoever gave another would let them acknowledge the job.
        text, hint = f"{who} is claimed by another session, not {job.session}", "only the holding session can acknowledge it"
    elif state == "done":
        text, hint = f"{who} is already done (completed by session {by})", "nothing to do: drop this result"
    elif state == "dead" and by == "operator":  # aq_job_v1.bury
        text, hint = f"{who} was buried by an operator ({bins.get('err')})", f"`aeroqueue job kick {job.list} {job.jid}` puts it back"
    elif state == "dead":
        text, hint = f"{who} is dead after {bins.get('att')} attempt(s)", f"`aeroqueue kick {job.list}` puts dead jobs back"
    elif state == "queued" and lessee is not None:
        if lessee == job.session and bins.get("kicked") is not None:
            # Buried and kicked while leased: the lease's fence refuses it (hotpath, `kicked`).
            text = f"{who} was kicked back into the queue after its lease by session {lessee} began"
            hint = "the lease no longer holds it: it runs again from the queue"
        elif lessee == job.session:
            # Its own lease, refused: past the lease's end (the job stays leased until a reaper ends it).
            until = job.lease[2] if job.lease is not None else None
            text, hint = f"{who}: the time limit of its lease by session {lessee}{_ran_out(until)}", _TOO_LATE
        else:
            text = f"{who} is leased by another session, not {job.session}"
            hint = "only the holding session can acknowledge it"
    elif state == "queued" and by is None and not bins.get("claimed"):
        text, hint = f"{who} was never reserved", "reserve it first: `aeroqueue reserve --hold SECONDS`"
    else:
        text = f"{who} is back in the queue: its last claim ended ({bins.get('err') or 'released'})"
        hint = "the claim was released (session expired, reaped or closed, or the job failed): another session will take it"
    err = ClaimLost(f"{what} refused: {text}")
    err.hint = hint
    return err


def _ack_json(job: Job, outcome: str) -> str:
    return json.dumps({"list": job.list, "token": job.token, "id": job.jid, "session": job.session, "outcome": outcome})


class _Token(click.IntRange):
    """A job's token: click's own "'c5' is not a valid integer range." said nothing of
    what TOKEN is, to a user who gave the job's id (what `job show` takes)."""

    def __init__(self) -> None:
        super().__init__(0)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a token: TOKEN is the job's number in its list, the \"token\" that "
                      "`aeroqueue reserve` printed for it (not its id)", param, ctx)
        return super().convert(value, param, ctx)


TOKEN_ARG = click.argument("token", type=_Token())


def _check_claim(claim: str | None) -> str | None:
    """A blank claim would check nothing (the store reads '' as any claim of the
    session): refused, so that a `jq` that found no "claim" does not pass silently."""
    if claim is not None and not claim.strip():
        raise ConfigError("the claim is empty: give the \"claim\" that `aeroqueue reserve` printed for the job, "
                          "or leave --claim out")
    return claim


CLAIM_OPT = option(
    "--claim", env="CLAIM", type=TEXT, default=None, callback=usage_check(_check_claim),
    help="The \"claim\" that `aeroqueue reserve` printed for the job: only that reservation's claim is acknowledged. "
         "Without it, any claim of the session is, even a later one of the same token (the job back and reserved "
         "again, or the list dropped and loaded again).")


@click.command()
@LIST_ARG
@TOKEN_ARG
@option("--session", env="SESSION", type=TEXT, required=True, help="The session the job was reserved under.")
@CLAIM_OPT
@option("--result", env="RESULT", type=TEXT, default="null", help="The result, as JSON.")
@JSON_OPT
@click.pass_obj
def complete(obj: Context, list_name: str, token: int, session: str, claim: str | None, result: str,
             as_json: bool) -> None:
    """Acknowledge job TOKEN of LIST as done (exactly once; repeating it is harmless).

    --json prints {"list", "token", "id", "session", "outcome": "done"}.
    """
    try:
        value = json.loads(result, object_pairs_hook=_keys_once)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e.msg}", param_hint="--result") from None
    except RecursionError:  # about 1,000 levels deep: Python's decoder gives up
        raise click.BadParameter("nested too deep (a result may nest 31 levels)", param_hint="--result") from None
    except ValueError:  # an integer past int()'s 4,300 digits: far outside 64 bits
        raise click.BadParameter("an integer is outside the 64-bit range a result may hold",
                                 param_hint="--result") from None
    # Python's json reads NaN, Infinity, 1e999 and integers of any size; stored, they
    # would make `job show --json` and `export` print invalid JSON and the sync refuse
    # the row. The worker's rule for handler results, so both store the same values.
    try:
        value = storable_result(value, "the result")
    except ResultNotStorable as e:
        raise click.BadParameter(str(e), param_hint="--result") from None
    backend = obj.backend()
    job = _held_job(backend, list_name, token, session, claim)
    try:
        Queue(backend).complete(job, value)
    except ClaimLost:
        raise _refusal(backend, job, "completion") from None
    click.echo(_ack_json(job, "done") if as_json else f"{list_name}/{token} (id {job.jid!r}) done")


def _keys_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of --result, whose keys must differ: JSON keeps the last of two values
    of a key without a word (as a load refuses a payload's)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        key = next(k for i, (k, _) in enumerate(pairs) if any(k == seen for seen, _ in pairs[:i]))
        raise click.BadParameter(f"key {key!r:.60} is given twice in one object (which value is meant?)",
                                 param_hint="--result")
    return obj


def _check_error(text: str) -> str:
    """A fail's error is the job's last error, what an operator reads later (`job show`,
    the dashboard): blank, it says nothing (a bury's reason is refused so too)."""
    if not text.strip():
        raise ConfigError("the error is empty: it is what the job's record keeps of this failure; say what went wrong")
    return text


# What `fail` says of each outcome of Queue.fail.
_FAILED = {"retry": "will be retried", "delayed": "will be retried after the list's backoff", "dead": "is dead"}


@click.command()
@LIST_ARG
@TOKEN_ARG
@option("--session", env="SESSION", type=TEXT, required=True, help="The session the job was reserved under.")
@CLAIM_OPT
@option("--error", "error_text", env="ERROR", type=TEXT, required=True, callback=usage_check(_check_error),
        help="What went wrong (not blank).")
@JSON_OPT
@click.pass_obj
def fail(obj: Context, list_name: str, token: int, session: str, claim: str | None, error_text: str,
         as_json: bool) -> None:
    """Record a failure of job TOKEN: retried while attempts remain (after the list's
    backoff, if it has one), else dead.

    --json prints {"list", "token", "id", "session", "outcome": "retry" | "delayed" | "dead"}.
    """
    backend = obj.backend()
    job = _held_job(backend, list_name, token, session, claim)
    try:
        outcome = Queue(backend).fail(job, error_text)
    except ClaimLost:
        raise _refusal(backend, job, "failure") from None
    if as_json:
        click.echo(_ack_json(job, outcome))
    else:
        click.echo(f"{list_name}/{token} (id {job.jid!r}) {_FAILED[outcome]}")
