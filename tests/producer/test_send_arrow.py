"""send_arrow on both brokers: every column combination and codec, read back with confluent-kafka."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import ArrowSendResult, ColumnError, InvalidPartitionError, KafkaProducer
from spark_sink.producer.arrow_input import HEADER_TYPE
from spark_sink.producer.partitioner import murmur2
from tests.brokers import consume_all, create_topic, unique_topic

N = 500


def _table(n: int, *, key: bool, partition: bool, headers: bool, timestamp: bool, topic_col: list[str] | None = None,
           string_values: bool = False) -> pa.Table:
    cols = {"value": pa.array([None if i % 97 == 5 else f"v{i}" * (i % 7) for i in range(n)],
                              pa.string() if string_values else pa.binary()) if string_values else
            pa.array([None if i % 97 == 5 else b"v%d" % i * (i % 7) for i in range(n)], pa.binary())}
    if key:
        cols["key"] = pa.array([None if i % 10 == 0 else b"k%d" % (i % 13) for i in range(n)], pa.binary())
    if partition:
        cols["partition"] = pa.array([i % 3 if i % 4 == 0 else None for i in range(n)], pa.int32())
    if headers:
        cols["headers"] = pa.array([[{"key": "i", "value": b"%d" % i}] if i % 3 else [] for i in range(n)], HEADER_TYPE)
    if timestamp:
        base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
        cols["timestamp"] = pa.array([base + dt.timedelta(milliseconds=i) for i in range(n)], pa.timestamp("us", tz="UTC"))
    if topic_col:
        cols["topic"] = pa.array([topic_col[i % 2] for i in range(n)], pa.string())
    return pa.table(cols)


COMBOS = list(itertools.product([False, True], repeat=4))


@pytest.mark.parametrize("key,partition,headers,timestamp", COMBOS)
def test_every_column_combination(broker: KafkaCluster, key: bool, partition: bool, headers: bool,
                                  timestamp: bool) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("arrow"), partitions=3)
    table = _table(N, key=key, partition=partition, headers=headers, timestamp=timestamp)
    with KafkaProducer({"bootstrap.servers": broker.bootstrap, "batch.size": 2048}) as p:
        result = p.send_arrow(table, topic=topic).result(60)
    assert result.records == N
    assert sum(c for c, _, _ in result.partitions.values()) == N
    messages = consume_all(broker.bootstrap, topic, N, settle=0.3)
    assert len(messages) == N
    rows = table.to_pylist()
    by_value_index: dict[int, list] = {}
    for m in messages:
        (idx,) = [h[1] for h in (m.headers() or []) if h[0] == "i"] or [None]
        by_value_index.setdefault(m.partition(), []).append(m)
    for (_topic, part), (count, first, last) in result.partitions.items():
        offsets = sorted(m.offset() for m in by_value_index[part])
        assert (count, first, last) == (len(offsets), offsets[0], offsets[-1])
    # order per partition follows row order, and each row is where it should be
    expected: dict[int, int | None] = {}
    for i, row in enumerate(rows):
        if partition and row.get("partition") is not None:
            expected[i] = row["partition"]
        elif key and row.get("key") is not None:
            expected[i] = (murmur2(row["key"]) & 0x7FFFFFFF) % 3
        else:
            expected[i] = None
    got = sorted(messages, key=lambda m: (m.partition(), m.offset()))
    per_part: dict[int, list] = {}
    for m in got:
        per_part.setdefault(m.partition(), []).append(m)
    seen_rows = []
    for part, ms in per_part.items():
        for m in ms:
            candidates = [i for i, r in enumerate(rows) if r["value"] == m.value() and (not key or r["key"] == m.key())]
            assert candidates, m.value()
            seen_rows.append((part, m, candidates))
    for part, m, candidates in seen_rows:
        assert any(expected[i] in (None, part) for i in candidates)
        if timestamp:
            assert any(int(rows[i]["timestamp"].timestamp() * 1000) == m.timestamp()[1] for i in candidates)
        if headers:
            assert any((m.headers() or []) == [(h["key"], h["value"]) for h in rows[i]["headers"]] for i in candidates)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_codecs_and_topic_column(broker: KafkaCluster, codec: str) -> None:
    t1 = create_topic(broker.bootstrap, unique_topic("a"), partitions=2)
    t2 = create_topic(broker.bootstrap, unique_topic("b"), partitions=2)
    table = _table(N, key=True, partition=False, headers=True, timestamp=False, topic_col=[t1, t2], string_values=True)
    with KafkaProducer({"bootstrap.servers": broker.bootstrap, "compression.type": codec}) as p:
        result = p.send_arrow(table).result(60)
    assert {t for t, _ in result.partitions} == {t1, t2}
    values = table.column("value").to_pylist()
    for topic, parity in ((t1, 0), (t2, 1)):
        got = sorted((m.value() or b"") for m in consume_all(broker.bootstrap, topic, N // 2, settle=0.3))
        assert got == sorted((v or "").encode() for i, v in enumerate(values) if i % 2 == parity)


def test_order_within_partition_follows_rows(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("ord"), partitions=1)
    table = pa.table({"value": pa.array([b"%06d" % i for i in range(20_000)])})
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "batch.size": 1024}) as p:
        futures = [p.send_arrow(table.slice(i, 5000), topic=topic) for i in range(0, 20_000, 5000)]
        results = [f.result(60) for f in futures]
    assert [r.partitions[(topic, 0)][1] for r in results] == [0, 5000, 10000, 15000]
    got = [m.value() for m in sorted(consume_all(kafka.bootstrap, topic, 20_000), key=lambda m: m.offset())]
    assert got == table.column("value").to_pylist()


def test_bad_columns_are_named_before_anything_is_sent(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("badcol"), partitions=2)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        with pytest.raises(ColumnError, match="'extra'.*to_json"):
            p.send_arrow(pa.table({"value": [b"v"], "extra": [1]}), topic=topic)
        with pytest.raises(ColumnError, match="'value' is required"):
            p.send_arrow(pa.table({"key": [b"k"]}), topic=topic)
        with pytest.raises(ColumnError, match="'key' has type int64"):
            p.send_arrow(pa.table({"value": [b"v"], "key": [1]}), topic=topic)
        with pytest.raises(ColumnError, match="no topic"):
            p.send_arrow(pa.table({"value": [b"v"]}))
        with pytest.raises(InvalidPartitionError, match="has 7 for topic .* 2 partitions"):
            p.send_arrow(pa.table({"value": [b"v"], "partition": pa.array([7], pa.int32())}), topic=topic)
        p.send_arrow(pa.table({"value": [b"fine"]}), topic=topic).result(30)
    assert [m.value() for m in consume_all(kafka.bootstrap, topic, 1, settle=0.3)] == [b"fine"]


def test_timestamp_as_int64_millis_and_large_types(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("ts"), partitions=1)
    table = pa.table({"value": pa.array(["a", "b"], pa.large_string()), "key": pa.array([b"x", b"y"], pa.binary_view()),
                      "timestamp": pa.array([1_700_000_000_123, None], pa.int64())})
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        p.send_arrow(table, topic=topic).result(30)
    a, b = sorted(consume_all(kafka.bootstrap, topic, 2), key=lambda m: m.offset())
    assert (a.key(), a.value(), a.timestamp()[1]) == (b"x", b"a", 1_700_000_000_123)
    assert b.timestamp()[1] > 1_700_000_000_123


def test_summary_ranges_follow_send_order_and_mark_unknown_ends() -> None:
    """A retried batch the broker had already written comes back without an offset: the
    summary says -1 for that end of the range, never an offset that is not its records'."""
    from spark_sink.encoder.columnar import EncodedRecords
    from spark_sink.producer.batch import ProducerBatch
    from spark_sink.producer.producer import ArrowSendFuture

    def queue(future: ArrowSendFuture, counts: Sequence[int]) -> list[ProducerBatch]:
        encoded = [EncodedRecords(b"", 0, n, 0, 0, 10 * n) for n in counts]
        future._queued(sum(counts), 10 * sum(counts), len(counts))
        return [ProducerBatch("t", 0, 0.0, order, 0, 16384, encoded=e, segments=[future._on_records, e.record_count])
                for order, e in enumerate(encoded)]

    future = ArrowSendFuture()
    first, middle, last = queue(future, (5, 7, 3))
    last.complete(40, -1, None)  # completion order need not be send order
    first.complete(-1, -1, None)
    middle.complete(20, -1, None)
    future._seal()
    assert future.result(1) == ArrowSendResult(15, 150, {("t", 0): (15, -1, 42)})

    future = ArrowSendFuture()
    first, last = queue(future, (4, 6))
    first.complete(100, -1, None)
    assert not future.done()
    future._seal()
    assert not future.done()  # sealed, one batch still out
    last.complete(-1, -1, None)
    assert future.result(1).partitions == {("t", 0): (10, 100, -1)}
