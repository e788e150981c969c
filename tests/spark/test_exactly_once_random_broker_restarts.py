"""(Found by a review.) An exactly-once streaming query whose one Kafka node is SIGKILLed and started
again at random moments (tasks writing, the driver committing), the query restarted from
its checkpoint whenever it fails: every row visible once to read_committed at the end,
nothing left open. Long (a broker restart costs seconds): make soak runs it."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import start_kafka, unique_topic
from tests.spark.faults import json_input, paused_value
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _exactly

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.soak

# A seed per 25 of KPROD_SOAK (make soak: 4).
SEEDS = max(1, int(os.environ.get("KPROD_SOAK", "1")) // 25)


def _restarts(cluster: KafkaCluster, rng: random.Random, stop: threading.Event, count: list[int]) -> None:
    node = cluster.nodes[0]
    while not stop.wait(rng.uniform(2.0, 8.0)):
        node.kill()
        stop.wait(rng.uniform(0.2, 4.0))
        node.start()
        cluster.wait_ready(120)
        count.append(1)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_broker_restarts_write_every_row_once(spark: SparkSession, tmp_path: Path, seed: int) -> None:
    rng = random.Random(9100 + seed)
    files, rows_per_file, tasks = rng.choice([6, 8]), rng.choice([50, 2000]), rng.choice([2, 3])
    pause_ms = rng.choice([300, 1500])
    print("shape:", dict(files=files, rows=rows_per_file, tasks=tasks, pause=pause_ms))
    cluster = start_kafka(config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"})
    try:
        topic = cluster.create_topic(unique_topic(f"eos-brk{seed}"), 2)
        source = json_input(tmp_path, files, rows_per_file)
        checkpoint = str(tmp_path / "chk")
        value = paused_value(rows_per_file, pause_ms)

        def run() -> str | None:
            rows = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
                    .repartition(tasks, "id").select(F.col("id").cast("string").alias("key"), value.alias("value")))
            query = (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", cluster.bootstrap)
                     .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
                     .option("kafka.request.timeout.ms", "5000").option("kafka.delivery.timeout.ms", "30000")
                     .option("kafka.max.block.ms", "20000")
                     .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
            try:
                query.awaitTermination(300)
            except Exception as exc:
                return str(exc).splitlines()[0][:200]
            finally:
                query.stop()
            return None if query.exception() is None else str(query.exception()).splitlines()[0][:200]

        stop = threading.Event()
        restarts: list[int] = []
        chaos = threading.Thread(target=_restarts, args=(cluster, rng, stop, restarts), daemon=True)
        chaos.start()
        outcomes = []
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                outcomes.append(run())
                if outcomes[-1] is None:
                    break
        finally:
            stop.set()
            chaos.join()
            cluster.nodes[0].start()
            cluster.wait_ready(120)
        for _ in range(3):
            outcomes.append(run())
            if outcomes[-1] is None:
                break
        print("restarts:", len(restarts), "outcomes:", outcomes)
        expected = {str(i) for i in range(files * rows_per_file)}
        _exactly(assert_nothing_left_open(cluster.bootstrap, topic, 2), expected)
    finally:
        cluster.stop()
