"""What the fault and failover tests share: leader bounces on the three-node cluster (the
``kafka3`` fixture), as Kafka's own system tests do them (SIGKILL the leader of a
partition mid-run, restart it once another node leads, wait until every replica is back
in sync), and the bookkeeping of deliveries they check."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Sequence

from confluent_kafka import Message
from confluent_kafka.admin import AdminClient

from kprod_broker import KafkaCluster
from spark_sink.producer import ArrowSendResult, RecordMetadata

# Retries must outlast an election: a killed node is fenced after broker.session.timeout.ms (3 s).
FAILOVER_CONFIG = {"linger.ms": 2, "request.timeout.ms": 5000, "delivery.timeout.ms": 120000,
                   "retry.backoff.ms": 50, "retry.backoff.max.ms": 500, "reconnect.backoff.ms": 20,
                   "reconnect.backoff.max.ms": 500}


def wait_in_sync(cluster: KafkaCluster, topic: str, timeout: float = 90.0) -> None:
    """Until every partition of ``topic`` has a leader and all its replicas in sync."""
    deadline = time.monotonic() + timeout
    # One client for the whole wait: a new one per poll costs the nodes a connection and
    # its handshake each time.
    admin = AdminClient({"bootstrap.servers": ",".join(n.address for n in cluster.nodes if n.alive)})
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        if all(p.leader >= 0 and len(p.isrs) == len(p.replicas) for p in meta.partitions.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"{topic} not back in sync after {timeout:.0f} s\n{cluster.logs()}")


def bounce_leader(cluster: KafkaCluster, topic: str, times: int = 2, pause: float = 1.0,
                  killed_at: list[float] | None = None) -> list[int]:
    """SIGKILL the leader of ``topic``-0, restart it once another node leads, wait for a
    full ISR; ``times`` times. Returns the killed node ids; ``killed_at`` gets the
    time.monotonic() of each kill."""
    killed = []
    for _ in range(times):
        time.sleep(pause)  # the clients run on the current leaders first
        victim = cluster.leader(topic, 0)
        cluster.node(victim).kill()
        if killed_at is not None:
            killed_at.append(time.monotonic())
        killed.append(victim)
        deadline = time.monotonic() + 60
        while cluster.leader(topic, 0) in (victim, -1):
            assert time.monotonic() < deadline, f"no new leader for {topic}-0\n{cluster.logs()}"
            time.sleep(0.2)
        time.sleep(pause)  # the clients run on the new leader while the old one is down
        cluster.node(victim).start()
        wait_in_sync(cluster, topic)
    return killed


def transaction_log_partition(transactional_id: str, partitions: int = 4) -> int:
    """The partition of __transaction_state (4 in kprod_broker's nodes) whose leader is the
    id's coordinator: Java's String.hashCode, made positive, modulo the partitions."""
    h = 0
    for unit in transactional_id.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def transaction_coordinator(cluster: KafkaCluster, transactional_id: str) -> int:
    """The node id coordinating ``transactional_id`` now (-1 while its log has no leader);
    __transaction_state must exist (the first InitProducerId creates it)."""
    return cluster.leader("__transaction_state", transaction_log_partition(transactional_id))


def _number(m: Message) -> int:
    """The integer a test sent as ``m``'s value."""
    value = m.value()
    assert value is not None, f"a null value at offset {m.offset()}"
    return int(value)


def _where(m: Message) -> tuple[int, int]:
    """(partition, offset) of a consumed message."""
    partition, offset = m.partition(), m.offset()
    assert partition is not None and offset is not None
    return partition, offset


def assert_order_per_key(messages: Sequence[Message]) -> None:
    """Values (increasing integers per key as sent) come back increasing for every key."""
    per_key: dict[bytes | str | None, list[int]] = collections.defaultdict(list)
    for m in sorted(messages, key=_where):
        per_key[m.key()].append(_number(m))
    assert all(v == sorted(v) for v in per_key.values())


class Deliveries:
    """Each send's callback outcomes: how many callbacks it got, where it was acknowledged,
    and the errors."""

    def __init__(self) -> None:
        self.outcomes: collections.Counter = collections.Counter()
        self.acked: dict[int, tuple[int, int]] = {}
        self.errors: list[Exception] = []
        self._lock = threading.Lock()

    def callback(self, i: int) -> Callable[[RecordMetadata | None, Exception | None], None]:
        """The callback of send number ``i``."""
        def done(metadata: RecordMetadata | None, error: Exception | None) -> None:
            with self._lock:
                self.outcomes[i] += 1
                if error is None:
                    assert metadata is not None
                    self.acked[i] = (metadata.partition, metadata.offset)
                else:
                    self.errors.append(error)
        return done

    def assert_one_callback_each(self, sent: int) -> None:
        assert sorted(self.outcomes) == list(range(sent)) and set(self.outcomes.values()) == {1}

    def assert_offsets_match(self, messages: Sequence[Message]) -> None:
        """Acknowledged offsets are where the records are. A retry the broker recognised as
        already written (DUPLICATE_SEQUENCE_NUMBER) carries no offset: -1, as in Java."""
        where = {_number(m): _where(m) for m in messages}
        wrong = [(i, where[i], self.acked[i]) for i in self.acked
                 if where[i] != self.acked[i] and self.acked[i] != (where[i][0], -1)]
        assert not wrong, (len(wrong), wrong[:5])


def assert_arrow_offsets_match(results: Sequence[ArrowSendResult], messages: Sequence[Message], chunk: int) -> int:
    """Each send_arrow call's summary is where its own records are (call ``c`` sent the
    values ``c * chunk`` up to ``(c + 1) * chunk``): per partition their count, and their
    first and last offsets, -1 only where a retry came back as a duplicate (no offset).
    Returns how many ends were -1."""
    offsets: dict[tuple[int, int], list[int]] = collections.defaultdict(list)  # (call, partition) -> offsets
    for m in messages:
        partition, offset = _where(m)
        offsets[(_number(m) // chunk, partition)].append(offset)
    unknown = 0
    for call, r in enumerate(results):
        assert {p for _, p in r.partitions} == {p for c, p in offsets if c == call}
        for (_, partition), (count, first, last) in r.partitions.items():
            got = offsets[(call, partition)]
            assert count == len(got)
            unknown += (first == -1) + (last == -1)
            assert first in (-1, min(got)) and last in (-1, max(got)), (call, partition, first, last)
    return unknown
