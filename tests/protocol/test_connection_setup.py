"""The connection bring-up machine, pure: every transition of its table, driven by
response bytes laid out by hand from the protocol specification, with the request bytes
it writes checked the same way."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import pytest

from spark_sink.protocol import kmsg
from spark_sink.protocol.connection_setup import (
    TRANSITIONS,
    ConnectionSetup,
    Event,
    Failed,
    Output,
    Ready,
    Send,
    SetupError,
    SetupState,
)
from spark_sink.protocol.framing import KafkaProtocol
from spark_sink.protocol.sasl import Plain, SaslMechanism, Scram

CLIENT_ID = b"\x00\x02kp"  # the client id "kp" as a (non-compact) string

# RFC 7677's SCRAM-SHA-256 example (user "user", password "pencil").
RFC_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


# -- bytes as the specification lays them out ------------------------------------

def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _uvarint(n: int) -> bytes:
    assert n < 128
    return bytes([n])


def _compact_bytes(data: bytes) -> bytes:
    return _uvarint(len(data) + 1) + data


def _api_versions_v3(cid: int, apis: list[tuple[int, int, int]], code: int = 0) -> bytes:
    """ApiVersions v3 response: header v0 (ApiVersions never has tagged header fields),
    error_code, compact array of (api_key, min, max, tags), throttle_time_ms, tags."""
    entries = b"".join(struct.pack(">hhh", *api) + b"\x00" for api in apis)
    return _frame(struct.pack(">ih", cid, code) + _uvarint(len(apis) + 1) + entries + struct.pack(">i", 0) + b"\x00")


def _api_versions_v0_error(cid: int, code: int, apis: Sequence[tuple[int, int, int]] = ()) -> bytes:
    """An ApiVersions error in v0's layout, whatever version was asked (KIP-511)."""
    entries = b"".join(struct.pack(">hhh", *api) for api in apis)
    return _frame(struct.pack(">ihi", cid, code, len(apis)) + entries)


def _sasl_handshake_v1(cid: int, code: int, mechanisms: list[bytes]) -> bytes:
    names = b"".join(struct.pack(">h", len(m)) + m for m in mechanisms)
    return _frame(struct.pack(">ihi", cid, code, len(mechanisms)) + names)


def _sasl_authenticate_v2(cid: int, auth: bytes = b"", code: int = 0, message: bytes | None = None,
                          lifetime_ms: int = 0) -> bytes:
    """SaslAuthenticate v2 response: header v1 (tags after the correlation id), error_code,
    compact nullable error_message, compact auth_bytes, session_lifetime_ms, tags."""
    text = b"\x00" if message is None else _compact_bytes(message)
    return _frame(struct.pack(">i", cid) + b"\x00" + struct.pack(">h", code) + text + _compact_bytes(auth)
                  + struct.pack(">q", lifetime_ms) + b"\x00")


# What a Kafka 4 broker with a SASL listener answers (its ranges, trimmed), plus an API
# kprod does not know and one with no version in common: both are left out.
BROKER_APIS = [(0, 3, 13), (3, 0, 13), (17, 0, 1), (18, 0, 4), (22, 6, 9), (36, 0, 2), (1000, 0, 1)]
AGREED = {0: 12, 3: 12, 17: 1, 18: 3, 36: 2}
NO_SASL_APIS = [(0, 3, 13), (3, 0, 13), (18, 0, 4)]

API_VERSIONS_V3_REQUEST = _frame(
    b"\x00\x12\x00\x03\x00\x00\x00\x00" + CLIENT_ID + b"\x00"  # header v2: key 18, v3, cid 0, tags
    b"\x06kprod\x060.1.0\x00")  # client software name and version (compact), tags


def _handshake_request(cid: int, mechanism: bytes) -> bytes:
    return _frame(b"\x00\x11\x00\x01" + struct.pack(">i", cid) + CLIENT_ID + struct.pack(">h", len(mechanism))
                  + mechanism)


def _authenticate_request(cid: int, token: bytes) -> bytes:
    return _frame(b"\x00\x24\x00\x02" + struct.pack(">i", cid) + CLIENT_ID + b"\x00" + _compact_bytes(token) + b"\x00")


# -- driving the machine ----------------------------------------------------------

def _setup(exchange: SaslMechanism | None = None) -> ConnectionSetup:
    return ConnectionSetup(KafkaProtocol("kp"), exchange, renew_fraction=0.9)


def _plain() -> ConnectionSetup:
    return _setup(Plain("alice", "secret"))


def _scram() -> ConnectionSetup:
    return _setup(Scram("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE))


def _mechanism(setup: ConnectionSetup) -> SaslMechanism:
    assert setup._exchange is not None
    return setup._exchange


def _failed(outputs: list[Output]) -> Failed:
    (failed,) = outputs
    assert isinstance(failed, Failed), failed
    return failed


def _connected(setup: ConnectionSetup, now: float = 0.0) -> ConnectionSetup:
    assert setup.connected(now) == [Send(API_VERSIONS_V3_REQUEST)]
    return setup


def _at_handshake(setup: ConnectionSetup) -> ConnectionSetup:
    mechanism = _mechanism(setup).name.encode()
    assert _connected(setup).receive_data(_api_versions_v3(0, BROKER_APIS), 1.0) == [
        Send(_handshake_request(1, mechanism))]
    return setup


def _at_authenticate(setup: ConnectionSetup) -> ConnectionSetup:
    first = _mechanism(setup).first_token()
    assert _at_handshake(setup).receive_data(_sasl_handshake_v1(1, 0, [b"PLAIN", b"SCRAM-SHA-256"]), 2.0) == [
        Send(_authenticate_request(2, first))]
    return setup


def _ready_with_lifetime(lifetime_ms: int) -> ConnectionSetup:
    setup = _at_authenticate(_plain())
    assert setup.receive_data(_sasl_authenticate_v2(2, lifetime_ms=lifetime_ms), 1000.0) == [Ready(AGREED)]
    return setup


# One case per transition: drives a fresh machine through it and checks what it asked for.

def _case_connected() -> ConnectionSetup:
    setup = _setup()
    assert setup.state is SetupState.CONNECTING and setup.request_sent_ms is None
    _connected(setup, now=5.0)
    assert setup.request_sent_ms == 5.0  # the owner times the request out from here
    return setup


def _case_version_too_new() -> ConnectionSetup:
    """A broker that knows ApiVersions up to v2 answers v3 with UNSUPPORTED_VERSION in v0's
    layout; the request goes again at v2 (header v1, an empty body)."""
    setup = _connected(_setup())
    again = _frame(b"\x00\x12\x00\x02\x00\x00\x00\x01" + CLIENT_ID)
    assert setup.receive_data(_api_versions_v0_error(0, 35, [(18, 0, 2)]), 1.0) == [Send(again)]
    return setup


def _case_versions_agreed() -> ConnectionSetup:
    setup = _connected(_setup())
    assert setup.receive_data(_api_versions_v3(0, BROKER_APIS), 3.0) == [Ready(AGREED)]
    assert setup.versions == AGREED and setup.request_sent_ms is None and setup.renew_at_ms == 0.0
    return setup


def _case_versions_agreed_sasl() -> ConnectionSetup:
    return _at_handshake(_plain())


def _case_no_sasl_api() -> ConnectionSetup:
    setup = _connected(_plain())
    failed = _failed(setup.receive_data(_api_versions_v3(0, NO_SASL_APIS), 1.0))
    assert failed == Failed(failed.reason, authentication=True)
    assert "does not support SaslHandshake" in failed.reason
    return setup


def _case_versions_error() -> ConnectionSetup:
    setup = _connected(_setup())
    assert setup.receive_data(_api_versions_v0_error(0, 42), 1.0) == [
        Failed("ApiVersions failed: INVALID_REQUEST", authentication=False)]
    return setup


def _case_mechanism_accepted() -> ConnectionSetup:
    return _at_authenticate(_plain())


def _case_mechanism_refused() -> ConnectionSetup:
    setup = _at_handshake(_plain())
    assert setup.receive_data(_sasl_handshake_v1(1, 33, [b"SCRAM-SHA-256", b"SCRAM-SHA-512"]), 2.0) == [Failed(
        "sasl.mechanism PLAIN is not enabled on the broker; it offers SCRAM-SHA-256, SCRAM-SHA-512",
        authentication=True)]
    return setup


def _case_handshake_error() -> ConnectionSetup:
    setup = _at_handshake(_plain())
    assert setup.receive_data(_sasl_handshake_v1(1, 34, []), 2.0) == [
        Failed("SaslHandshake failed: ILLEGAL_SASL_STATE (is this a SASL listener? a PLAINTEXT or SSL one answers "
               "so; check security.protocol)", authentication=True)]
    return setup


def _case_challenge() -> ConnectionSetup:
    """SCRAM's server-first message is answered with the client-final one (RFC 7677)."""
    setup = _at_authenticate(_scram())
    assert setup.receive_data(_sasl_authenticate_v2(2, RFC_SERVER_FIRST), 3.0) == [
        Send(_authenticate_request(3, RFC_CLIENT_FINAL))]
    return setup


def _case_authenticated() -> ConnectionSetup:
    """The server-final message proves the server knows the password; the session lasts
    10 s, so it is renewed after 9 (the renew fraction)."""
    setup = _case_challenge()
    assert setup.receive_data(_sasl_authenticate_v2(3, RFC_SERVER_FINAL, lifetime_ms=10_000), 100.0) == [
        Ready(AGREED)]
    assert setup.renew_at_ms == 100.0 + 9_000.0
    return setup


def _case_credentials_refused() -> ConnectionSetup:
    setup = _at_authenticate(_plain())
    (failed,) = setup.receive_data(
        _sasl_authenticate_v2(2, code=58, message=b"Authentication failed: Invalid username or password"), 3.0)
    assert failed == Failed("Authentication failed: Invalid username or password "
                            "(check the username and password in sasl.jaas.config)", authentication=True)
    assert "secret" not in failed.reason
    return setup


def _case_exchange_failed() -> ConnectionSetup:
    """A server that does not know the password cannot sign the server-final message."""
    setup = _case_challenge()
    forged = b"v=" + b"A" * 43 + b"="
    failed = _failed(setup.receive_data(_sasl_authenticate_v2(3, forged), 4.0))
    assert failed.authentication and "signature is wrong" in failed.reason
    return setup


def _case_session_ending() -> ConnectionSetup:
    setup = _ready_with_lifetime(10_000)
    assert setup.renew_at_ms == 1000.0 + 9_000.0
    assert not setup.session_ending(9_999.0) and setup.state is SetupState.READY
    assert setup.session_ending(10_000.0)
    assert setup.session_ending(10_001.0)  # stays ending: the owner replaces the connection
    return setup


CASES: dict[tuple[SetupState, Event], Callable[[], ConnectionSetup]] = {
    (SetupState.CONNECTING, Event.CONNECTED): _case_connected,
    (SetupState.API_VERSIONS, Event.VERSION_TOO_NEW): _case_version_too_new,
    (SetupState.API_VERSIONS, Event.VERSIONS_AGREED): _case_versions_agreed,
    (SetupState.API_VERSIONS, Event.VERSIONS_AGREED_SASL): _case_versions_agreed_sasl,
    (SetupState.API_VERSIONS, Event.NO_SASL_API): _case_no_sasl_api,
    (SetupState.API_VERSIONS, Event.VERSIONS_ERROR): _case_versions_error,
    (SetupState.SASL_HANDSHAKE, Event.MECHANISM_ACCEPTED): _case_mechanism_accepted,
    (SetupState.SASL_HANDSHAKE, Event.MECHANISM_REFUSED): _case_mechanism_refused,
    (SetupState.SASL_HANDSHAKE, Event.HANDSHAKE_ERROR): _case_handshake_error,
    (SetupState.SASL_AUTHENTICATE, Event.CHALLENGE): _case_challenge,
    (SetupState.SASL_AUTHENTICATE, Event.AUTHENTICATED): _case_authenticated,
    (SetupState.SASL_AUTHENTICATE, Event.CREDENTIALS_REFUSED): _case_credentials_refused,
    (SetupState.SASL_AUTHENTICATE, Event.EXCHANGE_FAILED): _case_exchange_failed,
    (SetupState.READY, Event.SESSION_ENDING): _case_session_ending,
}


def test_every_transition_has_a_case() -> None:
    assert set(CASES) == set(TRANSITIONS)


@pytest.mark.parametrize("transition", list(CASES), ids=lambda t: f"{t[0].name}-{t[1].name}")
def test_transition(transition: tuple[SetupState, Event]) -> None:
    setup = CASES[transition]()
    assert setup.state is TRANSITIONS[transition]
    if setup.state in (SetupState.READY, SetupState.RENEWING, SetupState.FAILED):
        assert setup.request_sent_ms is None  # nothing awaited: nothing to time out


# -- beyond single transitions ------------------------------------------------------

def test_plain_bring_up_in_one_byte_reads() -> None:
    """Responses split anywhere give the same outputs as whole ones."""
    setup = _connected(_plain())
    outputs = []
    for stream in (_api_versions_v3(0, BROKER_APIS), _sasl_handshake_v1(1, 0, [b"PLAIN"]),
                   _sasl_authenticate_v2(2)):
        for i in range(len(stream)):
            outputs += setup.receive_data(stream[i:i + 1], 1.0)
    assert outputs == [Send(_handshake_request(1, b"PLAIN")),
                       Send(_authenticate_request(2, b"\x00alice\x00secret")), Ready(AGREED)]
    assert setup.state is SetupState.READY and setup.renew_at_ms == 0.0


def test_api_versions_stepped_down_to_v0_then_agreed() -> None:
    setup = _connected(_setup())
    setup.receive_data(_api_versions_v0_error(0, 35, [(18, 0, 0)]), 1.0)  # the broker knows v0 only
    v0_response = _frame(struct.pack(">ihi", 1, 0, 2) + struct.pack(">hhh", 0, 3, 9) + struct.pack(">hhh", 18, 0, 0))
    assert setup.receive_data(v0_response, 2.0) == [Ready({0: 9, 18: 0})]


def test_unsupported_version_in_the_layout_of_the_version_sent() -> None:
    """librdkafka's mock cluster answers UNSUPPORTED_VERSION in the layout of the version
    asked (v3: compact array, tagged fields), not v0's. Read as the Java client reads it:
    with the version sent first; the request goes again at the highest version listed."""
    setup = _connected(_setup())
    again = _frame(b"\x00\x12\x00\x02\x00\x00\x00\x01" + CLIENT_ID)  # v2: header v1, empty body
    assert setup.receive_data(_api_versions_v3(0, [(0, 3, 9), (18, 0, 2)], code=35), 1.0) == [Send(again)]
    v2_response = _frame(struct.pack(">ihi", 1, 0, 2) + struct.pack(">hhh", 0, 3, 9)
                         + struct.pack(">hhh", 18, 0, 2) + struct.pack(">i", 0))  # v2: throttle_time_ms
    assert setup.receive_data(v2_response, 2.0) == [Ready({0: 9, 18: 2})]


def test_unsupported_version_listing_no_api_versions_steps_down_to_v0() -> None:
    setup = _connected(_setup())
    again = _frame(b"\x00\x12\x00\x00\x00\x00\x00\x01" + CLIENT_ID)  # v0: header v1, empty body
    assert setup.receive_data(_api_versions_v3(0, [], code=35), 1.0) == [Send(again)]


def test_another_error_in_the_layout_of_the_version_sent_fails() -> None:
    setup = _connected(_setup())
    assert setup.receive_data(_api_versions_v3(0, [], code=42), 1.0) == [
        Failed("ApiVersions failed: INVALID_REQUEST", authentication=False)]


def test_unsupported_version_at_v0_fails() -> None:
    setup = _connected(_setup())
    setup.receive_data(_api_versions_v0_error(0, 35, [(18, 0, 0)]), 1.0)
    assert setup.receive_data(_api_versions_v0_error(1, 35, [(18, 0, 0)]), 2.0) == [
        Failed("ApiVersions failed: UNSUPPORTED_VERSION", authentication=False)]


def test_a_session_without_lifetime_never_ends() -> None:
    setup = _ready_with_lifetime(0)
    assert setup.renew_at_ms == 0.0 and not setup.session_ending(1e15)
    assert setup.state is SetupState.READY


def test_session_ending_is_no_transition_before_ready() -> None:
    setup = _at_handshake(_plain())
    assert not setup.session_ending(1e15) and setup.state is SetupState.SASL_HANDSHAKE


def test_events_the_table_does_not_allow_raise() -> None:
    setup = _connected(_setup())
    with pytest.raises(SetupError, match="CONNECTED in state API_VERSIONS"):
        setup.connected(1.0)
    failed = _case_versions_error()
    with pytest.raises(SetupError, match="CONNECTED in state FAILED"):
        failed.connected(2.0)


def test_the_protocol_carries_on_after_ready() -> None:
    """The bring-up's correlation ids are the connection's: the next request continues them."""
    setup = _at_authenticate(_plain())
    setup.receive_data(_sasl_authenticate_v2(2), 3.0)
    cid, _ = setup.protocol.send_request(3, 12, kmsg.MetadataRequest(topics=None))
    assert cid == 3 and setup.protocol.in_flight == 1


def _api_versions_with_features(features: dict[str, int], apis: list[tuple[int, int, int]]) -> bytes:
    from spark_sink.protocol.apis import ApiKey, encode_response_body

    body = kmsg.ApiVersionsResponse(
        api_keys=[kmsg.ApiVersion(api_key=k, min_version=lo, max_version=hi) for k, lo, hi in apis],
        finalized_features_epoch=7,
        finalized_features=[kmsg.FinalizedFeatureKey(name=n, max_version_level=v, min_version_level=v)
                            for n, v in features.items()])
    return _frame(struct.pack(">i", 0) + encode_response_body(ApiKey.API_VERSIONS, 3, body))


TXN_V2_APIS = [(0, 3, 13), (18, 0, 4), (26, 0, 5), (28, 0, 5)]


@pytest.mark.parametrize(("features", "apis", "expected"), [
    ({"transaction.version": 2, "metadata.version": 30}, TXN_V2_APIS, 2),
    ({"transaction.version": 1}, TXN_V2_APIS, 1),
    ({}, TXN_V2_APIS, 0),  # a broker finalizing no transaction.version (Kafka 3.x)
    ({"transaction.version": 2}, [(0, 3, 11), (18, 0, 4), (26, 0, 5), (28, 0, 5)], 1),  # no Produce v12
    ({"transaction.version": 2}, [(0, 3, 13), (18, 0, 4), (26, 0, 4), (28, 0, 5)], 1),  # no EndTxn v5
])
def test_the_finalized_features_tell_the_transaction_protocol(features: dict[str, int],
                                                               apis: list[tuple[int, int, int]], expected: int) -> None:
    from spark_sink.protocol.apis import transaction_version

    setup = _connected(_setup())
    (ready,) = setup.receive_data(_api_versions_with_features(features, apis), 3.0)
    assert isinstance(ready, Ready) and ready.features == features and ready.features_epoch == 7
    assert transaction_version(ready.features, ready.versions) == expected
