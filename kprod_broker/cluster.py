"""Apache Kafka on loopback: KRaft nodes (broker and controller in one JVM) for tests,
jobs, benchmarks and local development (``kprod-broker``).

Each node gets its own directory holding its properties, its storage and ``server.log``,
everything the JVM printed, so a failing test can show what the broker said. The jars
come from ``kprod_broker.jars``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kprod_broker.jars import KAFKA_VERSION, KafkaUnavailableError, cache_dir, java, kafka_classpath

# Every port free_port handed out in this process: the kernel may offer a port again
# before the first taker binds it, and a node given one port for two listeners (seen in
# the suite: "two listeners on the same port") does not start.
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port() -> int:
    """A loopback TCP port that was free a moment ago, never one this process was
    handed before."""
    with _handed_out_lock:
        while True:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def check_port_free(port: int) -> None:
    """Raise KafkaUnavailableError naming ``port`` if a listener on 127.0.0.1 cannot bind
    it: said before the JVM starts, not found in its log after."""
    if not 0 < port < 65536:
        raise KafkaUnavailableError(f"port {port}: expected a TCP port, 1 to 65535")
    with socket.socket() as s:
        # As the JVM's server socket (SO_REUSEADDR): a closed connection's TIME_WAIT does
        # not hold the port, a listener does.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise KafkaUnavailableError(
                f"port {port} on 127.0.0.1 is taken ({exc.strerror}): another broker or program listens "
                "there; stop it or choose another port") from exc


_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""
# The same for Kafka 3, which logs through log4j 1 (reload4j).
_LOG4J1 = """\
log4j.rootLogger=INFO, out
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.request.logger=WARN
"""


# A node's formatted storage is its meta.properties (its id, the cluster's, a random
# directory id) and bootstrap.checkpoint: the metadata version, finalized features and
# SCRAM credentials, the same for every node of a cluster and every cluster of its shape.
# StorageTool's JVM (a second of CPU) runs once per shape: its checkpoint is kept here by
# KafkaCluster.format_shape, and in the cache directory unless it holds SCRAM credentials,
# and copied to the other nodes.
_FORMAT_FILES = ["bootstrap.checkpoint", "meta.properties"]
_FORMATTED: dict[tuple, bytes] = {}
_FORMATTED_LOCK = threading.Lock()
# Settings that place the storage elsewhere than the node's data directory.
_PLACED_BY_CONFIG = {"log.dirs", "log.dir", "metadata.log.dir", "controller.quorum.bootstrap.servers"}


def _format_file(shape: tuple) -> Path | None:
    """Where the checkpoint of ``shape`` is kept between processes; None for a shape with
    SCRAM users (their credentials stay in the nodes' own directories)."""
    version, _, scram_users, _ = shape
    if scram_users:
        return None
    digest = hashlib.sha256(repr(shape).encode()).hexdigest()[:16]
    return cache_dir() / "kafka-format" / f"{version}-{digest}.checkpoint"


def _formatted(shape: tuple) -> bytes | None:
    """The bootstrap checkpoint StorageTool wrote for ``shape``, if it ran before."""
    with _FORMATTED_LOCK:
        found = _FORMATTED.get(shape)
    path = _format_file(shape)
    if found is None and path is not None:
        with contextlib.suppress(OSError):
            found = path.read_bytes() or None
        if found is not None:
            with _FORMATTED_LOCK:
                _FORMATTED[shape] = found
    return found


def _keep_formatted(shape: tuple, checkpoint: bytes) -> None:
    """Keep the checkpoint StorageTool wrote for ``shape``: in this process, and in the
    cache directory where ``_format_file`` allows."""
    with _FORMATTED_LOCK:
        _FORMATTED[shape] = checkpoint
    path = _format_file(shape)
    if path is not None:
        # Written aside and renamed: a process reading it meanwhile never sees a part.
        partial = path.with_suffix(f".{os.getpid()}.partial")
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(checkpoint)
            partial.replace(path)


@dataclass(frozen=True)
class Listener:
    """A client listener besides the plain one every node has.

    ``protocol`` is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL; ``config`` holds its own
    settings without the ``listener.name.<name>.`` prefix (``ssl.client.auth``, JAAS, ...).
    ``port`` fixes the listener's port and ``advertised_port`` puts another one (a proxy in
    front) in metadata; both are for one-node clusters. ``node_ports`` and
    ``advertised_node_ports`` do the same per node id.
    """

    name: str
    protocol: str = "PLAINTEXT"
    config: Mapping[str, str] = field(default_factory=dict)
    port: int | None = None
    advertised_port: int | None = None
    node_ports: Mapping[int, int] = field(default_factory=dict)
    advertised_node_ports: Mapping[int, int] = field(default_factory=dict)


class KafkaNode:
    """One KRaft node (broker and controller) in its own JVM."""

    def __init__(self, cluster: KafkaCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.dir = cluster.dir / f"node-{node_id}"
        self.port = cluster.port if cluster.port is not None else free_port()
        self.controller_port = free_port()
        self.listener_ports = {listener.name: listener.port or listener.node_ports.get(node_id) or free_port()
                               for listener in cluster.listeners}
        self.log_path = self.dir / "server.log"
        self.process: subprocess.Popen | None = None
        self._log_start = 0  # where in the log the JVM started last began writing

    @property
    def address(self) -> str:
        """host:port of the plain listener."""
        return f"127.0.0.1:{self.port}"

    def properties(self) -> dict[str, str]:
        c = self.cluster
        names = ["INTERNAL", "CONTROLLER", *self.listener_ports]
        ports = [self.port, self.controller_port, *self.listener_ports.values()]
        advertised = [f"INTERNAL://127.0.0.1:{self.port}"] + [
            f"{lst.name}://127.0.0.1:"
            f"{lst.advertised_port or lst.advertised_node_ports.get(self.node_id) or self.listener_ports[lst.name]}"
            for lst in c.listeners]
        protocols = {"INTERNAL": "PLAINTEXT", "CONTROLLER": "PLAINTEXT",
                     **{lst.name: lst.protocol for lst in c.listeners}}
        replicas = str(min(3, c.size))
        min_isr = "2" if c.size >= 3 else "1"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": c.voters,
            "listeners": ",".join(f"{n}://127.0.0.1:{p}" for n, p in zip(names, ports)),
            "advertised.listeners": ",".join(advertised),
            "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in protocols.items()),
            "inter.broker.listener.name": "INTERNAL",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            # Internal topics of 50 partitions each cost seconds to create on two cores.
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # The controller's liveness records every 5 s instead of every 0.5 s: an idle
            # node then uses about a quarter less CPU.
            "metadata.max.idle.interval.ms": "5000",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        if c.size > 1:
            # A killed node is fenced (and its partitions move) after 3 s instead of 9. A
            # single node keeps Kafka's heartbeats (2 s): a quarter less CPU when idle.
            props.update({"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"})
        for lst in c.listeners:
            props.update({f"listener.name.{lst.name.lower()}.{k}": v for k, v in lst.config.items()})
        props.update(c.config)
        return props

    def format(self) -> None:
        """Write the properties and format the storage (with the cluster's SCRAM users):
        with StorageTool the first time a node of the cluster's shape is formatted, else
        with the bootstrap metadata that run wrote (``_formatted``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.dir / "log4j2.properties").write_text(_LOG4J2)
        (self.dir / "log4j.properties").write_text(_LOG4J1)
        shape = self.cluster.format_shape()
        bootstrap = _formatted(shape) if shape is not None else None
        if bootstrap is not None:
            self._format_from(bootstrap)
            return
        self._storage_tool(config)
        data = self.dir / "data"
        # Only the two files this Kafka's StorageTool writes are copied; one that writes
        # more is run for every node.
        if shape is not None and sorted(p.name for p in data.iterdir()) == _FORMAT_FILES:
            _keep_formatted(shape, (data / "bootstrap.checkpoint").read_bytes())

    def _format_from(self, bootstrap: bytes) -> None:
        """Format as StorageTool does, without its JVM: ``bootstrap.checkpoint`` as given,
        and ``meta.properties`` naming this node, the cluster and a new directory."""
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        (data / "bootstrap.checkpoint").write_bytes(bootstrap)
        (data / "meta.properties").write_text(
            f"version=1\ncluster.id={self.cluster.cluster_id}\nnode.id={self.node_id}\n"
            f"directory.id={_kafka_uuid()}\n")

    def _storage_tool(self, config: Path) -> None:
        """Format the storage with Kafka's StorageTool, in a JVM of its own."""
        scram = [arg for user in self.cluster.scram_users for arg in ("--add-scram", user)]
        features = [arg for name, level in self.cluster.features.items() for arg in ("--feature", f"{name}={level}")]
        result = subprocess.run(
            [java(), *self._jvm_args(), "-cp", kafka_classpath(self.cluster.version), *self._log_args(),
             "kafka.tools.StorageTool", "format",
             f"--cluster-id={self.cluster.cluster_id}", "--config", str(config), *scram, *features],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode != 0:
            raise KafkaUnavailableError(f"formatting node {self.node_id} failed:\n{result.stdout}{result.stderr}")

    def _log_args(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
                f"-Dlog4j.configuration=file:{self.dir / 'log4j.properties'}"]

    def _jvm_args(self) -> list[str]:
        """The cluster's own JVM options, then KAFKA_OPTS (as Kafka's scripts read it)."""
        return [*self.cluster.jvm_args, *shlex.split(os.environ.get("KAFKA_OPTS", ""))]

    def start(self) -> None:
        """Start the JVM (storage already formatted); returns without waiting for it."""
        if self.alive:
            return
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java(), f"-Xmx{self.cluster.heap}", f"-Xms{self.cluster.heap}", "-XX:+UseG1GC",
                 "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true", *self._log_args(),
                 *self._jvm_args(), "-cp", kafka_classpath(self.cluster.version), "kafka.Kafka",
                 str(self.dir / "server.properties")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def started(self) -> bool:
        """Whether the JVM started last has logged that it serves (``Kafka Server started``)."""
        with contextlib.suppress(OSError), open(self.log_path, "rb") as log:
            log.seek(self._log_start)
            return b"Kafka Server started" in log.read()
        return False

    @property
    def running(self) -> subprocess.Popen | None:
        """The node's process while it runs, else None."""
        process = self.process
        return process if process is not None and process.poll() is None else None

    @property
    def alive(self) -> bool:
        return self.running is not None

    @property
    def pid(self) -> int | None:
        process = self.running
        return process.pid if process is not None else None

    @property
    def exit_code(self) -> int | None:
        """How the node's process ended; None while it runs or before it starts."""
        return self.process.poll() if self.process is not None else None

    def wait(self) -> int:
        """Block until the node's process exits; its exit code."""
        if self.process is None:
            raise KafkaUnavailableError(f"Kafka node {self.node_id} was never started")
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL: the node dies without a controlled shutdown, as in a crash."""
        process = self.running
        if process is not None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """A controlled shutdown (SIGTERM), then SIGKILL if it takes longer than ``timeout``."""
        process = self.running
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 4000) -> str:
        """The end of what the node printed."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""


class KafkaCluster:
    """Apache Kafka nodes on loopback; ``bootstrap`` names the plain listeners. A context manager.

    One node by default; with three or more, topics default to replication factor 3 and
    ``min.insync.replicas`` 2. ``scram_users`` are StorageTool ``--add-scram`` values,
    e.g. ``SCRAM-SHA-256=[name=alice,password=secret]``. ``config`` overrides node settings.
    ``features`` sets finalized feature levels when the storage is formatted (StorageTool
    ``--feature``), e.g. ``{"transaction.version": 1}`` for a cluster without transaction
    protocol v2 (Kafka 4.x finalizes 2 by default).
    Each JVM gets ``jvm_args`` and then the options in the ``KAFKA_OPTS`` environment
    variable, which Kafka's own scripts read too. ``port`` fixes a one-node cluster's plain
    listener (else a free port is taken); a taken port is refused before anything starts.
    """

    def __init__(self, nodes: int = 1, *, listeners: Sequence[Listener] = (), config: Mapping[str, str] | None = None,
                 scram_users: Sequence[str] = (), features: Mapping[str, int] | None = None, heap: str = "512m",
                 jvm_args: Sequence[str] = (), start_timeout: float = 90.0, workdir: str | None = None,
                 version: str = KAFKA_VERSION, port: int | None = None) -> None:
        if port is not None:
            if nodes != 1:
                raise ValueError(f"port fixes the plain listener of one node; this cluster has {nodes}")
            check_port_free(port)
        self.port = port
        self.version = version
        self.listeners = tuple(listeners)
        self.config = dict(config or {})
        self.scram_users = tuple(scram_users)
        self.features = dict(features or {})
        self.heap = heap
        self.jvm_args = tuple(jvm_args)
        self.cluster_id = _cluster_id()
        self.size = nodes
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="kprod-kafka-"))
        self.nodes = [KafkaNode(self, i) for i in range(1, nodes + 1)]
        self.voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        try:
            for node in self.nodes:
                node.format()
            for node in self.nodes:
                node.start()
            self.wait_ready(start_timeout)
        except BaseException:
            self.stop()
            raise

    def format_shape(self) -> tuple | None:
        """What StorageTool's output depends on besides a node's own id and directory:
        nodes of one shape share it (``KafkaNode.format``). None where the storage is
        placed by ``config``: StorageTool then formats each node."""
        if _PLACED_BY_CONFIG.intersection(self.config):
            return None
        unstable = sorted((k, v) for k, v in self.config.items() if k.startswith("unstable."))
        return self.version, tuple(sorted(self.features.items())), self.scram_users, tuple(unstable)

    @property
    def bootstrap(self) -> str:
        """Every node's plain listener."""
        return ",".join(n.address for n in self.nodes)

    def listener_bootstrap(self, name: str) -> str:
        """Every node's address on the listener ``name`` (its own port, not the advertised one)."""
        return ",".join(f"127.0.0.1:{n.listener_ports[name]}" for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every live node has said it started: a KRaft broker says so once the
        controller quorum has registered and unfenced it, when it serves clients."""
        live = [n for n in self.nodes if n.alive]
        deadline = time.monotonic() + timeout
        while not all(n.started for n in live):
            for node in live:
                if not node.alive:
                    raise KafkaUnavailableError(
                        f"Kafka node {node.node_id} exited with code {node.exit_code}; "
                        f"its log ({node.log_path}) ends:\n{node.log_tail()}")
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"Kafka did not start within {timeout:.0f} s; node logs: "
                    + ", ".join(str(n.log_path) for n in self.nodes) + f"\n{self.nodes[0].log_tail()}")
            time.sleep(0.1)

    def create_topic(self, name: str, partitions: int, replication_factor: int | None = None,
                     config: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        """Create a topic and wait until every partition has a leader; returns its name
        (through confluent-kafka, the bench extra: the tests' own client)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        rf = replication_factor or min(3, len(self.nodes))
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=rf,
                                      config=dict(config or {}))])[name].result(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            topic = admin.list_topics(name, timeout=timeout).topics.get(name)
            if topic and topic.error is None and len(topic.partitions) == partitions and all(
                    p.leader >= 0 for p in topic.partitions.values()):
                return name
            time.sleep(0.1)
        raise RuntimeError(f"topic {name} has no leaders after {timeout:.0f} s")

    def leader(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        """The node id leading ``topic``/``partition`` now (-1 while there is none). The
        node asked may not know a new topic yet (metadata reaches the nodes one by one):
        it is asked again until it does, up to ``timeout``."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in self.nodes if n.alive)})
        deadline = time.monotonic() + timeout
        while True:
            found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
            info = found.partitions.get(partition) if found is not None and found.error is None else None
            if info is not None or time.monotonic() >= deadline:
                return info.leader if info is not None else -1
            time.sleep(0.1)

    def logs(self) -> str:
        """Where each node's log is, and how each ends: for a failing test's report."""
        return "\n".join(f"--- node {n.node_id} ({n.log_path}):\n{n.log_tail()}" for n in self.nodes)

    def stop(self) -> None:
        """Stop every node; remove the working directory if this cluster made it."""
        nodes = getattr(self, "nodes", ())
        # All at once: stopped one by one, the last nodes wait out a lost controller quorum.
        for node in nodes:
            if (process := node.running) is not None:
                process.terminate()
        for node in nodes:
            node.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as StorageTool
    makes. It may start with '-', so it is passed as ``--cluster-id=...``."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _kafka_uuid() -> str:
    """A Kafka Uuid as its ``randomUuid`` makes one for a directory id: 16 random bytes in
    URL-safe base64 without padding, never beginning with '-'."""
    text = _cluster_id()
    while text.startswith("-"):
        text = _cluster_id()
    return text


@contextlib.contextmanager
def running_kafka(nodes: int = 1, **kwargs: Any) -> Iterator[KafkaCluster]:
    """``with running_kafka() as cluster:`` a cluster for the block's life."""
    cluster = KafkaCluster(nodes, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()


def start_local_kafka(topic: str | None = None, partitions: int = 1, *, config: Mapping[str, str] | None = None,
                      **kwargs: Any) -> KafkaCluster:
    """One node for the demo, the jobs, kprod-perf and ``kprod-broker``: topics are created on
    first use with ``partitions`` partitions (Kafka's auto-creation), and ``topic`` now, by
    kprod's own producer asking for its metadata: nothing beyond kprod is needed."""
    cluster = KafkaCluster(1, config={"num.partitions": str(partitions), **(config or {})}, **kwargs)
    if topic:
        from spark_sink.producer import KafkaProducer

        try:
            with KafkaProducer({"bootstrap.servers": cluster.bootstrap}) as producer:
                producer.partitions_for(topic)
        except BaseException:
            cluster.stop()
            raise
    return cluster
