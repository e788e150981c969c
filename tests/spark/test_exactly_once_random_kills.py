"""(Found by a review.) One or two exactly-once streaming queries (to the same topic) whose Python
processes (the executors' writers and the driver's commit and abort workers alike) are
SIGKILLed at random moments, and which are stopped with query.stop() at random moments,
restarted in the same session
each time, as a notebook user or a scheduler would. Expected (README, Guarantees): every
row of every query visible once to read_committed once they have caught up, nothing left
open. (Two queries with the same topic have their own checkpoints, so their own prefixes.)"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests import procs
from tests.brokers import create_topic, unique_topic
from tests.spark.faults import json_input, paused_value
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _exactly

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

# Up to two minutes a seed on the 2-core machine: make soak runs them, not the suite.
pytestmark = pytest.mark.soak

# A seed per 25 of KPROD_SOAK (make soak: 4).
SEEDS = max(1, int(os.environ.get("KPROD_SOAK", "1")) // 25)


def _kprod_processes() -> list[int]:
    return [p for p in procs.descendants(os.getpid()) if procs.loads_kprod(p)]


def _killer(rng: random.Random, stop: threading.Event, killed: list[int]) -> None:
    while not stop.wait(rng.uniform(0.3, 3.0)):
        found = _kprod_processes()
        if found:
            pid = rng.choice(found)
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_process_kills_and_stops_write_every_row_once(spark: SparkSession, kafka: KafkaCluster,
                                                             tmp_path: Path, seed: int) -> None:
    rng = random.Random(7700 + seed)
    files, rows_per_file = rng.choice([6, 10]), rng.choice([40, 1500])
    tasks, partitions = rng.choice([2, 3, 5]), rng.choice([1, 3])
    pause_ms = rng.choice([200, 800, 2000])
    queries = rng.choice([1, 2])
    print("shape:", dict(files=files, rows=rows_per_file, tasks=tasks, partitions=partitions, pause=pause_ms,
                         queries=queries))
    topic = create_topic(kafka.bootstrap, unique_topic(f"eos-kill{seed}"), partitions=partitions)
    source = json_input(tmp_path, files, rows_per_file)
    checkpoint = str(tmp_path / "chk")
    value = paused_value(rows_per_file, pause_ms)

    def start(q: int) -> StreamingQuery:
        rows = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
                .repartition(tasks + q, "id")
                .select(F.concat(F.lit(f"q{q}-"), F.col("id").cast("string")).alias("key"), value.alias("value")))
        return (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap)
                .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
                .option("kafka.transaction.timeout.ms", "30000")
                .option("checkpointLocation", f"{checkpoint}-{q}").trigger(availableNow=True).start())

    def run(stop_after: float | None) -> str | None:
        running = [start(q) for q in range(queries)]
        outcome = None
        for query in running:
            try:
                # PySpark's hint says int; it passes any number of seconds on to the JVM.
                finished = query.awaitTermination(stop_after if stop_after is not None else 240)  # type: ignore[arg-type]
                if not finished:
                    query.stop()
                    outcome = "stopped"
            except Exception as exc:
                outcome = str(exc).splitlines()[0][:200]
            finally:
                query.stop()
            if query.exception() is not None:
                outcome = str(query.exception()).splitlines()[0][:200]
        return outcome

    stop = threading.Event()
    killed: list[int] = []
    killer = threading.Thread(target=_killer, args=(rng, stop, killed), daemon=True)
    killer.start()
    outcomes = []
    try:
        deadline = time.monotonic() + 100
        while time.monotonic() < deadline:
            outcome = run(rng.uniform(1.0, 8.0) if rng.random() < 0.4 else None)
            outcomes.append(outcome)
            if outcome is None:
                break
    finally:
        stop.set()
        killer.join()
    for _ in range(3):
        outcome = run(None)
        outcomes.append(outcome)
        if outcome is None:
            break
    print("killed:", len(killed), "outcomes:", outcomes)
    expected = {f"q{q}-{i}" for q in range(queries) for i in range(files * rows_per_file)}
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, partitions), expected)
