"""SASL client mechanisms as sans-IO objects: tokens in, tokens out.

A mechanism starts with :meth:`SaslMechanism.first_token`; each server token goes to
:meth:`SaslMechanism.respond`, which returns the next client token, or None once the
exchange is complete on the client's side. Failures raise :class:`SaslError`. The
connection bring-up (:mod:`~spark_sink.protocol.connection_setup`) carries the tokens in
SaslAuthenticate requests (KIP-152).

PLAIN is RFC 4616; SCRAM-SHA-256/512 is RFC 5802 and RFC 7677 as Kafka uses it (KIP-84):
no channel binding, the password's UTF-8 bytes without SASLprep, and at least 4096
iterations (Kafka's own floor, which its clients enforce). OAUTHBEARER is RFC 7628 as
Kafka uses it (KIP-255, SASL extensions KIP-342): the token comes from the caller, who
fetched it (an OAuth token endpoint, a token provider). GSSAPI is RFC 4752 (Kerberos V5
through GSS-API) as Kafka uses it: the GSS-API security context comes from the caller
(the producer layer, which holds the credentials and talks to the KDC for the first
token); here is the exchange around it, down to the negotiation of the security layer,
which is always "none" (Kafka protects its connections with TLS, not SASL).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Protocol

from spark_sink.protocol.error_codes import KProdError

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
_SCRAM_MIN_ITERATIONS = 4096
_GS2_HEADER = b"n,,"  # no channel binding, no authorization id


class SaslError(KProdError):
    """The SASL exchange failed on the client's side (a bad server message or signature)."""


class SaslMechanism(Protocol):
    name: str
    # What to check when the broker refuses the credentials (never a secret).
    hint: str

    def first_token(self) -> bytes: ...

    def respond(self, challenge: bytes) -> bytes | None: ...


def mechanism(name: str, username: str, password: str) -> SaslMechanism:
    """A fresh client exchange for password mechanism ``name`` (one per connection)."""
    if name == "PLAIN":
        return Plain(username, password)
    if name in _SCRAM_HASHES:
        return Scram(name, username, password)
    raise ValueError(f"unsupported SASL password mechanism {name!r}; expected PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")


class Plain:
    """PLAIN: one token carrying the user name and password; the server answers empty."""

    name = "PLAIN"
    hint = "check the username and password in sasl.jaas.config"

    def __init__(self, username: str, password: str) -> None:
        self._token = b"\x00" + username.encode() + b"\x00" + password.encode()

    def first_token(self) -> bytes:
        return self._token

    def respond(self, challenge: bytes) -> bytes | None:
        return None


class Scram:
    """SCRAM-SHA-256/512: client-first, server-first, client-final (the proof),
    server-final (the server's signature, checked: the server proves it knows the
    password too)."""

    hint = Plain.hint

    def __init__(self, name: str, username: str, password: str, nonce: str | None = None) -> None:
        self.name = name
        self._hash = _SCRAM_HASHES[name]
        self._password = password.encode()
        self._nonce = nonce or secrets.token_urlsafe(24)  # printable, never a comma
        # RFC 5802 section 5.1: '=' and ',' in the user name are escaped.
        user = username.replace("=", "=3D").replace(",", "=2C")
        self._client_first_bare = f"n={user},r={self._nonce}".encode()
        self._server_signature: bytes | None = None
        self._step = 0

    def first_token(self) -> bytes:
        return _GS2_HEADER + self._client_first_bare

    def respond(self, challenge: bytes) -> bytes | None:
        self._step += 1
        if self._step == 1:
            return self._client_final(challenge)
        if self._step == 2:
            self._verify_server_final(challenge)
            return None
        raise SaslError(f"{self.name}: unexpected server message after the exchange completed")

    def _client_final(self, server_first: bytes) -> bytes:
        attrs = _attributes(self.name, server_first)
        if "m" in attrs:
            raise SaslError(f"{self.name}: the server asks for an extension kprod does not know")
        try:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"], validate=True), int(attrs["i"])
        except (KeyError, ValueError) as exc:
            raise SaslError(f"{self.name}: malformed server-first message ({exc})") from None
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslError(f"{self.name}: the server's nonce does not extend the client's")
        if iterations < _SCRAM_MIN_ITERATIONS:
            raise SaslError(f"{self.name}: the server asks for {iterations} iterations, "
                            f"fewer than the minimum of {_SCRAM_MIN_ITERATIONS}")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = b"c=" + base64.b64encode(_GS2_HEADER) + b",r=" + nonce.encode()
        auth_message = b",".join((self._client_first_bare, server_first, without_proof))
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return without_proof + b",p=" + base64.b64encode(proof)

    def _verify_server_final(self, server_final: bytes) -> None:
        attrs = _attributes(self.name, server_final)
        if "e" in attrs:
            raise SaslError(f"{self.name}: the server refused the proof: {attrs['e']}")
        try:
            signature = base64.b64decode(attrs["v"], validate=True)
        except (KeyError, ValueError):
            raise SaslError(f"{self.name}: malformed server-final message") from None
        if not hmac.compare_digest(signature, self._server_signature or b""):
            raise SaslError(f"{self.name}: the server's signature is wrong (it does not know the password)")

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()


class OAuthBearer:
    """OAUTHBEARER: one token carrying the bearer token and SASL extensions. A broker
    that refuses the token answers with an error (a JSON status) instead of completing;
    the client acknowledges it with a single 0x01 and the broker then fails the exchange
    with its message. ``hint`` says which token was sent, for that message."""

    name = "OAUTHBEARER"

    def __init__(self, token: str, extensions: dict[str, str] | None = None, hint: str = "") -> None:
        for key, value in (extensions or {}).items():
            # RFC 7628 section 3.1: key = 1*(ALPHA), value = printable without 0x01.
            if not key.isascii() or not key.isalpha() or key == "auth":
                raise ValueError(f"SASL extension name {key!r}: expected ASCII letters, not 'auth'")
            if "\x01" in value:
                raise ValueError(f"SASL extension {key!r}: the value may not contain 0x01")
        extra = "".join(f"{key}={value}\x01" for key, value in (extensions or {}).items())
        self._token = _GS2_HEADER + f"\x01auth=Bearer {token}\x01{extra}\x01".encode()
        self.hint = hint
        self.server_error: str | None = None

    def first_token(self) -> bytes:
        return self._token

    def respond(self, challenge: bytes) -> bytes | None:
        if not challenge:
            return None
        if self.server_error is not None:
            raise SaslError("OAUTHBEARER: unexpected server message after the error")
        self.server_error = challenge.decode(errors="replace")
        return b"\x01"


class GssContext(Protocol):
    """An initiator's GSS-API security context (RFC 2743) as :class:`Gssapi` uses it. Its
    calls are local computations once the first token is made; a failure raises
    :class:`SaslError`."""

    @property
    def complete(self) -> bool: ...

    def step(self, token: bytes) -> bytes | None:
        """The next context token for the server's ``token`` (None: nothing to send)."""

    def unwrap(self, message: bytes) -> bytes: ...

    def wrap(self, message: bytes) -> bytes:
        """``message`` with an integrity check and no confidentiality."""


# RFC 4752 section 3.1: the security layers, a bit mask in the first octet.
_GSSAPI_NO_SECURITY_LAYER = 1


class Gssapi:
    """GSSAPI (RFC 4752): the context tokens until the context is established (the
    client's first one, made by the caller, carries the service ticket; the server's
    answer proves the server holds the service key), then the server's wrapped offer of
    security layers, answered with "no security layer" (Kafka's choice, as Java's
    client), a zero buffer size and the authorization id."""

    name = "GSSAPI"

    def __init__(self, context: GssContext, first_token: bytes, hint: str, authorization_id: str = "") -> None:
        self._context = context
        self._first_token = first_token
        self._authorization_id = authorization_id.encode()
        self.hint = hint
        self._step = "context"

    def first_token(self) -> bytes:
        return self._first_token

    def respond(self, challenge: bytes) -> bytes | None:
        if self._step == "context":
            token = self._context.step(challenge) if not self._context.complete else None
            if self._context.complete:
                self._step = "layers"
            return token or b""  # an empty response asks the server for its offer
        if self._step == "layers":
            self._step = "done"
            return self._choose_layer(challenge)
        if challenge:
            raise SaslError("GSSAPI: unexpected server message after the exchange completed")
        return None

    def _choose_layer(self, wrapped: bytes) -> bytes:
        offer = self._context.unwrap(wrapped)
        if len(offer) != 4:
            raise SaslError(f"GSSAPI: the server's security layer offer has {len(offer)} bytes, expected 4")
        if not offer[0] & _GSSAPI_NO_SECURITY_LAYER:
            raise SaslError("GSSAPI: the server requires a SASL security layer (integrity or confidentiality), "
                            "which Kafka clients do not use")
        # The chosen layer, then the largest message the client takes: 0 without a layer.
        return self._context.wrap(bytes([_GSSAPI_NO_SECURITY_LAYER, 0, 0, 0]) + self._authorization_id)


def _attributes(name: str, message: bytes) -> dict[str, str]:
    """``k=v,k=v`` of a SCRAM message (values may contain '=')."""
    try:
        text = message.decode()
    except UnicodeDecodeError:
        raise SaslError(f"{name}: server message is not UTF-8") from None
    attrs = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise SaslError(f"{name}: malformed server message {text!r}")
        attrs[key] = value
    return attrs
