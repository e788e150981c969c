"""A file-stream query to Kafka through kprod, for the crash tests: run, killed, rerun from
its checkpoint until it has read every file (availableNow).

    python eos_job.py INPUT_DIR CHECKPOINT BOOTSTRAP TOPIC GUARANTEE FAIL_PROBABILITY SEED [TASKS]

Each task's first attempt fails with FAIL_PROBABILITY, part-way through its rows, drawn
from SEED and the task's first row (a rerun with the same seed fails the same tasks). With
TASKS, each microbatch is repartitioned into that many tasks (a restart may change it).
"""

from __future__ import annotations

import itertools
import os
import random
import sys
from collections.abc import Iterator

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession


def main() -> None:
    input_dir, checkpoint, bootstrap, topic, guarantee, fail_probability, seed = sys.argv[1:8]
    tasks = int(sys.argv[8]) if len(sys.argv) > 8 else 0
    p = float(fail_probability)
    spark = (SparkSession.builder.master("local[2,4]").appName("kprod-eos-test")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "100").getOrCreate())
    source = (spark.readStream.schema("id LONG, payload STRING").option("maxFilesPerTrigger", 2)
              .json(input_dir))

    def flaky(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        ctx = TaskContext.get()
        assert ctx is not None, "runs in a Spark task"
        first = next(batches, None)
        if first is None:
            return
        row = first.column(0)[0].as_py() if first.num_rows else -1
        rng = random.Random(f"{seed}:{row}:{ctx.partitionId()}")
        fail_at = rng.randrange(1, 3) if ctx.attemptNumber() == 0 and rng.random() < p else -1
        for i, batch in enumerate(itertools.chain([first], batches)):
            if i == fail_at:
                raise RuntimeError(f"injected failure of task {ctx.partitionId()} (attempt 0)")
            yield batch

    if tasks:
        source = source.repartition(tasks)
    rows = source.mapInArrow(flaky, source.schema).selectExpr("CAST(id AS STRING) AS key", "payload AS value")
    query = (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
             .option("kprod.deliveryGuarantee", guarantee).option("checkpointLocation", checkpoint)
             # Not the 60 s default: on a loaded machine a microbatch of retried tasks took
             # 48 s, and its commit was refused as too late. Nor can the check below that
             # nothing is left open pass by the killed runs' transactions timing out.
             .option("kafka.transaction.timeout.ms", "600000")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
