"""Apache Kafka on loopback: KRaft nodes (broker and controller in one JVM) for tests, jobs and benchmarks.

The jars come from Maven Central through ``mvn`` (Java 17+ and Maven must be installed),
once, into a cache outside any repository (``$KPROD_CACHE``, default ``~/.cache/kprod``).
Each node gets its own directory holding its properties, its storage and ``server.log``,
everything the JVM printed, so a failing test can show what the broker said.

Nothing here is needed to talk to a cluster you already run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spark_sink.local_broker import free_port

KAFKA_VERSION = "4.3.1"
# Kafka 4 logs through log4j 2 behind slf4j 1.7; its jars name no slf4j binding.
_LOG4J_VERSION = "2.25.4"
_KAFKA_ARTIFACTS = (
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",  # ProducerPerformance, the Java peer of kprod-perf
    f"org.apache.logging.log4j:log4j-slf4j-impl:{_LOG4J_VERSION}",
)
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


class KafkaUnavailableError(RuntimeError):
    """Kafka cannot be fetched or started here (no Java, no Maven, no network to Maven Central)."""


def cache_dir() -> Path:
    """Where fetched jars live: ``$KPROD_CACHE`` or ``~/.cache/kprod`` (never inside a repository)."""
    return Path(os.environ.get("KPROD_CACHE") or Path.home() / ".cache" / "kprod")


def java() -> str:
    """The ``java`` to run: ``$JAVA_HOME/bin/java`` or the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not os.access(found, os.X_OK):
        raise KafkaUnavailableError("Apache Kafka needs Java 17 or newer: no java on PATH and no JAVA_HOME")
    return found


def maven_jars(name: str, artifacts: Sequence[str]) -> list[Path]:
    """The jars of ``artifacts`` (``group:artifact:version``) and their runtime dependencies.

    Fetched with Maven into ``cache_dir()/name`` the first time, under a file lock so that
    concurrent callers fetch once; later calls only list the directory.
    """
    target = cache_dir() / name
    done = target / ".complete"
    if not done.exists():
        target.mkdir(parents=True, exist_ok=True)
        with open(target / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                _fetch(target, artifacts)
                done.write_text("\n".join(artifacts) + "\n")
    return sorted((target / "libs").glob("*.jar"))


def _fetch(target: Path, artifacts: Sequence[str]) -> None:
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaUnavailableError("fetching Kafka's jars needs Maven (mvn) on PATH: apt-get install maven")
    deps = "".join(
        f"<dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in (artifact.split(":") for artifact in artifacts))
    (target / "pom.xml").write_text(
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>kprod.cache</groupId><artifactId>{target.name}</artifactId><version>1</version>"
        f"<dependencies>{deps}</dependencies></project>\n")
    shutil.rmtree(target / "libs", ignore_errors=True)
    result = subprocess.run(
        [mvn, "-B", "-q", "-f", str(target / "pom.xml"), "dependency:copy-dependencies",
         f"-DoutputDirectory={target / 'libs'}", "-DincludeScope=runtime"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        raise KafkaUnavailableError(
            f"mvn could not fetch {', '.join(artifacts)}:\n{(result.stdout + result.stderr)[-3000:]}")


def kafka_classpath() -> str:
    """Apache Kafka's server and tools jars, fetched on first use."""
    return os.pathsep.join(str(p) for p in maven_jars(f"kafka-{KAFKA_VERSION}", _KAFKA_ARTIFACTS))


def spark_kafka_jars(spark_version: str | None = None) -> list[Path]:
    """Spark's own Kafka sink (``spark-sql-kafka-0-10_2.13`` of the running Spark) and what
    it needs at run time that Spark does not already ship, for ``spark.jars``."""
    import re

    import pyspark

    version = spark_version or pyspark.__version__
    jars = maven_jars(f"spark-sql-kafka-{version}", [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}"])

    def artifact(jar: Path) -> str:
        return re.sub(r"-\d[\w.]*\.jar$", "", jar.name)

    shipped = {artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [j for j in jars if artifact(j) not in shipped]


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


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS on loopback: a CA, a broker certificate for 127.0.0.1 and
    localhost, and a client certificate, each signed by the CA."""

    ca: Path
    broker: Path  # private key (PKCS#8) and certificate: a PEM key store
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a CA and the broker's and a client's certificates into ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
                    *extensions: tuple[x509.ExtensionType, bool]) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        return builder.sign(signer, hashes.SHA256())

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key, broker_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = certificate("kprod-test-ca", ca_key, "kprod-test-ca", ca_key,
                     (x509.BasicConstraints(ca=True, path_length=None), True))
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    broker = certificate("localhost", broker_key, "kprod-test-ca", ca_key, (san, False),
                         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False))
    client = certificate("kprod-client", client_key, "kprod-test-ca", ca_key,
                         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False))
    pem = serialization.Encoding.PEM
    files = TlsFiles(directory / "ca.pem", directory / "broker.pem", directory / "client-cert.pem",
                     directory / "client-key.pem")
    files.ca.write_bytes(ca.public_bytes(pem))
    files.broker.write_bytes(pem_key(broker_key) + broker.public_bytes(pem) + ca.public_bytes(pem))
    files.client_cert.write_bytes(client.public_bytes(pem) + ca.public_bytes(pem))
    files.client_key.write_bytes(pem_key(client_key))
    return files


def ssl_listener_config(files: TlsFiles, client_auth: bool = False) -> dict[str, str]:
    """A listener's settings for TLS with ``files`` (PEM stores); ``client_auth`` requires
    a client certificate signed by the CA (mutual TLS)."""
    return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(files.broker),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(files.ca),
            "ssl.client.auth": "required" if client_auth else "none"}


class KafkaNode:
    """One KRaft node (broker and controller) in its own JVM."""

    def __init__(self, cluster: KafkaCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.dir = cluster.dir / f"node-{node_id}"
        self.port = free_port()
        self.controller_port = free_port()
        self.listener_ports = {listener.name: listener.port or listener.node_ports.get(node_id) or free_port()
                               for listener in cluster.listeners}
        self.log_path = self.dir / "server.log"
        self.process: subprocess.Popen | None = None

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
            # A killed node is fenced (and its partitions move) after 3 s instead of 9.
            "broker.session.timeout.ms": "3000",
            "broker.heartbeat.interval.ms": "500",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        for lst in c.listeners:
            props.update({f"listener.name.{lst.name.lower()}.{k}": v for k, v in lst.config.items()})
        props.update(c.config)
        return props

    def format(self) -> None:
        """Write the properties and format the storage (with the cluster's SCRAM users)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.dir / "log4j2.properties").write_text(_LOG4J2)
        scram = [arg for user in self.cluster.scram_users for arg in ("--add-scram", user)]
        result = subprocess.run(
            [java(), "-cp", kafka_classpath(), *self._log_args(), "kafka.tools.StorageTool", "format",
             f"--cluster-id={self.cluster.cluster_id}", "--config", str(config), *scram],
            stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if result.returncode != 0:
            raise KafkaUnavailableError(f"formatting node {self.node_id} failed:\n{result.stdout}{result.stderr}")

    def _log_args(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}"]

    def start(self) -> None:
        """Start the JVM (storage already formatted); returns without waiting for it."""
        if self.alive:
            return
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [java(), f"-Xmx{self.cluster.heap}", f"-Xms{self.cluster.heap}", "-XX:+UseG1GC",
                 "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true", *self._log_args(),
                 *self.cluster.jvm_args, "-cp", kafka_classpath(), "kafka.Kafka", str(self.dir / "server.properties")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.alive else None

    def kill(self) -> None:
        """SIGKILL: the node dies without a controlled shutdown, as in a crash."""
        if self.alive:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """A controlled shutdown (SIGTERM), then SIGKILL if it takes longer than ``timeout``."""
        if self.alive:
            self.process.terminate()
            try:
                self.process.wait(timeout)
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
    """

    name = "kafka"

    def __init__(self, nodes: int = 1, *, listeners: Sequence[Listener] = (), config: Mapping[str, str] | None = None,
                 scram_users: Sequence[str] = (), heap: str = "512m", jvm_args: Sequence[str] = (),
                 start_timeout: float = 90.0, workdir: str | None = None) -> None:
        self.listeners = tuple(listeners)
        self.config = dict(config or {})
        self.scram_users = tuple(scram_users)
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
        """Wait until every live node is registered and serves metadata."""
        from confluent_kafka.admin import AdminClient

        live = [n for n in self.nodes if n.alive]
        admin = None
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes:
                if node.process is not None and not node.alive and node in live:
                    raise KafkaUnavailableError(
                        f"Kafka node {node.node_id} exited with code {node.process.returncode}; "
                        f"its log ({node.log_path}) ends:\n{node.log_tail()}")
            # The admin client is made once every node listens, so it does not log refusals.
            if admin is None and all(_listens(n.port) for n in live):
                admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in live)})
            if admin is not None:
                with contextlib.suppress(Exception):
                    if len(admin.list_topics(timeout=2).brokers) >= len(live):
                        return
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"Kafka did not serve metadata within {timeout:.0f} s; node logs: "
                    + ", ".join(str(n.log_path) for n in self.nodes) + f"\n{self.nodes[0].log_tail()}")
            time.sleep(0.2)

    def create_topic(self, name: str, partitions: int, replication_factor: int | None = None,
                     config: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        """Create a topic and wait until every partition has a leader; returns its name."""
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

    def leader(self, topic: str, partition: int) -> int:
        """The node id leading ``topic``/``partition`` now (-1 while there is none)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in self.nodes if n.alive)})
        return admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader

    def logs(self) -> str:
        """Where each node's log is, and how each ends: for a failing test's report."""
        return "\n".join(f"--- node {n.node_id} ({n.log_path}):\n{n.log_tail()}" for n in self.nodes)

    def stop(self) -> None:
        """Stop every node; remove the working directory if this cluster made it."""
        nodes = getattr(self, "nodes", ())
        # All at once: stopped one by one, the last nodes wait out a lost controller quorum.
        for node in nodes:
            if node.alive:
                node.process.terminate()
        for node in nodes:
            node.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listens(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as StorageTool
    makes. It may start with '-', so it is passed as ``--cluster-id=...``."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


@contextlib.contextmanager
def running_kafka(nodes: int = 1, **kwargs: object) -> Iterator[KafkaCluster]:
    """``with running_kafka() as cluster:`` a cluster for the block's life."""
    cluster = KafkaCluster(nodes, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()
