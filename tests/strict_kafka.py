"""Apache Kafka that does not create topics on first use (fixture ``strict_kafka``): where
writing to an unknown topic is an error, as on most production clusters."""

from __future__ import annotations

import contextlib

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import start_kafka
from tests.services import SERVICES


def _start(stack: contextlib.ExitStack) -> KafkaCluster:
    cluster = start_kafka(config={"auto.create.topics.enable": "false"})
    stack.callback(cluster.stop)
    return cluster


@pytest.fixture
def strict_kafka() -> KafkaCluster:
    """Started by the worker's first test that uses it (tests/services.py)."""
    return SERVICES.get("strict_kafka", _start)
