"""Exactly-once over time and failure order: writes that outlast their transactions'
timeout, microbatches that fail before any task reports, prefixes whose names could meet,
a second attempt of a task that fences the first, and markers that are gone. Each case
once broke exactly-once on Apache Kafka; each is run against a real broker here."""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.client.clock import SYSTEM_TIME
from spark_sink.producer import KafkaProducer, PreparedTransaction, ProducerRecord
from spark_sink.spark import exactly_once, exactly_once_abort, exactly_once_names, exactly_once_state
from spark_sink.spark.exactly_once import MarkersMissingError, TransactionsEndedError
from spark_sink.spark.options import ExactlyOnce, parse_options
from spark_sink.spark.task_reports import KProdCommitMessage
from tests.brokers import consume_all, create_topic, unique_topic
from tests.clock import MovedClock
from tests.spark.faults import jvm_sleep, kill_writer
from tests.spark.readback import CommittedView, assert_nothing_left_open

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tests.conftest import ProxiedKafka


def _committed_values(bootstrap: str, topic: str, expected: int, settle: float = 1.0) -> list[str]:
    """What read_committed sees (reading ``settle`` s more for duplicates): the other
    exactly-once modules' read-back; this module's reads up to sentinels instead
    (assert_nothing_left_open returns the keys read_committed saw before them, duplicates
    included; every test here keys its rows by their values)."""
    return [m.value().decode() for m in consume_all(bootstrap, topic, expected, settle=settle,
                                                    overrides={"isolation.level": "read_committed"})]


def _prepare(bootstrap: str, tid: str, topic: str, values: list[bytes], **config: str
             ) -> tuple[KafkaProducer, KProdCommitMessage]:
    """A task's side: ``values`` sent in a transaction left open (its producer returned
    open, as a task that is still running, or closed by the caller)."""
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0, "transactional.id": tid, **config})
    began = time.time() * 1000
    exactly_once_names.fence_and_begin(producer)
    for v in values:
        producer.send(ProducerRecord(topic, v, key=v))
    txn = producer.prepare_transaction()
    partition = int(tid.rsplit("-", 1)[1])
    return producer, KProdCommitMessage(partition_id=partition, attempt=0, records=len(values), bytes=0,
                                        transaction=txn, query_id="q",
                                        transaction_began_ms=began)


def _prepared_tasks(bootstrap: str, prefix: str, topic: str, query: str | None = "q", tag: str = "",
                    tasks: int = 2, rows: int = 20) -> list[KProdCommitMessage]:
    """What a run's tasks return: task p's rows ``<tag><p>-<i>`` in a prepared transaction."""
    out = []
    for p in range(tasks):
        producer, message = _prepare(bootstrap, exactly_once_names.transactional_id(prefix, p), topic,
                                     [f"{tag}{p}-{i}".encode() for i in range(rows)])
        producer.close()
        out.append(dataclasses.replace(message, query_id=query))
    return out


# -- a write that outlasts transaction.timeout.ms --------------------------------------


def test_a_batch_write_that_outlasts_its_transactions_fails_whole_and_a_rerun_writes_it_once(spark: SparkSession,
                                                                                             kafka: KafkaCluster) -> None:
    """Four tasks on local[2], each pausing 3 s half-way with its transaction open: the
    first wave's transactions wait ~7 s for the last task, longer than
    kafka.transaction.timeout.ms=4000. The write fails saying so, nothing of it is visible,
    nothing stays open, and the same rows written again (at the default, the broker's
    transaction.max.timeout.ms; without the pauses, which only made the first write long)
    are visible exactly once."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-outlast"), partitions=2)
    rows, per_task = 80_000, 20_000
    halfway = F.col("id") % per_task == per_task // 2
    ids = spark.range(rows, numPartitions=4)
    df = ids.select(
        F.col("id").cast("string").alias("key"),
        F.when(halfway, F.concat(F.col("id").cast("string"), jvm_sleep(3000))).otherwise(
            F.col("id").cast("string")).alias("value"))

    def write(df: DataFrame, **options: str) -> None:
        writer = (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka.bootstrap)
                  .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
                  .option("kafka.buffer.memory", "262144"))  # rows reach Kafka as they come
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.save()

    with pytest.raises(Exception, match="outlasted its transactions' timeout") as failure:
        write(df, **{"kafka.transaction.timeout.ms": "4000"})
    text = str(failure.value)
    assert "fenced" not in text and "kafka.transaction.timeout.ms is 4000 ms" in text
    assert "transaction.max.timeout.ms=900000" in text and "Nothing of the batch write is visible" in text
    assert assert_nothing_left_open(kafka.bootstrap, topic, 2) == []
    write(ids.select(F.col("id").cast("string").alias("key"), F.col("id").cast("string").alias("value")))
    values = assert_nothing_left_open(kafka.bootstrap, topic, 2)
    assert collections.Counter(values) == collections.Counter(str(i) for i in range(rows))


def test_an_exactly_once_batch_write_takes_the_brokers_longest_transaction_timeout(kafka: KafkaCluster) -> None:
    topic = unique_topic("eos-maxtimeout")
    options = {"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic, "kprod.deliveryGuarantee": "exactly-once"}
    planned = exactly_once.with_transaction_timeout(parse_options(options))
    assert planned.producer_config["transaction.timeout.ms"] == "900000"  # Kafka's default maximum
    given_one = exactly_once.with_transaction_timeout(parse_options({**options, "kafka.transaction.timeout.ms": "7000"}))
    assert given_one.producer_config["transaction.timeout.ms"] == "7000"
    streaming = exactly_once.with_transaction_timeout(parse_options(options, streaming=True))
    assert "transaction.timeout.ms" not in streaming.producer_config  # Java's 60 s, as documented


def test_a_commit_after_the_timeout_says_timed_out_never_fenced(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-late"), partitions=1)
    config = {"bootstrap.servers": kafka.bootstrap, "transaction.timeout.ms": "2000"}
    prefix = unique_topic("late")
    producers, messages = zip(*(_prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, p), topic,
                                         [b"%d" % p], **{"transaction.timeout.ms": "2000"}) for p in range(2)))
    for p in producers:
        p.close()
    time.sleep(2.5)
    with pytest.raises(TransactionsEndedError, match="outlasted") as failure:
        exactly_once.commit(config, ExactlyOnce(prefix, topic, one_write=True), list(messages), None)
    assert "fenced" not in str(failure.value) and "2 of 2 timed out" in str(failure.value)
    assert assert_nothing_left_open(kafka.bootstrap, topic, 1) == []



def test_an_endtxn_refused_after_the_check_fails_saying_how_many_were_committed(kafka: KafkaCluster) -> None:
    """The driver's check found both transactions open, then task 1's was ended by another
    producer before its EndTxn (the window the margin covers): the error says one of two
    was committed, and task 0's rows are visible, task 1's are not."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-refused"), partitions=1)
    prefix = unique_topic("refused")
    producers, messages = zip(*(_prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, p), topic,
                                         [b"%d" % p]) for p in range(2)))
    for p in producers:
        p.close()
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap,
                        "transactional.id": exactly_once_names.transactional_id(prefix, 1)}) as fencer:
        fencer.init_transactions()  # aborts task 1's transaction under a new epoch
    config = {"bootstrap.servers": kafka.bootstrap}
    admin = AdminClient(config)
    try:
        txns = {m.partition_id: m.transaction for m in messages}
        with pytest.raises(TransactionsEndedError, match="1 of its 2 transaction") as failure:
            exactly_once._end_checked(admin, config, txns, {}, "batch write", SYSTEM_TIME)
    finally:
        admin.close()
    assert "ended by another producer" in str(failure.value)
    assert "kprod.transactionalIdPrefix" in str(failure.value) and "spark.speculation" in str(failure.value)
    assert assert_nothing_left_open(kafka.bootstrap, topic, 1) == ["0"]

# -- a microbatch that fails before any task reports ----------------------------------


def _wait_for_any_record(bootstrap: str, topic: str, timeout_s: float = 60.0) -> None:
    """Until a record of ``topic`` is in Kafka (committed or not)."""
    view = CommittedView(bootstrap, topic, "read_uncommitted")
    try:
        deadline = time.monotonic() + timeout_s
        while view.poll(0.2) == 0 and time.monotonic() < deadline:
            pass
    finally:
        view.close()


def test_a_microbatch_failing_before_any_task_reports_leaves_nothing_open(spark: SparkSession, kafka: KafkaCluster,
                                                                          kafka_proxy: ProxiedKafka, tmp_path: Path) -> None:
    """The default prefix (from the query id, which the driver does not know): one task has
    sent rows in an open transaction when its writer is SIGKILLed (as an out-of-memory kill
    does), and another task hits a poison row. No task reported and neither could abort its
    own, yet the driver's abort fences the open transaction: a record produced afterwards
    is visible to read_committed at once, not after transaction.timeout.ms."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-poison"), partitions=2)
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.json").write_text("\n".join(json.dumps({"id": i}) for i in range(30_000)) + "\n")
    (source / "b.json").write_text(json.dumps({"id": -1}) + "\n")
    # Pauses inside the JVM, which hands the sink the rows before them (a Python UDF would
    # hand over its output only once done): the first task holds its open transaction.
    value = (F.when(F.col("id") == 20_000, F.concat(F.lit("v"), jvm_sleep(60_000)))
             .when(F.col("id") == -1, F.concat(jvm_sleep(8_000), F.raise_error(F.lit("poison row -1"))))
             .otherwise(F.lit("v")))
    rows = spark.readStream.schema("id LONG").json(str(source)).select(
        F.col("id").cast("string").alias("key"), value.alias("value"))
    # Only this query's writers connect through the proxy: the one to kill is found by it.
    query = (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka_proxy.bootstrap)
             .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
             .option("kafka.buffer.memory", "262144")  # rows reach Kafka as they come
             # Far longer than the test: only the driver's fence can end the open transaction.
             .option("kafka.transaction.timeout.ms", "600000")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    _wait_for_any_record(kafka.bootstrap, topic)
    kill_writer(kafka_proxy.proxy.port)
    with pytest.raises(Exception, match="poison row|Python worker exited|EOFError|crashed|Connection reset"):
        query.awaitTermination(120)
    assert assert_nothing_left_open(kafka.bootstrap, topic, 2, within_s=5.0) == []


def test_query_stop_in_the_middle_of_a_microbatch_leaves_nothing_open(spark: SparkSession, kafka: KafkaCluster,
                                                                      tmp_path: Path) -> None:
    """query.stop() while a task holds an open transaction with rows in it: the microbatch
    is not committed, and nothing of it holds read_committed readers back."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-stop"), partitions=2)
    source = tmp_path / "in"
    source.mkdir()
    (source / "a.json").write_text("\n".join(json.dumps({"id": i}) for i in range(30_000)) + "\n")
    value = F.when(F.col("id") == 20_000, F.concat(F.lit("v"), jvm_sleep(60_000))).otherwise(F.lit("v"))
    rows = spark.readStream.schema("id LONG").json(str(source)).select(
        F.col("id").cast("string").alias("key"), value.alias("value"))
    query = (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap)
             .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
             .option("kafka.buffer.memory", "262144").option("kafka.transaction.timeout.ms", "600000")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    _wait_for_any_record(kafka.bootstrap, topic)
    query.stop()
    assert assert_nothing_left_open(kafka.bootstrap, topic, 2, within_s=5.0) == []


def test_the_driver_finds_the_prefix_its_tasks_registered(kafka: KafkaCluster) -> None:
    """The abort of a microbatch whose every task failed reads the prefix its tasks
    recorded before their first transaction, and fences their ids."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-registry"), partitions=1)
    eo = parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                        "kprod.deliveryGuarantee": "exactly-once", "checkpointLocation": "/x/" + topic},
                       streaming=True).exactly_once
    assert eo is not None
    prefix = eo.prefix_for(unique_topic("query"))
    config = {"bootstrap.servers": kafka.bootstrap}
    exactly_once_state.register_prefix(config, eo, prefix)
    producer, _ = _prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, 1), topic, [b"held"])
    try:
        exactly_once_abort.abort(config, eo, [None, None], MovedClock())  # no Spark task to wait for
        assert_nothing_left_open(kafka.bootstrap, topic, 1)
    finally:
        producer.close()


# -- names -------------------------------------------------------------------------------


def _die_after_committing_task_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver dies in the middle of its commit: its EndTxns reach task 1's transaction
    only (``monkeypatch.undo()`` brings the real commit back)."""
    real_end = AdminClient.end_transactions

    def commit_task_1_then_die(self: AdminClient, transactions: Iterable[PreparedTransaction], commit: bool,
                               timeout_ms: float | None = None) -> None:
        transactions = list(transactions)
        if commit:
            real_end(self, [t for t in transactions if t.transactional_id.endswith("-1")], commit)
            raise KeyboardInterrupt("the driver dies")
        real_end(self, transactions, commit, timeout_ms)

    monkeypatch.setattr(AdminClient, "end_transactions", commit_task_1_then_die)


def _names(prefix: str, tasks: int) -> set[str]:
    return ({exactly_once_names.directory_group(prefix)}
            | {exactly_once_names.transactional_id(prefix, p) for p in range(tasks)})


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12), st.integers(1, 120))
def test_the_names_of_two_prefixes_never_meet(a: str, b: str, tasks: int) -> None:
    if a != b:
        assert not _names(a, tasks) & _names(b, tasks)
        assert exactly_once_names.registry_group(a) not in _names(b, tasks)


def test_prefixes_x_and_x_1_keep_their_markers_apart(kafka: KafkaCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Query A (prefix X) commits task 1 of microbatch 0 and dies; query B (prefix X-1)
    commits a microbatch; A's replay still finds its own marker: A's rows once."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-names"), partitions=1)
    config = {"bootstrap.servers": kafka.bootstrap}
    x = unique_topic("X")
    a, b = ExactlyOnce(x, topic), ExactlyOnce(x + "-1", topic)

    def prepared(eo: ExactlyOnce, query: str, tasks: int, tag: str) -> list[KProdCommitMessage]:
        return _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, query, tag, tasks, rows=50)

    _die_after_committing_task_1(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        exactly_once.commit(config, a, prepared(a, "query-a", 2, "a"), 0)
    monkeypatch.undo()  # a new driver process
    exactly_once._fenced.clear()
    assert exactly_once.commit(config, b, prepared(b, "query-b", 2, "b"), 0).transactions == 2
    exactly_once._fenced.clear()
    assert exactly_once.commit(config, a, prepared(a, "query-a", 2, "a"), 0).transactions == 1  # task 0 only
    values = assert_nothing_left_open(kafka.bootstrap, topic, 1)
    assert collections.Counter(values) == collections.Counter(
        f"{tag}{p}-{i}" for tag in "ab" for p in range(2) for i in range(50))


# -- a second attempt of a task ----------------------------------------------------------


def test_a_second_attempt_that_fences_the_accepted_one_fails_the_write_whole(kafka: KafkaCluster) -> None:
    """Two attempts of task 0 at once (a speculative copy): the second's init_transactions
    ends the first's transaction after the first reported. The driver commits nothing,
    names spark.speculation, and nothing stays open."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-spec"), partitions=1)
    prefix = unique_topic("spec")
    first, m0 = _prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, 0), topic, [b"a0"])
    other, m1 = _prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, 1), topic, [b"a1"])
    second = KafkaProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0,
                            "transactional.id": exactly_once_names.transactional_id(prefix, 0)})
    try:
        exactly_once_names.fence_and_begin(second)
        second.send(ProducerRecord(topic, b"b0", key=b"b0")).result(30)
        with pytest.raises(TransactionsEndedError, match="spark.speculation") as failure:
            exactly_once.commit({"bootstrap.servers": kafka.bootstrap}, ExactlyOnce(prefix, topic, one_write=True),
                                [m0, m1], None)
        assert "Nothing of the batch write is visible" in str(failure.value)
        second.abort_transaction(10)
    finally:
        for p in (first, other, second):
            p.close()
    assert assert_nothing_left_open(kafka.bootstrap, topic, 1) == []


# -- markers that are gone -----------------------------------------------------------------


def test_a_restart_whose_markers_are_gone_fails_instead_of_writing_twice(kafka: KafkaCluster) -> None:
    from confluent_kafka.admin import AdminClient as ConfluentAdmin

    topic = create_topic(kafka.bootstrap, unique_topic("eos-expired"), partitions=1)
    config = {"bootstrap.servers": kafka.bootstrap}
    eo = ExactlyOnce(unique_topic("exp"), topic)
    prefix = eo.prefix_for(None)
    for batch in (0, 1):
        producer, message = _prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, 0), topic,
                                     [b"%d" % batch])
        producer.close()
        exactly_once.commit(config, eo, [message], batch)
    # As offsets.retention.minutes does after a long stop: the groups are gone.
    groups = [exactly_once_names.directory_group(prefix), exactly_once_names.transactional_id(prefix, 0)]
    admin = ConfluentAdmin({"bootstrap.servers": kafka.bootstrap})
    for future in admin.delete_consumer_groups(groups).values():
        future.result(30)
    exactly_once._fenced.clear()
    producer, message = _prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, 0), topic, [b"2"])
    producer.close()
    with pytest.raises(MarkersMissingError, match="kprod.missingMarkers=ignore"):
        exactly_once.commit(config, eo, [message], 2)
    exactly_once_abort.abort(config, eo, [message])
    resumed = ExactlyOnce(prefix, topic, missing_markers="ignore")
    producer, message = _prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, 0), topic, [b"2"])
    producer.close()
    assert exactly_once.commit(config, resumed, [message], 2).transactions == 1
    assert collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, 1)) == collections.Counter(["0", "1", "2"])


def test_a_replay_of_microbatch_0_whose_directory_is_gone_finds_its_markers(kafka: KafkaCluster,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The directory is committed just before the markers, so offsets.retention.minutes
    removes it first: microbatch 0, committed in part and replayed, must still find the
    markers it has (found by the review: it was written twice)."""
    from confluent_kafka.admin import AdminClient as ConfluentAdmin

    topic = create_topic(kafka.bootstrap, unique_topic("eos-dir0"), partitions=1)
    config = {"bootstrap.servers": kafka.bootstrap}
    eo = ExactlyOnce(unique_topic("dir0"), topic)
    prefix = eo.prefix_for(None)

    def prepared() -> list[KProdCommitMessage]:
        return _prepared_tasks(kafka.bootstrap, prefix, topic)

    _die_after_committing_task_1(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        exactly_once.commit(config, eo, prepared(), 0)
    monkeypatch.undo()  # a new driver process
    admin = ConfluentAdmin({"bootstrap.servers": kafka.bootstrap})
    for future in admin.delete_consumer_groups([exactly_once_names.directory_group(prefix)]).values():
        future.result(30)
    exactly_once._fenced.clear()
    assert exactly_once.commit(config, eo, prepared(), 0).transactions == 1  # task 0 only
    values = assert_nothing_left_open(kafka.bootstrap, topic, 1)
    assert collections.Counter(values) == collections.Counter(f"{p}-{i}" for p in range(2) for i in range(20))


def test_a_named_batch_write_killed_in_its_commit_is_completed_by_its_rerun(kafka: KafkaCluster,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch write commits one transaction per task: a driver that dies between them
    leaves it in part visible (found by the review). Under a prefix the user names, its
    rerun finds the markers and commits only what is missing."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-named"), partitions=1)
    config = {"bootstrap.servers": kafka.bootstrap}
    eo = parse_options({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                        "kprod.deliveryGuarantee": "exactly-once",
                        "kprod.transactionalIdPrefix": unique_topic("daily")}).exactly_once
    assert eo is not None and eo.batch and not eo.one_write

    def prepared() -> list[KProdCommitMessage]:
        # A batch write's tasks have no query.
        return _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, query=None)

    _die_after_committing_task_1(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        exactly_once.commit(config, eo, prepared(), None)
    monkeypatch.undo()  # a new driver process
    exactly_once._fenced.clear()
    assert exactly_once.commit(config, eo, prepared(), None).transactions == 1  # the rerun: task 0 only
    assert exactly_once.commit(config, eo, prepared(), None).transactions == 0  # once more: nothing
    values = assert_nothing_left_open(kafka.bootstrap, topic, 1)
    assert collections.Counter(values) == collections.Counter(f"{p}-{i}" for p in range(2) for i in range(20))


def test_a_named_batch_write_run_twice_through_spark_is_written_once(spark: SparkSession, kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-named-spark"), partitions=2)
    df = spark.range(500, numPartitions=3).select(F.col("id").cast("string").alias("key"),
                                                  F.col("id").cast("string").alias("value"))
    name = unique_topic("nightly")
    for _ in range(2):
        (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka.bootstrap)
         .option("topic", topic).option("kprod.deliveryGuarantee", "exactly-once")
         .option("kprod.transactionalIdPrefix", name).save())
    values = assert_nothing_left_open(kafka.bootstrap, topic, 2)
    assert collections.Counter(values) == collections.Counter(str(i) for i in range(500))


def test_the_driver_on_protocol_v1(kafka_tv1: KafkaCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's checks on a cluster without transaction protocol v2, where its EndTxn
    leaves the epoch as it was (under v2 a transaction the driver committed has the task's
    epoch plus one): timed out, fenced by a second attempt, refused after the check, and a
    named write whose driver died in its commit completed by its rerun."""
    test_a_commit_after_the_timeout_says_timed_out_never_fenced(kafka_tv1)
    test_a_second_attempt_that_fences_the_accepted_one_fails_the_write_whole(kafka_tv1)
    test_an_endtxn_refused_after_the_check_fails_saying_how_many_were_committed(kafka_tv1)
    test_a_named_batch_write_killed_in_its_commit_is_completed_by_its_rerun(kafka_tv1, monkeypatch)
