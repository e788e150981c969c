"""A topic whose max.message.bytes is below batch.size, on a real Kafka: the broker refuses
a batch of many small records with MESSAGE_TOO_LARGE; the producer splits it, as Java's
does, and every record arrives once, in order where the producer keeps order
(idempotent, transactional), with the offsets its futures report. A record too large on
its own fails naming the topic, partition and size. Seeded random sizes and settings."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kprod_broker import KafkaCluster
from spark_sink.client.errors import RecordTooLargeError
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import MessageTooLargeError
from tests.brokers import consume_all, consume_to_marks, unique_topic

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka

LIMIT = 3000  # the topic's max.message.bytes
COMMITTED = {"isolation.level": "read_committed"}


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
    got = consume_to_marks(kafka.bootstrap, topic, overrides=COMMITTED)
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


def _varint_size(n: int) -> int:
    zigzag = n << 1
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size


def _alone_batch_size(key: bytes, value: bytes) -> int:
    """A record batch holding one record (no headers, deltas 0), by the v2 format's layout:
    the batch header (61 bytes with the log's offset and length) and the record."""
    body = 3 + _varint_size(len(key)) + len(key) + _varint_size(len(value)) + len(value) + 1
    return 61 + _varint_size(body) + body


def test_a_record_too_large_on_its_own_fails_before_sending_naming_topic_partition_and_size(
        kafka: KafkaCluster) -> None:
    topic = _small_topic(kafka.bootstrap, 1)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        with pytest.raises(RecordTooLargeError) as failure:
            p.send_arrow(pa.table({"value": [b"a", b"x" * (LIMIT + 10), b"b"]}), topic).result(60)
        p.send_arrow(pa.table({"value": [b"after"]}), topic).result(60)
    message = str(failure.value)
    size = _alone_batch_size(b"", b"x" * (LIMIT + 10))  # a null key takes a byte, as an empty one
    assert f"row 1 makes a record batch of {size} bytes for {topic}-0" in message, message
    assert f"max.message.bytes ({LIMIT}" in message, message
    # Refused before sending: nothing of the call arrived.
    assert [m.value() for m in consume_all(kafka.bootstrap, topic, 1, to_end=True)] == [b"after"]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("setting", ["idempotent", "transactional"])
def test_records_too_large_for_the_topic_are_refused_exactly_at_its_limit(kafka: KafkaCluster, setting: str,
                                                                          seed: int) -> None:
    """on_error="skip": every row whose batch alone would pass max.message.bytes is refused
    (by the exact size: a row one byte under arrives), the others arrive once, and under
    a transaction the good rows commit."""
    rng = random.Random(f"{setting}-limit-{seed}")
    topic = _small_topic(kafka.bootstrap, rng.choice([1, 3]))
    n = rng.choice([20, 300, 2000])
    keys = [b"k%d" % rng.randrange(1000) for _ in range(n)]
    # Sizes around the limit (its batch alone within a few bytes of it), and small ones.
    values = []
    for i, key in enumerate(keys):
        if rng.random() < 0.3:
            target = LIMIT + rng.randrange(-6, 7)
            length = max(0, target - _alone_batch_size(key, b""))
            while _alone_batch_size(key, bytes(length)) > target:
                length -= 1
            values.append(b"%06d:" % i + rng.randbytes(max(0, length - 7)))
        else:
            values.append(b"%06d:" % i + rng.randbytes(rng.randrange(0, 400)))
    too_large = {i for i, (k, v) in enumerate(zip(keys, values)) if _alone_batch_size(k, v) > LIMIT}
    config: dict[str, str] = {"bootstrap.servers": kafka.bootstrap, **SETTINGS[setting]}
    if setting == "transactional":
        config["transactional.id"] = unique_topic("limit-txn")
    with KafkaProducer(config) as p:
        if setting == "transactional":
            p.init_transactions(30)
            p.begin_transaction()
        result = p.send_arrow(pa.table({"key": keys, "value": values}), topic, on_error="skip").result(120)
        if setting == "transactional":
            p.commit_transaction(30)
    refused = {int(r) for group in result.refused for r in group.rows}
    assert refused == too_large
    assert {g.error for g in result.refused} <= {"RecordTooLargeError"}
    assert all(g.topic == topic and "max.message.bytes (3000)" in g.message for g in result.refused)
    expected = sorted(v for i, v in enumerate(values) if i not in too_large)
    got = consume_to_marks(kafka.bootstrap, topic, overrides=COMMITTED)
    assert sorted(m.value() for m in got) == expected
    # The limit is the broker's own: the smallest refused record is refused by it too.
    if too_large:
        i = min(too_large, key=lambda i: _alone_batch_size(keys[i], values[i]))
        with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
            with pytest.raises(MessageTooLargeError):
                p.send(ProducerRecord(topic, values[i], key=keys[i])).result(60)


def test_the_topics_limit_is_asked_once_per_topic(kafka_proxy: ProxiedKafka) -> None:
    """The common path pays one DescribeConfigs per topic per producer, nothing per call
    (counted by the proxy between the producer and the broker); a topic without an
    override has the broker's message.max.bytes."""
    small = _small_topic(kafka_proxy.cluster.bootstrap, 1)
    plain = unique_topic("plain")
    asked_before = kafka_proxy.proxy.requests[ApiKey.DESCRIBE_CONFIGS]
    with KafkaProducer({"bootstrap.servers": kafka_proxy.bootstrap}) as p:
        for topics in [[small], [plain], *[[small, plain]] * 4]:  # one new topic per call, then none
            p.send_arrow(pa.table({"value": [b"v"] * 10, "topic": topics * (10 // len(topics))})).result(60)
        assert (p.max_message_bytes(small), p.max_message_bytes(plain)) == (LIMIT, 1048588)  # Kafka's default
    assert kafka_proxy.proxy.requests[ApiKey.DESCRIBE_CONFIGS] - asked_before == 2
