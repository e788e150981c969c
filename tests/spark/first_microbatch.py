"""Submitted by test_cluster.py with spark-submit: one streaming microbatch (available-now,
every file of INPUT_DIR at once, a task per file) written by SINK, on executors that have
just started. Prints its addBatch time as one JSON line.

    first_microbatch.py SINK BOOTSTRAP TOPIC INPUT_DIR CHECKPOINT

SINK is ``kprod``, ``kafka`` (Spark's own sink, its jars given with --jars) or ``kprodnoop``
(a Python streaming data source whose tasks only read their rows: what any Python sink
pays Spark for its first microbatch, whatever it writes to).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


def register_noop(spark: SparkSession, format_name: str = "kprodnoop") -> None:
    """The ``format_name`` format: a Python sink (streaming and batch) that reads its rows
    and writes nothing."""
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        DataSourceStreamWriter,
        DataSourceWriter,
        WriterCommitMessage,
    )

    class NoopWriter(DataSourceStreamArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
            pass

        def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
            pass

    class NoopBatchWriter(DataSourceArrowWriter):
        def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[WriterCommitMessage | None]) -> None:
            pass

        def abort(self, messages: list[WriterCommitMessage | None]) -> None:
            pass

    class NoopSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return format_name

        def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
            return NoopWriter()

        def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
            return NoopBatchWriter()

    spark.dataSource.register(NoopSource)


def main() -> None:
    sink, bootstrap, topic, source, checkpoint = sys.argv[1:6]
    spark = SparkSession.builder.appName(f"first microbatch: {sink}").getOrCreate()
    if sink == "kprod":
        # --py-files does not reach Spark's lookup of format("kprod"): register it (a no-op
        # need when kprod is installed on the driver, harmless then).
        from spark_sink.spark import KProdDataSource

        spark.dataSource.register(KProdDataSource)
    elif sink == "kprodnoop":
        register_noop(spark)
    query = (spark.readStream.schema("id bigint").option("maxFilesPerTrigger", 1000).json(source)
             .select(F.col("id").cast("string").alias("key"), F.to_json(F.struct("id")).alias("value"))
             .writeStream.format(sink).option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    (progress,) = [p for p in query.recentProgress if p["numInputRows"] > 0]
    print(json.dumps({"sink": sink, "rows": progress["numInputRows"],
                      "addBatchMs": progress["durationMs"]["addBatch"]}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
