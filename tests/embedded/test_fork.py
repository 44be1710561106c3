"""An embedded store used across fork(): a child forked while the store is open
(``multiprocessing``'s default start method on Linux, a pre-fork server) must be
able to write, and must not keep the store locked for a parent that died.

The parent's other threads do not exist in the child: a lock one of them held at
the fork (the store's thread lock, the Lua runtime's) is never released there. And
a forked child shares its parent's open file descriptions, the store's kernel
write lock among them.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from aeroqueue import errors
from aeroqueue.backends import open_backend
from aeroqueue.backends.embedded import storage
from tests.waiting import wait_for

_fork = multiprocessing.get_context("fork")

SPIN = """
function spin(rec, n)
  local x = 0
  for i = 1, n do x = x + i end
  return x
end
"""


def _put_from_child(backend, key: str) -> None:
    backend.put("s", key, {"by": os.getpid()})


def _forked_writer(backend, key: str) -> multiprocessing.process.BaseProcess:
    """A child forked now that writes `key` through the parent's `backend`, and exits."""
    child = _fork.Process(target=_put_from_child, args=(backend, key), daemon=True)
    child.start()
    return child


def _joined(child: multiprocessing.process.BaseProcess, timeout_s: float) -> int | None:
    child.join(timeout_s)
    if child.exitcode is None:  # it hangs: the test fails, and leaves nothing behind
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        return None
    return child.exitcode


def test_a_child_forked_while_another_thread_writes_can_write(tmp_path: Path):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    inside = threading.Event()

    def write() -> None:
        with backend.client._storage.write() as db:
            db.execute("UPDATE meta SET v = v WHERE k = 'format'")
            inside.set()
            time.sleep(0.5)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert inside.wait(10)
    child = _forked_writer(backend, "from-child")
    writer.join(10)
    assert _joined(child, 20) == 0, "the child's write hung (on a lock held by a thread of the parent at the fork)"
    assert backend.get("s", "from-child").bins == {"by": child.pid}


def _apply_from_child(backend, key: str) -> None:
    assert backend.client.apply(backend.key("s", key), "spin", "spin", [10]) == 55


def test_a_child_forked_while_another_thread_runs_a_udf_can_run_udfs(tmp_path: Path):
    backend = open_backend(f"embedded://{tmp_path / 's.db'}")
    (tmp_path / "spin.lua").write_text(SPIN)
    backend.client.udf_put(str(tmp_path / "spin.lua"))
    out: dict = {}
    # Long enough (a few hundred ms) for the fork to happen inside it.
    spinning = threading.Thread(
        target=lambda: out.setdefault("sum", backend.client.apply(backend.key("s", "a"), "spin", "spin", [30_000_000])),
        daemon=True,
    )
    spinning.start()
    wait_for("the thread inside the UDF", backend.client._lua._lock.locked, 10, step_s=0.001)
    child = _fork.Process(target=_apply_from_child, args=(backend, "b"), daemon=True)
    child.start()
    spinning.join(30)
    assert out["sum"] == 30_000_000 * (30_000_000 + 1) // 2
    assert _joined(child, 20) == 0, "the child's UDF call hung (on a lock held by a thread of the parent at the fork)"


def _write_after_forking_a_helper(url: str, helper_pid, inside) -> None:
    backend = open_backend(url)
    backend.put("s", "before", {"a": 1})  # the store's lock file is open from here on
    pid = os.fork()
    if pid == 0:  # a helper process that outlives its parent and never touches the store
        time.sleep(60)
        os._exit(0)
    helper_pid.value = pid
    with backend.client._storage.write() as db:
        db.execute("UPDATE meta SET v = v WHERE k = 'format'")
        inside.set()
        time.sleep(60)  # SIGKILLed here, holding the store's write lock


def test_a_writer_killed_mid_write_leaves_the_store_unlocked_though_its_forked_child_lives(tmp_path: Path, monkeypatch):
    url = f"embedded://{tmp_path / 's.db'}"
    backend = open_backend(url)
    helper_pid, inside = _fork.Value("i", 0), _fork.Event()
    writer = _fork.Process(target=_write_after_forking_a_helper, args=(url, helper_pid, inside), daemon=True)
    writer.start()
    try:
        assert inside.wait(20), "the writer holds the store's write lock"
        os.kill(writer.pid, signal.SIGKILL)
        # Not join(): its helper holds the pipe join() waits on.
        assert wait_for("the writer dead", lambda: writer.exitcode, 10) == -signal.SIGKILL
        assert helper_pid.value and Path(f"/proc/{helper_pid.value}").exists(), "its helper lives on"
        monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 3.0)
        try:
            backend.put("s", "after", {"a": 2})
        except errors.BackendTimeout as e:
            pytest.fail(f"the dead writer's lock outlived it in its forked helper: {e}")
        assert backend.get("s", "after").bins == {"a": 2}
        assert backend.get("s", "before").bins == {"a": 1}
    finally:
        if helper_pid.value:
            with contextlib.suppress(ProcessLookupError):
                os.kill(helper_pid.value, signal.SIGKILL)
