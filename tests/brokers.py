"""Brokers for the tests, and an independent client to read back.

Apache Kafka (KRaft nodes, ``kprod_broker``) is the broker of the suite. Reading back
always goes through confluent-kafka's consumer with CRC checks on.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kprod_broker import (  # noqa: F401 (free_port re-exported)
    KAFKA_VERSION,
    KafkaCluster,
    KafkaUnavailableError,
    Listener,
    LocalRegistry,
    free_port,
    start_local_registry,
)
from tests.jvms import C1_ONLY, kafka_jvm_options, with_test_jvm_options


def _skip_without_java(what: str) -> None:
    """Skip the test when there is no Java, except in CI (``CI`` set), where a test that
    needs a JVM must fail rather than pass unexercised."""
    import shutil

    import pytest

    if not shutil.which("java") and not os.environ.get("JAVA_HOME") and not os.environ.get("CI"):
        pytest.skip(f"{what} needs Java 17 or newer on PATH")


_BIND_ATTEMPTS = 3  # starts of a Kafka node whose port was taken meanwhile


def start_kafka(nodes: int = 1, *, listeners: Sequence[Listener] = (), config: Mapping[str, str] | None = None,
                features: Mapping[str, int] | None = None, jvm_args: Sequence[str] = (), scram_users: Sequence[str] = (),
                version: str = KAFKA_VERSION) -> KafkaCluster:
    """Start Apache Kafka for a test. Without Java the test skips, except in CI (``CI``
    set), where a test that needs Kafka must fail rather than pass unexercised."""
    import pytest

    _skip_without_java("Apache Kafka")
    # Tests write records with timestamps from 2024: the retention check (every 5 minutes)
    # would delete them from under a test that reads them back.
    settings = {"log.retention.ms": "-1", **(config or {})}
    for attempt in range(_BIND_ATTEMPTS):
        try:
            return KafkaCluster(nodes, listeners=listeners, config=settings, features=features,
                                scram_users=scram_users, jvm_args=[*kafka_jvm_options(), *jvm_args], version=version)
        except KafkaUnavailableError as exc:
            # A port free when it was chosen can be taken before the JVM binds it (another
            # worker's listener, any process's outgoing connection: the kernel hands out
            # both from one range). Ports the test chose itself come back the same: no use.
            fixed = any(listener.port or listener.node_ports for listener in listeners)
            if "Address already in use" not in str(exc) or fixed or attempt == _BIND_ATTEMPTS - 1:
                pytest.fail(f"Apache Kafka did not start: {exc}", pytrace=False)
    raise AssertionError("unreachable")


def discard(cluster: KafkaCluster) -> None:
    """End a test's cluster at once: SIGKILL every node, then remove its directory. Its data
    goes with it, so a controlled shutdown buys nothing, and it costs: the KRaft quorum's
    leader waits up to 5 s for followers already gone, and all of it under load."""
    for node in cluster.nodes:
        node.kill()
    cluster.stop()


def start_registry() -> LocalRegistry:
    """Start a Schema Registry (Apicurio, global compatibility BACKWARD) for a test: skipped
    without Java outside CI, failed when it cannot be fetched or started, as Kafka."""
    import pytest

    _skip_without_java("The Schema Registry (Apicurio)")
    try:
        return start_local_registry(jvm_args=C1_ONLY)
    except KafkaUnavailableError as exc:
        pytest.fail(f"the Schema Registry did not start: {exc}", pytrace=False)


def unique_topic(prefix: str = "t") -> str:
    """A topic name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create_topic(bootstrap: str, name: str, partitions: int = 3, timeout: float = 30.0) -> str:
    """Create a topic and wait until every partition has a leader; returns its name."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
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
                overrides: Mapping[str, object] | None = None, to_end: bool = False,
                until: bytes | None = None) -> list:
    """Read ``topic`` from the beginning of every partition until ``expected`` records.

    Partitions are assigned directly (no group rebalance to wait for). With ``settle``,
    keep reading that long after reaching ``expected`` so extra (duplicate) records show.
    With ``to_end``, instead read every partition up to its high watermark once
    ``expected`` are in: every record written so far, duplicates too, without waiting
    (for a topic without transactions: a marker is never delivered, and one written last
    leaves the high watermark out of reach). With ``until``, read every
    partition up to a record of that value, written last to each: after transactions, a
    read_committed reader reaches it only once none before it is open, whenever their
    markers land.
    Raises AssertionError if fewer than ``expected`` arrive in time. ``overrides`` are
    consumer settings (TLS, say).
    """
    c = consumer(bootstrap, **(overrides or {}))
    try:
        metadata = c.list_topics(topic, timeout=timeout)
        partitions = sorted(metadata.topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        messages: list[Message] = []
        deadline = time.monotonic() + timeout
        settle_until = None
        ends: dict[int, int] | None = None  # with to_end: each partition's high watermark
        next_offset = dict.fromkeys(partitions, 0)
        until_seen: set[int] = set()
        while time.monotonic() < deadline:
            if until is not None:
                if until_seen >= set(partitions) and len(messages) >= expected:
                    break
            elif len(messages) >= expected:
                if to_end:
                    # Every partition's high watermark in one request (a timestamp of -1
                    # asks for the latest offset), not one request each.
                    ends = ends or {tp.partition: tp.offset for tp in c.offsets_for_times(
                        [TopicPartition(topic, p, -1) for p in partitions], timeout=10)}
                    if all(next_offset[p] >= end for p, end in ends.items()):
                        break
                else:
                    settle_until = settle_until or time.monotonic() + settle
                    if time.monotonic() >= settle_until:
                        break
            for m in c.consume(num_messages=10000, timeout=0.2):
                if m.error():
                    raise KafkaException(m.error())
                messages.append(m)
                partition, offset = m.partition(), m.offset()
                assert partition is not None and offset is not None
                next_offset[partition] = offset + 1
                if until is not None and m.value() == until:
                    until_seen.add(partition)
        assert until is None or until_seen >= set(partitions), (
            f"{topic}: read no {until!r} from partitions {sorted(set(partitions) - until_seen)}")
        assert len(messages) >= expected, f"read {len(messages)} of {expected} records from {topic}"
        assert ends is None or all(next_offset[p] >= end for p, end in ends.items()), (
            f"{topic}: read up to offsets {next_offset}, not to the high watermarks {ends}")
        return messages
    finally:
        c.close()


def partition_counts(messages: list) -> dict[int, int]:
    """Records per partition."""
    counts: dict[int, int] = {}
    for m in messages:
        counts[m.partition()] = counts.get(m.partition(), 0) + 1
    return dict(sorted(counts.items()))



def subprocess_env(python: str | None = None) -> dict[str, str]:
    """Environment for children (jobs, Spark workers) that must import this project, with
    the suite's Python, or ``python``: a user's install, which imports its own kprod (no
    PYTHONPATH) and whose PySpark starts Spark from its own home, not the suite's
    (tests/jvms.py)."""
    env = with_test_jvm_options(dict(os.environ))
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = python or sys.executable
    if python is not None:
        del env["SPARK_HOME"]
        env.pop("PYTHONPATH", None)
    return env


def deny_topic(bootstrap: str, topic: str, operation: str, timeout: float = 30.0,
               allow: tuple[str, ...] = ("DESCRIBE", "READ")) -> None:
    """Deny User:ANONYMOUS (every PLAINTEXT client) ``operation`` (an AclOperation name:
    ALL, WRITE, ...) on ``topic``, on a broker with an authorizer (``acl_kafka``), and allow
    the operations ``allow`` names; returns once the broker's authorizer lists the ACLs (it
    answers from the same state)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    def acl(op: AclOperation, permission: AclPermissionType) -> AclBinding:
        return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*", op,
                          permission)

    admin = AdminClient({"bootstrap.servers": bootstrap})
    bindings = [acl(AclOperation[operation], AclPermissionType.DENY)]
    if operation != "ALL":
        # allow.everyone.if.no.acl.found stops applying to a topic once an ACL names it:
        # the rest is allowed again by name.
        bindings += [acl(AclOperation[name], AclPermissionType.ALLOW) for name in allow]
    for future in admin.create_acls(bindings).values():
        future.result(timeout)
    anyone: Any = None  # a filter's None matches every principal and host
    wanted = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, anyone, anyone,
                              AclOperation.ANY, AclPermissionType.ANY)
    deadline = time.monotonic() + timeout
    while not set(bindings) <= set(admin.describe_acls(wanted).result(timeout)):
        assert time.monotonic() < deadline, f"the ACLs denying {operation} on {topic} never showed"
        time.sleep(0.1)
    if operation == "ALL":
        # Until an independent client is refused the topic's metadata.
        while admin.list_topics(topic, timeout=10).topics[topic].error is None:
            assert time.monotonic() < deadline, "the ACL never took effect"
            time.sleep(0.1)


_END_MARK = b"end-mark-"  # consume_to_marks' records: their values begin so


def consume_to_marks(bootstrap: str, topic: str, timeout: float = 60.0,
                     overrides: Mapping[str, object] | None = None) -> list:
    """Every record of ``topic`` written so far, duplicates included, without reading for a
    fixed while: a plain record of a value of this call's own is produced last to every
    partition, and each partition read up to it (``consume_all``'s ``until``). Under
    read_committed that record shows only once no transaction before it is open, whenever
    their markers land. The marks, this call's and earlier calls' on the topic, are left
    out of what is returned."""
    mark = _END_MARK + uuid.uuid4().hex.encode()
    probe = consumer(bootstrap)
    try:
        partitions = sorted(probe.list_topics(topic, timeout=timeout).topics[topic].partitions)
    finally:
        probe.close()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for partition in partitions:
        producer.produce(topic, mark, key=mark, partition=partition)
    assert producer.flush(timeout) == 0, f"{topic}: the end marks were not all delivered"
    messages = consume_all(bootstrap, topic, len(partitions), timeout=timeout, overrides=overrides, until=mark)
    return [m for m in messages if not (m.value() or b"").startswith(_END_MARK)]
