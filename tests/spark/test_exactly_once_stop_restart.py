"""query.stop() at a random moment after a microbatch's tasks finished, then a restart
(found by a review).

A stop before kprod's commit begins (while Spark starts the commit's Python worker: up to
a second for a query's first microbatch) interrupts Spark before any kprod code runs, and
Spark's abort, called in the same interrupted thread, fails ("failed to abort"): the
tasks' transactions stay open until the query is restarted or transaction.timeout.ms (a
known gap, README Guarantees; not reproduced here on purpose: whether a stop lands before
or inside the commit is a race). What the README promises for it is tested: the restarted
query fences them (its tasks' ids), leaves nothing open and writes every row once,
wherever the stop landed. The commit's round trips are slowed (0.7 s each, replies only,
through the fault proxy) as in test_exactly_once_stop_mid_commit.py.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kprod_broker import KafkaCluster
from tests.spark.test_exactly_once_stop_mid_commit import stopped_and_restarted

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from tests.conftest import ProxiedKafka


def _wait_for_commit_phase(spark: SparkSession, tasks: int, timeout: float = 120.0) -> None:
    """Until the microbatch's write job (a stage of ``tasks`` tasks) has finished: the
    driver commits then."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout
    seen: set[int] = set()
    while time.monotonic() < deadline:
        seen |= set(tracker.getActiveJobsIds())
        for job in seen:
            info = tracker.getJobInfo(job)
            if info is None or info.status != "SUCCEEDED":
                continue
            stages = [tracker.getStageInfo(s) for s in info.stageIds]
            if any(s is not None and s.numTasks == tasks and s.numCompletedTasks == tasks for s in stages):
                return
        time.sleep(0.02)
    raise AssertionError("the microbatch's write job never finished")


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(3))
def test_a_query_stopped_at_a_random_moment_of_its_commit_and_restarted_writes_every_row_once(
        spark: SparkSession, kafka: KafkaCluster, kafka_proxy: ProxiedKafka, tmp_path: Path, seed: int) -> None:
    """The restart after such a stop (at a random moment of the commit, 0.7 s round trips):
    the replayed microbatch completes what the stopped commit did, every row once, and
    nothing is left open once the restarted query is done (its tasks fence their ids)."""
    rng = random.Random(500 + seed)

    def stop_at_random(query: StreamingQuery) -> None:
        _wait_for_commit_phase(spark, 2)
        time.sleep(rng.uniform(0.0, 4.0))
        query.stop()

    stopped_and_restarted(spark, kafka, kafka_proxy, tmp_path, stop_at_random, files=2, open_after_cut=False)
