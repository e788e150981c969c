"""Shared fixtures: the brokers, started once per test session.

``kafka`` is one Apache Kafka node with two client listeners: its plain one, and PROXIED,
whose advertised address is a fault proxy's, so every connection of a client that
bootstraps through ``kafka_proxy.bootstrap`` (its metadata included) crosses the proxy.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_sink.kafka_broker import KafkaCluster, Listener
from spark_sink.local_broker import LocalBroker
from tests.brokers import free_port, start_kafka, start_tansu
from tests.secure_kafka import secure_kafka  # noqa: F401 (a fixture)
from tests.strict_kafka import strict_kafka  # noqa: F401 (a fixture)
from tests.faultproxy import FaultProxy

# Spark's Python workers must run this interpreter, or they will not find the project.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@dataclass
class ProxiedKafka:
    """The session's Kafka node as seen through the fault proxy."""

    cluster: KafkaCluster
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"


@pytest.fixture(scope="session")
def _kafka_session() -> Iterator[ProxiedKafka]:
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy:
        cluster = start_kafka(listeners=[Listener("PROXIED", port=port, advertised_port=proxy.port)])
        try:
            yield ProxiedKafka(cluster, proxy)
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def kafka(_kafka_session: ProxiedKafka) -> KafkaCluster:
    """One Apache Kafka node (KRaft) on loopback, for the whole session."""
    return _kafka_session.cluster


@pytest.fixture
def kafka_proxy(_kafka_session: ProxiedKafka) -> Iterator[ProxiedKafka]:
    """The session's Kafka behind the fault proxy; faults are cleared after each test."""
    yield _kafka_session
    _kafka_session.proxy.set_delay(0)
    _kafka_session.proxy.stall(False)
    _kafka_session.proxy.cut_all()


@pytest.fixture(scope="session")
def kafka3() -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes: replication factor 3, min.insync.replicas 2 (failover)."""
    cluster = start_kafka(3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def kprod_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kprod's wheel, built once per session."""
    from tests.installs import build_wheel

    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def tansu() -> Iterator[LocalBroker]:
    """A Tansu broker with memory storage on loopback (the demo's zero-download broker)."""
    broker = start_tansu()
    yield broker
    broker.stop()


@pytest.fixture
def broker(kafka: KafkaCluster) -> KafkaCluster:
    """The broker of round-trip tests: Apache Kafka."""
    return kafka
