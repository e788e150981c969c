"""security.protocol=SASL_PLAINTEXT / SASL_SSL: kprod authenticates to Apache Kafka's own
SASL listeners (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; see tests/secure_kafka.py), and
confluent-kafka reads the records back."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from spark_sink.client.config import jaas_options
from spark_sink.client.errors import ConfigError, SaslAuthenticationError
from spark_sink.producer import FutureRecordMetadata, KafkaProducer, ProducerRecord
from spark_sink.producer.config import ProducerConfig
from tests.brokers import consume_all, unique_topic
from tests.secure_kafka import JAAS, REAUTH_MS, USERS, SecureKafka


def _sasl(mechanism: str, user: str = "alice", password: str | None = None,
          protocol: str = "SASL_PLAINTEXT") -> dict[str, str]:
    password = USERS[user] if password is None else password
    return {"security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.jaas.config": f'{JAAS[mechanism]} required username="{user}" password="{password}";'}


def _reader(mechanism: str, user: str = "alice", protocol: str = "sasl_plaintext", **extra: str) -> dict[str, str]:
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": USERS[user], **extra}


@pytest.mark.parametrize("mechanism, user", [("PLAIN", "alice"), ("SCRAM-SHA-256", "spark"),
                                             ("SCRAM-SHA-512", "alice")])
def test_send_and_send_arrow_authenticated(secure_kafka: SecureKafka, mechanism: str, user: str) -> None:
    bootstrap = secure_kafka.bootstrap("SASLPLAIN")
    topic = unique_topic("sasl")
    with KafkaProducer({"bootstrap.servers": bootstrap, **_sasl(mechanism, user)}) as p:
        futures = [p.send(ProducerRecord(topic, b"v%d" % i, key=b"k%d" % (i % 5))) for i in range(300)]
        summary = p.send_arrow(pa.table({"value": [b"a%d" % i for i in range(1000)]}), topic=topic).result(60)
        p.flush(60)
        assert len({(f.result(10).partition, f.result(10).offset) for f in futures}) == 300
    assert summary.records == 1000
    values = sorted(m.value() for m in consume_all(bootstrap, topic, 1300, overrides=_reader(mechanism, user)))
    assert values == sorted([b"v%d" % i for i in range(300)] + [b"a%d" % i for i in range(1000)])


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_over_tls(secure_kafka: SecureKafka, mechanism: str) -> None:
    bootstrap, ca = secure_kafka.bootstrap("SASLSSL"), secure_kafka.tls.ca
    topic = unique_topic("sasl-ssl")
    config = {"bootstrap.servers": bootstrap, "ssl.truststore.location": str(ca),
              **_sasl(mechanism, protocol="SASL_SSL")}
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"over tls")).result(30).offset >= 0
    messages = consume_all(bootstrap, topic, 1, overrides=_reader(
        mechanism, protocol="sasl_ssl", **{"ssl.ca.location": str(ca)}))
    assert messages[0].value() == b"over tls"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_fails_at_once_without_showing_it(secure_kafka: SecureKafka, mechanism: str) -> None:
    bootstrap = secure_kafka.bootstrap("SASLPLAIN")
    # max.block.ms an hour, past pytest's timeout: waiting it out would hang the test.
    config = {"bootstrap.servers": bootstrap, "max.block.ms": 3_600_000,
              **_sasl(mechanism, password="not-the-secret")}
    with KafkaProducer(config) as p:
        with pytest.raises(SaslAuthenticationError, match="sasl.jaas.config") as info:
            p.send(ProducerRecord(unique_topic("sasl"), b"x"))
    assert "not-the-secret" not in str(info.value) and mechanism in str(info.value)


def test_mechanism_the_broker_does_not_enable(secure_kafka: SecureKafka) -> None:
    # The REAUTH listener enables SCRAM-SHA-256 alone.
    config = {"bootstrap.servers": secure_kafka.bootstrap("REAUTH"), **_sasl("SCRAM-SHA-512")}
    with KafkaProducer(config) as p:
        with pytest.raises(SaslAuthenticationError, match="SCRAM-SHA-512 is not enabled.*offers SCRAM-SHA-256"):
            p.partitions_for(unique_topic("sasl"))


def test_session_lifetime_is_renewed_before_the_broker_ends_it(secure_kafka: SecureKafka) -> None:
    """The REAUTH listener's sessions last 3 s (connections.max.reauth.ms): the broker
    closes a connection whose session expired. kprod moves to a new, authenticated
    connection before that; counted at the listener's proxy, the broker ended none."""
    bootstrap, proxy = secure_kafka.bootstrap("REAUTH"), secure_kafka.reauth_proxy
    topic = unique_topic("sasl-reauth")
    closed_by_broker, opened = proxy.closed_by_target, proxy.connections_accepted
    with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 20, **_sasl("SCRAM-SHA-256")}) as p:
        futures: list[FutureRecordMetadata] = []
        # Until the proxy has seen four connections: the first two (bootstrap and leader)
        # and two that replaced one whose session was ending; or ten sessions long.
        deadline = time.monotonic() + 10 * REAUTH_MS / 1000
        while proxy.connections_accepted - opened < 4 and time.monotonic() < deadline:
            futures += [p.send(ProducerRecord(topic, b"%d" % len(futures))) for _ in range(50)]
            time.sleep(0.05)
        p.flush(60)
        offsets = [f.result(10).offset for f in futures]
    assert proxy.connections_accepted - opened >= 4  # sessions were renewed
    assert proxy.closed_by_target == closed_by_broker  # and none ran out
    assert len(set(offsets)) == len(futures)
    assert len(consume_all(bootstrap, topic, len(futures), to_end=True,
                           overrides=_reader("SCRAM-SHA-256"))) == len(futures)


@pytest.mark.parametrize("settings, named", [
    # GSSAPI, Java's default mechanism, needs its Krb5LoginModule entry (tests/producer/test_kerberos.py).
    ({"security.protocol": "SASL_SSL"}, "sasl.jaas.config: required with sasl.mechanism=GSSAPI"),
    # OAUTHBEARER without a token source: Kafka's unsecured tokens are refused by name.
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}, "token.endpoint.url.*unsecured"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.jaas.config: required"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": "username=alice password=hunter2"}, "sasl.jaas.config: expected"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": 'a.B required username="alice";'}, "password option"),
])
def test_bad_sasl_settings_name_the_key_and_hide_the_password(settings: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        KafkaProducer({"bootstrap.servers": "127.0.0.1:9", **settings})
    assert "hunter2" not in str(info.value)


def test_jaas_values_quoted_or_bare_with_escapes_and_never_in_the_repr() -> None:
    assert jaas_options('x.PlainLoginModule required username=bob password="p\\"w;d" extra = "1";') == {
        "username": "bob", "password": 'p"w;d', "extra": "1"}
    text = repr(ProducerConfig.from_dict({"bootstrap.servers": "h:1", **_sasl("PLAIN")}))
    assert "alice-secret" not in text and "SASL_PLAINTEXT" in text
