"""A named exactly-once batch write run again after its markers expired (found by a review).

README, Guarantees: "Name the write ... and a rerun completes it ... a write already
committed whole writes nothing." A scheduler runs a named backfill again more than
offsets.retention.minutes (7 days by default) after it succeeded. The markers are gone
then, but the directory (kept a year) records that the commit ended: the rerun writes
nothing. (Before, it failed with MarkersMissingError advising kprod.missingMarkers=ignore,
which then wrote every row a second time.) The broker keeps offsets one minute here
(offsets.retention.minutes=1, checked every second) instead of seven days.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient as ConfluentAdmin
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.spark import exactly_once, exactly_once_names
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, start_kafka, unique_topic
from tests.clock import days_later
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _exactly, _prepared_tasks

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _write(df: DataFrame, bootstrap: str, topic: str, prefix: str) -> None:
    (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
     .option("kprod.transactionalIdPrefix", prefix).save())


@pytest.mark.parametrize("batch_id", [None, 1])
def test_a_commit_ended_whole_is_skipped_when_its_markers_are_gone(kafka: KafkaCluster, batch_id: int | None) -> None:
    """A named batch write (``batch_id`` None) or a microbatch committed whole, run again
    after Kafka dropped its markers: nothing is written twice, nothing is left open."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-done"), partitions=2)
    config = {"bootstrap.servers": kafka.bootstrap}
    query = None if batch_id is None else unique_topic("query")
    eo = ExactlyOnce(unique_topic("orders") if batch_id is None else None, topic, batch=batch_id is None)
    prefix = eo.prefix_for(query)
    if batch_id:  # microbatch 0 had no rows
        exactly_once.commit(config, eo, _prepared_tasks(kafka.bootstrap, prefix, topic, {0: [], 1: []}, query), 0)
    rows = {0: [b"a%d" % i for i in range(5)], 1: [b"b%d" % i for i in range(5)]}
    assert exactly_once.commit(config, eo, _prepared_tasks(kafka.bootstrap, prefix, topic, rows, query),
                               batch_id).transactions == 2
    admin = ConfluentAdmin({"bootstrap.servers": kafka.bootstrap})  # kept: its futures need it
    for future in admin.delete_consumer_groups([exactly_once_names.transactional_id(prefix, p) for p in rows]).values():
        future.result(30)
    again = exactly_once.commit(config, eo, _prepared_tasks(kafka.bootstrap, prefix, topic, rows, query), batch_id,
                                days_later(8))
    assert again == exactly_once.Committed(0, frozenset(rows))
    got = collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, 2))
    assert got == collections.Counter(v.decode() for v in rows[0] + rows[1])


@pytest.mark.soak
def test_a_named_write_run_again_after_its_markers_expired_writes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """The same through Spark, on a broker that drops offsets a minute after their commit."""
    cluster = start_kafka(config={"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000"})
    try:
        topic = cluster.create_topic(unique_topic("eos-named"), 2)
        prefix = unique_topic("orders-2026-11-27")
        df = spark.range(100, numPartitions=2).select(F.col("id").cast("string").alias("key"),
                                                      F.lit("v").alias("value"))
        _write(df, cluster.bootstrap, topic, prefix)
        # The markers (groups <prefix>-N) expire a minute after the commit; the directory
        # (<prefix>-dir, kept a year) stays.
        markers = [exactly_once_names.transactional_id(prefix, p) for p in range(2)]
        with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:
                found = admin.committed_offsets({g: [(topic, 0)] for g in markers})
                if all(found[g][(topic, 0)][0] < 0 for g in markers):
                    break
                time.sleep(2)
            directory = exactly_once_names.directory_group(prefix)
            assert admin.committed_offsets({directory: [(topic, 0)]})[directory][(topic, 0)][0] == 0
        _write(df, cluster.bootstrap, topic, prefix)
        _exactly(assert_nothing_left_open(cluster.bootstrap, topic, 2), {str(i) for i in range(100)})
    finally:
        cluster.stop()
