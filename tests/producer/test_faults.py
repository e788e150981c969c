"""Every connection cut several times a second: nothing acknowledged is lost, nothing is
duplicated (idempotence), per-key order holds and every send gets exactly one callback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, create_topic, unique_topic
from tests.failover import Deliveries, assert_arrow_offsets_match, assert_order_per_key

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka

# Short timeouts and backoffs: many retries fit into a run that cuts connections.
RETRY_FAST = {"linger.ms": 1, "request.timeout.ms": 3000, "delivery.timeout.ms": 120000, "retry.backoff.ms": 20,
              "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 100}


def test_connections_cut_repeatedly_lose_and_duplicate_nothing(kafka_proxy: ProxiedKafka) -> None:
    proxy, broker = kafka_proxy.proxy, kafka_proxy
    cuts_before = proxy.connections_cut
    topic = create_topic(broker.bootstrap, unique_topic("faults"), partitions=3)
    deliveries = Deliveries()
    n = 30_000

    config = {**RETRY_FAST, "bootstrap.servers": broker.bootstrap, "batch.size": 2048}
    with KafkaProducer(config) as p, proxy.cutting(every_s=0.25):
        for i in range(n):
            p.send(ProducerRecord(topic, b"%d" % i, key=b"k%d" % (i % 11)), deliveries.callback(i))
            if i % 5000 == 4999:
                proxy.wait_for_cut()  # spread the sends over several cuts, however fast they go
        p.flush(120)
    assert proxy.connections_cut - cuts_before > 3
    deliveries.assert_one_callback_each(n)
    assert len(deliveries.acked) == n  # retried within delivery.timeout.ms, all got through

    messages = consume_all(broker.bootstrap, topic, n, timeout=60, settle=1.0)
    values = [int(m.value()) for m in messages]
    assert len(values) == len(set(values)) == n  # no duplicates
    deliveries.assert_offsets_match(messages)
    assert_order_per_key(messages)


def test_send_arrow_with_connections_cut_repeatedly_loses_duplicates_and_reorders_nothing(kafka_proxy: ProxiedKafka) -> None:
    """The columnar path under the same faults: its batches share one encoded buffer per
    group and are resent from it on every retry."""
    import pyarrow as pa

    proxy, broker = kafka_proxy.proxy, kafka_proxy
    cuts_before = proxy.connections_cut
    topic = create_topic(broker.bootstrap, unique_topic("arrow-faults"), partitions=3)
    n, chunk = 60_000, 2_000
    table = pa.table({"key": [b"k%d" % (i % 11) for i in range(n)], "value": [b"%d" % i for i in range(n)]})
    config = {**RETRY_FAST, "bootstrap.servers": broker.bootstrap, "batch.size": 4096}
    with KafkaProducer(config) as p, proxy.cutting(every_s=0.25):
        futures = []
        for start in range(0, n, chunk):
            futures.append(p.send_arrow(table.slice(start, chunk), topic=topic))
            if start % (5 * chunk) == 4 * chunk:
                proxy.wait_for_cut()  # spread the sends over several cuts, however fast they go
        results = [f.result(120) for f in futures]
    assert proxy.connections_cut - cuts_before > 3
    assert sum(r.records for r in results) == n

    messages = consume_all(broker.bootstrap, topic, n, timeout=60, settle=1.0)
    values = [int(m.value()) for m in messages]
    assert len(values) == len(set(values)) == n  # nothing lost, nothing twice
    assert_order_per_key(messages)
    unknown = assert_arrow_offsets_match(results, messages, chunk)
    assert unknown < sum(len(r.partitions) for r in results)  # duplicates are the exception


def test_records_timed_out_on_a_silent_broker_name_it(kafka_proxy: ProxiedKafka) -> None:
    """A broker that stops answering: the records fail after delivery.timeout.ms with an
    error naming that timeout and the broker (its id and address), whether they were
    still queued (expired) or in a request that timed out."""
    proxy, broker = kafka_proxy.proxy, kafka_proxy
    topic = create_topic(broker.bootstrap, unique_topic("silent"), partitions=1)
    config = {"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "request.timeout.ms": 500,
              "delivery.timeout.ms": 1500, "max.in.flight.requests.per.connection": 1}
    with KafkaProducer(config) as p:
        p.send(ProducerRecord(topic, b"warm")).result(30)
        proxy.stall()
        futures = [p.send(ProducerRecord(topic, b"%d" % i)) for i in range(3)]
        errors = []
        for f in futures:
            try:
                f.result(30)
            except Exception as exc:
                errors.append(str(exc))
        proxy.stall(False)
    assert len(errors) == 3
    for error in errors:
        assert "delivery.timeout.ms" in error and "1500" in error, error
        assert f"broker 1 at 127.0.0.1:{proxy.port}" in error or f"node 1 at 127.0.0.1:{proxy.port}" in error, error


def test_send_arrow_larger_than_the_buffer_stops_at_a_silent_brokers_first_timeout(kafka_proxy: ProxiedKafka) -> None:
    """One send_arrow call of many buffer.memory's worth to a broker that stopped
    answering: the call fails with the delivery timeout (naming it) once its first records
    expire, with about a buffer's worth queued: it does not wait out delivery.timeout.ms
    again for every buffer-full (max.block.ms, 60 s, is longer than the timeout)."""
    import os
    import random

    import pyarrow as pa
    import pytest

    from spark_sink.client.errors import KafkaTimeoutError

    seed = int(os.environ.get("KPROD_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    proxy, broker = kafka_proxy.proxy, kafka_proxy
    partitions = rng.choice([1, 3, 16])
    topic = create_topic(broker.bootstrap, unique_topic("silent-arrow"), partitions=partitions)
    buffer_memory, value_bytes = rng.choice([128, 256, 512]) << 10, rng.choice([100, 1000, 5000])
    rows = 12 * buffer_memory // value_bytes  # a dozen buffers' worth
    config = {"bootstrap.servers": broker.bootstrap, "linger.ms": rng.choice([0, 5]), "request.timeout.ms": 500,
              "delivery.timeout.ms": 1000, "buffer.memory": buffer_memory, "batch.size": 16384}
    table = pa.table({"value": pa.array([b"%09d" % i + b"v" * (value_bytes - 9) for i in range(rows)])})
    with KafkaProducer(config) as p:
        p.send_arrow(table.slice(0, 1), topic=topic).result(30)  # the topic's settings known
        proxy.stall()
        try:
            with pytest.raises(KafkaTimeoutError, match="delivery.timeout.ms") as raised:
                p.send_arrow(table, topic=topic).result(60)
        finally:
            proxy.stall(False)
    # send_arrow itself raised (its error's future holds the rows queued before it): it
    # did not return with every row queued, one buffer-full a timeout.
    future = getattr(raised.value, "future", None)
    assert future is not None, (seed, "send_arrow returned: only the result raised")
    queued = future._records
    # No more than what fits in buffer.memory (plus the encoding's chunk) before its first
    # records expire; without the early stop all of it is queued, one buffer-full a timeout.
    assert 0 < queued <= 3 * buffer_memory // value_bytes, (seed, queued, rows)
    with pytest.raises(KafkaTimeoutError):
        future.result(30)
