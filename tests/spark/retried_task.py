"""Run by test_task_faults.py as a child process: kprod batch writes in a SparkSession of
its own on local[2,4] (four attempts per task, which the suite's session does not allow),
each of one task that meets a fault on its first attempt once Kafka has acknowledged some
of its records.

    python retried_task.py BOOTSTRAP ROWS ACKED FAULT:TOPIC [FAULT:TOPIC ...]

FAULT is ``sigkill`` (the Python worker running kprod's writer for the task is killed
with SIGKILL) or ``raise`` (the DataFrame's mapInArrow raises). The fault strikes once
TOPIC holds ACKED records. Prints one JSON line per write: its fault and the task
attempts that failed. ``sigkill`` must come first: it finds the writer as the one
process connected to the broker, and a later write's may find an earlier one's idle.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from tests import procs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

VALUE_BYTES = 20


def wait_for_records(bootstrap: str, topic: str, count: int, timeout_s: float = 120.0) -> None:
    """Block until partition 0 of ``topic`` holds ``count`` records (acknowledged ones)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kprod-fault-watch"})
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] >= count:
                return
            time.sleep(0.05)
    finally:
        consumer.close()
    raise RuntimeError(f"{topic} did not reach {count} records in {timeout_s} s: no fault injected")


def kill_kprod_writer(broker_port: int) -> int:
    """SIGKILL the Python worker running kprod's writer for this task: a task worker
    (``pyspark.worker``) under this process's JVM, connected to the broker (the driver's
    workers, which ask the cluster before a write and commit it, run other modules and may
    be connected too); return its pid once it is gone."""
    daemon = procs.parent(os.getpid())  # this worker <- pyspark daemon <- JVM
    jvm = procs.parent(daemon) if daemon is not None else None
    if jvm is None:
        raise RuntimeError("this Python worker has no JVM above it")
    tasks = [pid for pid in procs.descendants(jvm) if pid != os.getpid() and procs.loads_kprod(pid)
             and Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[-2:-1] == [b"pyspark.worker"]]
    writers = procs.connected_to(tasks, broker_port)
    if len(writers) != 1:
        raise RuntimeError(f"expected one kprod writer connected to port {broker_port}, found {writers}")
    os.kill(writers[0], signal.SIGKILL)
    while procs.rss_bytes(writers[0]) is not None:  # a zombie has no VmRSS
        time.sleep(0.01)
    return writers[0]


def write_with_fault(spark: SparkSession, bootstrap: str, topic: str, fault: str, rows: int, acked: int) -> int:
    """One write whose task meets ``fault`` on its first attempt; returns the task
    attempts that failed."""
    from pyspark.sql import functions as F

    broker_port = int(bootstrap.rsplit(":", 1)[1])
    # Well past ACKED, so that the writer has been handed (and has sent) at least that
    # many rows whatever Spark buffers between the two Python workers.
    fault_after = 2 * acked

    def fault_once(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "runs in a Spark task"
        first_attempt = ctx.attemptNumber() == 0
        passed = 0
        for batch in batches:
            yield batch
            passed += batch.num_rows
            if first_attempt and passed >= fault_after:
                wait_for_records(bootstrap, topic, acked)
                if fault == "raise":
                    raise RuntimeError(f"injected fault after {passed} rows, {acked} or more acknowledged")
                pid = kill_kprod_writer(broker_port)
                print(f"killed kprod's writer, pid {pid}, with SIGKILL", file=sys.stderr, flush=True)
                return  # the task now fails on its dead writer, not on rows left out

    spark.sparkContext.setJobGroup(fault, f"kprod write with fault {fault}")
    df = spark.range(rows, numPartitions=1).select(
        F.lpad(F.col("id").cast("string"), VALUE_BYTES, "x").alias("value"))
    (df.mapInArrow(fault_once, df.schema).write.format("kprod").mode("append")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).option("kafka.linger.ms", "5").save())
    tracker = spark.sparkContext.statusTracker()
    jobs = [j for job in tracker.getJobIdsForGroup(fault) if (j := tracker.getJobInfo(job)) is not None]
    stages = [s for job in jobs for stage in job.stageIds if (s := tracker.getStageInfo(stage)) is not None]
    return sum(int(stage.numFailedTasks) for stage in stages)


def main() -> None:
    bootstrap, rows, acked = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2,4]").appName("kprod-task-fault")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.worker.reuse", "true").getOrCreate())
    for write in sys.argv[4:]:
        fault, topic = write.split(":", 1)
        failed = write_with_fault(spark, bootstrap, topic, fault, rows, acked)
        print(json.dumps({"fault": fault, "failed_task_attempts": failed}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
