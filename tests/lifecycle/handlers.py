"""Handlers for the lifecycle tests that run in child processes (--pool process):
importable by name, as a spawned process needs."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

from aeroqueue.queue import Job


def hang_or_double(job: Job) -> dict:
    if job.payload.get("hang"):
        time.sleep(60)
    if job.payload.get("touch"):  # 2 s of work, touched every 0.5 s
        for _ in range(4):
            time.sleep(0.5)
            job.touch()
    return {"double": job.payload["n"] * 2, "pid": os.getpid()}


def misbehave(job: Job) -> dict:
    """What a handler may do wrong, by payload: each fails its own job, in a child
    process as in a thread."""
    how = job.payload.get("how")
    if how == "bad-touch":
        job.touch(0.0)
    elif how == "exit":
        sys.exit(3)
    elif how == "interrupt":
        raise KeyboardInterrupt
    elif how == "slow":
        time.sleep(job.payload["s"])
    elif how == "regex":  # exponential backtracking: holds the GIL for good
        re.match(r"(a+)+$", "a" * 64 + "b")
    elif how == "die-mid-touch":  # asks for a touch, and dies (an OOM kill) before the answer
        threading.Thread(target=job.touch, daemon=True).start()
        time.sleep(0.3)
        os._exit(9)
    return {"pid": os.getpid()}


def record_run(job: Job) -> dict:
    """Sleeps payload["s"] seconds, then appends when it ran, and on which thread, to the
    file payload["out"] names: what a test of the worker's threads checks overlap on."""
    start = time.time()
    time.sleep(job.payload["s"])
    run = {"jid": job.jid, "start": start, "end": time.time(), "thread": threading.current_thread().name}
    with open(job.payload["out"], "a") as out:
        out.write(json.dumps(run) + "\n")
    return {"slept": job.payload["s"]}
