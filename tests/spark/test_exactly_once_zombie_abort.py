"""A zombie attempt's abort arriving after the next attempt of its task opened its
transaction (written by the skeptical review of branch ``break``): a task that fails aborts
its own transaction (exactly_once_abort.abort_in_task); if that EndTxn is slow (a stalled
connection) and a second attempt opens its transaction meanwhile, the late abort, under
the first attempt's epoch, must not end the second attempt's transaction. Under protocol
v2 each EndTxn bumps the epoch and the coordinator accepts a retried EndTxn under the
epoch before the current one, so an epoch-minus-one abort is tried too."""

from __future__ import annotations

import collections

import pytest

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient, PreparedTransaction
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.spark import exactly_once, exactly_once_abort, exactly_once_names
from spark_sink.spark.options import ExactlyOnce
from spark_sink.spark.task_reports import KProdCommitMessage
from tests.brokers import create_topic, unique_topic
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_time import _committed_values


def _run(cluster: KafkaCluster) -> None:
    topic = create_topic(cluster.bootstrap, unique_topic("eos-zombie"), partitions=1)
    prefix = unique_topic("zombie")
    tid = exactly_once_names.transactional_id(prefix, 0)
    config = {"bootstrap.servers": cluster.bootstrap}
    first = KafkaProducer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "transactional.id": tid})
    second = KafkaProducer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "transactional.id": tid})
    admin = AdminClient(config)
    try:
        exactly_once_names.fence_and_begin(first)
        first.send(ProducerRecord(topic, b"a0", key=b"a0")).result(10)
        first_epoch = admin.describe_transactions([tid])[tid].producer_epoch
        exactly_once_names.fence_and_begin(second)
        second.send(ProducerRecord(topic, b"b0", key=b"b0")).result(10)
        txn = second.prepare_transaction()
        assert txn is not None
        for epoch in sorted({first_epoch, txn.producer_epoch - 1}):
            with pytest.raises(Exception):  # noqa: B017 - refused, whatever the error
                admin.end_transactions([PreparedTransaction(tid, txn.producer_id, epoch)], commit=False,
                                       timeout_ms=10000)
        exactly_once_abort.abort_in_task(first)  # the zombie's own abort, late
        state = admin.describe_transactions([tid])[tid]
        assert (state.state, state.producer_id, state.producer_epoch) == ("Ongoing", txn.producer_id,
                                                                           txn.producer_epoch)
        message = KProdCommitMessage(partition_id=0, attempt=1, records=1, bytes=0,
                                                   transaction=txn, query_id="q")
        assert exactly_once.commit(config, ExactlyOnce(prefix, topic, one_write=True), [message], None).transactions == 1
    finally:
        for c in (first, second, admin):
            c.close()
    assert collections.Counter(_committed_values(cluster.bootstrap, topic, 1)) == collections.Counter(["b0"])
    assert_nothing_left_open(cluster.bootstrap, topic, 1)


def test_a_zombie_attempts_late_abort_leaves_the_next_attempts_transaction_to_commit(kafka: KafkaCluster) -> None:
    """Expected: the late aborts are refused, the second attempt's transaction stays open
    under its epoch, the driver commits it, and read_committed sees its row once and the
    zombie's never."""
    _run(kafka)


def test_the_same_on_protocol_v1(kafka_tv1: KafkaCluster) -> None:
    _run(kafka_tv1)
