"""The driver checks the cluster and the options before any task runs: a dead address, an
unknown topic, a wrong password or a conflicting option fails the write once, on the
driver, with kprod's message right after the one frame Spark shows. The check runs once per
query (and per settings, for a foreachBatch loop's writes), not per microbatch: counted as
connections through a fault proxy in front of the bootstrap address. Real SparkSession,
Apache Kafka (plain, SASL, and a node that creates no topics on first use)."""

from __future__ import annotations

import pickle
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.spark.driver_check import CheckCache, check_cache, check_write, forget_check
from spark_sink.spark.options import parse_options
from spark_sink.spark.source import KProdDataSource
from tests.brokers import consume_all, create_topic, unique_topic
from tests.clock import MovedClock
from tests.faultproxy import FaultProxy
from tests.secure_kafka import USERS, SecureKafka

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
UNRESOLVABLE = "no-such-broker.invalid:9092"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _df(spark: SparkSession, rows: int = 20, partitions: int = 2) -> DataFrame:
    return spark.range(rows, numPartitions=partitions).select(F.col("id").cast("string").alias("value"))


def _save(df: DataFrame, bootstrap: str, **options: str) -> None:
    writer = df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()


@contextmanager
def _jobs(spark: SparkSession) -> Iterator[list[int]]:
    """The ids of the Spark jobs (so, tasks) run inside the block."""
    sc = spark.sparkContext
    group = f"kprod-check-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "driver check test")
    jobs: list[int] = []
    try:
        yield jobs
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]  # None unsets it (PySpark's own doc)
        jobs += sc.statusTracker().getJobIdsForGroup(group)


def _refused(spark: SparkSession, df: DataFrame, bootstrap: str, **options: str) -> str:
    """The error text of a write that must fail on the driver: no job ran (no task waited
    out max.block.ms)."""
    with _jobs(spark) as jobs, pytest.raises(Exception) as err:
        _save(df, bootstrap, **options)
    assert jobs == [], "a task ran"
    return str(err.value)


def _kprod_line(text: str) -> int:
    """Which line of Spark's error text holds kprod's error (its class, then its message)."""
    return next(i for i, line in enumerate(text.splitlines()) if line.startswith("spark_sink."))


def test_a_write_that_works_runs_its_jobs(spark: SparkSession, kafka: KafkaCluster) -> None:
    """The control for every test below: a write that gets past the check runs a job."""
    topic = create_topic(kafka.bootstrap, unique_topic("check-ok"), 2)
    with _jobs(spark) as jobs:
        _save(_df(spark), kafka.bootstrap, topic=topic)
    assert jobs
    assert len(consume_all(kafka.bootstrap, topic, 20, to_end=True)) == 20


def test_dead_addresses_fail_the_write_on_the_driver(spark: SparkSession) -> None:
    closed = _closed_port()
    text = _refused(spark, _df(spark), f"{closed},{UNRESOLVABLE}", topic="t")
    line = text.splitlines()[_kprod_line(text)]
    assert line.startswith("spark_sink.client.errors.BrokersUnreachableError: cannot reach any bootstrap server")
    assert f"{closed}: connection refused" in line and f"{UNRESOLVABLE}: name not resolved" in line
    assert _kprod_line(text) <= 3  # after Spark's "Traceback" line and one frame


def test_per_row_topics_still_check_the_cluster(spark: SparkSession) -> None:
    df = _df(spark).withColumn("topic", F.lit("t"))
    text = _refused(spark, df, _closed_port())
    assert "BrokersUnreachableError: cannot reach any bootstrap server" in text


def test_unknown_topic_fails_the_write_on_the_driver(spark: SparkSession, strict_kafka: KafkaCluster) -> None:
    topic = unique_topic("missing")
    text = _refused(spark, _df(spark), strict_kafka.bootstrap, topic=topic)
    assert (f"UnknownTopicError: topic '{topic}' does not exist on the cluster at {strict_kafka.bootstrap}"
            in text.splitlines()[_kprod_line(text)])


def test_unknown_topic_in_the_topic_column_fails_the_task_within_seconds(spark: SparkSession,
                                                                         strict_kafka: KafkaCluster) -> None:
    """The driver cannot know a per-row topic; the task's producer stops at the brokers'
    UNKNOWN_TOPIC_OR_PARTITION answers (2 s of them) instead of max.block.ms (60 s): its
    error says which it waited for (not a timed assertion, which a loaded machine breaks)."""
    topic = unique_topic("missing")
    df = _df(spark, rows=4, partitions=1).withColumn("topic", F.lit(topic))
    with pytest.raises(Exception) as err:
        _save(df, strict_kafka.bootstrap)
    assert f"UnknownTopicError: topic '{topic}' does not exist on the cluster at {strict_kafka.bootstrap}" in str(
        err.value)
    assert "(waited 2000 ms of UNKNOWN_TOPIC_OR_PARTITION answers)" in str(err.value)


def test_wrong_password_fails_the_write_on_the_driver(spark: SparkSession, secure_kafka: SecureKafka) -> None:
    text = _refused(spark, _df(spark), secure_kafka.bootstrap("SASLPLAIN"), topic=unique_topic("sasl"), **{
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM} required username="spark" password="guessed-wrong";'})
    assert "SaslAuthenticationError: SASL SCRAM-SHA-512 authentication with" in text.splitlines()[_kprod_line(text)]
    assert "guessed-wrong" not in text and USERS["spark"] not in text


@pytest.mark.parametrize(("option", "value", "says"), [
    ("kafka.enable.idempotence", "false", "kafka.enable.idempotence=false (transactions need an idempotent producer)"),
    ("kafka.retries", "0", "kafka.retries=0"),
    ("kafka.max.in.flight.requests.per.connection", "6",
     "kafka.max.in.flight.requests.per.connection=6 (transactions need an idempotent producer, "
     "whose max.in.flight.requests.per.connection must be at most 5)"),
    ("kafka.acks", "1", "kafka.acks=1 (transactions need an idempotent producer, whose acks must be all)"),
])
def test_exactly_once_conflicts_fail_the_write_on_the_driver(spark: SparkSession, kafka: KafkaCluster, option: str,
                                                             value: str, says: str) -> None:
    text = _refused(spark, _df(spark), kafka.bootstrap, topic=unique_topic("eo"),
                       **{"kprod.deliveryGuarantee": "exactly-once", option: value})
    line = text.splitlines()[_kprod_line(text)]
    assert line.startswith("spark_sink.client.errors.ConfigError: option kprod.deliveryGuarantee=exactly-once "
                           "conflicts with ")
    assert says in line and "transactional.id" not in text


def test_a_streaming_query_fails_at_its_start(spark: SparkSession, tmp_path: Path) -> None:
    closed = _closed_port()
    stream = spark.readStream.format("rate").load().select(F.col("value").cast("string").alias("value"))
    # The driver's check's words: a task would say "no broker answered within ... max.block.ms".
    with pytest.raises(Exception, match=f"BrokersUnreachableError: cannot reach any bootstrap server of {closed}"):
        query = (stream.writeStream.format("kprod").option("kafka.bootstrap.servers", closed).option("topic", "t")
                 .option("checkpointLocation", str(tmp_path)).start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()


def test_a_failing_task_shows_kprods_message_after_one_frame(spark: SparkSession, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("task"), 2)
    df = _df(spark, 10, 1).withColumn("partition", F.lit(5))
    with pytest.raises(Exception) as err:
        _save(df, kafka.bootstrap, topic=topic)
    text = str(err.value)
    assert "InvalidPartitionError" in text.splitlines()[_kprod_line(text)]
    assert _kprod_line(text) <= 4  # Spark's "An exception was thrown..." and "Traceback" lines, one frame


def _proxy(kafka: KafkaCluster) -> FaultProxy:
    """A proxy in front of the node's plain listener, used as the bootstrap address only:
    the producers' connections to the leader go straight to the node (its advertised
    address), so the proxy sees the driver's checks and each new producer's bootstrap."""
    host, port = kafka.bootstrap.split(",")[0].rsplit(":", 1)
    return FaultProxy(host, int(port))


def _closed(proxy: FaultProxy) -> int:
    """Connections through the proxy that have ended: a check closes its connection as soon
    as it has its answer, a pooled producer keeps its own (a task that lands on a Python
    worker without one makes a producer, which must not count as a check)."""
    time.sleep(0.5)  # the proxy sees a close a moment after the client made it
    return proxy.connections_accepted - proxy.open_connections


def test_a_passed_check_stands_until_forgotten_or_expired(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("cached"), 1)
    options = parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic})
    clock = MovedClock()
    cache = CheckCache(tmp_path / "checks", ttl_s=1.0, clock=clock)
    assert check_write(options, cache) is True  # asked the cluster
    assert check_write(options, cache) is False  # remembered
    # Settings the check does not depend on share its entry; a different topic does not.
    assert check_write(parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                                      "kafka.linger.ms": "50"}), cache) is False
    other = parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": unique_topic("other")})
    assert check_write(other, cache) is True
    forget_check(options, cache)  # as an aborted write does
    assert check_write(options, cache) is True
    clock.advance(1100)
    assert check_write(options, cache) is True  # expired
    assert check_write(options, cache) is False  # remembered again, as of the clock's time
    assert (tmp_path / "checks").stat().st_mode & 0o777 == 0o700


def test_a_failed_check_is_never_remembered(strict_kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = unique_topic("later")
    options = parse_options({"kafka.bootstrap.servers": strict_kafka.bootstrap, "topic": topic})
    cache = CheckCache(tmp_path / "checks")
    for _ in range(2):
        with pytest.raises(Exception, match="UnknownTopicError|does not exist"):
            check_write(options, cache)
    create_topic(strict_kafka.bootstrap, topic, 1)
    assert check_write(options, cache) is True
    assert list((tmp_path / "checks").iterdir()) == [(tmp_path / "checks" / cache.key(options.producer_config,
                                                                                     [topic]))]


def test_a_cache_directory_of_someone_else_is_not_used(kafka: KafkaCluster, tmp_path: Path) -> None:
    shared = tmp_path / "checks"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # writable by others: its entries cannot be trusted
    options = parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": unique_topic("shared")})
    cache = CheckCache(shared)
    assert check_write(options, cache) is True
    assert check_write(options, cache) is True
    assert list(shared.iterdir()) == []


def test_the_commit_runners_copy_of_the_source_checks_nothing() -> None:
    """Spark pickles the data source made at a query's start only for the driver's commit
    runner, which asks for a writer per microbatch to commit it: no check there."""
    options = {"kafka.bootstrap.servers": _closed_port(), "topic": "t"}
    schema = _schema()
    with pytest.raises(Exception, match="BrokersUnreachableError|cannot reach any bootstrap server"):
        KProdDataSource(options).streamWriter(schema, False)
    copy = pickle.loads(pickle.dumps(KProdDataSource(options)))
    assert copy.streamWriter(schema, False).options.topic == "t"


def _schema() -> StructType:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField("value", StringType())])


def test_a_streaming_query_checks_the_cluster_once(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path) -> None:
    """Several microbatches: after the first, no more checks (before, the planner's and
    the commit runner's checks added two per microbatch: two microbatches show that)."""
    topic = create_topic(kafka.bootstrap, unique_topic("once"), 2)
    with _proxy(kafka) as proxy:
        stream = (spark.readStream.format("rate").option("rowsPerSecond", 20).option("numPartitions", 2).load()
                  .select(F.col("value").cast("string").alias("value")))
        query = (stream.writeStream.format("kprod").option("kafka.bootstrap.servers", f"127.0.0.1:{proxy.port}")
                 .option("topic", topic).option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            def done() -> int:
                return len([p for p in query.recentProgress if p["numInputRows"] > 0])

            deadline = time.monotonic() + 120
            while done() < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            after_first = _closed(proxy)
            first_batches = done()
            while done() < first_batches + 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            later = _closed(proxy) - after_first
            batches = done() - first_batches
        finally:
            query.stop()
    assert batches >= 2, f"only {batches} more microbatches with rows"
    assert after_first >= 1  # the first microbatch's check
    assert later == 0, f"{later} more check(s) over {batches} microbatches"


def test_a_foreachbatch_loops_writes_check_once(spark: SparkSession, kafka: KafkaCluster) -> None:
    """Batch writes with the same settings one after the other, as a foreachBatch loop
    makes them: the first checks, the rest reuse its result."""
    topic = create_topic(kafka.bootstrap, unique_topic("loop"), 2)
    with _proxy(kafka) as proxy:
        bootstrap = f"127.0.0.1:{proxy.port}"
        _save(_df(spark), bootstrap, topic=topic)
        after_first = _closed(proxy)
        for _ in range(2):
            _save(_df(spark), bootstrap, topic=topic)
        later = _closed(proxy) - after_first
    assert after_first >= 1  # the first write's check
    assert later == 0, f"{later} more check(s) over 2 writes"
    assert len(consume_all(kafka.bootstrap, topic, 60, to_end=True)) == 60


def test_an_aborted_write_is_checked_again(spark: SparkSession, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("again"), 2)
    options = parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic})
    key = CheckCache.key(options.producer_config, [topic])
    _save(_df(spark), kafka.bootstrap, topic=topic)
    assert check_cache().passed_recently(key)  # the driver's planner remembered it
    with pytest.raises(Exception, match="InvalidPartitionError"):
        _save(_df(spark, 10, 1).withColumn("partition", F.lit(5)), kafka.bootstrap, topic=topic)
    assert not check_cache().passed_recently(key)  # the abort forgot it
