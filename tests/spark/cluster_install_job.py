"""A job as a user writes it, for the cluster install tests (tests/spark/test_cluster_installs.py):
a batch write through format("kprod"), found by name (``--register`` registers it first,
as a job with kprod in --py-files must), and which encoder the executors' Python loads.

    spark-submit ... cluster_install_job.py BOOTSTRAP TOPIC ROWS [--register]

Its last line is a JSON object: the executors' encoder modules.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator

from pyspark.sql import SparkSession


def _encoder(_rows: Iterable[int]) -> Iterator[str]:
    from spark_sink.encoder import kernels

    yield kernels.compiled().__name__


def main(bootstrap: str, topic: str, rows: int, register: bool) -> None:
    spark = SparkSession.builder.appName("kprod-cluster-install").getOrCreate()
    if register:
        from spark_sink.spark import KProdDataSource

        spark.dataSource.register(KProdDataSource)
    (spark.range(rows, numPartitions=4).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
     .write.format("kprod").mode("append")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())
    encoders = sorted(set(spark.sparkContext.parallelize(range(4), 4).mapPartitions(_encoder).collect()))
    spark.stop()
    print(json.dumps({"encoders": encoders}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), "--register" in sys.argv[4:])
