"""kprod.errors.tolerance=all on a real Kafka and a local Spark: good rows mixed with each
kind of bad row at random positions and proportions (seeded), batch and streaming,
at-least-once and exactly-once. Every good row arrives once in its topic, every bad row
once in the dead-letter topic with its kprod.errors.* headers (read back with
confluent-kafka), the counts of the delivery report match, a stream runs on past them,
and an exactly-once query stopped and restarted writes neither kind twice."""

from __future__ import annotations

import collections
import json
import random
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kprod_broker import KafkaCluster
from spark_sink.producer import ConfigError
from spark_sink.spark.options import parse_options
from tests.brokers import consume_to_marks, create_topic, unique_topic

MAX_REQUEST = 20_000
INVALID_TOPIC = "no spaces allowed!"
# A bad row's kind -> the error class its dead letter must name.
BAD = {
    "too_large": "RecordTooLargeError",
    "invalid_topic": "InvalidTopicException",
    "null_topic": "ColumnError",
    "bad_partition": "InvalidPartitionError",
}
READ_COMMITTED = {"isolation.level": "read_committed"}


def _kinds(rng: random.Random, n: int) -> list[str]:
    """``n`` row kinds: good and every bad kind, in random proportions at random positions."""
    kinds = ["good", *BAD]
    weights = [rng.uniform(0.5, 3.0)] + [rng.uniform(0.0, 1.0) for _ in BAD]
    return rng.choices(kinds, weights, k=n)


def _write_input(directory: Path, kinds: list[str], files: int) -> None:
    directory.mkdir()
    per_file = -(-len(kinds) // files)
    for f in range(files):
        rows = [{"id": i, "kind": kinds[i]} for i in range(f * per_file, min(len(kinds), (f + 1) * per_file))]
        (directory / f"{f:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _as_records(df: DataFrame, good_topic: str) -> DataFrame:
    kind = F.col("kind")
    return df.select(
        F.col("id").cast("string").alias("key"),
        F.when(kind == "too_large", F.repeat(F.lit("x"), MAX_REQUEST + 100))
         .otherwise(F.concat(F.lit("row-"), F.col("id").cast("string"))).alias("value"),
        F.when(kind == "invalid_topic", F.lit(INVALID_TOPIC)).when(kind == "null_topic", F.lit(None))
         .otherwise(F.lit(good_topic)).alias("topic"),
        F.when(kind == "bad_partition", F.lit(99)).otherwise(F.lit(None)).cast("int").alias("partition"))


def _options(bootstrap: str, good_topic: str, dead_topic: str | None, report: Path, guarantee: str) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": bootstrap, "kafka.max.request.size": str(MAX_REQUEST),
            "kprod.errors.tolerance": "all", "kprod.deliveryReport.path": str(report),
            "kprod.deliveryGuarantee": guarantee}
    if dead_topic:
        opts["kprod.errors.deadLetterTopic"] = dead_topic
    if guarantee == "exactly-once":
        opts["kprod.markerTopic"] = good_topic
    return opts


def _check(bootstrap: str, kinds: list[str], good_topic: str, dead_topic: str, report: Path, guarantee: str,
           streaming: bool) -> None:
    """Every good row once in ``good_topic``, every bad row once in ``dead_topic`` with its
    headers, and the report's counts."""
    overrides = READ_COMMITTED if guarantee == "exactly-once" else None
    good = [i for i, k in enumerate(kinds) if k == "good"]
    bad = {i: k for i, k in enumerate(kinds) if k != "good"}
    got = consume_to_marks(bootstrap, good_topic, overrides=overrides)
    assert sorted(m.value() for m in got) == sorted(b"row-%d" % i for i in good)
    letters = consume_to_marks(bootstrap, dead_topic, overrides=overrides)
    assert sorted(int(m.key()) for m in letters) == sorted(bad)
    for m in letters:
        i = int(m.key())
        headers = {k: v.decode() for k, v in m.headers()}
        assert headers["kprod.errors.class"] == BAD[bad[i]], headers
        assert headers["kprod.errors.message"]
        assert int(headers["kprod.errors.timestamp"]) > 0
        assert "kprod.errors.stage.id" in headers and "kprod.errors.task.id" in headers
        assert ("kprod.errors.batch.id" in headers) == streaming
        if bad[i] == "too_large":
            assert m.value() is None  # what made it too large stays out of the dead letter
        else:
            assert m.value() == b"row-%d" % i
        expected_topic = {"invalid_topic": INVALID_TOPIC, "null_topic": None}.get(bad[i], good_topic)
        assert headers.get("kprod.errors.topic") == expected_topic
        assert headers.get("kprod.errors.partition") == ("99" if bad[i] == "bad_partition" else None)
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    refused: collections.Counter[str] = collections.Counter()
    for line in lines:
        refused.update(line["refusedRows"])
        assert line["deadLetterTopic"] == dead_topic
    assert dict(refused) == dict(collections.Counter(BAD[k] for k in bad.values()))
    assert sum(line["deadLetters"] for line in lines) == len(bad)
    assert sum(line["records"] for line in lines) == len(good)


def _topics(bootstrap: str) -> tuple[str, str]:
    return (create_topic(bootstrap, unique_topic("good"), 3), create_topic(bootstrap, unique_topic("dlq"), 2))


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
# Seed 0 of each guarantee in the suite; the other seeds in make soak (pytest -m soak).
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.soak)])
def test_batch_write_sends_bad_rows_to_the_dead_letter_topic(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path,
                                                             guarantee: str, seed: int) -> None:
    rng = random.Random(seed * 10 + len(guarantee))
    good_topic, dead_topic = _topics(kafka.bootstrap)
    kinds = _kinds(rng, rng.choice([40, 400, 3000]))
    _write_input(tmp_path / "in", kinds, rng.choice([1, 3]))
    report = tmp_path / "report.jsonl"
    df = _as_records(spark.read.schema("id bigint, kind string").json(str(tmp_path / "in")), good_topic)
    df.write.format("kprod").options(**_options(kafka.bootstrap, good_topic, dead_topic, report, guarantee)) \
        .mode("append").save()
    _check(kafka.bootstrap, kinds, good_topic, dead_topic, report, guarantee, streaming=False)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_a_stream_runs_on_past_bad_rows(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path, guarantee: str) -> None:
    rng = random.Random(7 + len(guarantee))
    good_topic, dead_topic = _topics(kafka.bootstrap)
    kinds = _kinds(rng, 900)
    _write_input(tmp_path / "in", kinds, 6)
    report = tmp_path / "report.jsonl"
    stream = spark.readStream.schema("id bigint, kind string").option("maxFilesPerTrigger", 2) \
        .json(str(tmp_path / "in"))
    q = (_as_records(stream, good_topic).writeStream.format("kprod")
         .options(**_options(kafka.bootstrap, good_topic, dead_topic, report, guarantee))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    assert len(report.read_text().splitlines()) == 3  # three microbatches, each past its bad rows
    _check(kafka.bootstrap, kinds, good_topic, dead_topic, report, guarantee, streaming=True)


def test_an_exactly_once_query_stopped_mid_way_and_restarted_writes_neither_twice(
        spark: SparkSession, kafka: KafkaCluster, tmp_path: Path) -> None:
    """Stopped once the second microbatch's tasks are done (before, in or after its
    commit), then restarted from the checkpoint."""
    from tests.spark.test_exactly_once_stop_restart import _wait_for_commit_phase

    rng = random.Random(11)
    good_topic, dead_topic = _topics(kafka.bootstrap)
    kinds = _kinds(rng, 600)
    _write_input(tmp_path / "in", kinds, 3)
    report = tmp_path / "report.jsonl"
    opts = _options(kafka.bootstrap, good_topic, dead_topic, report, "exactly-once")

    def start(available_now: bool) -> StreamingQuery:
        stream = spark.readStream.schema("id bigint, kind string").option("maxFilesPerTrigger", 1) \
            .json(str(tmp_path / "in"))
        writer = (_as_records(stream.repartition(2), good_topic).writeStream.format("kprod").options(**opts)
                  .option("checkpointLocation", str(tmp_path / "cp")))
        return (writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="1 second")).start()

    q = start(available_now=False)
    _wait_for_commit_phase(spark, 2)  # the first microbatch's write job
    q.stop()
    q = start(available_now=True)
    q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    overrides = READ_COMMITTED
    good = [i for i, k in enumerate(kinds) if k == "good"]
    bad = [i for i, k in enumerate(kinds) if k != "good"]
    got = consume_to_marks(kafka.bootstrap, good_topic, overrides=overrides)
    assert sorted(m.value() for m in got) == sorted(b"row-%d" % i for i in good)
    letters = consume_to_marks(kafka.bootstrap, dead_topic, overrides=overrides)
    assert sorted(int(m.key()) for m in letters) == bad


def test_max_ratio_fails_the_write_naming_ratio_and_reason(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path) -> None:
    good_topic, dead_topic = _topics(kafka.bootstrap)
    kinds = ["good", "too_large", "too_large", "bad_partition"] * 25
    _write_input(tmp_path / "in", kinds, 2)
    report = tmp_path / "report.jsonl"
    opts = _options(kafka.bootstrap, good_topic, dead_topic, report, "exactly-once")
    opts["kprod.errors.maxRatio"] = "0.5"
    df = _as_records(spark.read.schema("id bigint, kind string").json(str(tmp_path / "in")), good_topic)
    with pytest.raises(Exception, match=r"75 of 100 rows \(75.0%\).*maxRatio=0.5.*RecordTooLargeError \(50 rows\)"):
        df.write.format("kprod").options(**opts).mode("append").save()
    # Aborted: neither kind is visible to read_committed consumers.
    assert consume_to_marks(kafka.bootstrap, good_topic, overrides=READ_COMMITTED) == []
    assert consume_to_marks(kafka.bootstrap, dead_topic, overrides=READ_COMMITTED) == []
    assert not report.exists()


def test_a_missing_dead_letter_topic_fails_on_the_driver(spark: SparkSession, strict_kafka: KafkaCluster) -> None:
    good_topic = create_topic(strict_kafka.bootstrap, unique_topic("good"), 1)
    missing = unique_topic("nodlq")
    df = spark.createDataFrame([("k", "v")], "key string, value string")
    with pytest.raises(Exception, match=rf"kprod.errors.deadLetterTopic.*{missing}"):
        df.write.format("kprod").option("kafka.bootstrap.servers", strict_kafka.bootstrap) \
            .option("topic", good_topic).option("kprod.errors.tolerance", "all") \
            .option("kprod.errors.deadLetterTopic", missing).mode("append").save()
    assert consume_to_marks(strict_kafka.bootstrap, good_topic) == []


def test_a_missing_topic_is_a_bad_row_without_a_dead_letter_topic(spark: SparkSession, strict_kafka: KafkaCluster,
                                                                  tmp_path: Path) -> None:
    """On a cluster that creates no topic on first use; no dead-letter topic: dropped, counted."""
    good_topic = create_topic(strict_kafka.bootstrap, unique_topic("good"), 1)
    missing = unique_topic("missing")
    report = tmp_path / "report.jsonl"
    rows = [(str(i), f"row-{i}", missing if i % 3 == 0 else good_topic) for i in range(60)]
    spark.createDataFrame(rows, "key string, value string, topic string").write.format("kprod") \
        .option("kafka.bootstrap.servers", strict_kafka.bootstrap).option("kprod.errors.tolerance", "all") \
        .option("kprod.deliveryReport.path", str(report)).mode("append").save()
    got = consume_to_marks(strict_kafka.bootstrap, good_topic)
    assert sorted(m.value() for m in got) == sorted(f"row-{i}".encode() for i in range(60) if i % 3)
    (line,) = [json.loads(x) for x in report.read_text().splitlines()]
    assert (line["refusedRows"], line["deadLetters"], line["deadLetterTopic"]) == ({"UnknownTopicError": 20}, 0, None)


@pytest.mark.parametrize("options, match", [
    ({"kprod.errors.tolerance": "some"}, "expected none or all"),
    ({"kprod.errors.deadLetterTopic": "dlq"}, "only with kprod.errors.tolerance=all"),
    ({"kprod.errors.tolerance": "all", "kprod.errors.maxRatio": "1.5"}, "fraction from 0 to 1"),
    ({"kprod.errors.tolerance": "all", "kprod.errors.deadLetterTopic": "a b"}, "not a valid Kafka topic"),
])
def test_bad_options_are_refused(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_options({"kafka.bootstrap.servers": "h:1", "topic": "t", **options})


def test_tolerance_parsed() -> None:
    opts = parse_options({"kafka.bootstrap.servers": "h:1", "topic": "t", "kprod.errors.tolerance": "ALL",
                          "kprod.errors.deadLetterTopic": "dlq", "kprod.errors.maxRatio": "0.25"})
    assert opts.errors is not None
    assert (opts.errors.dead_letter_topic, opts.errors.max_ratio) == ("dlq", 0.25)
    assert parse_options({"kafka.bootstrap.servers": "h:1", "topic": "t"}).errors is None


def test_a_broker_killed_mid_write_makes_no_dead_letters(spark: SparkSession, kafka3: KafkaCluster, tmp_path: Path) -> None:
    """The leader of a partition SIGKILLed and restarted while a tolerance=all write runs
    (a topic column too, whose metadata the kill disturbs): the producer retries through
    the election as ever, every row arrives once, and not one becomes a dead letter."""
    import threading

    from confluent_kafka import TopicPartition

    from tests.brokers import consumer
    from tests.failover import FAILOVER_CONFIG, bounce_leader

    topic = kafka3.create_topic(unique_topic("dlq-failover"), 3)
    dead_topic = kafka3.create_topic(unique_topic("dlq"), 1)
    rows = 100_000
    report = tmp_path / "report.jsonl"
    df = spark.range(rows, numPartitions=2).select(
        (F.col("id") % 17).cast("string").alias("key"), F.col("id").cast("string").alias("value"),
        F.lit(topic).alias("topic"))
    writer = (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka3.bootstrap)
              .option("kafka.batch.size", "16384").option("kafka.max.in.flight.requests.per.connection", "1")
              .option("kprod.errors.tolerance", "all").option("kprod.errors.deadLetterTopic", dead_topic)
              .option("kprod.deliveryReport.path", str(report)))
    for key, value in FAILOVER_CONFIG.items():
        writer = writer.option(f"kafka.{key}", str(value))
    killed_at: list[float] = []

    def bounce_mid_write() -> None:
        check = consumer(kafka3.bootstrap)
        try:  # once the tasks are writing
            while check.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] < 1000:
                time.sleep(0.05)
        finally:
            check.close()
        bounce_leader(kafka3, topic, times=1, pause=0.3, killed_at=killed_at)

    bounce = threading.Thread(target=bounce_mid_write)
    bounce.start()
    try:
        writer.save()
        saved_at = time.monotonic()
    finally:
        bounce.join(180)
    assert killed_at and saved_at > killed_at[0]  # the leader died mid-write
    messages = consume_to_marks(kafka3.bootstrap, topic, timeout=120)
    assert sorted(int(m.value()) for m in messages) == list(range(rows))
    assert consume_to_marks(kafka3.bootstrap, dead_topic, timeout=120) == []
    (line,) = [json.loads(x) for x in report.read_text().splitlines()]
    assert (line["refusedRows"], line["deadLetters"]) == ({}, 0)


def test_a_named_exactly_once_write_run_again_writes_neither_twice(spark: SparkSession, kafka: KafkaCluster,
                                                                   tmp_path: Path) -> None:
    """A named batch write (kprod.transactionalIdPrefix) run a second time is a replay whose
    tasks an earlier run committed: its good rows and its dead letters, sent again by the
    second run's tasks, are aborted with their transactions."""
    rng = random.Random(23)
    good_topic, dead_topic = _topics(kafka.bootstrap)
    kinds = _kinds(rng, 500)
    _write_input(tmp_path / "in", kinds, 2)
    report = tmp_path / "report.jsonl"
    opts = {**_options(kafka.bootstrap, good_topic, dead_topic, report, "exactly-once"),
            "kprod.transactionalIdPrefix": f"dlq-rerun-{rng.random():.8f}"}
    df = _as_records(spark.read.schema("id bigint, kind string").json(str(tmp_path / "in")), good_topic)
    for _ in range(2):
        df.write.format("kprod").options(**opts).mode("append").save()
    good = [i for i, k in enumerate(kinds) if k == "good"]
    bad = [i for i, k in enumerate(kinds) if k != "good"]
    got = consume_to_marks(kafka.bootstrap, good_topic, overrides=READ_COMMITTED)
    assert sorted(m.value() for m in got) == sorted(b"row-%d" % i for i in good)
    letters = consume_to_marks(kafka.bootstrap, dead_topic, overrides=READ_COMMITTED)
    assert sorted(int(m.key()) for m in letters) == bad
