"""df.write in exactly-once mode: the whole write becomes visible at once, or not at all."""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from kprod_broker import KafkaCluster
from tests.brokers import consume_to_marks, create_topic, unique_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

N = 3000


def _write(df: DataFrame, bootstrap: str, topic: str, guarantee: str) -> None:
    (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kprod.deliveryGuarantee", guarantee).save())


def _visible(bootstrap: str, topic: str) -> list[bytes]:
    """The keys read_committed sees, up to marks produced now (not for a fixed while): the
    marks show only once no transaction before them is open."""
    return [m.key() for m in consume_to_marks(bootstrap, topic, overrides={"isolation.level": "read_committed"})]


def test_batch_write_commits_every_task_at_once(spark: SparkSession, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-batch"), partitions=3)
    df = spark.range(N, numPartitions=4).select(F.col("id").cast("string").alias("key"),
                                                 F.lit("v").alias("value"))
    _write(df, kafka.bootstrap, topic, "exactly-once")
    counts = collections.Counter(k.decode() for k in _visible(kafka.bootstrap, topic))
    assert set(counts) == {str(i) for i in range(N)} and set(counts.values()) == {1}


@pytest.mark.parametrize("guarantee, visible", [("exactly-once", False), ("at-least-once", True)])
def test_a_failed_batch_write_leaves_nothing_visible(spark: SparkSession, kafka: KafkaCluster, guarantee: str,
                                                     visible: bool) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-fail"), partitions=2)

    @F.udf(StringType())
    def fail_in_last_partition(i: int) -> str:
        if i >= N - 10:  # the last of three partitions, which starts once an earlier task is done (local[2])
            raise RuntimeError("injected failure")
        return str(i)

    df = spark.range(N, numPartitions=3).select(fail_in_last_partition("id").alias("key"), F.lit("v").alias("value"))
    with pytest.raises(Exception, match="injected failure"):
        _write(df, kafka.bootstrap, topic, guarantee)
    keys = _visible(kafka.bootstrap, topic)
    # At least once, a finished task's rows stay in Kafka; exactly once, its transaction was aborted.
    assert (len(keys) > 0) is visible, len(keys)
