"""The brokers themselves: Apache Kafka (the suite's) and Tansu (the demo's) start, create
topics and round-trip through confluent-kafka.

If these fail, every integration test would fail for a reason that is not kprod's.
"""

import pytest
from confluent_kafka import Producer

from tests.brokers import consume_all, create_topic, partition_counts, unique_topic


@pytest.mark.parametrize("which", ["kafka", "tansu"])
def test_broker_round_trip_with_reference_client(request, which):
    broker = request.getfixturevalue(which)
    topic = create_topic(broker.bootstrap, unique_topic("fixture"), partitions=3)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(30):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    assert p.flush(30) == 0
    messages = consume_all(broker.bootstrap, topic, 30)
    assert sorted(m.value() for m in messages) == sorted(b"v%d" % i for i in range(30))
    assert partition_counts(messages) == {0: 10, 1: 10, 2: 10}
