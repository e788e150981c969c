"""A named exactly-once batch write made inside foreachBatch and run again outside it, or
the other way round (found by a review).

README, Guarantees: name a batch write (kprod.transactionalIdPrefix) "and a rerun
completes it ... a write already committed whole writes nothing". A user writes each
microbatch of a stream with a named batch write in foreachBatch (the README's advice for
Update mode), and runs the same named write with the same rows from a plain batch job (a
scheduler retrying a day's load, a backfill). Inside foreachBatch the tasks see the
streaming query's id; a batch write took it for its own and recorded it with its markers,
so a run outside the stream found none of them and wrote every row again. A batch write
now belongs to no query.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import create_topic, unique_topic
from tests.spark.faults import json_input
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _exactly, _write

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@pytest.mark.parametrize("first", [pytest.param("foreachBatch", marks=pytest.mark.soak), "batch job"])
def test_a_named_write_committed_whole_is_not_written_again(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path,
                                                            first: str) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-fb"), partitions=2)
    name = unique_topic("orders-2026-11-27")
    source = json_input(tmp_path, 1, 50)

    def write(df: DataFrame, batch_id: int | None = None) -> None:
        rows = df.select(F.col("id").cast("string").alias("key"), F.lit("v").alias("value")).repartition(2, "key")
        _write(rows, kafka.bootstrap, topic, **{"kprod.transactionalIdPrefix": name})

    def in_foreach_batch() -> None:
        query = (spark.readStream.schema("id LONG").json(str(source)).writeStream.foreachBatch(write)
                 .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None

    def as_a_batch_job() -> None:
        write(spark.read.schema("id LONG").json(str(source)))

    runs = [in_foreach_batch, as_a_batch_job] if first == "foreachBatch" else [as_a_batch_job, in_foreach_batch]
    expected = {str(i) for i in range(50)}
    runs[0]()
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), expected)
    runs[1]()
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), expected)
