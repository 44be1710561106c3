"""Copy processed jobs to MySQL with PySpark (design.md, flow "sync"; invariant 5).

One module per step of a run:

- `target`: where the copy goes (``mysql://`` or ``sqlite://``), and the
  mark bin that names it on each job record;
- `scan`: the server-side filter of what to copy, streamed in batches;
- `write` and `schema`: the upsert into the target, its versioned tables,
  job records as rows (or rejects);
- `mark`: after the commit, one batch of the same server-side write marks what
  the target now holds (a versioned write per record where a job changed since
  the scan); retention;
- `task`: a Spark task's range of partitions, start to end;
- `job`: the Spark driver's side: the session, a run, progress, summaries;
- `schedule`: one run per target at a time (a lease), once or on a schedule;
- `bench`: the benchmark beside a plain loop.

Nothing here imports the command line (``aeroqueue.cli.sync_cmd`` holds the
``sync`` and ``sync-bench`` commands), nor PySpark or the MySQL driver until a
run needs them.
"""

from __future__ import annotations

from ..errors import SyncError
from .job import ProgressWatcher, rows_to_copy, run_sync, spark_session, write_summaries
from .mark import mark, retain
from .options import (
    DEFAULT_BATCH,
    DEFAULT_PAGE,
    DEFAULT_PARTITIONS,
    Counts,
    SyncFaults,
    SyncOptions,
    SyncReport,
    ranges,
)
from .scan import SCAN_BINS, to_copy
from .schedule import DEFAULT_LEASE_S, Lease, LeaseKeeper, Scheduler, sync_lease, sync_once
from .schema import (
    ENV_SCHEMA,
    JOB_COLUMNS,
    JOB_KEY,
    JOBS_TABLE,
    REJECTS_TABLE,
    Refused,
    job_row,
    migrate,
    migrations,
)
from .target import Target, demo_target, parse_target, redact, remember_demo_target
from .write import Sink

__all__ = [
    "DEFAULT_BATCH", "DEFAULT_LEASE_S", "DEFAULT_PAGE", "DEFAULT_PARTITIONS", "ENV_SCHEMA", "JOBS_TABLE",
    "JOB_COLUMNS", "JOB_KEY", "REJECTS_TABLE", "SCAN_BINS", "Counts", "Lease", "LeaseKeeper", "ProgressWatcher",
    "Refused", "Scheduler", "Sink", "SyncError", "SyncFaults", "SyncOptions", "SyncReport", "Target", "demo_target", "job_row",
    "mark", "migrate", "migrations", "parse_target", "ranges", "redact", "remember_demo_target", "retain",
    "rows_to_copy", "run_sync", "spark_session", "sync_lease", "sync_once", "to_copy", "write_summaries",
]
