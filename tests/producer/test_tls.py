"""security.protocol=SSL: TLS to Apache Kafka's own TLS listeners (server certificate only,
and mutual TLS), read back by confluent-kafka's consumer."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

from kprod_broker import TlsFiles, make_tls_files
from spark_sink.client.errors import ConfigError, KafkaTimeoutError, SslAuthenticationError
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, unique_topic
from tests.secure_kafka import SecureKafka


@pytest.fixture
def pki(secure_kafka: SecureKafka) -> TlsFiles:
    """The CA, the broker's and a client's certificates (PEM files)."""
    return secure_kafka.tls


@pytest.fixture
def tls_broker(secure_kafka: SecureKafka) -> str:
    """The TLS listener's address."""
    return secure_kafka.bootstrap("SSL")


def _tls(pki: TlsFiles, **extra: object) -> dict[str, object]:
    return {"security.protocol": "SSL", "ssl.truststore.location": str(pki.ca), **extra}


def test_send_and_send_arrow_over_tls(tls_broker: str, pki: TlsFiles) -> None:
    topic = unique_topic("tls")
    with KafkaProducer({"bootstrap.servers": tls_broker, **_tls(pki)}) as p:
        futures = [p.send(ProducerRecord(topic, b"v%d" % i, key=b"k%d" % (i % 7))) for i in range(500)]
        summary = p.send_arrow(pa.table({"value": [b"a%d" % i for i in range(2000)]}), topic=topic).result(60)
        p.flush(60)
        offsets = {(f.result(10).partition, f.result(10).offset) for f in futures}
    assert summary.records == 2000 and len(offsets) == 500
    messages = consume_all(tls_broker, topic, 2500,
                           overrides={"security.protocol": "ssl", "ssl.ca.location": str(pki.ca)})
    values = sorted(m.value() for m in messages)
    assert values == sorted([b"v%d" % i for i in range(500)] + [b"a%d" % i for i in range(2000)])


def test_pem_text_truststore_and_no_host_name_check(tls_broker: str, pki: TlsFiles) -> None:
    topic = unique_topic("tls")
    config = {"bootstrap.servers": tls_broker, "security.protocol": "SSL",
              "ssl.truststore.certificates": pki.ca.read_text(), "ssl.endpoint.identification.algorithm": ""}
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"x")).result(30).offset >= 0


def test_untrusted_broker_fails_at_once_with_the_settings_to_check(tls_broker: str, tmp_path: Path) -> None:
    other_ca = make_tls_files(tmp_path / "other")
    config = {"bootstrap.servers": tls_broker, "max.block.ms": 30000, **_tls(other_ca)}
    with KafkaProducer(config) as p:
        with pytest.raises(SslAuthenticationError, match="ssl.truststore.location") as info:
            p.partitions_for(unique_topic("tls"))
    assert "certificate verify failed" in str(info.value)


def test_plaintext_client_on_a_tls_listener_fails_within_max_block(tls_broker: str) -> None:
    with KafkaProducer({"bootstrap.servers": tls_broker, "max.block.ms": 1500}) as p:
        with pytest.raises(KafkaTimeoutError, match="max.block.ms"):
            p.partitions_for(unique_topic("tls"))


@pytest.mark.parametrize("settings, named", [
    ({"security.protocol": "SSL_TLS"}, "security.protocol"),
    ({"security.protocol": "TLS"}, "security.protocol"),
    ({"security.protocol": "SSL", "ssl.truststore.type": "BCFKS"}, "ssl.truststore.type"),
    ({"security.protocol": "SSL", "ssl.truststore.location": "/nonexistent/ca.pem"}, "ssl.truststore.location"),
    ({"security.protocol": "SSL", "ssl.keystore.location": "/nonexistent/me.pem"}, "ssl.keystore.location"),
    ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "ldap"},
     "ssl.endpoint.identification.algorithm"),
])
def test_bad_tls_settings_name_the_key(settings: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        KafkaProducer({"bootstrap.servers": "127.0.0.1:9", **settings})


def _keytool(*args: str) -> None:
    subprocess.run(["keytool", *args], check=True, capture_output=True)


@pytest.fixture
def mtls(secure_kafka: SecureKafka) -> tuple[str, Path, Path]:
    """(bootstrap, client cert, client key) of the listener that requires a client
    certificate from the test CA."""
    return secure_kafka.bootstrap("MTLS"), secure_kafka.tls.client_cert, secure_kafka.tls.client_key


# Each store is written once per CA: every keytool run is a JVM's start. The tests only read them.
@functools.cache
def _pkcs12_truststore(pki: TlsFiles) -> Path:
    """The CA in a PKCS12 truststore as keytool writes it (password changeit)."""
    truststore = Path(tempfile.mkdtemp(dir=pki.ca.parent)) / "truststore.p12"
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(pki.ca), "-keystore", str(truststore),
             "-storetype", "PKCS12", "-storepass", "changeit")
    return truststore


@pytest.mark.skipif(shutil.which("keytool") is None, reason="needs Java's keytool to write the stores")
def test_pkcs12_stores_written_by_keytool_and_openssl(mtls: tuple[str, Path, Path], pki: TlsFiles, tmp_path: Path) -> None:
    bootstrap, cert, key = mtls
    # A truststore as Java users have them: keytool's PKCS12 with a trusted-certificate entry.
    truststore = _pkcs12_truststore(pki)
    keystore = tmp_path / "keystore.p12"
    subprocess.run(["openssl", "pkcs12", "-export", "-in", str(cert), "-inkey", str(key), "-certfile", str(pki.ca),
                    "-out", str(keystore), "-passout", "pass:store-secret"], check=True, capture_output=True)
    config = {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
              "ssl.truststore.location": str(truststore), "ssl.truststore.type": "PKCS12",
              "ssl.truststore.password": "changeit", "ssl.keystore.location": str(keystore),
              "ssl.keystore.type": "PKCS12", "ssl.keystore.password": "store-secret"}
    topic = unique_topic("p12")
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"mutual")).result(30).offset >= 0
    assert not list(Path(tempfile.gettempdir()).glob("kprod-keystore-*"))  # the key's temporary file is gone
    # The same broker refuses a client without a certificate: the stores above did the work.
    with KafkaProducer({**config, "ssl.keystore.location": None, "max.block.ms": 30000}) as p:
        with pytest.raises(SslAuthenticationError, match="ssl.keystore"):
            p.partitions_for(topic)


def test_pem_keystore_for_mutual_tls(mtls: tuple[str, Path, Path], pki: TlsFiles, tmp_path: Path) -> None:
    bootstrap, cert, key = mtls
    keystore = tmp_path / "client.pem"
    keystore.write_bytes(key.read_bytes() + cert.read_bytes())
    config = {"bootstrap.servers": bootstrap, **_tls(pki, **{"ssl.keystore.location": str(keystore)})}
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(unique_topic("pem-mtls"), b"mutual")).result(30).offset >= 0


def test_missing_client_certificate_fails_at_once_naming_the_keystore(mtls: tuple[str, Path, Path], pki: TlsFiles) -> None:
    """A broker that requires a client certificate refuses the session (with TLS 1.3, by an
    alert after the client's side of the handshake is done): a fatal authentication error
    naming the setting, not retries until max.block.ms."""
    bootstrap, _, _ = mtls
    # max.block.ms an hour, past pytest's timeout: a client that retried until it ran out
    # would hang the test, not pass slowly (nor end in a timeout error rather than this).
    config = {"bootstrap.servers": bootstrap, "max.block.ms": 3_600_000, **_tls(pki)}
    with KafkaProducer(config) as p:
        with pytest.raises(SslAuthenticationError, match="ssl.keystore.location") as info:
            p.send(ProducerRecord(unique_topic("no-cert"), b"x")).result(60)
    assert "certificate" in str(info.value)


def _jks_stores(pki: TlsFiles, tmp_path: Path) -> tuple[Path, Path]:
    """Stores as Java shops hand them out, written by keytool: a JKS truststore with the
    CA as a trusted-certificate entry, and a JKS keystore whose key has a password of its
    own (ssl.key.password)."""
    truststore = tmp_path / "truststore.jks"
    _keytool("-importcert", "-noprompt", "-alias", "ca", "-file", str(pki.ca), "-keystore", str(truststore),
             "-storetype", "JKS", "-storepass", "trust-secret")
    p12 = tmp_path / "client.p12"
    subprocess.run(["openssl", "pkcs12", "-export", "-in", str(pki.client_cert), "-inkey", str(pki.client_key),
                    "-name", "client", "-out", str(p12), "-passout", "pass:p12-secret"], check=True, capture_output=True)
    keystore = tmp_path / "keystore.jks"
    _keytool("-importkeystore", "-noprompt", "-srckeystore", str(p12), "-srcstoretype", "PKCS12",
             "-srcstorepass", "p12-secret", "-srcalias", "client", "-destkeystore", str(keystore),
             "-deststoretype", "JKS", "-deststorepass", "store-secret", "-destalias", "client",
             "-destkeypass", "key-secret")
    return truststore, keystore


@functools.cache
def _jks_stores_once(pki: TlsFiles) -> tuple[Path, Path]:
    """:func:`_jks_stores` written once per CA."""
    return _jks_stores(pki, Path(tempfile.mkdtemp(dir=pki.ca.parent)))


needs_keytool = pytest.mark.skipif(shutil.which("keytool") is None and not os.environ.get("CI"),
                                   reason="needs Java's keytool to write the stores")


@needs_keytool
def test_jks_stores_written_by_keytool(mtls: tuple[str, Path, Path], pki: TlsFiles, tmp_path: Path) -> None:
    """JKS stores with no ssl.*.type given (JKS is Java's default) against the listener
    that requires a client certificate, read back by confluent-kafka."""
    bootstrap, _, _ = mtls
    truststore, keystore = _jks_stores_once(pki)
    config = {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
              "ssl.truststore.location": str(truststore), "ssl.truststore.password": "trust-secret",
              "ssl.keystore.location": str(keystore), "ssl.keystore.password": "store-secret",
              "ssl.key.password": "key-secret"}
    topic = unique_topic("jks")
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"from-jks")).result(30).offset >= 0
    assert not list(Path(tempfile.gettempdir()).glob("kprod-keystore-*"))  # the key's temporary file is gone
    messages = consume_all(bootstrap, topic, 1, overrides={
        "security.protocol": "ssl", "ssl.ca.location": str(pki.ca),
        "ssl.certificate.location": str(pki.client_cert), "ssl.key.location": str(pki.client_key)})
    assert [m.value() for m in messages] == [b"from-jks"]
    # As in Java: a truststore read without its password (no integrity check), and a
    # JKS file under ssl.*.type=PKCS12 (keystore.type.compat reads either kind).
    config.pop("ssl.truststore.password")
    with KafkaProducer({**config, "ssl.truststore.type": "PKCS12", "ssl.keystore.type": "PKCS12"}) as p:
        assert p.send(ProducerRecord(topic, b"again")).result(30).offset >= 0


@needs_keytool
def test_pkcs12_store_under_the_default_type(mtls: tuple[str, Path, Path], pki: TlsFiles, tmp_path: Path) -> None:
    """A PKCS12 truststore with no ssl.truststore.type: Java's default, JKS, reads it."""
    bootstrap, cert, key = mtls
    truststore = _pkcs12_truststore(pki)
    keystore = tmp_path / "client.pem"
    keystore.write_bytes(key.read_bytes() + cert.read_bytes())
    config = {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
              "ssl.truststore.location": str(truststore), "ssl.truststore.password": "changeit",
              "ssl.keystore.location": str(keystore)}  # a PEM keystore, under the default type too
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(unique_topic("p12-default"), b"x")).result(30).offset >= 0


def test_store_errors_name_the_setting_and_hide_the_password(pki: TlsFiles, tmp_path: Path) -> None:
    base = {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SSL"}
    truststore = tmp_path / "t.p12"
    subprocess.run(["openssl", "pkcs12", "-export", "-nokeys", "-in", str(pki.ca), "-out", str(truststore),
                    "-passout", "pass:right-one"], check=True, capture_output=True)
    cases = [
        ({"ssl.truststore.location": str(truststore), "ssl.truststore.type": "PKCS12",
          "ssl.truststore.password": "wrong-one"}, "ssl.truststore.location.*ssl.truststore.password"),
        ({"ssl.truststore.location": str(truststore)}, "ssl.truststore.location.*missing ssl.truststore.password"),
        ({"ssl.truststore.location": str(truststore), "ssl.truststore.type": "PEM"},
         "is a PKCS12 store, not PEM; set ssl.truststore.type=PKCS12"),
        ({"ssl.truststore.location": str(pki.ca), "ssl.truststore.type": "PKCS12"},
         "ssl.truststore.location.*if it is PEM, set ssl.truststore.type=PEM"),
        ({"ssl.keystore.location": str(truststore), "ssl.keystore.type": "PKCS12",
          "ssl.keystore.password": "right-one"}, "ssl.keystore.location.*no private key"),
        ({"ssl.truststore.type": "BKS"}, "ssl.truststore.type: expected JKS, PKCS12 or PEM"),
    ]
    if shutil.which("keytool") or os.environ.get("CI"):
        jks_truststore, jks_keystore = _jks_stores_once(pki)
        good = {"ssl.keystore.location": str(jks_keystore), "ssl.keystore.password": "store-secret"}
        cases += [
            ({"ssl.truststore.location": str(jks_truststore), "ssl.truststore.password": "wrong-one"},
             "ssl.truststore.location.*as JKS.*ssl.truststore.password"),
            ({"ssl.truststore.location": str(jks_truststore), "ssl.truststore.type": "PEM"},
             "is a JKS store, not PEM; set ssl.truststore.type=JKS"),
            ({**good, "ssl.keystore.password": "wrong-one"}, "ssl.keystore.location.*ssl.keystore.password"),
            ({**good, "ssl.key.password": "wrong-one"}, "ssl.keystore.location.*wrong or missing ssl.key.password"),
            (good, r"ssl.keystore.location.*ssl.key.password \(or ssl.keystore.password\)"),
            ({"ssl.keystore.location": str(jks_truststore), "ssl.keystore.password": "trust-secret"},
             "ssl.keystore.location.*no private key"),
        ]
    for settings, named in cases:
        with pytest.raises(ConfigError, match=named) as info:
            KafkaProducer({**base, **settings})
        for secret in ("wrong-one", "right-one", "store-secret", "key-secret", "trust-secret"):
            assert secret not in str(info.value)
