"""A Schema Registry on loopback for kprod's tests and jobs: Apicurio Registry, which serves
Confluent's REST API under ``/apis/ccompat/v7``, in memory.

Apicurio publishes its server ready to run on Maven Central
(``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``, 142 MB); it is fetched with
the Ivy that PySpark ships into ``$KPROD_CACHE`` (``~/.cache/kprod``) and unpacked there
once (146 MB), as Kafka's jars are. 2.6 runs on Java 17 (3.x needs 21).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kprod_broker.cluster import check_port_free, free_port
from kprod_broker.jars import KafkaUnavailableError, java, maven_archive

APICURIO_VERSION = "2.6.13.Final"
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryServerError(KafkaUnavailableError):
    """The local Schema Registry cannot be fetched or started here (no Java 17, no network
    to Maven Central, a server that exits or never answers)."""


def apicurio_jar(version: str = APICURIO_VERSION) -> Path:
    """Apicurio's runnable jar (its libraries beside it), fetched and unpacked on first use."""
    home = maven_archive(f"apicurio-registry-{version}", f"io.apicurio:apicurio-registry-app:{version}", "all")
    jar = home / f"apicurio-registry-app-{version}-runner.jar"
    if not jar.is_file():
        raise RegistryServerError(f"no {jar.name} in {home}: remove that directory to fetch it again")
    return jar


class LocalRegistry:
    """Apicurio Registry in its own JVM on 127.0.0.1, storing schemas in memory; ``url`` is
    its Confluent-compatible API (what a Schema Registry client takes as its url). A
    context manager.

    The global compatibility level is set to ``compatibility`` (Confluent's default,
    BACKWARD; Apicurio's own is NONE). Lookups match a schema by its canonical form, as
    Confluent's registry does (Apicurio's default compares the text byte for byte).
    """

    def __init__(self, *, compatibility: str = "BACKWARD", heap: str = "256m", jvm_args: Sequence[str] = (),
                 start_timeout: float = 120.0, version: str = APICURIO_VERSION, port: int | None = None) -> None:
        if port is not None:
            check_port_free(port)  # before the 142 MB fetch, not found in the server's log after
        jar = apicurio_jar(version)
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}/apis/ccompat/v7"
        self.dir = Path(tempfile.mkdtemp(prefix="kprod-registry-"))
        self.log_path = self.dir / "registry.log"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                # One GC thread: the heap is small, and a test machine's cores are the tests'.
                [java(), f"-Xmx{heap}", "-XX:+UseSerialGC", *jvm_args,
                 "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
                 "-Dregistry.ccompat.use-canonical-hash=true",
                 # One line per request otherwise.
                 '-Dquarkus.log.category."io.apicurio.common.apps.logging.audit".level=WARN',
                 "-jar", str(jar)],
                cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)  # a Ctrl-C in the caller's terminal is the caller's to handle
        try:
            self._wait_ready(start_timeout)
            try:
                self._request("PUT", "/config", {"compatibility": compatibility})
            except OSError as exc:
                raise RegistryServerError(f"Apicurio Registry at {self.url} refused compatibility "
                                          f"{compatibility}: {exc}") from exc
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RegistryServerError(
                    f"Apicurio Registry exited with code {self.process.returncode} (it needs Java 17 or newer); "
                    f"its log ({self.log_path}) ends:\n{self.log_tail()}")
            with contextlib.suppress(OSError):  # refused until it listens; urllib's errors are OSErrors
                self._request("GET", "/config")
                return
            if time.monotonic() > deadline:
                raise RegistryServerError(f"Apicurio Registry did not answer on {self.url} within {timeout:.0f} s; "
                                          f"its log ({self.log_path}) ends:\n{self.log_tail()}")
            time.sleep(0.2)

    def _request(self, method: str, path: str, body: object = None) -> object:
        import urllib.request  # here: importing kprod_broker need not load http and ssl

        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def log_tail(self, chars: int = 4000) -> str:
        """The end of what the server printed."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (Quarkus stops in well under a second), SIGKILL after ``timeout``; the
        working directory is removed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_registry(**kwargs: Any) -> LocalRegistry:
    """A running Apicurio Registry on loopback (``.url``, ``.stop()``); see LocalRegistry."""
    return LocalRegistry(**kwargs)
