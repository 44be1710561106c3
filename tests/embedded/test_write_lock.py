"""The embedded store's kernel write lock (flock on `<store>.lock`) across threads and processes."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import threading
import time
import types

import pytest

from aeroqueue.backends.embedded import storage
from aeroqueue.backends.embedded.storage import Storage
from tests.waiting import wait_for

# Another process on the store's lock file, driven line by line: "lock" waits for
# the lock, "unlock" lets it go, "try" reports whether it could take it now.
_OTHER_PROCESS = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "lock":
        fcntl.flock(fd, fcntl.LOCK_EX)
        answer = "locked"
    elif cmd == "unlock":
        fcntl.flock(fd, fcntl.LOCK_UN)
        answer = "unlocked"
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            answer = "busy"
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            answer = "got"
    print(answer, flush=True)
"""


class OtherProcess:
    def __init__(self, lock_path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _OTHER_PROCESS, lock_path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def __call__(self, cmd: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(10)


def _waiting_in_lock_file(thread: threading.Thread) -> bool:
    """`thread` is blocked on a thread primitive (not in flock) inside Storage._lock_file."""
    frame = sys._current_frames().get(thread.ident or -1)
    if frame is None or not frame.f_code.co_filename.endswith("threading.py"):
        return False
    while frame is not None:
        if frame.f_code.co_name == "_lock_file":
            return True
        frame = frame.f_back
    return False


def test_a_timed_out_writers_late_lock_does_not_leave_the_next_write_unlocked(tmp_path, monkeypatch):
    """A write that timed out behind another process leaves its flock queued (a helper
    thread), and that thread lets the lock go when it finally gets it. flock locks
    belong to the open file description, which all threads of a process share: a next
    write of the process that asked for the lock in between was granted at once (the
    description held it already), and then wrote while the helper let go, so another
    process took the lock in the middle of that write."""
    path = str(tmp_path / "s.db")
    store = Storage(path)
    other = OtherProcess(path + ".lock")
    real_flock = fcntl.flock
    late_waiter: list[threading.Thread] = []
    waiter_has_lock = threading.Event()
    waiter_goes_on = threading.Event()

    def flock(fd: int, op: int) -> None:
        real_flock(fd, op)
        if op == fcntl.LOCK_EX and threading.current_thread().name == "aeroqueue-store-lock" and not late_waiter:
            # The timed-out write's helper, just granted the lock: hold it in the window
            # before it acts on the lock.
            late_waiter.append(threading.current_thread())
            waiter_has_lock.set()
            waiter_goes_on.wait(30)

    monkeypatch.setattr(storage, "fcntl", types.SimpleNamespace(
        flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB, LOCK_UN=fcntl.LOCK_UN
    ))
    monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 0.2)
    writing = threading.Event()
    write_ends = threading.Event()
    errors: list[BaseException] = []

    def next_write() -> None:
        try:
            with store.write() as db:
                writing.set()
                db.execute("INSERT INTO meta (k, v) VALUES ('h1', 'next write')")
                write_ends.wait(30)
        except BaseException as e:
            errors.append(e)

    try:
        assert other("lock") == "locked"
        with pytest.raises(Exception, match="locked for 0 s"), store.write():
            pass
        assert other("unlock") == "unlocked"
        assert waiter_has_lock.wait(10), "the timed-out write's flock was granted"
        writer = threading.Thread(target=next_write)
        writer.start()
        wait_for("the next write writing, or waiting for the queued lock",
                 lambda: writing.is_set() or _waiting_in_lock_file(writer), 10, step_s=0.01)
        waiter_goes_on.set()
        late_waiter[0].join(10)
        assert not late_waiter[0].is_alive()
        assert writing.wait(10), f"the next write got the lock {errors}"
        assert other("try") == "busy", "another process took the store's lock in the middle of a write"
        write_ends.set()
        writer.join(10)
        assert not errors
        assert other("try") == "got", "the write let the lock go"
        with store.write() as db:
            assert db.execute("SELECT v FROM meta WHERE k = 'h1'").fetchone() == ("next write",)
    finally:
        waiter_goes_on.set()
        write_ends.set()
        other.close()
        store.close()


def test_a_timed_out_writers_late_lock_is_let_go_when_no_write_wants_it(tmp_path, monkeypatch):
    """Nobody writes after the timeout: the queued flock, once granted, must not keep
    the store locked for every other process."""
    path = str(tmp_path / "s.db")
    store = Storage(path)
    other = OtherProcess(path + ".lock")
    monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 0.2)
    try:
        assert other("lock") == "locked"
        for _ in range(2):  # the second write waits on the first one's queued flock
            with pytest.raises(Exception, match="locked for 0 s"), store.write():
                pass
        assert other("unlock") == "unlocked"
        wait_for("the store's lock let go", lambda: other("try") == "got", 10, step_s=0.01)
        with store.write() as db:
            db.execute("INSERT INTO meta (k, v) VALUES ('h1', 'later write')")
        assert other("try") == "got"
    finally:
        other.close()
        store.close()


def test_a_store_closed_while_a_timed_out_flock_waits_leaves_the_descriptor_to_it(tmp_path, monkeypatch):
    """The store closes while a timed-out write's flock is still queued: the waiter
    closes the descriptor once its flock returns (which lets the lock go), rather
    than unlocking a descriptor number the store closed, by then another file's or
    none (an exception in the lock's thread)."""
    path = str(tmp_path / "s.db")
    store = Storage(path)
    other = OtherProcess(path + ".lock")
    monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 0.2)
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    waiters: list[threading.Thread] = []
    try:
        assert other("lock") == "locked"
        before = set(threading.enumerate())  # not another test's waiters, if any live on
        with pytest.raises(Exception, match="locked for 0 s"), store.write():
            pass
        waiters = [t for t in set(threading.enumerate()) - before if t.name == "aeroqueue-store-lock"]
        assert waiters, "the timed-out write's flock is queued in a thread"
        store.close()
        assert other("unlock") == "unlocked"
        for t in waiters:
            t.join(10)
            assert not t.is_alive()
        assert not failures, failures
        assert other("try") == "got", "the store's lock let go"
    finally:
        other.close()
        store.close()


def test_every_thread_behind_a_held_store_times_out_after_the_busy_timeout(tmp_path, monkeypatch):
    """Threads of one process writing while another process holds the store (stopped
    inside a write): each queued on the process's thread lock first, and then waited
    its own full busy timeout for the store's lock, so the k-th got its TimeoutError
    after k times that (a worker's heartbeat behind 8 request threads: 9 minutes, not
    1, before it could count its session lost). Each now gives up after the busy
    timeout in all."""
    monkeypatch.setattr(storage, "BUSY_TIMEOUT_S", 1.0)
    path = str(tmp_path / "s.db")
    store = Storage(path)
    other = OtherProcess(path + ".lock")
    try:
        assert other("lock") == "locked"
        waited: list[float] = []
        codes: list[object] = []

        def write(i: int) -> None:
            started = time.monotonic()
            try:
                with store.write() as db:
                    db.execute("INSERT INTO meta (k, v) VALUES (?, 'never')", (f"t{i}",))
            except Exception as e:
                codes.append(getattr(e, "code", e))
            waited.append(time.monotonic() - started)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert codes == [9] * 4, codes
        # The timeout's length is under test, so a bound, but a generous one: the k-th
        # thread waited k timeouts (the 4th, 4 s), and a loaded machine adds to each wait.
        assert max(waited) < 3.0, f"waits before the timeout: {sorted(round(w, 2) for w in waited)}"
    finally:
        other("unlock")
        other.close()
        store.close()
