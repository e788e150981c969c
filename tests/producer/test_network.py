"""NetworkClient against real brokers: handshake, pipelining, timeouts, refused connections."""

import threading
import time

from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.errors import KafkaTimeoutError
from spark_sink.producer.network import NetworkClient, now_ms
from spark_sink.protocol.errors import KafkaConnectionError
from spark_sink.protocol.messages import ApiKey
from tests.brokers import free_port, start_tansu
from tests.faultproxy import FaultProxy


def _client(bootstrap, **extra):
    return NetworkClient(ProducerConfig.from_dict({"bootstrap.servers": bootstrap, **extra}))


def _poll_until(client, predicate, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        client.poll(50)


def _ready_node(client):
    node = client.bootstrap_nodes()[0]
    _poll_until(client, lambda: client.ready(node, now_ms()))
    return node


def test_handshake_and_pipelined_metadata(broker):
    client = _client(broker.bootstrap, **{"max.in.flight.requests.per.connection": 3})
    try:
        node = _ready_node(client)
        assert client.api_version(node, ApiKey.PRODUCE) >= 3
        responses = []
        sent = 0
        while len(responses) < 10:
            while sent < 10 and client.ready(node, now_ms()):
                client.send(node, ApiKey.METADATA, {"topics": None}, responses.append)
                sent += 1
                assert client.in_flight_count(node) <= 3
            client.poll(100)
        assert all(r.error is None and r.body["brokers"] for r in responses)
        assert [r.correlation_id for r in responses] == sorted(r.correlation_id for r in responses)
    finally:
        client.close()


def test_stalled_broker_times_out_then_reconnects():
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy, start_tansu(port=port, advertised_port=proxy.port) as b:
        client = _client(b.bootstrap, **{"request.timeout.ms": 500, "delivery.timeout.ms": 2000, "linger.ms": 0})
        try:
            node = _ready_node(client)
            proxy.stall(True)
            got = []
            client.send(node, ApiKey.METADATA, {"topics": None}, got.append)
            _poll_until(client, lambda: got, timeout_s=10)
            assert isinstance(got[0].error, KafkaTimeoutError)
            assert "request.timeout.ms" in str(got[0].error)
            proxy.stall(False)
            node = _ready_node(client)
            client.send(node, ApiKey.METADATA, {"topics": None}, got.append)
            _poll_until(client, lambda: len(got) == 2)
            assert got[1].error is None
        finally:
            client.close()


def test_refused_connection_backs_off():
    client = _client(f"127.0.0.1:{free_port()}", **{"reconnect.backoff.ms": 200})
    try:
        node = client.bootstrap_nodes()[0]
        _poll_until(client, lambda: (client.ready(node, now_ms()), client.connection_failed(node))[1])
        assert client.connection_delay_ms(node, now_ms()) > 0
    finally:
        client.close()


def test_wakeup_interrupts_poll(tansu):
    client = _client(tansu.bootstrap)
    try:
        threading.Timer(0.1, client.wakeup).start()
        started = time.monotonic()
        client.poll(20000)
        assert time.monotonic() - started < 10
    finally:
        client.close()


def test_close_fails_requests_in_flight(tansu):
    client = _client(tansu.bootstrap)
    node = _ready_node(client)
    got = []
    client.send(node, ApiKey.METADATA, {"topics": None}, got.append)
    client.close()
    assert isinstance(got[0].error, KafkaConnectionError)
