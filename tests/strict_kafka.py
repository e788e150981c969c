"""Apache Kafka that does not create topics on first use (fixture ``strict_kafka``): where
writing to an unknown topic is an error, as on most production clusters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import start_kafka


@pytest.fixture(scope="session")
def strict_kafka() -> Iterator[KafkaCluster]:
    cluster = start_kafka(config={"auto.create.topics.enable": "false"})
    try:
        yield cluster
    finally:
        cluster.stop()
