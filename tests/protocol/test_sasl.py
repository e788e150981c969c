"""SASL mechanisms: RFC 7677's SCRAM-SHA-256 example, an independent SCRAM server
(scramp) for both hashes, PLAIN's token, and the SASL message bytes as the spec lays them out."""

import base64

import pytest
import scramp

from spark_sink.protocol import kmsg
from spark_sink.protocol import primitives as p
from spark_sink.protocol.apis import ApiKey, decode_response_body, encode_request_body
from spark_sink.protocol.sasl import Gssapi, Plain, SaslError, Scram, mechanism


def test_scram_sha_256_matches_rfc_7677_example() -> None:
    client = Scram("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first_token() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert client.respond(server_first) == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert client.respond(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None


@pytest.mark.parametrize("name", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("user, password", [("alice", "secret"), ("b,o=b", "pässword with spaces")])
def test_scram_against_an_independent_server(name: str, user: str, password: str) -> None:
    server_mechanism = scramp.ScramMechanism(name)
    auth_info = server_mechanism.make_auth_info(password, iteration_count=4096)
    seen_users: list[str] = []

    def auth_for(username: str) -> object:
        seen_users.append(username)
        return auth_info

    server = server_mechanism.make_server(auth_for)
    client = mechanism(name, user, password)
    server.set_client_first(client.first_token().decode())
    assert seen_users == [user]  # the escaped name arrives as the user's
    client_final = client.respond(server.get_server_first().encode())
    assert client_final is not None
    server.set_client_final(client_final.decode())  # raises if the proof is wrong
    assert client.respond(server.get_server_final().encode()) is None


def test_scram_rejects_a_server_that_does_not_know_the_password() -> None:
    server_mechanism = scramp.ScramMechanism("SCRAM-SHA-256")
    impostor_info = server_mechanism.make_auth_info("another password", iteration_count=4096)
    client = mechanism("SCRAM-SHA-256", "alice", "secret")
    first = client.first_token().decode()
    # The impostor answers with its own salt; the client's proof then fails on its side,
    # so it forges a server-final with a signature computed from the wrong password.
    impostor = server_mechanism.make_server(lambda username: impostor_info)
    impostor.set_client_first(first)
    client.respond(impostor.get_server_first().encode())
    forged = b"v=" + base64.b64encode(b"\x00" * 32)
    with pytest.raises(SaslError, match="signature is wrong"):
        client.respond(forged)


@pytest.mark.parametrize("server_first, match", [
    (b"r=someone-elses-nonce,s=QSXCR+Q6sek8bf92,i=4096", "nonce"),
    (b"r={nonce}xyz,s=QSXCR+Q6sek8bf92,i=1000", "iterations"),
    (b"m=ext,r={nonce}xyz,s=QSXCR+Q6sek8bf92,i=4096", "extension"),
    (b"r={nonce}xyz,i=4096", "malformed"),
    (b"garbage", "malformed"),
])
def test_scram_rejects_bad_server_first_messages(server_first: bytes, match: str) -> None:
    client = Scram("SCRAM-SHA-512", "alice", "secret", nonce="abc")
    with pytest.raises(SaslError, match=match):
        client.respond(server_first.replace(b"{nonce}", b"abc"))


def test_scram_server_error_is_reported() -> None:
    client = Scram("SCRAM-SHA-256", "alice", "secret", nonce="abc")
    client.respond(b"r=abcdef,s=QSXCR+Q6sek8bf92,i=4096")
    with pytest.raises(SaslError, match="invalid-proof"):
        client.respond(b"e=invalid-proof")


def test_plain_token_and_unknown_mechanism() -> None:
    client = Plain("alice", "sécret")
    assert client.first_token() == b"\x00alice\x00s\xc3\xa9cret"
    assert client.respond(b"") is None
    with pytest.raises(ValueError, match="OAUTHBEARER"):
        mechanism("OAUTHBEARER", "a", "b")


def test_sasl_message_bytes() -> None:
    # SaslHandshake v1: mechanism as INT16-length string.
    assert encode_request_body(ApiKey.SASL_HANDSHAKE, 1, kmsg.SaslHandshakeRequest("PLAIN")) == b"\x00\x05PLAIN"
    # SaslAuthenticate v1: INT32-length bytes; v2 (flexible): uvarint length + 1, then tags.
    token = kmsg.SaslAuthenticateRequest(b"tok")
    assert encode_request_body(ApiKey.SASL_AUTHENTICATE, 1, token) == b"\x00\x00\x00\x03tok"
    assert encode_request_body(ApiKey.SASL_AUTHENTICATE, 2, token) == b"\x04tok\x00"
    v1 = p.INT16.pack(0) + p.INT16.pack(-1) + p.INT32.pack(2) + b"ok" + p.INT64.pack(3600000)
    assert decode_response_body(ApiKey.SASL_AUTHENTICATE, 1, v1) == kmsg.SaslAuthenticateResponse(
        error_code=0, error_message=None, auth_bytes=b"ok", session_lifetime_ms=3600000)
    v2 = p.INT16.pack(58) + b"\x04bad" + b"\x01" + p.INT64.pack(0) + b"\x00"
    assert decode_response_body(ApiKey.SASL_AUTHENTICATE, 2, v2) == kmsg.SaslAuthenticateResponse(
        error_code=58, error_message="bad", auth_bytes=b"", session_lifetime_ms=0)
    handshake = p.INT16.pack(33) + p.INT32.pack(2) + b"\x00\x05PLAIN\x00\x0dSCRAM-SHA-256"
    assert decode_response_body(ApiKey.SASL_HANDSHAKE, 1, handshake) == kmsg.SaslHandshakeResponse(
        error_code=33, mechanisms=["PLAIN", "SCRAM-SHA-256"])


def test_oauthbearer_initial_response_as_kip_255_lays_it_out() -> None:
    from spark_sink.protocol.sasl import OAuthBearer

    assert OAuthBearer("t.k.n").first_token() == b"n,,\x01auth=Bearer t.k.n\x01\x01"
    client = OAuthBearer("tok", {"logicalCluster": "lkc-1", "poolId": "p"})
    assert client.first_token() == b"n,,\x01auth=Bearer tok\x01logicalCluster=lkc-1\x01poolId=p\x01\x01"
    assert client.respond(b"") is None  # the broker accepted the token


def test_oauthbearer_acknowledges_the_brokers_error_with_one_control_a() -> None:
    from spark_sink.protocol.sasl import OAuthBearer

    client = OAuthBearer("tok")
    assert client.respond(b'{"status":"invalid_token"}') == b"\x01"
    assert client.server_error == '{"status":"invalid_token"}'
    with pytest.raises(SaslError):
        client.respond(b"more")
    with pytest.raises(ValueError, match="extension name 'auth'"):
        OAuthBearer("tok", {"auth": "x"})


class _ScriptedContext:
    """A GSS-API context that completes on the server's first token and wraps by prefixing
    "W:" (the GSS-API calls themselves run against a real KDC in
    tests/producer/test_kerberos.py); this checks the RFC 4752 steps around them."""

    def __init__(self, final_token: bytes | None = None) -> None:
        self.complete = False
        self._final_token = final_token

    def step(self, token: bytes) -> bytes | None:
        assert token == b"AP-REP"
        self.complete = True
        return self._final_token

    def unwrap(self, message: bytes) -> bytes:
        assert message.startswith(b"W:")
        return message[2:]

    def wrap(self, message: bytes) -> bytes:
        return b"W:" + message


def test_gssapi_chooses_no_security_layer_as_rfc_4752_lays_it_out() -> None:
    exchange = Gssapi(_ScriptedContext(), b"AP-REQ", hint="h")
    assert exchange.first_token() == b"AP-REQ"
    assert exchange.respond(b"AP-REP") == b""  # context complete, nothing to send: ask for the offer
    # The offer: every layer (none, integrity, confidentiality), 64 KiB buffers. The answer:
    # no layer, a zero buffer size, no authorization id.
    assert exchange.respond(b"W:\x07\x01\x00\x00") == b"W:\x01\x00\x00\x00"
    assert exchange.respond(b"") is None
    with pytest.raises(SaslError, match="after the exchange completed"):
        exchange.respond(b"more")
    # A context whose last step has a token sends it instead of the empty response.
    assert Gssapi(_ScriptedContext(b"last"), b"AP-REQ", hint="h").respond(b"AP-REP") == b"last"


@pytest.mark.parametrize("offer, match", [(b"W:\x06\x01\x00\x00", "requires a SASL security layer"),
                                          (b"W:\x01\x00", "has 2 bytes, expected 4")])
def test_gssapi_refuses_an_offer_without_the_no_layer_choice(offer: bytes, match: str) -> None:
    exchange = Gssapi(_ScriptedContext(), b"AP-REQ", hint="h")
    exchange.respond(b"AP-REP")
    with pytest.raises(SaslError, match=match):
        exchange.respond(offer)
