"""Faults at the Spark level, on real Kafka: what a task does when it fails part-way, when
its Python worker dies, and when the broker stops answering.

kprod's sink is at-least-once: a task that fails after some of its records were
acknowledged leaves them in Kafka, and its retry sends them all again.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consumer, create_topic, subprocess_env, unique_topic
from tests.procs import RssSampler

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tests.conftest import ProxiedKafka

pytestmark = pytest.mark.timeout(600)


def read_ids(bootstrap: str, topic: str, at_least: int, timeout: float = 120.0) -> list[int]:
    """The ids in every record of ``topic`` (values are ids left-padded with 'x'), read
    with confluent-kafka until at least ``at_least`` and then to the end of each partition."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

    c = consumer(bootstrap, **{"enable.partition.eof": True})
    try:
        partitions = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        ids: list[int] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (len(ids) < at_least or len(at_end) < len(partitions)):
            for m in c.consume(num_messages=10000, timeout=0.2):
                error, partition, value = m.error(), m.partition(), m.value()
                assert partition is not None
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(partition)
                        continue
                    raise AssertionError(f"consumer error: {error}")
                assert value is not None
                at_end.discard(partition)
                ids.append(int(value.lstrip(b"x")))
        assert len(ids) >= at_least, f"read {len(ids)} of at least {at_least} records from {topic}"
        return ids
    finally:
        c.close()


# -- a task that fails part-way, and one whose Python worker dies ----------------

RETRIED_TASK = Path(__file__).with_name("retried_task.py")
FAULTS = ("sigkill", "raise")  # in the order the child process meets them (see retried_task.py)
RETRIED_ROWS, RETRIED_ACKED = 300_000, 100_000


@pytest.fixture(scope="module")
def retried_writes(kafka: KafkaCluster) -> tuple[dict[str, str], dict[str, int], str]:
    """One child process (one JVM for both) making one write per fault, each to its own
    topic: the topics, the failed task attempts of each write, the child's stderr."""
    topics = {fault: create_topic(kafka.bootstrap, unique_topic(f"retry-{fault}"), 1) for fault in FAULTS}
    done = subprocess.run([sys.executable, str(RETRIED_TASK), kafka.bootstrap, str(RETRIED_ROWS), str(RETRIED_ACKED),
                           *(f"{fault}:{topics[fault]}" for fault in FAULTS)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-6000:]
    failed = {r["fault"]: r["failed_task_attempts"] for r in map(json.loads, done.stdout.splitlines())}
    return topics, failed, done.stderr


@pytest.mark.parametrize("fault", FAULTS)
def test_task_failing_after_acknowledged_rows_is_retried(kafka: KafkaCluster,
                                                         retried_writes: tuple[dict[str, str], dict[str, int], str],
                                                         fault: str) -> None:
    """One task of 300,000 rows meets a fault on its first attempt once 100,000 of them
    are acknowledged: the Python worker running kprod's writer is killed with SIGKILL
    (``sigkill``), or the task's input raises (``raise``). Spark retries the task
    (local[2,4], in a child process) and the write succeeds: every row is in Kafka, those
    the first attempt had delivered twice."""
    topics, failed, stderr = retried_writes
    topic = topics[fault]
    assert failed[fault] == 1, stderr[-6000:]
    cause = "injected fault after" if fault == "raise" else "Python worker exited unexpectedly (crashed)"
    assert cause in stderr
    # The driver's summary counts what the successful attempt delivered: all of it.
    assert re.search(rf"kprod batch write committed: {RETRIED_ROWS} records, .* \[{topic}\], from 1 task\(s\)",
                     stderr)
    ids = read_ids(kafka.bootstrap, topic, RETRIED_ROWS + RETRIED_ACKED)
    counts = Counter(ids)
    assert set(counts) == set(range(RETRIED_ROWS))
    twice = sum(1 for n in counts.values() if n > 1)
    assert twice >= RETRIED_ACKED and max(counts.values()) == 2
    print(f"{fault}: {len(ids)} records for {RETRIED_ROWS} rows, {twice} rows twice")


# -- a broker that stops answering ---------------------------------------------

STALL_BUFFER_MEMORY = 4 << 20
STALL_DELIVERY_TIMEOUT_MS = 6000
STALL_VALUE_BYTES = 200
# What a writer may hold beyond buffer.memory while the broker is silent: the Arrow batch
# Spark is handing it, the joined table being sent (at most a quarter of buffer.memory),
# the encoder's chunk, the allocators' slack. Each task is given 50 MB of values: a
# producer that did not bound its memory would hold most of them.
STALL_OVERHEAD_BOUND = 24 << 20


def _write_ids(directory: Path, start: int, count: int, name: str) -> None:
    pq.write_table(pa.table({"id": pa.array(range(start, start + count), pa.int64())}), directory / name)


def test_stalled_broker_fails_the_task_then_the_query_resumes(spark: SparkSession, kafka_proxy: ProxiedKafka,
                                                              tmp_path: Path) -> None:
    """The proxy holds every byte both ways. The microbatch's tasks fail once their records
    have waited delivery.timeout.ms, with an error naming the broker and that timeout,
    while each writer's memory stays within buffer.memory plus a bounded overhead; the
    query (local[2]: no task retries) stops with that error. Restarted from its checkpoint
    with the proxy flowing again, it writes that microbatch again and every row arrives."""
    warm, big_files, per_file = 1000, 2, 250_000  # 50 MB of values per big file
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("stall"), 2)
    source, checkpoint, report = tmp_path / "in", tmp_path / "cp", tmp_path / "report.jsonl"
    source.mkdir()
    _write_ids(source, 0, warm, "part-0.parquet")

    def run_query() -> StreamingQuery:
        df = spark.readStream.schema("id bigint").option("maxFilesPerTrigger", big_files).parquet(str(source))
        query = (df.select(F.lpad(F.col("id").cast("string"), STALL_VALUE_BYTES, "x").alias("value"))
                 .writeStream.format("kprod")
                 .option("kafka.bootstrap.servers", kafka_proxy.bootstrap).option("topic", topic)
                 .option("kafka.buffer.memory", str(STALL_BUFFER_MEMORY))
                 .option("kafka.delivery.timeout.ms", str(STALL_DELIVERY_TIMEOUT_MS))
                 .option("kafka.request.timeout.ms", "2000").option("kafka.linger.ms", "5")
                 .option("kprod.deliveryReport.path", str(report))
                 # What the tasks do under a stall is the point: the driver's check would
                 # refuse to start the query instead.
                 .option("kprod.clusterCheck", "false")
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        with contextlib.suppress(StreamingQueryException):  # query.exception() tells
            query.awaitTermination(300)
        return query

    # Microbatch 0 with the broker answering: the writers are warm (imports, compiled
    # encoder, a pooled producer) before their memory is measured.
    assert run_query().exception() is None
    for f in range(big_files):
        _write_ids(source, warm + f * per_file, per_file, f"part-{f + 1}.parquet")

    kafka_proxy.proxy.stall()
    started = time.monotonic()
    with RssSampler(os.getpid(), kafka_proxy.proxy.port) as rss:
        failed = run_query()
    failed_after = time.monotonic() - started
    error = str(failed.exception())
    growth = rss.growth()
    print(f"stalled microbatch failed after {failed_after:.1f} s: {error[:2000]}")
    print("writers' RSS, first sample connected -> peak (MiB):", {
        pid: f"{rss.first[pid] / 2**20:.1f} -> {rss.peak[pid] / 2**20:.1f}" for pid in growth})
    assert failed.exception() is not None
    assert f"delivery.timeout.ms={STALL_DELIVERY_TIMEOUT_MS}" in error
    assert f"its leader is broker 1 at 127.0.0.1:{kafka_proxy.proxy.port}" in error
    assert growth, "no writer process was seen"
    assert max(growth.values()) <= STALL_BUFFER_MEMORY + STALL_OVERHEAD_BOUND

    kafka_proxy.proxy.stall(False)
    assert run_query().exception() is None
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(e["batchId"], e["records"]) for e in entries] == [(0, warm), (1, big_files * per_file)]
    total = warm + big_files * per_file
    ids = read_ids(kafka_proxy.bootstrap, topic, total)
    assert set(ids) == set(range(total))
