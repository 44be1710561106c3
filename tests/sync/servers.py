"""Servers the fault and cluster tests start and stop themselves: a MariaDB of
their own (never the machine's), and a Spark standalone master and worker from
the installed pyspark. Loopback only; each stops what it started."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from aeroqueue.sync.job import DRIVER_JVM_OPTIONS
from tests.conftest import port_open
from tests.waiting import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnMariaDB:
    """A mariadbd on its own port with its own datadir, which a test may stop and restart."""

    def __init__(self, root: Path, *extra_args: str) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.extra_args = extra_args  # server options of the test's own

    @staticmethod
    def available() -> bool:
        return bool(shutil.which("mariadbd") and shutil.which("mariadb-install-db"))

    def install(self) -> None:
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={self.root / 'data'}", "--user=root",
             "--auth-root-authentication-method=normal", "--skip-test-db"],
            check=True, capture_output=True, timeout=120,
        )

    def start(self) -> None:
        path = self.root / "mariadbd.log"
        ready_before = path.read_bytes().count(b"ready for connections") if path.exists() else 0
        log = open(path, "ab")  # noqa: SIM115 - held by the child
        self.proc = subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={self.root / 'data'}", "--user=root", f"--port={self.port}",
             "--bind-address=127.0.0.1", f"--socket={self.root / 'sock'}", f"--pid-file={self.root / 'pid'}",
             # A throwaway server for one test: anyone on loopback is root.
             "--skip-grant-tables", "--innodb-buffer-pool-size=32M", "--skip-log-bin", *self.extra_args],
            stdout=log, stderr=log,
        )
        proc = self.proc

        def ready() -> bool:
            # Its own log, not the port alone: a port free when chosen may be another
            # process's by now, and then the port answers while our server has exited.
            assert proc.poll() is None, f"mariadbd exited: {path.read_text(errors='replace')[-2000:]}"
            return path.read_bytes().count(b"ready for connections") > ready_before and port_open("127.0.0.1", self.port)

        wait_for(f"mariadbd ready on port {self.port}", ready, 60, step_s=0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.proc = None


def spark_scratch_env(directory: Path) -> dict[str, str]:
    """The environment that makes a Spark started under it keep its scratch in
    `directory` (made here), not in /tmp: its `spark-*` and `blockmgr-*` directories
    (SPARK_LOCAL_DIRS) and what the JVMs put in java.io.tmpdir (lz4's native library):
    the driver's through SPARK_SUBMIT_OPTS, which the launcher adds to the driver JVM's
    options without a word on stderr (JAVA_TOOL_OPTIONS prints one, and tests compare
    stderr), and a standalone cluster's executors' through spark-defaults.conf, which
    the driver reads from SPARK_CONF_DIR (the sync sets no executor options)."""
    conf = directory / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "spark-defaults.conf").write_text(f"spark.executor.extraJavaOptions -Djava.io.tmpdir={directory}\n")
    submit_opts = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} -Djava.io.tmpdir={directory}".strip()
    return {"SPARK_LOCAL_DIRS": str(directory), "SPARK_SUBMIT_OPTS": submit_opts, "SPARK_CONF_DIR": str(conf)}


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class SparkCluster:
    """A standalone master and one worker on 127.0.0.1, started with `spark-class`:
    two test processes (tests/run.py's parts) may each run one at once.

    Spark picks the master's ports and the cluster reads them from the master's log.
    Ports chosen beforehand raced: a port free when chosen was another process's by
    the time the master bound it, and Spark then moves to the next port without
    failing, so the test read another Spark's page (seen in CI: an HTML page where
    the master's JSON was expected)."""

    def __init__(self, root: Path, cores: int = 2) -> None:
        self.root = root
        self.cores = cores
        self.master_port = 0
        self.ui_port = 0
        self.procs: list[subprocess.Popen] = []
        self.url = ""

    def _env(self) -> dict[str, str]:
        # The master and worker daemons only schedule, as the sync's driver: its JVM options.
        # Their scratch, and the executors' local directories (under the worker's), stay
        # under the cluster's root: tests kill executors, which leave theirs behind.
        scratch = spark_scratch_env(self.root / "scratch")
        return {**os.environ, **scratch, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1",
                "SPARK_LOG_DIR": str(self.root), "PYSPARK_PYTHON": sys.executable,
                "SPARK_DAEMON_JAVA_OPTS": f"{DRIVER_JVM_OPTIONS} -Djava.io.tmpdir={self.root / 'scratch'}"}

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - held by the child
        proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=self._env(),
                                stdout=log, stderr=log, start_new_session=True)
        self.procs.append(proc)
        return proc

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def start(self) -> None:
        master = self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                             "--port", "0", "--webui-port", "0")
        log = self.root / "master.log"

        def bound() -> bool:
            assert master.poll() is None, f"the Spark master exited: {log.read_text(errors='replace')[-2000:]}"
            found = dict(re.findall(r"Successfully started service '(sparkMaster|MasterUI)' on port (\d+)",
                                    log.read_text(errors="replace")))
            if len(found) < 2:
                return False
            self.master_port, self.ui_port = int(found["sparkMaster"]), int(found["MasterUI"])
            return True

        wait_for("the Spark master's ports in its log", bound, 90, step_s=0.2)
        self.url = f"spark://127.0.0.1:{self.master_port}"
        self.worker = self._start(
            "worker", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
            "--cores", str(self.cores), "--memory", "1g", "--webui-port", "0",
            "--work-dir", str(self.root / "work"),
        )

        def worker_alive() -> bool:
            try:
                return any(w.get("state") == "ALIVE" for w in self.state().get("workers", []))
            except OSError:
                return False

        wait_for("the Spark worker registered", worker_alive, 90, step_s=0.2)

    def executors(self) -> list[int]:
        """Pids of the executor JVMs our worker launched (its child processes)."""
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.worker.pid:
                cmdline = (stat.parent / "cmdline").read_bytes()
                if b"CoarseGrainedExecutorBackend" in cmdline:
                    out.append(int(stat.parent.name))
        return out

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


class TcpProxy:
    """A proxy process in front of a local port (tcp_proxy.py): a database that a test
    kills (SIGKILL: every connection through it drops at once) and brings back on the
    same port, without stopping the machine's server that others use."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("tcp_proxy.py")), str(self.port), str(self.target_port)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready", "the proxy did not start"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
