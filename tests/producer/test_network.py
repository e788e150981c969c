"""NetworkClient against real brokers: handshake, pipelining, timeouts, refused connections."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from kprod_broker import KafkaCluster
from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.connections import ClientResponse
from spark_sink.client.dialer import Resolve
from spark_sink.client.errors import KafkaTimeoutError
from spark_sink.client.network import NetworkClient
from spark_sink.producer.config import ProducerConfig
from spark_sink.protocol import kmsg
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import KafkaConnectionError
from spark_sink.protocol.records import Record, build_record_batch
from spark_sink.protocol.schema import Request
from tests.brokers import consume_all, create_topic, free_port, unique_topic
from tests.clock import MovedClock
from tests.faultproxy import FaultProxy

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka


Reply = TypeVar("Reply")
# A poll bound far past pytest's 300 s timeout: a poll that waits it out hangs the test.
_HOUR_MS = 3_600_000

def _client(bootstrap: str, clock: Clock = now_ms, /, **extra: object) -> NetworkClient:
    config = ProducerConfig.from_dict({"bootstrap.servers": bootstrap, **extra})
    return NetworkClient(config, config.max_in_flight_requests_per_connection, clock=clock)


def _poll_until(client: NetworkClient, predicate: Callable[[], object], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        client.poll(50)


def _ready_node(client: NetworkClient, clock: Clock = now_ms) -> int:
    node = client.bootstrap_nodes()[0]
    _poll_until(client, lambda: client.ready(node, clock()))
    return node


def _request(client: NetworkClient, node: int, api_key: int, body: Request[Reply]) -> Reply:
    got: list[ClientResponse[Reply]] = []
    client.send(node, api_key, body, got.append)
    _poll_until(client, lambda: got)
    assert got[0].error is None, got[0].error
    return got[0].reply()


def _failed_times(client: NetworkClient, node: int, attempts: int) -> bool:
    """Whether ``node``'s connection has failed ``attempts`` times (asking if it is ready
    is what tries it again)."""
    client.ready(node, now_ms())
    return client._conns[node].failures >= attempts


def _leader_of(client: NetworkClient, topic: str, partition: int = 0) -> int:
    """Ask metadata for ``topic``, hand its brokers to the client, return the leader's id."""
    node = _ready_node(client)
    body = _request(client, node, ApiKey.METADATA, kmsg.MetadataRequest(
        topics=[kmsg.MetadataRequestTopic(name=topic)], allow_auto_topic_creation=False))
    client.set_nodes({b.node_id: (b.host, b.port) for b in body.brokers})
    (meta,) = body.topics
    return next(p.leader_id for p in meta.partitions if p.partition_index == partition)


def _produce_body(topic: str, values: list[bytes], acks: int) -> kmsg.ProduceRequest:
    batch = build_record_batch([Record(None, v, int(time.time() * 1000)) for v in values])
    return kmsg.ProduceRequest(transactional_id=None, acks=acks, timeout_ms=10000,
                               topic_data=[kmsg.TopicProduceData(topic, [kmsg.PartitionProduceData(0, batch)])])


def test_handshake_and_pipelined_metadata(broker: KafkaCluster) -> None:
    client = _client(broker.bootstrap, **{"max.in.flight.requests.per.connection": 3})
    try:
        node = _ready_node(client)
        assert (client.api_version(node, ApiKey.PRODUCE) or 0) >= 3
        assert (client.api_version(node, ApiKey.METADATA) or 0) >= 1
        responses: list[ClientResponse[kmsg.MetadataResponse]] = []
        sent = 0
        saw_limit = False
        while len(responses) < 10:
            while sent < 10 and client.ready(node, now_ms()):
                client.send(node, ApiKey.METADATA, kmsg.MetadataRequest(topics=None), responses.append)
                sent += 1
                assert client.in_flight_count(node) <= 3
            if client.in_flight_count(node) == 3:
                # The limit, not the broker, is what stops us: ready() says no until a
                # response frees a slot.
                assert not client.ready(node, now_ms())
                saw_limit = True
            client.poll(100)
        assert saw_limit
        assert all(r.error is None and r.reply().brokers for r in responses)
        assert [r.correlation_id for r in responses] == sorted(r.correlation_id for r in responses)
    finally:
        client.close()


def test_poll_reports_a_ready_connection_and_a_completed_request(kafka: KafkaCluster) -> None:
    """The Sender acts again at once when poll() says something changed, instead of
    sleeping out a wait computed before it (that cost a new producer 20-70 ms)."""
    client = _client(kafka.bootstrap)
    try:
        node = client.bootstrap_nodes()[0]
        progressed = []
        while not client.ready(node, now_ms()):
            progressed.append(client.poll(50))
        assert progressed[-1] is True and not any(progressed[:-1])  # only the poll that made it ready
        assert client.poll(0) is False  # nothing happened
        got: list[ClientResponse[kmsg.MetadataResponse]] = []
        client.send(node, ApiKey.METADATA, kmsg.MetadataRequest(topics=None), got.append)
        while not got:
            assert client.poll(50) is bool(got)
        assert client.poll(0) is False
    finally:
        client.close()


def test_stalled_broker_times_out_then_reconnects(kafka_proxy: ProxiedKafka) -> None:
    """request.timeout.ms is measured on the client's clock: moved past it, a request the
    stalled broker holds fails at the next poll."""
    proxy, b = kafka_proxy.proxy, kafka_proxy
    clock = MovedClock()
    client = _client(b.bootstrap, clock, **{"request.timeout.ms": 30_000})
    try:
        node = _ready_node(client, clock)
        proxy.stall(True)
        got: list[ClientResponse[kmsg.MetadataResponse]] = []
        client.send(node, ApiKey.METADATA, kmsg.MetadataRequest(topics=None), got.append)
        client.poll(0)
        assert not got  # not before its time
        clock.advance(30_000)
        _poll_until(client, lambda: got, timeout_s=10)
        assert isinstance(got[0].error, KafkaTimeoutError)
        assert "request.timeout.ms" in str(got[0].error)
        proxy.stall(False)
        node = _ready_node(client, clock)
        client.send(node, ApiKey.METADATA, kmsg.MetadataRequest(topics=None), got.append)
        _poll_until(client, lambda: len(got) == 2)
        assert got[1].error is None
    finally:
        client.close()


def test_refused_connection_backs_off() -> None:
    client = _client(f"127.0.0.1:{free_port()}", **{"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 300})
    try:
        node = client.bootstrap_nodes()[0]
        conn = client._conns[node]
        backoffs = []
        for attempt in range(1, 6):
            _poll_until(client, partial(_failed_times, client, node, attempt))
            assert client.connection_failed(node) and not client.is_connected(node)
            assert client.connection_delay_ms(node, now_ms()) <= conn.backoff_ms
            backoffs.append(conn.backoff_ms)
        # Exponential (with +-20% jitter) from reconnect.backoff.ms, capped at the max.
        assert 40 <= backoffs[0] <= 60 and backoffs[0] < backoffs[1] < backoffs[2]
        assert all(b <= 300 * 1.2 for b in backoffs) and backoffs[4] >= 300 * 0.8
        assert client.least_loaded_node(now_ms()) in (None, node)
    finally:
        client.close()


def _resolving_to(*addresses: tuple[str, int]) -> tuple[list[str], Resolve]:
    """A resolver that gives every name ``addresses``, and the list of names it was asked."""
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[tuple[Any, ...]]:
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", a) for a in addresses]
    return asked, resolver


def test_a_name_whose_first_address_refuses_connects_to_the_next(kafka: KafkaCluster) -> None:
    """As Java's client.dns.lookup=use_all_dns_ips: localhost as ::1 then 127.0.0.1, or a
    DNS name of several brokers, where the first address refuses. The address that
    answered is tried first again when its connection breaks."""
    host, port = kafka.bootstrap.rsplit(":", 1)
    with FaultProxy(host, int(port)) as proxy:
        asked, resolver = _resolving_to(("127.0.0.1", free_port()), ("127.0.0.1", proxy.port))
        config = ProducerConfig.from_dict({"bootstrap.servers": "brokers.example:9092", "reconnect.backoff.ms": 10})
        client = NetworkClient(config, resolver=resolver)
        try:
            node = _ready_node(client)
            assert asked == ["brokers.example"] and client._conns[node].failures == 0
            assert proxy.cut_all() == 1
            _poll_until(client, lambda: not client.is_connected(node))
            _poll_until(client, lambda: client.ready(node, now_ms()))
            assert asked == ["brokers.example"], "the working address was not tried first again"
        finally:
            client.close()


def test_every_address_is_tried_before_the_name_is_resolved_again() -> None:
    asked, resolver = _resolving_to(("127.0.0.1", free_port()), ("127.0.0.1", free_port()))
    config = ProducerConfig.from_dict({"bootstrap.servers": "brokers.example:9092", "reconnect.backoff.ms": 10,
                                       "reconnect.backoff.max.ms": 20})
    client = NetworkClient(config, resolver=resolver)
    try:
        node = client.bootstrap_nodes()[0]
        for attempt, resolved in [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3)]:
            _poll_until(client, partial(_failed_times, client, node, attempt))
            assert len(asked) == resolved, (attempt, asked)
        assert client.connect_failures["brokers.example:9092"].startswith("connection refused")
    finally:
        client.close()


def test_wakeup_interrupts_poll(kafka: KafkaCluster) -> None:
    client = _client(kafka.bootstrap)
    try:
        threading.Timer(0.1, client.wakeup).start()
        # Nothing else can end this poll: no connection, an hour's wait (a wakeup lost is
        # a hang pytest-timeout fails); True says the wakeup is what ended it.
        assert client.poll(_HOUR_MS) is True
    finally:
        client.close()


def test_close_fails_requests_in_flight(kafka: KafkaCluster) -> None:
    client = _client(kafka.bootstrap)
    node = _ready_node(client)
    got: list[ClientResponse[kmsg.MetadataResponse]] = []
    client.send(node, ApiKey.METADATA, kmsg.MetadataRequest(topics=None), got.append)
    client.close()
    assert isinstance(got[0].error, KafkaConnectionError)


def test_metadata_nodes_replace_bootstrap_and_produce_is_answered(broker: KafkaCluster) -> None:
    """Brokers learnt from metadata get positive ids and their own connections; a Produce
    request too large for one write (tiny send buffer) is written across polls, pipelined
    behind others, and each is answered."""
    topic = create_topic(broker.bootstrap, unique_topic("net"), partitions=1)
    client = _client(broker.bootstrap, **{"send.buffer.bytes": 4096, "max.in.flight.requests.per.connection": 5})
    try:
        leader = _leader_of(client, topic)
        assert leader >= 0
        _poll_until(client, lambda: client.ready(leader, now_ms()))
        assert (client.least_loaded_node(now_ms()) or -1) >= 0
        value = bytes(range(256)) * 2048  # 512 KiB per record
        got: list[ClientResponse[kmsg.ProduceResponse]] = []
        for i in range(3):
            client.send(leader, ApiKey.PRODUCE, _produce_body(topic, [value, b"%d" % i], acks=1), got.append)
        assert client.in_flight_count(leader) == 3
        # 1.5 MiB cannot leave through a 4 KiB socket buffer at once: until the last
        # request is fully written the node takes no more (Java's canSendMore).
        assert not client.ready(leader, now_ms())
        _poll_until(client, lambda: len(got) == 3, timeout_s=60)
        for response in got:
            assert response.error is None, response.error
            (part,) = response.reply().responses[0].partition_responses
            assert part.error_code == 0, part
        assert [r.correlation_id for r in got] == sorted(r.correlation_id for r in got)
        messages = consume_all(broker.bootstrap, topic, 6)
        assert sorted(m.value() for m in messages if len(m.value()) < 10) == [b"0", b"1", b"2"]
        assert all(m.value() == value for m in messages if len(m.value()) >= 10)
    finally:
        client.close()


def test_acks0_produce_calls_back_once_written(broker: KafkaCluster) -> None:
    """The callback of an acks=0 Produce fires once the frame is written. Kafka (and the
    mock) never answer one; Tansu does, and that answer must neither break the connection
    nor be taken for the answer to a later request."""
    topic = create_topic(broker.bootstrap, unique_topic("net0"), partitions=1)
    client = _client(broker.bootstrap, acks=0)
    try:
        leader = _leader_of(client, topic)
        _poll_until(client, lambda: client.ready(leader, now_ms()))
        got: list[ClientResponse[kmsg.ProduceResponse]] = []
        for round_ in range(3):
            for i in range(5):
                client.send(leader, ApiKey.PRODUCE, _produce_body(topic, [b"v%d-%d" % (round_, i)], acks=0),
                            got.append, expect_response=False)
            assert client.in_flight_count(leader) == 0  # nothing waits for an answer
            # A request that is answered, queued behind the unanswered ones.
            assert _request(client, leader, ApiKey.METADATA, kmsg.MetadataRequest(topics=None)).brokers
        _poll_until(client, lambda: len(got) == 15)
        assert all(r.error is None and r.body is None for r in got)
        for _ in range(5):
            client.poll(20)
        assert client.is_connected(leader)
        values = sorted(m.value() for m in consume_all(broker.bootstrap, topic, 15, settle=0.5))
        assert values == sorted(b"v%d-%d" % (r, i) for r in range(3) for i in range(5))
    finally:
        client.close()


def test_connection_setup_timeout() -> None:
    """A listener whose accept queue is full never completes our handshake: the attempt is
    abandoned after socket.connection.setup.timeout.ms and counts as a failure."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers = []
    try:
        for _ in range(4):  # fill the accept queue so further SYNs are dropped
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(listener.getsockname())
            fillers.append(s)
        time.sleep(0.2)
        host, port = listener.getsockname()
        clock = MovedClock()
        client = _client(f"{host}:{port}", clock, **{"socket.connection.setup.timeout.ms": 30_000})
        try:
            node = client.bootstrap_nodes()[0]
            assert not client.ready(node, clock())
            client.poll(0)
            assert not client.connection_failed(node)  # not before its time
            clock.advance(30_000)
            _poll_until(client, lambda: client.connection_failed(node), timeout_s=20)
            assert not client.is_connected(node)
        finally:
            client.close()
    finally:
        for s in fillers:
            s.close()
        listener.close()


def test_repeated_wakeups_keep_interrupting(kafka: KafkaCluster) -> None:
    """Every wakeup() from another thread ends the current poll, not only the first."""
    client = _client(kafka.bootstrap)
    try:
        for _ in range(3):
            for _ in range(5):
                client.wakeup()  # coalesced: one byte at most
            client.poll(0)
            threading.Timer(0.05, client.wakeup).start()
            assert client.poll(_HOUR_MS) is True  # woken, not timed out (a lost wakeup hangs)
    finally:
        client.close()


def test_poll_that_consumes_a_wakeup_reports_progress(kafka: KafkaCluster) -> None:
    """A poll(0) that drains a wakeup() returns True, so a caller that decided before the
    poll (the Sender checking for close) looks again instead of sleeping through the
    wakeup: close() used to wait out the Sender's 100 ms idle wait that way."""
    client = _client(kafka.bootstrap)
    try:
        client.poll(0)
        assert client.poll(0) is False
        client.wakeup()
        assert client.poll(0) is True
        assert client.poll(0) is False  # drained: the next poll has nothing new
    finally:
        client.close()


def test_stuck_acks0_write_times_out_and_close_fails_the_rest(kafka_proxy: ProxiedKafka) -> None:
    """acks=0 requests get no response, so only their write can time out: a frame stuck
    behind a stalled peer fails with KafkaTimeoutError; close() fails what is still queued."""
    proxy, b = kafka_proxy.proxy, kafka_proxy
    clock = MovedClock()
    client = _client(b.bootstrap, clock, **{"request.timeout.ms": 30_000, "send.buffer.bytes": 4096})
    try:
        # More than loopback buffers and the stalled proxy can absorb.
        big = kmsg.ProduceRequest(transactional_id=None, acks=0, timeout_ms=1000, topic_data=[
            kmsg.TopicProduceData("x", [kmsg.PartitionProduceData(0, build_record_batch(
                [Record(None, b"\0" * (32 << 20), 0)]))])])
        node = _ready_node(client, clock)
        proxy.stall(True)
        got: list[ClientResponse[kmsg.ProduceResponse]] = []
        client.send(node, ApiKey.PRODUCE, big, got.append, expect_response=False)
        client.poll(0)
        assert not got
        clock.advance(30_000)
        _poll_until(client, lambda: got, timeout_s=20)
        assert isinstance(got[0].error, KafkaTimeoutError)
        assert not client.is_connected(node)
        proxy.stall(False)
        _poll_until(client, lambda: client.ready(node, clock()), timeout_s=20)
        proxy.stall(True)
        client.send(node, ApiKey.PRODUCE, big, got.append, expect_response=False)
        client.poll(0)
    finally:
        client.close()
    assert len(got) == 2 and isinstance(got[1].error, KafkaConnectionError)
    assert "closed" in str(got[1].error)


def test_poll_that_finishes_writing_a_request_reports_progress(kafka_proxy: ProxiedKafka) -> None:
    """A request too large for one write keeps its node busy; the poll that writes its
    rest says so (the Sender waits on the selector, not a timer, for a busy node: only
    this poll can tell it the node takes the next request before the answer comes)."""
    proxy = kafka_proxy.proxy
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("net-written"), partitions=1)
    client = _client(kafka_proxy.bootstrap, **{"send.buffer.bytes": 4096, "max.in.flight.requests.per.connection": 5})
    try:
        leader = _leader_of(client, topic)
        _poll_until(client, lambda: client.ready(leader, now_ms()))
        proxy.set_delay(1000, replies_only=True)  # the answer comes well after the write ends
        got: list[ClientResponse[kmsg.ProduceResponse]] = []
        client.send(leader, ApiKey.PRODUCE, _produce_body(topic, [bytes(range(256)) * 2048], acks=1), got.append)
        assert not client.ready(leader, now_ms())  # 512 KiB through a 4 KiB send buffer
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "the request was never written whole"
            progressed = client.poll(50)
            if client.ready(leader, now_ms()):
                break
        assert client.in_flight_count(leader) == 1 and not got  # written, not yet answered
        assert progressed
        _poll_until(client, lambda: got, timeout_s=30)
        assert got[0].error is None, got[0].error
    finally:
        client.close()
