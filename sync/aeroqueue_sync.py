"""spark-submit entry point for `aeroqueue sync`: the aeroqueue command line, run by Spark.

On a cluster, build the package once and ship it to the executors with
``--py-files`` (a wheel is a zip Python imports from); its dependencies
(aerospike, lupa, mysql-connector-python) must be installed on every node, or
shipped as a packed virtualenv with ``--archives`` and ``PYSPARK_PYTHON``::

    python -m pip wheel --no-deps -w dist .
    spark-submit \\
        --master spark://spark-master:7077 \\
        --py-files dist/aeroqueue-0.1.0-py3-none-any.whl \\
        sync/aeroqueue_sync.py \\
        --url aerospike://aerospike-1:3000,aerospike-2:3000/jobs \\
        sync --mysql mysql://aq_sync@mysql-host:3306/aeroqueue --partitions 256

    # with a packed virtualenv instead of installed dependencies:
    #   venv-pack -o aq_env.tar.gz
    #   spark-submit --archives aq_env.tar.gz#aq_env \\
    #       --conf spark.pyspark.python=./aq_env/bin/python ... (as above)

The password comes from ``AEROQUEUE_MYSQL_PASSWORD`` (or ``MYSQL_PWD``) in
the driver's environment rather than the command line, where ``ps`` would
show it. The master is spark-submit's: ``sync`` only sets one (``local[*]``)
when it is not run by spark-submit and no ``--master`` is given. The same
script runs locally with plain Python::

    python sync/aeroqueue_sync.py --url embedded:///var/lib/aq/store.db sync --master 'local[4]'

Options are those of ``aeroqueue sync --help``; ``--every 5m`` keeps it
running on a schedule.
"""

from __future__ import annotations

import os
from pathlib import Path

from aeroqueue.cli.sync_cmd import spark_submit_main
from aeroqueue.sync import ENV_SCHEMA

if __name__ == "__main__":
    # With --py-files the driver imports aeroqueue from the wheel, which may not
    # carry sync/schema.sql: the copy beside this script is the one to use.
    os.environ.setdefault(ENV_SCHEMA, str(Path(__file__).resolve().with_name("schema.sql")))
    spark_submit_main()
