"""Shared fixtures: the two real brokers, started once per test session."""

from __future__ import annotations

import os
import sys

import pytest

from tests.brokers import Broker, start_mock_cluster, start_tansu

# Spark's Python workers must run this interpreter, or they will not find the project.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture(scope="session")
def tansu() -> Broker:
    """A Tansu broker with memory storage on loopback."""
    broker = start_tansu()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def mock_cluster() -> Broker:
    """librdkafka's mock cluster with three brokers, in a child process."""
    broker = start_mock_cluster()
    yield broker
    broker.stop()


@pytest.fixture(params=["tansu", "mock"])
def broker(request: pytest.FixtureRequest) -> Broker:
    """Each test using this runs once against Tansu and once against the mock cluster."""
    return request.getfixturevalue("tansu" if request.param == "tansu" else "mock_cluster")
