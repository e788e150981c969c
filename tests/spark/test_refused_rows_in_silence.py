"""Refused rows under a silent broker (break 58, found by a breaker on real Kafka; soak:
each a Spark write of tens of seconds; tests/spark/test_dead_letter_pieces.py holds each
fix in the suite). With ``kprod.errors.tolerance=all``:

- rows refused as too large were kept with their call's future until the task settled it,
  from the oldest, which a silent broker never completes: up to 64 calls' huge rows held
  (30.7 MiB binary, 68.4 Avro, 59.7 JSON against a 19-19.5 MiB bound). The writer now
  hands each call's refused rows to the dead letters as the call returns.
- a task whose rows were all refused by its format had no send of its own to fail it: its
  dead letters were settled only at its end, so it crawled through its input at a
  buffer.memory per delivery.timeout.ms (69.8 s, 46.5 x the timeout). Dead letters sent
  are now settled as they complete, and at most 64 wait.
"""

from __future__ import annotations

import json
import os
import random
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from spark_sink.spark.writer import send_bytes_for
from tests.brokers import create_topic, unique_topic
from tests.spark.test_task_faults import STALL_OVERHEAD_BOUND, write_into_silence

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.conftest import ProxiedKafka

pytestmark = [pytest.mark.soak, pytest.mark.timeout(900)]

MAX_REQUEST = 1 << 20  # the producer's default max.request.size


@pytest.mark.parametrize("fmt", ["binary", "avro", "json"])
def test_refused_too_large_rows_are_not_held_past_the_bound(
        spark: SparkSession, kafka_proxy: ProxiedKafka, schema_registry: str, fmt: str) -> None:
    """Tiny rows each followed by one too large (refused, tolerated) in Spark Arrow batches
    of two rows, every call holding one refused row, and a delivery timeout long enough
    for more than 64 calls before the first records expire."""
    seed = int(os.environ.get("KPROD_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    buffer_memory = rng.choice([2, 4]) << 20
    huge = MAX_REQUEST + rng.choice([50_000, 200_000])
    with_dead_letters = rng.choice([True, False])
    rows = 2 * 2 * rng.choice([120, 160])  # 2 tasks, half the rows huge: > 64 calls each
    topic = create_topic(kafka_proxy.bootstrap, unique_topic(f"held-{fmt}"), 1)
    options = {"kafka.bootstrap.servers": kafka_proxy.bootstrap, "topic": topic,
               "kafka.buffer.memory": str(buffer_memory), "kafka.delivery.timeout.ms": "20000",
               "kafka.request.timeout.ms": "3000", "kafka.linger.ms": "5", "kprod.clusterCheck": "false",
               "kprod.errors.tolerance": "all"}
    if with_dead_letters:
        options["kprod.errors.deadLetterTopic"] = create_topic(kafka_proxy.bootstrap, unique_topic("held-dead"), 1)
    if fmt != "binary":
        options |= {"kprod.value.format": fmt, "kprod.schema.registry.url": schema_registry}

    def frame(n: int, tasks: int) -> DataFrame:
        size = F.when(F.col("id") % 2 == 1, F.lit(huge)).otherwise(F.lit(8))
        value = F.lpad(F.col("id").cast("string").substr(1, 1), size, "x")
        if fmt != "binary":
            value = F.struct(F.col("id"), value.alias("text"))
        return spark.range(0, n, 1, tasks).select(F.col("id").cast("string").alias("key"), value.alias("value"))

    silence = write_into_silence(
        spark, kafka_proxy, frame, rows, 8, options, seed,
        f"{fmt}, {rows} rows (every other {huge} bytes), buffer {buffer_memory}, dead letters {with_dead_letters}",
        {"spark.sql.execution.arrow.maxRecordsPerBatch": "2"})
    call = send_bytes_for(buffer_memory) // (1 if fmt == "binary" else 2)
    bound = buffer_memory + max(call, huge + 1000) + (0 if fmt == "binary" else call) + STALL_OVERHEAD_BOUND
    assert silence.growth <= bound, (seed, silence.growth, bound)


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_a_task_of_refused_rows_fails_at_its_delivery_timeout(
        spark: SparkSession, kafka_proxy: ProxiedKafka, schema_registry: str, fmt: str) -> None:
    """Every row refused by its format (a NaN in JSON; 2 bytes for a 4-byte Avro fixed),
    40 MB of dead letters a task: the task fails within a few delivery timeouts of the
    stall (before: at the end of its input), its writer within the bound."""
    seed = int(os.environ.get("KPROD_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    buffer_memory = rng.choice([1, 2]) << 20
    text_bytes = rng.choice([1000, 2000, 4000])
    guarantee = rng.choice(["at-least-once", "exactly-once"])
    rows = 2 * (40 << 20) // text_bytes
    topic = create_topic(kafka_proxy.bootstrap, unique_topic(f"all-refused-{fmt}"), 2)
    dead = create_topic(kafka_proxy.bootstrap, unique_topic("all-refused-dead"), 1)
    options = {"kafka.bootstrap.servers": kafka_proxy.bootstrap, "topic": topic,
               "kafka.buffer.memory": str(buffer_memory), "kafka.delivery.timeout.ms": "1500",
               "kafka.request.timeout.ms": "1000", "kafka.linger.ms": "5", "kprod.clusterCheck": "false",
               "kprod.errors.tolerance": "all", "kprod.errors.deadLetterTopic": dead,
               "kprod.value.format": fmt, "kprod.schema.registry.url": schema_registry,
               "kprod.deliveryGuarantee": guarantee}
    if fmt == "avro":
        options["kprod.value.avro.schema"] = json.dumps({"type": "record", "name": "refused", "fields": [
            {"name": "id", "type": "long"}, {"name": "score", "type": "double"}, {"name": "text", "type": "string"},
            {"name": "tag", "type": {"type": "fixed", "name": "tag4", "size": 4}}]})
    if guarantee == "exactly-once":
        options["kprod.markerTopic"] = topic

    def frame(n: int, tasks: int) -> DataFrame:
        # The warm-up's rows are good but one per task (its producer learns both topics).
        bad = (F.col("id") % 8 == 0) if n <= 64 else F.lit(True)
        score = F.when(bad & F.lit(fmt == "json"), F.lit(float("nan"))).otherwise(F.col("id") * 0.5)
        tag = F.when(bad & F.lit(fmt == "avro"), F.lit(b"ab")).otherwise(F.lit(b"abcd"))
        text = F.lpad(F.col("id").cast("string"), text_bytes, "x")
        return spark.range(0, n, 1, tasks).select(F.col("id").cast("string").alias("key"), F.struct(
            F.col("id"), score.alias("score"), text.alias("text"), tag.alias("tag")).alias("value"))

    silence = write_into_silence(
        spark, kafka_proxy, frame, rows, 8, options, seed,
        f"{fmt}, {guarantee}, {rows} rows of {text_bytes} bytes all refused, buffer {buffer_memory}")
    # Under exactly-once the driver's abort of a silent broker comes on top (5.1-8.4 s).
    assert silence.seconds <= (4 if guarantee == "at-least-once" else 8) * 1.5, (seed, silence.seconds)
    call = send_bytes_for(buffer_memory) // 2
    bound = buffer_memory + 2 * call + 10_000 * (text_bytes + 40) + STALL_OVERHEAD_BOUND  # and one Arrow batch
    assert silence.growth <= bound, (seed, silence.growth, bound)
