"""SASL for tests: a proxy that authenticates clients the way a Kafka broker's SASL listener
does (SaslHandshake v1 + SaslAuthenticate, KIP-152; session lifetime and re-authentication,
KIP-368), then relays their traffic to a plaintext broker.

Tansu cannot run SASL here (its users can only be created over an authenticated
connection), so the proxy terminates it instead. Like ``tlsproxy.TlsProxy``, put it in front
of a broker whose advertised address is the proxy's (``start_tansu(advertised_port=
proxy.port)``) and every client connection, bootstrap and leader alike, authenticates.

The wire format is written out here with ``struct``, independently of spark_sink's protocol
code, because the proxy is what checks kprod's own SASL client. SCRAM's server side is the
``scramp`` library's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from scramp import ScramException, ScramMechanism

from tests.asyncserver import BackgroundServer

PRODUCE = 0
SASL_HANDSHAKE = 17
API_VERSIONS = 18
SASL_AUTHENTICATE = 36

UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
SASL_AUTHENTICATION_FAILED = 58

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

# Highest versions the proxy answers itself (those Kafka and Tansu know).
_MAX_VERSION = {SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 2}
# First flexible version of the requests whose bodies the proxy reads (SaslHandshake has
# none): their request header carries tagged fields, their response header an empty set.
_FLEXIBLE_FROM = {PRODUCE: 9, SASL_AUTHENTICATE: 2}
# A Kafka broker's sasl.server.max.receive.size: larger frames before authentication are
# refused (a TLS ClientHello sent to a plaintext listener, say).
_PRE_AUTH_MAX_RECEIVE = 524288


class _Close(Exception):
    """End the client connection (any response already written is still delivered)."""


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_uvarint(data: bytes, offset: int) -> tuple[int, int]:
    """Decode an unsigned varint at ``offset``; returns (value, offset after it)."""
    value = shift = 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7


def _skip_tagged_fields(data: bytes, offset: int) -> int:
    count, offset = _read_uvarint(data, offset)
    for _ in range(count):
        _, offset = _read_uvarint(data, offset)  # tag
        size, offset = _read_uvarint(data, offset)
        offset += size
    return offset


def _string(value: str) -> bytes:
    raw = value.encode()
    return struct.pack(">h", len(raw)) + raw


def _nullable_string(value: str | None, compact: bool) -> bytes:
    if value is None:
        return b"\x00" if compact else struct.pack(">h", -1)
    raw = value.encode()
    return (_uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


@dataclass(frozen=True)
class _Request:
    """One request frame from the client, size prefix included (so it can be forwarded)."""

    frame: bytes

    @property
    def api_key(self) -> int:
        return struct.unpack_from(">h", self.frame, 4)[0]

    @property
    def api_version(self) -> int:
        return struct.unpack_from(">h", self.frame, 6)[0]

    @property
    def correlation_id(self) -> int:
        return struct.unpack_from(">i", self.frame, 8)[0]

    @property
    def flexible(self) -> bool:
        return self.api_version >= _FLEXIBLE_FROM.get(self.api_key, 1 << 15)

    def body_offset(self) -> int:
        """Where the body starts: after client_id (int16-length even in header v2) and,
        for flexible versions, the header's tagged fields."""
        (client_id_length,) = struct.unpack_from(">h", self.frame, 12)
        offset = 14 + max(client_id_length, 0)
        return _skip_tagged_fields(self.frame, offset) if self.flexible else offset

    def response(self, body: bytes) -> bytes:
        """A size-prefixed response frame to this request (never ApiVersions: the broker's
        own response is relayed for those)."""
        header = struct.pack(">i", self.correlation_id) + (b"\x00" if self.flexible else b"")
        return struct.pack(">i", len(header) + len(body)) + header + body


def _expects_response(request: _Request) -> bool:
    """Every request is answered except Produce with acks=0."""
    if request.api_key != PRODUCE:
        return True
    offset = request.body_offset()
    if request.api_version >= 3:  # transactional_id precedes acks
        if request.flexible:
            length, offset = _read_uvarint(request.frame, offset)
            offset += max(length - 1, 0)
        else:
            (length,) = struct.unpack_from(">h", request.frame, offset)
            offset += 2 + max(length, 0)
    (acks,) = struct.unpack_from(">h", request.frame, offset)
    return acks != 0


def _handshake_response(request: _Request, error_code: int, mechanisms: Iterable[str]) -> bytes:
    names = list(mechanisms)
    return request.response(struct.pack(">hi", error_code, len(names)) + b"".join(_string(m) for m in names))


def _authenticate_response(request: _Request, error_code: int, message: str | None = None,
                           auth_bytes: bytes = b"", session_lifetime_ms: int = 0) -> bytes:
    compact = request.flexible
    body = struct.pack(">h", error_code) + _nullable_string(message, compact)
    body += (_uvarint(len(auth_bytes) + 1) if compact else struct.pack(">i", len(auth_bytes))) + auth_bytes
    if request.api_version >= 1:
        body += struct.pack(">q", session_lifetime_ms)
    if compact:
        body += b"\x00"  # no tagged fields
    return request.response(body)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    prefix = await reader.readexactly(4)
    (size,) = struct.unpack(">i", prefix)
    return prefix + await reader.readexactly(size)


class SaslProxy:
    """Accept SASL_PLAINTEXT (or SASL_SSL, given ``ssl_context``) on 127.0.0.1:``port`` and
    relay authenticated connections to ``target`` in plaintext.

    ``users`` maps user names to passwords for every mechanism; SCRAM credentials are salted
    with ``scram_iterations`` (4096 at least, Kafka's minimum too). ``session_lifetime_ms`` > 0
    is reported to clients (SaslAuthenticate v1+) and enforced as Kafka's
    ``connections.max.reauth.ms`` is: the first request after expiry closes the connection,
    unless the client re-authenticated in time. It is read at each authentication, so a test
    may change it on a running proxy.

    For tests: ``authentications`` lists (mechanism, user) of every success, re-authentications
    included, which ``reauthentications`` counts; ``failures`` lists (mechanism or None, user or
    None, reason); ``sessions_expired`` counts connections closed for an expired session.
    """

    def __init__(self, target_host: str, target_port: int, users: dict[str, str],
                 mechanisms: Iterable[str] = MECHANISMS, port: int = 0,
                 ssl_context: ssl.SSLContext | None = None, session_lifetime_ms: int = 0,
                 scram_iterations: int = 4096) -> None:
        self.mechanisms: tuple[str, ...] = tuple(mechanisms)
        if unknown := set(self.mechanisms) - set(MECHANISMS):
            raise ValueError(f"unsupported SASL mechanisms {sorted(unknown)}; choose from {MECHANISMS}")
        self.users = dict(users)
        self.session_lifetime_ms = session_lifetime_ms
        self.authentications: list[tuple[str, str]] = []
        self.reauthentications = 0
        self.failures: list[tuple[str | None, str | None, str]] = []
        self.sessions_expired = 0
        # A broker stores salted SCRAM credentials, not passwords: derive them once.
        self._scram: dict[str, tuple[ScramMechanism, dict[str, tuple]]] = {}
        for name in self.mechanisms:
            if name.startswith("SCRAM-"):
                mechanism = ScramMechanism(name)
                self._scram[name] = (mechanism, {
                    user: mechanism.make_auth_info(password, iteration_count=scram_iterations)
                    for user, password in self.users.items()})
        self._target = (target_host, target_port)
        self._connections: set[asyncio.Task] = set()
        self._server = BackgroundServer(self._handle, port, ssl_context, "saslproxy")
        self.port = self._server.port

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        upstream_writer = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
            await _Connection(self, client_reader, client_writer, upstream_reader, upstream_writer).run()
        except (_Close, OSError, asyncio.IncompleteReadError, struct.error, ValueError):
            pass  # the connection ends, as a broker would end it
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    with contextlib.suppress(OSError, RuntimeError):
                        writer.close()
            self._connections.discard(task)

    def close(self) -> None:
        """Stop listening and end every connection."""
        self._server.close(self._connections)

    def __enter__(self) -> SaslProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Connection:
    """One client connection: authentication, then relaying with re-authentication."""

    def __init__(self, proxy: SaslProxy, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter,
                 upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter) -> None:
        self._proxy = proxy
        self._client_reader = client_reader
        self._client_writer = client_writer
        self._upstream_reader = upstream_reader
        self._upstream_writer = upstream_writer
        self._mechanism: str | None = None
        self._user: str | None = None
        self._expires_at: float | None = None  # time.monotonic(); None: the session never expires
        # Correlation ids of forwarded requests whose responses are not relayed yet. The proxy
        # answers a re-authentication only once none are left, so responses stay in request
        # order (a broker achieves that by processing one request per connection at a time).
        self._awaiting: set[int] = set()
        self._drained = asyncio.Event()
        self._drained.set()

    async def run(self) -> None:
        request = await self._read_request(_PRE_AUTH_MAX_RECEIVE)
        while request.api_key == API_VERSIONS:
            accepted = await self._relay_api_versions(request)
            request = await self._read_request(_PRE_AUTH_MAX_RECEIVE)
            if accepted:  # as in Kafka, only a failed ApiVersions may be retried
                break
        await self._authenticate(request)
        await asyncio.gather(self._forward_requests(), self._relay_responses(), return_exceptions=True)

    # -- framing ------------------------------------------------------------------

    async def _read_request(self, limit: int | None = None) -> _Request:
        prefix = await self._client_reader.readexactly(4)
        (size,) = struct.unpack(">i", prefix)
        if size < 10 or (limit is not None and size > limit):
            self._reject(self._mechanism, self._user, f"invalid request size {size}")
        return _Request(prefix + await self._client_reader.readexactly(size))

    async def _send(self, frame: bytes) -> None:
        self._client_writer.write(frame)
        await self._client_writer.drain()

    async def _relay_api_versions(self, request: _Request) -> bool:
        """Relay an ApiVersions exchange with the broker; True if it succeeded."""
        self._upstream_writer.write(request.frame)
        await self._upstream_writer.drain()
        response = await _read_frame(self._upstream_reader)
        await self._send(response)
        # The ApiVersions response header is always v0: error_code follows the correlation id.
        return struct.unpack_from(">h", response, 8)[0] == 0

    # -- authentication -----------------------------------------------------------

    def _reject(self, mechanism: str | None, user: str | None, reason: str) -> NoReturn:
        self._proxy.failures.append((mechanism, user, reason))
        raise _Close(reason)

    async def _fail(self, request: _Request, mechanism: str, user: str | None, message: str, reason: str) -> NoReturn:
        """Answer SASL_AUTHENTICATION_FAILED with ``message``, then close."""
        await self._send(_authenticate_response(request, SASL_AUTHENTICATION_FAILED, message))
        self._reject(mechanism, user, reason)

    def _invalid_credentials(self, mechanism: str) -> str:
        # Kafka's message when the mechanism fails without a client-safe message of its own.
        during = "re-authentication" if self._user else "authentication"
        return f"Authentication failed during {during} due to invalid credentials with SASL mechanism {mechanism}"

    async def _authenticate(self, request: _Request) -> None:
        """Authenticate (or re-authenticate) starting at ``request``, a SaslHandshake."""
        if request.api_key != SASL_HANDSHAKE:
            self._reject(None, None, f"request with api key {request.api_key} before authentication")
        if request.api_version != 1:
            # v0 would be followed by unframed tokens, which Kafka clients no longer send.
            self._reject(None, None, f"SaslHandshake v{request.api_version}")
        offset = request.body_offset()
        (length,) = struct.unpack_from(">h", request.frame, offset)
        mechanism = request.frame[offset + 2:offset + 2 + length].decode()
        enabled = self._proxy.mechanisms
        if mechanism not in enabled:
            await self._send(_handshake_response(request, UNSUPPORTED_SASL_MECHANISM, enabled))
            self._reject(mechanism, None, "unsupported mechanism")
        await self._send(_handshake_response(request, 0, enabled))
        if self._mechanism is not None and mechanism != self._mechanism:
            # Kafka accepts the handshake and closes the connection at the next request.
            await self._read_request(_PRE_AUTH_MAX_RECEIVE)
            self._reject(mechanism, self._user, f"mechanism changed from {self._mechanism} on re-authentication")

        if mechanism == "PLAIN":
            request, user, final = await self._plain()
        else:
            request, user, final = await self._scram(mechanism)
        if self._user is not None and user != self._user:
            await self._fail(request, mechanism, user,
                             f"Cannot change principals during re-authentication from User:{self._user}: User:{user}",
                             "user changed on re-authentication")

        lifetime_ms = max(self._proxy.session_lifetime_ms, 0)
        self._expires_at = time.monotonic() + lifetime_ms / 1000 if lifetime_ms else None
        await self._send(_authenticate_response(request, 0, auth_bytes=final, session_lifetime_ms=lifetime_ms))
        if self._user is not None:
            self._proxy.reauthentications += 1
        self._mechanism, self._user = mechanism, user
        self._proxy.authentications.append((mechanism, user))

    async def _read_token(self, mechanism: str) -> tuple[_Request, bytes]:
        """Read a SaslAuthenticate request; returns it and its auth_bytes."""
        request = await self._read_request(_PRE_AUTH_MAX_RECEIVE)
        if request.api_key != SASL_AUTHENTICATE or request.api_version > _MAX_VERSION[SASL_AUTHENTICATE]:
            self._reject(mechanism, None, f"expected SaslAuthenticate, got api key {request.api_key} "
                                          f"v{request.api_version}")
        offset = request.body_offset()
        if request.flexible:
            length, offset = _read_uvarint(request.frame, offset)
            length -= 1
        else:
            (length,) = struct.unpack_from(">i", request.frame, offset)
            offset += 4
        return request, request.frame[offset:offset + max(length, 0)]

    async def _plain(self) -> tuple[_Request, str, bytes]:
        """One round: ``authzid NUL user NUL password`` (RFC 4616); the success token is empty."""
        request, token = await self._read_token("PLAIN")
        parts = token.decode("utf-8", "replace").split("\0")
        if len(parts) != 3:
            await self._fail(request, "PLAIN", None, self._invalid_credentials("PLAIN"),
                             f"expected 3 tokens, got {len(parts)}")
        authzid, user, password = parts
        if not user or not password:
            await self._fail(request, "PLAIN", user or None, self._invalid_credentials("PLAIN"),
                             "empty user name or password")
        if self._proxy.users.get(user) != password:
            await self._fail(request, "PLAIN", user, "Authentication failed: Invalid username or password",
                             "invalid username or password")
        if authzid and authzid != user:
            await self._fail(request, "PLAIN", user, "Authentication failed: Client requested an authorization "
                             "id that is different from username", f"authorization id {authzid!r}")
        return request, user, b""

    async def _scram(self, name: str) -> tuple[_Request, str, bytes]:
        """Two rounds: client-first → server-first, client-final → server-final (RFC 5802)."""
        mechanism, credentials = self._proxy._scram[name]
        user: str | None = None

        def lookup(name_from_client: str) -> tuple | None:
            nonlocal user
            user = name_from_client  # already unescaped (=2C, =3D) by scramp
            return credentials.get(name_from_client)

        server = mechanism.make_server(lookup)
        request, token = await self._read_token(name)
        try:
            server.set_client_first(token.decode())
            server_first = server.get_server_first()
        except (ScramException, UnicodeDecodeError) as e:
            await self._fail(request, name, user, self._invalid_credentials(name), str(e))
        # The intermediate round reports no session lifetime.
        await self._send(_authenticate_response(request, 0, auth_bytes=server_first.encode()))
        request, token = await self._read_token(name)
        try:
            server.set_client_final(token.decode())
            server_final = server.get_server_final()
        except (ScramException, UnicodeDecodeError) as e:
            await self._fail(request, name, user, self._invalid_credentials(name), str(e))
        return request, user, server_final.encode()

    # -- after authentication ----------------------------------------------------

    async def _forward_requests(self) -> None:
        """Forward whole request frames to the broker, stepping in for SASL requests."""
        try:
            while True:
                request = await self._read_request()
                if request.api_key == SASL_HANDSHAKE and self._expires_at is not None:
                    # Re-authentication; as in Kafka, it may begin even once the session expired.
                    await self._drained.wait()
                    await self._authenticate(request)
                    continue
                if self._expires_at is not None and time.monotonic() >= self._expires_at:
                    self._proxy.sessions_expired += 1
                    return
                if request.api_key in _MAX_VERSION:
                    # SASL requests on an authenticated connection without re-authentication: the
                    # broker's request handler answers ILLEGAL_SASL_STATE.
                    if request.api_version > _MAX_VERSION[request.api_key]:
                        return
                    await self._drained.wait()
                    if request.api_key == SASL_HANDSHAKE:
                        await self._send(_handshake_response(request, ILLEGAL_SASL_STATE, ()))
                    else:
                        message = "SaslAuthenticate request received after successful authentication"
                        await self._send(_authenticate_response(request, ILLEGAL_SASL_STATE, message))
                    continue
                if _expects_response(request):
                    self._awaiting.add(request.correlation_id)
                    self._drained.clear()
                self._upstream_writer.write(request.frame)
                await self._upstream_writer.drain()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                self._upstream_writer.close()  # ends _relay_responses

    async def _relay_responses(self) -> None:
        """Relay whole response frames from the broker to the requests awaiting them.

        Others are dropped: Tansu answers Produce with acks=0, which a Kafka broker never does.
        """
        try:
            while True:
                frame = await _read_frame(self._upstream_reader)
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                if correlation_id not in self._awaiting:
                    continue
                await self._send(frame)
                self._awaiting.discard(correlation_id)
                if not self._awaiting:
                    self._drained.set()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                self._client_writer.close()  # ends _forward_requests
