"""A sync driver in a process of its own, for tests that kill it or its executors:
`python run_driver.py JSON` with the store, target, master and a pause directory;
every task's first attempt pauses after its first commit (see SyncFaults)."""

from __future__ import annotations

import json
import sys

from aeroqueue.backends import open_backend
from aeroqueue.sync import SyncFaults, SyncOptions, parse_target, spark_session, sync_once


def main() -> None:
    args = json.loads(sys.argv[1])
    options = SyncOptions(
        store_url=args["store"], target=parse_target(args["target"]), partitions=args["partitions"],
        batch_size=args["batch"], lists=tuple(args["lists"]),
        faults=SyncFaults(pause_after_commits=1, pause_dir=args["pause_dir"]),
    )
    spark, _ = spark_session(args["master"], "aeroqueue-sync-fault-test")
    try:
        report = sync_once(options, spark, open_backend(args["store"]), lease_s=args["lease_s"])
        print(json.dumps(report.as_dict()), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
