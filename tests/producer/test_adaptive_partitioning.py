"""Adaptive partitioning (KIP-794) on the three-node cluster, one node's client traffic
slowed or stalled by the fault proxy in front of it (the ``kafka3_proxies`` fixture):
records without keys go less to the slow node's partitions, none go to a stalled
leader's partitions after partitioner.availability.timeout.ms, and nothing is lost."""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from spark_sink.client.network import NetworkClient
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, unique_topic
from tests.clock import MovedClock

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka3

VALUE = b"v" * 1000
PARTITIONS = 6
# The slow node's replies come this late: with 5 requests in flight it takes about
# 300 kB/s, well below what the other two take on a 2-core machine.
SLOW_MS = 500
RECORDS = 6000


def _topic(kafka3_proxies: ProxiedKafka3, prefix: str) -> tuple[str, dict[int, int]]:
    cluster = kafka3_proxies.cluster
    topic = cluster.create_topic(unique_topic(prefix), PARTITIONS)
    leaders = {p: cluster.leader(topic, p) for p in range(PARTITIONS)}
    return topic, leaders


def _write(producer: KafkaProducer, topic: str, records: int, path: str) -> tuple[float, collections.Counter[int]]:
    """Send ``records`` keyless values of 1 kB through ``path``; (seconds, partition counts)."""
    started = time.monotonic()
    counts: collections.Counter[int] = collections.Counter()
    if path == "send":
        futures = [producer.send(ProducerRecord(topic, VALUE)) for _ in range(records)]
        producer.flush(120)
        counts.update(f.result(0).partition for f in futures)
    else:
        table = pa.table({"value": [VALUE] * 250})
        calls = [producer.send_arrow(table, topic=topic) for _ in range(records // 250)]
        for future in calls:
            for (_, partition), (count, _, _) in future.result(120).partitions.items():
                counts[partition] += count
    return time.monotonic() - started, counts


def _config(kafka3_proxies: ProxiedKafka3, **settings: object) -> dict[str, object]:
    # A buffer smaller than the write: send() then waits for room as a long write does,
    # and the queues show how fast each broker takes batches.
    return {"bootstrap.servers": kafka3_proxies.bootstrap, "linger.ms": 5, "batch.size": 16384,
            "buffer.memory": 2_000_000, "delivery.timeout.ms": 120000, **settings}


def _warm_up(producer: KafkaProducer, topic: str) -> None:
    """Connections to every leader and the topic's metadata, before any fault."""
    for partition in range(PARTITIONS):
        producer.send(ProducerRecord(topic, b"warm-up", partition=partition))
    producer.flush(30)


@pytest.mark.parametrize("path", ["send", "send_arrow"])
def test_a_slow_nodes_partitions_get_fewer_records(kafka3_proxies: ProxiedKafka3, path: str) -> None:
    topic, leaders = _topic(kafka3_proxies, "adaptive")
    slow = leaders[0]
    records = RECORDS
    with KafkaProducer(_config(kafka3_proxies)) as producer:
        _warm_up(producer, topic)
        kafka3_proxies.proxies[slow].set_delay(SLOW_MS, replies_only=True)
        _, counts = _write(producer, topic, records, path)
    shares: collections.Counter[int] = collections.Counter()
    for partition, count in counts.items():
        shares[leaders[partition]] += count
    others = [shares[node] for node in set(leaders.values()) if node != slow]
    assert shares[slow] < 0.75 * sum(others) / len(others), (shares, slow)
    assert sum(counts.values()) == records
    assert len(consume_all(kafka3_proxies.cluster.bootstrap, topic, records + PARTITIONS)) == records + PARTITIONS


def test_no_new_batches_for_a_stalled_leader_after_the_availability_timeout(kafka3_proxies: ProxiedKafka3) -> None:
    topic, leaders = _topic(kafka3_proxies, "availability")
    stalled = leaders[0]
    stalled_partitions = {p for p, node in leaders.items() if node == stalled}
    others = {node: p for p, node in leaders.items() if node != stalled}  # a partition of each other leader
    timeout_ms = 60_000  # never reached in real time: the clock is moved past it
    config = _config(kafka3_proxies, **{"partitioner.availability.timeout.ms": timeout_ms,
                                        "request.timeout.ms": 300_000, "delivery.timeout.ms": 600_000})
    clock = MovedClock()
    with KafkaProducer(config, clock=clock) as producer:
        _warm_up(producer, topic)
        # Before the stall the node's partitions are chosen like any other: 1,000 records
        # of 1 kB move the sticky partition on about 60 times.
        before = [producer.send(ProducerRecord(topic, VALUE)) for _ in range(1000)]
        producer.flush(30)
        proxy = kafka3_proxies.proxies[stalled]
        proxy.stall(True)
        queues = producer._accumulator._by_topic[topic]
        client = producer._client
        assert isinstance(client, NetworkClient)
        try:
            # Until the stalled node has a batch it cannot take (as many requests in flight
            # as it may have, unanswered): then it is overdue once the timeout has passed.
            during: list = []
            while not (client.in_flight_count(stalled) >= 5 and any(queues.get(p) for p in stalled_partitions)):
                assert len(during) < 20_000, "the stalled node's partitions never queued a batch"
                during += [producer.send(ProducerRecord(topic, VALUE)) for _ in range(20)]
            clock.advance(2 * timeout_ms)
            # The move ages every node's last batch taken at once: until a node takes one
            # again it looks overdue too, and with every leader overdue the partitioner has
            # none to prefer and picks among all partitions (as Java's does). So the other
            # leaders each take a batch on the moved clock first (a record acknowledged).
            taken = [producer.send(ProducerRecord(topic, VALUE, partition=p)) for p in others.values()]
            for future in taken:
                future.result(60)
            after = [producer.send(ProducerRecord(topic, VALUE)) for _ in range(200)]
        finally:
            proxy.stall(False)
        producer.flush(120)
    # A sticky partition chosen before the node was overdue keeps its records until its
    # batch is full (16 to 32 records of 1 kB); after that, none go to the stalled node.
    late = {f.result(0).partition for f in after[50:]}
    assert late and not stalled_partitions & late
    # It was a candidate before the stall. (Not checked in the stall's first moments: the
    # node's growing queue may already steer records away, before the timeout does.)
    assert stalled_partitions & {f.result(0).partition for f in before}
    total = len(before) + len(during) + len(taken) + len(after) + PARTITIONS
    assert len(consume_all(kafka3_proxies.cluster.bootstrap, topic, total, to_end=True)) == total


@pytest.mark.bench
def test_bench_slow_node_write_time_adaptive_on_and_off(kafka3_proxies: ProxiedKafka3) -> None:
    """The same keyless write with one node's replies 500 ms late, adaptive partitioning
    on and off, alternating in one run; prints the times and the slow node's share."""
    rounds, records = 3, RECORDS
    results = collections.defaultdict(list)
    for _ in range(rounds):
        for adaptive in (True, False):
            topic, leaders = _topic(kafka3_proxies, "adaptive-bench")
            slow = leaders[0]
            config = _config(kafka3_proxies, **{"partitioner.adaptive.partitioning.enable": adaptive})
            with KafkaProducer(config) as producer:
                _warm_up(producer, topic)
                kafka3_proxies.proxies[slow].set_delay(SLOW_MS, replies_only=True)
                try:
                    seconds, counts = _write(producer, topic, records, "send")
                finally:
                    kafka3_proxies.proxies[slow].set_delay(0)
            share = sum(c for p, c in counts.items() if leaders[p] == slow) / records
            results[adaptive].append((seconds, share))
    for adaptive, runs in results.items():
        print(f"adaptive={adaptive}: " + ", ".join(f"{s:.2f} s (slow node {share:.0%})" for s, share in runs))
    on, off = (sorted(s for s, _ in results[a])[rounds // 2] for a in (True, False))
    print(f"median on {on:.2f} s, off {off:.2f} s, off/on {off / on:.2f}")
