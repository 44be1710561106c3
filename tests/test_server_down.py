"""A server that stops under a connected client: the commands say the server is down,
not what the client makes of it ("Partition query not supported by connected
server", as if the server were too old for scans). A node of its own, started from
../shared/aerospike and stopped by the test: the shared test servers stay up."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from aeroqueue import errors
from aeroqueue.backends import open_backend
from aeroqueue.cli import main
from aeroqueue.lists import JobLists
from tests.conftest import port_open, require

SERVER = Path(__file__).resolve().parents[2] / "shared" / "aerospike" / "server"


def _free_port() -> int:
    """Four free ports in a row (service, fabric, heartbeat, admin), above the range
    .ci/run gives its nodes (3100-3199) and the default node's (3000)."""
    for port in range(3400, 3500, 4):
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
