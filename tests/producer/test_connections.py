"""A connection's record without its socket: deadlines, backoff, failing what it held and
the choice of the least loaded node, with times passed in."""

from __future__ import annotations

import pytest

from spark_sink.client.connections import (
    ClientResponse,
    Connection,
    ConnState,
    InFlight,
    Outgoing,
    least_loaded,
)
from spark_sink.client.errors import KafkaTimeoutError
from spark_sink.producer.config import ProducerConfig
from spark_sink.protocol.connection_setup import ConnectionSetup
from spark_sink.protocol.error_codes import KafkaConnectionError, KProdError
from spark_sink.protocol.framing import KafkaProtocol

CONFIG = ProducerConfig.from_dict({
    "bootstrap.servers": "h:1", "request.timeout.ms": 1000, "socket.connection.setup.timeout.ms": 300,
    "connections.max.idle.ms": 5000, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 400})


def _ready(node_id: int = 1, in_flight: int = 0) -> Connection:
    conn = Connection(node_id, "h", 1)
    conn.note_ready({0: 9}, now=0.0)
    for i in range(in_flight):
        conn.in_flight.append(InFlight(i, 0, 9, None, sent_ms=100.0 + i))
    return conn


def _expired(conn: Connection, now: float) -> tuple[KProdError, bool]:
    """What ``conn.expiry`` found past a deadline at ``now``."""
    expired = conn.expiry(now, CONFIG)
    assert expired is not None
    return expired


def test_a_request_unanswered_past_request_timeout_closes_the_connection() -> None:
    conn = _ready(in_flight=2)
    assert conn.next_deadline_ms(CONFIG) == 1100.0
    assert conn.expiry(1099.0, CONFIG) is None
    error, backoff = _expired(conn, 1100.0)
    assert isinstance(error, KafkaTimeoutError) and "request.timeout.ms" in str(error) and backoff


def test_an_acks0_write_stuck_in_the_outbox_times_out_like_a_request() -> None:
    conn = _ready()
    conn.outbox.append(Outgoing(memoryview(b"frame"), None, queued_ms=40.0))
    assert conn.oldest_request_ms() == 40.0
    assert isinstance(_expired(conn, 1040.0)[0], KafkaTimeoutError)


def test_a_bring_up_request_times_out_too() -> None:
    conn = Connection(1, "h", 1, state=ConnState.SETTING_UP)
    conn.setup = ConnectionSetup(KafkaProtocol())
    conn.setup.connected(now=7.0)  # ApiVersions sent at 7
    assert conn.oldest_request_ms() == 7.0 and conn.next_deadline_ms(CONFIG) == 1007.0


def test_connection_setup_timeout_and_idle_close() -> None:
    conn = Connection(1, "h", 1, state=ConnState.CONNECTING, connect_started_ms=10.0)
    assert conn.next_deadline_ms(CONFIG) == 310.0
    error, backoff = _expired(conn, 310.0)
    assert "socket.connection.setup.timeout.ms" in str(error) and backoff
    idle = _ready()
    assert idle.expiry(4999.0, CONFIG) is None
    error, backoff = _expired(idle, 5000.0)
    assert isinstance(error, KafkaConnectionError) and not backoff  # idle is no failure


def test_backoff_grows_with_jitter_up_to_the_cap_and_a_ready_connection_resets_it() -> None:
    conn = Connection(1, "h", 1)
    assert conn.may_connect(0.0)
    backoffs = []
    for attempt in range(6):
        conn.note_failure(now=1000.0 * attempt, config=CONFIG)
        backoffs.append(conn.backoff_ms)
        assert not conn.may_connect(1000.0 * attempt + conn.backoff_ms - 1)
        assert conn.connect_delay_ms(1000.0 * attempt) == pytest.approx(conn.backoff_ms)
    assert 40 <= backoffs[0] <= 60 and 80 <= backoffs[1] <= 120 and all(320 <= b <= 480 for b in backoffs[3:])
    conn.note_ready({}, now=9000.0)
    assert conn.failures == 0 and conn.backoff_ms == 0.0 and conn.connect_delay_ms(9000.0) == 0.0


def test_disconnected_fails_what_it_held_and_forgets_the_bring_up() -> None:
    conn = _ready(in_flight=1)
    got: list[ClientResponse[object]] = []
    conn.in_flight[0].callback = got.append
    written: ClientResponse[object] = ClientResponse(1, 0, 9, 5, None, None, 0.0)
    conn.outbox.append(Outgoing(memoryview(b"x"), (got.append, written), 150.0))
    error = KafkaConnectionError("gone")
    failed = conn.disconnected(error, now=200.0)
    for callback, response in failed:
        callback(response)
    assert [(r.correlation_id, r.error, r.request_latency_ms) for r in got] == [(0, error, 100.0), (5, error, 0.0)]
    assert conn.state is ConnState.DISCONNECTED and not conn.in_flight and not conn.outbox
    assert conn.versions == {} and conn.setup is None


def test_least_loaded_prefers_ready_brokers_with_fewest_in_flight() -> None:
    busy, idle = _ready(1, in_flight=3), _ready(2, in_flight=1)
    assert least_loaded([busy, idle], 0.0) == 2
    assert least_loaded([busy, idle, _ready(-1)], 0.0) == -1  # the load decides
    for _ in range(20):  # on a tie, a broker from metadata wins over a bootstrap entry
        assert least_loaded([_ready(-1), _ready(-2), _ready(4)], 0.0) == 4
    backing_off = Connection(3, "h", 1)
    backing_off.note_failure(0.0, CONFIG)
    assert least_loaded([backing_off], 1.0) is None  # nothing to try yet
    assert least_loaded([backing_off], 1000.0) == 3
