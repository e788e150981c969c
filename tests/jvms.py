"""The options of every JVM the suite starts, chosen for CPU: the suite is CPU-bound on
the 2-core CI machine, and most of its JVMs live for seconds.

- C1 only (``-XX:TieredStopAtLevel=1``), for Kafka nodes and Spark JVMs alike: C2's
  compiler threads cost more than they save in that time.
- Spark JVMs (drivers, executors, standalone daemons, the Connect server) also map a
  class-data archive of Spark's classes, made once per venv by ``python -m tests.jvms``
  (``make test`` does it): class loading is most of a Spark JVM's start. Without the
  archive, or when it does not match (another JDK, other jars), they start as usual.

Measured on the CI machine (a local SparkSession, a shuffle and a mapInArrow job): 25 s
of CPU with the JVM's defaults, 15 s with C1 only, 10 s with the archive too. Only for
tests: the benchmarks' JVMs keep their defaults.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

C1_ONLY = ("-XX:TieredStopAtLevel=1",)

# Made per venv: the archive records the jars' sizes and times, which a new venv changes.
SPARK_ARCHIVE = Path(sys.prefix) / "kprod-tests-spark.jsa"

# The variables Spark's launcher adds to the java command line of a spark-submit driver
# (and so of a local session started from Python), of a standalone master or worker, and
# of an executor.
_SPARK_JVM_VARIABLES = ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS", "SPARK_EXECUTOR_OPTS")


def spark_jvm_options() -> tuple[str, ...]:
    """The options of a Spark JVM: C1 only, and the class archive if it has been made (a
    mismatch is not worth a warning: the JVM then loads its classes as usual)."""
    if not SPARK_ARCHIVE.is_file():
        return C1_ONLY
    return (*C1_ONLY, f"-XX:SharedArchiveFile={SPARK_ARCHIVE}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def with_test_jvm_options(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the suite's options for every Spark JVM and Kafka node (a job's own
    local broker reads KAFKA_OPTS) that its processes start."""
    spark = spark_jvm_options()
    for name, options in [*((name, spark) for name in _SPARK_JVM_VARIABLES), ("KAFKA_OPTS", C1_ONLY)]:
        env[name] = " ".join(filter(None, [env.get(name), *options]))
    return env


# What the archive is made from: the classes a Spark driver loads for a shuffle, an Arrow
# UDF, a write and a streaming query.
_WORKLOAD = """
import time
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.appName("kprod-tests-cds").config("spark.ui.enabled", "false").getOrCreate()
df = spark.range(20000, numPartitions=2).select((F.col("id") % 7).alias("k"), F.col("id").cast("string").alias("v"))
df.groupBy("k").count().collect()
df.mapInArrow(lambda batches: batches, df.schema).write.format("noop").mode("overwrite").save()
query = (spark.readStream.format("rate").option("rowsPerSecond", 100).load()
         .writeStream.format("noop").trigger(processingTime="200 milliseconds").start())
time.sleep(2)
query.stop()
spark.stop()
"""


def make_spark_archive() -> Path:
    """Run the workload under spark-submit, whose JVM writes the archive as it exits;
    it is renamed into place only once whole."""
    from pyspark.find_spark_home import _find_spark_home

    partial = SPARK_ARCHIVE.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        workload = Path(scratch, "workload.py")
        workload.write_text(_WORKLOAD)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        done = subprocess.run(
            [str(Path(_find_spark_home(), "bin", "spark-submit")), "--master", "local[2]", "--driver-java-options",
             " ".join([*C1_ONLY, f"-XX:ArchiveClassesAtExit={partial}", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]),
             str(workload)], cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.is_file():
        raise SystemExit(f"making {SPARK_ARCHIVE} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.rename(SPARK_ARCHIVE)
    return SPARK_ARCHIVE


if __name__ == "__main__":
    print(f"tests/jvms.py: made {make_spark_archive()}")
