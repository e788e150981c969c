"""Exactly-once writes over every shape of data: empty and skewed partitions, 200 shuffle
partitions after an aggregation, tasks failing after they sent rows, a microbatch replayed
with another task count, and checkpoints named by URI. After each, every row is visible
once to read_committed, and no transaction is left open: a record produced afterwards is
visible at once (the last stable offset reached the high watermark)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.producer import KafkaProducer, PreparedTransaction, ProducerRecord, RowsDigest
from spark_sink.spark import exactly_once, exactly_once_abort, exactly_once_names
from spark_sink.spark.exactly_once_state import PartlyCommittedError
from spark_sink.spark.options import ExactlyOnce
from spark_sink.spark.task_reports import KProdCommitMessage
from tests.brokers import create_topic, unique_topic
from tests.spark.faults import jvm_sleep, kill_writer
from tests.spark.readback import assert_nothing_left_open

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.conftest import ProxiedKafka

# A few random shapes in the suite; KPROD_SOAK=N tries N more (make soak).
SHAPES = int(os.environ.get("KPROD_SOAK", "0")) or 3


def _write(df: DataFrame, bootstrap: str, topic: str, **options: str) -> None:
    writer = (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once"))
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def _exactly(keys: list[str], expected: set[str]) -> None:
    counts = collections.Counter(k for k in keys if not k.startswith("sentinel"))
    missing, extra = sorted(expected - set(counts))[:5], sorted(set(counts) - expected)[:5]
    assert set(counts) == expected, f"missing {missing}, extra {extra}"
    duplicated = {k: n for k, n in counts.items() if n > 1}
    assert not duplicated, f"written more than once: {list(duplicated.items())[:5]}"


def _setting(spark: SparkSession, key: str) -> str:
    """A Spark SQL setting the session has a value for."""
    value = spark.conf.get(key)
    assert value is not None, key
    return value


def _partition_id() -> int:
    """The partition of the Spark task this runs in."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    assert ctx is not None, "runs in a Spark task"
    return ctx.partitionId()


def test_a_dataframe_with_empty_partitions(spark: SparkSession, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-empty"), partitions=2)
    df = spark.range(3, numPartitions=6).select(F.col("id").cast("string").alias("key"), F.lit("v").alias("value"))
    _write(df, kafka.bootstrap, topic)
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), {"0", "1", "2"})


def test_an_aggregation_over_200_shuffle_partitions(spark: SparkSession, kafka: KafkaCluster) -> None:
    """The default spark.sql.shuffle.partitions: most of the 200 tasks have no row."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-agg"), partitions=3)
    saved = {k: _setting(spark, k) for k in ("spark.sql.adaptive.enabled", "spark.sql.shuffle.partitions")}
    # Without adaptive execution, which would coalesce the empty partitions away.
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        df = (spark.range(1000).groupBy((F.col("id") % 7).alias("k")).count()
              .select(F.col("k").cast("string").alias("key"), F.col("count").cast("string").alias("value")))
        assert df.rdd.getNumPartitions() == 200
        _write(df, kafka.bootstrap, topic)
    finally:
        for key, value in saved.items():
            spark.conf.set(key, value)
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 3), {str(k) for k in range(7)})


def test_a_task_that_fails_after_sending_aborts_its_transaction(spark: SparkSession, kafka: KafkaCluster) -> None:
    """local[2] retries no task: the write fails, and what its tasks sent is aborted
    rather than left open until transaction.timeout.ms."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-taskfail"), partitions=2)
    schema = "key string, value string"

    def fail_after_sending(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from batches
        if _partition_id() == 1:
            raise RuntimeError("injected failure after the rows were handed to the sink")

    df = (spark.range(4000, numPartitions=2).select(F.col("id").cast("string").alias("key"), F.lit("v").alias("value"))
          .mapInArrow(fail_after_sending, schema))
    with pytest.raises(Exception, match="injected failure"):
        _write(df, kafka.bootstrap, topic)
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), set())


def test_foreach_batch_in_update_mode_over_an_aggregation(spark: SparkSession, kafka: KafkaCluster,
                                                          tmp_path: Path) -> None:
    """A streaming aggregation written with foreachBatch: each microbatch a batch write of
    200 shuffle partitions, a new transactional-id prefix each time."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-fb"), partitions=2)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(3):
        (source / f"{f}.json").write_text("\n".join(json.dumps({"id": f * 100 + i}) for i in range(100)) + "\n")
    counts = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
              .groupBy((F.col("id") % 5).alias("k")).count())

    def write(batch_df: DataFrame, batch_id: int) -> None:
        _write(batch_df.select(F.concat_ws("@", F.col("k").cast("string"), F.lit(str(batch_id))).alias("key"),
                               F.col("count").cast("string").alias("value")), kafka.bootstrap, topic)

    query = (counts.writeStream.outputMode("update").foreachBatch(write)
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), {f"{k}@{b}" for k in range(5) for b in range(3)})


@pytest.mark.soak  # the batch aggregation over 200 shuffle partitions stays in the suite
def test_a_streaming_aggregation_over_50_shuffle_partitions(spark: SparkSession, kafka: KafkaCluster,
                                                            tmp_path: Path) -> None:
    """kprod itself as the sink of a streaming aggregation (Complete mode: Spark offers
    Python data sources no Update mode): each microbatch 50 tasks, most of them empty, each
    microbatch's counts visible once. (50, not the default 200 of the batch test above: a
    stateful query's every shuffle partition has a state store, which made this the suite's
    costliest test.)"""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-stream-agg"), partitions=2)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(2):
        (source / f"{f}.json").write_text("\n".join(json.dumps({"id": f * 100 + i}) for i in range(100)) + "\n")
    saved = _setting(spark, "spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "50")  # a stateful query keeps its count
    try:
        counts = (spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).json(str(source))
                  .groupBy((F.col("id") % 5).alias("k")).count()
                  .select(F.concat_ws("@", F.col("k").cast("string"), F.col("count").cast("string")).alias("key"),
                          F.lit("v").alias("value")))
        query = (counts.writeStream.format("kprod").outputMode("complete")
                 .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic)
                 .option("kprod.deliveryGuarantee", "exactly-once")
                 .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", saved)
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 2), {f"{k}@{n}" for k in range(5) for n in (20, 40)})


def test_the_prefix_comes_from_the_query_id_whatever_the_checkpoint_is_called(spark: SparkSession,
                                                                              kafka: KafkaCluster, tmp_path: Path) -> None:
    """A file:// URI and a plain path name the same checkpoint, so the same query: the
    restarted query finds its own commit records under the same prefix."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-uri"), partitions=1)
    source = tmp_path / "in"
    source.mkdir()
    checkpoint = tmp_path / "chk"
    ids = []
    for run, name in enumerate((checkpoint.as_uri(), str(checkpoint))):
        (source / f"{run}.json").write_text(json.dumps({"id": run}) + "\n")
        rows = spark.readStream.schema("id LONG").json(str(source)).select(
            F.col("id").cast("string").alias("key"), F.lit("v").alias("value"))
        query = (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap)
                 .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
                 .option("checkpointLocation", name).trigger(availableNow=True).start())
        query.awaitTermination(300)
        assert query.exception() is None
        ids.append(query.id)
    assert ids[0] == ids[1]
    directory = exactly_once_names.directory_group(ExactlyOnce(None, topic).prefix_for(ids[0]))
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        offset, metadata = admin.committed_offsets({directory: [(topic, 0)]})[directory][(topic, 0)]
    assert offset == 1 and metadata is not None and json.loads(metadata)["query"] == ids[0]
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, 1), {"0", "1"})


def assert_visible_once(kafka: KafkaCluster, topic: str, rows: list[bytes], note: str = "", partitions: int = 2) -> None:
    """Every one of ``rows`` visible to read_committed once (none twice, none lost), and
    nothing left open on the topic's partitions."""
    expected = collections.Counter(v.decode() for v in rows)
    # Read up to sentinels produced now (the rows' keys are their values): every row
    # committed is before them, so no time is spent waiting for duplicates that may come.
    got = collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, partitions))
    twice = sorted(k for k, n in got.items() if n > 1)
    lost = sorted(set(expected) - set(got))
    assert not twice and not lost, f"visible twice: {twice}; never visible: {lost}{note}"
    assert got == expected


def _prepared_tasks(bootstrap: str, prefix: str, topic: str, rows: dict[int, list[bytes]], query: str | None
                    ) -> list[KProdCommitMessage]:
    """What a run's tasks return: each partition's rows sent in a prepared transaction (none
    for a partition without rows)."""
    messages = []
    for partition, values in rows.items():
        if not values:  # an empty task opens no transaction
            messages.append(KProdCommitMessage(partition_id=partition, attempt=0, records=0, bytes=0,
                                               query_id=query, rows_digest=str(RowsDigest())))
            continue
        with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                            "transactional.id": exactly_once_names.transactional_id(prefix, partition)}) as p:
            exactly_once_names.fence_and_begin(p)
            for v in values:
                p.send(ProducerRecord(topic, v, key=v))
            txn = p.prepare_transaction()
        digest = RowsDigest()  # as a Spark task computes it from the rows it sends
        digest.add(pa.table({"key": pa.array(values, pa.binary()), "value": pa.array(values, pa.binary())}))
        messages.append(KProdCommitMessage(partition_id=partition, attempt=0, records=len(values), bytes=0,
                                           transaction=txn, query_id=query,
                                           rows_digest=str(digest)))
    return messages


class _Crash(BaseException):
    """The driver dies part-way through its commit."""


@contextlib.contextmanager
def driver_dies_committing(*tasks: int) -> Iterator[None]:
    """Within: the driver's commit ends (EndTxn) the transactions of ``tasks`` only, then
    dies; its next commit is a new driver process's (which fences what it finds first)."""
    real_end = AdminClient.end_transactions
    ends = tuple(f"-{p}" for p in tasks)

    def end_some_then_crash(self: AdminClient, transactions: Iterable[PreparedTransaction], commit: bool,
                            timeout_ms: float | None = None) -> None:
        transactions = list(transactions)
        if commit:
            real_end(self, [t for t in transactions if t.transactional_id.endswith(ends)], commit)
            raise _Crash()
        real_end(self, transactions, commit, timeout_ms)

    AdminClient.end_transactions = end_some_then_crash  # type: ignore[method-assign]  # the driver dies mid-commit
    try:
        with pytest.raises(_Crash):
            yield
    finally:
        AdminClient.end_transactions = real_end  # type: ignore[method-assign]
        exactly_once._fenced.clear()


def test_a_replay_with_fewer_tasks_finds_what_a_larger_run_committed(kafka: KafkaCluster) -> None:
    """Run 1 splits microbatch 0 into four tasks and dies after committing two of them;
    run 2 has two tasks: it must not commit everything again (it refuses, saying why);
    run 3, split as run 1 was, commits only the two missing tasks."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-replay"), partitions=2)
    config = {"bootstrap.servers": kafka.bootstrap}
    query = unique_topic("query")
    eo = ExactlyOnce(None, topic)
    prefix = eo.prefix_for(query)
    rows4 = {p: [b"%d-%d" % (p, i) for i in range(5)] for p in range(4)}

    with driver_dies_committing(2, 3):
        exactly_once.commit(config, eo, _prepared_tasks(kafka.bootstrap, prefix, topic, rows4, query), 0)

    rows2 = {0: rows4[0] + rows4[1], 1: rows4[2] + rows4[3]}
    run2 = _prepared_tasks(kafka.bootstrap, prefix, topic, rows2, query)
    with pytest.raises(PartlyCommittedError, match="2 of 4"):
        exactly_once.commit(config, eo, run2, 0)
    exactly_once_abort.abort(config, eo, run2)
    exactly_once._fenced.clear()

    run3 = _prepared_tasks(kafka.bootstrap, prefix, topic, rows4, query)
    assert exactly_once.commit(config, eo, run3, 0).transactions == 2
    expected = {v.decode() for values in rows4.values() for v in values}
    got = assert_nothing_left_open(kafka.bootstrap, topic, 2)
    assert collections.Counter(got) == collections.Counter(expected)


@pytest.mark.parametrize("seed", range(SHAPES))
def test_random_shapes_timings_and_failures(spark: SparkSession, kafka: KafkaCluster, kafka_proxy: ProxiedKafka,
                                            seed: int) -> None:
    """Random shapes (partition counts, many empty or skewed tasks, waves of more tasks than
    cores), timings (tasks that pause with their transaction open, a
    transaction.timeout.ms close to the write's length) and failures (a task raising in
    Python or in the JVM, before or after others reported, a writer SIGKILLed at a random
    moment): the write is all there exactly once, or nothing of it is and nothing stays
    open; a write that outlasted its timeout, run again as a scheduler would, is there once."""
    rng = random.Random(seed)
    partitions = rng.choice([1, 2, 7, 24])
    tasks = rng.choice([1, 3, 8, 40])
    rows = rng.choice([0, 1, 5, 300, 3000, 30000])
    skew = rng.random() < 0.5
    fault = rng.choice(["none", "none", "python", "jvm", "kill"])
    fail_task = rng.randrange(tasks)
    fail_after = rng.randrange(3)
    pauses = {rng.randrange(max(rows, 1)): rng.choice([500, 1500, 3000]) for _ in range(rng.randrange(3))}
    timeout_ms = rng.choice([None, None, 3000, 6000])
    kill_after_s = rng.uniform(0.5, 6.0)
    shape = dict(partitions=partitions, tasks=tasks, rows=rows, skew=skew, fault=fault, fail_task=fail_task,
                 pauses=pauses, timeout_ms=timeout_ms)
    print("shape:", shape)
    topic = create_topic(kafka.bootstrap, unique_topic(f"eos-rand{seed}"), partitions=partitions)

    def python_fault(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        failing = fault == "python" and _partition_id() == fail_task
        for i, batch in enumerate(batches):
            if failing and i == fail_after:
                raise RuntimeError("injected failure")
            yield batch
        if failing:
            raise RuntimeError("injected failure")

    ids = spark.range(rows, numPartitions=tasks)
    if skew:  # most rows in one task
        ids = ids.repartitionByRange(tasks, F.when(F.col("id") % 10 == 0, F.col("id")).otherwise(F.lit(0)))
    value = F.lit("v")
    for row, ms in pauses.items():  # in the JVM: the rows before it reach the sink meanwhile
        value = F.when(F.col("id") == row, F.concat(F.lit("v"), jvm_sleep(ms))).otherwise(value)
    if fault == "jvm" and rows:
        value = F.when(F.col("id") == rng.randrange(rows), F.raise_error(F.lit("injected failure"))).otherwise(value)
    df = ids.select(F.col("id").cast("string").alias("key"), value.alias("value"))
    if fault == "python":
        df = df.mapInArrow(python_fault, "key string, value string")
    options = {"kafka.batch.size": str(rng.choice([1000, 1000000])), "kafka.buffer.memory": "262144"}
    if timeout_ms:
        options["kafka.transaction.timeout.ms"] = str(timeout_ms)
    killer = None
    if fault == "kill":
        killer = threading.Timer(kill_after_s, kill_writer, (kafka_proxy.proxy.port, rng))
        killer.start()
    # (Spark runs no Python for an empty partition: a failure planned there does not happen.)
    try:
        _write(df, kafka_proxy.bootstrap, topic, **options)
        expected = {str(i) for i in range(rows)}
    except Exception as exc:
        text = str(exc)
        assert ("injected failure" in text or "outlasted its transactions' timeout" in text
                or fault == "kill"), text[:3000]
        _exactly(assert_nothing_left_open(kafka.bootstrap, topic, partitions), set())
        if "outlasted" not in text:
            return
        _write(df, kafka.bootstrap, topic, **{k: v for k, v in options.items() if "timeout" not in k})
        expected = {str(i) for i in range(rows)}
    finally:
        if killer is not None:
            killer.cancel()
            killer.join()
    _exactly(assert_nothing_left_open(kafka.bootstrap, topic, partitions), expected)


@pytest.mark.soak  # the suite writes on protocol v1 in the crash points and the driver tests
def test_writes_on_protocol_v1(spark: SparkSession, kafka_tv1: KafkaCluster, kafka_tv1_proxy: ProxiedKafka) -> None:
    """On a cluster without transaction protocol v2 (AddPartitionsToTxn, AddOffsetsToTxn,
    EndTxn v4): a failing task, a replay's markers, and a random shape."""
    test_a_task_that_fails_after_sending_aborts_its_transaction(spark, kafka_tv1)
    test_a_replay_with_fewer_tasks_finds_what_a_larger_run_committed(kafka_tv1)
    test_random_shapes_timings_and_failures(spark, kafka_tv1, kafka_tv1_proxy, 0)
