"""A formats write serializes each call in slices whose wire bytes stay within the call
size (break 56b (2): a call is sized by its Arrow bytes, and its JSON form of 48 booleans
is ~15 times that). ``WireSlices`` over a real registry's serializer: the parts handed to
send_arrow within the size (or one row), the same bytes in the same order as the call
serialized whole, the same rows refused, the same rows digest; hand-picked and seeded
random shapes (rows growing, shrinking, refused). Then a Spark write on a real Kafka with
a small buffer.memory: every row once, in each task's order, the refused ones as dead
letters. (The writer's memory under a silent broker: ``python -m tests.break56b_formats``
on branch break56b.)"""

from __future__ import annotations

import json
import math
import os
import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.producer import (
    ArrowSerializer,
    FormatValueError,
    RefusedRows,
    RowRefusals,
    RowsDigest,
    WireBudget,
    WireBudgetExceeded,
    serialize_columns,
)
from spark_sink.spark.writer import SLICE_FILL, WireSlices
from tests.arrow_memory import arrow_peak
from tests.brokers import consume_to_marks, create_topic, unique_topic
from tests.spark.test_formats_sink import _decode

KiB = 1 << 10
# Random shapes: 10 in the suite, KPROD_SOAK (make soak) as many as it says.
SEEDS = int(os.environ.get("KPROD_SOAK", "0")) or 10


def _flags(rows: int) -> pa.Table:
    """The break's shape: a string key and a value struct of 48 booleans."""
    ids = pa.array(range(rows), pa.int64())
    fields = {f"flag_{i:02d}": pa.array([r % (i + 2) == 0 for r in range(rows)]) for i in range(48)}
    return pa.table({"key": pa.array([str(r) for r in range(rows)]),
                     "value": pa.StructArray.from_arrays([ids, *fields.values()], ["id", *fields])})


def _texts(rng: random.Random, rows: int) -> pa.Table:
    """Rows of a random size (runs of short and long texts: a slice's rows may be far
    larger than the last slice's), some with a NaN score (JSON cannot carry it)."""
    texts: list[str] = []
    while len(texts) < rows:
        size = rng.choice([0, 3, 40, 400, 4000, 30_000])
        texts += ["x" * rng.randint(0, size)] * rng.randint(1, max(1, rows // 4))
    scores = [float("nan") if rng.random() < 0.05 else r * 0.5 for r in range(rows)]
    value = pa.StructArray.from_arrays([pa.array(range(rows), pa.int64()), pa.array(scores), pa.array(texts[:rows])],
                                       ["id", "score", "text"])
    return pa.table({"key": pa.array([str(r) for r in range(rows)]), "value": value})


def _slice_and_check(table: pa.Table, serializer: ArrowSerializer, topic: str, max_bytes: int,
                     slices: WireSlices | None = None) -> tuple[list[pa.Table], list[pa.Table]]:
    """The parts and the serialized slices of ``table``, checked against the call
    serialized whole: the same bytes in order, the same rows refused, the same digest;
    every slice serialized within the size in wire bytes, or one row."""
    slices = slices or WireSlices(max_bytes)
    serialized: list[pa.Table] = []
    refused: list[RefusedRows] = []

    def serialize(rows: pa.Table, budget: WireBudget) -> pa.Table:
        refusals = RowRefusals(rows)
        wire = serialize_columns(rows, topic, None, serializer, refusals, budget)
        refused.extend(refusals.refused)
        serialized.append(wire)
        wire_bytes = pc.sum(pc.binary_length(wire.column("value"))).as_py() or 0
        assert wire_bytes <= max_bytes or wire.num_rows <= 1, (wire.num_rows, wire_bytes, max_bytes)
        return wire

    parts = list(slices.parts(table, serialize))
    for part in parts:
        assert part.num_rows == 1 or part.nbytes <= max_bytes, (part.num_rows, part.nbytes, max_bytes)
    whole_refusals = RowRefusals(table)
    whole = serialize_columns(table, topic, None, serializer, whole_refusals)
    got = pa.concat_tables(parts) if parts else whole.slice(0, 0)
    assert got.column("key").to_pylist() == whole.column("key").to_pylist()
    assert got.column("value").to_pylist() == whole.column("value").to_pylist()

    def refused_ids(groups: list[RefusedRows]) -> list[int]:
        return sorted(i for r in groups for i in r.data.column("value").combine_chunks().field("id").to_pylist())

    assert refused_ids(refused) == refused_ids(whole_refusals.refused)
    # The exactly-once replay digest: the same whatever the parts.
    digests = RowsDigest(), RowsDigest()
    for part in parts:
        digests[0].add(part)
    digests[1].add(whole)
    assert str(digests[0]) == str(digests[1])
    return parts, serialized


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_the_breaks_rows_are_serialized_within_the_call_size(schema_registry: str, fmt: str) -> None:
    """48 booleans (Avro ~2x, JSON ~15x their Arrow bytes): every slice serialized, not
    only every part sent, within the size, and the parts near it (not cut small)."""
    table = _flags(10_000)  # a call: its Arrow bytes within the size
    max_bytes = 256 * KiB
    serializer = ArrowSerializer(fmt, {"url": schema_registry})
    parts, serialized = _slice_and_check(table, serializer, unique_topic(f"slices-{fmt}"), max_bytes)
    assert all(s.nbytes <= max_bytes for s in serialized), [s.nbytes for s in serialized]
    total = sum(p.nbytes for p in parts)
    assert total > 2 * max_bytes > 2 * table.nbytes  # the whole call serialized at once would not fit
    assert len(parts) <= total // (max_bytes * SLICE_FILL * 0.9) + 2, (len(parts), total)


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_tiny_rows_then_huge_ones_are_serialized_within_the_call_size(schema_registry: str, fmt: str) -> None:
    """Break 57 (2): empty lists of booleans, then lists of 16,000 (JSON ~40x their Arrow
    bytes): a slice sized by the tiny rows before it held 1,000 huge rows in wire form.
    Now the encoder stops at the size and the slice is serialized again with the rows
    that fit."""
    tiny, huge = 9_000, 1_000
    flags = pa.array([[]] * tiny + [[r % 3 == 0 for r in range(16_000)]] * huge, pa.list_(pa.bool_()))
    ids = pa.array(range(tiny + huge), pa.int64())
    table = pa.table({"key": pa.array([str(r) for r in range(tiny + huge)]),
                      "value": pa.StructArray.from_arrays([ids, flags], ["id", "flags"])})
    serializer = ArrowSerializer(fmt, {"url": schema_registry})
    max_bytes = 1 << 20
    parts, _ = _slice_and_check(table, serializer, unique_topic(f"slices-huge-{fmt}"), max_bytes)
    assert sum(p.num_rows for p in parts) == tiny + huge


def test_random_row_sizes_and_refusals_are_sliced_within_the_call_size(schema_registry: str) -> None:
    serializer = ArrowSerializer("json", {"url": schema_registry})
    topic = unique_topic("slices-random")
    for seed in range(SEEDS):
        rng = random.Random(seed)
        max_bytes = rng.choice([2 * KiB, 16 * KiB, 64 * KiB, 1 << 20])
        slices = WireSlices(max_bytes)  # one per task: its estimate carries over calls
        for _ in range(rng.randint(1, 3)):
            _slice_and_check(_texts(rng, rng.choice([1, 7, 300, 3000])), serializer, topic, max_bytes, slices)


def _frame(spark: SparkSession, rows: int, fmt: str, seed: int) -> DataFrame:
    """Two tasks of ids in order; texts of 1 to 1,000 bytes, their size changing in runs;
    with JSON, a NaN score every so often (a dead letter)."""
    rng = random.Random(seed)
    every, run = rng.choice([7, 31, 113]), rng.choice([50, 400])
    text = F.expr(f"repeat('y', cast(pow(10, cast(id / {run} as int) % 4) as int))")
    score = F.col("id") * 0.5
    if fmt == "json":
        score = F.when(F.col("id") % every == 3, F.lit(float("nan"))).otherwise(score)
    return spark.range(0, rows, 1, 2).select(F.col("id").cast("string").alias("key"),
                                             F.struct(F.col("id"), score.alias("score"), text.alias("text")).alias("value"))


@pytest.mark.parametrize(("fmt", "seed"), [("json", 0), ("avro", 1)])
def test_a_small_buffer_write_sends_every_row_once_in_order(spark: SparkSession, kafka: KafkaCluster,
                                                            schema_registry: str, fmt: str, seed: int) -> None:
    """buffer.memory 96 KiB (with a format, calls and slices of 24 KiB) and rows of 10 to
    1,000 bytes of text: many slices a call. One partition: each task's rows in
    its order."""
    rows = 6000
    topic = create_topic(kafka.bootstrap, unique_topic(f"slices-{fmt}"), 1)
    dead_topic = create_topic(kafka.bootstrap, unique_topic(f"slices-dlq-{fmt}"), 1)
    frame = _frame(spark, rows, fmt, seed)
    bad = sorted(r["value"]["id"] for r in frame.collect() if math.isnan(r["value"]["score"]))
    frame.write.format("kprod").mode("append").options(**{
        "kafka.bootstrap.servers": kafka.bootstrap, "topic": topic, "kafka.buffer.memory": str(96 * KiB),
        "kprod.value.format": fmt, "kprod.schema.registry.url": schema_registry,
        "kprod.errors.tolerance": "all", "kprod.errors.deadLetterTopic": dead_topic}).save()
    ids = [v["id"] for v in _decode(schema_registry, fmt, consume_to_marks(kafka.bootstrap, topic))]
    assert sorted(ids) == sorted(set(range(rows)) - set(bad))
    half = rows // 2
    for task in ([i for i in ids if i < half], [i for i in ids if i >= half]):
        assert task == sorted(task)
    letters = consume_to_marks(kafka.bootstrap, dead_topic)
    assert sorted(int(m.key()) for m in letters) == bad
    assert all(json.loads(m.value())["score"] == "nan" for m in letters)


def test_a_refused_row_is_named_by_its_index_in_the_call_whatever_the_slices(schema_registry: str) -> None:
    """With no dead letters a row JSON cannot carry fails the call: the error names its
    row in the call (plus the call's first row in the task), not in the slice that held
    it. Seeded shapes put the bad row in a random slice."""
    serializer = ArrowSerializer("json", {"url": schema_registry})
    topic = unique_topic("slices-row")
    for seed in range(12):
        rng = random.Random(seed)
        rows, first = rng.choice([50, 900, 4000]), rng.choice([0, 1, 123_456])
        bad = rng.randrange(rows)
        table = _texts(random.Random(seed), rows)
        value = table.column("value").combine_chunks()
        scores = [float("nan") if r == bad else r * 0.5 for r in range(rows)]
        table = table.set_column(1, "value", pa.StructArray.from_arrays(
            [value.field("id"), pa.array(scores), value.field("text")], ["id", "score", "text"]))
        slices = WireSlices(rng.choice([2 * KiB, 16 * KiB]))
        with pytest.raises(FormatValueError) as failure:
            for _ in slices.parts(table, lambda rows, budget: serialize_columns(rows, topic, None, serializer,
                                                                                  budget=budget), first):
                pass
        assert failure.value.row == first + bad, (seed, failure.value.row, first, bad)
        assert f"column value.score, row {first + bad}: NaN" in str(failure.value)


def test_a_tasks_refused_row_is_named_by_its_index_among_the_tasks_rows(spark: SparkSession, kafka: KafkaCluster,
                                                                         schema_registry: str) -> None:
    """One task of 6,000 rows (one Arrow batch, sent in calls of a few KiB, each
    serialized in slices): the NaN at row 4,321 fails the write naming row 4,321."""
    topic = create_topic(kafka.bootstrap, unique_topic("slices-task-row"), 1)
    frame = spark.range(0, 6000, 1, 1).select(
        F.col("id").cast("string").alias("key"),
        F.struct(F.col("id"), F.when(F.col("id") == 4321, F.lit(float("nan"))).otherwise(F.col("id") * 0.5)
                 .alias("score"), F.repeat(F.lit("z"), 50).alias("text")).alias("value"))
    with pytest.raises(Exception) as failure:
        frame.write.format("kprod").mode("append").options(**{
            "kafka.bootstrap.servers": kafka.bootstrap, "topic": topic, "kafka.buffer.memory": str(96 * KiB),
            "kprod.value.format": "json", "kprod.schema.registry.url": schema_registry}).save()
    assert "column value.score, row 4321: NaN" in str(failure.value), str(failure.value)[:3000]


def test_a_refused_row_to_one_of_several_topics_is_named_by_its_index_in_the_task(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str) -> None:
    """Break 58: with a ``topic`` column each topic's rows are serialized apart, and the
    error named the row by its index among its topic's rows (1293 reported as 443). A
    random format, row count and spread over 3 topics (KPROD_SEED to replay); the bad row
    not among the first topic's."""
    seed = int(os.environ.get("KPROD_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    fmt, rows = rng.choice(["json", "avro"]), rng.choice([40, 200, 3000])
    topics = [create_topic(kafka.bootstrap, unique_topic(f"row-of-{fmt}-{i}"), 1) for i in range(3)]
    which = [rng.randrange(3) for _ in range(rows)]
    bad = rng.choice([i for i in range(rows) if which[i] != which[0]])
    extra = {}
    if fmt == "json":
        value = F.struct(F.col("id"), F.when(F.col("id") == bad, F.lit(float("nan"))).otherwise(F.col("id") * 0.5)
                         .alias("score"))
    else:  # a 2-byte tag for the schema's 4-byte fixed
        value = F.struct(F.col("id"), F.when(F.col("id") == bad, F.lit(b"ab")).otherwise(F.lit(b"abcd")).alias("tag"))
        extra["kprod.value.avro.schema"] = json.dumps({"type": "record", "name": "row_of", "fields": [
            {"name": "id", "type": ["long", "null"]},
            {"name": "tag", "type": [{"type": "fixed", "name": "t4", "size": 4}, "null"]}]})
    df = spark.createDataFrame([(i, topics[which[i]]) for i in range(rows)], "id long, topic string").coalesce(1)
    with pytest.raises(Exception) as failure:
        df.select(F.col("id").cast("string").alias("key"), value.alias("value"), F.col("topic")) \
            .write.format("kprod").mode("append").options(**{
                "kafka.bootstrap.servers": kafka.bootstrap, "kprod.value.format": fmt,
                "kprod.schema.registry.url": schema_registry}, **extra).save()
    error = str(failure.value)
    assert f", row {bad}:" in error, (seed, fmt, rows, bad, error[-3000:])


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_a_topic_columns_rows_are_encoded_in_place(schema_registry: str, fmt: str) -> None:
    """Break 59: rows to several topics (each its own schema id) were taken out per topic
    before encoding, and a take of lists of booleans makes an index per boolean: a slice
    sized by tiny rows before it took whole calls of huge rows (139 MiB against a 21.5 MiB
    bound). Now each topic's rows are encoded in place, so the budget stops them. The
    bytes are each topic's rows serialized alone, in the rows' order; null rows stay null."""
    rng = random.Random(5)
    rows = 200
    flags = pa.array([None if rng.random() < 0.05 else [r % 3 == 0] * rng.choice([0, 16_000]) for r in range(rows)],
                     pa.list_(pa.bool_()))
    value = pa.StructArray.from_arrays([pa.array(range(rows), pa.int64()), flags], ["id", "flags"],
                                       mask=pa.array([r % 50 == 7 for r in range(rows)]))
    names = [unique_topic(f"in-place-{fmt}-{i}") for i in range(3)]
    topics = pa.array([names[rng.randrange(3)] for _ in range(rows)])
    serializer = ArrowSerializer(fmt, {"url": schema_registry})
    alone = {t: serializer.serialize(value, t).to_pylist() for t in names}
    assert serializer.serialize(value, topics).to_pylist() == [alone[t][i] for i, t in enumerate(topics.to_pylist())]

    def past_the_budget() -> None:
        with pytest.raises(WireBudgetExceeded):
            serializer.serialize(value, topics, budget=WireBudget(64 * KiB))

    assert arrow_peak(past_the_budget) < 1 << 20  # taken out first: ~9 MiB of indices
