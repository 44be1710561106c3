"""A server that stops under a connected client: the commands say the server is down,
not what the client makes of it ("Partition query not supported by connected
server", as if the server were too old for scans). A node of its own, started from
../shared/aerospike and stopped by the test: the shared test servers stay up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from aeroqueue import errors, udfs
from aeroqueue.backends import open_backend
from aeroqueue.cli import main
from aeroqueue.lists import JobLists
from aeroqueue.loading import JobSpec
from tests.conftest import port_open, require

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT.parent / "shared" / "aerospike" / "server"


def _free_port() -> int:
    """Four free ports in a row (service, fabric, heartbeat, admin), above the range
    .ci/run gives its nodes (3100-3199) and the default node's (3000). Looked for
    from a place of this process's own: `make test` runs this file's tests in two
    processes at once, and both took 3400; one stopped its node, the other started
    its own there, and the first's client, told its server was down, found a
    server again (seen in a full run)."""
    slots = 25
    first = os.getpid() % slots
    for i in range(slots):
        port = 3400 + 4 * ((first + i) % slots)
        if not any(port_open("127.0.0.1", p) for p in range(port, port + 4)):
            return port
    raise AssertionError("no four free ports in 127.0.0.1:3400-3499")


@pytest.fixture
def stopped_server(tmp_path: Path) -> Iterator[tuple[str, JobLists]]:
    """A client connected to a node of its own, and the node stopped after."""
    require(SERVER.is_file(), f"{SERVER} is missing: no Aerospike server to stop")
    port, where = _free_port(), tmp_path / "node"
    run = [str(SERVER), "--port", str(port), "--dir", str(where)]
    subprocess.run([run[0], "start", *run[1:]], check=True, capture_output=True, timeout=90)
    url = f"aerospike://127.0.0.1:{port}/test"
    backend = None
    try:
        backend = open_backend(url)
        lists = JobLists(backend)
        assert lists.names() == [], "a fresh node"
        subprocess.run([run[0], "stop", *run[1:]], check=True, capture_output=True, timeout=60)
        yield url, lists
    finally:
        if backend is not None:
            backend.close()
        subprocess.run([run[0], "stop", *run[1:]], capture_output=True, timeout=60)


def test_a_scan_and_a_read_on_a_stopped_server_say_it_may_be_down(stopped_server: tuple[str, JobLists]) -> None:
    url, lists = stopped_server
    with pytest.raises(errors.BackendError) as scan:
        lists.names()
    said = str(scan.value)
    assert "no server node is connected (the server is down or unreachable" in said, said
    with pytest.raises(errors.BackendError) as read:
        lists.status("nothing")
    assert "every node is down" in str(read.value), str(read.value)
    # The CLI, started after the stop: it cannot connect at all, and says so.
    out = CliRunner().invoke(main, ["--url", url, "lists"])
    assert out.exit_code == 1 and "is the server running" in out.output, out.output


def test_the_exporter_serves_store_up_0_until_its_server_comes_up(tmp_path: Path) -> None:
    """`aeroqueue metrics` started before its server (a deploy brings both up at once):
    it serves `aeroqueue_store_up` 0 instead of exiting (Prometheus would see the
    exporter down), still 0 while the new server lacks the Lua modules (each attempt
    checks them again), and exports the lists once both are there."""
    from tests.observe.conftest import free_port, spawn, stop
    from tests.observe.test_metrics import scrape, value, wait_for

    require(SERVER.is_file(), f"{SERVER} is missing: no Aerospike server to start")
    port, where = _free_port(), tmp_path / "node"
    run = [str(SERVER), "--port", str(port), "--dir", str(where)]
    url, metrics_port, log = f"aerospike://127.0.0.1:{port}/test", free_port(), tmp_path / "exporter.log"
    proc = spawn(["--url", url, "metrics", "--port", str(metrics_port), "--connect-every", "1"], log)
    endpoint = f"http://127.0.0.1:{metrics_port}/metrics"

    def until(what: str, ok: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 30
        while not ok():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"never {what}:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)

    try:
        samples = wait_for(endpoint, proc, log)
        assert value(samples, "aeroqueue_store_up") == 0 and value(samples, "aeroqueue_lists") == 0, samples
        subprocess.run([run[0], "start", *run[1:]], check=True, capture_output=True, timeout=90)
        until("refused for the missing modules", lambda: "store not usable" in log.read_text())
        time.sleep(1.5)  # another attempt: a store whose check failed is not taken as checked
        assert value(scrape(endpoint), "aeroqueue_store_up") == 0, log.read_text()[-3000:]
        backend = open_backend(url)
        try:
            udfs.register(backend)
            JobLists(backend).load("up-later", [JobSpec(str(i), i) for i in range(3)], seal=True)
        finally:
            backend.close()
        until("connected", lambda: value(scrape(endpoint), "aeroqueue_store_up") == 1)
        samples = scrape(endpoint)
        assert value(samples, "aeroqueue_list_jobs", list="up-later") == 3, samples
        assert value(samples, "aeroqueue_exporter_errors_total") >= 4, "the failed connects stay counted"
    finally:
        code = stop(proc)
        subprocess.run([run[0], "stop", *run[1:]], capture_output=True, timeout=60)
    said = log.read_text()
    assert code == 0, said[-3000:]
    assert said.count("store not reachable") == 1, f"said once, not at each attempt:\n{said[-3000:]}"
    assert "is the server running and reachable" in said and "event=store_reachable" in said, said


def test_an_exporter_whose_login_is_refused_ends_at_once(real_url: str) -> None:
    """Only an unreachable store is waited for: a refused login is the URL's fault, and
    a wait would serve `aeroqueue_store_up` 0 for ever."""
    scheme, rest = real_url.split("://", 1)
    url = f"{scheme}://app:pw-not-shown@{rest}"
    with pytest.raises(errors.BackendError) as refused:
        open_backend(url)
    assert not isinstance(refused.value, errors.StoreUnreachable), refused.value
    out = subprocess.run([sys.executable, "-m", "aeroqueue", "--url", url, "metrics", "--port", "0"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1 and "the server refused the login" in out.stderr, out.stderr
    assert "pw-not-shown" not in out.stderr


def test_a_worker_whose_store_is_down_at_start_exits_1_at_once_serving_nothing(tmp_path: Path) -> None:
    """Unlike the exporter, a worker needs its store to work at all: with the store
    down it fails fast, one line naming the URL and status 1 (README, "Exit
    statuses": a store that cannot be opened), so that its supervisor starts it again
    later, rather than look alive (its /healthz answering) while doing nothing."""
    from tests.observe.conftest import free_port

    url, metrics_port = f"aerospike://127.0.0.1:{_free_port()}/test", free_port()
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", url, "worker", "--handler", "json:dumps", "--list", "L",
         "--metrics-port", str(metrics_port)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"error: cannot connect to {url}") and "is the server running" in line, line
    assert time.monotonic() - started < 30, "failed fast, without waiting for the store"
