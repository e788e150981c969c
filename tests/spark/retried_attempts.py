"""Run by test_exactly_once_retried_attempts.py as a child process: kprod writes in a
SparkSession of its own on local[2,4] (four attempts per task, which the suite's session
does not allow) whose one task fails on its first attempt once Kafka holds some of its
records, and whose retry is given the same rows or others: fewer, more or none (a
nondeterministic source or filter, input files gone, a ``sample()``).

    python retried_attempts.py BOOTSTRAP CHECKPOINT_DIR CASE_JSON [CASE_JSON ...]

Each CASE_JSON is an object: ``mode`` ("batch" or "stream"), ``topic``, ``fault``
("sigkill": the Python worker running kprod's writer is killed; "raise": the task's input
raises), ``first`` (the rows attempt 0 is given), ``retry`` (the rows every later attempt
is given: a prefix of the same ids, or more), ``acked`` (how many records of attempt 0
Kafka holds when the fault strikes), for a stream ``microbatches`` (1 or more; the fault
strikes in the last, each earlier one writes ``first`` rows of its own cleanly), and
optionally ``guarantee`` (kprod.deliveryGuarantee, exactly-once unless given).
Prints one JSON line per case: the ids that should be visible once, how the write ended
(``ok`` or the error's first line) and, for a batch write, the task attempts that failed.

At-least-once writes keep their producers pooled in the Python workers (still connected):
give them last, or a later ``sigkill`` finds two writers connected.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from tests import procs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The ids of microbatch m are m * STRIDE and up: a microbatch's rows tell which it is.
STRIDE = 1_000_000
# Spark's Arrow batches of this many rows, of VALUE_BYTES each: each batch a call of its own.
BATCH_ROWS, VALUE_BYTES = 1000, 100
# The writer joins Spark's Arrow batches into calls of at most writer.send_bytes_for(
# buffer.memory) bytes: with a small buffer (calls of less than two batches) each batch of
# rows is sent as it comes, so that attempt 0 has records in Kafka while its input is
# still running (main() checks it).
SMALL_BUFFER = "262144"


class RecordCount:
    """How many records the partitions of ``topic`` hold in all (acknowledged ones,
    committed or not), as their end offsets say."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer

        # read_uncommitted: a read_committed end offset stops at the open transaction.
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kprod-fault-watch",
                                  "isolation.level": "read_uncommitted"})
        self.topic = topic
        self.partitions = list(self.consumer.list_topics(topic, timeout=30).topics[topic].partitions)

    def __call__(self) -> int:
        from confluent_kafka import TopicPartition

        return sum(self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                   for p in self.partitions)

    def wait(self, count: int, timeout_s: float = 120.0) -> None:
        import time

        deadline = time.monotonic() + timeout_s
        while self() < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.topic} did not reach {count} records in {timeout_s} s (it holds "
                                   f"{self()}): no fault injected")
            time.sleep(0.05)

    def close(self) -> None:
        self.consumer.close()


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


def _fault_task(case: dict, bootstrap: str,
                faulty_batch: int) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The mapInArrow function: attempt 0 of the faulty microbatch's task passes ``first``
    rows and meets the fault once ``acked`` of them are in Kafka; later attempts pass
    ``retry`` rows; the other microbatches pass ``first`` rows."""
    fault, first, retry, acked, topic = case["fault"], case["first"], case["retry"], case["acked"], case["topic"]
    broker_port = int(bootstrap.rsplit(":", 1)[1])

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None, "runs in a Spark task"
        first_attempt = ctx.attemptNumber() == 0
        count = None
        for batch in batches:
            if batch.num_rows == 0:
                continue
            batch_no = pc.min(batch.column("id")).as_py() // STRIDE
            faulty = batch_no == faulty_batch
            keep = first if not faulty or first_attempt else retry
            offset = pc.subtract(batch.column("id"), batch_no * STRIDE)
            batch = batch.filter(pc.less(offset, keep))
            if batch.num_rows:
                yield batch
            if not (faulty and first_attempt):
                continue
            # Earlier microbatches' records (and their commit markers) count toward the
            # partitions' end offsets: the fault may strike a little early, never late.
            count = count or RecordCount(bootstrap, topic)
            target = faulty_batch * first + acked
            last = pc.max(offset).as_py() >= first - 1
            if count() < target and not last:
                continue  # more rows first: the writer sends each batch once the next comes
            count.wait(target)
            count.close()
            if fault == "raise":
                raise RuntimeError("injected fault on the first attempt")
            pid = kill_kprod_writer(broker_port)
            print(f"killed kprod's writer, pid {pid}, with SIGKILL", file=sys.stderr, flush=True)
            return  # the task now fails on its dead writer, not on rows left out

    return run


def _rows(spark: SparkSession, batch_no: int, count: int) -> DataFrame:
    return spark.range(batch_no * STRIDE, batch_no * STRIDE + count, numPartitions=1)


def _as_records(df: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return df.select(F.col("id"), F.col("id").cast("string").alias("key"),
                     F.lpad(F.col("id").cast("string"), VALUE_BYTES, "v").alias("value"))


def _guarantee(case: dict) -> str:
    return str(case.get("guarantee", "exactly-once"))


def run_batch(spark: SparkSession, bootstrap: str, case: dict) -> tuple[list[int], int]:
    """The ids written, and the task attempts of the write that failed."""
    rows = max(case["first"], case["retry"])
    spark.sparkContext.setJobGroup(case["topic"], "kprod write with a fault")
    df = _as_records(_rows(spark, 0, rows)).mapInArrow(_fault_task(case, bootstrap, 0), "id long, key string, value string")
    (df.drop("id").write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", case["topic"]).option("kprod.deliveryGuarantee", _guarantee(case))
     .option("kafka.linger.ms", "5").option("kafka.buffer.memory", SMALL_BUFFER).save())
    tracker = spark.sparkContext.statusTracker()
    jobs = [j for job in tracker.getJobIdsForGroup(case["topic"]) if (j := tracker.getJobInfo(job)) is not None]
    stages = [s for job in jobs for stage in job.stageIds if (s := tracker.getStageInfo(stage)) is not None]
    return list(range(case["retry"])), sum(int(stage.numFailedTasks) for stage in stages)


def run_stream(spark: SparkSession, bootstrap: str, case: dict, checkpoints: Path) -> list[int]:
    """Microbatches from a file source (one file each); the fault in the last one."""
    microbatches = case["microbatches"]
    rows = max(case["first"], case["retry"])
    source = checkpoints / f"{case['topic']}-in"
    source.mkdir(parents=True)
    for m in range(microbatches):
        (source / f"{m:03d}.json").write_text(
            "".join(json.dumps({"id": m * STRIDE + i}) + "\n" for i in range(rows)))
    last = microbatches - 1
    df = _as_records(spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source)))
    df = df.mapInArrow(_fault_task(case, bootstrap, last), "id long, key string, value string").drop("id")
    query = (df.writeStream.format("kprod").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", case["topic"]).option("kprod.deliveryGuarantee", _guarantee(case))
             .option("kafka.linger.ms", "5").option("kafka.buffer.memory", SMALL_BUFFER)
             .option("checkpointLocation", str(checkpoints / case["topic"]))
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [m * STRIDE + i for m in range(last) for i in range(case["first"])] + \
        [last * STRIDE + i for i in range(case["retry"])]


def main() -> None:
    bootstrap, checkpoints = sys.argv[1], Path(sys.argv[2])
    from pyspark.sql import SparkSession

    from spark_sink.spark.writer import send_bytes_for

    if send_bytes_for(int(SMALL_BUFFER)) >= 2 * BATCH_ROWS * VALUE_BYTES:
        raise SystemExit(f"buffer.memory {SMALL_BUFFER} lets the writer join two of Spark's batches into a call: "
                         "attempt 0 would hold its rows back from Kafka")

    spark = (SparkSession.builder.master("local[2,4]").appName("kprod-retried-attempts")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "1")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", str(BATCH_ROWS))
             .config("spark.python.worker.reuse", "true").getOrCreate())
    for raw in sys.argv[3:]:
        case = json.loads(raw)
        started = time.monotonic()
        failed: int | None = None
        try:
            if case["mode"] == "stream":
                expected = run_stream(spark, bootstrap, case, checkpoints)
            else:
                expected, failed = run_batch(spark, bootstrap, case)
            outcome = "ok"
        except Exception as exc:  # reported to the test, which decides
            expected, outcome = [], str(exc).splitlines()[0][:2000]
        print(json.dumps({"topic": case["topic"], "outcome": outcome, "expected": expected,
                          "failed_task_attempts": failed, "seconds": round(time.monotonic() - started, 1)}),
              flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
