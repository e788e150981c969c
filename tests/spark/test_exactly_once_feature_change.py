"""Exactly-once microbatches across a change of the cluster's transaction.version (written
by the skeptical review of branch ``break``): the driver's AdminClient, kept across
microbatches, still speaks the protocol its connections agreed on, task 0's producer is
kept too (as the worker's pool does) and task 1's is new, so after the change the driver
and the tasks may speak different protocols (EndTxn v4 on a transaction begun under v2,
TxnOffsetCommit v5 without AddOffsetsToTxn under v1)."""

from __future__ import annotations

import collections
import dataclasses
import subprocess
import time
from collections.abc import Iterator

import pytest

from kprod_broker import KafkaCluster
from kprod_broker.jars import java, kafka_classpath
from spark_sink.admin import AdminClient
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.spark import exactly_once, exactly_once_names
from spark_sink.spark.options import ExactlyOnce
from spark_sink.spark.task_reports import KProdCommitMessage
from tests.brokers import create_topic, start_kafka, unique_topic
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_time import _committed_values


def _set_transaction_version(bootstrap: str, level: int, verb: str) -> None:
    out = subprocess.run([java(), "-cp", kafka_classpath(), "org.apache.kafka.tools.FeatureCommand",
                          "--bootstrap-server", bootstrap, verb, "--feature", f"transaction.version={level}"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"was {verb}d to {level}" in out.stdout, out.stdout + out.stderr


def _task(producer: KafkaProducer, topic: str, partition: int, values: list[bytes]) -> KProdCommitMessage:
    exactly_once_names.fence_and_begin(producer)
    for v in values:
        producer.send(ProducerRecord(topic, v, key=v))
    txn = producer.prepare_transaction()
    return KProdCommitMessage(partition_id=partition, attempt=0, records=len(values), bytes=0,
                              transaction=txn, query_id="q",
                              transaction_began_ms=time.time() * 1000)


@dataclasses.dataclass
class _Node:
    cluster: KafkaCluster
    transaction_version: int

    def set_transaction_version(self, level: int) -> None:
        if level != self.transaction_version:
            _set_transaction_version(self.cluster.bootstrap, level,
                                     "upgrade" if level > self.transaction_version else "downgrade")
            self.transaction_version = level


@pytest.fixture(scope="module")
def node() -> Iterator[_Node]:
    """One node for both changes, formatted with transaction.version 1: the upgrade's end
    is where the downgrade starts (each test sets the level it starts from, if need be)."""
    cluster = start_kafka(features={"transaction.version": 1})
    try:
        yield _Node(cluster, 1)
    finally:
        cluster.stop()


@pytest.mark.parametrize(("before", "after"), [(1, 2), pytest.param(2, 1, marks=pytest.mark.soak)],
                         ids=["1-2-upgrade", "2-1-downgrade"])
def test_microbatches_across_a_transaction_version_change_are_written_once(node: _Node, before: int, after: int) -> None:
    """Expected: every microbatch before and after the change visible exactly once to
    read_committed, each one's markers committed, and nothing left open."""
    node.set_transaction_version(before)
    cluster = node.cluster
    kept = None
    try:
        topic = create_topic(cluster.bootstrap, unique_topic("eos-feature"), partitions=2)
        config = {"bootstrap.servers": cluster.bootstrap}
        eo = ExactlyOnce(unique_topic("feature"), topic)
        assert eo.prefix is not None
        kept = KafkaProducer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0,
                              "transactional.id": exactly_once_names.transactional_id(eo.prefix, 0)})
        expected: collections.Counter[str] = collections.Counter()
        for batch in range(4):
            if batch == 2:
                node.set_transaction_version(after)
            values = {p: [b"%d-%d-%d" % (batch, p, i) for i in range(10)] for p in range(2)}
            with KafkaProducer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0,
                                "transactional.id": exactly_once_names.transactional_id(eo.prefix, 1)}) as fresh:
                messages = [_task(kept, topic, 0, values[0]), _task(fresh, topic, 1, values[1])]
            assert exactly_once.commit(config, eo, [dataclasses.replace(m) for m in messages], batch).transactions == 2
            expected.update(v.decode() for vs in values.values() for v in vs)
        with AdminClient(config) as admin:
            groups = {exactly_once_names.transactional_id(eo.prefix, p): [(topic, 0)] for p in range(2)}
            markers = admin.committed_offsets(groups)
        assert all(offsets[(topic, 0)][0] == 3 for offsets in markers.values()), markers
        got = collections.Counter(_committed_values(cluster.bootstrap, topic, sum(expected.values()), settle=2))
        assert got == expected
        assert_nothing_left_open(cluster.bootstrap, topic, 2)
    finally:
        if kept is not None:
            kept.close()
