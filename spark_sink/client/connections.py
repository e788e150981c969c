"""What the NetworkClient knows of each broker connection, apart from its socket I/O:
where it stands, the reconnect backoff, the frames waiting to be written, the requests
awaiting answers, and which deadline it has passed. As Java's ClusterConnectionStates and
InFlightRequests: times are passed in, and nothing here touches a socket.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Generic, TypeVar

from spark_sink.client.config import ClientConfig
from spark_sink.client.errors import KafkaTimeoutError
from spark_sink.protocol.connection_setup import ConnectionSetup
from spark_sink.protocol.error_codes import KafkaConnectionError, KProdError
from spark_sink.protocol.framing import KafkaProtocol

if TYPE_CHECKING:
    import socket


Reply = TypeVar("Reply", covariant=True)


@dataclass(frozen=True, slots=True)
class ClientResponse(Generic[Reply]):
    """The outcome of one request: its decoded reply, or the error that prevented it."""

    node_id: int
    api_key: int
    api_version: int
    correlation_id: int
    # The reply, of the class its request names (kmsg's ``Request[Reply]``); None when
    # ``error`` is set, and for a Produce with acks=0 (nothing comes back).
    body: Reply | None
    error: Exception | None
    request_latency_ms: float

    def reply(self) -> Reply:
        """The reply; raises the error that prevented it."""
        if self.error is not None:
            raise self.error
        if self.body is None:
            raise KafkaConnectionError(f"request {self.correlation_id} to node {self.node_id} expected no reply")
        return self.body


# What a request's outcome is handed to, as kept while it is in flight: each is given the
# reply of its own request's class, which NetworkClient.send pairs with it.
Callback = Callable[[ClientResponse[object]], None]


class ConnState(Enum):
    """Where a connection stands, as the NetworkClient drives it."""

    DISCONNECTED = 0
    CONNECTING = 1  # TCP
    HANDSHAKING = 2  # TLS
    SETTING_UP = 3  # ApiVersions and SASL: the connection's ConnectionSetup
    READY = 4


@dataclass(slots=True)
class InFlight:
    """A request written (or being written) that awaits its response."""

    correlation_id: int
    api_key: int
    api_version: int
    callback: Callback | None
    sent_ms: float


class Outgoing:
    """One buffer of a frame waiting to be written. The last buffer of a request that
    expects no response (Produce with acks=0) carries ``on_written``, the (callback,
    response) run once the frame is out; ``queued_ms`` lets a write stuck behind a stalled
    socket time out like a request in flight."""

    __slots__ = ("data", "on_written", "queued_ms")

    def __init__(self, data: memoryview, on_written: tuple[Callback, ClientResponse[object]] | None,
                 queued_ms: float) -> None:
        self.data = data
        self.on_written = on_written
        self.queued_ms = queued_ms


@dataclass(slots=True)
class Connection:
    """One broker connection: its socket and protocol objects (used by the NetworkClient and
    its Dialer alone) and its state."""

    node_id: int
    host: str
    port: int
    state: ConnState = ConnState.DISCONNECTED
    sock: socket.socket | None = None
    protocol: KafkaProtocol | None = None
    setup: ConnectionSetup | None = None  # from SETTING_UP on: bring-up and session renewal
    versions: dict[int, int] = field(default_factory=dict)
    outbox: deque[Outgoing] = field(default_factory=deque)
    in_flight: deque[InFlight] = field(default_factory=deque)
    connect_started_ms: float = 0.0
    last_used_ms: float = 0.0
    last_failure_ms: float = -1e18
    failures: int = 0
    backoff_ms: float = 0.0
    writing: bool = False  # the socket is watched for writability

    def transport(self) -> tuple[socket.socket, KafkaProtocol]:
        """The socket and protocol of a connection that has them (CONNECTING and after)."""
        if self.sock is None or self.protocol is None:
            raise KafkaConnectionError(f"the connection to node {self.node_id} is not open ({self.state.name})")
        return self.sock, self.protocol

    def bring_up(self) -> ConnectionSetup:
        """The connection's bring-up machine (SETTING_UP and after)."""
        if self.setup is None:
            raise KafkaConnectionError(f"the connection to node {self.node_id} has no bring-up ({self.state.name})")
        return self.setup

    def may_connect(self, now: float) -> bool:
        """Disconnected, and the reconnect backoff has passed."""
        return self.state is ConnState.DISCONNECTED and now - self.last_failure_ms >= self.backoff_ms

    def connect_delay_ms(self, now: float) -> float:
        """How long until a new attempt may start (0 if now, or if not disconnected)."""
        if self.state is not ConnState.DISCONNECTED:
            return 0.0
        return max(0.0, self.last_failure_ms + self.backoff_ms - now)

    def note_failure(self, now: float, config: ClientConfig) -> None:
        """An attempt failed or a connection broke: back off exponentially from
        reconnect.backoff.ms up to reconnect.backoff.max.ms."""
        self.failures += 1
        self.last_failure_ms = now
        base, cap = config.reconnect_backoff_ms, config.reconnect_backoff_max_ms
        exp = min(cap, base * (2 ** min(self.failures - 1, 20)))
        self.backoff_ms = exp * random.uniform(0.8, 1.2)  # jitter keeps clients from reconnecting in lockstep

    def note_ready(self, versions: dict[int, int], now: float) -> None:
        """The bring-up is done: requests may go, and the backoff starts afresh."""
        self.state = ConnState.READY
        self.versions = versions
        self.last_used_ms = now
        self.failures = 0
        self.backoff_ms = 0.0

    def disconnected(self, error: Exception, now: float) -> list[tuple[Callback, ClientResponse[object]]]:
        """The connection is gone: its bring-up and versions are forgotten, and each request
        queued or awaiting an answer is returned with its callback and ``error``."""
        self.state = ConnState.DISCONNECTED
        self.writing = False
        self.versions = {}
        self.setup = None
        failed: list[tuple[Callback, ClientResponse[object]]] = [
            (e.callback, ClientResponse(self.node_id, e.api_key, e.api_version, e.correlation_id, None, error,
                                        now - e.sent_ms))
            for e in self.in_flight if e.callback is not None]
        for entry in self.outbox:
            if entry.on_written is not None:
                callback, done = entry.on_written
                failed.append((callback, dataclasses.replace(done, error=error)))
        self.in_flight.clear()
        self.outbox.clear()
        return failed

    def oldest_request_ms(self) -> float | None:
        """When the oldest request still unanswered (or, for acks=0, unwritten) was queued,
        bring-up requests included; None if there is none."""
        oldest: float | None = None
        if self.in_flight:
            oldest = self.in_flight[0].sent_ms
        elif self.state is ConnState.SETTING_UP and self.setup is not None:
            oldest = self.setup.request_sent_ms
        if self.outbox and (oldest is None or self.outbox[0].queued_ms < oldest):
            oldest = self.outbox[0].queued_ms  # an acks=0 write stuck behind a full socket
        return oldest

    def next_deadline_ms(self, config: ClientConfig) -> float:
        """When the nearest request or connection-setup timeout falls (inf: none)."""
        nearest = float("inf")
        oldest = self.oldest_request_ms()
        if oldest is not None:
            nearest = oldest + config.request_timeout_ms
        if self.state is ConnState.CONNECTING or self.state is ConnState.HANDSHAKING:
            nearest = min(nearest, self.connect_started_ms + config.socket_connection_setup_timeout_ms)
        return nearest

    def expiry(self, now: float, config: ClientConfig) -> tuple[KProdError, bool] | None:
        """Why the connection must close now, and whether that counts as a failure (backs
        off), or None."""
        state = self.state
        if state is ConnState.DISCONNECTED:
            return None
        oldest = self.oldest_request_ms()
        if oldest is not None and now - oldest >= config.request_timeout_ms:
            # As in Java: a request that timed out leaves the connection in an unknown
            # state, so everything in flight on it fails and it is closed.
            return KafkaTimeoutError(f"request to node {self.node_id} at {self.host}:{self.port} timed out "
                                     f"after {config.request_timeout_ms} ms (request.timeout.ms)"), True
        setup_timeout = config.socket_connection_setup_timeout_ms
        if (state is ConnState.CONNECTING or state is ConnState.HANDSHAKING) and \
                now - self.connect_started_ms >= setup_timeout:
            return KafkaConnectionError(f"timed out: no connection within {setup_timeout} ms "
                                        "(socket.connection.setup.timeout.ms)"), True
        max_idle = config.connections_max_idle_ms
        if state is ConnState.READY and oldest is None and max_idle > 0 and now - self.last_used_ms >= max_idle:
            # connections.max.idle.ms: the broker would close it anyway; closing it
            # ourselves avoids a request racing that close. No backoff: it did not fail.
            return KafkaConnectionError("idle connection closed"), False
        return None


def least_loaded(conns: Iterable[Connection], now: float) -> int | None:
    """A ready node with the fewest requests in flight, else one that is connecting or may
    connect now; brokers from metadata are preferred over bootstrap entries, and ties are
    broken at random."""
    best, best_load = None, None
    fallback = None
    for conn in sorted(conns, key=lambda c: (c.node_id < 0, random.random())):
        if conn.state is ConnState.READY:
            load = len(conn.in_flight)
            if best_load is None or load < best_load:
                best, best_load = conn.node_id, load
        elif fallback is None and (conn.state is not ConnState.DISCONNECTED or conn.may_connect(now)):
            fallback = conn.node_id
    return best if best is not None else fallback
