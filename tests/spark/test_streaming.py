"""Streaming writes through format("kprod"): a file source run to completion, more files
added, the query restarted from its checkpoint; every row exactly once."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chispa import assert_df_equality
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import create_topic, unique_topic
from tests.spark.readback import as_sent, read_topics

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = "id bigint, name string"


def add_files(spark: SparkSession, directory: Path, start: int, count: int, files: int) -> None:
    """Write rows start..start+count as ``files`` JSON files (not through a temp dir: the
    file source lists the directory, and Spark writes atomically with a rename)."""
    spark.range(start, start + count, numPartitions=files).select(
        "id", F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name")
    ).write.mode("append").json(str(directory))


def run_to_completion(spark: SparkSession, source: Path, checkpoint: Path, bootstrap: str, topic: str, report: Path,
                      mode: str = "append", query: Callable[[DataFrame], DataFrame] | None = None) -> None:
    assert query is not None, "how the stream's rows become records"
    df = query(spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(str(source)))
    q = (df.writeStream.format("kprod").outputMode(mode)
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
         .option("kprod.deliveryReport.path", str(report))
         .option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()


def _counts_by_group(df: DataFrame) -> DataFrame:
    return df.groupBy((F.col("id") % 4).alias("k")).count().select(
        F.col("k").cast("string").alias("key"), F.col("count").cast("string").alias("value"))


def as_records(df: DataFrame) -> DataFrame:
    return df.select(F.col("id").cast("string").alias("key"),
                     F.to_json(F.struct("id", "name")).alias("value"))


def test_file_stream_restarted_from_checkpoint_exactly_once(spark: SparkSession, broker: KafkaCluster,
                                                            tmp_path: Path) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("st"), 3)
    source, checkpoint, report = tmp_path / "in", tmp_path / "cp", tmp_path / "report.jsonl"
    add_files(spark, source, 0, 300, 3)
    run_to_completion(spark, source, checkpoint, broker.bootstrap, topic, report, query=as_records)
    first = [json.loads(line) for line in report.read_text().splitlines()]
    assert sum(e["records"] for e in first) == 300

    add_files(spark, source, 300, 200, 2)
    run_to_completion(spark, source, checkpoint, broker.bootstrap, topic, report, query=as_records)
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    batch_ids = [e["batchId"] for e in entries]
    assert batch_ids == list(range(len(entries)))  # each microbatch committed once, in order
    assert sum(e["records"] for e in entries) == 500
    # The producer's counts over each microbatch's tasks: nothing retried or failed here.
    for e in entries:
        assert e["requests"] >= 1 and e["retries"] == e["errors"] == 0
        assert 0 < e["requestLatencyAvgMs"] <= e["requestLatencyMaxMs"]

    got, messages = read_topics(spark, broker.bootstrap, {topic: 500}, to_end=True)
    assert len(messages) == 500  # nothing from a committed microbatch written again
    expected = as_sent(as_records(spark.read.schema(SCHEMA).json(str(source))), topic)
    assert_df_equality(got.drop("partition", "timestamp"), expected.drop("timestamp"),
                       ignore_row_order=True, ignore_column_order=True, ignore_nullable=True)
    # The report's offset ranges cover exactly what was read.
    per_partition: dict[int, list[tuple[int, int, int]]] = {}
    for e in entries:
        for p in e["partitions"]:
            per_partition.setdefault(p["partition"], []).append((p["firstOffset"], p["lastOffset"], p["count"]))
    for p, ranges in per_partition.items():
        offsets = sorted(m.offset() for m in messages if m.partition() == p)
        assert sum(c for _, _, c in ranges) == len(offsets)
        assert min(f for f, _, _ in ranges) == offsets[0] and max(last for _, last, _ in ranges) == offsets[-1]


def test_complete_mode_writes_each_result(spark: SparkSession, broker: KafkaCluster, tmp_path: Path) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("sc"), 2)
    source, checkpoint, report = tmp_path / "in", tmp_path / "cp", tmp_path / "report.jsonl"
    add_files(spark, source, 0, 40, 2)
    run_to_completion(spark, source, checkpoint, broker.bootstrap, topic, report, mode="complete",
                      query=_counts_by_group)
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    # maxFilesPerTrigger=2 over 2 files: one microbatch with the 4 groups.
    assert [e["records"] for e in entries] == [4]
    got, _ = read_topics(spark, broker.bootstrap, {topic: 4}, to_end=True)
    assert sorted((r.key, r.value) for r in got.collect()) == [(str(k).encode(), b"10") for k in range(4)]


def test_failed_microbatch_fails_the_query_and_is_not_reported(spark: SparkSession, kafka: KafkaCluster,
                                                               tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("sx"), 2)
    source, checkpoint, report = tmp_path / "in", tmp_path / "cp", tmp_path / "report.jsonl"
    add_files(spark, source, 0, 10, 1)

    def bad_partition(df: DataFrame) -> DataFrame:
        return df.select(F.col("name").alias("value"), F.lit(7).alias("partition"))

    df = bad_partition(spark.readStream.schema(SCHEMA).json(str(source)))
    q = (df.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap)
         .option("topic", topic).option("kprod.deliveryReport.path", str(report))
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        q.awaitTermination(300)
    except Exception as exc:  # the query's failure, with the producer's error in it
        assert "partition" in str(exc) and "7" in str(exc)
    else:
        raise AssertionError("the query should have failed")
    finally:
        q.stop()
    assert not report.exists() or report.read_text() == ""


def test_update_mode_is_refused_by_spark_and_works_through_foreach_batch(spark: SparkSession, broker: KafkaCluster,
                                                                         tmp_path: Path) -> None:
    """Spark gives Python data sources no Update mode (its Kafka sink has one); the README's
    way round it, a kprod batch write inside foreachBatch, sends each microbatch's changed
    groups."""
    topic = create_topic(broker.bootstrap, unique_topic("su"), 2)
    source = tmp_path / "in"
    add_files(spark, source, 0, 40, 2)  # one microbatch: every group at 10
    stream = _counts_by_group(spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(str(source)))

    direct = (stream.writeStream.format("kprod").outputMode("update")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic)
              .option("checkpointLocation", str(tmp_path / "cp-direct")).trigger(availableNow=True).start())
    try:
        direct.awaitTermination(120)
    except Exception as exc:
        assert "does not support Update mode" in str(exc)
    else:
        raise AssertionError("Spark accepted Update mode for a Python data source: document and test it directly")
    finally:
        direct.stop()

    def write(batch: DataFrame, batch_id: int) -> None:
        (batch.write.format("kprod").mode("append")
         .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", topic).save())

    def run() -> None:
        q = (stream.writeStream.foreachBatch(write).outputMode("update")
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
        q.awaitTermination(300)
        assert q.exception() is None, q.exception()

    run()
    add_files(spark, source, 40, 2, 1)  # ids 40 and 41: groups 0 and 1 change
    run()
    got, _ = read_topics(spark, broker.bootstrap, {topic: 6}, to_end=True)
    assert sorted((r.key, r.value) for r in got.collect()) == sorted(
        [(str(k).encode(), b"10") for k in range(4)] + [(b"0", b"11"), (b"1", b"11")])
