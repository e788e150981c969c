"""Records read back with confluent-kafka: as a Spark DataFrame chispa can compare, as a
read_committed consumer sees them, and whether a transaction is still open."""

from __future__ import annotations

import time
import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, consumer

SCHEMA = (
    "topic string, partition int, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>, timestamp bigint"
)


def read_topics(spark: SparkSession, bootstrap: str, expected: dict[str, int],
                settle: float = 1.0, to_end: bool = False) -> tuple[DataFrame, list]:
    """Every record of ``expected`` topics (reading ``settle`` seconds more to catch
    duplicates; with ``to_end``, up to each partition's high watermark instead, without
    waiting: for topics without transactions)."""
    messages = []
    for topic, count in expected.items():
        messages += consume_all(bootstrap, topic, count, timeout=60, settle=0.0 if to_end else settle, to_end=to_end)
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


class CommittedView:
    """Counts the records in a topic as a consumer of the given isolation level sees them."""

    def __init__(self, bootstrap: str, topic: str, isolation: str) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self.consumer = consumer(bootstrap, **{"isolation.level": isolation})
        partitions = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self.keys: list[str] = []

    def poll(self, seconds: float) -> int:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for m in self.consumer.consume(num_messages=10000, timeout=0.05):
                if not m.error():
                    self.keys.append((m.key() or b"").decode())  # a null key as empty
        return len(self.keys)

    def close(self) -> None:
        self.consumer.close()


def assert_nothing_left_open(bootstrap: str, topic: str, partitions: int, within_s: float = 10.0) -> list[str]:
    """A plain record produced now to every partition is visible to read_committed within
    ``within_s``: no transaction before it holds the last stable offset back. Returns the
    keys read_committed saw up to these sentinels, sentinels (this call's and earlier
    ones') left out: each partition is read in offset order, so every record committed
    before this call is among them, duplicates included."""
    tag = uuid.uuid4().hex[:8]  # this call's own: a topic may hold earlier calls' sentinels
    with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as p:
        for partition in range(partitions):
            p.send(ProducerRecord(topic, b"sentinel", key=b"sentinel-%d-%s" % (partition, tag.encode()),
                                  partition=partition))
        p.flush(30)
    t = CommittedView(bootstrap, topic, "read_committed")
    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            t.poll(0.05)  # short steps: most calls find the sentinels at once
            if sum(k.startswith("sentinel") and k.endswith(tag) for k in t.keys) == partitions:
                return [k for k in t.keys if not k.startswith("sentinel")]
        raise AssertionError(f"sentinels seen by read_committed: {[k for k in t.keys if k.endswith(tag)]}; "
                             f"a transaction is still open on the others")
    finally:
        t.close()
