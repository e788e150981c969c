"""Through Spark: a microbatch whose driver commit refuses to commit (written by the
skeptical review of branch ``break``; no break found, kept as a regression test).

README, Guarantees: "No transaction outlives a failed write or microbatch, whatever
failed". The harness tests call the writer's abort after a refused commit "as Spark
does"; here Spark itself runs the query: microbatch 1's commit raises
MarkersMissingError (its directory gone, as after offsets.retention.minutes), and the
transactions its tasks prepared must be aborted by Spark's call of the writer's abort,
not left open until transaction.timeout.ms (set far longer than the test).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.spark import exactly_once_names
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, unique_topic
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_time import _committed_values

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery


def test_a_microbatch_whose_commit_is_refused_leaves_nothing_open(spark: SparkSession, kafka: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-refused"), partitions=2)
    source = tmp_path / "in"
    source.mkdir()

    def run() -> StreamingQuery:
        rows = spark.readStream.schema("id LONG").json(str(source)).select(
            F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value"))
        return (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
                .option("kafka.transaction.timeout.ms", "600000")
                .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())

    (source / "a.json").write_text("\n".join(json.dumps({"id": i}) for i in range(10)) + "\n")
    query = run()
    query.awaitTermination(120)
    assert query.exception() is None
    directory = exactly_once_names.directory_group(ExactlyOnce(None, topic).prefix_for(query.id))
    admin = ConfluentAdmin({"bootstrap.servers": kafka.bootstrap})  # kept: its futures need it
    for future in admin.delete_consumer_groups([directory]).values():
        future.result(30)
    (source / "b.json").write_text("\n".join(json.dumps({"id": i}) for i in range(10, 20)) + "\n")
    query = run()
    with pytest.raises(Exception, match="MarkersMissingError"):
        query.awaitTermination(120)
    assert_nothing_left_open(kafka.bootstrap, topic, 2, within_s=5.0)
    values = _committed_values(kafka.bootstrap, topic, 12)
    assert sorted(v for v in values if v != "sentinel") == sorted(str(i) for i in range(10))
