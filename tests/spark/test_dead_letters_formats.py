"""Rows a value format cannot encode, with kprod.errors.tolerance=all, on a real Kafka, a
real Schema Registry and a local Spark: a JSON value with NaN (JSON has no number for it)
and an Avro value whose binary field does not fit the schema's fixed size, mixed with
good rows and rows with a topic that cannot be (seeded random positions and
proportions). Good rows decode with confluent-kafka's deserializers; each bad row is once
in the dead-letter topic, its fields as JSON, with its kprod.errors.* headers; with
tolerance=none the write fails naming the column and the row."""

from __future__ import annotations

import collections
import json
import random
import re
import urllib.request
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consume_to_marks, create_topic, unique_topic
from tests.spark.test_formats_sink import _decode

AVRO_SCHEMA = json.dumps({"type": "record", "name": "reading", "fields": [
    {"name": "id", "type": ["long", "null"]}, {"name": "score", "type": ["double", "null"]},
    {"name": "tag", "type": [{"type": "fixed", "name": "tag4", "size": 4}, "null"]}]})
# A bad row's kind -> (error class, words its message must hold).
BAD = {"unencodable": ("FormatValueError", {"json": "column value.score: NaN",
                                            "avro": "column value.tag: 2 bytes"}),
       "invalid_topic": ("InvalidTopicException", {"json": "", "avro": ""})}


def _invalid_topic() -> str:
    """A topic name Kafka refuses, new per test: the registry keeps a subject per name."""
    return unique_topic("no spaces allowed!")


def _frame(spark: SparkSession, kinds: list[str], good_topic: str, invalid_topic: str = "-") -> DataFrame:
    rows = [(i, kinds[i]) for i in range(len(kinds))]
    kind = F.col("kind")
    return spark.createDataFrame(rows, "id long, kind string").repartition(3).select(
        F.col("id").cast("string").alias("key"),
        F.struct(F.col("id"),
                 F.when(kind == "unencodable", F.lit(float("nan"))).otherwise(F.col("id") * 0.5).alias("score"),
                 F.when(kind == "unencodable", F.lit(b"ab")).otherwise(F.lit(b"abcd")).alias("tag"))
         .alias("value"),
        F.when(kind == "invalid_topic", F.lit(invalid_topic)).otherwise(F.lit(good_topic)).alias("topic"))


def _options(fmt: str, bootstrap: str, registry: str, dead_topic: str | None, report: Path, guarantee: str,
             good_topic: str) -> dict[str, str]:
    opts = {"kafka.bootstrap.servers": bootstrap, "kprod.schema.registry.url": registry,
            "kprod.value.format": fmt, "kprod.deliveryReport.path": str(report),
            "kprod.deliveryGuarantee": guarantee}
    if fmt == "avro":
        opts["kprod.value.avro.schema"] = AVRO_SCHEMA
    if dead_topic is not None:
        opts |= {"kprod.errors.tolerance": "all", "kprod.errors.deadLetterTopic": dead_topic}
    if guarantee == "exactly-once":
        opts["kprod.markerTopic"] = good_topic
    return opts


# Each format and each guarantee in the suite; the other two pairs in make soak (pytest -m soak).
@pytest.mark.parametrize(("fmt", "guarantee", "seed"), [
    ("json", "at-least-once", 0), pytest.param("avro", "at-least-once", 1, marks=pytest.mark.soak),
    pytest.param("json", "exactly-once", 2, marks=pytest.mark.soak), ("avro", "exactly-once", 3)])
def test_rows_a_format_cannot_encode_are_dead_letters(spark: SparkSession, kafka: KafkaCluster, schema_registry: str,
                                                      tmp_path: Path, fmt: str, guarantee: str, seed: int) -> None:
    rng = random.Random(seed)
    good_topic = create_topic(kafka.bootstrap, unique_topic(f"fmt-good-{fmt}"), 3)
    dead_topic = create_topic(kafka.bootstrap, unique_topic(f"fmt-dlq-{fmt}"), 2)
    n = rng.choice([60, 500, 2000])
    weights = [rng.uniform(1, 3), rng.uniform(0.05, 1), rng.uniform(0, 0.5)]
    kinds = rng.choices(["good", "unencodable", "invalid_topic"], weights, k=n)
    report = tmp_path / "report.jsonl"
    invalid_topic = _invalid_topic()
    _frame(spark, kinds, good_topic, invalid_topic).write.format("kprod").mode("append") \
        .options(**_options(fmt, kafka.bootstrap, schema_registry, dead_topic, report, guarantee, good_topic)).save()

    overrides = {"isolation.level": "read_committed"} if guarantee == "exactly-once" else None
    good = [i for i, k in enumerate(kinds) if k == "good"]
    bad = {i: k for i, k in enumerate(kinds) if k != "good"}
    messages = consume_to_marks(kafka.bootstrap, good_topic, overrides=overrides)
    values = _decode(schema_registry, fmt, messages)
    assert sorted(v["id"] for v in values) == good
    assert all(v["score"] == v["id"] * 0.5 for v in values)

    letters = consume_to_marks(kafka.bootstrap, dead_topic, overrides=overrides)
    assert sorted(int(m.key()) for m in letters) == sorted(bad)
    for m in letters:
        i = int(m.key())
        headers = {k: v.decode() for k, v in m.headers()}
        error, words = BAD[bad[i]]
        assert headers["kprod.errors.class"] == error, headers
        assert words[fmt] in headers["kprod.errors.message"], headers
        if bad[i] == "unencodable":
            # The value could not be encoded: the dead letter keeps its fields as JSON.
            assert json.loads(m.value()) == {"id": i, "score": "nan", "tag": "YWI="}  # base64 of b"ab"
            assert headers["kprod.errors.topic"] == good_topic
        else:
            # Refused for its topic's name before encoding (no subject is named after it):
            # the dead letter keeps its fields as JSON.
            assert json.loads(m.value())["id"] == i
            assert headers["kprod.errors.topic"] == invalid_topic
    subjects = json.loads(urllib.request.urlopen(f"{schema_registry}/subjects", timeout=30).read())
    assert not [s for s in subjects if s.startswith(invalid_topic)]
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    refused: collections.Counter[str] = collections.Counter()
    for line in lines:
        refused.update(line["refusedRows"])
    assert dict(refused) == dict(collections.Counter(BAD[k][0] for k in bad.values()))
    assert sum(line["deadLetters"] for line in lines) == len(bad)
    assert sum(line["records"] for line in lines) == len(good)


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_without_tolerance_the_write_fails_naming_column_and_row(spark: SparkSession, kafka: KafkaCluster,
                                                                  schema_registry: str, tmp_path: Path, fmt: str) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic(f"fmt-fail-{fmt}"), 1)
    kinds = ["good"] * 5 + ["unencodable"] + ["good"] * 3
    writer = _frame(spark, kinds, topic).coalesce(1).write.format("kprod").mode("append") \
        .options(**_options(fmt, kafka.bootstrap, schema_registry, None, tmp_path / "r.jsonl", "at-least-once",
                            topic))
    with pytest.raises(Exception) as failure:
        writer.save()
    # The row's position in its task's input (Spark's order, not the DataFrame's).
    column, words = BAD["unencodable"][1][fmt].split(": ")
    assert re.search(rf"{re.escape(column)}, row \d+: {words}", str(failure.value)), str(failure.value)[:3000]
    assert consume_to_marks(kafka.bootstrap, topic) == []
