"""NetworkClient: non-blocking connections to brokers, the only module with sockets.

One selector multiplexes every broker connection. A connection goes through TCP (and
TLS), then its bring-up (ApiVersions, SASL: the sans-IO machine of
:mod:`~spark_sink.protocol.connection_setup`, fed what is read), keeps its requests in
flight in order, resumes partial writes on the next poll and is closed (failing what is
in flight) on errors and request timeouts. What the client knows of each connection
besides its socket (state, backoff, queues, deadlines) is in
:mod:`~spark_sink.client.connections`. Only the thread doing the Sender's work (the
one holding its I/O lock) calls it, except :meth:`NetworkClient.wakeup` and
:meth:`NetworkClient.wait`.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import selectors
import socket
import ssl
from collections.abc import Mapping
from itertools import islice
from typing import Any, cast

from spark_sink.client import tls
from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.config import ClientConfig
from spark_sink.client.connections import (
    Callback,
    ClientResponse,
    Connection,
    ConnState,
    InFlight,
    Outgoing,
    least_loaded,
)
from spark_sink.client.errors import AuthenticationError, SaslAuthenticationError
from spark_sink.client.oauth import sasl_exchanges
from spark_sink.protocol.connection_setup import ConnectionSetup, Failed, Output, Ready, Send
from spark_sink.protocol.error_codes import (
    KafkaConnectionError,
    KProdError,
    UnsupportedVersionError,
)
from spark_sink.protocol.framing import KafkaProtocol
from spark_sink.protocol.messages import ApiKey, transaction_version

__all__ = ["Callback", "ClientResponse", "NetworkClient"]

log = logging.getLogger(__name__)

_RECV_SIZE = 256 * 1024
# Frames handed to one sendmsg(): enough to batch many small requests into one syscall,
# well under IOV_MAX (1024 on Linux).
_MAX_IOV = 64


class NetworkClient:
    """Connections to every broker the producer talks to."""

    def __init__(self, config: ClientConfig, max_in_flight: int = 5, *, clock: Clock = now_ms) -> None:
        self._config = config
        self._clock = clock  # what request and connection-setup timeouts are measured with
        self._max_in_flight = max_in_flight  # per connection: the producer's max.in.flight.requests.per.connection
        self._selector = selectors.DefaultSelector()
        self._conns: dict[int, Connection] = {}
        for i, (host, port) in enumerate(config.bootstrap_servers):
            self._conns[-(i + 1)] = Connection(-(i + 1), host, port)
        self._ssl = tls.ssl_context(config)
        # A fresh SASL exchange per connection (with OAUTHBEARER, the first token is
        # fetched now: a refused client fails here, before anything is sent).
        self._sasl_exchange = sasl_exchanges(config)
        # The last authentication (TLS or SASL) that failed; cleared when a connection
        # becomes ready. Read by threads waiting for metadata, which then fail at once, as
        # in Java.
        self.authentication_error: AuthenticationError | None = None
        # Why the last attempt to bring up a connection to each address failed, in words
        # ("connection refused"), until one succeeds: what an error saying that no broker
        # answered names. An address is warned about at its first failure only.
        self.connect_failures: dict[str, str] = {}
        self._warned: set[str] = set()
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
        # The transaction protocol the cluster speaks with kprod (messages.transaction_version),
        # from the connection whose finalized features are the newest (the highest features
        # epoch, as Java's ApiVersions keeps them): 2 where transaction.version is 2 or more.
        self.transaction_version = 0
        self._features_epoch = -2  # below any broker's (-1: a broker that finalizes no feature)

    # -- nodes ----------------------------------------------------------------

    def bootstrap_nodes(self) -> list[int]:
        """Ids of the bootstrap servers (negative, until metadata names the brokers)."""
        return [n for n in self._conns if n < 0]

    def set_nodes(self, nodes: Mapping[int, tuple[str, int]]) -> None:
        """Learn broker addresses from metadata; a moved broker is reconnected."""
        for node_id, (host, port) in nodes.items():
            conn = self._conns.get(node_id)
            if conn is None:
                self._conns[node_id] = Connection(node_id, host, port)
            elif (conn.host, conn.port) != (host, port):
                self._disconnect(conn, KafkaConnectionError(f"broker {node_id} moved to {host}:{port}"), backoff=False)
                conn.host, conn.port = host, port

    # -- readiness ------------------------------------------------------------

    def ready(self, node_id: int, now: float) -> bool:
        """True if a request can be sent to ``node_id`` now: connected, versions negotiated,
        the previous request fully written and fewer than max.in.flight in flight.
        Otherwise starts connecting when the reconnect backoff allows."""
        conn = self._conns.get(node_id)
        if conn is None:
            return False
        setup = conn.setup
        if conn.state is ConnState.READY and setup is not None and setup.renew_at_ms and setup.session_ending(now):
            if conn.in_flight or conn.outbox:
                return False  # let the session's last requests finish
            self._disconnect(conn, KafkaConnectionError("SASL session lifetime ending; authenticating anew"),
                             backoff=False)
        if conn.state is ConnState.READY:
            # As Java's canSendMore: not while the last request is still being written. A
            # slow socket then leaves batches in the accumulator, where they keep filling,
            # instead of queueing small requests here (and acks=0, which has nothing in
            # flight, cannot queue without bound).
            return not conn.outbox and len(conn.in_flight) < self._max_in_flight
        if conn.may_connect(now):
            self._connect(conn, now)
        return False

    def is_connected(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and conn.state is ConnState.READY

    def connection_failed(self, node_id: int) -> bool:
        """True if the last attempt to reach ``node_id`` failed and it is backing off."""
        conn = self._conns.get(node_id)
        return conn is not None and conn.state is ConnState.DISCONNECTED and conn.failures > 0

    def connection_delay_ms(self, node_id: int, now: float) -> float:
        """How long until ``node_id`` may be tried again (0 if now)."""
        conn = self._conns.get(node_id)
        return conn.connect_delay_ms(now) if conn is not None else 0.0

    def in_flight_count(self, node_id: int) -> int:
        conn = self._conns.get(node_id)
        return len(conn.in_flight) if conn else 0

    def least_loaded_node(self, now: float) -> int | None:
        """A ready node with the fewest requests in flight, else one that is connecting or
        may connect now; brokers from metadata are preferred over bootstrap entries."""
        return least_loaded(self._conns.values(), now)

    def describe_bootstrap(self) -> str:
        """Each bootstrap address with what happened when it was last tried, for errors
        saying why no broker answered: ``127.0.0.1:1: connection refused; ...``."""
        parts = []
        for node in self.bootstrap_nodes():
            conn = self._conns[node]
            address = f"{conn.host}:{conn.port}"
            cause = self.connect_failures.get(address)
            if cause is None:
                cause = {ConnState.READY: "connected, but no metadata came back",
                         ConnState.DISCONNECTED: "not tried yet"}.get(conn.state, "still connecting")
            parts.append(f"{address}: {cause}")
        return "; ".join(parts)

    @property
    def features_known(self) -> bool:
        """A broker has told its finalized features (``transaction_version`` is its word)."""
        return self._features_epoch > -2

    def api_version(self, node_id: int, api_key: int) -> int | None:
        conn = self._conns.get(node_id)
        return conn.versions.get(api_key) if conn else None

    # -- requests -------------------------------------------------------------

    def send(self, node_id: int, api_key: int, body: Any, callback: Callback | None,
             expect_response: bool = True, max_version: int | None = None) -> None:
        """Queue a request to a READY node; the version is the highest both sides support,
        at most ``max_version`` (a transaction of protocol v1 stops below v2's versions)."""
        conn = self._conns[node_id]
        if conn.state is not ConnState.READY:
            raise KafkaConnectionError(f"node {node_id} is not ready")
        version = conn.versions.get(api_key)
        if version is None:
            raise UnsupportedVersionError(f"broker {node_id} does not support {ApiKey(api_key).name}")
        if max_version is not None and version > max_version:
            version = max_version
        self._enqueue(conn, api_key, version, body, callback, expect_response)

    def _enqueue(self, conn: Connection, api_key: int, version: int, body: Any,
                 callback: Callback | None, expect_response: bool) -> None:
        _, protocol = conn.transport()
        correlation_id, parts = protocol.send_request_parts(api_key, version, body, expect_response)
        now = self._clock()
        conn.last_used_ms = now
        on_written = None
        if expect_response:
            conn.in_flight.append(InFlight(correlation_id, api_key, version, callback, now))
        elif callback is not None:
            on_written = (callback, ClientResponse(conn.node_id, api_key, version, correlation_id, None, None, 0.0))
        # One outbox entry per buffer (record bytes are written from where they are); the
        # last one carries what to do once the whole frame is out.
        last = len(parts) - 1
        conn.outbox.extend(Outgoing(memoryview(part), on_written if i == last else None, now)
                           for i, part in enumerate(parts))
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
            timeout_ms = min(timeout_ms, self.next_timeout_ms(self._clock()))
        for key, events in self._selector.select(max(0.0, timeout_ms) / 1000.0):
            conn = key.data
            if conn is None:
                self._drain_wakeups()
                # Whoever woke us changed something (close, flush, a new topic) that the
                # caller decided on before this poll: it must look again, not wait.
                self._progressed = True
                continue
            try:
                if conn.state is ConnState.CONNECTING:
                    self._finish_connect(conn)
                    continue
                if conn.state is ConnState.HANDSHAKING:
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
        self._expire(self._clock())
        if self._completed:
            self._progressed = True
            self._run_callbacks()
        return self._progressed

    def _run_callbacks(self) -> None:
        """Run every completed request's callback. One that raises is a bug that may have
        left its batches or transaction half handled: the others still run, then the
        first error goes up to whoever polls (the Sender fails everything it holds with
        it), rather than leaving records waiting forever."""
        completed, self._completed = self._completed, []
        failure: Exception | None = None
        for callback, response in completed:
            try:
                callback(response)
            except Exception as exc:
                log.exception("request callback failed")
                failure = failure or exc
        if failure is not None:
            raise failure

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
        try:
            self._run_callbacks()
        except Exception:  # logged; whoever closes fails what is left anyway
            pass
        self._selector.close()
        self._wakeup_selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- connection lifecycle -------------------------------------------------

    def _connect(self, conn: Connection, now: float) -> None:
        log.debug("connecting to node %s at %s:%s", conn.node_id, conn.host, conn.port)
        try:
            family = socket.AF_INET6 if ":" in conn.host else socket.AF_INET
            infos = socket.getaddrinfo(conn.host, conn.port, 0, socket.SOCK_STREAM)
            family, _, _, _, address = infos[0] if infos else (family, None, None, None, (conn.host, conn.port))
            sock = socket.socket(family, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            self._fail_connect(conn, f"name not resolved ({exc.strerror})", now)
            return
        except OSError as exc:
            self._fail_connect(conn, f"cannot open a socket: {exc}", now)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._config.send_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._config.send_buffer_bytes)
        if self._config.receive_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._config.receive_buffer_bytes)
        conn.sock, conn.state, conn.connect_started_ms = sock, ConnState.CONNECTING, now
        conn.protocol = KafkaProtocol(self._config.client_id)
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
            sock.close()
            conn.sock = None
            self._fail_connect(conn, _errno_text(err), now)
            return
        self._selector.register(sock, selectors.EVENT_WRITE, conn)
        conn.writing = True

    def _finish_connect(self, conn: Connection) -> None:
        sock, _ = conn.transport()
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise KafkaConnectionError(_errno_text(err))
        if self._ssl is not None:
            # The wrapped socket takes over the file descriptor: register it instead.
            self._selector.unregister(sock)
            conn.sock = self._ssl.wrap_socket(sock, server_hostname=conn.host, do_handshake_on_connect=False)
            self._selector.register(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            conn.writing = True
            conn.state = ConnState.HANDSHAKING
            self._handshake(conn)
            return
        self._start_setup(conn)

    def _handshake(self, conn: Connection) -> None:
        """One step of the TLS handshake; waits for whichever direction it needs next."""
        sock, _ = conn.transport()
        try:
            cast(ssl.SSLSocket, sock).do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
            return
        except OSError as exc:  # ssl.SSLError included
            raise self._tls_failed(conn, exc) from None
        self._start_setup(conn)

    def _tls_failed(self, conn: Connection, exc: OSError) -> KProdError:
        error = tls.handshake_error(exc, conn.host, conn.port, self._config)
        if isinstance(error, AuthenticationError):
            self.authentication_error = error  # threads waiting for metadata fail at once, as in Java
        return error

    def _start_setup(self, conn: Connection) -> None:
        sock, protocol = conn.transport()
        conn.state = ConnState.SETTING_UP
        self._selector.modify(sock, selectors.EVENT_READ, conn)
        conn.writing = False
        try:
            exchange = self._sasl_exchange(conn.host) if self._sasl_exchange is not None else None
        except SaslAuthenticationError as error:  # no OAUTHBEARER token or Kerberos ticket to be had
            self.authentication_error = error
            raise
        # Java's choice: renew a SASL session at a random 85-95% of its lifetime, so that a
        # fleet of clients does not reconnect at once, well before the broker closes it.
        conn.setup = ConnectionSetup(protocol, exchange, random.uniform(0.85, 0.95))
        now = self._clock()
        self._follow(conn, conn.setup.connected(now), now)

    def _follow(self, conn: Connection, outputs: list[Output], now: float) -> None:
        """Do what the connection's bring-up, fed at ``now``, says."""
        for output in outputs:
            if type(output) is Send:
                conn.outbox.append(Outgoing(memoryview(output.data), None, now))
                self._write(conn)
            elif type(output) is Ready:
                conn.note_ready(output.versions, now)
                if output.features_epoch > self._features_epoch:
                    self._features_epoch = output.features_epoch
                    self.transaction_version = transaction_version(output.features, output.versions)
                self._progressed = True
                self.authentication_error = None
                address = f"{conn.host}:{conn.port}"
                self.connect_failures.pop(address, None)
                self._warned.discard(address)
                log.debug("node %s ready, versions %s", conn.node_id, conn.versions)
            elif type(output) is Failed:
                if output.authentication:
                    error = SaslAuthenticationError(f"SASL {self._config.sasl_mechanism} authentication with "
                                                    f"{conn.host}:{conn.port} failed: {output.reason}")
                    self.authentication_error = error
                    raise error
                raise KafkaConnectionError(f"setting up the connection to node {conn.node_id} failed: "
                                           f"{output.reason}")

    def _fail_connect(self, conn: Connection, cause: str, now: float) -> None:
        conn.state = ConnState.DISCONNECTED
        conn.note_failure(now, self._config)
        self._bring_up_failed(conn, cause)

    def _bring_up_failed(self, conn: Connection, cause: str) -> None:
        """Remember why the connection to an address could not be brought up; the first
        failure is a warning (a wrong address or security.protocol shows at once), the
        retries that follow are not."""
        address = f"{conn.host}:{conn.port}"
        self.connect_failures[address] = cause
        level = logging.INFO if address in self._warned else logging.WARNING
        self._warned.add(address)
        log.log(level, "cannot connect to %s (node %s): %s", address, conn.node_id, cause)

    def _disconnect(self, conn: Connection, error: Exception, backoff: bool = True) -> None:
        if conn.sock is not None:
            try:
                self._selector.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
            conn.sock.close()
            conn.sock = None
            if conn.state is ConnState.READY or not backoff:
                log.info("disconnected from node %s: %s", conn.node_id, error)
            else:
                self._bring_up_failed(conn, str(error))
        now = self._clock()
        if conn.state is not ConnState.DISCONNECTED and backoff:
            conn.note_failure(now, self._config)
        self._completed += conn.disconnected(error, now)

    # -- I/O ------------------------------------------------------------------

    def _write(self, conn: Connection) -> None:
        outbox, sock = conn.outbox, conn.sock
        if sock is None or conn.state is ConnState.CONNECTING:
            return
        while outbox:
            try:
                if len(outbox) == 1 or self._ssl is not None:  # SSLSocket has no sendmsg
                    sent = sock.send(outbox[0].data)
                else:
                    # Several queued frames go out in one syscall (writev), no joining copy.
                    sent = sock.sendmsg([entry.data for entry in islice(outbox, _MAX_IOV)])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                break
            except OSError as exc:
                raise KafkaConnectionError(f"write to node {conn.node_id} failed: {exc}") from exc
            # Retire the frames written whole; a partly written one keeps its tail (a
            # memoryview slice, no copy) for the next writable event: never spin on a full
            # socket buffer.
            while sent:
                entry = outbox[0]
                view = entry.data
                if sent < len(view):
                    entry.data = view[sent:]
                    break
                sent -= len(view)
                outbox.popleft()
                if entry.on_written is not None:
                    self._completed.append(entry.on_written)
            else:
                continue
            break
        want_write = bool(outbox)
        if want_write != conn.writing:
            self._selector.modify(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want_write else 0), conn)
            conn.writing = want_write

    def _read(self, conn: Connection) -> None:
        sock, buf = conn.sock, self._recv_view
        while sock is not None:
            try:
                n = sock.recv_into(buf)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as exc:
                if conn.state is not ConnState.READY and tls.is_alert(exc):
                    # With TLS 1.3 the client's side of the handshake ends before the broker
                    # has checked the client's certificate: a refusal arrives as an alert on
                    # the first read.
                    raise self._tls_failed(conn, exc) from None
                raise KafkaConnectionError(f"read from node {conn.node_id} failed: {exc}") from exc
            if not n:
                if conn.state is ConnState.SETTING_UP:
                    # What a TLS listener does to a plaintext connection (the other way
                    # round fails in the TLS handshake instead).
                    raise KafkaConnectionError("the broker closed the connection before answering ApiVersions "
                                               "(a TLS or SASL_SSL listener? check security.protocol)")
                raise KafkaConnectionError(f"node {conn.node_id} closed the connection")
            if conn.state is ConnState.SETTING_UP:
                now = self._clock()
                self._follow(conn, conn.bring_up().receive_data(buf[:n], now), now)
            elif responses := conn.transport()[1].receive_data(buf[:n]):
                now = self._clock()
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
        config = self._config
        return max(0.0, min((c.next_deadline_ms(config) for c in self._conns.values()), default=float("inf")) - now)

    def _expire(self, now: float) -> None:
        for conn in self._conns.values():
            expiry = conn.expiry(now, self._config)
            if expiry is not None:
                self._disconnect(conn, expiry[0], backoff=expiry[1])


def _errno_text(err: int) -> str:
    """A connect() error in words: ``connection refused`` (ECONNREFUSED)."""
    text = os.strerror(err)
    return f"{text[:1].lower()}{text[1:]} ({errno.errorcode.get(err, err)})"
