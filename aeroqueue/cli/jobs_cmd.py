"""One job at a time from a shell: reserve, complete, fail."""

from __future__ import annotations

import json

import click

from ..queue import Job, Queue
from ..sessions import Session
from .context import (
    LIST_ARG,
    Context,
    option,
)


@click.command()
@LIST_ARG
@option("--count", "-n", env="COUNT", type=click.IntRange(1, 10_000), default=1, help="How many jobs to reserve.")
@option("--session", env="SESSION", default=None, help="Reserve under this session id (default: open a new session).")
@click.pass_obj
def reserve(obj: Context, list_name: str, count: int, session: str | None) -> None:
    """Reserve up to N jobs of LIST and print them as JSON lines.

    Each line carries the session id the claim is held under; acknowledge
    with `aeroqueue complete` or `aeroqueue fail`.
    """
    backend = obj.backend()
    sess = session or Session.open(backend).id
    for job in Queue(backend).reserve(list_name, sess, count):
        click.echo(json.dumps({"list": job.list, "token": job.token, "id": job.jid, "payload": job.payload,
                               "attempt": job.attempt, "session": job.session}))


def _job_from_args(obj: Context, list_name: str, token: int, session: str) -> Job:
    return Job(list=list_name, token=token, jid=str(token), payload=None, attempt=0, session=session)


@click.command()
@LIST_ARG
@click.argument("token", type=click.IntRange(0))
@option("--session", env="SESSION", required=True, help="The session the job was reserved under.")
@option("--result", env="RESULT", default="null", help="The result, as JSON.")
@click.pass_obj
def complete(obj: Context, list_name: str, token: int, session: str, result: str) -> None:
    """Acknowledge job TOKEN of LIST as done (exactly once)."""
    try:
        value = json.loads(result)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e.msg}", param_hint="--result") from None
    Queue(obj.backend()).complete(_job_from_args(obj, list_name, token, session), value)
    click.echo(f"{list_name}/{token} done")


@click.command()
@LIST_ARG
@click.argument("token", type=click.IntRange(0))
@option("--session", env="SESSION", required=True, help="The session the job was reserved under.")
@option("--error", "error_text", env="ERROR", required=True, help="What went wrong.")
@click.pass_obj
def fail(obj: Context, list_name: str, token: int, session: str, error_text: str) -> None:
    """Record a failure of job TOKEN: retried while attempts remain, else dead."""
    outcome = Queue(obj.backend()).fail(_job_from_args(obj, list_name, token, session), error_text)
    click.echo(f"{list_name}/{token} {'will be retried' if outcome == 'retry' else 'is dead'}")


