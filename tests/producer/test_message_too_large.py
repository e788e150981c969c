"""A topic whose max.message.bytes is below batch.size, on a real Kafka: the broker refuses
a batch of many small records with MESSAGE_TOO_LARGE; the producer splits it, as Java's
does, and every record arrives once, in order where the producer keeps order
(idempotent, transactional), with the offsets its futures report. A record too large on
its own fails naming the topic, partition and size. Seeded random sizes and settings."""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.protocol.error_codes import MessageTooLargeError
from tests.brokers import consume_all, unique_topic

LIMIT = 3000  # the topic's max.message.bytes


def _small_topic(bootstrap: str, partitions: int) -> str:
    name = unique_topic("small-msg")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config={"max.message.bytes": str(LIMIT)})])[name].result(30)
    deadline = time.monotonic() + 30
    while True:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if topic and topic.error is None and all(p.leader >= 0 for p in topic.partitions.values()):
            return name
        assert time.monotonic() < deadline
        time.sleep(0.1)


SETTINGS = {
    "idempotent": {},
    "idempotent-lz4": {"compression.type": "lz4"},
    "not-idempotent": {"enable.idempotence": "false", "max.in.flight.requests.per.connection": "1"},
    "transactional": {"transactional.id": "split"},
}


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_batches_over_the_topics_limit_are_split_and_arrive_in_order(kafka: KafkaCluster, setting: str,
                                                                      seed: int) -> None:
    rng = random.Random(f"{setting}-{seed}")
    topic = _small_topic(kafka.bootstrap, rng.choice([1, 3]))
    n = rng.choice([40, 700, 5000])
    # Each record fits the topic on its own; the batches kprod makes (batch.size 16 KiB) do not.
    sizes = [rng.choice([0, rng.randrange(1, 200), rng.randrange(200, LIMIT - 200)]) for _ in range(n)]
    values = [b"%06d:" % i + rng.randbytes(s) for i, s in enumerate(sizes)]
    keys = [b"k%d" % rng.randrange(20) for _ in range(n)]
    config: dict[str, str] = {"bootstrap.servers": kafka.bootstrap, **SETTINGS[setting]}
    if "transactional.id" in config:
        config["transactional.id"] = unique_topic("split-txn")
    with KafkaProducer(config) as p:
        if "transactional.id" in config:
            p.init_transactions(30)
            p.begin_transaction()
        result = p.send_arrow(pa.table({"key": keys, "value": values}), topic).result(120)
        # send()'s records too, with their offsets.
        futures = [p.send(ProducerRecord(topic, b"single-%03d|" % i + bytes(rng.randrange(LIMIT // 2)),
                                         partition=0)) for i in range(30)]
        p.flush(120)
        if "transactional.id" in config:
            p.commit_transaction(30)
    assert result.records == n
    assert sum(count for count, _, _ in result.partitions.values()) == n
    got = consume_all(kafka.bootstrap, topic, n + 30, settle=0.5, overrides={"isolation.level": "read_committed"})
    arrow = [m for m in got if not m.value().startswith(b"single-")]
    assert sorted(m.value() for m in arrow) == sorted(values)
    by_partition: dict[int, list[int]] = {}
    for m in sorted(arrow, key=lambda m: (m.partition(), m.offset())):
        by_partition.setdefault(m.partition(), []).append(int(m.value()[:6]))
    for rows in by_partition.values():
        assert rows == sorted(rows), "a partition's rows out of their input order"
    offsets = {m.value()[:11]: m.offset() for m in got if m.value().startswith(b"single-")}
    assert len(offsets) == 30
    for i, f in enumerate(futures):
        # -1 only where another producer wrote between the halves of its batch: none here.
        assert f.result(0).offset == offsets[b"single-%03d|" % i]


def test_a_record_too_large_on_its_own_fails_naming_topic_partition_and_size(kafka: KafkaCluster) -> None:
    topic = _small_topic(kafka.bootstrap, 1)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        with pytest.raises(MessageTooLargeError) as failure:
            p.send_arrow(pa.table({"value": [b"a", b"x" * (LIMIT + 10), b"b"]}), topic).result(60)
        # The other rows' batches were split from it and went through.
        p.send_arrow(pa.table({"value": [b"after"]}), topic).result(60)
    message = str(failure.value)
    assert f"{topic}-0" in message and "max.message.bytes" in message, message
    assert "bytes holding one record" in message, message
    assert sorted(m.value() for m in consume_all(kafka.bootstrap, topic, 3, settle=0.5)) == [b"a", b"after", b"b"]
