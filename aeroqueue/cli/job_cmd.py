"""One job by its own id (the id in the loaded file): show, kick, bury."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..lists import JobLists, check_bury_reason
from ..logs import visible
from ..sessions import lease_holder
from .context import JSON_OPT, LIST_ARG, TEXT, Context, option, server_time, usage_check

JOB_ID_ARG = click.argument("job_id", metavar="ID", type=TEXT)
# What `job show` prints of a record, in this order (JSON keys; the table says them in words).
SHOWN = ("id", "state", "attempts", "max_attempts", "session", "leased_by", "time_limit_s", "claimed_at", "deadline", "due",
         "swept_at", "done_at", "by", "token", "payload", "result", "errors")


def job_view(bins: dict[str, Any], leased_by: str | None = None) -> dict[str, Any]:
    """The documented shape of `job show --json`. `leased_by`: the session whose lease
    holds the job (a worker's batch), which its record does not name: it stays queued."""
    state = bins.get("state")
    claimed = state == "claimed"
    return {
        "id": bins.get("jid"),
        "state": state,
        "attempts": bins.get("att", 0),
        "max_attempts": bins.get("max_att"),
        "session": bins.get("sess") if claimed else None,
        "leased_by": leased_by if state == "queued" else None,
        "time_limit_s": bins["tl"] / 1000 if claimed and bins.get("tl") else None,
        "claimed_at": server_time(bins.get("claimed")),
        "deadline": server_time(bins.get("dl")) if claimed else None,
        "due": server_time(bins.get("due")) if state == "delayed" else None,
        # When a sweeper last offered it again: its reserver died, or its schedule slipped.
        "swept_at": server_time(bins.get("swept")),
        "done_at": server_time(bins.get("done_at")),
        "by": bins.get("by"),
        "token": bins.get("token"),
        "payload": bins.get("payload"),
        "result": bins.get("result"),
        "errors": [{"at": server_time(e.get("at")), "error": e.get("err")} for e in bins.get("errs") or []],
    }


@click.group("job")
def job() -> None:
    """One job, by the id it was loaded with: show, kick, bury."""


@job.command()
@LIST_ARG
@JOB_ID_ARG
@JSON_OPT
@click.pass_obj
def show(obj: Context, list_name: str, job_id: str, as_json: bool) -> None:
    """Print one job of LIST: its state (queued, delayed, claimed, done, dead), attempts,
    session, time limit, timestamps and its last errors, each with time, message and
    traceback."""
    backend = obj.backend()
    bins = JobLists(backend).find_job(list_name, job_id)
    # A queued job a worker leased shows no session of its own: it may be running.
    leased = lease_holder(backend, list_name, bins["token"], bins) if bins.get("state") == "queued" else None
    view = job_view(bins, leased)
    if as_json:
        click.echo(json.dumps(view, default=str))
        return
    # Text, not markup: a job id or payload such as "[/]" or "[link=...]" is shown as
    # it is stored (as markup it raised MarkupError, or vanished into styles); its
    # terminal controls as escapes (`visible`): the id and the errors are the
    # customer's and the handler's text.
    table = Table(title=Text(visible(f"{list_name} / {job_id}")), show_header=False)
    table.add_column("")
    table.add_column("")
    for key in SHOWN[:-1]:
        value = view[key]
        if value is not None:
            table.add_row(key.replace("_", " "),
                          Text(visible(value) if isinstance(value, str) else json.dumps(value, default=str)))
    console = Console()
    console.print(table)
    errors = view["errors"]
    console.print(f"errors: {len(errors)}" + (" (the last ones, oldest first)" if errors else ""), highlight=False)
    for e in errors:
        console.print(f"--- {e['at']}", style="bold", highlight=False)
        console.print(visible(str(e["error"]), keep="\n\t"), highlight=False, markup=False)


@job.command()
@LIST_ARG
@JOB_ID_ARG
@click.pass_obj
def kick(obj: Context, list_name: str, job_id: str) -> None:
    """Put one dead or delayed job of LIST back in the queue now (a dead one with fresh
    attempts); a complete list becomes incomplete again."""
    jl = JobLists(obj.backend())
    if not jl.kick_job(list_name, job_id):
        state = jl.find_job(list_name, job_id).get("state")
        raise click.ClickException(f"job {job_id!r} of {list_name!r} is {state}: only a dead or delayed job is kicked")
    click.echo(visible(f"{list_name}/{job_id}: queued"))


@job.command()
@LIST_ARG
@JOB_ID_ARG
@option("--reason", env="BURY_REASON", type=TEXT, default="buried by an operator", callback=usage_check(check_bury_reason),
        help="Recorded in the job's error history (not blank).")
@click.pass_obj
def bury(obj: Context, list_name: str, job_id: str, reason: str) -> None:
    """Send one job of LIST to dead by hand (queued, delayed or claimed: a worker holding
    it has its acknowledgement refused). A done job is left alone."""
    backend = obj.backend()
    jl = JobLists(backend)
    bins = jl.find_job(list_name, job_id)
    token = bins.get("token")
    leased = lease_holder(backend, list_name, token, bins) if isinstance(token, int) else None
    state = jl.bury(list_name, job_id, reason)
    if state != "dead":
        raise click.ClickException(f"job {job_id!r} of {list_name!r} is {state}: not buried")
    click.echo(visible(f"{list_name}/{job_id}: dead") + (
        f" (leased by session {leased}: its worker may be running it still; its acknowledgement is refused)"
        if leased else ""))
