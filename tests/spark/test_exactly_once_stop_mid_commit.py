"""The driver's commit of an exactly-once microbatch cut short (found by a review).

A user stops a query (a notebook's stop button, a scheduler shutting the job down) while
the driver commits a microbatch: the commit's Python worker goes on and ends the commit.
If that worker dies instead (the application exits, and Spark's Python daemon takes its
workers with it; the kernel's OOM killer), the commit's last will
(spark_sink/spark/last_will.py) aborts the microbatch, or ends the commits it had begun.
Either way nothing is left open until transaction.timeout.ms to hold back read_committed
readers (README, Guarantees), and a restart writes every row once. The commit's round
trips are slowed (0.35 s each, replies only, through the fault proxy) so that the stop or
the kill lands inside it: the moments below are in those round trips, and each of the
tasks' round trips before the commit costs the same delay.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests import procs
from tests.brokers import create_topic, unique_topic
from tests.spark.faults import json_input
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _exactly

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tests.conftest import ProxiedKafka



def _start(spark: SparkSession, source: Path, bootstrap: str, topic: str, checkpoint: str) -> StreamingQuery:
    rows = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
            .repartition(2, "id").select(F.col("id").cast("string").alias("key"), F.lit("v").alias("value")))
    return (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
            .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())


def _under_this_process(pid: int | None) -> bool:
    """Whether ``pid`` descends from this test process."""
    while pid not in (None, 0, 1):
        if pid == os.getpid():
            return True
        pid = procs.parent(pid)
    return False


def _wills() -> list[int]:
    """The last-will processes of kprod's commits and aborts under this test process.
    Every process's command line first, the ancestry of matches only: polled every 20 ms,
    a walk of the whole process tree (procs.descendants) took 17 ms of CPU a poll, this 5."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"spark_sink.spark.last_will" in cmdline and _under_this_process(int(entry.name)):
            found.append(int(entry.name))
    return found


def _wait_for_the_commit(query: StreamingQuery, timeout: float = 120.0) -> int:
    """Until the driver's commit has begun: the process of its last will, once armed. A
    query that ends first (failed, or done without a commit to see) fails the wait within
    half a second (asked no more often: each question is a round trip to Spark's JVM)."""
    asked = time.monotonic()
    deadline = asked + timeout
    while not (found := _wills()):
        now = time.monotonic()
        assert now < deadline, "the driver's commit never began"
        if now - asked > 0.5:
            assert query.isActive, f"the query ended before its commit was seen: {query.exception()}"
            asked = now
        time.sleep(0.02)
    return found[0]


# The suite keeps a kill at the commit's start and a random moment and cut; make soak adds a stop.
@pytest.mark.parametrize(("into_commit_s", "cut"), [(0.0, "kill"), pytest.param(0.5, "stop", marks=pytest.mark.soak),
                                                  (None, None)])
def test_a_commit_cut_short_leaves_nothing_open(spark: SparkSession, kafka: KafkaCluster, kafka_proxy: ProxiedKafka,
                                                tmp_path: Path, into_commit_s: float | None, cut: str | None) -> None:
    """Expected: once the query has stopped, nothing of its last microbatch holds
    read_committed readers back (checked within 10 s; transaction.timeout.ms is 60 s);
    restarted, the query writes every row once. ``into_commit_s`` after the commit began
    (before its checks, among its offset commits, or among its EndTxns), the query is
    stopped, or the commit's worker killed and then the query stopped (None: a moment
    and a cut chosen at random)."""
    if into_commit_s is None:
        into_commit_s, cut = random.uniform(0.0, 1.5), random.choice(["stop", "kill"])
        print("cut:", cut, into_commit_s, "s into the commit")

    def cut_short(query: StreamingQuery) -> None:
        worker = procs.parent(_wait_for_the_commit(query))
        time.sleep(into_commit_s)
        if cut == "kill" and worker is not None:
            os.kill(worker, signal.SIGKILL)
        query.stop()

    stopped_and_restarted(spark, kafka, kafka_proxy, tmp_path, cut_short, reply_delay_ms=350)


def stopped_and_restarted(spark: SparkSession, kafka: KafkaCluster, kafka_proxy: ProxiedKafka, tmp_path: Path,
                          cut: Callable[[Any], None], *, files: int = 1, open_after_cut: bool = True,
                          reply_delay_ms: int = 700) -> None:
    """A query writing ``files`` microbatches of 100 rows through replies slowed by
    ``reply_delay_ms``,
    ``cut`` short, restarted without the delay: nothing is left open (``open_after_cut``:
    once the query is cut, else once the restarted one is done) and every row is there once."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-stop"), partitions=2)
    source = json_input(tmp_path, files, 100)
    checkpoint = str(tmp_path / "chk")
    kafka_proxy.proxy.set_delay(reply_delay_ms, replies_only=True)
    query = _start(spark, source, kafka_proxy.bootstrap, topic, checkpoint)
    try:
        cut(query)
    finally:
        kafka_proxy.proxy.set_delay(0)
    if open_after_cut:
        assert_nothing_left_open(kafka.bootstrap, topic, 2)
    query = _start(spark, source, kafka.bootstrap, topic, checkpoint)
    query.awaitTermination(180)
    assert query.exception() is None
    rows = 100 * files
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), {str(i) for i in range(rows)})
