"""Spark services as separate JVMs for tests: a standalone master and workers, and a
Spark Connect server, all started with PySpark's own ``bin/spark-class`` on loopback.

Each JVM runs in its own process group (the executors and Python workers it starts
join it), logs to a file in the test's directory, and is stopped by ``stop()`` however
the test ended: SIGTERM, then SIGKILL for the whole group. ``logs()`` gathers what they
printed, for a failing test to show.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kprod_broker import free_port
from tests.jvms import spark_home, with_test_jvm_options

SPARK_HOME = spark_home()  # the machine's (tests/jvms.py), as every other Spark JVM of the suite
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = SPARK_HOME / "bin" / "spark-submit"


class SparkServiceError(RuntimeError):
    """A Spark JVM did not come up (its log is in the message)."""


@dataclass
class _Service:
    """One JVM started by spark-class or spark-submit, logging to ``log``."""

    name: str
    command: Sequence[str]
    log: Path
    env: Mapping[str, str]
    process: subprocess.Popen | None = field(default=None, repr=False)

    def start(self) -> None:
        with open(self.log, "ab") as out:
            # spark-class (and spark-submit through it) execs java: the process is the JVM,
            # and its children (executors, Python workers) stay in the group that
            # start_new_session makes.
            self.process = subprocess.Popen(list(self.command), env=dict(self.env),
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")
        return ""

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """Block until the log matches ``pattern``; fail if the JVM exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            if self.process is not None and self.process.poll() is not None:
                raise SparkServiceError(f"{self.name} exited with {self.process.returncode}:\n{self.text()[-4000:]}")
            time.sleep(0.2)
        raise SparkServiceError(f"{self.name}: no {pattern!r} in its log after {timeout:.0f} s:\n{self.text()[-4000:]}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the JVM (a worker then stops its executors), then SIGKILL whatever of
        its process group is left."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def spark_env(python: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for Spark JVMs on loopback whose Python workers run ``python``.

    PYTHONPATH is dropped: what executors can import is then only what their Python has
    installed or what the job ships, as on a real cluster.
    """
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONPATH", None)
    env.update({
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
    })
    return with_test_jvm_options(env)


class StandaloneCluster:
    """A standalone master and ``workers`` workers (``cores`` and ``memory`` each) on
    127.0.0.1; ``url`` is what ``spark-submit --master`` takes. A context manager."""

    def __init__(self, directory: Path, env: Mapping[str, str], workers: int = 2, cores: int = 1,
                 memory: str = "1g") -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        env = {**env, "SPARK_DAEMON_MEMORY": "256m"}  # the heap of the master and the workers
        self.master = _Service("master", [
            str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(free_port())], directory / "master.log", env)
        self.workers = [
            _Service(f"worker-{i}", [
                str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--webui-port", str(free_port()),
                "--cores", str(cores), "--memory", memory, "--work-dir", str(directory / f"worker-{i}"), self.url],
                directory / f"worker-{i}.log", env)
            for i in range(workers)]

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker has registered."""
        try:
            self.master.start()
            self.master.wait_for(r"New state: ALIVE", timeout)
            for worker in self.workers:
                worker.start()
            for worker in self.workers:
                worker.wait_for(r"Successfully registered with master", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def executor_logs(self) -> str:
        """What every executor printed (its stderr: the sink's task lines, Python errors)."""
        parts = []
        for path in sorted(self.directory.glob("worker-*/app-*/*/stderr")):
            parts.append(f"--- {path.relative_to(self.directory)}\n{path.read_text(errors='replace')[-6000:]}")
        return "\n".join(parts)

    def logs(self) -> str:
        """The master's, the workers' and the executors' logs, ends only."""
        parts = [f"--- {s.name}\n{s.text()[-4000:]}" for s in (self.master, *self.workers)]
        return "\n".join([*parts, self.executor_logs()])

    def stop(self) -> None:
        """Workers first (each stops its executors), then the master."""
        for service in (*self.workers, self.master):
            service.stop()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ConnectServer:
    """A Spark Connect server (local master ``master``) on 127.0.0.1; ``url`` is what
    ``SparkSession.builder.remote`` takes. Its Python workers run the ``PYSPARK_PYTHON``
    of ``env``. A context manager."""

    def __init__(self, directory: Path, env: Mapping[str, str], master: str = "local[2]",
                 conf: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        settings = {"spark.connect.grpc.binding.address": "127.0.0.1",
                    "spark.connect.grpc.binding.port": str(self.port),
                    "spark.ui.enabled": "false", **(conf or {})}
        # The launcher sizes a Connect server's heap as a daemon's, not as a driver's.
        env = {**env, "SPARK_DAEMON_MEMORY": "768m"}
        self.server = _Service("connect-server", [
            str(SPARK_SUBMIT), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", "kprod Spark Connect test", "--master", master,
            *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}"))],
            directory / "connect-server.log", env)

    def start(self, timeout: float = 120.0) -> ConnectServer:
        """Start the server; return once it listens."""
        try:
            self.server.start()
            self.server.wait_for(r"Spark Connect server started", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def logs(self) -> str:
        return f"--- {self.server.name}\n{self.server.text()[-8000:]}"

    def stop(self) -> None:
        self.server.stop()

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
