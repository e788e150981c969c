"""The driver checks the cluster and the options before any task runs: a dead address, an
unknown topic, a wrong password or a conflicting option fails the write once, on the
driver, with kprod's message right after the one frame Spark shows. Real SparkSession,
Apache Kafka (plain, SASL, and a node that creates no topics on first use)."""

from __future__ import annotations

import socket
import time
import uuid
from contextlib import contextmanager

import pytest
from pyspark.sql import functions as F

from tests.brokers import consume_all, create_topic, unique_topic
from tests.secure_kafka import USERS

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
UNRESOLVABLE = "no-such-broker.invalid:9092"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _df(spark, rows=20, partitions=2):
    return spark.range(rows, numPartitions=partitions).select(F.col("id").cast("string").alias("value"))


def _save(df, bootstrap, **options):
    writer = df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        writer = writer.option(k, v)
    writer.save()


@contextmanager
def _jobs(spark):
    """The ids of the Spark jobs (so, tasks) run inside the block."""
    sc = spark.sparkContext
    group = f"kprod-check-{uuid.uuid4().hex[:8]}"
    sc.setJobGroup(group, "driver check test")
    jobs: list[int] = []
    try:
        yield jobs
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        jobs += sc.statusTracker().getJobIdsForGroup(group)


def _refused(spark, df, bootstrap, **options) -> tuple[str, float]:
    """The error text of a write that must fail on the driver, and how long it took."""
    started = time.monotonic()
    with _jobs(spark) as jobs, pytest.raises(Exception) as err:
        _save(df, bootstrap, **options)
    assert jobs == [], "a task ran"
    return str(err.value), time.monotonic() - started


def _kprod_line(text: str) -> int:
    """Which line of Spark's error text holds kprod's error (its class, then its message)."""
    return next(i for i, line in enumerate(text.splitlines()) if line.startswith("spark_sink."))


def test_a_write_that_works_runs_its_jobs(spark, kafka):
    """The control for every test below: a write that gets past the check runs a job."""
    topic = create_topic(kafka.bootstrap, unique_topic("check-ok"), 2)
    with _jobs(spark) as jobs:
        _save(_df(spark), kafka.bootstrap, topic=topic)
    assert jobs
    assert len(consume_all(kafka.bootstrap, topic, 20)) == 20


def test_dead_addresses_fail_the_write_on_the_driver(spark):
    closed = _closed_port()
    text, seconds = _refused(spark, _df(spark), f"{closed},{UNRESOLVABLE}", topic="t")
    line = text.splitlines()[_kprod_line(text)]
    assert line.startswith("spark_sink.producer.errors.BrokersUnreachableError: cannot reach any bootstrap server")
    assert f"{closed}: connection refused" in line and f"{UNRESOLVABLE}: name not resolved" in line
    assert _kprod_line(text) <= 3  # after Spark's "Traceback" line and one frame
    assert seconds < 30  # tasks used to wait out max.block.ms (60 s) each


def test_per_row_topics_still_check_the_cluster(spark):
    df = _df(spark).withColumn("topic", F.lit("t"))
    text, _ = _refused(spark, df, _closed_port())
    assert "BrokersUnreachableError: cannot reach any bootstrap server" in text


def test_unknown_topic_fails_the_write_on_the_driver(spark, strict_kafka):
    topic = unique_topic("missing")
    text, _ = _refused(spark, _df(spark), strict_kafka.bootstrap, topic=topic)
    assert (f"UnknownTopicError: topic '{topic}' does not exist on the cluster at {strict_kafka.bootstrap}"
            in text.splitlines()[_kprod_line(text)])


def test_unknown_topic_in_the_topic_column_fails_the_task_within_seconds(spark, strict_kafka):
    """The driver cannot know a per-row topic; the task's producer stops at the brokers'
    UNKNOWN_TOPIC_OR_PARTITION answers (2 s of them) instead of max.block.ms (60 s)."""
    topic = unique_topic("missing")
    df = _df(spark, rows=4, partitions=1).withColumn("topic", F.lit(topic))
    started = time.monotonic()
    with pytest.raises(Exception) as err:
        _save(df, strict_kafka.bootstrap)
    assert f"UnknownTopicError: topic '{topic}' does not exist on the cluster at {strict_kafka.bootstrap}" in str(
        err.value)
    assert time.monotonic() - started < 30  # one task attempt (local mode does not retry), not 60 s


def test_wrong_password_fails_the_write_on_the_driver(spark, secure_kafka):
    text, _ = _refused(spark, _df(spark), secure_kafka.bootstrap("SASLPLAIN"), topic=unique_topic("sasl"), **{
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config": f'{SCRAM} required username="spark" password="guessed-wrong";'})
    assert "SaslAuthenticationError: SASL SCRAM-SHA-512 authentication with" in text.splitlines()[_kprod_line(text)]
    assert "guessed-wrong" not in text and USERS["spark"] not in text


@pytest.mark.parametrize(("option", "value", "says"), [
    ("kafka.enable.idempotence", "false", "kafka.enable.idempotence=false (transactions need an idempotent producer)"),
    ("kafka.retries", "0", "kafka.retries=0"),
    ("kafka.max.in.flight.requests.per.connection", "6", "kafka.max.in.flight.requests.per.connection=6 (at most 5"),
    ("kafka.acks", "1", "kafka.acks=1 (transactions need acks=all)"),
])
def test_exactly_once_conflicts_fail_the_write_on_the_driver(spark, kafka, option, value, says):
    text, _ = _refused(spark, _df(spark), kafka.bootstrap, topic=unique_topic("eo"),
                       **{"kprod.deliveryGuarantee": "exactly-once", option: value})
    line = text.splitlines()[_kprod_line(text)]
    assert line.startswith("spark_sink.producer.errors.ConfigError: option kprod.deliveryGuarantee=exactly-once "
                           "conflicts with ")
    assert says in line and "transactional.id" not in text


def test_a_streaming_query_fails_at_its_start(spark, tmp_path):
    closed = _closed_port()
    stream = spark.readStream.format("rate").load().select(F.col("value").cast("string").alias("value"))
    started = time.monotonic()
    with pytest.raises(Exception, match=f"BrokersUnreachableError: cannot reach any bootstrap server of {closed}"):
        query = (stream.writeStream.format("kprod").option("kafka.bootstrap.servers", closed).option("topic", "t")
                 .option("checkpointLocation", str(tmp_path)).start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
    assert time.monotonic() - started < 30


def test_a_failing_task_shows_kprods_message_after_one_frame(spark, kafka):
    topic = create_topic(kafka.bootstrap, unique_topic("task"), 2)
    df = _df(spark, 10, 1).withColumn("partition", F.lit(5))
    with pytest.raises(Exception) as err:
        _save(df, kafka.bootstrap, topic=topic)
    text = str(err.value)
    assert "InvalidPartitionError" in text.splitlines()[_kprod_line(text)]
    assert _kprod_line(text) <= 4  # Spark's "An exception was thrown..." and "Traceback" lines, one frame
