"""Spark's own Kafka sink and kprod side by side: the behaviours Spark's KafkaSinkSuite
(connector/kafka-0-10-sql) tests, each run through ``format("kafka")`` and
``format("kprod")`` in the one SparkSession of the suite, reading back with an
independent client (confluent-kafka) and asserting the same records, or an error from
both. Where kprod deliberately differs, the test says so (``DIFFERS``) and the README's
"Moving from format('kafka')" table lists it.

Spark's sink is the connector jar of the running Spark (``kprod_broker.spark_kafka_jars``,
on the suite's session: tests/spark/conftest.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

FORMATS = ("kafka", "kprod")
HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
ROUND_ROBIN = "org.apache.kafka.clients.producer.RoundRobinPartitioner"
# Spark's suite writes with a 5 s max.block.ms, so a write that cannot work fails soon.
SPARK_SUITE_OPTIONS = {"kafka.max.block.ms": "5000"}


def save(df: DataFrame, fmt: str, bootstrap: str, topic: str | None = None, mode: str | None = "append",
         **options: str) -> None:
    writer = df.write.format(fmt).option("kafka.bootstrap.servers", bootstrap)
    if mode is not None:
        writer = writer.mode(mode)
    if topic is not None:
        writer = writer.option("topic", topic)
    for key, value in {**SPARK_SUITE_OPTIONS, **options}.items():
        writer = writer.option(key, value)
    writer.save()


def records(bootstrap: str, topic: str, n: int, partitions: bool = False) -> list[tuple]:
    """The records of ``topic`` as (partition or None, key, value, headers), in a stable
    order; partitions only where both sinks must agree on them (keyed or explicit). Read to
    the high watermarks: any record written twice shows."""
    read = consume_all(bootstrap, topic, n, to_end=True)
    assert len(read) == n, f"{len(read)} records in {topic}, expected {n}"
    rows = [(m.partition() if partitions else None, m.key(), m.value(), tuple(m.headers() or ())) for m in read]
    return sorted(rows, key=repr)


def both(bootstrap: str, make: Callable[[str], DataFrame], n: int, partitions: int = 1, *,
         same_partitions: bool = False, topic_option: bool = True, options: Mapping[str, str] | None = None,
         ) -> dict[str, list[tuple]]:
    """Write ``make(topic)`` through each sink (with ``options``) to a new topic; the records each wrote."""
    out = {}
    for fmt in FORMATS:
        topic = create_topic(bootstrap, unique_topic(f"parity-{fmt}"), partitions)
        # A write that must work may wait for metadata longer than the suite's 5 s: on a
        # loaded machine Spark's producer once took longer to see a topic just created.
        save(make(topic), fmt, bootstrap, topic if topic_option else None,
             **{"kafka.max.block.ms": "60000", **(options or {})})
        out[fmt] = records(bootstrap, topic, n, same_partitions)
    return out


def errors(write: Callable[[str], None]) -> dict[str, str]:
    """The error text each sink's write raised (each must raise)."""
    out = {}
    for fmt in FORMATS:
        with pytest.raises(Exception) as err:
            write(fmt)
        out[fmt] = str(err.value)
    return out


def test_topic_column(spark: SparkSession, kafka: KafkaCluster) -> None:
    """KafkaSinkSuite "write to kafka with topic field": no topic option, a topic column."""
    got = both(kafka.bootstrap, lambda t: spark.range(5).selectExpr(f"'{t}' AS topic", "CAST(id AS STRING) AS value"),
               5, topic_option=False)
    assert got["kafka"] == got["kprod"] == [(None, None, str(i).encode(), ()) for i in range(5)]


def test_topic_option(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"write w/o topic field, with topic option"."""
    got = both(kafka.bootstrap, lambda t: spark.range(5).selectExpr("CAST(id AS STRING) AS value"), 5)
    assert got["kafka"] == got["kprod"] and len(got["kprod"]) == 5


def test_topic_option_overrides_the_topic_column(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"topic field and topic option": the records go to the option's topic, none to 'foo'."""
    got = both(kafka.bootstrap, lambda t: spark.range(5).selectExpr("'foo' AS topic", "CAST(id AS STRING) AS value"),
               5)
    assert got["kafka"] == got["kprod"] and len(got["kprod"]) == 5


def test_headers_with_nulls(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"batch - write to kafka": a headers column, one row's headers null."""
    data = [("1", [("a", b"b")]), ("2", [("c", b"d"), ("e", b"f")]), ("3", [("g", b"h"), ("g", b"i")]),
            ("4", None), ("5", [("j", b"k"), ("j", b"l"), ("m", b"n")])]
    schema = StructType([StructField("value", StringType()), StructField("headers", HEADERS)])
    got = both(kafka.bootstrap, lambda t: spark.createDataFrame(data, schema), 5)
    assert got["kafka"] == got["kprod"]
    assert (None, None, b"4", ()) in got["kprod"] and (None, None, b"2", (("c", b"d"), ("e", b"f"))) in got["kprod"]


def test_keys_go_to_the_same_partitions(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"partition column and partitioner priorities", default partitioner: Java's murmur2
    in both, so every keyed record lands in the same partition."""
    make = lambda t: spark.range(20).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")  # noqa: E731
    got = both(kafka.bootstrap, make, 20, partitions=4, same_partitions=True)
    assert got["kafka"] == got["kprod"] and len({r[0] for r in got["kprod"]}) > 1


def test_null_partitions_leave_it_to_the_partitioner(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"when the partition column value is null, it is ignored": keys decide, as above."""
    make = lambda t: spark.range(20).selectExpr(  # noqa: E731
        "CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value", "CAST(NULL AS INT) AS partition")
    got = both(kafka.bootstrap, make, 20, partitions=4, same_partitions=True)
    assert got["kafka"] == got["kprod"]


def test_partition_column_overrides_the_partitioner_class(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"partition column overrides custom partitioner" (Java's RoundRobinPartitioner here:
    Spark's suite's TestKafkaPartitioner is a test class, not in the connector jar)."""
    make = lambda t: spark.range(5).selectExpr(  # noqa: E731
        "CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value", "2 AS partition")
    got = both(kafka.bootstrap, make, 5, partitions=4, same_partitions=True,
               options={"kafka.partitioner.class": ROUND_ROBIN})
    assert got["kafka"] == got["kprod"] and {r[0] for r in got["kprod"]} == {2}


def test_round_robin_partitioner_class(spark: SparkSession, kafka: KafkaCluster) -> None:
    """kafka.partitioner.class=RoundRobinPartitioner: keys are ignored and records spread
    over every partition. Which record lands where is not compared: Java's partitioner is
    called twice for a record that starts a new batch (KAFKA-9965), kprod's once."""
    make = lambda t: spark.range(1, numPartitions=1).selectExpr(  # noqa: E731
        "explode(sequence(0, 15)) AS id").selectExpr("'same key' AS key", "CAST(id AS STRING) AS value")
    got = both(kafka.bootstrap, make, 16, partitions=4, same_partitions=True,
               options={"kafka.partitioner.class": ROUND_ROBIN})
    for fmt in FORMATS:
        assert len({r[0] for r in got[fmt]}) > 1, fmt
    assert sorted(r[1:] for r in got["kafka"]) == sorted(r[1:] for r in got["kprod"])


def test_custom_partitioner(spark: SparkSession, kafka: KafkaCluster) -> None:
    """DIFFERS: Spark's sink takes a JVM class (its suite's TestKafkaPartitioner returns 0);
    kprod takes a Python function by import path, and refuses a Java class name on the driver."""
    topic = create_topic(kafka.bootstrap, unique_topic("parity-custom"), 4)
    df = spark.range(5).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    save(df, "kprod", kafka.bootstrap, topic, **{"kafka.partitioner.class": "tests.spark.partitioners:always_zero"})
    assert {r[0] for r in records(kafka.bootstrap, topic, 5, partitions=True)} == {0}
    with pytest.raises(Exception, match=r"kafka.partitioner.class.*'org.apache.spark.sql.kafka010.TestKafkaPartitioner'"
                                        r" is not a Python callable"):
        save(df, "kprod", kafka.bootstrap, topic,
             **{"kafka.partitioner.class": "org.apache.spark.sql.kafka010.TestKafkaPartitioner"})


def test_null_topic_and_no_topic_option(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"null topic field value, and no topic option": an error from both."""
    df = spark.createDataFrame([(None, "1")], "topic string, value string")
    text = errors(lambda fmt: save(df, fmt, kafka.bootstrap))
    assert "contains a null topic" in text["kafka"]
    assert "column 'topic' is null at row 0 and no default topic is set" in text["kprod"]


@pytest.mark.parametrize(("select", "kafka_says", "kprod_says"), [
    (["CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value"], "topic option required",
     "no topic"),
    (["'t' AS topic", "CAST(id AS STRING) AS key"], "required attribute 'value' not found", "'value' is required"),
    (["CAST(1 AS INT) AS topic", "CAST(id AS STRING) AS value"], "topic must be a(n) string", "column 'topic'"),
    (["'t' AS topic", "CAST(id AS INT) AS value"], "value must be a(n) string or binary", "column 'value'"),
    (["'t' AS topic", "CAST(id AS INT) AS key", "CAST(id AS STRING) AS value"], "key must be a(n) string or binary",
     "column 'key'"),
    (["'t' AS topic", "CAST(id AS STRING) AS value", "CAST(id AS STRING) AS partition"], "partition must be a(n) int",
     "column 'partition'"),
])
def test_missing_and_mistyped_columns(spark: SparkSession, kafka: KafkaCluster, select: list[str], kafka_says: str,
                                      kprod_says: str) -> None:
    """"write data with bad schema" and "valid schema but wrong types": errors from both."""
    df = spark.range(2).selectExpr(*select)
    text = errors(lambda fmt: save(df, fmt, kafka.bootstrap))
    assert kafka_says in text["kafka"].lower() or kafka_says in text["kafka"], text["kafka"]
    assert kprod_says in text["kprod"], text["kprod"]


def test_unknown_topic(spark: SparkSession, strict_kafka: KafkaCluster) -> None:
    """"write to non-existing topic" (brokers that create no topic on first use): an error
    from both; Spark's task after max.block.ms (5 s here), kprod on the driver at once."""
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    topic = unique_topic("parity-missing")
    text = errors(lambda fmt: save(df, fmt, strict_kafka.bootstrap, topic))
    assert topic in text["kafka"] and f"UnknownTopicError: topic '{topic}' does not exist" in text["kprod"]


@pytest.mark.parametrize("key", ["kafka.key.serializer", "kafka.value.serializer"])
def test_serializer_options(spark: SparkSession, kafka: KafkaCluster, key: str) -> None:
    """"exception on config serializer": both refuse it and name it."""
    df = spark.range(1).selectExpr("CAST(id AS STRING) AS value")
    text = errors(lambda fmt: save(df, fmt, kafka.bootstrap, "t", **{key: "foo"}))
    assert f"Kafka option '{key[6:]}' is not supported" in text["kafka"]
    assert f"option '{key}' is not supported" in text["kprod"]


@pytest.mark.parametrize("mode", ["ignore", "overwrite"])
def test_unsupported_save_modes(spark: SparkSession, kafka: KafkaCluster, mode: str) -> None:
    """"unsupported save modes": an error from both."""
    df = spark.range(1).selectExpr("CAST(id AS STRING) AS value")
    text = errors(lambda fmt: save(df, fmt, kafka.bootstrap, "t", mode=mode))
    assert mode.capitalize() in text["kafka"] or "truncate" in text["kafka"]
    assert mode in text["kprod"].lower()


def test_no_save_mode(spark: SparkSession, kafka: KafkaCluster) -> None:
    """DIFFERS: without .mode() Spark's sink appends; Spark refuses it for every Python
    data source (UNSUPPORTED_DATA_SOURCE_SAVE_MODE), before kprod is called."""
    topic = create_topic(kafka.bootstrap, unique_topic("parity-nomode"), 1)
    df = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    save(df, "kafka", kafka.bootstrap, topic, mode=None)
    assert len(records(kafka.bootstrap, topic, 3)) == 3
    with pytest.raises(Exception, match=r'UNSUPPORTED_DATA_SOURCE_SAVE_MODE.*"ErrorIfExists"'):
        save(df, "kprod", kafka.bootstrap, topic, mode=None)


def test_to_json_struct_values(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"SPARK-20496: batch - enforce analyzed plans": to_json(struct(*)) values."""
    got = both(kafka.bootstrap, lambda t: spark.range(1, 1000).select(F.to_json(F.struct("*")).alias("value")), 999)
    assert got["kafka"] == got["kprod"] and (None, None, b'{"id":1}', ()) in got["kprod"]


def test_big_values_with_a_small_buffer(spark: SparkSession, kafka: KafkaCluster) -> None:
    """"write big data with small producer buffer": values of 15000 bytes through
    buffer.memory=16384, sends waiting for the buffer rather than failing. The buffer holds
    one value at a time: 100 values wait for it 99 times (Spark's suite writes 1000, 15 MB
    a sink for the same waits)."""
    make = lambda t: spark.range(100, numPartitions=1).select(  # noqa: E731
        F.expr("unhex(repeat('00', 15000))").alias("value"))
    for fmt in FORMATS:
        topic = create_topic(kafka.bootstrap, unique_topic(f"parity-big-{fmt}"), 1)
        save(make(topic), fmt, kafka.bootstrap, topic, **{"kafka.buffer.memory": "16384",
                                                         "kafka.block.on.buffer.full": "true"})
        read = consume_all(kafka.bootstrap, topic, 100, timeout=60, to_end=True)
        assert len(read) == 100 and all(len(m.value()) == 15000 for m in read), fmt


def test_extra_columns_and_read_options_are_ignored(spark: SparkSession, kafka: KafkaCluster) -> None:
    """Not in KafkaSinkSuite, what jobs do: select("*") brings columns beside key/value,
    and read options (includeHeaders) are copied into writes; both sinks ignore them."""
    make = lambda t: spark.range(5).selectExpr("id", "CAST(id AS STRING) AS value", "current_date() AS day")  # noqa: E731
    got = both(kafka.bootstrap, make, 5, options={"includeHeaders": "true"})
    assert got["kafka"] == got["kprod"] and len(got["kprod"]) == 5


def test_timestamp_column(spark: SparkSession, kafka: KafkaCluster) -> None:
    """DIFFERS: Spark's sink ignores a 'timestamp' column (records get the send time);
    kprod writes it as each record's timestamp."""
    given = 1_600_000_000_000
    make = lambda t: spark.range(3).selectExpr(  # noqa: E731
        "CAST(id AS STRING) AS value", f"timestamp_millis({given}) AS timestamp")
    stamps = {}
    for fmt in FORMATS:
        topic = create_topic(kafka.bootstrap, unique_topic(f"parity-ts-{fmt}"), 1)
        save(make(topic), fmt, kafka.bootstrap, topic)
        stamps[fmt] = {m.timestamp()[1] for m in consume_all(kafka.bootstrap, topic, 3, to_end=True)}
    assert stamps["kprod"] == {given}
    assert all(ts > given for ts in stamps["kafka"])


def _stream(spark: SparkSession, source_dir: Path, fmt: str, bootstrap: str, topic: str, checkpoint: str,
            mode: str = "append") -> StreamingQuery:
    df = (spark.readStream.schema("id long").json(str(source_dir))
          .selectExpr("CAST(id AS STRING) AS value"))
    return (df.writeStream.format(fmt).outputMode(mode).trigger(availableNow=True)
            .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
            .option("checkpointLocation", checkpoint).start())


def test_streaming_sink_progress(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path) -> None:
    """"streaming - sink progress is produced": sink.numOutputRows is 3 in both."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(1, 4)))
    for fmt in FORMATS:
        topic = create_topic(kafka.bootstrap, unique_topic(f"parity-stream-{fmt}"), 1)
        query = _stream(spark, source, fmt, kafka.bootstrap, topic, str(tmp_path / f"cp-{fmt}"))
        try:
            query.awaitTermination(120)
            deadline = time.monotonic() + 10  # the last progress is posted after the batch
            while not any(p["sink"]["numOutputRows"] == 3 for p in query.recentProgress) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert [p["sink"]["numOutputRows"] for p in query.recentProgress if p["numInputRows"]] == [3], fmt
        finally:
            query.stop()
        assert sorted(m.value() for m in consume_all(kafka.bootstrap, topic, 3, to_end=True)) == [b"1", b"2", b"3"]


def test_update_mode(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path) -> None:
    """DIFFERS: Spark's suite runs its progress test in Update mode, which Spark offers no
    Python data source: kprod's query fails at its first microbatch (use foreachBatch)."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-0.json").write_text('{"id": 1}\n')
    topic = create_topic(kafka.bootstrap, unique_topic("parity-update"), 1)
    for fmt in FORMATS:
        query = _stream(spark, source, fmt, kafka.bootstrap, topic, str(tmp_path / f"cp-{fmt}"), mode="update")
        try:
            if fmt == "kafka":
                query.awaitTermination(120)
                assert query.exception() is None
            else:
                with pytest.raises(Exception, match="kprod does not support Update mode"):
                    query.awaitTermination(120)
        finally:
            query.stop()
