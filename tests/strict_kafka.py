"""Apache Kafka that does not create topics on first use (fixture ``strict_kafka``): where
writing to an unknown topic is an error, as on most production clusters. Nor can it
create the group coordinator's topic (__consumer_offsets, replication factor 2 on its one
node): every group's coordinator is unavailable, as on a cluster whose offsets topic is
lost or misconfigured (transactions work; consumer groups and transactional offsets do
not)."""

from __future__ import annotations

import contextlib

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import discard, start_kafka
from tests.services import SERVICES


def _start(stack: contextlib.ExitStack) -> KafkaCluster:
    cluster = start_kafka(config={"auto.create.topics.enable": "false", "offsets.topic.replication.factor": "2"})
    stack.callback(discard, cluster)
    return cluster


@pytest.fixture
def strict_kafka() -> KafkaCluster:
    """Started by the worker's first test that uses it (tests/services.py)."""
    return SERVICES.get("strict_kafka", _start)
