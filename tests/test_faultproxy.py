"""The fault proxy forwards faithfully, and its cuts are real: checked with confluent-kafka."""

from confluent_kafka import Producer

from tests.brokers import consume_all, create_topic, unique_topic


def test_proxy_forwards_every_connection_and_cuts_them(kafka_proxy):
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
