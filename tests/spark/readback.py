"""Records read back with confluent-kafka, as a Spark DataFrame chispa can compare."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.brokers import consume_all

SCHEMA = (
    "topic string, partition int, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>, timestamp bigint"
)


def read_topics(spark: SparkSession, bootstrap: str, expected: dict[str, int], settle: float = 1.0) -> tuple[DataFrame, list]:
    """Every record of ``expected`` topics (reading ``settle`` seconds more to catch duplicates)."""
    messages = []
    for topic, count in expected.items():
        messages += consume_all(bootstrap, topic, count, timeout=60, settle=settle)
    rows = [
        (m.topic(), m.partition(), m.key(), m.value(),
         [(k, v) for k, v in m.headers()] if m.headers() else None, m.timestamp()[1])
        for m in messages
    ]
    return spark.createDataFrame(rows, SCHEMA), messages


def as_sent(df: DataFrame, topic: str | None = None, default_ts: bool = True) -> DataFrame:
    """The input DataFrame in read-back shape: bytes, ms timestamps, empty headers as null."""
    cols = df.columns
    out = df.select(
        (F.col("topic") if "topic" in cols and topic is None else F.lit(topic)).alias("topic"),
        (F.col("key").cast("binary") if "key" in cols else F.lit(None).cast("binary")).alias("key"),
        F.col("value").cast("binary").alias("value"),
        (F.when(F.size("headers") > 0, F.col("headers")) if "headers" in cols
         else F.lit(None).cast("array<struct<key: string, value: binary>>")).alias("headers"),
        (F.unix_millis("timestamp") if "timestamp" in cols else F.lit(None).cast("bigint")).alias("timestamp"),
    )
    return out
