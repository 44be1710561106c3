"""The `aeroqueue` command line: load job lists and operate the queue.

Every option can also be set from an environment variable, named in its help
(``AEROQUEUE_URL`` for ``--url``, ...). Errors print one line saying what went
wrong and what to do next; ``--verbose`` adds the traceback.

One module per group of commands; `context` holds what they share. Commands
are plain click commands added to `main` here, so no command module imports
another, and no library module imports the CLI.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from ..config import ENV_URL, default_store_path, resolve_url
from ..logs import default_command_logging
from . import (
    bench_cmd,
    job_cmd,
    jobs_cmd,
    lists_cmd,
    load_cmd,
    observe_cmd,
    store_cmd,
    udf_cmd,
    worker_cmd,
)
from .context import AeroqueueGroup, Context


@click.group(cls=AeroqueueGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option(
    "--url",
    envvar=ENV_URL,
    show_envvar=True,
    metavar="URL",
    help=(
        "Where the records live: aerospike://host:3000[,host2:3000]/namespace for a server or cluster, "
        "embedded:///path/store.db for the embedded store. "
        f"Default: the embedded store at {default_store_path()}."
    ),
)
@click.option("-v", "--verbose", is_flag=True, envvar="AEROQUEUE_VERBOSE", show_envvar=True, help="Show tracebacks on errors.")
@click.option(
    "--create", is_flag=True, envvar="AEROQUEUE_CREATE", show_envvar=True,
    help="Create the embedded store file if it does not exist (its directory must). Without it, a missing "
    "store named by --url or AEROQUEUE_URL is an error; the default store is always created on first use.",
)
@click.version_option(package_name="aeroqueue")
@click.pass_context
def main(ctx: click.Context, url: str | None, verbose: bool, create: bool) -> None:
    """aeroqueue: a job queue on Aerospike.

    Load job lists, reserve jobs in O(1), acknowledge each exactly once, and
    recover the jobs of workers that died. Exit status: 0 success, 1 error
    (one line on stderr), 2 wrong usage, 3 and 4 from `worker` (see its help),
    130 interrupted, 141 output cut short by its reader (`| head`), 143 a
    single `sync` or a `load` stopped by SIGTERM.
    """
    default_command_logging()
    if (url is not None and not url.strip() and ctx.get_parameter_source("url") is ParameterSource.ENVIRONMENT
            and not _asks_for_help(ctx)):
        # click passes a blank variable on as if typed (AEROQUEUE_URL=' '): said here,
        # as resolve_url says it, so that the error names the variable, not --url. Not
        # before a subcommand's --help (which click reads after this): help needs no store.
        resolve_url(None)
    ctx.obj = Context(url=url, verbose=verbose, create=create)
    ctx.call_on_close(lambda: ctx.obj._backend and ctx.obj._backend.close())


def _asks_for_help(ctx: click.Context) -> bool:
    """A help option among the command line's words (before a `--`)."""
    argv = list(AeroqueueGroup.argv)
    words = argv[: argv.index("--")] if "--" in argv else argv
    return any(w in ctx.help_option_names for w in words)


for _command in (
    store_cmd.init, store_cmd.show_config,
    udf_cmd.udf,
    lists_cmd.create, load_cmd.load, lists_cmd.tune, lists_cmd.seal, lists_cmd.pause, lists_cmd.status,
    lists_cmd.lists_cmd, lists_cmd.export, lists_cmd.kick, lists_cmd.drop, job_cmd.job,
    jobs_cmd.reserve, jobs_cmd.complete, jobs_cmd.fail,
    bench_cmd.bench,
    worker_cmd.worker, worker_cmd.reap, worker_cmd.sweep,
    observe_cmd.metrics, observe_cmd.dashboard,
):
    main.add_command(_command)


def _register_sync() -> None:
    # aeroqueue.sync loads neither pyspark nor the MySQL driver until a run starts.
    from . import sync_cmd

    main.add_command(sync_cmd.sync)
    main.add_command(sync_cmd.sync_bench)


_register_sync()

__all__ = ["Context", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
