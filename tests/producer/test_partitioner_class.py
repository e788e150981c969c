"""partitioner.class against a real broker: Java's RoundRobinPartitioner and a Python
callable, through send() and send_arrow(), an explicit partition always winning."""

from __future__ import annotations

import pyarrow as pa

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, create_topic, unique_topic

ROUND_ROBIN = "org.apache.kafka.clients.producer.RoundRobinPartitioner"


def _partitions(bootstrap: str, topic: str, n: int) -> list[int]:
    return sorted(m.partition() for m in consume_all(bootstrap, topic, n))


def test_round_robin_spreads_keyed_records_one_by_one(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("rr"), partitions=4)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "partitioner.class": ROUND_ROBIN}) as producer:
        for _ in range(4):
            producer.send(ProducerRecord(topic, b"v", key=b"same key")).result(30)
        producer.send_arrow(pa.table({"key": [b"k"] * 8, "value": [b"v"] * 8}), topic).result(30)
        producer.send_arrow(pa.table({"value": [b"v"] * 2, "partition": pa.array([3, None], pa.int32())}),
                            topic).result(30)
    # 4 + 8 round robin, then 3 explicit and 1 round robin: 3 on each partition, 4 on 3.
    parts = _partitions(kafka.bootstrap, topic, 14)
    assert [parts.count(p) for p in range(4)] == [4, 3, 3, 4]


def test_a_python_callable_by_import_path(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("custom"), partitions=3)
    config = {"bootstrap.servers": kafka.bootstrap, "partitioner.class": "tests.spark.partitioners:always_zero"}
    with KafkaProducer(config) as producer:
        producer.send(ProducerRecord(topic, b"v", key=b"a")).result(30)
        producer.send_arrow(pa.table({"key": [b"x", b"y", None], "value": [b"1", b"2", b"3"]}), topic).result(30)
        producer.send(ProducerRecord(topic, b"v", partition=2)).result(30)
    assert _partitions(kafka.bootstrap, topic, 5) == [0, 0, 0, 0, 2]
