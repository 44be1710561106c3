"""What every command shares: the store context, error handling, shared options.

No library module imports this package: the CLI is a thin layer over the
library (design.md's modules), and these helpers are its common ground.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .. import udfs
from ..backends import Backend, open_backend
from ..errors import AeroqueueError
from ..lists import DEFAULT_MAX_ATTEMPTS

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

err_console = Console(stderr=True)

@dataclass
class Context:
    url: str | None
    verbose: bool
    _backend: Backend | None = None

    def backend(self, *, check_udfs: bool = True) -> Backend:
        if self._backend is None:
            self._backend = open_backend(self.url)
            if check_udfs:
                udfs.ensure(self._backend)
        return self._backend


class AeroqueueGroup(click.Group):
    """Turns aeroqueue errors into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AeroqueueError as e:
            verbose = bool(ctx.obj and ctx.obj.verbose) or "--verbose" in sys.argv or "-v" in sys.argv
            if verbose:
                click.echo(traceback.format_exc(), err=True)
            # One line, never wrapped, so scripts and people can both read it.
            click.echo(f"error: {e}" + (f" ({e.hint})" if e.hint else ""), err=True)
            if not verbose:
                click.echo("(run with --verbose for the traceback)", err=True)
            ctx.exit(1)


def option(*decls: str, env: str, **kw: Any) -> Callable[[F], F]:
    """A click option that also reads AEROQUEUE_<env>, named in its help."""
    return click.option(*decls, envvar=f"AEROQUEUE_{env}", show_envvar=True, **kw)


LIST_ARG = click.argument("list_name", metavar="LIST")
MODE_OPT = option(
    "--mode", env="MODE", type=click.Choice(["tokens", "ids"]), default="tokens",
    help="tokens: sequential token store; ids: list-pop ID store (chunked).",
)
MAX_ATT_OPT = option("--max-attempts", env="MAX_ATTEMPTS", type=click.IntRange(1), default=DEFAULT_MAX_ATTEMPTS, help="Failures before a job goes dead.")
JSON_OPT = option("--json", "as_json", env="JSON", is_flag=True, help="Print JSON instead of a table.")


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=err_console, transient=False,
    )


def advance(progress: Progress, task: Any, items: Iterable[T]) -> Iterator[T]:
    for i, item in enumerate(items, start=1):
        if i % 1000 == 0:
            progress.update(task, completed=i)
        yield item


HEARTBEAT_OPT = option("--heartbeat", "interval_s", env="HEARTBEAT", type=click.FloatRange(min=0.01), default=1.0, help="Seconds between heartbeats.")
EXPIRY_OPT = option("--expiry", "expiry_s", env="EXPIRY", type=click.FloatRange(min=0.05), default=5.0, help="Seconds without a heartbeat after which a session is dead (more than twice --heartbeat).")

