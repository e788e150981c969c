"""murmur2 equals Java's: known values from Kafka's own tests, and librdkafka's murmur2 partitioner."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from kprod_broker import KafkaCluster
from spark_sink.producer.partitioner import (
    StickyPartitions,
    murmur2,
    murmur2_array,
    partition_for_hash,
    partition_for_key,
)

# Values asserted by Apache Kafka's UtilsTest.testMurmur2.
JAVA_CASES = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_known_java_values() -> None:
    for key, expected in JAVA_CASES.items():
        assert murmur2(key) == expected, key


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=37), min_size=1, max_size=50))
def test_vectorised_equals_scalar(keys: list[bytes]) -> None:
    assert murmur2_array(pa.array(keys, pa.binary())).tolist() == [murmur2(k) for k in keys]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 13), st.lists(st.binary(min_size=13, max_size=13), min_size=1, max_size=30), st.integers(0, 3))
def test_vectorised_equal_length_keys(length: int, raw: list[bytes], cut: int) -> None:
    # Every length mod 4 (the tail bytes), and a slice that starts them mid-buffer.
    keys = [k[:length] for k in raw]
    arr = pa.array([b"x" * 5] * cut + keys, pa.binary()).slice(cut)
    assert murmur2_array(arr).tolist() == [murmur2(k) for k in keys]
    assert murmur2_array(pa.array(keys, pa.large_binary())).tolist() == [murmur2(k) for k in keys]


def test_vectorised_handles_slices_nulls_and_strings() -> None:
    arr = pa.array(["", "a", "ab", "abc", "abcd", None, "abcde"]).slice(1)
    assert murmur2_array(arr).tolist() == [murmur2(k) for k in (b"a", b"ab", b"abc", b"abcd", b"", b"abcde")]


def test_partition_matches_librdkafka_murmur2_partitioner(kafka: KafkaCluster) -> None:
    from confluent_kafka import Message, Producer

    from tests.brokers import create_topic, unique_topic

    topic = create_topic(kafka.bootstrap, unique_topic("murmur"), partitions=7)
    placed: dict[bytes, int] = {}

    def delivered(err: object, msg: Message) -> None:
        key, partition = msg.key(), msg.partition()
        assert isinstance(key, bytes) and partition is not None, (err, key, partition)
        placed[key] = partition

    p = Producer({"bootstrap.servers": kafka.bootstrap, "partitioner": "murmur2_random"})
    for i in range(50):
        key = b"key-%d" % i
        p.produce(topic, b"v", key=key, on_delivery=delivered)
    assert p.flush(30) == 0
    assert placed == {k: partition_for_hash(murmur2(k), 7) for k in placed}


def test_partition_for_key_is_javas_to_positive_modulo() -> None:
    # murmur2(b"21") is negative: toPositive masks the sign bit before the modulo.
    assert partition_for_key(b"21", 7) == (-973932308 & 0x7FFFFFFF) % 7
    assert all(partition_for_key(k, 5) == partition_for_hash(murmur2(k), 5) for k in JAVA_CASES)


def test_sticky_partition_stays_until_moved_on_and_avoids_unavailable_partitions() -> None:
    available = {"t": [1, 3]}
    sticky = StickyPartitions(lambda topic: available.get(topic, []))
    first = sticky.current("t", 4)
    assert first in (1, 3) and sticky.current("t", 4) == first
    assert sticky.next("t", 4) == ({1, 3} - {first}).pop()  # moves on, to the other live one
    assert sticky.current("u", 2) in (0, 1)  # no leader known yet: any partition of the topic
    assert sticky.current("t", 1) == 0  # the topic shrank below the sticky partition
