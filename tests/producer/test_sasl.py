"""security.protocol=SASL_PLAINTEXT / SASL_SSL: kprod authenticates to a SASL proxy in
front of Tansu (the proxy's SCRAM server is scramp's, and it is itself checked against
librdkafka in tests/test_saslproxy.py), and confluent-kafka reads the records back."""

import time

import pyarrow as pa
import pytest

from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.producer.config import ProducerConfig, jaas_options
from spark_sink.producer.errors import ConfigError, SaslAuthenticationError
from tests.brokers import consume_all, free_port, start_tansu, unique_topic
from tests.saslproxy import SaslProxy
from tests.tlsproxy import make_pki

# SCRAM's reserved characters in a user name (escaped on the wire) and in a password.
USERS = {"alice": "alice-secret", "carol=c,d": "p,a=ss wörd"}
JAAS = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
        "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
        "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}


def _sasl(mechanism, user="alice", password=None, protocol="SASL_PLAINTEXT"):
    password = USERS[user] if password is None else password
    return {"security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.jaas.config": f'{JAAS[mechanism]} required username="{user}" password="{password}";'}


def _reader(mechanism, user="alice", protocol="sasl_plaintext", **extra):
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": USERS[user], **extra}


@pytest.fixture(scope="module")
def proxied():
    """(proxy, bootstrap) of a Tansu broker behind a SASL_PLAINTEXT proxy."""
    port = free_port()
    with SaslProxy("127.0.0.1", port, USERS) as proxy, start_tansu(port=port, advertised_port=proxy.port) as broker:
        yield proxy, broker.bootstrap


@pytest.mark.parametrize("mechanism, user", [("PLAIN", "alice"), ("SCRAM-SHA-256", "carol=c,d"),
                                             ("SCRAM-SHA-512", "alice")])
def test_send_and_send_arrow_authenticated(proxied, mechanism, user):
    proxy, bootstrap = proxied
    topic = unique_topic("sasl")
    with KafkaProducer({"bootstrap.servers": bootstrap, **_sasl(mechanism, user)}) as p:
        futures = [p.send(ProducerRecord(topic, b"v%d" % i, key=b"k%d" % (i % 5))) for i in range(300)]
        summary = p.send_arrow(pa.table({"value": [b"a%d" % i for i in range(1000)]}), topic=topic).result(60)
        p.flush(60)
        assert len({(f.result(10).partition, f.result(10).offset) for f in futures}) == 300
    assert summary.records == 1000
    assert (mechanism, user) in proxy.authentications
    values = sorted(m.value() for m in consume_all(bootstrap, topic, 1300, overrides=_reader(mechanism, user)))
    assert values == sorted([b"v%d" % i for i in range(300)] + [b"a%d" % i for i in range(1000)])


def test_sasl_over_tls(tmp_path):
    pki = make_pki(tmp_path)
    port = free_port()
    with SaslProxy("127.0.0.1", port, USERS, ssl_context=pki.server_context()) as proxy, \
            start_tansu(port=port, advertised_port=proxy.port) as broker:
        topic = unique_topic("sasl-ssl")
        config = {"bootstrap.servers": broker.bootstrap, "ssl.truststore.location": str(pki.ca),
                  **_sasl("SCRAM-SHA-512", protocol="SASL_SSL")}
        with KafkaProducer(config) as p:
            assert p.send(ProducerRecord(topic, b"over tls")).result(30).offset >= 0
        assert proxy.authentications == [("SCRAM-SHA-512", "alice")] * len(proxy.authentications)
        messages = consume_all(broker.bootstrap, topic, 1, overrides=_reader(
            "SCRAM-SHA-512", protocol="sasl_ssl", **{"ssl.ca.location": str(pki.ca)}))
        assert messages[0].value() == b"over tls"


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_wrong_password_fails_at_once_without_showing_it(proxied, mechanism):
    proxy, bootstrap = proxied
    config = {"bootstrap.servers": bootstrap, "max.block.ms": 30000,
              **_sasl(mechanism, password="not-the-secret")}
    started = time.monotonic()
    with KafkaProducer(config) as p:
        with pytest.raises(SaslAuthenticationError, match="sasl.jaas.config") as info:
            p.send(ProducerRecord(unique_topic("sasl"), b"x"))
    assert time.monotonic() - started < 20  # not after max.block.ms
    assert "not-the-secret" not in str(info.value) and mechanism in str(info.value)
    assert any(f[0] == mechanism and f[1] == "alice" for f in proxy.failures)


def test_mechanism_the_broker_does_not_enable(proxied):
    _, upstream = proxied
    host, port = upstream.rsplit(":", 1)
    with SaslProxy(host, int(port), USERS, mechanisms=("PLAIN",)) as plain_only:
        config = {"bootstrap.servers": f"127.0.0.1:{plain_only.port}", **_sasl("SCRAM-SHA-256")}
        with KafkaProducer(config) as p:
            with pytest.raises(SaslAuthenticationError, match="SCRAM-SHA-256 is not enabled.*offers PLAIN"):
                p.partitions_for(unique_topic("sasl"))


def test_session_lifetime_is_renewed_before_the_broker_ends_it():
    port = free_port()
    with SaslProxy("127.0.0.1", port, USERS, session_lifetime_ms=1500) as proxy, \
            start_tansu(port=port, advertised_port=proxy.port) as broker:
        topic = unique_topic("sasl-reauth")
        with KafkaProducer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20,
                            **_sasl("SCRAM-SHA-256")}) as p:
            futures = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                futures += [p.send(ProducerRecord(topic, b"%d" % len(futures))) for _ in range(50)]
                time.sleep(0.05)
            p.flush(60)
            offsets = [f.result(10).offset for f in futures]
        # Every session was replaced before it expired: no connection was cut with requests
        # on it, and every record was written once.
        assert proxy.sessions_expired == 0
        assert len(proxy.authentications) >= 3
        assert len(set(offsets)) == len(futures)
        assert len(consume_all(broker.bootstrap, topic, len(futures), settle=1.0,
                               overrides=_reader("SCRAM-SHA-256"))) == len(futures)


@pytest.mark.parametrize("settings, named", [
    ({"security.protocol": "SASL_SSL"}, "sasl.mechanism.*Kerberos"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}, "sasl.mechanism"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "sasl.jaas.config: required"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": "username=alice password=hunter2"}, "sasl.jaas.config: expected"),
    ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
      "sasl.jaas.config": 'a.B required username="alice";'}, "password option"),
])
def test_bad_sasl_settings_name_the_key_and_hide_the_password(settings, named):
    with pytest.raises(ConfigError, match=named) as info:
        KafkaProducer({"bootstrap.servers": "127.0.0.1:9", **settings})
    assert "hunter2" not in str(info.value)


def test_jaas_values_quoted_or_bare_with_escapes_and_never_in_the_repr():
    assert jaas_options('x.PlainLoginModule required username=bob password="p\\"w;d" extra = "1";') == {
        "username": "bob", "password": 'p"w;d', "extra": "1"}
    text = repr(ProducerConfig.from_dict({"bootstrap.servers": "h:1", **_sasl("PLAIN")}))
    assert "alice-secret" not in text and "SASL_PLAINTEXT" in text
