"""Shared fixtures: the brokers, started once per test session (per worker under
pytest-xdist, which ``make test`` runs: see ``pytest_collection_modifyitems``); the
three-node cluster and the secured, OAuth and strict brokers only while a worker's tests
use them (tests/services.py).

``kafka`` is one Apache Kafka node with two client listeners: its plain one, and PROXIED,
whose advertised address is a fault proxy's, so every connection of a client that
bootstraps through ``kafka_proxy.bootstrap`` (its metadata included) crosses the proxy.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kprod_broker import KafkaCluster, Listener
from tests.brokers import discard, free_port, start_kafka, start_registry
from tests.faultproxy import FaultProxy
from tests.oauth_kafka import oauth_kafka  # noqa: F401 (a fixture)
from tests.secure_kafka import kerberos, secure_kafka  # noqa: F401 (fixtures)
from tests.services import SERVICES
from tests.strict_kafka import strict_kafka  # noqa: F401 (a fixture)

# Every process the session starts ends with it, however it ends (tests/reaper.py).
pytest_plugins = ["tests.reaper"]

# Spark's Python workers must run this interpreter, or they will not find the project.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


# Fixtures too costly to start on every xdist worker, by the group of tests that share
# one: a test using one runs on the worker that runs its group (``--dist loadgroup``).
# The groups are in the order they start in, the longest first. (The wheel and the venvs
# are cheap enough to build on each worker that needs them: tests/installs.py takes
# turns for the builds that write into this checkout.)
_HEAVY_GROUPS = {
    "_kafka3_session": "kafka3",
    "secure_kafka": "secure_kafka",
    "oauth_kafka": "oauth_kafka",
    "strict_kafka": "strict_kafka",
    "_kafka_tv1_session": "kafka_tv1",  # about a minute: the transaction tests on protocol v1
    # Apicurio: about 5 s of CPU and 220 MB to start, nearly nothing idle (a session fixture).
    "schema_registry": "schema_registry",
    "acl_kafka": "acl_kafka",  # three modules' tests, one node
}


# Fixtures that start a JVM (Kafka, Spark): a test using one, directly or through another
# fixture, is marked ``jvm``; ``make unit`` runs the others, with no Java to be found.
_JVM_FIXTURES = {"kafka", "_kafka_session", "kafka_proxy", "kafka3", "_kafka3_session", "kafka3_proxies", "broker",
                 "secure_kafka", "kerberos", "oauth_kafka", "strict_kafka", "spark", "_kafka_tv1_session",
                 "kafka_tv1", "kafka_tv1_proxy", "schema_registry", "acl_kafka"}

# Modules whose tests start a JVM themselves (kprod-broker as a command).
_JVM_MODULES = {"test_brokers.py"}

# Modules started first: those whose tests take a minute or more each on a loaded CI
# machine, and those that mostly wait (on timeouts, retries, a child job's JVM: a minute
# or more of wall for a third of it in CPU). Last, they ran alone while the other workers
# had finished, one core idle; first, they overlap the CPU-bound start.
_MINUTE_LONG = {"test_exactly_once", "test_jobs", "test_exactly_once_shapes", "test_task_faults",
                "test_quickstart", "test_exactly_once_retried_attempts", "test_exactly_once_time",
                "test_exactly_once_stop_mid_commit"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put each test that needs a heavy shared fixture in that fixture's xdist group, and
    the tests of a module with a module-scoped fixture in the module's group: spread over
    workers, each worker would start that fixture (a cluster of JVMs, a Spark job) again.
    Without xdist only the order changes."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if _JVM_FIXTURES.intersection(names) or "spark" in item.path.parts or item.path.name in _JVM_MODULES:
            item.add_marker(pytest.mark.jvm)
        group = next((_HEAVY_GROUPS[name] for name in names if name in _HEAVY_GROUPS), None)
        if group is None:
            definitions = getattr(item, "_fixtureinfo", None)
            definitions = definitions.name2fixturedefs if definitions else {}
            if isinstance(item, pytest.Function) and any(defs[-1].scope == "module" for defs in definitions.values()):
                group = item.module.__name__
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # xdist hands work out in collection order (make test turns its reordering by group
    # size off): the heavy groups first, the longest first; then the modules, the
    # minute-long first, a Spark module and another in turn: neighbouring modules are
    # alike (the exactly-once ones mostly wait on timeouts, the encoder's use the CPU
    # throughout), and mixed they keep both cores busy.
    ranks = {group: rank for rank, group in enumerate(dict.fromkeys(_HEAVY_GROUPS.values()))}
    heavy: list[tuple[int, pytest.Item]] = []
    modules: dict[Path, list[pytest.Item]] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is not None and marker.args[0] in ranks:
            heavy.append((ranks[marker.args[0]], item))
        else:
            modules.setdefault(item.path, []).append(item)
    heavy.sort(key=lambda ranked: ranked[0])  # stable: each group's tests in their order
    paths = sorted(modules, key=lambda path: path.stem not in _MINUTE_LONG)
    turns = itertools.zip_longest([p for p in paths if "spark" in p.parts], [p for p in paths if "spark" not in p.parts])
    items[:] = [item for _, item in heavy] + [item for pair in turns for path in pair if path for item in modules[path]]


# The markers `make unit` leaves out: only their tests may run Java.
_JAVA_MARKERS = ("jvm", "bench", "versions", "installs", "soak")

_NO_JAVA = """#!/bin/sh
echo "java run by a test not marked jvm (tests/conftest.py marks it from the fixtures it uses: add a fixture \
that starts a JVM to _JVM_FIXTURES, or mark the test @pytest.mark.jvm; make unit has no java)" >&2
exit 127
"""


@functools.cache
def _no_java_dir() -> str:
    """A directory whose ``java`` refuses to run (removed at the session's end)."""
    folder = tempfile.mkdtemp(prefix="kprod-no-java-")
    (Path(folder) / "java").write_text(_NO_JAVA)
    (Path(folder) / "java").chmod(0o755)
    return folder


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """A test without a Java marker, and every fixture it sets up whatever its scope, finds
    a ``java`` that fails first on PATH (JAVA_HOME unset): one that would run Java unmarked
    fails in every run, not only under ``make unit``, which has none."""
    if any(item.get_closest_marker(name) for name in _JAVA_MARKERS):
        yield
        return
    saved = {name: os.environ.get(name) for name in ("PATH", "JAVA_HOME")}
    os.environ["PATH"] = f"{_no_java_dir()}{os.pathsep}{saved['PATH'] or ''}"
    os.environ.pop("JAVA_HOME", None)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's own teardown, stop the shared services the worker's next test does
    not use (tests/services.py). Under xdist ``nextitem`` is None only for a worker's last
    test."""
    yield
    SERVICES.stop_unneeded(getattr(nextitem, "fixturenames", ()))


def pytest_sessionfinish() -> None:
    SERVICES.stop_unneeded(())
    if _no_java_dir.cache_info().currsize:
        shutil.rmtree(_no_java_dir(), ignore_errors=True)


@dataclass
class ProxiedKafka:
    """The session's Kafka node as seen through the fault proxy."""

    cluster: KafkaCluster
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"


@dataclass
class ProxiedKafka3:
    """The three-node cluster, each node also reachable through its own fault proxy."""

    cluster: KafkaCluster
    proxies: dict[int, FaultProxy]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{proxy.port}" for proxy in self.proxies.values())


@pytest.fixture(scope="session")
def _kafka_session() -> Iterator[ProxiedKafka]:
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy:
        # The coordinator looks for timed-out transactions every second (10 s by default):
        # tests of transaction.timeout.ms wait for it. Expired offsets are looked for every
        # 500 ms (10 minutes by default): test_exactly_once_idle.py waits for a commit's own
        # short retention.
        cluster = start_kafka(listeners=[Listener("PROXIED", port=port, advertised_port=proxy.port)],
                              config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
                                      "offsets.retention.check.interval.ms": "500"})
        try:
            yield ProxiedKafka(cluster, proxy)
        finally:
            discard(cluster)


@pytest.fixture(scope="session")
def kafka(_kafka_session: ProxiedKafka) -> KafkaCluster:
    """One Apache Kafka node (KRaft) on loopback, for the whole session."""
    return _kafka_session.cluster


@pytest.fixture
def kafka_proxy(_kafka_session: ProxiedKafka) -> Iterator[ProxiedKafka]:
    """The session's Kafka behind the fault proxy; faults are cleared after each test."""
    yield _kafka_session
    _clear_faults(_kafka_session.proxy)
    _kafka_session.proxy.cut_all()


def _start_kafka_tv1(stack: contextlib.ExitStack) -> ProxiedKafka:
    port = free_port()
    proxy = stack.enter_context(FaultProxy("127.0.0.1", port))
    cluster = start_kafka(listeners=[Listener("PROXIED", port=port, advertised_port=proxy.port)],
                          features={"transaction.version": 1},
                          config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"})
    stack.callback(discard, cluster)
    return ProxiedKafka(cluster, proxy)


@pytest.fixture
def _kafka_tv1_session() -> ProxiedKafka:
    """Started by the worker's first test that uses it (tests/services.py)."""
    return SERVICES.get("_kafka_tv1_session", _start_kafka_tv1)


@pytest.fixture
def kafka_tv1(_kafka_tv1_session: ProxiedKafka) -> KafkaCluster:
    """One Apache Kafka node formatted with transaction.version 1: transaction protocol v1
    (AddPartitionsToTxn, EndTxn v4), which ``kafka`` (Kafka 4.x's default, 2) no longer
    speaks. For a few tests of transactions, run on both."""
    return _kafka_tv1_session.cluster


@pytest.fixture
def kafka_tv1_proxy(_kafka_tv1_session: ProxiedKafka) -> Iterator[ProxiedKafka]:
    """``kafka_tv1`` behind its fault proxy; faults are cleared after each test."""
    yield _kafka_tv1_session
    _clear_faults(_kafka_tv1_session.proxy)
    _kafka_tv1_session.proxy.cut_all()


def _start_kafka3(stack: contextlib.ExitStack) -> ProxiedKafka3:
    ports = {node_id: free_port() for node_id in (1, 2, 3)}
    proxies = {node_id: stack.enter_context(FaultProxy("127.0.0.1", port)) for node_id, port in ports.items()}
    cluster = start_kafka(3, listeners=[Listener("PROXIED", node_ports=ports, advertised_node_ports={
        node_id: proxy.port for node_id, proxy in proxies.items()})])
    stack.callback(discard, cluster)
    return ProxiedKafka3(cluster, proxies)


@pytest.fixture
def _kafka3_session() -> Iterator[ProxiedKafka3]:
    """Started by the worker's first test that uses it (tests/services.py). The topics a
    test made are deleted after it: a killed node that restarts loads, and catches up on,
    every partition it holds, and the group's later restarts paid for all the earlier
    tests' (a restart and its return to the ISR: 2.2 CPU s with one topic, 5 s with 40)."""
    running = SERVICES.get("_kafka3_session", _start_kafka3)
    before = _topics(running.cluster)
    yield running
    _delete_topics(running.cluster, _topics(running.cluster) - before)


def _topics(cluster: KafkaCluster) -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in cluster.nodes if n.alive)})
    return set(admin.list_topics(timeout=30).topics)


def _delete_topics(cluster: KafkaCluster, topics: set[str]) -> None:
    """Delete ``topics`` (the internal ones kept), waiting for the controller's answer."""
    from confluent_kafka.admin import AdminClient

    topics = {topic for topic in topics if not topic.startswith("__")}
    if topics:
        admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in cluster.nodes if n.alive)})
        for future in admin.delete_topics(sorted(topics), operation_timeout=30).values():
            future.result(60)


@pytest.fixture
def kafka3(_kafka3_session: ProxiedKafka3) -> KafkaCluster:
    """Three Apache Kafka nodes: replication factor 3, min.insync.replicas 2 (failover)."""
    return _kafka3_session.cluster


@pytest.fixture
def kafka3_proxies(_kafka3_session: ProxiedKafka3) -> Iterator[ProxiedKafka3]:
    """The three nodes with a fault proxy in front of each one's PROXIED listener (by node
    id); faults are cleared after each test."""
    yield _kafka3_session
    for proxy in _kafka3_session.proxies.values():
        _clear_faults(proxy)


def _clear_faults(proxy: FaultProxy) -> None:
    """No delay and no stall: what a test's faults leave behind for the next one."""
    proxy.set_delay(0)
    proxy.stall(False)


def _start_acl_kafka(stack: contextlib.ExitStack) -> KafkaCluster:
    cluster = start_kafka(config={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true"})
    stack.callback(discard, cluster)
    return cluster


@pytest.fixture
def acl_kafka() -> KafkaCluster:
    """A node with Kafka's authorizer (StandardAuthorizer), allowing what no ACL names: the
    clients, all User:ANONYMOUS on PLAINTEXT, may do everything but what an ACL denies
    (``tests.brokers.deny_topic``, on topics of a test's own). Started by the worker's first
    test that uses it (tests/services.py), shared by the modules that do."""
    return SERVICES.get("acl_kafka", _start_acl_kafka)


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """A Schema Registry on loopback (Apicurio Registry, in memory, global compatibility
    BACKWARD): the URL of its Confluent-compatible API, for the whole session."""
    registry = start_registry()
    try:
        yield registry.url
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def kprod_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kprod's wheel, built once per session."""
    from tests.installs import build_wheel

    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture
def broker(kafka: KafkaCluster) -> KafkaCluster:
    """The broker of round-trip tests: Apache Kafka."""
    return kafka
