"""The Spark job: the driver's side of a run.

1. The target's schema is created or migrated (``sync/schema.sql``).
2. Spark tasks each take a range of Aerospike's 4096 partitions (`task`);
   only counts come back. Meanwhile the driver reads the tasks' progress
   records and hands rows copied per list to a callback (the progress bar).
3. The driver writes the list summaries and drops rejects since copied.

It runs unchanged in ``local[*]``, under ``spark-submit`` and on a
standalone or YARN cluster: tasks receive plain values only (the store URL,
the target) and open their own connections. Spark's own logging is kept to
errors unless asked for (`spark_session(verbose=True)`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import keys
from ..backends import Backend, open_backend
from ..errors import (
    AeroqueueError,
    BackendError,
    Interrupted,
    ListNotFound,
    SparkDriverLost,
    SyncError,
    Terminated,
)
from ..lists import JobLists
from .options import Counts, SyncOptions, SyncReport, ranges
from .schema import (
    JOBS_TABLE,
    REJECTS_TABLE,
    SUMMARY_COLUMNS,
    SUMMARY_TABLE,
    migrate,
    now_ms,
    target_id,
)
from .target import Target
from .task import progress_name, sync_ranges
from .write import Sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5
# Spark's JVM logging, errors only: given to a JVM this process starts.
_QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# The levels Spark compares the root's with before it says "Setting default log level"
# (the shell's logger, and the one PySpark's gateway logs as).
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.pygateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.pygateway.level = error
# A failed task is the run's failure, which the command says in one line (the task's
# own error: its target, the reason): not Spark's reports of it besides, each with the
# task's Python traceback inside a Java stack (a target gone mid-run printed dozens of
# lines). Their levels stay the root's; --verbose logs them (Spark's own configuration).
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.filter.task.type = RegexFilter
logger.executor.filter.task.regex = Exception in task .*
logger.executor.filter.task.onMatch = DENY
logger.executor.filter.task.onMismatch = NEUTRAL
logger.tasksets.name = org.apache.spark.scheduler.TaskSetManager
logger.tasksets.filter.abort.type = RegexFilter
logger.tasksets.filter.abort.regex = Task .* failed [0-9]+ times?; aborting job
logger.tasksets.filter.abort.onMatch = DENY
logger.tasksets.filter.abort.onMismatch = NEUTRAL
"""


def _quiet_log4j2() -> str:
    path = Path(tempfile.gettempdir()) / f"aeroqueue-spark-log4j2-{os.getuid()}.properties"
    if not path.is_file() or path.read_text() != _QUIET_LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_QUIET_LOG4J2)
        tmp.replace(path)
    return str(path)


_NO_PYSPARK = "PySpark is not installed: pip install 'aeroqueue[spark]' (and Java 17 for Spark)"


def require_pyspark() -> None:
    """Refuse at once (SyncError) where PySpark is not installed: before a run takes
    its lease, and before a schedule that starts Spark at its first run starts."""
    try:
        import pyspark  # noqa: F401  (what the run imports next)
    except ImportError:
        raise SyncError(_NO_PYSPARK) from None


def spark_session(
    master: str | None = None, app_name: str = "aeroqueue-sync", *, verbose: bool = False, sigint: Any = None
) -> tuple[SparkSession, bool]:
    """The active SparkSession, or a new one; and whether this call created it.

    With no master: the one spark-submit was given, else ``local[*]``. In
    local mode the Python workers run this interpreter, so they import the
    same aeroqueue and its dependencies. Unless `verbose`, Spark logs errors
    only (for a JVM started here, from its first line on). A JVM started here
    ignores SIGTERM, and is killed if interrupted before it answered
    (`_jvm_launched_for_this_driver`). `sigint`: the SIGINT handler (or SIG_IGN) a
    context started here installs in place of PySpark's own (`_sigint_from_the_start`).
    """
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        raise SyncError(_NO_PYSPARK) from None

    created = SparkContext._active_spark_context is None
    builder = SparkSession.builder.appName(app_name).config("spark.ui.showConsoleProgress", "false")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or (None if under_submit else "local[*]")
    if chosen:
        builder = builder.master(chosen)
    if created and not under_submit:
        # Read once, when the context starts: without it the workers run
        # whatever `python3` is on the PATH, likely without aeroqueue.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Defaults, before any extraJavaOptions of the user's: a flag there wins.
        builder = builder.config("spark.driver.defaultJavaOptions", DRIVER_JVM_OPTIONS)
        builder = builder.config("spark.python.daemon.module", DAEMON_MODULE)
        if not verbose:
            builder = builder.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{_quiet_log4j2()}")
    # The context starts here (under spark-submit too, whose JVM is already up): its
    # start's SIGINT handler is the caller's.
    try:
        with _jvm_launched_for_this_driver() if created and not under_submit else contextlib.nullcontext(), \
                _sigint_from_the_start(sigint if created else None):
            spark = builder.getOrCreate()
        if created:
            spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
            _accumulator_errors_logged(spark.sparkContext)
    except Exception as e:
        # The JVM exited as it started (killed; or no Java, or a wrong option: it said
        # why on stderr): PySpark's JAVA_GATEWAY_EXITED, or a py4j error, said as an
        # internal error. A stop asked meanwhile (SIGTERM) is said as itself: the JVM
        # was killed for it (`_jvm_launched_for_this_driver`).
        if isinstance(e, (Interrupted, Terminated)):
            raise
        lost = driver_lost(e, "as it started")
        if lost is None:
            raise
        raise lost from None
    return spark, created


def _accumulator_errors_logged(sc: Any) -> None:
    """PySpark's accumulator server (the JVM connects to it once a task has ended)
    printed socketserver's report of a failed request, a traceback ending in EOFError,
    when that connection broke: the JVM killed under a schedule. The run's own error
    says that; the report goes to the debug log (--verbose) instead."""
    server = getattr(sc, "_accumulatorServer", None)
    if server is None:
        return

    def handle_error(request: Any, client_address: Any) -> None:
        log.debug("Spark's connection to the accumulator server broke (its JVM gone?)", exc_info=True,
                  extra={"event": "spark_accumulators_failed"})

    server.handle_error = handle_error


# The driver's JVM only hands out tasks and gathers their counts (the records go from
# the store to MySQL in the Python workers): the JIT's optimising tier and a parallel
# collector cost a run's JVM more CPU than they save. Measured on a 2-core machine, one
# JVM and two small syncs: 19 s of JVM CPU with the defaults, 11 s with these.
DRIVER_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# The Python workers fork from a daemon that has imported their code once (it is
# PySpark's daemon, the imports before it): see aeroqueue/sync/daemon.py.
DAEMON_MODULE = "aeroqueue.sync.daemon"


@contextmanager
def _sigint_from_the_start(handler: Any) -> Iterator[None]:
    """A SparkContext starting in the main thread installs its SIGINT handler as its
    start's last step, whatever was there: one that calls the JVM (cancelAllJobs) from
    inside the handler, mostly while the main thread is in a py4j call of the start
    ('reentrant call' tracebacks), and over an inherited SIG_IGN. With `handler` (None:
    PySpark's, as it is), that step installs `handler` instead, so there is no moment
    between the context's start and the caller's own installing when PySpark's runs."""
    if handler is None:
        yield
        return
    try:
        from pyspark.core import context as module  # PySpark 4
    except ImportError:
        from pyspark import context as module  # PySpark 3.5
    real = getattr(module, "signal", None)
    if real is not signal:  # another PySpark: its handler, as before
        yield
        return

    class _Signals:
        def __getattr__(self, name: str) -> Any:
            return getattr(signal, name)

        @staticmethod
        def signal(signum: int, theirs: Any) -> Any:
            return signal.signal(signum, handler if signum == signal.SIGINT else theirs)

    setattr(module, "signal", _Signals())  # noqa: B010 (mypy: a module's attribute, another type)
    try:
        yield
    finally:
        setattr(module, "signal", signal)  # noqa: B010


@contextmanager
def _jvm_launched_for_this_driver() -> Iterator[None]:
    """The JVM PySpark launches, and the processes it starts, ignore SIGTERM; one
    interrupted before it answered is killed.

    A service manager stops a service by sending SIGTERM to all its processes at
    once (systemd's KillMode=control-group; a kill of the process group does the
    same). The JVM then ran its shutdown hooks under the running job: its tasks
    failed, Spark logged each with its stack, the driver's accumulator server
    printed a traceback, and the run ended as a failure. Ignoring it, the JVM
    lives on until this driver, which handles SIGTERM, stops the context, and it
    exits when the driver's end closes its stdin. An ignored signal stays ignored
    across exec, and Java does not install a handler over it.
    PySpark sets `preexec_fn` itself (to ignore SIGINT): its Popen is wrapped to
    add ours. The JVM is killed if the body ends in an exception (an interrupt)
    before the JVM answered."""
    from pyspark import java_gateway

    popen = getattr(java_gateway, "Popen", None)
    if popen is None:  # a PySpark that launches its JVM otherwise: it gets SIGTERM, as before
        yield
        return

    def launch(*args: Any, **kwargs: Any) -> Any:
        theirs = kwargs.get("preexec_fn")

        def preexec() -> None:
            if theirs is not None:
                theirs()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

        kwargs["preexec_fn"] = preexec
        global _driver_jvm
        started.append(popen(*args, **kwargs))
        _driver_jvm = started[-1]
        return started[-1]

    started: list[Any] = []
    java_gateway.Popen = launch  # type: ignore[assignment,misc]
    try:
        yield
    except BaseException as e:
        # Interrupted (Ctrl-C, SIGTERM) or failed before the JVM answered: no job ran
        # in the JVM, so it is killed, not left to end on its own.
        # - Before its gateway answered, PySpark leaves the JVM it started, which
        #   ignores SIGINT and SIGTERM and never reads its stdin's end either: it
        #   lived on, orphaned, holding the terminal.
        # - Interrupted after, it ended once this process had (its stdin closed), in
        #   the middle of making the context: it logged "Error initializing
        #   SparkContext" with its stack after the command's last line (seen in CI).
        # A context that failed on its own is left as it is: how the JVM ended, or
        # what it answered, is what the error says (`driver_lost`).
        from pyspark import SparkContext

        if SparkContext._gateway is None or isinstance(e, (KeyboardInterrupt, Interrupted, Terminated)):
            for proc in started:
                with contextlib.suppress(OSError):
                    proc.kill()
                with contextlib.suppress(Exception):
                    proc.wait(5)
        raise
    finally:
        java_gateway.Popen = popen  # type: ignore[misc]


# The process of the JVM this process launched for Spark's driver (PySpark's Popen of
# spark-submit, which execs the JVM): PySpark keeps it on its gateway, which a JVM that
# exited as it started never made.
_driver_jvm: Any = None


def _driver_process() -> Any:
    """The process of the Spark driver's JVM this process launched, or None (under
    spark-submit, whose JVM started this process)."""
    try:
        from pyspark import SparkContext
    except ImportError:
        return None
    return getattr(SparkContext._gateway, "proc", None) or _driver_jvm


def driver_ended() -> int | None:
    """The exit status of the Spark driver's JVM this process launched (negative: the
    signal that killed it), once it has ended; None while it runs, or when this
    process launched none."""
    proc = _driver_process()
    return None if proc is None else proc.poll()


# How long a JVM whose py4j connection broke is given to be seen ended: its sockets
# close as it exits, a moment before its parent can reap it.
DRIVER_END_WAIT_S = 2.0


def driver_lost(e: BaseException, when: str, then: str = "") -> SparkDriverLost | None:
    """The error to say for `e` if the Spark driver's JVM is gone (`when`: what it was
    doing, `then`: what follows for the copy), else None. Its end reaches py4j's calls as a broken
    or refused connection ("[Errno 111] Connection refused", "Answer from Java side is
    empty"), which said nothing of the JVM; and a schedule went on failing so, run
    after run, with no JVM to run them."""
    proc = _driver_process()
    broken = _py4j_lost(e)
    status = None if proc is None else proc.poll()
    if status is None and proc is not None and broken:
        with contextlib.suppress(subprocess.TimeoutExpired):
            status = proc.wait(DRIVER_END_WAIT_S)
    then = f"; {then}" if then else ""
    if status is None:
        return SparkDriverLost(f"the Spark driver (its JVM) stopped answering {when}{then}") if broken else None
    how = f"with exit status {status}"
    if status < 0:
        with contextlib.suppress(ValueError):
            how = f"killed by {signal.Signals(-status).name}"
    return SparkDriverLost(f"the Spark driver (its JVM, pid {proc.pid}) ended {when}, {how}{then}")


def _py4j_lost(e: BaseException) -> bool:
    """py4j lost its connection to the JVM somewhere in `e`'s chain: the sign of its end
    when this process did not launch it (spark-submit's).

    Besides its network error, a bare "An error occurred while calling o22.getLocalProperty"
    (a Py4JError with no Java trace): py4j's client catches a call's broken connection,
    logs it and answers the call with its error code, which carries nothing else. A run
    whose JVM was SIGKILLed so failed as an ordinary run, logged, the schedule going on
    (seen once in CI), because the JVM was not yet reaped when the error was looked at."""
    try:
        from py4j.protocol import Py4JError, Py4JNetworkError
    except ImportError:
        return False
    seen: BaseException | None = e
    for _ in range(20):
        if seen is None:
            return False
        if isinstance(seen, Py4JNetworkError):
            return True
        if type(seen) is Py4JError and str(seen).startswith("An error occurred while calling") \
                and "Trace:" not in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def stop_spark(spark: SparkSession) -> None:
    """Stop a session this process started, without waiting on PySpark's accumulator
    server. With its JVM gone (killed) nothing is asked of it: every call would fail,
    and PySpark warns of the first on stderr.

    `SparkSession.stop` stops the context in the JVM (a tenth of a second), then shuts
    that server down and waits for it: its thread serves the JVM's connection (open
    once a task has ended) in a loop that looks for the shutdown once a second, and the
    server's own loop every half second. A SIGTERM'd `sync --every` so waited up to
    1.5 s more, its JVM kept up all along (it ends once this process does): about 2 s
    from the signal to the JVM's end. The server's shutdown runs in a thread of its
    own instead (a daemon: a process that ends does not wait for it either)."""
    if driver_ended() is not None:
        return
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)
    sc._accumulatorServer = None  # type: ignore[assignment]  # so that `stop` leaves it to us
    try:
        spark.stop()
    finally:
        if server is not None:
            threading.Thread(target=server.shutdown, name="aeroqueue-spark-accumulators-stop", daemon=True).start()


_RUN_LOST = "rows committed so far are marked synced, the next run copies the rest"
_TASK_ERROR = re.compile(r"SyncError: ([^\n]+)")
_PY_ERROR = re.compile(r"^\s*((?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)): (.+)$", re.M)
_JVM_PREFIXES = ("org.", "java.", "scala.", "py4j.")


def _spark_failure(e: Exception, target: Target) -> SyncError:
    """A clear one-line error from a failed Spark job. Spark wraps a task's
    Python traceback in a Java stack trace: the task's own SyncError message
    if there is one, else the last Python exception line, else Spark's."""
    text = str(e)
    found = _TASK_ERROR.findall(text)
    if found:
        return SyncError(target.redact(found[-1].strip()))
    python = [f"{name}: {msg}" for name, msg in _PY_ERROR.findall(text) if not name.startswith(_JVM_PREFIXES)]
    if python:
        why = python[-1]
    elif "worker exited unexpectedly" in text or "crashed" in text:
        why = "a task's Python worker crashed"
    else:
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        why = next((line for line in lines if "Job aborted" in line), lines[0] if lines else repr(e))
    return SyncError(
        f"the Spark job failed: {target.redact(why)[:500]}; rows committed so far are marked synced, "
        "the next run copies the rest"
    )


class ProgressWatcher:
    """Reads the tasks' progress records every half second, for a callback
    given rows copied per list; deletes them when the run ends."""

    def __init__(self, options: SyncOptions, on_progress: Callable[[dict[str, int]], None]) -> None:
        self.names = [progress_name(options.run_id, begin) for begin, _ in ranges(options.partitions)]
        self.url = options.store_url
        self.on_progress = on_progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aeroqueue-sync-progress", daemon=True)

    def __enter__(self) -> ProgressWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self, backend: Backend) -> dict[str, int]:
        total: dict[str, int] = {}
        for i in range(0, len(self.names), 500):
            for rec in backend.batch_get(keys.SYNC_SET, self.names[i:i + 500]):
                for name, n in ((rec.bins.get("lists") or {}) if rec else {}).items():
                    total[name] = total.get(name, 0) + int(n)
        return total

    def _run(self) -> None:
        # A backend of its own: the caller's may not be shared across threads.
        backend = open_backend(self.url, create=False)
        try:
            while True:
                stopping = self._stop.wait(PROGRESS_EVERY_S)
                try:
                    self.on_progress(self._read(backend))
                except BackendError as e:
                    log.debug("reading the sync's progress failed: %s", e, extra={"event": "sync_progress_failed"})
                if stopping:
                    break
            for i in range(0, len(self.names), 500):
                backend.batch_operate(keys.SYNC_SET, [(n, [_delete()]) for n in self.names[i:i + 500]])
        except BackendError as e:
            log.debug("cleaning up the sync's progress records failed: %s", e, extra={"event": "sync_cleanup_failed"})
        finally:
            backend.close()


def _delete() -> dict:
    from aerospike_helpers.operations import operations as op

    return op.delete()


def run_sync(
    options: SyncOptions, spark: SparkSession, backend: Backend,
    on_progress: Callable[[dict[str, int]], None] | None = None,
) -> SyncReport:
    """One sync run on `spark`. The caller holds the lease (see `sync_once`)."""
    started = time.monotonic()
    synced_at = now_ms()
    with Sink(options.target) as sink:
        migrate(sink)
        # The copy's id names its marks: read from the target each run, so a database
        # made anew since the last run is copied into in full.
        target = replace(options.target, target_id=target_id(sink))
    options = replace(options, target=target)
    if on_progress is not None and not options.run_id:
        options = _with_run_id(options)
    sc = spark.sparkContext
    parts = ranges(options.partitions)
    task = functools.partial(sync_ranges, options, synced_at)
    watcher = ProgressWatcher(options, on_progress) if on_progress is not None else None
    try:
        if watcher:
            watcher.__enter__()
        try:
            with _job_group(sc, f"aeroqueue-sync-{uuid.uuid4().hex}") as group:
                # Not after Ctrl-C (a BaseException): the context is stopped then, its tasks with it.
                try:
                    per_task = sc.parallelize(parts, len(parts)).mapPartitions(task).collect()
                except Exception:
                    _await_tasks(sc, group)
                    raise
                _await_tasks(sc, group)
        finally:
            if watcher:
                watcher.__exit__(None, None, None)
    except Exception as e:
        if isinstance(e, AeroqueueError):
            raise
        raise driver_lost(e, "during the run", _RUN_LOST) or _spark_failure(e, target) from None
    counts = Counts()
    for c in per_task:
        counts.add(c)
    with Sink(target) as sink:
        n_lists = write_summaries(backend, sink, synced_at, options.lists)
        forget_copied_rejects(sink)
    report = SyncReport(str(target), counts, n_lists, time.monotonic() - started, synced_at, options.resync)
    log.debug("%s", report, extra={"event": "sync_report"})
    return report


# The local properties `setJobGroup` sets, restored after a run: a caller's own group stays theirs.
_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
# How long a run waits for its Spark job's last tasks to end. A failed job's other
# tasks are killed, but a task's Python worker is only killed 2 to 4 s later
# (spark.python.task.killTimeout, after the monitor's 2 s poll); more on a loaded machine.
TASKS_END_LIMIT_S = 120.0
# A failure before the job was submitted leaves no job in the group to wait for.
JOB_SEEN_LIMIT_S = 10.0
TASKS_POLL_S = 0.05


@contextmanager
def _job_group(sc: Any, group: str) -> Iterator[str]:
    """The block's Spark jobs in a job group of their own (`_await_tasks` finds them
    by it). Tasks are not interrupted when the job is cancelled (Spark's default,
    said here because it matters): an interrupted task can end, and be counted as
    ended, while its Python worker still runs until it is killed."""
    saved = {key: sc.getLocalProperty(key) for key in _JOB_GROUP_PROPERTIES}
    sc.setJobGroup(group, "aeroqueue sync", interruptOnCancel=False)
    try:
        yield group
    finally:
        with contextlib.suppress(Exception):  # the context stopped under the run (Ctrl-C, a killed JVM)
            for key, value in saved.items():
                sc.setLocalProperty(key, value)


def _await_tasks(sc: Any, group: str) -> None:
    """Wait until no task of the group's jobs is running, or `TASKS_END_LIMIT_S`.

    A Spark job fails as soon as one task has failed its last attempt: `collect`
    raises while the job's other tasks still run, until Spark kills them, seconds
    later. Such a task went on copying and marking after the run had failed, and
    after its lease was released: another run could start beside it, and a caller
    that checked the target after the failure saw rows and marks appear later. A
    job that succeeds may leave speculative copies of its tasks running too.
    Only the status store's view counts, so first the job's end must have reached
    it: every task started before the job ended was reported before that end."""
    started = time.monotonic()
    tracker = None
    while True:
        try:
            # Inside the try: with the context stopped under the run its `_jsc` is None
            # (an AttributeError), with its JVM gone a Py4J error; raised here, either
            # replaced the run's own error.
            tracker = tracker or sc.statusTracker()
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(group)]
            if jobs and all(job is not None and job.status != "RUNNING" and not any(
                    (stage := tracker.getStageInfo(s)) is not None and stage.numActiveTasks > 0
                    for s in job.stageIds) for job in jobs):
                return
        except Exception as e:  # the context stopped under the run: its tasks went with it
            log.debug("reading the sync job's status failed: %s", e, extra={"event": "sync_status_failed"})
            return
        waited = time.monotonic() - started
        if not jobs and waited > JOB_SEEN_LIMIT_S:
            return
        if waited > TASKS_END_LIMIT_S:
            log.warning("tasks of the sync's Spark job were still running %.0f s after it ended; "
                        "they may still copy and mark rows", waited, extra={"event": "sync_tasks_running", "waited_s": round(waited)})
            return
        time.sleep(TASKS_POLL_S)


def _with_run_id(options: SyncOptions) -> SyncOptions:
    return replace(options, run_id=uuid.uuid4().hex[:16])


def write_summaries(backend: Backend, sink: Sink, at_ms: int, only: tuple[str, ...] = ()) -> int:
    """One aq_list_summary row per job list (read from the list records, not the jobs)."""
    lists = JobLists(backend)
    rows = []
    for name in (only or lists.names()):
        try:
            st = lists.status(name)
        except ListNotFound:
            # Dropped while the run copied its jobs (or since it was named): nothing to
            # summarise, and not this run's failure. Its last summary row stays.
            log.info("list dropped during the sync: no summary", extra={"event": "sync_list_gone", "list": name})
            continue
        rows.append((name, st.mode, st.total, st.done, st.dead, int(st.sealed), int(st.complete), st.completed_at, at_ms,
                     st.created))
    try:
        sink.upsert(SUMMARY_TABLE, SUMMARY_COLUMNS, ("list",), rows)
        sink.commit()
    except Exception as e:
        if not sink.dialect.is_error(e):
            raise
        raise sink.fail(e, "writing the list summaries") from None
    return len(rows)


def forget_copied_rejects(sink: Sink) -> None:
    """Drop sync_rejects rows whose job has been copied since it was refused: a row
    of its list (the stamp: a list of the name dropped before is another list), or,
    for a reject written before migration 5 (created 0, the stamp unknown), of its
    (list, token) as before."""
    try:
        sink.execute(
            f"DELETE FROM {REJECTS_TABLE} WHERE EXISTS (SELECT 1 FROM {JOBS_TABLE} j "
            f"WHERE j.list = {REJECTS_TABLE}.list AND j.token = {REJECTS_TABLE}.token "
            f"AND (j.created = {REJECTS_TABLE}.created OR {REJECTS_TABLE}.created = 0) "
            f"AND j.synced_at >= {REJECTS_TABLE}.seen_at)"
        )
        sink.commit()
    except Exception as e:
        if not sink.dialect.is_error(e):
            raise
        raise sink.fail(e, "clearing copied rejects") from None



def rows_to_copy(backend: Backend, options: SyncOptions) -> dict[str, int]:
    """Per list, about how many rows this run copies: the list's processed jobs
    (from its header and bitmaps: no job is read), less the rows the target
    already holds for it (none counted for a resync). For the progress bar."""
    lists = JobLists(backend)
    names = list(options.lists) or lists.names()
    held: dict[tuple[str, int], int] = {}
    if not options.resync:
        with Sink(options.target) as sink:
            try:
                # The rows of each list as it is now: those of a list of the name
                # dropped before are not its.
                held = {(name, int(c)): int(n) for name, c, n in sink.execute(
                    f"SELECT list, created, COUNT(*) FROM {JOBS_TABLE} GROUP BY list, created")}
            except Exception as e:
                if not sink.dialect.is_error(e):
                    raise
                held = {}  # no table yet: nothing held
    out = {}
    for name in names:
        try:
            st = lists.status(name)
        except ListNotFound:
            continue  # dropped since it was listed (or named): nothing of it to copy
        # Rows copied before migration 4 (created 0) are counted as the list's: its jobs
        # take their place when copied (`RangeSync._replace_legacy_rows`).
        out[name] = max(0, st.done + st.dead - held.get((name, st.created), 0) - held.get((name, 0), 0))
    return out
