"""send_arrow's planning: column checks, partition choice for whole columns, per-partition
grouping in row order, timestamps in any unit; and the encoded batches decode to the rows."""

import itertools
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.client.errors import ColumnError, InvalidPartitionError, RecordTooLargeError
from spark_sink.producer.arrow_input import HEADER_TYPE, SendLimits, TopicRows, plan_arrow_send
from spark_sink.producer.partitioner import murmur2, partition_for_hash
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD, Record, decode_record_batches, encode_record_batch


@dataclass(frozen=True)
class Group:
    """One partition's rows of a plan, as a single-partition TopicRows."""

    topic: str
    partition: int
    rows: TopicRows

    keys = property(lambda self: self.rows.keys)
    values = property(lambda self: self.rows.values)
    timestamps = property(lambda self: self.rows.timestamps)

    def __len__(self) -> int:
        return len(self.rows)


def _number(record: Record, digits: int | None = None) -> int:
    """The row number a test wrote as ``record``'s value (its first ``digits`` characters)."""
    assert record.value is not None
    return int(record.value[:digits])


def _view(payload: bytes | memoryview) -> memoryview:
    """An uncompressed section's payload: a view of its partition's buffer."""
    assert isinstance(payload, memoryview)
    return payload


def limits(batch_size: int = 16384, max_request_size: int = 1 << 20, buffer_memory: int = 32 << 20,
           codec: int = 0) -> SendLimits:
    return SendLimits(batch_size, max_request_size, buffer_memory, codec)


def plan(data: pa.Table, topic: str | None = "t", *, partitions: int = 4, ignore_keys: bool = False,
         batch_size: int = 16384, now_ms: int = 1_000, **limit: int) -> list[Group]:
    """The plan, split into one Group per topic and partition."""
    sticky_calls = itertools.count()
    planned = plan_arrow_send(
        data, topic, partition_count=lambda _t: partitions,
        sticky_partition=lambda _t, n: next(sticky_calls) % n,
        ignore_keys=ignore_keys, limits=limits(batch_size, **limit), now_ms=now_ms)
    groups: list[Group] = []
    for t in planned:
        parts = np.full(len(t), t.partitions) if isinstance(t.partitions, int) else t.partitions
        for p in sorted(set(parts.tolist())):
            mask = parts == p
            def cut(a: pa.Array | None, mask: np.ndarray = mask) -> pa.Array | None:
                return None if a is None else a.filter(pa.array(mask))
            groups.append(Group(t.topic, p, TopicRows(t.topic, cut(t.keys), cut(t.values), t.timestamps[mask],
                                                      cut(t.headers), p, t.partition_count)))
    return groups


def decoded(group: Group, batch_size: int = 16384, codec: int = 0) -> list[Record]:
    """Every record of a group, through real record batch bytes."""
    out: list[Record] = []
    for chunk in group.rows.encode(batch_size, codec):
        ((partition, encoded),) = chunk
        assert partition == group.partition
        for e in encoded:
            wire = encode_record_batch(bytes(e.payload), record_count=e.record_count,
                                       last_offset_delta=e.last_offset_delta, base_timestamp=e.base_timestamp,
                                       max_timestamp=e.max_timestamp, codec=e.codec)
            out += decode_record_batches(wire)[0].records
    return out


@pytest.mark.parametrize(("column", "array", "accepted"), [
    ("value", pa.array([1], pa.int32()), "binary or string"),
    ("key", pa.array([1.5]), "binary or string"),
    ("topic", pa.array([b"t"]), "string"),
    ("partition", pa.array([1], pa.int16()), "int32 or int64"),
    ("headers", pa.array([["a"]]), "list<struct<key: string, value: binary>>"),
    ("timestamp", pa.array([1], pa.int32()), "timestamp"),
])
def test_wrong_type_names_column_and_accepted_types(column: str, array: pa.Array, accepted: str) -> None:
    cols = {"value": pa.array([b"v"]), column: array}
    with pytest.raises(ColumnError) as e:
        plan(pa.table(cols))
    assert repr(column) in str(e.value) and accepted in str(e.value)


def test_unknown_missing_value_and_missing_topic() -> None:
    with pytest.raises(ColumnError, match="'offset' is not accepted"):
        plan(pa.table({"value": [b"v"], "offset": [1]}))
    with pytest.raises(ColumnError, match="'value' is required"):
        plan(pa.table({"key": [b"k"]}))
    with pytest.raises(ColumnError, match="no topic"):
        plan(pa.table({"value": [b"v"]}), topic=None)
    with pytest.raises(ColumnError, match="RecordBatch or Table"):
        plan([b"v"])


def test_explicit_partitions_are_range_checked() -> None:
    for bad in (4, -2, 100):
        with pytest.raises(InvalidPartitionError) as e:
            plan(pa.table({"value": [b"a", b"b"], "partition": pa.array([0, bad], pa.int32())}))
        assert "'t'" in str(e.value) and str(bad) in str(e.value) and "4 partitions" in str(e.value)


def test_keys_hash_like_java_explicit_wins_and_null_keys_stick() -> None:
    keys = [b"k%d" % i for i in range(200)] + [None] * 3
    parts = pa.array([None] * 150 + [3] * 50 + [None] * 3, pa.int64())
    values = [b"%d" % i for i in range(203)]
    groups = plan(pa.table({"value": values, "key": pa.array(keys, pa.binary()), "partition": parts}), partitions=7)
    where = {}
    for g in groups:
        assert g.topic == "t"
        for v in g.values.to_pylist():
            where[int(v)] = g.partition
    for i in range(150):
        key = keys[i]
        assert key is not None and where[i] == partition_for_hash(murmur2(key), 7), i
    assert all(where[i] == 3 for i in range(150, 200))
    assert len({where[i] for i in range(200, 203)}) == 1  # one sticky run


def test_ignore_keys_and_sticky_runs_switch_after_a_batch() -> None:
    n = 100
    data = pa.table({"value": [b"x" * 84] * n, "key": [b"same"] * n})
    groups = plan(data, ignore_keys=True, partitions=3, batch_size=1000)
    # 100 bytes a row (value + 16 estimate): a run of about 10 rows per partition in turn.
    assert sum(len(g) for g in groups) == n
    assert {g.partition for g in groups} == {0, 1, 2}
    keyed = plan(data, partitions=3, batch_size=1000)
    assert [(g.partition, len(g)) for g in keyed] == [(partition_for_hash(murmur2(b"same"), 3), n)]


def test_groups_keep_row_order_per_topic_and_partition_and_decode() -> None:
    n = 300
    rng = np.random.default_rng(3)
    topics = pa.array(rng.choice(np.array(["a", "b", None], dtype=object), n).tolist())
    parts = pa.array(rng.integers(0, 4, n), pa.int32())
    headers = pa.array([[{"key": "i", "value": b"%d" % i}] if i % 2 else [] for i in range(n)], HEADER_TYPE)
    data = pa.table({"value": [b"%d" % i for i in range(n)], "topic": topics, "partition": parts,
                     "headers": headers, "timestamp": pa.array(np.arange(n) + 5_000, pa.int64())})
    groups = plan(data, topic="dflt")
    seen = []
    for g in groups:
        records = decoded(g, batch_size=200)
        rows = [_number(r) for r in records]
        assert rows == sorted(rows)  # input order within a partition
        for r in records:
            i = _number(r)
            expected_topic = topics[i].as_py() or "dflt"
            assert (g.topic, g.partition) == (expected_topic, parts[i].as_py())
            assert r.timestamp == 5_000 + i
            assert r.headers == ((("i", b"%d" % i),) if i % 2 else ())
            seen.append(i)
    assert sorted(seen) == list(range(n))


def test_null_topic_without_default_names_the_row() -> None:
    with pytest.raises(ColumnError, match="null at row 1"):
        plan(pa.table({"value": [b"a", b"b"], "topic": ["x", None]}), topic=None)


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
def test_timestamps_in_any_unit_become_millis_and_nulls_take_now(unit: str) -> None:
    ts = pa.array([1_700_000_000, None], pa.int64()).cast(pa.timestamp("s")).cast(pa.timestamp(unit, tz="UTC"))
    (g,) = plan(pa.table({"value": [b"a", b"b"], "timestamp": ts}), partitions=1, now_ms=42)
    assert g.timestamps.tolist() == [1_700_000_000_000, 42]
    assert [r.timestamp for r in decoded(g)] == [1_700_000_000_000, 42]


def test_string_large_view_columns_and_large_list_headers() -> None:
    headers = pa.array([[{"key": "h", "value": "v"}]], pa.large_list(pa.struct([("key", pa.large_string()),
                                                                                ("value", pa.string())])))
    data = pa.table({"value": pa.array(["val"], pa.string_view()), "key": pa.array(["k"], pa.large_string()),
                     "headers": headers})
    (g,) = plan(data, partitions=5)
    (r,) = decoded(g, codec=1)
    assert (r.key, r.value, r.headers) == (b"k", b"val", (("h", b"v"),))
    assert g.partition == partition_for_hash(murmur2(b"k"), 5)


def test_empty_input_plans_nothing() -> None:
    assert plan(pa.table({"value": pa.array([], pa.binary())})) == []


def test_groups_larger_than_a_chunk_encode_in_pieces_in_order() -> None:
    n = 9_000  # ~9.1 MB of values: more than one 8 MiB encoding chunk
    values = pa.array([b"%06d" % i + b"x" * 1_000 for i in range(n)], pa.binary())
    (g,) = plan(pa.table({"value": values}), partitions=1, batch_size=100_000)
    chunks = [encoded for chunk in g.rows.encode(100_000, 0) for _, encoded in chunk]
    assert len(chunks) >= 2
    records = [r for chunk in chunks for e in chunk for r in decode_record_batches(encode_record_batch(
        bytes(e.payload), record_count=e.record_count, last_offset_delta=e.last_offset_delta,
        base_timestamp=e.base_timestamp, max_timestamp=e.max_timestamp))[0].records]
    assert [_number(r, 6) for r in records] == list(range(n))
    assert all(RECORD_BATCH_OVERHEAD + len(e.payload) <= 100_000 for chunk in chunks for e in chunk)


def test_every_partition_of_a_multi_chunk_plan_encodes_in_order() -> None:
    # ~12 MB over 5 partitions: partitions share encoding passes, and some span two chunks.
    n = 12_000
    parts = pa.array([(i * 7) % 5 for i in range(n)], pa.int32())
    values = pa.array([b"%06d" % i + b"x" * 1_000 for i in range(n)], pa.binary())
    (t,) = plan_arrow_send(pa.table({"value": values, "partition": parts}), "t", partition_count=lambda _t: 5,
                           sticky_partition=lambda _t, n: 0, ignore_keys=False, limits=limits(100_000), now_ms=1)
    chunks = list(t.encode(100_000, 0))
    pieces = [piece for chunk in chunks for piece in chunk]
    assert len(pieces) > 5  # some partition came in two pieces
    for chunk in chunks:  # each partition's payloads share a buffer of its own
        buffers = [{id(_view(e.payload).obj) for e in encoded} for _, encoded in chunk]
        assert all(len(ids) == 1 for ids in buffers) and len(set.union(*buffers)) == len(chunk)
    got: dict[int, list[int]] = {}
    for partition, encoded in pieces:
        for e in encoded:
            assert RECORD_BATCH_OVERHEAD + len(e.payload) <= 100_000
            wire = encode_record_batch(bytes(e.payload), record_count=e.record_count,
                                       last_offset_delta=e.last_offset_delta, base_timestamp=e.base_timestamp,
                                       max_timestamp=e.max_timestamp)
            got.setdefault(partition, []).extend(_number(r, 6) for r in decode_record_batches(wire)[0].records)
    assert got == {p: [i for i in range(n) if (i * 7) % 5 == p] for p in range(5)}


def test_a_row_too_large_for_a_request_is_named_before_anything_is_planned() -> None:
    # The record bound counts every framing varint at its widest and each header's key and
    # value, as send() does: key + value + headers + 36, plus the 61-byte batch header.
    headers = pa.array([[{"key": "h", "value": b"x" * 10}], [], [{"key": "h", "value": b"x" * 500}]], HEADER_TYPE)
    data = pa.table({"value": [b"a" * 100, b"b" * 100, b"c" * 100], "key": [b"k", None, b"k"], "headers": headers})
    sizes = [100 + 1 + 1 + 10 + 10 + 36, 100 + 36, 100 + 1 + 1 + 500 + 10 + 36]
    assert len(plan(data, max_request_size=RECORD_BATCH_OVERHEAD + max(sizes))) >= 1
    with pytest.raises(RecordTooLargeError, match=r"row 2 makes a record of up to \d+ bytes.*max.request.size \(700\)"):
        plan(data, max_request_size=700)
    with pytest.raises(RecordTooLargeError, match=r"row 0 .*max.request.size"):
        plan(data, max_request_size=RECORD_BATCH_OVERHEAD + sizes[1])


def test_buffer_memory_bounds_a_row_by_what_it_may_compress_into() -> None:
    from spark_sink.protocol.compression import Codec, compressed_bound

    data = pa.table({"value": [b"v" * 10_000]})
    record = 10_000 + 36
    fits = RECORD_BATCH_OVERHEAD + compressed_bound(Codec.SNAPPY, record)
    plan(data, codec=Codec.SNAPPY, buffer_memory=fits)
    with pytest.raises(RecordTooLargeError, match=r"row 0 .* larger than buffer.memory"):
        plan(data, codec=Codec.SNAPPY, buffer_memory=fits - 1)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_batches_of_several_records_never_compress_past_max_request_size(codec: int) -> None:
    from spark_sink.protocol.compression import compressed_bound

    bound = limits(batch_size=1_000_000, max_request_size=300_000, codec=codec)
    largest = bound.batch_bytes()
    assert largest <= 300_000
    assert RECORD_BATCH_OVERHEAD + compressed_bound(codec, largest - RECORD_BATCH_OVERHEAD) <= 300_000
    assert limits(batch_size=16384, codec=codec).batch_bytes() == 16384  # batch.size when it fits
    # Incompressible rows, planned and encoded with that size: every batch fits a request.
    values = pa.array([np.random.default_rng(i).bytes(997) for i in range(1500)], pa.binary())
    (t,) = plan_arrow_send(pa.table({"value": values}), "t", partition_count=lambda _t: 1,
                           sticky_partition=lambda _t, n: 0, ignore_keys=False, limits=bound, now_ms=1)
    encoded = [e for chunk in t.encode(largest, codec) for _, batches in chunk for e in batches]
    assert len(encoded) > 1 and all(e.size_in_bytes <= 300_000 for e in encoded)


def test_a_column_given_twice_is_named() -> None:
    data = pa.Table.from_arrays([pa.array([b"a"]), pa.array([b"b"])], names=["value", "value"])
    with pytest.raises(ColumnError, match="'value' appears more than once"):
        plan(data)



_ROW = st.tuples(
    st.none() | st.binary(max_size=6),                               # key
    st.sampled_from([None, "a", "b", "dflt"]),                       # topic ("dflt" also names the default)
    st.none() | st.integers(0, 3),                                   # partition
    st.none() | st.integers(0, 2**41),                               # timestamp
    st.none() | st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=3)), max_size=2),  # headers
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_ROW, min_size=1, max_size=40), st.integers(0, 3), st.booleans())
def test_random_rows_with_nulls_in_every_column_plan_as_row_by_row(rows: list[tuple], cut: int, ignore_keys: bool) -> None:
    """Each row lands in its topic (the default for a null), its explicit partition, else
    murmur2 of its key (unless keys are ignored), else a sticky one; a null timestamp takes
    now, a null header list is none; every row once, in input order per partition. The
    columns are sliced, so their buffers start at an offset."""
    def column(values: list, arrow_type: pa.DataType) -> pa.Array:
        return pa.array(values, arrow_type).slice(cut)

    data = pa.table({
        "key": column([r[0] for r in rows], pa.binary()),
        "value": column([b"%d" % i for i in range(len(rows))], pa.binary()),  # the row's number
        "topic": column([r[1] for r in rows], pa.string()),
        "partition": column([r[2] for r in rows], pa.int32()),
        "timestamp": column([r[3] for r in rows], pa.int64()),
        "headers": column([None if r[4] is None else [{"key": k, "value": v} for k, v in r[4]] for r in rows],
                          HEADER_TYPE),
    })
    seen = []
    for g in plan(data, topic="dflt", ignore_keys=ignore_keys, now_ms=7):
        numbers = []
        for record in decoded(g):
            i = _number(record)
            key, topic, partition, timestamp, headers = rows[i]
            assert record.key == key and g.topic == (topic or "dflt")
            if partition is not None:
                assert g.partition == partition
            elif key is not None and not ignore_keys:
                assert g.partition == partition_for_hash(murmur2(key), 4)
            assert record.timestamp == (7 if timestamp is None else timestamp)
            assert record.headers == tuple(headers or ())
            numbers.append(i)
        assert numbers == sorted(numbers)  # input order within a partition
        seen += numbers
    assert sorted(seen) == list(range(min(cut, len(rows)), len(rows)))
