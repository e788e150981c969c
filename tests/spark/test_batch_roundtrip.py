"""Batch writes through format("kprod") on both brokers, read back with confluent-kafka and
compared with chispa: every column combination."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.producer.partitioner import murmur2
from tests.brokers import create_topic, unique_topic
from tests.spark.readback import as_sent, read_topics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

N = 600


def write(df: DataFrame, bootstrap: str, **options: str) -> None:
    w = df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def compare(spark: SparkSession, df: DataFrame, broker: KafkaCluster, topics: dict[str, int], topic: str | None = None,
            with_timestamp: bool = False) -> tuple[DataFrame, list]:
    """Check every row arrived exactly once with its key, value, headers (and timestamp)."""
    got, messages = read_topics(spark, broker.bootstrap, topics, to_end=True)
    expected = as_sent(df, topic)
    drop = ["partition"] if with_timestamp else ["partition", "timestamp"]
    assert_df_equality(got.drop(*drop), expected.drop(*drop[1:]) if with_timestamp else expected.drop("timestamp"),
                       ignore_row_order=True, ignore_column_order=True, ignore_nullable=True)
    return got, messages


def test_values_only_with_nulls(spark: SparkSession, broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sv"), 3)
    df = spark.range(N, numPartitions=2).select(
        F.when(F.col("id") % 7 == 0, None).otherwise(F.concat(F.lit("v-"), F.col("id").cast("string"))).alias("value"))
    write(df, broker.bootstrap, topic=topic)
    got, messages = compare(spark, df, broker, {topic: N}, topic)
    assert len(messages) == N
    # Keyless rows go to partitions in sticky runs; all three may or may not be used, but
    # a record never lands outside the topic.
    assert {m.partition() for m in messages} <= {0, 1, 2}


def test_keys_with_nulls_follow_murmur2(spark: SparkSession, broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sk"), 4)
    df = spark.range(N, numPartitions=2).select(
        F.when(F.col("id") % 5 == 0, None).otherwise((F.col("id") % 50).cast("string")).alias("key"),
        F.col("id").cast("string").cast("binary").alias("value"))
    write(df, broker.bootstrap, topic=topic)
    _, messages = compare(spark, df, broker, {topic: N}, topic)
    for m in messages:
        if m.key() is not None:
            assert m.partition() == (murmur2(m.key()) & 0x7FFFFFFF) % 4


def test_headers_and_timestamps(spark: SparkSession, broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sh"), 2)
    base = dt.datetime(2024, 5, 1, 12, 0, 0, tzinfo=dt.UTC)
    rows = [
        (f"k{i}".encode(), f"v{i}",
         [] if i % 4 == 0 else [("n", str(i).encode()), ("empty", None if i % 3 == 0 else b"")],
         base + dt.timedelta(milliseconds=1000 * i + 7))
        for i in range(200)
    ]
    df = spark.createDataFrame(
        rows, "key binary, value string, headers array<struct<key: string, value: binary>>, timestamp timestamp"
    ).repartition(2)
    write(df, broker.bootstrap, topic=topic)
    compare(spark, df, broker, {topic: 200}, topic, with_timestamp=True)


def test_explicit_partitions_and_order_within_a_task(spark: SparkSession, broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sp"), 3)
    df = spark.range(N, numPartitions=2).select(
        F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"),
        F.when(F.col("id") % 10 == 0, None).otherwise((F.col("id") % 3).cast("int")).alias("partition"))
    write(df, broker.bootstrap, topic=topic)
    _, messages = compare(spark, df, broker, {topic: N}, topic)
    for m in messages:
        i = int(m.value())
        if i % 10:
            assert m.partition() == i % 3
    # spark.range splits ids into two contiguous halves, one per task: within a task,
    # each partition's offsets follow the input order.
    for p in range(3):
        in_p = sorted((m.offset(), int(m.value())) for m in messages if m.partition() == p)
        for half in (lambda i: i < N // 2, lambda i: i >= N // 2):
            ids = [i for _, i in in_p if half(i)]
            assert ids == sorted(ids)


def test_many_small_arrow_batches_are_joined_without_loss_or_reordering(spark: SparkSession,
                                                                        broker: KafkaCluster) -> None:
    # Spark's Arrow batches of 7 rows: a task joins them into larger send_arrow calls.
    topic = create_topic(broker.bootstrap, unique_topic("small-batches"), 3)
    df = spark.range(N, numPartitions=2).select(
        F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")
    try:
        write(df, broker.bootstrap, topic=topic)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    _, messages = compare(spark, df, broker, {topic: N}, topic)
    for p in range(3):  # one key per value: each partition holds each task's rows in order
        in_p = sorted((m.offset(), int(m.value())) for m in messages if m.partition() == p)
        for half in (lambda i: i < N // 2, lambda i: i >= N // 2):
            ids = [i for _, i in in_p if half(i)]
            assert ids == sorted(ids)


def test_topic_column_to_two_topics(spark: SparkSession, broker: KafkaCluster) -> None:
    a = create_topic(broker.bootstrap, unique_topic("sa"), 2)
    b = create_topic(broker.bootstrap, unique_topic("sb"), 3)
    df = spark.range(N, numPartitions=2).select(
        F.when(F.col("id") % 3 == 0, F.lit(a)).otherwise(F.lit(b)).alias("topic"),
        F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"))
    write(df, broker.bootstrap)
    compare(spark, df, broker, {a: N // 3, b: N - N // 3})


def test_topic_option_overrides_topic_column_and_report(spark: SparkSession, broker: KafkaCluster,
                                                        tmp_path: Path) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("so"), 2)
    df = spark.range(100, numPartitions=2).select(
        F.lit("not-this-topic").alias("topic"), F.col("id").cast("string").alias("value"))
    report = tmp_path / "report.jsonl"
    write(df, broker.bootstrap, topic=topic, **{"kprod.deliveryReport.path": str(report)})
    _, messages = compare(spark, df.drop("topic"), broker, {topic: 100}, topic)
    (line,) = report.read_text().splitlines()
    entry = json.loads(line)
    assert entry["batchId"] is None and entry["records"] == 100 and entry["tasks"] == 2
    offsets: dict[int, list[int]] = {}
    for m in messages:
        offsets.setdefault(m.partition(), []).append(m.offset())
    assert {(p["partition"], p["count"], p["firstOffset"], p["lastOffset"]) for p in entry["partitions"]} == {
        (p, len(o), min(o), max(o)) for p, o in offsets.items()}


def test_delivery_failure_fails_the_write(spark: SparkSession, broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sf"), 2)
    df = spark.range(10, numPartitions=1).select(
        F.col("id").cast("string").alias("value"), F.lit(5).alias("partition"))
    with pytest.raises(Exception, match=r"partition.*5.*2 partitions"):
        write(df, broker.bootstrap, topic=topic, **{"kafka.max.block.ms": "10000"})


def test_every_column_at_once(spark: SparkSession, broker: KafkaCluster) -> None:
    # All six columns in one DataFrame: two topics from the column, null and hashed keys,
    # null values, explicit and null partitions, null and non-empty headers, and epoch-ms
    # bigint timestamps (the timestamp type is covered above).
    a = create_topic(broker.bootstrap, unique_topic("sea"), 2)
    b = create_topic(broker.bootstrap, unique_topic("seb"), 3)
    base_ms = 1_714_564_800_000
    i = F.col("id")
    df = spark.range(N, numPartitions=2).select(
        F.when(i % 2 == 0, F.lit(a)).otherwise(F.lit(b)).alias("topic"),
        F.when(i % 5 == 0, None).otherwise((i % 40).cast("string")).alias("key"),
        F.when(i % 11 == 0, None).otherwise(F.concat(F.lit("v-"), i.cast("string"))).cast("binary").alias("value"),
        F.when(i % 3 == 0, (i % 2).cast("int")).alias("partition"),
        F.when(i % 4 != 0, F.array(F.struct(F.lit("n").alias("key"), i.cast("string").cast("binary").alias("value")),
                                    F.struct(F.lit("e").alias("key"), F.lit(b"").alias("value"))))
        .alias("headers"),
        (F.lit(base_ms) + i * 37).alias("timestamp"),
    )
    write(df, broker.bootstrap)
    got, messages = read_topics(spark, broker.bootstrap, {a: N // 2, b: N // 2}, to_end=True)
    expected = df.select("topic", F.col("key").cast("binary").alias("key"), "value", "headers", "timestamp")
    assert_df_equality(got.drop("partition"), expected, ignore_row_order=True, ignore_column_order=True,
                       ignore_nullable=True)
    # Placement: explicit partitions win, keys follow Java's murmur2 on their topic's count.
    sent = {(r.topic, r.timestamp): r for r in df.collect()}
    for m in messages:
        row = sent[(m.topic(), m.timestamp()[1])]
        if row.partition is not None:
            assert m.partition() == row.partition
        elif row.key is not None:
            assert m.partition() == (murmur2(row.key.encode()) & 0x7FFFFFFF) % (2 if m.topic() == a else 3)
