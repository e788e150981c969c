"""KafkaProducer.metrics() on real Kafka: the Java producer's names, counted per batch
and per request, over sends that succeed, are retried, fail, and wait for memory."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.producer.metrics import WINDOW_S
from tests.brokers import create_topic, unique_topic
from tests.clock import MovedClock

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka

JAVA_NAMES = {"record-send-rate", "byte-rate", "batch-size-avg", "records-per-request-avg", "request-latency-avg",
              "request-latency-max", "record-retry-rate", "record-error-rate", "buffer-available-bytes",
              "bufferpool-wait-time"}


def test_metrics_of_sends_that_succeed(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("metrics"), partitions=3)
    n, value = 30_000, b"v" * 100
    table = pa.table({"value": [value] * n})
    # Every partition's leader takes writes before the measured producer starts: a new
    # producer asks for a new topic's metadata at once, and a leader still loading its
    # partition answers NOT_LEADER_OR_FOLLOWER, which is retried (and counted).
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0}) as warm:
        for partition in range(3):
            warm.send(ProducerRecord(topic, b"warm", partition=partition)).result(30)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5}) as p:
        before = p.metric_totals()
        result = p.send_arrow(table, topic).result(60)
        p.flush(30)
        m = p.metrics()
        task = p.metric_totals().since(before)
    assert JAVA_NAMES <= set(m)
    assert result.records == n
    assert m["record-send-total"] == n and m["record-retry-total"] == m["record-error-total"] == 0
    # A producer younger than a window: rates over one whole window, as Java's.
    assert m["record-send-rate"] == pytest.approx(n / WINDOW_S, rel=0.01)
    assert m["byte-total"] >= n * len(value) and m["byte-rate"] == pytest.approx(m["byte-total"] / WINDOW_S, rel=0.01)
    assert m["records-per-request-avg"] == pytest.approx(n / m["request-total"])
    assert 0 < m["batch-size-avg"] <= 16384 + 1024  # batch.size, plus one record's overflow
    assert 0 < m["request-latency-avg"] <= m["request-latency-max"] < 10_000
    assert m["buffer-available-bytes"] == m["buffer-total-bytes"] == 33554432  # all given back
    assert m["bufferpool-wait-time"] == 0
    assert (task.records_sent, task.records_retried, task.records_failed) == (n, 0, 0)
    assert task.responses == task.requests == m["request-total"]
    assert task.request_latency_max_ms == m["request-latency-max"]
    assert task.request_latency_avg_ms == pytest.approx(m["request-latency-avg"])


def test_metrics_count_retries_errors_and_buffer_waits(kafka_proxy: ProxiedKafka) -> None:
    """A silent broker (the proxy holds everything): a request past request.timeout.ms is
    retried (record-retry-*), records past delivery.timeout.ms fail (record-error-*), and
    sends that find buffer.memory full wait (bufferpool-wait-time). The producer's clock
    is moved past the timeouts rather than waited for."""
    proxy = kafka_proxy.proxy
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("metrics-faults"), partitions=1)
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "linger.ms": 0, "request.timeout.ms": 20_000,
              "retry.backoff.ms": 50, "max.in.flight.requests.per.connection": 1}

    # Retried, then delivered once the proxy flows again.
    clock = MovedClock()
    with KafkaProducer({**config, "delivery.timeout.ms": 120_000}, clock=clock) as p:
        p.send(ProducerRecord(topic, b"warm")).result(30)
        proxy.stall()
        futures = [p.send(ProducerRecord(topic, b"%d" % i)) for i in range(10)]
        # Past request.timeout.ms the request in flight is given up and its batch retried.
        clock.advance(20_000)
        deadline = time.monotonic() + 10  # well within request.timeout.ms of real time
        while not p.metrics()["record-retry-total"] and time.monotonic() < deadline:
            time.sleep(0.05)
        proxy.stall(False)
        for f in futures:
            f.result(30)
        m = p.metrics()
    assert m["record-retry-total"] >= 1 and m["record-retry-rate"] > 0
    assert m["record-error-total"] == 0

    # Failed: delivery.timeout.ms passes while the proxy holds everything (less than a
    # metrics window: the rate is over one whole window).
    clock = MovedClock()
    with KafkaProducer({**config, "request.timeout.ms": 10_000, "delivery.timeout.ms": 12_000}, clock=clock) as p:
        p.send(ProducerRecord(topic, b"warm")).result(30)
        before = p.metric_totals()
        proxy.stall()
        futures = [p.send(ProducerRecord(topic, b"%d" % i)) for i in range(5)]
        clock.advance(12_000)
        for f in futures:
            with pytest.raises(Exception, match="delivery.timeout.ms"):
                f.result(6)  # well within delivery.timeout.ms of real time
        proxy.stall(False)
        m, task = p.metrics(), p.metric_totals().since(before)
    assert m["record-error-total"] == 5 and m["record-error-rate"] == pytest.approx(5 / WINDOW_S, rel=0.01)
    assert task.records_failed == 5

    # Waiting for memory: a buffer of four batches, filled while the broker is silent.
    small = {**config, "delivery.timeout.ms": 30_000, "buffer.memory": 4 * 16384, "batch.size": 16384}
    clock = MovedClock()
    with KafkaProducer(small, clock=clock) as p:
        p.send(ProducerRecord(topic, b"warm")).result(30)
        proxy.stall()
        sent = threading.Event()

        def fill() -> None:
            for _ in range(20):
                p.send(ProducerRecord(topic, b"x" * 15000))  # one batch each
            sent.set()

        filler = threading.Thread(target=fill)
        filler.start()
        deadline = time.monotonic() + 30
        while not p._pool.exhausted:  # until a send waits for memory
            assert time.monotonic() < deadline and not sent.is_set(), "the sends did not block on buffer.memory"
            time.sleep(0.01)
        clock.advance(400)  # how long it waits, by the producer's clock
        assert p.metrics()["buffer-available-bytes"] < 16384
        proxy.stall(False)
        filler.join(30)
        p.flush(30)
        m = p.metrics()
    assert m["bufferpool-wait-time-ns-total"] >= 0.3e9
    assert 0 < m["bufferpool-wait-time"] < 1
    assert m["buffer-available-bytes"] == 4 * 16384


def test_rates_span_two_windows_and_forget_older_samples_as_the_clock_moves() -> None:
    """Java's Rate over two 30 s samples, on a clock the test moves: no sleeping."""
    from spark_sink.producer.buffer_pool import BufferPool
    from spark_sink.producer.metrics import ProducerMetrics

    clock = MovedClock()
    metrics = ProducerMetrics(BufferPool(1 << 20), clock)
    metrics.response_received(10.0)
    assert metrics.metrics()["request-latency-avg"] == 10.0
    clock.advance(WINDOW_S * 1000 + 1)  # a second sample starts; the first still counts
    metrics.response_received(30.0)
    assert metrics.metrics()["request-latency-avg"] == 20.0
    assert metrics.metrics()["request-latency-max"] == 30.0
    clock.advance(WINDOW_S * 1000 + 1)  # the first sample is two windows old: forgotten
    assert metrics.metrics()["request-latency-max"] == 30.0  # the second is now the previous one
    clock.advance(2 * WINDOW_S * 1000 + 1)  # nothing for two windows: every sample gone
    assert metrics.metrics()["request-latency-max"] == 0.0
    assert metrics.checkpoint().responses == 2  # totals never age
