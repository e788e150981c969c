"""The options of every JVM the suite starts, chosen for CPU: the suite is CPU-bound on
the 2-core CI machine, and most of its JVMs live for seconds.

- C1 only (``-XX:TieredStopAtLevel=1``), for Kafka nodes and Spark JVMs alike: C2's
  compiler threads cost more than they save in that time.
- Each JVM maps a class-data archive of its classes, made by ``python -m tests.jvms``
  (``make test`` does it): class loading is most of a short JVM's start. Spark's is made
  once per venv (its jars are new in each); Kafka's once per Kafka version and JDK, in
  kprod_broker's cache. Without an archive, or when one does not match (another JDK,
  other jars), a JVM starts as usual.

Measured on the CI machine: a local SparkSession, a shuffle and a mapInArrow job took 25 s
of CPU with the JVM's defaults, 15 s with C1 only, 10 s with the archive too; a Kafka
node's format, start, a transaction and stop 5.5 s with C1 only, 3.8 s with the archive.
Only for tests: the benchmarks' JVMs keep their defaults.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kprod_broker import KAFKA_VERSION, KafkaCluster, cache_dir, java

C1_ONLY = ("-XX:TieredStopAtLevel=1",)
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")  # a mismatched archive is not worth a warning

# Made per venv: the archive records the jars' sizes and times, which a new venv changes.
SPARK_ARCHIVE = Path(sys.prefix) / "kprod-tests-spark.jsa"


@functools.cache
def kafka_archive() -> Path:
    """Where Kafka's archive is kept: by Kafka version and JDK (its binary and build time),
    beside the jars it is made from, which keep their times."""
    binary = Path(os.path.realpath(shutil.which(java()) or java()))
    stamp = f"{binary}:{binary.stat().st_mtime_ns}" if binary.exists() else "none"
    jdk = hashlib.sha1(stamp.encode()).hexdigest()[:10]
    return cache_dir() / "cds" / f"kafka-{KAFKA_VERSION}-jdk{jdk}.jsa"


def kafka_jvm_options() -> tuple[str, ...]:
    """The options of a Kafka node's JVMs (its storage format and the node)."""
    archive = kafka_archive()
    return (*C1_ONLY, f"-XX:SharedArchiveFile={archive}", *_QUIET) if archive.is_file() else C1_ONLY


# The variables Spark's launcher adds to the java command line of a spark-submit driver
# (and so of a local session started from Python) and of a standalone master or worker. A
# standalone worker starts executors with spark.executor.extraJavaOptions instead.
_SPARK_JVM_VARIABLES = ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")


def spark_jvm_options() -> tuple[str, ...]:
    """The options of a Spark JVM: C1 only, and the class archive if it has been made (a
    mismatch is not worth a warning: the JVM then loads its classes as usual)."""
    if not SPARK_ARCHIVE.is_file():
        return C1_ONLY
    return (*C1_ONLY, f"-XX:SharedArchiveFile={SPARK_ARCHIVE}", *_QUIET)


def with_test_jvm_options(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the suite's options for every Spark JVM and Kafka node (a job's own
    local broker reads KAFKA_OPTS) that its processes start."""
    spark = spark_jvm_options()
    for name, options in [*((name, spark) for name in _SPARK_JVM_VARIABLES), ("KAFKA_OPTS", kafka_jvm_options())]:
        env[name] = " ".join(filter(None, [env.get(name), *options]))
    return env


# What the archive is made from: the classes a Spark driver loads for a shuffle, an Arrow
# UDF, writes and a file-stream query (run in a scratch directory).
_WORKLOAD = """
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.builder.appName("kprod-tests-cds").config("spark.ui.enabled", "false").getOrCreate()
df = spark.range(20000, numPartitions=2).select((F.col("id") % 7).alias("k"), F.col("id").cast("string").alias("v"))
df.groupBy("k").count().collect()
df.mapInArrow(lambda batches: batches, df.schema).write.format("noop").mode("overwrite").save()
df.write.json("in")
query = spark.readStream.schema(df.schema).json("in").writeStream.format("noop").trigger(availableNow=True).start()
query.awaitTermination()
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
             " ".join([*C1_ONLY, f"-XX:ArchiveClassesAtExit={partial}", *_QUIET]),
             str(workload)], cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.is_file():
        raise SystemExit(f"making {SPARK_ARCHIVE} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    partial.rename(SPARK_ARCHIVE)
    return SPARK_ARCHIVE


def make_kafka_archive() -> Path:
    """A node's start, a topic and a transaction, and its stop: its JVM writes the archive
    as it exits (after the format's, when StorageTool runs: kprod_broker keeps its output)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from spark_sink.producer import KafkaProducer, ProducerRecord

    archive = kafka_archive()
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    cluster = KafkaCluster(1, jvm_args=[*C1_ONLY, f"-XX:ArchiveClassesAtExit={partial}", *_QUIET])
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics([NewTopic("t", 3, 1)])["t"].result(60)
        del admin  # before the node stops, or it retries the connection meanwhile
        with KafkaProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "archive"}) as producer:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(ProducerRecord("t", b"v"))
            producer.commit_transaction()
    finally:
        cluster.stop()
    if not partial.is_file():
        raise SystemExit(f"making {archive} failed: the node wrote no archive\n{cluster.logs()[-3000:]}")
    partial.rename(archive)
    return archive


if __name__ == "__main__":
    if not SPARK_ARCHIVE.is_file():
        print(f"tests/jvms.py: made {make_spark_archive()}")
    if not kafka_archive().is_file():
        print(f"tests/jvms.py: made {make_kafka_archive()}")
