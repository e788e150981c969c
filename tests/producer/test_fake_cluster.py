"""A whole KafkaProducer (its threads, accumulator, buffer pool, Sender and transactions)
against the in-process fake cluster: what the client decides on its own, in milliseconds
and without a JVM (``make unit``). What a broker decides is tested on real Kafka."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.protocol.error_codes import NotLeaderOrFollowerError
from spark_sink.protocol.messages import ApiKey
from tests.producer.fake_cluster import FakeCluster

TOPIC = "t"


def _producer(cluster: FakeCluster, **config: object) -> KafkaProducer:
    return KafkaProducer({"bootstrap.servers": "fake:9092", "linger.ms": 0, **config}, network_client=cluster)


def test_records_land_in_order_with_their_offsets_and_callbacks():
    cluster = FakeCluster(topics={TOPIC: [0, 0]})
    seen = []
    with _producer(cluster) as producer:
        futures = [producer.send(ProducerRecord(TOPIC, b"%d" % i, partition=i % 2),
                                 lambda md, err: seen.append((md.partition, md.offset, err)))
                   for i in range(2000)]
        producer.flush(10)
        offsets = [(f.result(0).partition, f.result(0).offset) for f in futures]
    assert cluster.values((TOPIC, 0)) == [b"%d" % i for i in range(0, 2000, 2)]
    assert cluster.values((TOPIC, 1)) == [b"%d" % i for i in range(1, 2000, 2)]
    assert offsets == [(i % 2, i // 2) for i in range(2000)]
    assert sorted(seen) == sorted((p, o, None) for p, o in offsets)


def test_a_lost_answer_is_retried_and_written_once():
    cluster = FakeCluster(topics={TOPIC: [0]}, lose_answers=1)
    with _producer(cluster) as producer:
        first = producer.send(ProducerRecord(TOPIC, b"a"))
        assert first.result(10).offset == 0  # the broker's first write, recognised by its sequence
        producer.send(ProducerRecord(TOPIC, b"b")).result(10)
    assert cluster.values((TOPIC, 0)) == [b"a", b"b"]


def test_a_retriable_error_is_retried_within_the_delivery_timeout():
    cluster = FakeCluster(topics={TOPIC: [0]}, fail_next={(TOPIC, 0): [NotLeaderOrFollowerError] * 3})
    with _producer(cluster, **{"retry.backoff.ms": 1}) as producer:
        assert producer.send(ProducerRecord(TOPIC, b"a")).result(10).offset == 0
        assert producer.metrics()["record-retry-total"] == 3
    assert cluster.values((TOPIC, 0)) == [b"a"]


@pytest.mark.parametrize("protocol", [1, 2])
def test_send_arrow_and_a_committed_transaction(protocol):
    cluster = FakeCluster(topics={TOPIC: [0, 0, 0]}, transaction_version=protocol)
    with _producer(cluster, **{"transactional.id": "tx"}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_arrow(pa.table({"key": [b"k%d" % i for i in range(300)], "value": [b"v"] * 300}),
                            topic=TOPIC).result(10)
        producer.commit_transaction()
    assert sum(len(cluster.values((TOPIC, p))) for p in range(3)) == 300
    ended = [r.body for r in cluster.requests if r.api_key == ApiKey.END_TXN]
    assert [e.committed for e in ended] == [True]
    # v1 adds the partitions before producing; v2's Produce adds them itself (KIP-890)
    added = [r for r in cluster.requests if r.api_key == ApiKey.ADD_PARTITIONS_TO_TXN]
    assert bool(added) == (protocol == 1)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_every_acks_setting_completes_every_future(acks):
    cluster = FakeCluster(topics={TOPIC: [0]})
    with _producer(cluster, acks=acks, **({"enable.idempotence": "false"} if acks != "all" else {})) as producer:
        futures = [producer.send(ProducerRecord(TOPIC, b"x")) for _ in range(100)]
        producer.flush(10)
    assert all(f.done() for f in futures)
    assert len(cluster.values((TOPIC, 0))) == 100
