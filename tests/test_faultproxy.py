"""The fault proxy forwards faithfully, and its cuts are real: checked with confluent-kafka."""

from __future__ import annotations

from typing import TYPE_CHECKING

from confluent_kafka import Producer

from tests.brokers import consume_all, create_topic, unique_topic

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
