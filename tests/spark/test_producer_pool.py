"""Producers kept across tasks and microbatches: reused when healthy and configured alike,
closed after a failed task or once idle past kprod.producer.cache.timeout."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.producer import ConfigError, KafkaProducer, ProducerClosedError, ProducerRecord
from spark_sink.spark.options import parse_options
from spark_sink.spark.producer_pool import ProducerPool
from tests.brokers import consume_all, create_topic, unique_topic
from tests.clock import MovedClock

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.conftest import ProxiedKafka


def _send_one(producer: KafkaProducer, topic: str) -> None:
    producer.send_arrow(pa.table({"value": [b"x"]}), topic).result(30)


def test_a_healthy_producer_is_reused_only_for_the_same_settings(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("pool"), 1)
    pool = ProducerPool()
    config = {"bootstrap.servers": kafka.bootstrap}
    first = pool.acquire(config)
    _send_one(first, topic)
    pool.release(first, config, healthy=True, timeout_s=60)
    assert pool.acquire(dict(config)) is first  # same settings, in any dict
    other = pool.acquire({**config, "linger.ms": "7"})
    assert other is not first
    pool.release(other, {**config, "linger.ms": "7"}, healthy=False, timeout_s=60)  # a failed task
    assert pool.idle_count() == 0
    with pytest.raises(ProducerClosedError):
        _send_one(other, topic)
    _send_one(first, topic)  # the reused one still works
    pool.release(first, config, healthy=True, timeout_s=0)  # caching off: closed at once
    assert pool.idle_count() == 0
    with pytest.raises(ProducerClosedError):
        _send_one(first, topic)
    assert len(consume_all(kafka.bootstrap, topic, 2, settle=0.3)) == 2


def test_its_producers_run_on_the_pools_clock(kafka: KafkaCluster) -> None:
    """A pool given a clock hands it to the producers it makes: their records' timestamps
    (and timeouts) follow it, as the pool's idle times do."""
    topic = create_topic(kafka.bootstrap, unique_topic("pool-clock"), 1)
    clock = MovedClock(20 * 60_000)  # within the broker's log.message.timestamp.after.max.ms
    pool = ProducerPool(clock)
    config = {"bootstrap.servers": kafka.bootstrap}
    producer = pool.acquire(config)
    try:
        before = clock.wall_ms()
        stamp = producer.send(ProducerRecord(topic, b"v")).result(30).timestamp
        assert before <= stamp <= clock.wall_ms()  # 20 minutes ahead of the system's
    finally:
        pool.release(producer, config, healthy=False, timeout_s=0)
    [record] = consume_all(kafka.bootstrap, topic, 1, settle=0.3)
    assert record.timestamp()[1] == stamp


def test_idle_producers_are_closed_after_their_timeout(kafka: KafkaCluster) -> None:
    pool = ProducerPool()
    config = {"bootstrap.servers": kafka.bootstrap}
    producer = pool.acquire(config)
    pool.release(producer, config, healthy=True, timeout_s=0.3)
    deadline = time.monotonic() + 10
    while pool.idle_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.idle_count() == 0  # the pool's own thread closed it, no call needed
    with pytest.raises(ProducerClosedError):
        _send_one(producer, "any")


def test_the_pool_stays_bounded_and_closes_the_longest_idle(kafka: KafkaCluster,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Exactly-once producers differ by transactional id, so a loop of writes would pile
    them up: past MAX_IDLE the longest idle are closed."""
    from spark_sink.spark import producer_pool

    monkeypatch.setattr(producer_pool, "MAX_IDLE", 3)
    pool = ProducerPool()
    producers = []
    for i in range(5):
        config = {"bootstrap.servers": kafka.bootstrap, "client.id": f"c{i}"}
        producers.append(pool.acquire(config))
        pool.release(producers[-1], config, healthy=True, timeout_s=600)
    assert pool.idle_count() == 3
    assert [p.usable for p in producers] == [False, False, True, True, True]
    pool.close_all()


def test_a_producer_whose_sender_died_is_not_handed_out(kafka: KafkaCluster) -> None:
    pool = ProducerPool()
    config = {"bootstrap.servers": kafka.bootstrap}
    producer = pool.acquire(config)
    pool.release(producer, config, healthy=True, timeout_s=600)
    producer._sender.force_close()  # as a bug or a fatal error would stop it
    producer._sender.join(10)
    fresh = pool.acquire(config)
    assert fresh is not producer and fresh.usable
    fresh.close()


def test_cache_timeout_option_takes_spark_durations() -> None:
    base = {"kafka.bootstrap.servers": "h:1"}
    assert parse_options(base).producer_cache_timeout_s == 600
    for text, seconds in (("10m", 600), ("30s", 30), ("500ms", 0.5), ("2500", 2.5), ("0", 0), ("1h", 3600)):
        assert parse_options({**base, "kprod.producer.cache.timeout": text}).producer_cache_timeout_s == seconds
    with pytest.raises(ConfigError, match="kprod.producer.cache.timeout.*duration"):
        parse_options({**base, "kprod.producer.cache.timeout": "soon"})


def _write(spark: SparkSession, bootstrap: str, topic: str, rows: int, **options: str) -> None:
    # The driver's check of the cluster opens a connection of its own for each write: off,
    # so that the proxy counts the tasks' connections alone.
    writer = (spark.range(rows, numPartitions=2).select(F.col("id").cast("string").alias("value"))
              .write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
              .option("kprod.clusterCheck", "false"))
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def test_a_second_write_reuses_the_workers_producers_and_their_connections(spark: SparkSession,
                                                                           kafka_proxy: ProxiedKafka) -> None:
    """Counted at the proxy: the second write opens no connection. With the cache off it
    does (so this test can fail)."""
    proxy = kafka_proxy.proxy
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("pool-spark"), 2)
    _write(spark, kafka_proxy.bootstrap, topic, 1000)
    opened = proxy.connections_accepted
    _write(spark, kafka_proxy.bootstrap, topic, 1000)
    assert proxy.connections_accepted == opened

    _write(spark, kafka_proxy.bootstrap, topic, 1000, **{"kprod.producer.cache.timeout": "0"})
    opened = proxy.connections_accepted
    _write(spark, kafka_proxy.bootstrap, topic, 1000, **{"kprod.producer.cache.timeout": "0"})
    assert proxy.connections_accepted > opened
    assert len(consume_all(kafka_proxy.bootstrap, topic, 4000, settle=0.5)) == 4000


def test_pooled_producers_close_their_connections_once_idle(spark: SparkSession, kafka_proxy: ProxiedKafka) -> None:
    proxy = kafka_proxy.proxy
    proxy.cut_all()
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("pool-idle"), 2)
    _write(spark, kafka_proxy.bootstrap, topic, 1000, **{"kprod.producer.cache.timeout": "1s"})
    deadline = time.monotonic() + 20
    while proxy.open_connections and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proxy.open_connections == 0
    assert len(consume_all(kafka_proxy.bootstrap, topic, 1000)) == 1000
