"""A handler module whose import in a handler process waits for the test
(AQ_TEST_START_GATE, a directory): the process says so with a file
`starting-<pid>` there, then goes on once `go` exists. A handler process is
killed in that window as the OOM killer would kill one that is starting."""

from __future__ import annotations

import multiprocessing
import os
import time

from aeroqueue.queue import Job

GATE = os.environ.get("AQ_TEST_START_GATE", "")
# The worker imports this module too (to find the handler): only its handler
# processes, named so before they unpickle the handler, wait.
if GATE and multiprocessing.current_process().name == "aeroqueue-handler":
    open(os.path.join(GATE, f"starting-{os.getpid()}"), "w").close()
    while not os.path.exists(os.path.join(GATE, "go")):
        time.sleep(0.01)


def quick(job: Job) -> dict:
    return {"pid": os.getpid()}
