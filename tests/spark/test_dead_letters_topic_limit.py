"""kprod.errors.tolerance=all with records too large for their topic's max.message.bytes
(under max.request.size), on a real Kafka and a local Spark: seeded random sizes around
the limit, at-least-once and exactly-once. Each row whose batch alone would pass the limit
is a dead letter (RecordTooLargeError), every other row arrives once (read back with
confluent-kafka), and the delivery report counts them; with tolerance=none the write
fails naming topic, partition and size before anything is sent."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from kprod_broker import KafkaCluster
from tests.brokers import consume_to_marks, create_topic, unique_topic
from tests.producer.test_message_too_large import LIMIT, _alone_batch_size, _small_topic

READ_COMMITTED = {"isolation.level": "read_committed"}


def _rows(rng: random.Random, n: int) -> list[tuple[bytes, bytes]]:
    rows = []
    for i in range(n):
        key = b"%d" % i
        if rng.random() < 0.3:  # a batch of its own within a few bytes of the limit
            target = LIMIT + rng.randrange(-5, 6)
            length = target - _alone_batch_size(key, b"")
            while _alone_batch_size(key, bytes(length)) > target:
                length -= 1
            rows.append((key, rng.randbytes(length)))
        else:
            rows.append((key, rng.randbytes(rng.randrange(0, 300))))
    return rows


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
# Seed 0 of each guarantee in the suite; the other seeds in make soak (pytest -m soak).
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.soak)])
def test_records_too_large_for_the_topic_become_dead_letters(spark: SparkSession, kafka: KafkaCluster, tmp_path: Path,
                                                              guarantee: str, seed: int) -> None:
    rng = random.Random(f"{guarantee}-{seed}")
    topic = _small_topic(kafka.bootstrap, 3)
    dead = create_topic(kafka.bootstrap, unique_topic("dlq"), 2)
    rows = _rows(rng, rng.choice([30, 300, 1500]))
    too_large = {k for k, v in rows if _alone_batch_size(k, v) > LIMIT}
    report = tmp_path / "report.jsonl"
    opts = {"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic, "kprod.errors.tolerance": "all",
            "kprod.errors.deadLetterTopic": dead, "kprod.deliveryReport.path": str(report),
            "kprod.deliveryGuarantee": guarantee}
    if guarantee == "exactly-once":
        opts["kprod.markerTopic"] = create_topic(kafka.bootstrap, unique_topic("marker"), 1)
    df = spark.createDataFrame(rows, "key binary, value binary").repartition(rng.choice([1, 3]))
    df.write.format("kprod").options(**opts).mode("append").save()
    overrides = READ_COMMITTED if guarantee == "exactly-once" else None
    good = sorted((k, v) for k, v in rows if k not in too_large)
    got = consume_to_marks(kafka.bootstrap, topic, overrides=overrides)
    assert sorted((m.key(), m.value()) for m in got) == good
    letters = consume_to_marks(kafka.bootstrap, dead, overrides=overrides)
    assert sorted(m.key() for m in letters) == sorted(too_large)
    for m in letters:
        headers = {k: v.decode() for k, v in m.headers()}
        assert headers["kprod.errors.class"] == "RecordTooLargeError", headers
        assert headers["kprod.errors.topic"] == topic
        assert f"max.message.bytes ({LIMIT})" in headers["kprod.errors.message"]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    refused = sum(line["refusedRows"].get("RecordTooLargeError", 0) for line in lines)
    assert refused == len(too_large)
    assert sum(line["records"] for line in lines) == len(good)


def test_without_tolerance_the_write_fails_naming_topic_partition_and_size(spark: SparkSession,
                                                                           kafka: KafkaCluster) -> None:
    topic = _small_topic(kafka.bootstrap, 1)
    df = spark.createDataFrame([(b"a",), (b"x" * (LIMIT + 50),)], "value binary").coalesce(1)
    with pytest.raises(Exception, match=rf"makes a record batch of \d+ bytes for {topic}-0 .*max.message.bytes"):
        df.write.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic) \
            .mode("append").save()
    assert consume_to_marks(kafka.bootstrap, topic) == []
