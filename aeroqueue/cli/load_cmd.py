"""`aeroqueue load`: a CSV or JSON Lines file (or standard input) into a job list."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ..errors import BackendError, InputChanged, Interrupted, LoadError, Terminated
from ..lists import DEFAULT_CHUNK, JobLists, LoadReport, max_payload
from ..load import EMBEDDED_CHUNK
from ..loading import STDIN, Checked, read_file, sniff_format, spooled_stdin, validate
from .context import (
    BACKOFF_MAX_OPT,
    BACKOFF_OPT,
    JSON_OPT,
    LIST_ARG,
    MAX_ATT_OPT,
    MODE_OPT,
    TIMEOUT_OPT,
    Context,
    check_new_list_policy,
    err_console,
    note_new_list_options,
    option,
    seconds,
)


class RateColumn(ProgressColumn):
    """Rows per second, as rich measures it over the last seconds."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} rows/s" if speed else "", style="progress.data.speed")


def _few_malloc_arenas() -> None:
    """glibc gives each thread that allocates under contention its own malloc arena (up
    to 8 per core), and each keeps what was freed in it: with 8 writer threads that was
    about 55 MB of the loader's 150 MB peak RSS for 1,000,000 rows. Two arenas are
    enough for threads that mostly wait on the network. (Process-wide, so the CLI
    decides it, not the library.)"""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), RateColumn(), TimeElapsedColumn(),
        console=err_console, transient=False, disable=not enabled,
    )


def _reads_once(file: Path) -> bool:
    """The input can be read only once: a FIFO, a pipe or socket passed as /dev/fd/N, or
    a terminal (/dev/stdin not redirected, /dev/pts/N). Read twice, a terminal took the
    jobs typed for the check, then waited for more to write: what it loaded was never
    checked (other character devices, /dev/null, read the same each time)."""
    try:
        mode = file.stat().st_mode
    except OSError:
        return False  # read_file says what is wrong with it
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and _is_terminal(file))


def _is_terminal(file: Path) -> bool:
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return False  # read_file says what is wrong with it
    try:
        return os.isatty(fd)
    finally:
        os.close(fd)


def _say_terminal() -> None:
    """Jobs are read from a terminal until Ctrl-D: said, or the load looks hung (a
    FILE forgotten, `-` typed for one)."""
    err_console.print("reading jobs from the terminal until Ctrl-D (end of input); Ctrl-C gives up",
                      highlight=False)


def _format_of(file: Path) -> str | None:
    """The format its name tells (jobs.csv as a named pipe), else None: sniffed."""
    suffix = file.suffix.lower()
    return "csv" if suffix == ".csv" else "jsonl" if suffix in (".jsonl", ".ndjson", ".json") else None


def _unnamed(file: Path) -> bool:
    """Standard input or another descriptor by a path of its own (/dev/stdin, /dev/fd/N)."""
    text = str(file)
    return text in ("/dev/stdin", "/proc/self/fd/0") or text.startswith(("/dev/fd/", "/proc/self/fd/"))


def _open_input(file: Path, source: str) -> Any:
    try:
        return file.open("rb")
    except OSError as e:
        raise LoadError(f"cannot read the file: {e.strerror or e}", source=source) from None


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is written: its size, modification time and inode."""
    try:
        st = path.stat()
    except OSError:
        return None  # read_file says what is wrong with it
    return st.st_size, st.st_mtime_ns, st.st_ino


def _as_checked(rows: Iterable[Any], n: int, path: Path, before: Any, source: str) -> Iterator[Any]:
    """The write pass's rows, which must be the `n` the check read: a file changed
    since (cut short, edited in place, replaced) raises `InputChanged`, after the rows
    before it were loaded, rather than load a part of it as if whole (and seal the
    list without the rest), or report a line it finds malformed as if nothing was
    loaded. Raised from the input, it stops the load before any seal."""
    count = 0
    try:
        for row in rows:
            count += 1
            yield row
    except InputChanged:
        raise
    except LoadError as e:
        raise InputChanged(f"the file changed while it was loaded: {e.reason}", source=e.source, line=e.line,
                           field=e.field) from None
    if count != n or _identity(path) != before:
        raise InputChanged(
            f"the file changed while it was loaded (is it still being written?): {count:,} of the {n:,} rows "
            f"checked were read again", source=source)


class _StopAsked(BaseException):
    """SIGTERM or SIGINT, out of the signal handler: a BaseException, as KeyboardInterrupt
    is, so that no `except Exception` on the way takes it for an error it can handle."""


class _StopGuard:
    """SIGTERM or Ctrl-C (SIGINT) during a load. While the input is read and checked
    nothing is written yet: the handler raises at once. While jobs are written it only
    assigns (a handler may not take a lock: aeroqueue.stopping), and `rows` raises
    between two rows: no range is started after it, those in flight finish
    (`load._run_concurrently`), so the list holds whole ranges, none pending on a lease,
    and the same load run again finishes it at once. (A KeyboardInterrupt in the middle
    of a range left it pending on its lease: the next load waited the lease out, and
    behind many such ranges each list call grew slower.) A second Ctrl-C stops it at
    once, as Python's would: the first waits for what is under way, which a locked
    store can make long. Once every job is written, the first ends the load's wait for
    another loader's range (`JobLists.load`'s `stop`)."""

    def __init__(self) -> None:
        self.writing = False
        self.asked: int | None = None  # the signal that asked for the stop
        self.total: int | None = None  # jobs in the input, once checked

    def on_signal(self, signum: int, frame: Any = None) -> None:
        if self.asked is not None:
            if signum == signal.SIGINT:
                # A second Ctrl-C: now, as Python would, whatever is under way (a write
                # waiting on a locked store). The range being written stays on its lease
                # for the next load to finish.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            return  # a second SIGTERM: the stop is under way
        self.asked = signum
        if not self.writing:
            raise _StopAsked()

    def rows(self, rows: Iterable[Any]) -> Iterator[Any]:
        for row in rows:
            if self.asked is not None:
                raise _StopAsked()
            yield row

    def stopped(self, what: str) -> Interrupted | Terminated:
        """The error of a load the signal asked stopped: "load stopped by ... `what`",
        exit 130 for Ctrl-C, 143 for SIGTERM."""
        ctrl_c = self.asked == signal.SIGINT
        return (Interrupted if ctrl_c else Terminated)(f"load stopped by {'Ctrl-C' if ctrl_c else 'SIGTERM'} {what}")


@contextlib.contextmanager
def _stops_handled(guard: _StopGuard) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can handle a signal (CliRunner in a thread)
        return
    handled = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        handled.append(signal.SIGINT)  # not when started with SIGINT ignored (`... &` in a script)
    previous = {signum: signal.signal(signum, guard.on_signal) for signum in handled}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@click.command()
@LIST_ARG
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@option("--format", "fmt", env="FORMAT", type=click.Choice(["csv", "jsonl"]), default=None,
        help="Input format (default: from the extension; for standard input, JSON Lines if it starts with '{').")
@option("--id-field", env="ID_FIELD", default="id", help="The column (CSV) or field (JSON Lines) holding the job id.")
@option("--strict", env="STRICT", is_flag=True,
        help="With a 'payload' column (field): refuse the others beside the id instead of merging them into "
             "the payload. Without one, the other columns (fields) are the payload, strict or not.")
@MODE_OPT
@MAX_ATT_OPT
@TIMEOUT_OPT
@BACKOFF_OPT
@BACKOFF_MAX_OPT
@option("--delay", "delay_s", env="DELAY", type=seconds(0), default=0.0, metavar="SECONDS",
        help="Hold these jobs back for SECONDS (by the server's clock); a row's own run_at field (ISO 8601 with a "
             "zone, or epoch seconds) holds it until then.")
@option("--seal", env="SEAL", is_flag=True, help="Mark the list complete for loading afterwards.")
@option("--chunk-size", env="CHUNK_SIZE", type=click.IntRange(1, 50_000), default=None,
        help=f"Jobs per load range (and per ID-store chunk record; default: {DEFAULT_CHUNK:,} on a server, "
             f"{EMBEDDED_CHUNK:,} on the embedded store in token mode).")
@option("--workers", env="LOAD_WORKERS", type=click.IntRange(1, 64), default=None,
        help="Load ranges written at once (default: 8 on a server, 1 on the embedded store).")
@JSON_OPT
@click.pass_obj
def load(
    obj: Context, list_name: str, file: Path, fmt: str | None, id_field: str, strict: bool, mode: str | None,
    max_attempts: int, timeout_s: float | None, backoff_s: float | None, backoff_max_s: float | None, delay_s: float,
    seal: bool, chunk_size: int | None, workers: int | None, as_json: bool,
) -> None:
    """Load jobs from a CSV or JSON Lines FILE ('-': standard input) into LIST.

    The whole input is checked first (every error names its line and field):
    a bad line loads nothing, and an empty input is an error. Then it is read
    again to write, so memory stays bounded whatever its size (a file that
    changed meanwhile stops the load, unsealed). Re-running the
    same load adds nothing twice (jobs are keyed by their id); re-running it
    on a list it sealed is a no-op. SIGTERM or Ctrl-C stops it between two load
    ranges (exit 143 or 130); the same load run again finishes it.
    """
    _few_malloc_arenas()
    guard = _StopGuard()
    written = voided = 0

    def wrote(report: LoadReport) -> None:
        # Jobs the list holds from this input: loaded now or before (skipped), not rows
        # left void (their id another row, or another loader, took): a file edited
        # into a duplicate id said "3,000 of 3,000" loaded where the list held 2,999.
        nonlocal written, voided
        written += report.loaded + report.skipped
        voided += report.voided

    def loaded() -> str:
        """What every error of a load cut short says it wrote: "N of M jobs"."""
        return (f"{written:,}" + (f" of {guard.total:,}" if guard.total is not None else "") + " jobs"
                + (f" ({voided:,} duplicate(s) left void)" if voided else ""))

    with _stops_handled(guard):
        try:
            _load(obj, list_name, file, fmt, id_field, strict, mode, max_attempts, timeout_s, backoff_s, backoff_max_s,
                  delay_s, seal, chunk_size, workers, as_json, guard, wrote)
        except InputChanged as e:
            raise InputChanged(
                f"{e.reason}; {loaded()} were loaded into {list_name} before it was noticed",
                source=e.source, line=e.line, field=e.field,
            ) from None
        except BackendError as e:
            # The store failed mid-load: what was written stays (reservable), as after a
            # stop, and the same load run again finishes it. Said, not left to guess; not
            # of a failure before the writing began (nothing written, nothing to finish).
            if guard.writing:
                # Jobs written: the list took new ones, so it was not sealed, and is not yet.
                said = (f"{loaded()} were loaded into {list_name} before it failed"
                        + (", and the list is not sealed" if seal else "")
                        + "; once the store answers, run the same load again to finish it (it adds nothing twice)"
                        if written else "once the store answers, run the same load again (it adds nothing twice)")
                e.hint = f"{said}; {e.hint}" if e.hint else said
            raise
        except _StopAsked:
            raise guard.stopped(
                f"before it finished: {loaded()} loaded into {list_name}"
                + (", and the list is not sealed" if seal else "")
                + "; run the same load again to finish it (it adds nothing twice)"
            ) from None


def _load(
    obj: Context, list_name: str, file: Path, fmt: str | None, id_field: str, strict: bool, mode: str | None,
    max_attempts: int, timeout_s: float | None, backoff_s: float | None, backoff_max_s: float | None, delay_s: float,
    seal: bool, chunk_size: int | None, workers: int | None, as_json: bool, guard: _StopGuard,
    wrote: Callable[[LoadReport], None],
) -> None:
    backend = obj.backend()
    check_new_list_policy(JobLists(backend), list_name, max_attempts, timeout_s, backoff_s, backoff_max_s)
    limit = max_payload(backend)
    with contextlib.ExitStack() as stack:
        if str(file) == STDIN:
            if sys.stdin is not None and sys.stdin.isatty():
                _say_terminal()
            path, source = stack.enter_context(spooled_stdin()), "<stdin>"
            fmt = fmt or sniff_format(path)
        elif _reads_once(file):
            # A named pipe, <(...) (/dev/fd/N) or a terminal reads once: spooled as
            # standard input is, or the write pass would find it empty (or block on the
            # open, or wait for the jobs to be typed again).
            source = str(file)
            fmt = fmt or _format_of(file)
            with _open_input(file, source) as stream:
                if stream.isatty():
                    _say_terminal()
                path = stack.enter_context(spooled_stdin(stream))
            fmt = fmt or sniff_format(path)
        else:
            path, source = file, str(file)
            if fmt is None and _format_of(file) is None and _unnamed(file):
                # /dev/stdin or /dev/fd/N redirected from a file: standard input by another
                # name, whose name tells no format ("cannot tell the format from the extension ''").
                fmt = sniff_format(path)

        def read() -> Any:
            return read_file(path, fmt=fmt, id_field=id_field, max_payload=limit, strict=strict, source=source)

        progress = stack.enter_context(_progress(err_console.is_terminal and not as_json))
        t0 = time.perf_counter()
        checking = progress.add_task("checking", total=None)
        before = _identity(path)
        n = validate(read, source, id_field, progress=lambda k: progress.update(checking, completed=k))
        if _identity(path) != before:
            raise LoadError("the file changed while it was checked (is it still being written?); run the load "
                            "again once it is complete", source=source)
        progress.update(checking, total=n, completed=n)
        guard.total = n
        if n == 0:
            raise LoadError("no jobs in the input, so no list was created", source=source)
        t1 = time.perf_counter()
        note_new_list_options(JobLists(backend), list_name)
        writing = progress.add_task(f"loading into {list_name}", total=n)
        guard.writing = True

        def advance(k: int) -> None:
            progress.advance(writing, k)

        # Only the rows the check saw: a line appended since (an exporter still writing
        # the file) would be loaded unchecked, or stop the load half-way.
        report = JobLists(backend).load(
            list_name, Checked(guard.rows(_as_checked(itertools.islice(read(), n), n, path, before, source))),
            mode=mode, seal=seal, chunk_size=chunk_size,
            max_attempts=max_attempts, workers=workers, progress=advance, timeout_s=timeout_s,
            backoff_s=backoff_s, backoff_max_s=backoff_max_s, delay_s=delay_s, stop=lambda: guard.asked is not None,
            on_range=wrote,
        )
        t2 = time.perf_counter()
    if as_json:
        click.echo(json.dumps({
            "list": list_name, "source": source, "jobs": n, "loaded": report.loaded, "skipped": report.skipped,
            "voided": report.voided, "waiting": report.waiting,
            "sealed": (seal and not report.seal_skipped) or report.already_sealed,
            "already_sealed": report.already_sealed,
            "check_s": round(t1 - t0, 3), "load_s": round(t2 - t1, 3),
            "jobs_per_s": round(n / (t2 - t0)) if t2 > t0 else None,
        }))
    elif report.already_sealed:
        click.echo(f"{list_name}: nothing to do: the list is sealed and already holds all {n:,} jobs of {source}")
    else:
        click.echo(
            f"{list_name}: {report.loaded} loaded, {report.skipped} already there"
            + (f", {report.voided} duplicate(s) left void" if report.voided else "")
            + (" (sealed)" if seal and not report.seal_skipped else "")
        )
    if report.waiting and guard.asked is not None:
        # Stopped while its jobs, all written, waited behind another loader's range.
        raise guard.stopped(
            f"while {report.waiting:,} of its jobs waited behind "
            f"a load range of another load into {list_name} (its loader may have died): every job is written"
            + ("; the list is not sealed: run the same load again to seal it" if report.seal_skipped else "")
            + "; once that range's lease runs out, a sweep or the same load run again finishes it"
        )
    if report.waiting:
        err_console.print(
            f"[yellow]note:[/] {report.waiting:,} of this load's jobs are written but wait for a load range of "
            f"another load into {list_name} (still running, or its lease not run out yet): they become reservable "
            "when that load publishes the range, or once its lease runs out, at a sweep or the same load run again"
        )
