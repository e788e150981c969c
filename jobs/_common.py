"""What every job shares: command-line options, conf/ files, the Spark session, the broker.

Jobs run with ``python jobs/<job>.py`` or ``spark-submit jobs/<job>.py``; either way this
directory is first on sys.path, so ``import _common`` works.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

# Spark's Python workers must run this interpreter, the one that has kprod installed.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Loopback unless told otherwise: the jobs default to a local master and a local broker.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"

log = logging.getLogger("kprod.jobs")


def say(message: str) -> None:
    """Jobs talk to the person running them on stderr; stdout stays for results."""
    print(f"[kprod] {message}", file=sys.stderr, flush=True)


def docstring_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """A script's parser: its docstring's first paragraph as the description, the rest as
    the epilog, kept as written."""
    return argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog=doc.split("\n\n", 1)[1])


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options every job has: where Kafka is, the topic, producer and Spark settings."""
    parser.add_argument("--bootstrap-servers", metavar="HOST:PORT[,...]",
                        help="Kafka cluster to write to; without it a local Apache Kafka node is started for "
                             "the job (its jars are fetched once into ~/.cache/kprod)")
    parser.add_argument("--topic", default="kprod-demo", help="topic to write to (default: %(default)s)")
    parser.add_argument("--broker-feature", action="append", default=[], metavar="NAME=LEVEL",
                        help="a feature level the local broker is formatted with, e.g. transaction.version=1 "
                             "(Kafka's transaction protocol v1; 4.x finalizes 2) (repeatable)")
    parser.add_argument("--partitions", type=int, default=6,
                        help="partitions when the job creates the topic (local broker or --create-topic; "
                             "default: %(default)s)")
    parser.add_argument("--create-topic", action="store_true",
                        help="create --topic on --bootstrap-servers first (needs confluent-kafka)")
    parser.add_argument("--producer-config", default=str(CONF / "producer.properties"), metavar="FILE",
                        help="producer settings file (default: conf/producer.properties)")
    parser.add_argument("--producer-prop", action="append", default=[], metavar="KEY=VALUE",
                        help="producer setting overriding the file, e.g. linger.ms=10 (repeatable)")
    parser.add_argument("--spark-config", default=str(CONF / "spark-defaults.conf"), metavar="FILE",
                        help="Spark settings file (default: conf/spark-defaults.conf)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="Spark setting overriding the file and spark-submit, e.g. "
                             "spark.master=local[4] (repeatable)")


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"{what}: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def _config_lines(path: str, comment_marks: str) -> Iterator[tuple[str, str]]:
    """(raw, stripped) for each line of ``path`` that is neither blank nor a comment; a
    missing file has none."""
    file = Path(path)
    if not file.exists():
        return
    for raw in file.read_text().splitlines():
        line = raw.strip()
        if line and line[0] not in comment_marks:
            yield raw, line


def read_properties(path: str) -> dict[str, str]:
    """Java-style properties: key=value (or key: value) lines; # and ! start comments."""
    out: dict[str, str] = {}
    for raw, line in _config_lines(path, "#!"):
        for sep in ("=", ":"):
            if sep in line:
                key, value = line.split(sep, 1)
                out[key.strip()] = value.strip()
                break
        else:
            raise SystemExit(f"{path}: expected key=value, got {raw!r}")
    return out


def read_spark_defaults(path: str) -> dict[str, str]:
    """spark-defaults.conf: key, whitespace, value."""
    out: dict[str, str] = {}
    for _, line in _config_lines(path, "#"):
        parts = line.split(None, 1)
        out[parts[0]] = parts[1].strip() if len(parts) > 1 else ""
    return out


def producer_options(args: argparse.Namespace, bootstrap: str) -> dict[str, str]:
    """kafka.* options for the kprod sink: the file, then --producer-prop, then the broker."""
    settings = read_properties(args.producer_config)
    settings.update(_pairs(args.producer_prop, "--producer-prop"))
    settings["bootstrap.servers"] = bootstrap
    return {f"kafka.{k}": v for k, v in settings.items()}


def spark_session(args: argparse.Namespace, app_name: str):
    """A SparkSession: conf file values unless spark-submit set them, then --conf."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # Under spark-submit the JVM started this process and its settings (--master, --conf)
    # win over the file; under plain python, the JVM pyspark launches carries defaults of
    # its own (local[*], progress bars) that the file replaces.
    under_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    SparkContext._ensure_initialized()
    conf = SparkConf()
    for key, value in read_spark_defaults(args.spark_config).items():
        if under_spark_submit:
            conf.setIfMissing(key, value)
        else:
            conf.set(key, value)
    for key, value in _pairs(args.conf, "--conf").items():
        conf.set(key, value)
    conf.setIfMissing("spark.app.name", app_name)
    spark = SparkSession.builder.config(conf=conf).getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("KPROD_SPARK_LOG_LEVEL", "WARN"))
    # The pyspark_kprod module registers "kprod" on its own once installed; registering
    # here keeps the jobs working from a source checkout that is not installed. Only then:
    # over the installed one, Spark warns that it replaced a statically registered source.
    if not _kprod_registered(spark):
        from spark_sink.spark import KProdDataSource

        spark.dataSource.register(KProdDataSource)
    return spark


def _kprod_registered(spark) -> bool:
    """Whether Spark already knows the "kprod" data source (found by its discovery of
    ``pyspark_*`` modules). Spark has no Python API for this: its session state is asked,
    and anything unexpected there counts as not registered."""
    try:
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists("kprod"))
    except Exception:  # another Spark's internals: register, as before
        return False


def stop_spark() -> None:
    """Stop the job's Spark session, if it started one. Left to the process's exit, the
    JVM dies under Spark's Python workers and the driver's accumulator server while they
    still read and write: each prints a traceback (BrokenPipeError in pyspark/daemon.py,
    EOFError in accumulators.py) after the job's own last lines."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()


@contextlib.contextmanager
def kafka_cluster(args: argparse.Namespace) -> Iterator[str]:
    """The bootstrap address: --bootstrap-servers, or a local Apache Kafka node for the
    job's life. At the end the job's Spark stops first, then the node: Spark's Python
    workers keep their producers (and connections) between tasks."""
    if args.bootstrap_servers:
        if args.create_topic:
            create_topic(args.bootstrap_servers, args.topic, args.partitions)
        try:
            yield args.bootstrap_servers
        finally:
            stop_spark()
        return
    from kprod_broker import KAFKA_VERSION, start_local_kafka

    say(f"no --bootstrap-servers given: starting Apache Kafka {KAFKA_VERSION} (one KRaft node) on loopback")
    features = {}
    for name, level in _pairs(args.broker_feature, "--broker-feature").items():
        if not level.isdigit():
            raise SystemExit(f"--broker-feature {name}: expected a level (a whole number), got {level!r}")
        features[name] = int(level)
    broker = start_local_kafka(args.topic, args.partitions, heap="1g", features=features)
    args.broker_pid = broker.nodes[0].pid
    say(f"Apache Kafka serves at {broker.bootstrap}; created topic {args.topic} with {args.partitions} partitions")
    try:
        yield broker.bootstrap
    finally:
        try:
            stop_spark()
        finally:
            broker.stop()
            say("local broker stopped")


@contextlib.contextmanager
def given_or_local_kafka(bootstrap: str | None) -> Iterator[str]:
    """``bootstrap`` if given, else that of a local Apache Kafka node started for the block."""
    if bootstrap is not None:
        yield bootstrap
        return
    from kprod_broker import start_local_kafka

    cluster = start_local_kafka()
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


def noop_data_source(source_name: str) -> type:
    """A Python data source named ``source_name`` that takes Spark's Arrow batches and
    drops them: what Spark costs a Python sink, the floor the benchmarks measure kprod
    against. The classes are made in this function because Spark's workers cannot import
    jobs/ or bench/: a class of an imported module is pickled by reference, a class made
    in a function by value (cloudpickle)."""
    from dataclasses import dataclass

    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    @dataclass(frozen=True)
    class Dropped(WriterCommitMessage):
        rows: int

    class NoopWriter(DataSourceArrowWriter):
        def write(self, iterator):
            return Dropped(sum(batch.num_rows for batch in iterator))

    class NoopDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return source_name

        def writer(self, schema, overwrite):
            return NoopWriter()

    return NoopDataSource


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` unless it exists, ready to be written (``create_topics``)."""
    from confluent_kafka.admin import AdminClient

    if topic in AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics:
        say(f"topic {topic} exists")
        return
    create_topics(bootstrap, [topic], partitions)
    say(f"created topic {topic} with {partitions} partitions")


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    """Create the topics (confluent-kafka's admin client) and wait until every partition
    has a leader and a log."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, num_partitions=partitions, replication_factor=1)
                                       for n in names]).values():
        future.result(60)
    deadline = time.monotonic() + 60
    for name in names:
        while True:
            meta = admin.list_topics(name, timeout=10).topics.get(name)
            if (meta is not None and meta.error is None and len(meta.partitions) == partitions
                    and all(p.leader >= 0 for p in meta.partitions.values())):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"topic {name}: no leader for every partition after 60 s")
            time.sleep(0.05)
    # A leader in the metadata is not yet a log on the broker: a loaded broker took a second
    # to create 64 partitions' logs, and Spark's sink, answered NOT_LEADER_OR_FOLLOWER
    # meanwhile, then met OutOfOrderSequence until its batches expired (the broker's log,
    # 2026-11-29; bench_sink.py's Spark-sink round the same way on a fresh 6-partition
    # topic). ListOffsets answers once every log is there.
    while True:
        try:
            end_offsets(bootstrap, names, partitions)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def end_offsets(bootstrap: str, names: list[str], partitions: int) -> int:
    """The sum of the topics' end offsets (one ListOffsets round)."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = {TopicPartition(n, p): OffsetSpec.latest() for n in names for p in range(partitions)}
    return sum(f.result(60).offset for f in admin.list_offsets(request).values())


def setup_logging() -> None:
    """Show the sink's INFO lines (commit summaries) next to the job's own messages."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("spark_sink.spark").setLevel(logging.INFO)
