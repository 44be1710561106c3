"""What every command shares: the store context, error handling, shared options.

No library module imports this package: the CLI is a thin layer over the
library (design.md's modules), and these helpers are its common ground.
"""

from __future__ import annotations

import datetime as dt
import errno
import io
import os
import select
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from .. import udfs
from ..backends import Backend, open_backend
from ..config import (
    ENV_URL,
    MAX_ATTEMPTS,
    MAX_SECONDS,
    PLAIN_NUMBER,
    mask_passwords,
    mask_url,
    may_create,
    plain_number,
)
from ..errors import AeroqueueError, ConfigError, Interrupted, ListNotFound, Terminated
from ..keys import check_list_name, check_text
from ..lists import DEFAULT_MAX_ATTEMPTS, JobLists, new_list_policy
from ..logs import visible
from ..sessions import check_timing

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

err_console = Console(stderr=True)

# Exit statuses of every command (README: "Exit statuses"). The worker adds its
# own (aeroqueue.worker: 3 session lost, 4 every handler thread died).
EXIT_OK = 0
EXIT_ERROR = 1  # what went wrong is one line on stderr
EXIT_USAGE = 2  # a wrong option or argument
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
EXIT_PIPE = 141  # whoever read the output stopped (`| head`), as shells report SIGPIPE
EXIT_TERMINATED = 143  # a command that handles SIGTERM stopped short by it, as shells report it

_VERBOSE = "aeroqueue.verbose"


@dataclass
class Context:
    url: str | None
    verbose: bool
    _backend: Backend | None = None
    create: bool = False  # --create: an embedded store file that does not exist yet is made

    def __repr__(self) -> str:
        # Not the dataclass's own: it showed the URL as given, password and all.
        url = None if self.url is None else mask_url(self.url)
        return f"Context(url={url!r}, verbose={self.verbose!r}, create={self.create!r})"

    def backend(self, *, check_udfs: bool = True, create: bool = False) -> Backend:
        if self._backend is None:
            # The default store, or AEROQUEUE_CREATE: config.may_create, as for connect().
            backend = open_backend(self.url, create=create or self.create or may_create(self.url))
            if check_udfs:
                try:
                    udfs.ensure(backend)
                except BaseException:
                    # Not kept: a caller that asks again (the metrics exporter, at its
                    # next scrape) gets the check again, not a store it refused.
                    backend.close()
                    raise
            self._backend = backend
        return self._backend



def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        # meta is shared by the whole chain of contexts: the group sees it.
        ctx.meta[_VERBOSE] = True


def verbose_requested(ctx: click.Context) -> bool:
    """--verbose was given, before or after the subcommand (or AEROQUEUE_VERBOSE)."""
    return bool(ctx.meta.get(_VERBOSE) or (ctx.obj and ctx.obj.verbose))


def verbose_option() -> click.Option:
    """--verbose, for every command, so that it works before or after the subcommand."""
    return click.Option(
        ["-v", "--verbose"], is_flag=True, expose_value=False, is_eager=True, callback=_set_verbose,
        envvar="AEROQUEUE_VERBOSE", show_envvar=True, help="Show tracebacks on errors.",
    )


_URL_GIVEN = "aeroqueue.url_after_command"


def _on_command_line(ctx: click.Context, param: click.Parameter) -> bool:
    # The group read the environment variable already: here only a value typed after
    # the command counts, or the variable would override the group's --url.
    return param.name is not None and ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE


def _store_context(ctx: click.Context) -> Context:
    obj = ctx.find_object(Context)
    assert obj is not None, "the aeroqueue group makes the Context before its commands parse"
    return obj


def _set_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # The group's callback made the Context before any subcommand parses its options.
    if value is not None and _on_command_line(ctx, param):
        ctx.meta[_URL_GIVEN] = True
        _store_context(ctx).url = value


def _set_create(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and _on_command_line(ctx, param):
        _store_context(ctx).create = True


def url_given_after_command(ctx: click.Context) -> bool:
    """--url came after the subcommand (it wins over the group's --url and AEROQUEUE_URL)."""
    return bool(ctx.meta.get(_URL_GIVEN))


def _store_options() -> list[click.Option]:
    """--url and --create on every command too, so that `aeroqueue udf register --url
    URL` works as well as `aeroqueue --url URL udf register`."""
    return [
        click.Option(
            ["--url"], metavar="URL", expose_value=False, is_eager=True, callback=_set_url,
            envvar=ENV_URL, show_envvar=True,
            help="Where the records live, as `aeroqueue --url` (which see); given here, it wins.",
        ),
        click.Option(
            ["--create"], is_flag=True, expose_value=False, is_eager=True, callback=_set_create,
            envvar="AEROQUEUE_CREATE", show_envvar=True,
            help="As `aeroqueue --create`: create the embedded store file if it does not exist.",
        ),
    ]


def _with_shared_options(cmd: click.Command) -> None:
    """The group's options on `cmd` and every command below it, wherever `cmd` does
    not have an option of that name itself."""
    taken = {opt for p in cmd.params if isinstance(p, click.Option) for opt in p.opts}
    for option in (verbose_option(), *_store_options()):
        if not taken.intersection(option.opts):
            cmd.params.append(option)
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _with_shared_options(sub)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _say_error(text: str, argv: Sequence[str] = ()) -> None:
    """An error line (or traceback) on stderr, any user:password@ in it masked: click's
    usage errors quote the value they refused, which is a store or MySQL URL when one
    lands in the wrong place (`aeroqueue sync mysql://u:pw@h/db`, --mysql forgotten).
    Each argument quoted whole is masked as one URL (`mask_url`), so that a password
    holding a blank, which the pattern of `mask_passwords` stops at, goes whole too;
    and as a path would show it: a URL given where a file goes (`load L mysql://...`)
    is quoted with its `//` made one (click's Path)."""
    for arg in argv:
        # --every=URL: click quotes the value.
        for value in {arg, arg.partition("=")[2], str(PurePath(arg)) if arg else ""}:
            if value and (shown := mask_url(value)) != value:
                text = text.replace(value, shown)
    # A job's id or error quoted in it is the customer's text: no terminal controls.
    click.echo(visible(mask_passwords(text), keep="\n"), err=True, nl=False)


def _stdout_fd() -> int | None:
    """Standard output's file descriptor; None when it is not a real file (a test runner's)."""
    try:
        return sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _stdout_closed() -> bool:
    """Whoever read standard output has closed it (the pipe's reader end is gone)."""
    fd = _stdout_fd()
    if fd is None:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _quiet_stdout() -> None:
    """The reader of our output went away (`aeroqueue export L | head`): what is left
    to print goes nowhere, not into an error at exit when Python flushes stdout."""
    fd = _stdout_fd()
    if fd is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class _ClosedStdout(io.TextIOBase):
    """Standard output when the process started with it closed (`aeroqueue status --json
    >&-`): Python sets sys.stdout to None and click.echo then prints nothing, so a
    command whose output is its result exited 0 with the result lost. A write fails
    here instead, as GNU tools' do: one error line, exit 1."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed: what this command prints has nowhere to go")


# click 8.2+ raises this (a UsageError whose message is the help) for a group given
# no command; older click prints the help and exits itself.
_NoArgsIsHelp: tuple[type[click.UsageError], ...] = tuple(
    c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c is not None
)


class AeroqueueGroup(click.Group):
    """Every error is one line on stderr: 1 for errors, 2 for usage errors, 130 on
    Ctrl-C, 143 for a SIGTERM that cut a command short (`Terminated`); the traceback only with --verbose (given anywhere on the line). Output
    cut short by its reader (`| head`) is not an error: nothing is said, status 141."""

    argv: Sequence[str] = ()  # the command line `main` was given (the process's: one at a time)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _with_shared_options(cmd)
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError as e:
            if not _stdout_closed():
                self._fail(ctx, e)  # another pipe (a socket, a handler process's): an error
            _quiet_stdout()
            ctx.exit(EXIT_PIPE)
        except Exception as e:
            self._fail(ctx, e)

    def _fail(self, ctx: click.Context, e: Exception) -> NoReturn:
        """One line on stderr for `e` (the traceback first with --verbose), exit 1."""
        verbose = bool(ctx.meta.get(_VERBOSE) or (ctx.obj and ctx.obj.verbose))
        if verbose:
            _say_error(traceback.format_exc())
        if isinstance(e, ListNotFound) and isinstance(ctx.obj, Context) and ctx.obj._backend is not None:
            # Which store was looked in: an unset AEROQUEUE_URL reads the default store,
            # and a list missing there looked like lost data.
            hint = f"looked in {ctx.obj._backend.url}" + (f"; {e.hint}" if e.hint else "")
            line = f"error: {e} ({hint})"
        elif isinstance(e, AeroqueueError):
            line = f"error: {e}" + (f" ({e.hint})" if e.hint else "")
        elif isinstance(e, OSError):
            line = f"error: {e}"
        else:
            line = f"error: internal error, {type(e).__name__}: {e}" + (
                "" if verbose else " (run with --verbose for the traceback, and please report it)"
            )
        # One line, never wrapped, so scripts and people can both read it. The message may
        # quote an argument (a URL given where a file goes): masked as usage errors are.
        _say_error(_one_line(line) + "\n", AeroqueueGroup.argv)
        ctx.exit(EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED if isinstance(e, Interrupted)
                 else EXIT_ERROR)

    def main(
        self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
        standalone_mode: bool = True, **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = list(args) if args is not None else sys.argv[1:]
        AeroqueueGroup.argv = argv  # for `_fail`, which a subgroup's invoke may call
        if sys.stdout is None:
            sys.stdout = _ClosedStdout()
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except _NoArgsIsHelp as e:
            # `aeroqueue` or `aeroqueue job` alone: click answers with the help, as
            # help (not flattened into one "error:" line), and wrong usage's status.
            click.echo(e.format_message(), err=True)
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            _say_error(_one_line(f"error: {e.format_message()}{where}") + "\n", argv)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            _say_error(_one_line(f"error: {e.format_message()}") + "\n", argv)
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(rv if isinstance(rv, int) else EXIT_OK)


def option(*decls: str, env: str, **kw: Any) -> Callable[[F], F]:
    """A click option that also reads AEROQUEUE_<env>, named in its help."""
    return click.option(*decls, envvar=f"AEROQUEUE_{env}", show_envvar=True, **kw)


class _Seconds(click.FloatRange):
    """Seconds from `min` to ten years (config.MAX_SECONDS): click's own range check,
    which lets NaN through (every comparison with it is false), and inf too without a
    maximum; both end in an internal error further down, not a usage error here."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        # Not float() alone: it reads '1_000', ' 12 ', Arabic-Indic digits, 'nan' and 'inf'.
        if isinstance(value, str) and plain_number(value) is None:
            self.fail(f"{value!r} is not a number ({PLAIN_NUMBER})", param, ctx)
        rv = super().convert(value, param, ctx)
        if rv != rv:
            self.fail(f"{value!r} is not a number", param, ctx)
        return rv


def seconds(min: float = 0, *, min_open: bool = False) -> click.FloatRange:
    """A click type for a duration option: seconds from `min` up to ten years."""
    return _Seconds(min=min, min_open=min_open, max=MAX_SECONDS)


class _Text(click.ParamType):
    """Text that goes into the store (a job id, a session, an error): valid UTF-8, or
    wrong usage. Bytes of another encoding reach click as lone surrogates, which the
    aerospike client crashes on as a record's name (`keys.check_text`)."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            try:
                check_text(value, "")
            except AeroqueueError as e:
                self.fail(str(e).lstrip(), param, ctx)
        return value


TEXT = _Text()


def usage_check(check: Callable[[str], object]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback running `check` on the value (on each, for a repeated option):
    its error is wrong usage (exit 2), said before the store is opened or anything
    served, for a value that could never work (a name no list can have)."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        for one in value if isinstance(value, tuple) else (value,):
            try:
                check(one)
            except AeroqueueError as e:
                raise click.BadParameter(str(e), ctx=ctx, param=param) from None
        return value

    return callback


def bad_parameter(ctx: click.Context, name: str, e: AeroqueueError) -> click.BadParameter:
    """`e`, found in a command's body rather than by a callback (it needs the value
    used: a handler imported), as the usage error of its parameter `name`: status 2,
    naming the option and its variable, as a callback's; with --verbose, the
    traceback first, as for any error."""
    if verbose_requested(ctx):
        _say_error(traceback.format_exc(), AeroqueueGroup.argv)
    param = next(p for p in ctx.command.params if p.name == name)
    return click.BadParameter(str(e), ctx=ctx, param=param)


def check_bind_host(host: str) -> str:
    """A bind address given empty (an unset variable in a unit file, say) would bind
    every address of the machine, for a page that asks for no login: refused, and
    told how to ask for that on purpose."""
    if not host.strip():
        raise ConfigError("the address to bind is empty: give 127.0.0.1 (this machine only), or 0.0.0.0 or :: "
                          "for every address")
    return host


LIST_ARG = click.argument("list_name", metavar="LIST", callback=usage_check(check_list_name))
MODE_OPT = option(
    "--mode", env="MODE", type=click.Choice(["tokens", "ids"]), default=None,
    help="tokens: sequential token store; ids: list-pop ID store (chunked). A new list: tokens; an existing "
         "list keeps its own, and another mode given is an error.",
)
MAX_ATT_OPT = option("--max-attempts", env="MAX_ATTEMPTS", type=click.IntRange(1, MAX_ATTEMPTS), default=DEFAULT_MAX_ATTEMPTS, help="Failures before a job goes dead.")
JSON_OPT = option("--json", "as_json", env="JSON", is_flag=True, help="Print JSON instead of a table.")
_SECONDS = seconds(0, min_open=True)
TIMEOUT_OPT = option(
    "--timeout", "timeout_s", env="TIMEOUT", type=_SECONDS, default=None, metavar="SECONDS", show_default=False,
    help="The job time limit: a claim not acknowledged within it is retried as timed out (new lists: 300; "
         "a handler extends its own with job.touch()).",
)
BACKOFF_OPT = option(
    "--backoff", "backoff_s", env="BACKOFF", type=seconds(0), default=None, metavar="SECONDS",
    show_default=False,
    help="Backoff base: a failed attempt n waits between half and all of SECONDS*2^(n-1) (new lists: 1; 0: none).",
)
BACKOFF_MAX_OPT = option(
    "--backoff-max", "backoff_max_s", env="BACKOFF_MAX", type=seconds(0), default=None,
    metavar="SECONDS", show_default=False, help="The backoff's cap (new lists: 3600).",
)


def server_time(ms: int | None) -> str | None:
    """Server ms as ISO 8601 UTC (what an operator compares with logs)."""
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


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


HEARTBEAT_OPT = option("--heartbeat", "interval_s", env="HEARTBEAT", type=seconds(0.01), default=1.0, help="Seconds between heartbeats.")
EXPIRY_OPT = option("--expiry", "expiry_s", env="EXPIRY", type=seconds(0.05), default=5.0, help="Seconds without a heartbeat after which a session is dead (more than twice --heartbeat).")


def check_session_timing(interval_s: float, expiry_s: float) -> None:
    """--heartbeat and --expiry that do not fit together: a usage error (exit 2),
    naming where each value came from (an option, or its environment variable)."""
    try:
        check_timing(interval_s, expiry_s)
    except AeroqueueError as e:
        said = " and ".join(_given_as(name, flag, env) for name, flag, env in
                            (("expiry_s", "--expiry", "EXPIRY"), ("interval_s", "--heartbeat", "HEARTBEAT")))
        raise click.UsageError(f"{said}: {e}") from None


def _given_as(name: str, flag: str, env: str) -> str:
    """The option as the user gave it: a value read from its variable is named so."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return f"{flag} (AEROQUEUE_{env})" if source is click.core.ParameterSource.ENVIRONMENT else flag


# Options that set up a new list; an existing list keeps what it has.
_NEW_LIST_ONLY = {"max_attempts": "--max-attempts", "timeout_s": "--timeout", "backoff_s": "--backoff",
                  "backoff_max_s": "--backoff-max"}


def check_new_list_policy(
    lists: JobLists, name: str, max_attempts: int, timeout_s: float | None, backoff_s: float | None,
    backoff_max_s: float | None,
) -> None:
    """A new list's options, as wrong usage (exit 2) before anything is read or written:
    a load refused them only once its whole file had been checked, minutes into a large
    load. An existing list keeps its own policy: they are checked only as given."""
    try:
        lists.header(name)
        new = False
    except ListNotFound:
        new = True
    try:
        new_list_policy(max_attempts=max_attempts, timeout_s=timeout_s, backoff_s=backoff_s,
                        backoff_max_s=backoff_max_s, new=new)
    except ConfigError as e:
        raise click.UsageError(str(e)) from None


def note_new_list_options(lists: JobLists, name: str, *, exists: bool | None = None) -> None:
    """Say so when options that only set up a new list were given for an existing one
    (`exists`; None: look it up): the command goes on (a load, a create that finds
    the list), and they would otherwise be dropped without a word."""
    ctx = click.get_current_context()
    given = [opt for param, opt in _NEW_LIST_ONLY.items()
             if ctx.get_parameter_source(param) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)]
    if not given:
        return
    if exists is None:
        try:
            lists.header(name)
        except ListNotFound:
            return
    elif not exists:
        return
    err_console.print(f"note: {name} exists, so {', '.join(given)} change nothing (they set up a new list; "
                      f"`aeroqueue tune {name}` changes a list's time limit and backoff)", highlight=False)
