"""Errors that name the cause: a producer that reaches no broker says, per bootstrap
address, what happened; an unknown topic is called one; check_cluster says the same at
once. On Apache Kafka: its plain, TLS and SASL listeners, and a node that creates no
topics on first use (tests/strict_kafka.py)."""

from __future__ import annotations

import logging
import socket

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.client import check_cluster
from spark_sink.producer import (
    BrokersUnreachableError,
    KafkaProducer,
    KafkaTimeoutError,
    ProducerRecord,
    SaslAuthenticationError,
    UnknownTopicError,
)
from tests.brokers import create_topic, unique_topic
from tests.secure_kafka import JAAS, SecureKafka

UNRESOLVABLE = "no-such-broker.invalid:9092"
# The wait before a producer that reached no broker says why. On loopback each address
# fails within milliseconds: a second and a half is a wide margin on a loaded machine.
# (An unresolvable name asks the resolver, which may be slow: those tests wait longer.)
LOOPBACK_BLOCK_MS = 1500


def _closed_port() -> str:
    """An address where nothing listens: a port bound, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _unreachable(config: dict, topic: str = "t") -> str:
    with KafkaProducer(config) as producer, pytest.raises(BrokersUnreachableError) as err:
        producer.send(ProducerRecord(topic, b"v"))
    return str(err.value)


def test_no_broker_reached_names_each_address_and_what_happened(caplog: pytest.LogCaptureFixture) -> None:
    closed = _closed_port()
    caplog.set_level(logging.INFO, logger="spark_sink.client.network")
    message = _unreachable({"bootstrap.servers": f"{closed},{UNRESOLVABLE}", "max.block.ms": 3000})
    assert f"{closed}: connection refused" in message
    assert f"{UNRESOLVABLE}: name not resolved" in message
    assert "max.block.ms" in message and "'t'" in message
    assert isinstance(BrokersUnreachableError(), KafkaTimeoutError)  # what Java's callers catch
    assert "3000 ms" in message  # the max.block.ms given, not the 60 s default
    # The first failure per address is a warning; the retries that follow are not.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(w.split(" ")[3] for w in warnings) == sorted([closed, UNRESOLVABLE])
    assert any(r.levelno == logging.INFO and closed in r.getMessage() for r in caplog.records)


def test_tls_spoken_to_a_plaintext_listener(kafka: KafkaCluster) -> None:
    message = _unreachable({"bootstrap.servers": kafka.bootstrap, "security.protocol": "SSL",
                               "max.block.ms": LOOPBACK_BLOCK_MS})
    assert f"{kafka.bootstrap}: TLS handshake failed" in message and "security.protocol" in message


def test_sasl_spoken_to_a_plaintext_listener(kafka: KafkaCluster) -> None:
    """The broker answers the SaslHandshake with ILLEGAL_SASL_STATE: the error points at
    security.protocol, at once."""
    config = {"bootstrap.servers": kafka.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
              "sasl.jaas.config": f'{JAAS["PLAIN"]} required username="alice" password="secret";'}
    with pytest.raises(SaslAuthenticationError) as err:  # a wait would hang: an hour's bound
        check_cluster(config, ["t"], 3_600_000)
    assert "ILLEGAL_SASL_STATE" in str(err.value) and "check security.protocol" in str(err.value)


def test_plaintext_spoken_to_a_tls_listener(secure_kafka: SecureKafka) -> None:
    bootstrap = secure_kafka.bootstrap("SSL")
    message = _unreachable({"bootstrap.servers": bootstrap, "max.block.ms": LOOPBACK_BLOCK_MS})
    assert f"{bootstrap}: the broker closed the connection before answering ApiVersions" in message
    assert "security.protocol" in message


@pytest.mark.parametrize("send", ["send", "send_arrow"])
def test_unknown_topic_is_called_one_within_seconds(strict_kafka: KafkaCluster, send: str) -> None:
    """The brokers answer UNKNOWN_TOPIC_OR_PARTITION and create nothing: the producer says
    so after 2 s of such answers, not after max.block.ms (60 s by default), as Java would."""
    topic = unique_topic("missing")
    with KafkaProducer({"bootstrap.servers": strict_kafka.bootstrap}) as producer:
        with pytest.raises(UnknownTopicError) as err:
            if send == "send":
                producer.send(ProducerRecord(topic, b"v"))
            else:
                producer.send_arrow(pa.table({"value": [b"v"], "topic": [topic]}))
    assert str(err.value).startswith(f"topic {topic!r} does not exist on the cluster at {strict_kafka.bootstrap} "
                                     "(waited 2000 ms of UNKNOWN_TOPIC_OR_PARTITION answers)")  # not max.block.ms
    assert "UNKNOWN_TOPIC_OR_PARTITION" in str(err.value) and "auto.create.topics.enable" in str(err.value)


def test_offsets_for_a_group_without_a_coordinator_name_why(strict_kafka: KafkaCluster,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """strict_kafka cannot create __consumer_offsets, so it answers every FindCoordinator
    for a group with COORDINATOR_NOT_AVAILABLE. send_offsets_to_transaction retries that
    (a new cluster answers so while it creates the topic), warns once it has lasted 5 s,
    and its timeout names the request, the group, the error and the likely cause."""
    topic = create_topic(strict_kafka.bootstrap, unique_topic("offsets"), 1)
    group = unique_topic("group")
    caplog.set_level(logging.WARNING, logger="spark_sink.producer.transactions.coordinator_requests")
    with KafkaProducer({"bootstrap.servers": strict_kafka.bootstrap, "transactional.id": unique_topic("tid"),
                        "max.block.ms": 6000}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(KafkaTimeoutError) as err:
            producer.send_offsets_to_transaction({(topic, 0): 5}, group)
    message = str(err.value)
    assert message.startswith(f"send_offsets_to_transaction() did not finish within 6000 ms (max.block.ms): "
                              f"TXN_OFFSET_COMMIT for group {group!r} met [COORDINATOR_NOT_AVAILABLE"), message
    assert "__consumer_offsets" in message and "offsets.topic.replication.factor" in message
    (warning,) = [r.getMessage() for r in caplog.records if "still retrying" in r.getMessage()]
    assert f"for group {group!r} met [COORDINATOR_NOT_AVAILABLE" in warning


# -- check_cluster: the same errors at once -------------------------------------------

def test_check_cluster_fails_at_once_when_every_address_failed() -> None:
    closed = _closed_port()
    with pytest.raises(BrokersUnreachableError) as err:
        check_cluster({"bootstrap.servers": f"{closed},{UNRESOLVABLE}"}, ["t"], 60000)
    # Once every address failed, not "no broker ... answered within 60000 ms" at the deadline.
    assert str(err.value).startswith(f"cannot reach any bootstrap server of {closed},{UNRESOLVABLE}: "), err.value
    assert f"{closed}: connection refused" in str(err.value) and f"{UNRESOLVABLE}: name not resolved" in str(err.value)


def test_check_cluster_counts_partitions_and_refuses_unknown_topics(strict_kafka: KafkaCluster) -> None:
    bootstrap = strict_kafka.bootstrap
    topic = create_topic(bootstrap, unique_topic("known"), partitions=3)
    assert check_cluster({"bootstrap.servers": f"{_closed_port()},{bootstrap}"}, [topic], 60000) == {topic: 3}
    missing = unique_topic("missing")
    with pytest.raises(UnknownTopicError, match=f"topic '{missing}' does not exist on the cluster at {bootstrap}"):
        check_cluster({"bootstrap.servers": bootstrap}, [topic, missing], 60000)


def test_check_cluster_wrong_password(secure_kafka: SecureKafka) -> None:
    config = {"bootstrap.servers": secure_kafka.bootstrap("SASLPLAIN"), "security.protocol": "SASL_PLAINTEXT",
              "sasl.mechanism": "SCRAM-SHA-256",
              "sasl.jaas.config": f'{JAAS["SCRAM-SHA-256"]} required username="alice" password="wrong-one";'}
    with pytest.raises(SaslAuthenticationError) as err:
        check_cluster(config, ["t"], 60000)
    assert "wrong-one" not in str(err.value) and "sasl.jaas.config" in str(err.value)


def test_check_cluster_lets_the_cluster_create_a_topic_on_first_use(kafka: KafkaCluster) -> None:
    """Kafka answers UNKNOWN_TOPIC_OR_PARTITION to the request that makes it create a topic:
    where auto.create.topics.enable is on (the default), a new topic is not an error."""
    topic = unique_topic("auto")
    assert check_cluster({"bootstrap.servers": kafka.bootstrap}, [topic], 60000) in ({topic: 0}, {topic: 1})
