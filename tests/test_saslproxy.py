"""The SASL proxy authenticates as a Kafka broker does: checked with librdkafka (confluent-kafka),
a client this project did not write, producing through the proxy and reading back.

kafka-python covers what librdkafka does not: SaslAuthenticate v2, and (through its protocol
codec on a bare socket) v0, errors, requests before authentication, a session left to
expire, SASL requests on an authenticated connection.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from tests.brokers import LocalBroker, consume_all, free_port, start_tansu, unique_topic
from tests.saslproxy import MECHANISMS, SaslProxy
from tests.tlsproxy import make_pki

# bob's password and carol's name hold SCRAM's reserved characters (',' and '='), which the
# client must escape in the user name (=2C, =3D) and send as is in the password.
USERS = {"alice": "alice-secret", "bob": "b,o=b pass", "carol=c,d": "carol-secret"}


@pytest.fixture(scope="module")
def sasl() -> Iterator[tuple[SaslProxy, LocalBroker]]:
    """A Tansu broker behind a SASL_PLAINTEXT proxy with every mechanism; ``bootstrap`` is the proxy's."""
    port = free_port()
    with SaslProxy("127.0.0.1", port, USERS) as proxy, start_tansu(port=port, advertised_port=proxy.port) as broker:
        yield proxy, broker


def client_config(bootstrap: str, mechanism: str, user: str, password: str,
                  protocol: str = "SASL_PLAINTEXT") -> dict[str, object]:
    return {"bootstrap.servers": bootstrap, "security.protocol": protocol, "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password}


def read_back(config: dict[str, object], topic: str, n: int, settle: float = 0.0) -> list:
    """Consume ``n`` records of ``topic`` with librdkafka and the SASL settings of ``config``."""
    overrides = {k: v for k, v in config.items() if k != "bootstrap.servers"}
    return consume_all(str(config["bootstrap.servers"]), topic, n, settle=settle, overrides=overrides)


def create_topic(config: dict[str, object], partitions: int = 2) -> str:
    """Create a topic through the proxy (tests.brokers.create_topic has no SASL settings)."""
    name = unique_topic("sasl")
    admin = AdminClient(config)
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(15)
    return name


def produce_and_read_back(config: dict[str, object], n: int = 5) -> None:
    """Produce ``n`` records with librdkafka, all delivered, and consume them again."""
    topic = create_topic(config)
    errors: list[KafkaError | None] = []
    producer = Producer(config)
    for i in range(n):
        producer.produce(topic, f"value-{i}".encode(), key=f"k{i}".encode(),
                         on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(15) == 0
    assert errors == [None] * n
    assert sorted(m.value() for m in read_back(config, topic, n)) == [f"value-{i}".encode() for i in range(n)]


def authentication_errors(config: dict[str, object], timeout: float = 10.0) -> list[KafkaError]:
    """Start a producer with ``config`` and return librdkafka's errors once one is about
    authentication (or all of them after ``timeout``)."""
    errors: list[KafkaError] = []
    producer = Producer({**config, "error_cb": errors.append, "reconnect.backoff.ms": 1000})
    producer.produce("never-delivered", b"x")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        producer.poll(0.1)
    producer.purge()
    return errors


@pytest.mark.parametrize("mechanism, user", [
    ("PLAIN", "alice"),
    ("SCRAM-SHA-256", "alice"),
    ("SCRAM-SHA-512", "alice"),
    ("PLAIN", "carol=c,d"),
    ("SCRAM-SHA-256", "bob"),
    ("SCRAM-SHA-512", "carol=c,d"),
])
def test_librdkafka_produces_and_consumes_through_the_proxy(sasl, mechanism, user):
    proxy, broker = sasl
    before = len(proxy.authentications)
    produce_and_read_back(client_config(broker.bootstrap, mechanism, user, USERS[user]))
    # Admin, producer and consumer each authenticate their bootstrap and broker connections.
    new = proxy.authentications[before:]
    assert len(new) >= 3 and set(new) == {(mechanism, user)}


@pytest.mark.parametrize("mechanism, user, password, message, reason", [
    ("PLAIN", "alice", "wrong", "Authentication failed: Invalid username or password",
     "invalid username or password"),
    ("SCRAM-SHA-256", "alice", "wrong",
     "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256",
     "The client keys don't match"),
    ("SCRAM-SHA-512", "mallory", "alice-secret",
     "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
     "Unknown user"),
])
def test_bad_credentials_fail_authentication(sasl, mechanism, user, password, message, reason):
    proxy, broker = sasl
    before = len(proxy.failures)
    errors = authentication_errors(client_config(broker.bootstrap, mechanism, user, password))
    auth_errors = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert auth_errors, f"no authentication error from librdkafka: {errors}"
    # librdkafka quotes the broker's error_message: the proxy's encoding of it reads back.
    assert message in auth_errors[0].str()
    failures = proxy.failures[before:]
    assert failures and all(f[:2] == (mechanism, user) and reason in f[2] for f in failures)


def test_a_mechanism_the_listener_lacks_is_refused(sasl):
    _, broker = sasl
    with SaslProxy("127.0.0.1", broker.port, USERS, mechanisms=["SCRAM-SHA-512"]) as proxy:
        errors = authentication_errors(client_config(f"127.0.0.1:{proxy.port}", "PLAIN", "alice", "alice-secret"))
        assert any("SCRAM-SHA-512" in e.str() for e in errors), errors
        assert proxy.failures and proxy.failures[0] == ("PLAIN", None, "unsupported mechanism")
        assert proxy.authentications == []


def test_sasl_ssl(tmp_path):
    pki = make_pki(tmp_path)
    port = free_port()
    with SaslProxy("127.0.0.1", port, USERS, ssl_context=pki.server_context()) as proxy, \
            start_tansu(port=port, advertised_port=proxy.port) as broker:
        config = client_config(broker.bootstrap, "SCRAM-SHA-512", "bob", USERS["bob"], protocol="SASL_SSL")
        produce_and_read_back({**config, "ssl.ca.location": str(pki.ca)})
        assert proxy.authentications and set(proxy.authentications) == {("SCRAM-SHA-512", "bob")}


# With acks=0 Produce has no response: the proxy must not wait for one before it answers the
# re-authentication.
@pytest.mark.parametrize("acks", ["all", "0"])
def test_librdkafka_reauthenticates_before_the_session_expires(sasl, acks):
    proxy, broker = sasl
    proxy.session_lifetime_ms = 1000
    try:
        config = client_config(broker.bootstrap, "SCRAM-SHA-256", "alice", USERS["alice"])
        topic = create_topic(config)
        reauthentications, expired = proxy.reauthentications, proxy.sessions_expired
        errors: list[KafkaError | None] = []
        producer = Producer({**config, "acks": acks})
        deadline = time.monotonic() + 2.5  # past two expiries
        while time.monotonic() < deadline:
            producer.produce(topic, b"v", on_delivery=lambda err, _msg: errors.append(err))
            producer.poll(0.05)
        assert producer.flush(15) == 0
        assert set(errors) == {None}
        assert proxy.reauthentications > reauthentications
        assert proxy.sessions_expired == expired
        assert len(read_back(config, topic, len(errors), settle=0.2)) == len(errors)
    finally:
        proxy.session_lifetime_ms = 0


# -- kafka-python ------------------------------------------------------------------------
# kafka-python (3.x) sends SaslAuthenticate v2 (flexible: compact fields, tagged fields) where
# librdkafka sends v1, and PLAIN with the user as authorization id. Its protocol codec, not the
# proxy's, also encodes and decodes the bare exchanges below.

@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_produces_through_the_proxy(sasl, mechanism):
    proxy, broker = sasl
    config = client_config(broker.bootstrap, mechanism, "bob", USERS["bob"])
    topic = create_topic(config)
    before = len(proxy.authentications)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism=mechanism, sasl_plain_username="bob", sasl_plain_password=USERS["bob"])
    try:
        producer.send(topic, b"from kafka-python").get(timeout=15)
    finally:
        producer.close()
    assert proxy.authentications[before:] and set(proxy.authentications[before:]) == {(mechanism, "bob")}
    assert [m.value() for m in read_back(config, topic, 1)] == [b"from kafka-python"]


class BareClient:
    """One connection to the proxy, requests and responses framed by kafka-python's codec."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.correlation_id = 0

    def send(self, request: ApiMessage) -> None:
        self.correlation_id += 1
        request.with_header(correlation_id=self.correlation_id)
        self.sock.sendall(request.encode(header=True, framed=True))

    def call(self, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage | None:
        """Send ``request``; its decoded response, or None if the proxy closed the connection."""
        self.send(request)
        frame = self.read_frame()
        if frame is None:
            return None
        response = response_class.decode(frame, version=request.API_VERSION, header=True, framed=True)
        assert response.header.correlation_id == self.correlation_id
        return response

    def read_frame(self) -> bytes | None:
        """The next response frame, size prefix included; None once the proxy closed."""
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            data += chunk
        return data

    def login(self, password: str, version: int = 1) -> ApiMessage | None:
        """SaslHandshake v1 for PLAIN, then SaslAuthenticate ``version`` as alice."""
        handshake = self.call(SaslHandshakeRequest(mechanism="PLAIN", version=1), SaslHandshakeResponse)
        assert handshake.error_code == 0 and handshake.mechanisms == list(MECHANISMS)
        token = f"\0alice\0{password}".encode()
        return self.call(SaslAuthenticateRequest(auth_bytes=token, version=version), SaslAuthenticateResponse)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def bare(sasl) -> Iterator[BareClient]:
    client = BareClient(sasl[1].bootstrap)
    yield client
    client.close()


def api_versions(client: BareClient) -> ApiMessage | None:
    return client.call(ApiVersionsRequest(version=0), ApiVersionsResponse)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_sasl_authenticate_versions(bare, version):
    response = bare.login(USERS["alice"], version)
    assert (response.error_code, response.error_message, response.auth_bytes) == (0, None, b"")
    if version >= 1:
        assert response.session_lifetime_ms == 0
    assert api_versions(bare).error_code == 0  # authenticated: relayed to the broker


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_failed_sasl_authenticate_answers_then_closes(sasl, bare, version):
    proxy, _ = sasl
    before = len(proxy.failures)
    response = bare.login("wrong", version)
    assert response.error_code == 58  # SASL_AUTHENTICATION_FAILED
    assert response.error_message == "Authentication failed: Invalid username or password"
    assert bare.read_frame() is None
    assert proxy.failures[before:] == [("PLAIN", "alice", "invalid username or password")]


def test_requests_before_authentication_close_the_connection(sasl, bare):
    proxy, _ = sasl
    before = len(proxy.failures)
    assert bare.call(MetadataRequest(topics=None, version=0), MetadataResponse) is None
    assert proxy.failures[before:] == [(None, None, "request with api key 3 before authentication")]


def test_sasl_requests_after_authentication_get_illegal_sasl_state(bare):
    assert bare.login(USERS["alice"]).error_code == 0
    handshake = bare.call(SaslHandshakeRequest(mechanism="PLAIN", version=1), SaslHandshakeResponse)
    assert (handshake.error_code, handshake.mechanisms) == (34, [])  # ILLEGAL_SASL_STATE
    authenticate = bare.call(SaslAuthenticateRequest(auth_bytes=b"", version=2), SaslAuthenticateResponse)
    assert authenticate.error_code == 34
    assert api_versions(bare).error_code == 0  # the connection still works


@pytest.mark.parametrize("version", [3, 9])  # transactional_id before acks: int16 / compact length
def test_produce_with_acks_0_gets_no_response(bare, version):
    """As from Kafka. Tansu does answer it, so the proxy reads acks to drop that response (and
    to know which responses a re-authentication must wait for)."""
    assert bare.login(USERS["alice"]).error_code == 0
    for acks in (0, 1):
        request = ProduceRequest(transactional_id=None, acks=acks, timeout_ms=1000, topic_data=[], version=version)
        if acks:
            assert bare.call(request, ProduceResponse) is not None  # correlation id checked
        else:
            bare.send(request)
            assert api_versions(bare).error_code == 0  # the next response is the ApiVersions one


def test_an_expired_session_is_closed_at_the_next_request(sasl, bare):
    proxy, _ = sasl
    proxy.session_lifetime_ms = 300
    try:
        expired = proxy.sessions_expired
        assert bare.login(USERS["alice"]).session_lifetime_ms == 300
        assert api_versions(bare).error_code == 0
        time.sleep(0.4)
        assert api_versions(bare) is None
        assert proxy.sessions_expired == expired + 1
    finally:
        proxy.session_lifetime_ms = 0
