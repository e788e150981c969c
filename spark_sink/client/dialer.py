"""Dialer: brings a broker connection up, from a new socket to READY.

TCP (with the configured socket options), then TLS when the listener speaks it, then the
connection's setup (ApiVersions, SASL: the sans-IO machine of
:mod:`~spark_sink.protocol.connection_setup`, fed what the NetworkClient reads). It keeps
what the bring-ups taught: why each address last failed, the last authentication that
failed, and the cluster's transaction protocol from the brokers' finalized features. The
NetworkClient owns the selector and the sockets' reads and writes; the Dialer registers
the sockets it opens with that selector and asks the client to write what the setup sends.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import selectors
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from spark_sink.client import tls
from spark_sink.client.clock import Clock
from spark_sink.client.config import ClientConfig
from spark_sink.client.connections import Connection, ConnState, Outgoing
from spark_sink.client.errors import AuthenticationError, SaslAuthenticationError
from spark_sink.client.oauth import sasl_exchanges
from spark_sink.protocol.apis import transaction_version
from spark_sink.protocol.connection_setup import ConnectionSetup, Failed, Output, Ready, Send
from spark_sink.protocol.error_codes import KafkaConnectionError, KProdError
from spark_sink.protocol.framing import KafkaProtocol

# The logger users know from the README's troubleshooting (a wrong address shows here).
log = logging.getLogger("spark_sink.client.network")

# What a name resolves to: (family, type, proto, canonname, sockaddr) tuples, as
# socket.getaddrinfo(host, port, 0, SOCK_STREAM) gives them.
AddressInfo = tuple[Any, ...]
Resolve = Callable[[str, int], Sequence[AddressInfo]]


def resolve(host: str, port: int) -> Sequence[AddressInfo]:
    """Every TCP address of ``host``, in the order the system's resolver prefers."""
    return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)


class Dialer:
    """Brings the NetworkClient's connections up and remembers how that went."""

    def __init__(self, config: ClientConfig, selector: selectors.BaseSelector,
                 write: Callable[[Connection], None], clock: Clock, resolver: Resolve = resolve) -> None:
        self._config = config
        self._resolve = resolver
        # Each host:port's resolved addresses and the next one to try. Every attempt takes
        # the next, and a name is resolved again once all were tried: Java's
        # client.dns.lookup=use_all_dns_ips, so that a name whose first address refuses
        # (localhost as ::1 before 127.0.0.1, a DNS name of several brokers' IPs) still
        # connects, and a name whose addresses changed is looked up again.
        self._addresses: dict[tuple[str, int], tuple[Sequence[AddressInfo], int]] = {}
        self._selector = selector
        self._write = write  # the NetworkClient's: queued setup requests go out with its I/O
        self._clock = clock
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
        # The transaction protocol the cluster speaks with kprod (messages.transaction_version),
        # from the connection whose finalized features are the newest (the highest features
        # epoch, as Java's ApiVersions keeps them): 2 where transaction.version is 2 or more.
        self.transaction_version = 0
        self._features_epoch = -2  # below any broker's (-1: a broker that finalizes no feature)

    @property
    def uses_tls(self) -> bool:
        return self._ssl is not None

    @property
    def features_known(self) -> bool:
        """A broker has told its finalized features (``transaction_version`` is its word)."""
        return self._features_epoch > -2

    def connect(self, conn: Connection, now: float) -> None:
        """Open a socket to ``conn``'s address and start connecting, without blocking."""
        log.debug("connecting to node %s at %s:%s", conn.node_id, conn.host, conn.port)
        try:
            family, _, _, _, address = self._next_address(conn.host, conn.port)
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

    def _next_address(self, host: str, port: int) -> AddressInfo:
        """The address of ``host:port`` to try now (resolving it when all were tried)."""
        infos, index = self._addresses.get((host, port), ((), 0))
        if index >= len(infos):
            infos, index = self._resolve(host, port), 0
            if not infos:
                raise socket.gaierror(socket.EAI_NONAME, "no address")
        self._addresses[(host, port)] = (infos, index + 1)
        return infos[index]

    def _keep_address(self, host: str, port: int) -> None:
        """The address just tried works: try it first again when the connection breaks."""
        infos, index = self._addresses.get((host, port), ((), 0))
        if index > 0:
            self._addresses[(host, port)] = (infos, index - 1)

    def advance(self, conn: Connection) -> None:
        """The socket of a CONNECTING or HANDSHAKING connection is ready: take the next step."""
        if conn.state is ConnState.HANDSHAKING:
            self._handshake(conn)
            return
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

    def receive(self, conn: Connection, data: memoryview, now: float) -> bool:
        """Feed what a SETTING_UP connection read to its setup; True once it is READY."""
        return self._follow(conn, conn.bring_up().receive_data(data, now), now)

    def read_failed(self, conn: Connection, exc: OSError) -> KProdError:
        """The error for a read that failed before the connection was READY."""
        if tls.is_alert(exc):
            # With TLS 1.3 the client's side of the handshake ends before the broker has
            # checked the client's certificate: a refusal arrives as an alert on the first read.
            return self._tls_failed(conn, exc)
        return KafkaConnectionError(f"read from node {conn.node_id} failed: {exc}")

    def failed(self, conn: Connection, cause: str) -> None:
        """Remember why the connection to an address could not be brought up; the first
        failure is a warning (a wrong address or security.protocol shows at once), the
        retries that follow are not."""
        address = f"{conn.host}:{conn.port}"
        self.connect_failures[address] = cause
        level = logging.INFO if address in self._warned else logging.WARNING
        self._warned.add(address)
        log.log(level, "cannot connect to %s (node %s): %s", address, conn.node_id, cause)

    def describe(self, conns: Iterable[Connection]) -> str:
        """Each connection's address with what happened when it was last tried:
        ``127.0.0.1:1: connection refused; ...``."""
        parts = []
        for conn in conns:
            address = f"{conn.host}:{conn.port}"
            cause = self.connect_failures.get(address)
            if cause is None:
                cause = {ConnState.READY: "connected, but no metadata came back",
                         ConnState.DISCONNECTED: "not tried yet"}.get(conn.state, "still connecting")
            parts.append(f"{address}: {cause}")
        return "; ".join(parts)

    def _fail_connect(self, conn: Connection, cause: str, now: float) -> None:
        conn.state = ConnState.DISCONNECTED
        conn.note_failure(now, self._config)
        self.failed(conn, cause)

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

    def _follow(self, conn: Connection, outputs: list[Output], now: float) -> bool:
        """Do what the connection's setup, fed at ``now``, says; True if it became READY."""
        ready = False
        for output in outputs:
            if type(output) is Send:
                conn.outbox.append(Outgoing(memoryview(output.data), None, now))
                self._write(conn)
            elif type(output) is Ready:
                conn.note_ready(output.versions, now)
                if output.features_epoch > self._features_epoch:
                    self._features_epoch = output.features_epoch
                    self.transaction_version = transaction_version(output.features, output.versions)
                ready = True
                self.authentication_error = None
                self._keep_address(conn.host, conn.port)
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
        return ready


def _errno_text(err: int) -> str:
    """A connect() error in words: ``connection refused`` (ECONNREFUSED)."""
    text = os.strerror(err)
    return f"{text[:1].lower()}{text[1:]} ({errno.errorcode.get(err, err)})"
