"""A Spark batch write through kprod while the leader of a partition is killed with
SIGKILL and restarted: every row arrives once (idempotence), each task's rows in order
per key."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from confluent_kafka import TopicPartition
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, consumer, unique_topic
from tests.failover import FAILOVER_CONFIG, assert_order_per_key, bounce_leader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_batch_write_while_a_broker_is_bounced(spark: SparkSession, kafka3: KafkaCluster) -> None:
    topic = kafka3.create_topic(unique_topic("failover-sink"), 3)
    rows = 300_000
    # Per key the values increase with the row id; each task writes one half of the ids.
    df = spark.range(rows, numPartitions=2).select(
        (F.col("id") % 17).cast("string").alias("key"), F.col("id").cast("string").alias("value"))
    writer = (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka3.bootstrap)
              .option("topic", topic).option("kafka.batch.size", "16384"))
    for key, value in FAILOVER_CONFIG.items():
        writer = writer.option(f"kafka.{key}", str(value))
    # Rows go slowly enough that the write spans the bounce: small batches, one call at a time.
    writer = writer.option("kafka.max.in.flight.requests.per.connection", "1")
    # The bounce runs beside the write (Spark's calls stay on this thread, where PySpark
    # finds its Python data sources).
    killed: list[int] = []
    killed_at: list[float] = []

    def bounce_mid_write() -> None:
        check = consumer(kafka3.bootstrap)
        try:  # once the tasks are writing, not while Spark still plans
            while check.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] < 1000:
                time.sleep(0.05)
        finally:
            check.close()
        killed.extend(bounce_leader(kafka3, topic, times=1, pause=0.3, killed_at=killed_at))

    bounce = threading.Thread(target=bounce_mid_write)
    bounce.start()
    try:
        writer.save()
        saved_at = time.monotonic()
    finally:
        bounce.join(180)
    assert killed
    assert saved_at > killed_at[0]  # the leader died mid-write, not after it
    messages = consume_all(kafka3.bootstrap, topic, rows, timeout=120, to_end=True)
    values = [int(m.value()) for m in messages]
    assert len(values) == len(set(values)) == rows
    for task in range(2):  # order is kept within each task (its rows are ids of one half)
        half = [m for m in messages if int(m.value()) // (rows // 2) == task]
        assert_order_per_key(half)
