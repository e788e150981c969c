"""Run by tests/test_versions.py in a venv with another PySpark or another Python: one
batch write and one streaming write (files, available-now, two microbatches) through
kprod, found by name.

    python version_roundtrip.py BOOTSTRAP BATCH_TOPIC STREAM_TOPIC ROWS

Its last line is a JSON object: the PySpark and Python versions it ran, and the module of
the encoder's loops (``kernels.compiled()``) in the driver and in a Spark Python worker.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyspark
from pyspark.sql import SparkSession


def _encoder() -> str:
    """The module the encoder runs its loops from in this process: the wheel's C
    extension, or numba's fallback."""
    from spark_sink.encoder import kernels

    return kernels.compiled().__name__


def _worker_encoder(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: the Python worker's version and encoder, one row."""
    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"python": [sys.version.split()[0]], "encoder": [_encoder()]})


def main(bootstrap: str, batch_topic: str, stream_topic: str, rows: int) -> None:
    spark = (SparkSession.builder.master("local[2]").appName("kprod-versions")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    kafka = {"kafka.bootstrap.servers": bootstrap}
    (spark.range(rows).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
     .write.format("kprod").mode("append").options(**kafka).option("topic", batch_topic).save())

    work = Path(tempfile.mkdtemp(prefix="kprod-versions-"))
    source = work / "in"
    source.mkdir()
    half = rows // 2
    for part, ids in enumerate((range(half), range(half, rows))):
        (source / f"part-{part}.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    query = (spark.readStream.schema("id long").option("maxFilesPerTrigger", 1).json(str(source))
             .selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
             .writeStream.format("kprod").options(**kafka).option("topic", stream_topic)
             .option("checkpointLocation", str(work / "cp")).trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")
    (worker,) = spark.range(1, numPartitions=1).mapInArrow(_worker_encoder, "python string, encoder string").collect()
    spark.stop()
    print(json.dumps({"pyspark": pyspark.__version__, "python": sys.version.split()[0], "driver_encoder": _encoder(),
                      "worker_python": worker.python, "worker_encoder": worker.encoder}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
