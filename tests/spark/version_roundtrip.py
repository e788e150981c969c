"""Run by tests/test_versions.py in a venv with another PySpark: one batch write and one
streaming write (files, available-now, two microbatches) through kprod, found by name.

    python version_roundtrip.py BOOTSTRAP BATCH_TOPIC STREAM_TOPIC ROWS

Prints the PySpark version it ran, as its last line.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession


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
    spark.stop()
    print(pyspark.__version__)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
