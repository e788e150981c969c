"""security.protocol=SSL: TLS to the brokers, through a TLS-terminating proxy in front of
Tansu, read back over TLS by confluent-kafka's consumer."""

import pyarrow as pa
import pytest

from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.producer.errors import ConfigError, SslAuthenticationError
from tests.brokers import consume_all, free_port, start_tansu, unique_topic
from tests.tlsproxy import TlsProxy, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(pki):
    port = free_port()
    with TlsProxy(pki, "127.0.0.1", port) as proxy, start_tansu(port=port, advertised_port=proxy.port) as broker:
        yield broker


def _tls(pki, **extra):
    return {"security.protocol": "SSL", "ssl.truststore.location": str(pki.ca), **extra}


def test_send_and_send_arrow_over_tls(tls_broker, pki):
    topic = unique_topic("tls")
    with KafkaProducer({"bootstrap.servers": tls_broker.bootstrap, **_tls(pki)}) as p:
        futures = [p.send(ProducerRecord(topic, b"v%d" % i, key=b"k%d" % (i % 7))) for i in range(500)]
        summary = p.send_arrow(pa.table({"value": [b"a%d" % i for i in range(2000)]}), topic=topic).result(60)
        p.flush(60)
        offsets = {(f.result(10).partition, f.result(10).offset) for f in futures}
    assert summary.records == 2000 and len(offsets) == 500
    messages = consume_all(tls_broker.bootstrap, topic, 2500,
                           overrides={"security.protocol": "ssl", "ssl.ca.location": str(pki.ca)})
    values = sorted(m.value() for m in messages)
    assert values == sorted([b"v%d" % i for i in range(500)] + [b"a%d" % i for i in range(2000)])


def test_pem_text_truststore_and_no_host_name_check(tls_broker, pki):
    topic = unique_topic("tls")
    config = {"bootstrap.servers": tls_broker.bootstrap, "security.protocol": "SSL",
              "ssl.truststore.certificates": pki.ca.read_text(), "ssl.endpoint.identification.algorithm": ""}
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"x")).result(30).offset >= 0


def test_untrusted_broker_fails_at_once_with_the_settings_to_check(tls_broker, tmp_path):
    other_ca = make_pki(tmp_path / "other", name="another-ca")
    config = {"bootstrap.servers": tls_broker.bootstrap, "max.block.ms": 30000, **_tls(other_ca)}
    with KafkaProducer(config) as p:
        with pytest.raises(SslAuthenticationError, match="ssl.truststore.location") as info:
            p.partitions_for(unique_topic("tls"))
    assert "certificate verify failed" in str(info.value)


def test_plaintext_client_on_a_tls_listener_fails_within_max_block(tls_broker):
    from spark_sink.producer.errors import KafkaTimeoutError

    with KafkaProducer({"bootstrap.servers": tls_broker.bootstrap, "max.block.ms": 1500}) as p:
        with pytest.raises(KafkaTimeoutError, match="max.block.ms"):
            p.partitions_for(unique_topic("tls"))


@pytest.mark.parametrize("settings, named", [
    ({"security.protocol": "SSL_TLS"}, "security.protocol"),
    ({"security.protocol": "TLS"}, "security.protocol"),
    ({"security.protocol": "SSL", "ssl.truststore.type": "JKS"}, "ssl.truststore.type"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"}, "ssl.truststore.location"),
    ({"security.protocol": "SSL", "ssl.keystore.location": "/nonexistent/me.pem"}, "ssl.keystore.location"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldap"},
     "ssl.endpoint.identification.algorithm"),
])
def test_bad_tls_settings_name_the_key(settings, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        KafkaProducer({"bootstrap.servers": "127.0.0.1:9", **settings})
