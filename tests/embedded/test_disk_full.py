"""The embedded store on a full disk: a write the file system refuses is an error
that says so, names the store and what to do (as a server at stop-writes answers:
code 8), and leaves nothing half-written: the same load run again, with room,
loads every job once.

The disk fills for real, for one process: `aeroqueue load` runs under a file
size limit (RLIMIT_FSIZE, with SIGXFSZ ignored, so that a write past it fails
with EFBIG instead of killing the process), which SQLite reports as it does a
full disk."""

from __future__ import annotations

import contextlib
import json
import resource
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from aeroqueue.backends import open_backend
from aeroqueue.lists import JobLists

N = 5000


def _limited(max_bytes: int):  # type: ignore[no-untyped-def]
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return apply


def _aq(url: str, *args: str, max_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aeroqueue", "--url", url, *args], capture_output=True, text=True, timeout=120,
        preexec_fn=_limited(max_bytes) if max_bytes else None,
    )


def test_a_load_onto_a_full_disk_says_so_and_a_rerun_with_room_loads_each_job_once(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    url = f"embedded://{store}"
    assert _aq(url, "--create", "init").returncode == 0
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"id": f"j{i}", "payload": {"text": "x" * 200, "i": i}}) + "\n"
                            for i in range(N)))
    # Room for the store as it is and a little more: a fraction of the jobs.
    room = max(p.stat().st_size for p in tmp_path.glob("store.db*")) + 200_000
    full = _aq(url, "load", "big", str(jobs), max_bytes=room)
    assert full.returncode == 1, (full.returncode, full.stderr[-2000:])
    said = full.stderr
    assert "internal error" not in said and "Traceback" not in said, said[-2000:]
    assert f"embedded store {store}" in said and "the file system refused the write" in said, said
    assert "make room" in said, said

    rerun = _aq(url, "load", "big", str(jobs))
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    said = rerun.stderr
    if "wait behind a load range" in said:
        # The full load's ranges hold the re-run's back until their lease runs out and
        # it recovers them; a recovery that failed meanwhile (a lock wait timing out on a
        # loaded machine: seen once in CI) leaves them to the next load, as it says.
        again = _aq(url, "load", "big", str(jobs))
        assert again.returncode == 0, again.stderr[-2000:]
        said += again.stderr
    backend = open_backend(url)
    try:
        lists = JobLists(backend)
        st = lists.status("big")
        assert (st.total, st.reservable) == (N, N), (st, said[-2000:])
        ids = Counter(j["jid"] for j in lists.jobs("big"))
        assert ids == Counter({f"j{i}": 1 for i in range(N)}), "each job id loaded exactly once"
    finally:
        backend.close()


@contextlib.contextmanager
def _immutable_with_a_list(db: Path, made_immutable: Path) -> Iterator[str]:
    """A store at `db` holding list L of two jobs, then `made_immutable` (the store file
    or its directory) made immutable (chattr +i: what a read-only mount does, even to
    root) for the block: the store's URL."""
    from aeroqueue import connect

    url = f"embedded://{db}"
    backend = connect(url, create=True)
    JobLists(backend).load("L", [("a", {}), ("b", {})])
    backend.close()
    if subprocess.run(["chattr", "+i", str(made_immutable)], capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a file immutable (chattr +i)")
    try:
        yield url
    finally:
        subprocess.run(["chattr", "-i", str(made_immutable)], check=True)


def test_a_store_file_the_process_may_not_write_says_so(tmp_path: Path) -> None:
    """A store on a read-only mount, or a file made immutable: every write failed as
    "internal error, OperationalError: attempt to write a readonly database". It names
    the store and what to check now, and nothing is written; reads still work."""
    db = tmp_path / "s.db"
    with _immutable_with_a_list(db, db) as url:
        out = _aq(url, "pause", "L")
        assert out.returncode == 1, out
        assert "internal error" not in out.stderr, out.stderr
        assert f"embedded store {db} is read-only to this process" in out.stderr, out.stderr
        assert "check the file's, its directory's and the mount's permissions" in out.stderr, out.stderr
        listed = _aq(url, "status", "L", "--json")
        assert listed.returncode == 0 and json.loads(listed.stdout)["paused"] is False, listed


def test_a_store_in_a_directory_the_process_may_not_write_is_not_called_no_store(tmp_path: Path) -> None:
    """A WAL store on a read-only mount (here its directory made immutable) cannot make
    its shared-memory file even to be read: that was "not an aeroqueue store", which
    invited making it again. It says the file or its directory is read-only."""
    home = tmp_path / "ro"
    home.mkdir()
    with _immutable_with_a_list(home / "s.db", home) as url:
        out = _aq(url, "status", "L")
        assert out.returncode == 1, out
        assert "not an aeroqueue store" not in out.stderr, out.stderr
        assert "cannot be opened by this process" in out.stderr and "is read-only to it" in out.stderr, out.stderr
