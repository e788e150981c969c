"""The review's attacks on the rows digest of exactly-once markers (branch ``break``).

README, Guarantees: "Each marker holds its task's row count and a digest of its rows
(key, value, topic, partition and headers, in any order; timestamps left out), so a
replay knows a task of the run that committed it only by its number *and* its rows. A
replay split differently (another task count, or as many tasks with rows dealt
otherwise) still skips a microbatch committed whole, but one committed in part then
fails the query with PartlyCommittedError ... rather than risk writing rows twice or
losing some".

Each attack: run 1 of microbatch 0 has two tasks, each with one row (or a few), and its
driver dies after committing task 0's transaction; run 2 replays microbatch 0 with the
same rows dealt the other way round. A row is what a read_committed consumer sees:
topic, partition (when the row names one), key, value, timestamp and headers (in their
order). Allowed outcomes: run 2 is refused (PartlyCommittedError) and run 1's committed
rows are visible once, or run 2 completes the microbatch and every row is visible once.

The tasks here send what a Spark task sends, as ``writer.write_task`` does: one Arrow
table through ``send_arrow`` in the task's transaction, its digest taken from that same
table; the driver's commit is ``exactly_once.commit``, which a crash interrupts between
its EndTxn requests (as in test_exactly_once_replay_split.py).
"""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.encoder.columnar import HEADER_TYPE
from spark_sink.producer import KafkaProducer, RowsDigest
from spark_sink.producer.partitioner import murmur2_array
from spark_sink.spark import exactly_once, exactly_once_abort, exactly_once_names
from spark_sink.spark.exactly_once_state import PartlyCommittedError
from spark_sink.spark.options import ExactlyOnce
from spark_sink.spark.task_reports import KProdCommitMessage
from tests.brokers import consume_all, create_topic, unique_topic
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import driver_dies_committing

TS = 1_700_000_000_000

SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("timestamp", pa.int64()),
                    ("headers", HEADER_TYPE)])


def _row(value: bytes | None = b"ping", key: bytes | None = b"sensor-1", ts: int = TS,
         headers: list[tuple[str, bytes | None]] | None = None, **more: object) -> dict:
    return {"key": key, "value": value, "timestamp": ts,
            "headers": [{"key": k, "value": v} for k, v in (headers or [])], **more}


def _tasks(bootstrap: str, prefix: str, topic: str | None, tables: dict[int, pa.Table], query: str
           ) -> list[KProdCommitMessage]:
    """What a run's tasks return: each table sent by send_arrow in the task's prepared
    transaction, with the digest write_task takes of it (an empty table: no transaction)."""
    messages = []
    for partition, table in tables.items():
        digest = RowsDigest()
        if table.num_rows == 0:
            messages.append(KProdCommitMessage(partition_id=partition, attempt=0, records=0, bytes=0,
                                               query_id=query, rows_digest=str(digest)))
            continue
        with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                            "transactional.id": exactly_once_names.transactional_id(prefix, partition)}) as p:
            exactly_once_names.fence_and_begin(p)
            digest.add(table)
            future = p.send_arrow(table, topic)
            p.flush(30)
            future.result(30)
            txn = p.prepare_transaction()
        messages.append(KProdCommitMessage(partition_id=partition, attempt=0, records=table.num_rows, bytes=0,
                                           transaction=txn, query_id=query,
                                           rows_digest=str(digest)))
    return messages


def _seen(bootstrap: str, topics: list[str], expected: collections.Counter, with_partition: bool
          ) -> collections.Counter:
    """Each record a read_committed consumer sees, as (topic, partition, key, value, timestamp,
    headers in order); reading a second more after the expected count to catch duplicates."""
    seen: collections.Counter = collections.Counter()
    for topic in topics:
        count = sum(n for k, n in expected.items() if k[0] == topic)
        for m in consume_all(bootstrap, topic, count, settle=1.0, overrides={"isolation.level": "read_committed"}):
            seen[(m.topic(), m.partition() if with_partition else None, m.key(), m.value(), m.timestamp()[1],
                  tuple(m.headers() or ()))] += 1
    return seen


def _as_seen(row: dict, topic: str, with_partition: bool) -> tuple:
    def raw(v: str | bytes | None) -> bytes | None:
        return v.encode() if isinstance(v, str) else v

    return (row.get("topic", topic), row.get("partition") if with_partition else None, raw(row["key"]),
            raw(row["value"]), row["timestamp"], tuple((h["key"], h["value"]) for h in row["headers"]))


def _swap_attack(kafka: KafkaCluster, a: list[dict], b: list[dict], *, schema: pa.Schema = SCHEMA,
                 schema2: pa.Schema | None = None, topics: int = 1, with_partition: bool = False
                 ) -> PartlyCommittedError | None:
    """Run 1: task 0 sends ``a``, task 1 ``b``; its driver dies after committing task 0.
    Run 2 (a new driver): task 0 sends ``b``, task 1 ``a`` (in ``schema2`` if given). Asserts
    no row is visible twice or lost; returns run 2's refusal, if any."""
    names = [create_topic(kafka.bootstrap, unique_topic("eos-digest"), partitions=2) for _ in range(topics)]
    topic = names[0]
    if topics > 1:  # rows name their topic: "t0" and "t1" stand for the topics made here
        a = [{**r, "topic": names[int(r["topic"][1:])]} for r in a]
        b = [{**r, "topic": names[int(r["topic"][1:])]} for r in b]
    send_topic = None if topics > 1 else topic
    query = unique_topic("query")
    eo = ExactlyOnce(None, topic)
    prefix = eo.prefix_for(query)
    config = {"bootstrap.servers": kafka.bootstrap}

    def table(rows: list[dict], s: pa.Schema) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=s)

    with driver_dies_committing(0):
        exactly_once.commit(config, eo, _tasks(kafka.bootstrap, prefix, send_topic,
                                               {0: table(a, schema), 1: table(b, schema)}, query), 0)

    s2 = schema2 or schema
    run2 = _tasks(kafka.bootstrap, prefix, send_topic, {0: table(b, s2), 1: table(a, s2)}, query)
    refusal = None
    try:
        exactly_once.commit(config, eo, run2, 0)
    except PartlyCommittedError as exc:
        exactly_once_abort.abort(config, eo, run2)
        refusal = exc
    shown = a if refusal is not None else a + b
    expected = collections.Counter(_as_seen(r, topic, with_partition) for r in shown)
    got = _seen(kafka.bootstrap, names, expected, with_partition)
    twice = [k for k, n in got.items() if n > expected.get(k, 0)]
    lost = [k for k, n in expected.items() if got.get(k, 0) < n]
    assert not twice and not lost, (f"run 2 {'refused' if refusal else 'completed'}; "
                                    f"visible too often: {twice}; missing: {lost}")
    for name in names:
        assert_nothing_left_open(kafka.bootstrap, name, 2)
    return refusal


# -- breaks the review found, fixed (the digest now holds timestamps, headers in their
# order, and 64 bits of each value); kept as regression tests ------------------------


def test_rows_that_differ_only_in_their_timestamp(kafka: KafkaCluster) -> None:
    """README: "every row once, as a read_committed consumer sees it, through ... driver
    crashes", and a replay with rows dealt otherwise "fails the query with
    PartlyCommittedError ... rather than risk writing rows twice or losing some".

    Two pings of one sensor with the same value at different (given) times, one per task;
    the replay deals them the other way round. With timestamps left out of the digests,
    run 2 skipped task 0 as committed and committed its task 1, which held the ping run 1's
    task 0 had already committed: that ping was visible twice, the other never."""
    _swap_attack(kafka, [_row(ts=TS)], [_row(ts=TS + 60_000)])


def test_rows_that_differ_only_in_the_order_of_their_headers(kafka: KafkaCluster) -> None:
    """README: "every row once, as a read_committed consumer sees it", and the digest holds
    "headers". Kafka headers are a list: their order is part of the record (a consumer's
    lastHeader("v") reads the last of duplicate keys). Two rows alike but for the order of
    their headers, dealt the other way round by the replay: one was visible twice, one never."""
    _swap_attack(kafka, [_row(headers=[("v", b"1"), ("v", b"2")])],
                 [_row(headers=[("v", b"2"), ("v", b"1")])])


def _murmur2_collision() -> tuple[bytes, bytes]:
    """Two values with the same (Kafka) murmur2 hash: 400,000 candidates hold some pairs."""
    values = [b"v%07d" % i for i in range(400_000)]
    hashes = murmur2_array(pa.array(values, pa.binary()))
    order = np.argsort(hashes, kind="stable")
    same = np.nonzero(hashes[order][1:] == hashes[order][:-1])[0]
    i = int(same[0])
    return values[order[i]], values[order[i + 1]]


def test_rows_whose_values_share_a_murmur2_hash(kafka: KafkaCluster) -> None:
    """README: a replay knows a task of the run that committed it "only by its number *and*
    its rows" (rows_digest.py: "two different row sets share a digest with a chance of
    2**-64"). Each column enters a row's hash as its 32-bit murmur2, so two distinct values
    collide with a chance of 2**-32 per pair: among 400,000 values there are about twenty
    such pairs (a microbatch of a million distinct values holds about a hundred). Two rows
    whose values collide, dealt the other way round by the replay: one was visible twice,
    one never."""
    v1, v2 = _murmur2_collision()
    assert v1 != v2
    _swap_attack(kafka, [_row(value=v1)], [_row(value=v2)])


# -- attacks the digest withstood (kept as regression tests) -------------------------


@pytest.mark.parametrize("a, b", [
    pytest.param(_row(key=None), _row(key=b""), id="null-key-vs-empty-key"),
    pytest.param(_row(value=None), _row(value=b""), id="null-value-vs-empty-value"),
    pytest.param(_row(headers=[("h", None)]), _row(headers=[("h", b"")]), id="null-vs-empty-header-value"),
    pytest.param(_row(headers=[("h", b"1")]), _row(headers=[("g", b"1")]), id="header-key"),
    pytest.param(_row(key=b"ab", value=b"c"), _row(key=b"a", value=b"bc"), id="bytes-moved-key-to-value"),
    pytest.param(_row(key=b"x", value=b"y"), _row(key=b"y", value=b"x"), id="key-and-value-swapped"),
])
def test_rows_that_differ_in_one_detail_are_told_apart(kafka: KafkaCluster, a: dict, b: dict) -> None:
    """Rows alike but for one detail, dealt the other way round by the replay: refused."""
    assert _swap_attack(kafka, [a], [b]) is not None


def test_rows_that_differ_only_in_their_partition_column(kafka: KafkaCluster) -> None:
    """The same record for partition 0 and for partition 1: refused."""
    schema = SCHEMA.append(pa.field("partition", pa.int32()))
    assert _swap_attack(kafka, [_row(partition=0)], [_row(partition=1)], schema=schema,
                        with_partition=True) is not None


def test_rows_that_differ_only_in_their_topic_column(kafka: KafkaCluster) -> None:
    """The same record for two topics (a topic column, no topic option): refused."""
    schema = SCHEMA.append(pa.field("topic", pa.string()))
    assert _swap_attack(kafka, [_row(topic="t0")], [_row(topic="t1")], schema=schema,
                        topics=2) is not None


def test_duplicate_rows_dealt_otherwise(kafka: KafkaCluster) -> None:
    """Task 0 {x, x} and task 1 {y, y}, replayed as {y, y} and {x, x}: refused; and as
    {x, y} twice the sums differ too (checked on the digests alone)."""
    x, y = _row(value=b"x"), _row(value=b"y")
    assert _swap_attack(kafka, [x, x], [y, y]) is not None

    def digest(rows: list[dict]) -> str:
        d = RowsDigest()
        d.add(pa.Table.from_pylist(rows, schema=SCHEMA))
        return str(d)

    assert digest([x, x]) != digest([x, y]) != digest([y, y])


def test_string_columns_replayed_as_binary_complete_the_microbatch(kafka: KafkaCluster) -> None:
    """The same bytes as string columns in run 1 and binary in run 2: the same records, so
    the replay completes the microbatch (rows dealt as run 1 did: here both tasks hold the
    same row, so the swap deals them alike)."""
    strings = pa.schema([("key", pa.string()), ("value", pa.string()), ("timestamp", pa.int64()),
                         ("headers", HEADER_TYPE)])
    row = {"key": "k", "value": "v", "timestamp": TS, "headers": []}
    assert _swap_attack(kafka, [row], [row], schema=strings, schema2=SCHEMA) is None


def test_the_digest_is_the_same_whatever_arrow_types_and_slices_carry_the_rows() -> None:
    """Spark hands the same rows as string or binary, large or not (Spark 4's large var
    types), a partition as int or bigint, and in batches of any size: the same digest."""
    keys, values = [b"a", None, b"c"], [b"x", b"y", None]
    digests = set()
    for key_type in (pa.binary(), pa.large_binary(), pa.string(), pa.large_string()):
        for partition_type in (pa.int32(), pa.int64()):
            for header_type in (HEADER_TYPE, pa.large_list(pa.struct([("key", pa.large_string()),
                                                                          ("value", pa.large_binary())]))):
                as_text = pa.types.is_string(key_type) or pa.types.is_large_string(key_type)
                table = pa.table({
                    "key": pa.array([k.decode() if as_text and k is not None else k for k in keys], key_type),
                    "value": pa.array(values, pa.binary()),
                    "partition": pa.array([0, 1, None], partition_type),
                    "headers": pa.array([[{"key": "h", "value": b"1"}], [], None], header_type)})
                digest = RowsDigest()
                digest.add(table)
                digests.add(str(digest))
                sliced = RowsDigest()
                for offset in range(3):
                    sliced.add(table.slice(offset, 1))
                digests.add(str(sliced))
    assert len(digests) == 1, digests
