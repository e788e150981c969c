"""Batch save modes through real Spark against both brokers.

What PySpark (4.1 to 4.3) does for a Python data source: only ``append`` and ``overwrite``
reach ``DataSource.writer()``; ``errorifexists`` (also spelled ``error``/``default``, and
Spark's default when no mode is set) and ``ignore`` are refused by Spark's DataFrameWriter
itself with UNSUPPORTED_DATA_SOURCE_SAVE_MODE. kprod refuses ``overwrite``. So ``append``
is the one batch mode that writes; every other mode fails on the driver, before any record
is sent, which the read-back below proves against the topic itself.

What a Python data source sees of a write is its options, the schema and one flag,
``overwrite`` (PySpark's worker/write_into_data_source.py): neither the save mode Spark
refused nor a streaming query's output mode reaches kprod. Update mode is refused by
Spark's planner (``V2Writes``: "<name> does not support Update mode.") when the first
microbatch is planned, after ``start()`` returned, without calling kprod. Only Spark can
move these checks or change their words; the tests pin the words the README quotes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

N = 20

# (mode given to .mode(), or None for no .mode() call; what the error must say)
REJECTED = [
    ("overwrite", r"save mode 'overwrite' is not supported by kprod.*accepted save mode is 'append'"),
    ("ignore", r'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"Ignore" mode'),
    ("errorifexists", r'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"ErrorIfExists" mode'),
    ("error", r'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"ErrorIfExists" mode'),
    (None, r'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"ErrorIfExists" mode'),
]


def save(df: DataFrame, bootstrap: str, topic: str, mode: str | None) -> None:
    writer = df.write.format("kprod").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    if mode is not None:
        writer = writer.mode(mode)
    writer.save()


def test_only_append_writes_and_other_modes_send_nothing(spark: SparkSession, broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sm"), 2)
    df = spark.range(N, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    for mode, error in REJECTED:
        with pytest.raises(Exception, match=error):
            save(df, broker.bootstrap, topic, mode)
    save(df, broker.bootstrap, topic, "append")
    # Read past the N appended records: a record from a refused write would show up here.
    messages = consume_all(broker.bootstrap, topic, N, settle=1.0)
    assert sorted(int(m.value()) for m in messages) == list(range(N))


def test_update_mode_is_refused_by_spark_when_the_query_runs(spark: SparkSession, tmp_path: Path) -> None:
    """The README's Troubleshooting quotes this message and gives the foreachBatch form."""
    counts = (spark.readStream.format("rate").option("rowsPerSecond", 10).load()
              .groupBy("value").count().select(F.col("value").cast("string").alias("value")))
    query = (counts.writeStream.format("kprod").outputMode("update")
             .option("kafka.bootstrap.servers", "127.0.0.1:9").option("topic", "t")
             .option("checkpointLocation", str(tmp_path)).start())  # Spark checks nothing here
    try:
        with pytest.raises(Exception, match=r"kprod does not support Update mode"):
            query.awaitTermination(60)
    finally:
        query.stop()
