"""The options of every JVM the suite starts, chosen for CPU: the suite is CPU-bound on
the 2-core CI machine, and most of its JVMs live for seconds.

- C1 only (``-XX:TieredStopAtLevel=1``), for Kafka nodes and Spark JVMs alike: C2's
  compiler threads cost more than they save in that time.
- Each JVM maps a class-data archive of its classes, made by ``python -m tests.jvms``
  (``make test`` does it), once per machine and JDK, in kprod_broker's cache: class loading
  is most of a short JVM's start. Without an archive, or when one does not match (another
  JDK, other jars), a JVM starts as usual.
- The archive records each classpath jar's path, size and time, which every new venv
  changes: so the suite's Spark JVMs run Spark's jars from one home per machine (and per
  PySpark and jars), hardlinked once from the first venv's PySpark into the cache
  (``spark_home``), through SPARK_HOME. The tests of what a user's install does
  (test_quickstart, test_jars, tests/installs.py's venvs, the version matrix) keep their
  own PySpark's.

Measured on the CI machine: a local SparkSession, a shuffle and a mapInArrow job took 25 s
of CPU with the JVM's defaults, 15 s with C1 only, 10 s with the archive too; a Kafka
node's format, start, a transaction and stop 5.5 s with C1 only, 3.8 s with the archive.
Only for tests: the benchmarks' JVMs keep their defaults.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kprod_broker import KAFKA_VERSION, KafkaCluster, cache_dir, java
from tests.bytecode import add_bytecode

C1_ONLY = ("-XX:TieredStopAtLevel=1",)
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")  # a mismatched archive is not worth a warning


@functools.cache
def _jdk() -> str:
    """The JDK an archive is made by and for: its binary and build time, hashed."""
    binary = Path(os.path.realpath(shutil.which(java()) or java()))
    stamp = f"{binary}:{binary.stat().st_mtime_ns}" if binary.exists() else "none"
    return hashlib.sha1(stamp.encode()).hexdigest()[:10]


def _publish(partial: Path, final: Path) -> None:
    """Give ``partial`` the name ``final`` unless another run published one meanwhile: a
    published file is never replaced (JVMs of concurrent runs may be mapping it)."""
    with contextlib.suppress(FileExistsError):
        os.link(partial, final)
    partial.unlink()


@contextlib.contextmanager
def _maker(archive: Path) -> Iterator[bool]:
    """True for the one run on the machine that may make ``archive`` now: another run
    making it (concurrent clones share the cache) will publish it, and this one does not
    spend the CPU again."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.with_name(archive.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield not archive.is_file()


@functools.cache
def kafka_archive() -> Path:
    """Where Kafka's archive is kept: by Kafka version and JDK, beside the jars it is made
    from, which keep their times."""
    return cache_dir() / "cds" / f"kafka-{KAFKA_VERSION}-jdk{_jdk()}.jsa"


def kafka_jvm_options() -> tuple[str, ...]:
    """The options of a Kafka node's JVMs (its storage format and the node)."""
    archive = kafka_archive()
    return (*C1_ONLY, f"-XX:SharedArchiveFile={archive}", *_QUIET) if archive.is_file() else C1_ONLY


def _pyspark() -> Path:
    """The venv's PySpark: its jars, scripts and workers' zips."""
    import pyspark

    return Path(pyspark.__file__).parent


@functools.cache
def _machine_spark_home() -> Path:
    """Where the machine's copy of this PySpark's home is kept: by version and the jars'
    names and sizes (a wheel of one version has the same jars in every venv)."""
    import pyspark

    root = _pyspark() / "jars"
    jars = sorted((str(jar.relative_to(root)), jar.stat().st_size) for jar in root.rglob("*") if jar.is_file())
    digest = hashlib.sha1(repr(jars).encode()).hexdigest()[:10]
    return cache_dir() / "spark" / f"{pyspark.__version__}-{digest}"


def spark_home() -> Path:
    """The SPARK_HOME of the suite's Spark JVMs: the machine's (``make_spark_home``) once
    made, else the venv's PySpark."""
    home = _machine_spark_home()
    return home if home.is_dir() else _pyspark()


def spark_archive() -> Path:
    """Where the Spark JVMs' archive is kept: beside the machine's home, by JDK."""
    home = _machine_spark_home()
    return home.with_name(f"{home.name}-jdk{_jdk()}.jsa")


# What a Spark JVM and its Python workers use of a home: the launch scripts, the jars, and
# the zips put first on the workers' path.
_HOME_PARTS = ("bin", "sbin", "jars", "python")


def _link_or_copy(source: str, target: str) -> None:
    """A hardlink (no disk) where the cache shares the venv's filesystem, else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def make_spark_home() -> Path:
    """The machine's home, made from the venv's PySpark into a temporary name and renamed
    into place whole; never changed after: every later venv of this PySpark reuses it, and
    the archive keeps matching its jars (their inodes, and so their times, are the cache's
    from then on; a jar of the first venv touched in place touches the home's too: the
    archive is then refused and the JVMs start as usual). The workers' zips get their
    bytecode (tests/bytecode.py says why)."""
    home = _machine_spark_home()
    if home.is_dir():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{home.name}.", suffix=".partial", dir=home.parent))
    try:
        for part in _HOME_PARTS:
            shutil.copytree(_pyspark() / part, partial / part, copy_function=_link_or_copy,
                            ignore=shutil.ignore_patterns("__pycache__"))
        for archive in (partial / "python" / "lib").glob("*.zip"):
            add_bytecode(archive)  # writes a new file: the venv's stays as it is
        partial.chmod(0o755)
        try:
            partial.rename(home)
        except OSError:
            if not home.is_dir():
                raise
            # Another run published it first.
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return home


# The variables Spark's launcher adds to the java command line of a spark-submit driver
# (and so of a local session started from Python) and of a standalone master or worker. A
# standalone worker starts executors with spark.executor.extraJavaOptions instead.
_SPARK_JVM_VARIABLES = ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS")


def spark_jvm_options() -> tuple[str, ...]:
    """The options of a Spark JVM of ``spark_home()``: C1 only, and the class archive if it
    has been made (a mismatch is not worth a warning: the JVM then loads its classes as
    usual)."""
    archive = spark_archive()
    if not archive.is_file():
        return C1_ONLY
    return (*C1_ONLY, f"-XX:SharedArchiveFile={archive}", *_QUIET)


def with_test_jvm_options(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the suite's Spark home and options for every Spark JVM and Kafka node
    (a job's own local broker reads KAFKA_OPTS) that its processes start."""
    spark = spark_jvm_options()
    for name, options in [*((name, spark) for name in _SPARK_JVM_VARIABLES), ("KAFKA_OPTS", kafka_jvm_options())]:
        env[name] = " ".join(filter(None, [env.get(name), *options]))
    env["SPARK_HOME"] = str(spark_home())
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
    """Run the workload under the machine home's spark-submit, whose JVM writes the archive
    as it exits; it is published only once whole."""
    home, archive = make_spark_home(), spark_archive()
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory() as scratch:
        workload = Path(scratch, "workload.py")
        workload.write_text(_WORKLOAD)
        env = {**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        done = subprocess.run(
            [str(home / "bin" / "spark-submit"), "--master", "local[2]", "--driver-java-options",
             " ".join([*C1_ONLY, f"-XX:ArchiveClassesAtExit={partial}", *_QUIET]),
             str(workload)], cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise SystemExit(f"making {archive} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    _publish(partial, archive)
    return archive


def make_kafka_archive() -> Path:
    """A node's start, a topic and a transaction, and its stop: its JVM writes the archive
    as it exits (after the format's, when StorageTool runs: kprod_broker keeps its output)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from spark_sink.producer import KafkaProducer, ProducerRecord

    archive = kafka_archive()
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
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
    _publish(partial, archive)
    return archive


def main(arguments: list[str]) -> None:
    """``home``: the machine's Spark home only (quick: links); else the archives too, each
    unless made already or being made by another run."""
    print(f"tests/jvms.py: Spark home {make_spark_home()}")
    if arguments == ["home"]:
        return
    for archive, make in ((spark_archive(), make_spark_archive), (kafka_archive(), make_kafka_archive)):
        with _maker(archive) as mine:
            if mine:
                print(f"tests/jvms.py: made {make()}")


if __name__ == "__main__":
    main(sys.argv[1:])
