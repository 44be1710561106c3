"""Worker processes (the CLI) following lists that are dropped, and loaded again under
the same name, while they run, on every backend: the jobs of the list loaded again are
taken whatever its mode, a dropped list's jobs a worker holds unstarted are counted
once, and nothing of it stops the worker's maintenance. Audited job by job, from the
handler's log and the worker's last line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from tests.logs import json_events
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]

# Logs each run; a job of a list whose name ends in "-held" touches its claim well past
# the list's time limit, says so (the test drops the list only then: dropped before the
# touch, the job would fail at once and the jobs behind it start at once), then waits
# for the gate file.
HANDLER = """
import os, time
from pathlib import Path

def handle(job):
    with open(os.environ["AQ_RAN"], "a") as f:
        f.write(f"{job.list} {job.jid}\\n")
    if job.list.endswith("-held"):
        job.touch(60)
        Path(os.environ["AQ_TOUCHED"]).touch()
        gate = Path(os.environ["AQ_GATE"])
        while not gate.exists():
            time.sleep(0.02)
    return "ok"
"""


class WorkerProc:
    def __init__(self, store_url: str, tmp_path: Path, *args: str) -> None:
        (tmp_path / "drop_handler.py").write_text(textwrap.dedent(HANDLER))
        self.ran, self.gate, self.log = tmp_path / "ran.txt", tmp_path / "gate", tmp_path / "worker.jsonl"
        self.touched = tmp_path / "touched"
        self.ran.touch()
        env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "AQ_RAN": str(self.ran),
               "AQ_GATE": str(self.gate), "AQ_TOUCHED": str(self.touched)}
        with open(self.log, "w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "aeroqueue", "--url", store_url, "worker", "--handler", "drop_handler:handle",
                 "--heartbeat", "0.2", "--expiry", "3", "--idle-max", "0.2", "--refresh-lists", "0.2",
                 "--log-format", "json", "--log-level", "info", *args],
                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=stderr)

    def wait_for(self, what: str, check: Callable[[], object], timeout_s: float = 30.0) -> None:
        """`wait_for`, saying on a timeout whether the worker still runs and what it logged."""
        try:
            wait_for(what, check, timeout_s)
        except AssertionError as e:
            raise AssertionError(f"{e} (worker exit status {self.proc.poll()}; its log: "
                                 f"{self.log.read_text()[-3000:]})") from None

    def runs(self) -> Counter[tuple[str, str]]:
        """(list, job id) -> how many times the handler ran it."""
        return Counter(tuple(line.split()) for line in self.ran.read_text().splitlines())  # type: ignore[misc]

    def events(self) -> list[dict]:
        return json_events(self.log)

    def last_counts(self) -> dict:
        stopped = [e for e in self.events() if e.get("event") == "stopped"]
        assert len(stopped) == 1, self.log.read_text()
        return {k: stopped[0][k] for k in ("reserved", "done", "retried", "dead", "lost", "unacked", "released")}

    def wait(self) -> int:
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker did not exit: {self.log.read_text()[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("modes", [("tokens", "ids"), ("ids", "tokens")])
def test_a_list_dropped_and_loaded_again_in_the_other_mode_is_worked_on(store_url, registered, list_name, tmp_path,
                                                                        modes):
    """The worker's queue knew the list in its first mode: loaded again in ID mode, its
    jobs were never popped (the worker polled it and found nothing, for ever)."""
    lists = JobLists(registered)
    again, other = f"{list_name}-again", f"{list_name}-open"
    lists.load(again, [JobSpec(f"a{i}", {}) for i in range(5)], mode=modes[0], seal=True)
    lists.load(other, [JobSpec("o0", {})])  # not sealed: the worker waits on
    w = WorkerProc(store_url, tmp_path, "--list", f"{list_name}-*", "--until-complete")
    try:
        w.wait_for("the first jobs done", lambda: lists.status(again).done == 5 and lists.status(other).done == 1)
        lists.drop(again, grace_s=0)
        lists.load(again, [JobSpec(f"b{i}", {}) for i in range(5)], mode=modes[1], seal=True)
        w.wait_for(f"the jobs of {again}, loaded again in {modes[1]} mode, done",
                 lambda: lists.status(again).done == 5, timeout_s=20)
        lists.seal(other)
        assert w.wait() == 0
    finally:
        w.kill()
    expected = {(again, f"a{i}") for i in range(5)} | {(again, f"b{i}") for i in range(5)} | {(other, "o0")}
    runs = w.runs()
    assert set(runs) == expected and set(runs.values()) == {1}, runs
    assert w.last_counts() == {"reserved": 11, "done": 11, "retried": 0, "dead": 0, "lost": 0, "unacked": 0,
                               "released": 0}


@pytest.mark.parametrize("ending", ["drained", "until_complete"])
def test_jobs_held_unstarted_when_their_list_is_dropped_are_counted_once(store_url, registered, list_name, tmp_path,
                                                                         ending):
    """A thread runs one job of a list, three more of it prefetched behind, when the list
    is dropped. The three are gone: counted lost, as the running one's refused ack is,
    whether the worker gives them back at its drain (SIGTERM) or gets to them and goes
    on with its other list. Before, they were counted nowhere (reserved 4, lost 1), and
    the renewals of their claims failed the worker's maintenance at every tick, so it
    neither reaped nor checked --until-complete while the handler ran."""
    lists = JobLists(registered)
    held, rest = f"{list_name}-held", f"{list_name}-rest"
    # A 1 s time limit: the prefetched claims are renewed every half second.
    lists.load(held, [JobSpec(f"h{i}", {}) for i in range(6)], seal=True, timeout_s=1.0)
    lists.load(rest, [JobSpec(f"r{i}", {}) for i in range(10)], seal=True)
    # One thread; the first pick is "-held" (picks tie in name order); 4 jobs a time.
    w = WorkerProc(store_url, tmp_path, "--list", f"{list_name}-*", "--prefetch", "4", "--until-complete")
    try:
        w.wait_for("the first job of the held list running, its claim touched", w.touched.exists)
        assert w.runs() == Counter({(held, "h0"): 1}), w.runs()
        lists.drop(held, grace_s=0)
        time.sleep(1.5)  # renewals of the prefetched claims come due
        if ending == "drained":
            w.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
        w.gate.touch()
        assert w.wait() == 0
    finally:
        w.kill()
    runs = w.runs()
    assert runs[(held, "h0")] == 1 and not [k for k in runs if k[0] == held and k[1] != "h0"], runs
    assert set(runs.values()) == {1}, runs
    done = 0 if ending == "drained" else 10
    if done:
        assert {k for k in runs if k[0] == rest} == {(rest, f"r{i}") for i in range(10)}, runs
    assert w.last_counts() == {"reserved": 4 + done, "done": done, "retried": 0, "dead": 0, "lost": 4, "unacked": 0,
                               "released": 0}
    # Nothing failed: the store answered every renewal (the job was gone), and nothing was given back.
    failed = [e for e in w.events() if e.get("event") in ("maintenance_failed", "renew_failed", "release_failed")]
    assert not failed, failed
