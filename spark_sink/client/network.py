"""NetworkClient: non-blocking I/O with every broker, on one selector.

It keeps each connection's requests in flight in order, writes frames (several per
syscall), resumes partial writes on the next poll, reads responses and closes a
connection (failing what is in flight) on errors and request timeouts. Bringing a
connection up (TCP, TLS, ApiVersions, SASL) is the :mod:`~spark_sink.client.dialer`'s
job; what the client knows of each connection besides its socket (state, backoff,
queues, deadlines) is in :mod:`~spark_sink.client.connections`. The client and the
Dialer are the only modules with sockets. Only the thread doing the Sender's work (the one holding its I/O
lock) calls the client, except :meth:`NetworkClient.wakeup` and :meth:`NetworkClient.wait`.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
from collections.abc import Callable, Mapping
from itertools import islice
from typing import cast

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.config import ClientConfig
from spark_sink.client.connections import (
    Callback,
    ClientResponse,
    Connection,
    ConnState,
    InFlight,
    Outgoing,
    Reply,
    least_loaded,
)
from spark_sink.client.dialer import Dialer, Resolve, resolve
from spark_sink.client.errors import AuthenticationError
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import (
    KafkaConnectionError,
    KProdError,
    UnsupportedVersionError,
)
from spark_sink.protocol.schema import Request

__all__ = ["Callback", "ClientResponse", "NetworkClient"]

log = logging.getLogger(__name__)

_RECV_SIZE = 256 * 1024
# Frames handed to one sendmsg(): enough to batch many small requests into one syscall,
# well under IOV_MAX (1024 on Linux).
_MAX_IOV = 64


class NetworkClient:
    """Connections to every broker the producer talks to."""

    def __init__(self, config: ClientConfig, max_in_flight: int = 5, *, clock: Clock = now_ms,
                 resolver: Resolve = resolve) -> None:
        self._config = config
        self._clock = clock  # what request and connection-setup timeouts are measured with
        self._max_in_flight = max_in_flight  # per connection: the producer's max.in.flight.requests.per.connection
        self._selector = selectors.DefaultSelector()
        self._conns: dict[int, Connection] = {}
        for i, (host, port) in enumerate(config.bootstrap_servers):
            self._conns[-(i + 1)] = Connection(-(i + 1), host, port)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        # Watches the wakeup socket alone: for a wait that must not be cut short by broker I/O.
        self._wakeup_selector = selectors.DefaultSelector()
        self._wakeup_selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._completed: list[tuple[Callback, ClientResponse[object]]] = []
        self._progressed = False  # set by poll() when a request completes or a connection gets ready
        # One receive buffer for every connection: KafkaProtocol copies what it is fed, and
        # only the polling thread reads, so recv_into() never allocates per read.
        self._recv_buf = bytearray(_RECV_SIZE)
        self._recv_view = memoryview(self._recv_buf)
        self._closed = False
        # Set once a wakeup byte is written, cleared when it is read: send() calls wakeup()
        # for every new or full batch, and most of those find the sender already woken.
        self._wakeup_pending = False
        # Brings connections up (TCP, TLS, ApiVersions, SASL); it writes through this client.
        # resolver: what names are looked up with (tests give names several addresses).
        self._dialer = Dialer(config, self._selector, self._write, clock, resolver)
        self._tls = self._dialer.uses_tls  # read per write and read: SSLSocket has no sendmsg

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
            self._dialer.connect(conn, now)
        return False

    def is_connected(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and conn.state is ConnState.READY

    def connection_failed(self, node_id: int) -> bool:
        """True if the last attempt to reach ``node_id`` failed and it is backing off."""
        conn = self._conns.get(node_id)
        return conn is not None and conn.state is ConnState.DISCONNECTED and conn.failures > 0

    def connection_delay_ms(self, node_id: int, now: float) -> float:
        """How long until ``node_id`` may be tried again (0 if now); infinite for a
        connected node, which only I/O can make ready again (an answer to a request in
        flight, the socket taking the rest of one), as Java's connectionDelay: a Sender
        waiting on the selector wakes for that, and a timer would only wake it for nothing."""
        conn = self._conns.get(node_id)
        if conn is None:
            return 0.0
        return float("inf") if conn.state is ConnState.READY else conn.connect_delay_ms(now)

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
        return self._dialer.describe(self._conns[node] for node in self.bootstrap_nodes())

    @property
    def authentication_error(self) -> AuthenticationError | None:
        """The last authentication (TLS or SASL) that failed, until a connection is ready:
        threads waiting for metadata fail with it at once, as in Java."""
        return self._dialer.authentication_error

    @property
    def connect_failures(self) -> dict[str, str]:
        """Why the last bring-up of each address failed, in words, until one succeeds."""
        return self._dialer.connect_failures

    @property
    def transaction_version(self) -> int:
        """The transaction protocol the cluster speaks with kprod (messages.transaction_version)."""
        return self._dialer.transaction_version

    @property
    def features_known(self) -> bool:
        """A broker has told its finalized features (``transaction_version`` is its word)."""
        return self._dialer.features_known

    def api_version(self, node_id: int, api_key: int) -> int | None:
        conn = self._conns.get(node_id)
        return conn.versions.get(api_key) if conn else None

    # -- requests -------------------------------------------------------------

    def send(self, node_id: int, api_key: int, body: Request[Reply],
             callback: Callable[[ClientResponse[Reply]], None] | None, expect_response: bool = True,
             max_version: int | None = None) -> None:
        """Queue a request to a READY node; the version is the highest both sides support,
        at most ``max_version`` (a transaction of protocol v1 stops below v2's versions).
        ``callback`` gets the reply of ``body``'s class (``api_key``'s, as kmsg pairs them)."""
        conn = self._conns[node_id]
        if conn.state is not ConnState.READY:
            raise KafkaConnectionError(f"node {node_id} is not ready")
        version = conn.versions.get(api_key)
        if version is None:
            raise UnsupportedVersionError(f"broker {node_id} does not support {ApiKey(api_key).name}")
        if max_version is not None and version > max_version:
            version = max_version
        # Kept among every request's callbacks, each of which is given its own reply class.
        self._enqueue(conn, api_key, version, body, cast("Callback | None", callback), expect_response)

    def _enqueue(self, conn: Connection, api_key: int, version: int, body: object,
                 callback: Callback | None, expect_response: bool) -> None:
        _, protocol = conn.transport()
        correlation_id, parts = protocol.send_request_parts(api_key, version, body, expect_response)
        now = self._clock()
        conn.last_used_ms = now
        on_written: tuple[Callback, ClientResponse[object]] | None = None
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
        a request completed, a connection became ready, one finished writing a request
        left part-written or wakeup() was called: the caller's next step may differ."""
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
                if conn.state is ConnState.CONNECTING or conn.state is ConnState.HANDSHAKING:
                    self._dialer.advance(conn)
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
                self._dialer.failed(conn, str(error))
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
                if len(outbox) == 1 or self._tls:  # SSLSocket has no sendmsg
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
        if conn.writing and not want_write:
            # The rest of a request went out on a writable event: the connection may take
            # the next one now, which the caller must look at rather than wait for an answer.
            self._progressed = True
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
                if conn.state is not ConnState.READY:
                    raise self._dialer.read_failed(conn, exc) from None
                raise KafkaConnectionError(f"read from node {conn.node_id} failed: {exc}") from exc
            if not n:
                if conn.state is ConnState.SETTING_UP:
                    # What a TLS listener does to a plaintext connection (the other way
                    # round fails in the TLS handshake instead).
                    raise KafkaConnectionError("the broker closed the connection before answering ApiVersions "
                                               "(a TLS or SASL_SSL listener? check security.protocol)")
                raise KafkaConnectionError(f"node {conn.node_id} closed the connection")
            if conn.state is ConnState.SETTING_UP:
                if self._dialer.receive(conn, buf[:n], self._clock()):
                    self._progressed = True
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
            if n < _RECV_SIZE and not self._tls:
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

