"""The Python daemon Spark forks a sync's task workers from (``spark.python.daemon.module``).

PySpark's own daemon (``pyspark.daemon``) imports the worker's code after each
fork, so every worker it starts imported PySpark's worker, aeroqueue's sync
task and the MySQL driver again: about 0.6 s of CPU per worker, and each sync
run's daemon starts a worker per task slot (and again for one that a fault
killed). Imported here once, before the forks, they are shared by every worker;
the daemon is PySpark's, unchanged.

Set by `aeroqueue.sync.job.spark_session` on a SparkContext it creates outside
`spark-submit` (under it, `--conf spark.python.daemon.module=aeroqueue.sync.daemon`).
The executors' Python must have aeroqueue installed, as it must to run the tasks
at all.
"""

from __future__ import annotations

import contextlib

import pyspark.worker  # noqa: F401  (the daemon imports it after each fork otherwise)
from pyspark.daemon import manager

import aeroqueue.sync.task  # noqa: F401  (what each task's function unpickles to)

with contextlib.suppress(ImportError):  # the `mysql` extra: a sqlite:// target needs none
    import mysql.connector  # noqa: F401

if __name__ == "__main__":
    manager()
