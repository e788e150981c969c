"""The fault proxy forwards faithfully, its cuts are real and its request counts right:
checked with confluent-kafka."""

from __future__ import annotations

import collections
import random
import struct
import threading
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

from spark_sink.protocol.apis import ApiKey
from tests.brokers import consume_all, create_topic, unique_topic
from tests.faultproxy import RequestFrames

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka


def test_proxy_forwards_every_connection_and_cuts_them(kafka_proxy: ProxiedKafka) -> None:
    proxy, broker = kafka_proxy.proxy, kafka_proxy
    assert broker.bootstrap == f"127.0.0.1:{proxy.port}"
    topic = create_topic(broker.bootstrap, unique_topic("proxy"), partitions=2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    p.produce(topic, b"before")
    assert p.flush(30) == 0
    assert proxy.connections_accepted >= 1
    assert proxy.cut_all() >= 1
    p.produce(topic, b"after")
    assert p.flush(30) == 0
    assert sorted(m.value() for m in consume_all(broker.bootstrap, topic, 2)) == [b"after", b"before"]


def test_delayed_replies_come_late_but_whole_and_in_order(kafka_proxy: ProxiedKafka) -> None:
    import time

    proxy, broker = kafka_proxy.proxy, kafka_proxy
    topic = create_topic(broker.bootstrap, unique_topic("proxy-delay"), partitions=1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    p.produce(topic, b"warm")
    assert p.flush(30) == 0
    proxy.set_delay(200, replies_only=True)
    started = time.monotonic()
    p.produce(topic, b"late")
    assert p.flush(30) == 0
    assert time.monotonic() - started >= 0.2  # a round trip takes at least the added delay
    for i in range(2000):
        p.produce(topic, b"%d" % i)
    assert p.flush(60) == 0
    got = [m.value() for m in sorted(consume_all(broker.bootstrap, topic, 2002), key=lambda m: m.offset())]
    assert got == [b"warm", b"late"] + [b"%d" % i for i in range(2000)]


@pytest.mark.parametrize("seed", range(20))
def test_requests_are_counted_by_api_key_however_the_bytes_are_cut(seed: int) -> None:
    """Frames of random sizes (empty bodies and 6-byte ones included), the stream cut into
    chunks at random places: each request counted once, under its API key."""
    rng = random.Random(seed)
    keys = [rng.choice([0, 3, 18, 32, 1000]) for _ in range(rng.randint(1, 60))]
    stream = b"".join(struct.pack(">ih", 2 + size, key) + rng.randbytes(size)
                      for key in keys for size in [rng.choice([0, 4, rng.randrange(5000)])])
    counts: collections.Counter[int] = collections.Counter()
    frames = RequestFrames(counts, threading.Lock())
    at = 0
    while at < len(stream):
        step = rng.choice([1, 2, 5, 6, 7, rng.randrange(1, 9000)])
        frames.feed(stream[at:at + step])
        at += step
    assert counts == collections.Counter(keys)


def test_the_proxy_counts_what_a_client_sends(kafka_proxy: ProxiedKafka) -> None:
    """confluent-kafka's Produce requests through the proxy, as the broker sees them."""
    topic = create_topic(kafka_proxy.cluster.bootstrap, unique_topic("count"), partitions=1)
    produced_before = kafka_proxy.proxy.requests[ApiKey.PRODUCE]
    p = Producer({"bootstrap.servers": kafka_proxy.bootstrap, "linger.ms": 0})
    for i in range(3):
        p.produce(topic, b"%d" % i)
        assert p.flush(30) == 0  # one request each
    assert kafka_proxy.proxy.requests[ApiKey.PRODUCE] - produced_before == 3


def test_bytes_that_are_not_kafka_frames_stop_the_count() -> None:
    counts: collections.Counter[int] = collections.Counter()
    frames = RequestFrames(counts, threading.Lock())
    frames.feed(struct.pack(">ih", 6, 18) + bytes(4) + b"\xff\xff\xff\xff\x00\x03" + struct.pack(">ih", 2, 0))
    assert counts == collections.Counter({18: 1})
