"""A real headless browser (Debian's chromium and chromium-driver, driven by selenium).

`make test` installs chromium and chromium-driver when they are missing; without
them the browser tests skip here and fail in CI (`require`).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--window-size=1400,1000",
)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One headless Chromium for the session, with a new empty profile."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    require(chromium is not None and driver is not None,
            "chromium and chromium-driver are not installed (`make test` installs them with apt-get)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        require(False, "selenium is not installed (pip install -e '.[dev]')")
        raise
    # Never let Selenium Manager look for (or download) a browser or driver.
    os.environ.setdefault("SE_OFFLINE", "true")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(str(driver)), options=options)
    drv.set_page_load_timeout(30)
    try:
        yield drv
    finally:
        drv.quit()


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """A WSGI app on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="dashboard", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def screenshot_dir() -> Callable[[str], Path] | None:
    """Where to save a screenshot when AEROQUEUE_SCREENSHOTS names a directory (else None)."""
    where = os.environ.get("AEROQUEUE_SCREENSHOTS")
    if not where:
        return None
    Path(where).mkdir(parents=True, exist_ok=True)
    return lambda name: Path(where) / f"{name}.png"


ROOT = Path(__file__).resolve().parents[2]


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "w") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "aeroqueue", *args], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=stderr,
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
