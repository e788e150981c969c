"""A principal that may write a topic but not describe its settings (no DescribeConfigs
right), on a real Kafka with an authorizer: the producer cannot learn the topic's
max.message.bytes, says so once in a warning naming the topic, and falls back to the
broker's refusal: rows within the limit arrive, a record over it fails its write with the
broker's MESSAGE_TOO_LARGE (even with on_error="skip", which can only refuse what is known
before sending), and nothing is refused that the broker would take."""

from __future__ import annotations

import logging
import random

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer
from spark_sink.protocol.error_codes import MessageTooLargeError
from tests.brokers import consume_all, deny_topic
from tests.producer.test_message_too_large import LIMIT, _small_topic


@pytest.mark.parametrize("seed", range(2))
def test_without_describe_configs_the_broker_refuses_what_is_too_large(acl_kafka: KafkaCluster, seed: int,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(seed)
    bootstrap = acl_kafka.bootstrap
    topic = _small_topic(bootstrap, rng.choice([1, 3]))
    deny_topic(bootstrap, topic, "DESCRIBE_CONFIGS", allow=("DESCRIBE", "READ", "WRITE"))
    caplog.set_level(logging.WARNING, logger="spark_sink.producer.sender")
    good = [b"%04d:" % i + rng.randbytes(rng.randrange(0, LIMIT // 3)) for i in range(rng.choice([5, 200]))]
    with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as p:
        p.send_arrow(pa.table({"value": good}), topic, on_error="skip").result(60)
        with pytest.raises(MessageTooLargeError) as failure:
            # Alone in its call, so that its batch holds it alone: the broker refuses that batch.
            p.send_arrow(pa.table({"value": [b"x" * (LIMIT + rng.randrange(10, 500))]}), topic,
                         on_error="skip").result(60)
        p.send_arrow(pa.table({"value": [b"after"]}), topic).result(60)
    assert topic in str(failure.value)
    got = consume_all(bootstrap, topic, len(good) + 1, settle=0.5)
    assert sorted(m.value() for m in got) == sorted([*good, b"after"])
    warnings = [r.getMessage() for r in caplog.records if "max.message.bytes of topics" in r.getMessage()]
    assert len(warnings) == 1 and topic in warnings[0] and "DescribeConfigs" in warnings[0], warnings
