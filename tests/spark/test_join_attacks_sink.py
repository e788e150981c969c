"""format("kprod") writes whose tasks' send_arrow calls join batches: many Kafka
partitions, a skewed partition column, batch.size small and odd, replies delayed through
the fault proxy. Every row once (read_committed for exactly-once), and each task's rows in
its order per Kafka partition (monotonically_increasing_id rises within a task)."""

from __future__ import annotations

import collections
import random
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from tests.brokers import consume_all, create_topic, unique_topic
from tests.spark.readback import assert_nothing_left_open

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.conftest import ProxiedKafka


@pytest.mark.parametrize(("seed", "guarantee"), [(81, "exactly-once"), (82, "at-least-once")])
def test_a_skewed_write_over_many_partitions_lands_once_in_task_order(spark: SparkSession,
                                                                        kafka_proxy: ProxiedKafka, seed: int,
                                                                        guarantee: str) -> None:
    rng = random.Random(seed)
    partitions, rows = rng.choice([17, 40]), rng.choice([20_000, 40_000])
    batch_size, linger = rng.choice([333, 700, 4097]), rng.choice([0, 1, 5])
    print(f"seed={seed} partitions={partitions} rows={rows} batch.size={batch_size} linger.ms={linger}")
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("join-sink"), partitions=partitions)
    df = (spark.range(rows, numPartitions=rng.choice([2, 3]))
          .select(F.monotonically_increasing_id().cast("string").alias("value"),
                  F.when(F.col("id") % 3 == 0, F.lit(0))
                   .otherwise((F.col("id") * 7919) % partitions).cast("int").alias("partition"),
                  F.when(F.col("id") % 5 == 0, F.lit(None)).otherwise(F.col("id").cast("string")).alias("key")))
    kafka_proxy.proxy.set_delay(rng.choice([2, 8]), replies_only=True)
    try:
        (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka_proxy.bootstrap)
         .option("topic", topic).option("kprod.deliveryGuarantee", guarantee)
         .option("kafka.batch.size", str(batch_size)).option("kafka.linger.ms", str(linger)).save())
    finally:
        kafka_proxy.proxy.set_delay(0)
    messages = consume_all(kafka_proxy.bootstrap, topic, rows, timeout=60, settle=1.0,
                           overrides={"isolation.level": "read_committed"})
    ids = [int(m.value()) for m in messages]
    assert len(ids) == len(set(ids)) == rows
    per_task: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        per_task[(m.partition(), int(m.value()) >> 33)].append(int(m.value()))
    assert all(v == sorted(v) for v in per_task.values())
    if guarantee == "exactly-once":
        assert_nothing_left_open(kafka_proxy.bootstrap, topic, partitions)
