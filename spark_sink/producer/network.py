"""NetworkClient: non-blocking connections to brokers, the only module with sockets.

One selector multiplexes every broker connection. Each connection negotiates API
versions right after connecting (then authenticates, with SASL), keeps its requests in
flight in order, resumes partial writes on the next poll and is closed (failing what is
in flight) on errors and request timeouts. Only the thread doing the Sender's work (the
one holding its I/O lock) calls it, except :meth:`NetworkClient.wakeup` and
:meth:`NetworkClient.wait`.
"""

from __future__ import annotations

import errno
import logging
import random
import selectors
import socket
import ssl
import time
from collections import deque
from itertools import islice
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from spark_sink.producer.config import ProducerConfig, sasl_credentials
from spark_sink.producer.errors import (
    AuthenticationError,
    KafkaTimeoutError,
    SaslAuthenticationError,
    SslAuthenticationError,
)
from spark_sink.producer.tls import ssl_context
from spark_sink.protocol import sasl
from spark_sink.protocol.errors import KafkaConnectionError, KProdError, error_for_code
from spark_sink.protocol.framing import KafkaProtocol
from spark_sink.protocol.messages import ApiKey, choose_version

log = logging.getLogger(__name__)

_RECV_SIZE = 256 * 1024
# Frames handed to one sendmsg(): enough to batch many small requests into one syscall,
# well under IOV_MAX (1024 on Linux).
_MAX_IOV = 64


def _is_tls_alert(exc: OSError) -> bool:
    """True for a TLS protocol error (an alert from the peer, a failed check), not for a
    connection that merely ended or broke."""
    return isinstance(exc, ssl.SSLError) and not isinstance(
        exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError))


def now_ms() -> float:
    """Monotonic milliseconds, the clock every timeout in the producer uses."""
    return time.monotonic() * 1000.0


@dataclass(slots=True)
class ClientResponse:
    """The outcome of one request: a decoded body, or the error that prevented it."""

    node_id: int
    api_key: int
    api_version: int
    correlation_id: int
    body: dict[str, Any] | None
    error: Exception | None
    request_latency_ms: float


Callback = Callable[[ClientResponse], None]


class _State(Enum):
    DISCONNECTED = 0
    CONNECTING = 1
    HANDSHAKING = 2  # TLS
    CHECKING_API_VERSIONS = 3
    AUTHENTICATING = 4  # SASL
    READY = 5


@dataclass(slots=True)
class _InFlight:
    correlation_id: int
    api_key: int
    api_version: int
    callback: Callback | None
    sent_ms: float


@dataclass
class _Connection:
    node_id: int
    host: str
    port: int
    state: _State = _State.DISCONNECTED
    sock: socket.socket | None = None
    protocol: KafkaProtocol | None = None
    versions: dict[int, int] = field(default_factory=dict)
    sasl_exchange: sasl.SaslMechanism | None = None  # under way
    # When a SASL session with a lifetime (KIP-368) is due to be replaced: from then on no
    # new request is sent, and once none is in flight the connection is closed and a new
    # one authenticates. 0: no lifetime.
    reauthenticate_ms: float = 0.0
    # Frame buffers waiting to be written as [view, on_written, queued_ms]; on_written is the
    # (callback, response) fired once the frame is out (requests that expect no response,
    # e.g. Produce with acks=0), queued_ms lets a write stuck behind a stalled socket time
    # out like a request in flight.
    outbox: deque = field(default_factory=deque)
    in_flight: deque = field(default_factory=deque)
    connect_started_ms: float = 0.0
    last_used_ms: float = 0.0
    last_failure_ms: float = -1e18
    failures: int = 0
    backoff_ms: float = 0.0
    writing: bool = False


class NetworkClient:
    """Connections to every broker the producer talks to."""

    def __init__(self, config: ProducerConfig) -> None:
        self._config = config
        self._selector = selectors.DefaultSelector()
        self._conns: dict[int, _Connection] = {}
        for i, (host, port) in enumerate(config.bootstrap_servers):
            self._conns[-(i + 1)] = _Connection(-(i + 1), host, port)
        self._ssl = ssl_context(config)
        self._sasl_credentials = (
            sasl_credentials(config.sasl_jaas_config) if config.security_protocol.startswith("SASL_") else None)
        # The last authentication (TLS or SASL) that failed; cleared when a connection
        # becomes ready. Read by threads waiting for metadata, which then fail at once, as
        # in Java.
        self.authentication_error: AuthenticationError | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        # Watches the wakeup socket alone: for a wait that must not be cut short by broker I/O.
        self._wakeup_selector = selectors.DefaultSelector()
        self._wakeup_selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._completed: list[tuple[Callback, ClientResponse]] = []
        self._progressed = False  # set by poll() when a request completes or a connection gets ready
        # One receive buffer for every connection: KafkaProtocol copies what it is fed, and
        # only the polling thread reads, so recv_into() never allocates per read.
        self._recv_buf = bytearray(_RECV_SIZE)
        self._recv_view = memoryview(self._recv_buf)
        self._closed = False
        # Set once a wakeup byte is written, cleared when it is read: send() calls wakeup()
        # for every new or full batch, and most of those find the sender already woken.
        self._wakeup_pending = False

    # -- nodes ----------------------------------------------------------------

    def bootstrap_nodes(self) -> list[int]:
        """Ids of the bootstrap servers (negative, until metadata names the brokers)."""
        return [n for n in self._conns if n < 0]

    def set_nodes(self, nodes: Mapping[int, tuple[str, int]]) -> None:
        """Learn broker addresses from metadata; a moved broker is reconnected."""
        for node_id, (host, port) in nodes.items():
            conn = self._conns.get(node_id)
            if conn is None:
                self._conns[node_id] = _Connection(node_id, host, port)
            elif (conn.host, conn.port) != (host, port):
                self._disconnect(conn, KafkaConnectionError(f"broker {node_id} moved to {host}:{port}"), backoff=False)
                conn.host, conn.port = host, port

    def known_nodes(self) -> list[int]:
        return list(self._conns)

    # -- readiness ------------------------------------------------------------

    def ready(self, node_id: int, now: float) -> bool:
        """True if a request can be sent to ``node_id`` now: connected, versions negotiated,
        the previous request fully written and fewer than max.in.flight in flight.
        Otherwise starts connecting when the reconnect backoff allows."""
        conn = self._conns.get(node_id)
        if conn is None:
            return False
        if conn.state is _State.READY and conn.reauthenticate_ms and now >= conn.reauthenticate_ms:
            if conn.in_flight or conn.outbox:
                return False  # let the session's last requests finish
            self._disconnect(conn, KafkaConnectionError("SASL session lifetime ending; authenticating anew"),
                             backoff=False)
        if conn.state is _State.READY:
            # As Java's canSendMore: not while the last request is still being written. A
            # slow socket then leaves batches in the accumulator, where they keep filling,
            # instead of queueing small requests here (and acks=0, which has nothing in
            # flight, cannot queue without bound).
            return not conn.outbox and len(conn.in_flight) < self._config.max_in_flight_requests_per_connection
        if conn.state is _State.DISCONNECTED and now - conn.last_failure_ms >= conn.backoff_ms:
            self._connect(conn, now)
        return False

    def is_connected(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and conn.state is _State.READY

    def connection_failed(self, node_id: int) -> bool:
        """True if the last attempt to reach ``node_id`` failed and it is backing off."""
        conn = self._conns.get(node_id)
        return conn is not None and conn.state is _State.DISCONNECTED and conn.failures > 0

    def connection_delay_ms(self, node_id: int, now: float) -> float:
        """How long until ``node_id`` may be tried again (0 if now)."""
        conn = self._conns.get(node_id)
        if conn is None or conn.state is not _State.DISCONNECTED:
            return 0.0
        return max(0.0, conn.last_failure_ms + conn.backoff_ms - now)

    def in_flight_count(self, node_id: int | None = None) -> int:
        if node_id is None:
            return sum(len(c.in_flight) for c in self._conns.values())
        conn = self._conns.get(node_id)
        return len(conn.in_flight) if conn else 0

    def least_loaded_node(self, now: float) -> int | None:
        """A ready node with the fewest requests in flight, else one that is connecting or
        may connect now; brokers from metadata are preferred over bootstrap entries."""
        best, best_load = None, None
        fallback = None
        for node_id, conn in sorted(self._conns.items(), key=lambda kv: (kv[0] < 0, random.random())):
            if conn.state is _State.READY:
                load = len(conn.in_flight)
                if best_load is None or load < best_load:
                    best, best_load = node_id, load
            elif fallback is None and (
                conn.state is not _State.DISCONNECTED or now - conn.last_failure_ms >= conn.backoff_ms
            ):
                fallback = node_id
        return best if best is not None else fallback

    def api_version(self, node_id: int, api_key: int) -> int | None:
        conn = self._conns.get(node_id)
        return conn.versions.get(api_key) if conn else None

    # -- requests -------------------------------------------------------------

    def send(self, node_id: int, api_key: int, body: dict[str, Any], callback: Callback | None,
             expect_response: bool = True) -> None:
        """Queue a request to a READY node; the version is the highest both sides support."""
        conn = self._conns[node_id]
        if conn.state is not _State.READY:
            raise KafkaConnectionError(f"node {node_id} is not ready")
        version = conn.versions.get(api_key)
        if version is None:
            raise error_for_code(35, f"broker {node_id} does not support {ApiKey(api_key).name}")
        self._enqueue(conn, api_key, version, body, callback, expect_response)

    def _enqueue(self, conn: _Connection, api_key: int, version: int, body: dict[str, Any],
                 callback: Callback | None, expect_response: bool) -> None:
        correlation_id, parts = conn.protocol.send_request_parts(api_key, version, body, expect_response)
        now = now_ms()
        conn.last_used_ms = now
        on_written = None
        if expect_response:
            conn.in_flight.append(_InFlight(correlation_id, api_key, version, callback, now))
        elif callback is not None:
            on_written = (callback, ClientResponse(conn.node_id, api_key, version, correlation_id, None, None, 0.0))
        # One outbox entry per buffer (record bytes are written from where they are); the
        # last one carries what to do once the whole frame is out.
        last = len(parts) - 1
        conn.outbox.extend([memoryview(part), on_written if i == last else None, now] for i, part in enumerate(parts))
        try:
            self._write(conn)
        except KProdError as exc:
            # Fails this request too; its callback runs on the next poll, like any other.
            self._disconnect(conn, exc)

    def poll(self, timeout_ms: float) -> bool:
        """Wait up to ``timeout_ms`` for I/O, handle it, expire timed-out requests and
        connection attempts, then run the callbacks of completed requests. Returns whether
        a request completed, a connection became ready or wakeup() was called: the caller's
        next step may differ."""
        self._progressed = False
        if timeout_ms > 0:
            timeout_ms = min(timeout_ms, self.next_timeout_ms(now_ms()))
        for key, events in self._selector.select(max(0.0, timeout_ms) / 1000.0):
            conn = key.data
            if conn is None:
                self._drain_wakeups()
                # Whoever woke us changed something (close, flush, a new topic) that the
                # caller decided on before this poll: it must look again, not wait.
                self._progressed = True
                continue
            try:
                if conn.state is _State.CONNECTING:
                    self._finish_connect(conn)
                    continue
                if conn.state is _State.HANDSHAKING:
                    self._handshake(conn)
                    continue
                if events & selectors.EVENT_WRITE:
                    self._write(conn)
                if events & selectors.EVENT_READ:
                    self._read(conn)
            except KProdError as exc:
                self._disconnect(conn, exc)
            except Exception as exc:  # a decoding bug must not kill the I/O thread
                log.exception("unexpected error on the connection to node %s", conn.node_id)
                self._disconnect(conn, KafkaConnectionError(f"connection to node {conn.node_id} failed: {exc!r}"))
        self._expire(now_ms())
        if self._completed:
            self._progressed = True
            self._run_callbacks()
        return self._progressed

    def _run_callbacks(self) -> None:
        completed, self._completed = self._completed, []
        for callback, response in completed:
            try:
                callback(response)
            except Exception:  # a callback bug must not kill the I/O thread
                log.exception("request callback failed")

    def wait(self, timeout_ms: float, io: bool = True) -> None:
        """Block up to ``timeout_ms`` until wakeup() is called or (``io``) some I/O is ready,
        handling nothing: the next poll(0) does. Unlike the other methods, it may run while
        another thread uses the client (the Sender waits here without its I/O lock)."""
        if io:
            self._selector.select(max(0.0, timeout_ms) / 1000.0)
        elif self._wakeup_selector.select(max(0.0, timeout_ms) / 1000.0):
            self._drain_wakeups()  # else every later wait would return at once

    def wakeup(self) -> None:
        """Interrupt a blocking poll; safe from any thread."""
        if self._wakeup_pending:
            return
        self._wakeup_pending = True
        try:
            self._wake_w.send(b"\x00")
        except OSError:
            pass  # buffer full (already woken) or closed

    def close(self) -> None:
        """Close every connection, failing what is in flight."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns.values():
            self._disconnect(conn, KafkaConnectionError("producer network client closed"), backoff=False)
        self._run_callbacks()
        self._selector.close()
        self._wakeup_selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- connection lifecycle -------------------------------------------------

    def _connect(self, conn: _Connection, now: float) -> None:
        log.debug("connecting to node %s at %s:%s", conn.node_id, conn.host, conn.port)
        try:
            family = socket.AF_INET6 if ":" in conn.host else socket.AF_INET
            infos = socket.getaddrinfo(conn.host, conn.port, 0, socket.SOCK_STREAM)
            family, _, _, _, address = infos[0] if infos else (family, None, None, None, (conn.host, conn.port))
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            self._fail_connect(conn, KafkaConnectionError(f"cannot resolve {conn.host}:{conn.port}: {exc}"), now)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._config.send_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._config.send_buffer_bytes)
        if self._config.receive_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._config.receive_buffer_bytes)
        conn.sock, conn.state, conn.connect_started_ms = sock, _State.CONNECTING, now
        conn.protocol = KafkaProtocol(self._config.client_id)
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            conn.sock = None
            self._fail_connect(conn, KafkaConnectionError(
                f"cannot connect to {conn.host}:{conn.port}: {errno.errorcode.get(err, err)}"), now)
            return
        self._selector.register(sock, selectors.EVENT_WRITE, conn)
        conn.writing = True

    def _finish_connect(self, conn: _Connection) -> None:
        err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise KafkaConnectionError(f"cannot connect to {conn.host}:{conn.port}: {errno.errorcode.get(err, err)}")
        if self._ssl is not None:
            # The wrapped socket takes over the file descriptor: register it instead.
            self._selector.unregister(conn.sock)
            conn.sock = self._ssl.wrap_socket(conn.sock, server_hostname=conn.host, do_handshake_on_connect=False)
            self._selector.register(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            conn.writing = True
            conn.state = _State.HANDSHAKING
            self._handshake(conn)
            return
        self._start_api_versions(conn)

    def _handshake(self, conn: _Connection) -> None:
        """One step of the TLS handshake; waits for whichever direction it needs next."""
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except ssl.SSLCertVerificationError as exc:
            error = SslAuthenticationError(
                f"TLS handshake with {conn.host}:{conn.port} failed: certificate verify failed: "
                f"{exc.verify_message or exc} "
                "(check ssl.truststore.location / ssl.truststore.certificates, and "
                "ssl.endpoint.identification.algorithm for the host name)")
            self.authentication_error = error
            raise error from None
        except OSError as exc:  # ssl.SSLError included
            if _is_tls_alert(exc):
                raise self._tls_refused(conn, exc) from None
            raise KafkaConnectionError(f"TLS handshake with {conn.host}:{conn.port} failed: {exc}") from exc
        self._start_api_versions(conn)

    def _tls_refused(self, conn: _Connection, exc: ssl.SSLError) -> SslAuthenticationError:
        """The broker refused the TLS session with an alert: an authentication failure, as
        Java's SslAuthenticationException, so that waiting threads fail at once."""
        hint = ("the broker may require a client certificate: set ssl.keystore.location"
                if self._config.ssl_keystore_location is None
                else "check the client certificate in ssl.keystore.location and that the broker trusts its CA")
        error = SslAuthenticationError(
            f"the TLS session with {conn.host}:{conn.port} was refused: {exc.reason or exc} ({hint})")
        self.authentication_error = error
        return error

    def _start_api_versions(self, conn: _Connection) -> None:
        conn.state = _State.CHECKING_API_VERSIONS
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        conn.writing = False
        self._enqueue(conn, ApiKey.API_VERSIONS, 3, {}, self._on_api_versions, True)

    def _on_api_versions(self, response: ClientResponse) -> None:
        conn = self._conns.get(response.node_id)
        if conn is None or response.error is not None or conn.state is not _State.CHECKING_API_VERSIONS:
            return
        body = response.body
        if body["error_code"] == 35 and response.api_version > 0:
            ours = [e["max_version"] for e in body["api_keys"] if e["api_key"] == ApiKey.API_VERSIONS]
            retry_version = min(response.api_version - 1, max(ours or [0]))
            self._enqueue(conn, ApiKey.API_VERSIONS, retry_version, {}, self._on_api_versions, True)
            return
        if body["error_code"]:
            self._disconnect(conn, error_for_code(body["error_code"], f"ApiVersions from node {conn.node_id}"))
            return
        versions = {}
        for entry in body["api_keys"]:
            try:
                versions[entry["api_key"]] = choose_version(entry["api_key"], entry["min_version"], entry["max_version"])
            except (KeyError, ValueError):
                continue  # an API kprod does not use
            except KProdError:
                continue  # not usable at any common version; send() will say so
        conn.versions = versions
        if self._sasl_credentials is None:
            self._mark_ready(conn)
        else:
            self._start_sasl(conn)

    def _mark_ready(self, conn: _Connection) -> None:
        conn.state = _State.READY
        self._progressed = True
        conn.sasl_exchange = None
        conn.last_used_ms = now_ms()
        conn.failures = 0
        conn.backoff_ms = 0.0
        self.authentication_error = None
        log.debug("node %s ready, versions %s", conn.node_id, conn.versions)

    # -- SASL (KIP-43 handshake, KIP-152 SaslAuthenticate) --------------------

    def _start_sasl(self, conn: _Connection) -> None:
        conn.state = _State.AUTHENTICATING
        if ApiKey.SASL_HANDSHAKE not in conn.versions or ApiKey.SASL_AUTHENTICATE not in conn.versions:
            self._fail_sasl(conn, "the broker does not support SaslHandshake v1 and SaslAuthenticate "
                                  "(Kafka 1.0 or newer), or has no SASL listener on this port")
            return
        self._enqueue(conn, ApiKey.SASL_HANDSHAKE, conn.versions[ApiKey.SASL_HANDSHAKE],
                      {"mechanism": self._config.sasl_mechanism}, self._on_sasl_handshake, True)

    def _on_sasl_handshake(self, response: ClientResponse) -> None:
        conn = self._authenticating(response)
        if conn is None:
            return
        body = response.body
        if body["error_code"] == 33:  # UNSUPPORTED_SASL_MECHANISM
            offered = ", ".join(body["mechanisms"] or ()) or "none"
            self._fail_sasl(conn, f"sasl.mechanism {self._config.sasl_mechanism} is not enabled on the broker; "
                                  f"it offers {offered}")
            return
        if body["error_code"]:
            self._fail_sasl(conn, f"SaslHandshake failed: {error_for_code(body['error_code']).name}")
            return
        conn.sasl_exchange = sasl.mechanism(self._config.sasl_mechanism, *self._sasl_credentials)
        self._send_sasl_token(conn, conn.sasl_exchange.first_token())

    def _send_sasl_token(self, conn: _Connection, token: bytes) -> None:
        self._enqueue(conn, ApiKey.SASL_AUTHENTICATE, conn.versions[ApiKey.SASL_AUTHENTICATE],
                      {"auth_bytes": token}, self._on_sasl_authenticate, True)

    def _on_sasl_authenticate(self, response: ClientResponse) -> None:
        conn = self._authenticating(response)
        if conn is None or conn.sasl_exchange is None:
            return
        body = response.body
        if body["error_code"]:
            reason = body["error_message"] or error_for_code(body["error_code"]).name
            self._fail_sasl(conn, f"{reason} (check the username and password in sasl.jaas.config)")
            return
        try:
            token = conn.sasl_exchange.respond(body["auth_bytes"] or b"")
        except sasl.SaslError as exc:
            self._fail_sasl(conn, str(exc))
            return
        if token is not None:
            self._send_sasl_token(conn, token)
            return
        lifetime = body.get("session_lifetime_ms", 0)
        # Java's choice: renew at a random 85-95% of the lifetime, so that a fleet of
        # clients does not reconnect at once, well before the broker closes the connection.
        conn.reauthenticate_ms = now_ms() + lifetime * random.uniform(0.85, 0.95) if lifetime > 0 else 0.0
        self._mark_ready(conn)

    def _authenticating(self, response: ClientResponse) -> _Connection | None:
        """The connection a SASL response belongs to, if it is still authenticating."""
        conn = self._conns.get(response.node_id)
        if conn is None or response.error is not None or conn.state is not _State.AUTHENTICATING:
            return None
        return conn

    def _fail_sasl(self, conn: _Connection, reason: str) -> None:
        error = SaslAuthenticationError(
            f"SASL {self._config.sasl_mechanism} authentication with {conn.host}:{conn.port} failed: {reason}")
        self.authentication_error = error
        self._disconnect(conn, error)

    def _fail_connect(self, conn: _Connection, error: Exception, now: float) -> None:
        conn.state = _State.DISCONNECTED
        self._note_failure(conn, now)
        log.info("connection to node %s failed: %s", conn.node_id, error)

    def _note_failure(self, conn: _Connection, now: float) -> None:
        conn.failures += 1
        conn.last_failure_ms = now
        base, cap = self._config.reconnect_backoff_ms, self._config.reconnect_backoff_max_ms
        exp = min(cap, base * (2 ** min(conn.failures - 1, 20)))
        conn.backoff_ms = exp * random.uniform(0.8, 1.2)  # jitter keeps clients from reconnecting in lockstep

    def _disconnect(self, conn: _Connection, error: Exception, backoff: bool = True) -> None:
        if conn.sock is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.sock.close()
            conn.sock = None
            log.info("disconnected from node %s: %s", conn.node_id, error)
        if conn.state is not _State.DISCONNECTED and backoff:
            self._note_failure(conn, now_ms())
        conn.state = _State.DISCONNECTED
        conn.writing = False
        conn.versions = {}
        conn.sasl_exchange = None
        conn.reauthenticate_ms = 0.0
        now = now_ms()
        for entry in conn.in_flight:
            if entry.callback is not None:
                self._completed.append((entry.callback, ClientResponse(
                    conn.node_id, entry.api_key, entry.api_version, entry.correlation_id, None, error,
                    now - entry.sent_ms)))
        for _, on_written, _ in conn.outbox:
            if on_written is not None:
                callback, done = on_written
                done.error = error
                self._completed.append((callback, done))
        conn.in_flight.clear()
        conn.outbox.clear()

    # -- I/O ------------------------------------------------------------------

    def _write(self, conn: _Connection) -> None:
        outbox, sock = conn.outbox, conn.sock
        if sock is None or conn.state is _State.CONNECTING:
            return
        while outbox:
            try:
                if len(outbox) == 1 or self._ssl is not None:  # SSLSocket has no sendmsg
                    sent = sock.send(outbox[0][0])
                else:
                    # Several queued frames go out in one syscall (writev), no joining copy.
                    sent = sock.sendmsg([entry[0] for entry in islice(outbox, _MAX_IOV)])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            except OSError as exc:
                raise KafkaConnectionError(f"write to node {conn.node_id} failed: {exc}") from exc
            # Retire the frames written whole; a partly written one keeps its tail (a
            # memoryview slice, no copy) for the next writable event: never spin on a full
            # socket buffer.
            while sent:
                entry = outbox[0]
                view = entry[0]
                if sent < len(view):
                    entry[0] = view[sent:]
                    break
                sent -= len(view)
                outbox.popleft()
                if entry[1] is not None:
                    self._completed.append(entry[1])
            else:
                continue
            break
        want_write = bool(outbox)
        if want_write != conn.writing:
            self._selector.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0), conn)
            conn.writing = want_write

    def _read(self, conn: _Connection) -> None:
        sock, buf = conn.sock, self._recv_view
        while sock is not None:
            try:
                n = sock.recv_into(buf)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as exc:
                if conn.state is not _State.READY and _is_tls_alert(exc):
                    # With TLS 1.3 the client's side of the handshake ends before the broker
                    # has checked the client's certificate: a refusal arrives as an alert on
                    # the first read.
                    raise self._tls_refused(conn, exc) from None
                raise KafkaConnectionError(f"read from node {conn.node_id} failed: {exc}") from exc
            if not n:
                raise KafkaConnectionError(f"node {conn.node_id} closed the connection")
            if responses := conn.protocol.receive_data(buf[:n]):
                now = now_ms()
                conn.last_used_ms = now
                for correlation_id, api_key, version, body in responses:
                    entry = conn.in_flight.popleft()
                    if entry.callback is not None:
                        self._completed.append((entry.callback, ClientResponse(
                            conn.node_id, api_key, version, correlation_id, body, None, now - entry.sent_ms)))
            # A TLS socket may hold decrypted bytes that select() does not announce: read on
            # until it would block.
            if n < _RECV_SIZE and self._ssl is None:
                return
            sock = conn.sock

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        # Cleared only after the pipe is empty: clearing first could swallow the byte of a
        # wakeup() racing with us and leave the flag set with nothing to read, so every later
        # wakeup() would be skipped. A wakeup() that now sees the flag still set needs no
        # byte: this thread is awake and returns from poll() after this.
        self._wakeup_pending = False

    def next_timeout_ms(self, now: float) -> float:
        """Milliseconds until the nearest request or connection-setup timeout."""
        nearest = float("inf")
        request_timeout = self._config.request_timeout_ms
        setup_timeout = self._config.socket_connection_setup_timeout_ms
        for conn in self._conns.values():
            if conn.in_flight:
                nearest = min(nearest, conn.in_flight[0].sent_ms + request_timeout - now)
            if conn.outbox:
                nearest = min(nearest, conn.outbox[0][2] + request_timeout - now)
            if conn.state in (_State.CONNECTING, _State.HANDSHAKING):
                nearest = min(nearest, conn.connect_started_ms + setup_timeout - now)
        return max(0.0, nearest)

    def _expire(self, now: float) -> None:
        request_timeout = self._config.request_timeout_ms
        setup_timeout = self._config.socket_connection_setup_timeout_ms
        max_idle = self._config.connections_max_idle_ms
        for conn in self._conns.values():
            state = conn.state
            if state is _State.DISCONNECTED:
                continue
            oldest = conn.in_flight[0].sent_ms if conn.in_flight else None
            if conn.outbox and (oldest is None or conn.outbox[0][2] < oldest):
                oldest = conn.outbox[0][2]  # an acks=0 write stuck behind a full socket
            if oldest is not None and now - oldest >= request_timeout:
                # As in Java: a request that timed out leaves the connection in an unknown
                # state, so everything in flight on it fails and it is closed.
                self._disconnect(conn, KafkaTimeoutError(
                    f"request to node {conn.node_id} timed out after {request_timeout} ms (request.timeout.ms)"))
            elif state in (_State.CONNECTING, _State.HANDSHAKING) and now - conn.connect_started_ms >= setup_timeout:
                self._disconnect(conn, KafkaConnectionError(
                    f"connecting to {conn.host}:{conn.port} took over {setup_timeout} ms "
                    "(socket.connection.setup.timeout.ms)"))
            elif (state is _State.READY and oldest is None and max_idle > 0
                  and now - conn.last_used_ms >= max_idle):
                # connections.max.idle.ms: the broker would close it anyway; closing it
                # ourselves avoids a request racing that close. No backoff: it did not fail.
                log.debug("closing idle connection to node %s", conn.node_id)
                self._disconnect(conn, KafkaConnectionError("idle connection closed"), backoff=False)
