"""The columnar encoder writes exactly the bytes of the row-wise reference encoder, with
either of its compiled forms: the C extension and numba's."""

import hashlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import numba
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kprod_broker import cache_dir
from spark_sink.encoder import _kernels, columnar, jit, kernels
from spark_sink.encoder.columnar import EncodedRecords, as_numpy, encode_columns, encode_groups
from spark_sink.producer.partitioner import murmur2, murmur2_array
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD, Header, Record, encode_records


@pytest.fixture(scope="module")
def _numba_cache() -> Iterator[None]:
    """numba's first compile of the loops (about 16 s of CPU) once per machine, not once per
    clone: numba keeps what it compiles beside jit.py (its __pycache__, which a fresh clone
    lacks), and the suite keeps a copy under ~/.cache/kprod, as it does Kafka's jars, by
    jit.py's contents and numba's and Python's versions. numba checks every entry it reads
    (jit.py's contents, the CPU, the types) and compiles on a miss. No setting is changed."""
    source = Path(jit.__file__)
    here = source.parent / "__pycache__"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    kept = cache_dir() / "numba" / f"jit-{digest}-numba{numba.__version__}-{sys.implementation.cache_tag}"
    _copy_entries(kept, here)
    yield
    _copy_entries(here, kept)


def _copy_entries(source: Path, target: Path) -> None:
    """numba's cache entries of jit.py, the data files before the indexes that name them,
    each replaced whole (another clone's run may be reading them)."""
    if not source.is_dir():
        return
    target.mkdir(parents=True, exist_ok=True)
    for entry in sorted(source.glob("jit.*.nb[ci]"), key=lambda path: path.suffix == ".nbi"):
        partial = target / f".{entry.name}.{os.getpid()}"
        shutil.copyfile(entry, partial)
        os.replace(partial, target / entry.name)


@pytest.fixture(autouse=True, scope="module", params=[_kernels, jit], ids=["extension", "numba"])
def loops(request: pytest.FixtureRequest, _numba_cache: None) -> Iterator[ModuleType]:
    """Every test of this module once with each form of the loops."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kernels, "compiled", lambda: request.param)
        yield request.param


@settings(max_examples=60, deadline=None)
@given(st.lists(st.none() | st.binary(max_size=13), max_size=30), st.integers(0, 3))
def test_murmur2_over_a_column_equals_javas_per_key(keys: list[bytes | None], cut: int) -> None:
    column = pa.array(keys, pa.binary()).slice(min(cut, len(keys)))
    assert murmur2_array(column).tolist() == [murmur2(k or b"") for k in keys[cut:]]

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

rows_st = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=20),
        st.none() | st.binary(max_size=200),
        st.integers(0, 2**42),
        st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=3),
    ),
    min_size=1,
    max_size=40,
)


# A row as rows_st draws it: key, value, timestamp, headers.
Row = tuple[bytes | None, bytes | None, int, Sequence[Header]]


def _reference(rows: Sequence[Row]) -> list[Record]:
    return [Record(k, v, ts, tuple(h)) for k, v, ts, h in rows]


@settings(max_examples=80, deadline=None)
@given(rows_st, st.booleans())
def test_single_batch_equals_row_wise_encoder(rows: list[Row], with_headers: bool) -> None:
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    ts = np.array([r[2] for r in rows], np.int64)
    headers = pa.array([[{"key": k, "value": v} for k, v in r[3]] for r in rows], HEADERS) if with_headers else None
    (batch,) = encode_columns(keys, values, ts, headers, batch_size=0)
    expected = _reference([(k, v, t, h if with_headers else []) for k, v, t, h in rows])
    assert batch.payload == encode_records(expected, rows[0][2])
    assert (batch.record_count, batch.base_timestamp, batch.max_timestamp) == (len(rows), rows[0][2], max(ts))


@settings(max_examples=80, deadline=None)
@given(rows_st, st.integers(61, 600), st.booleans())
def test_split_batches_each_equal_reference_and_respect_batch_size(rows: list[Row], batch_size: int,
                                                                    ordered: bool) -> None:
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    ts = np.array([r[2] for r in rows], np.int64)
    ts = np.sort(ts) if ordered else ts  # out-of-order timestamps give negative deltas
    batches = encode_columns(keys, values, ts, None, batch_size=batch_size)
    assert sum(b.record_count for b in batches) == len(rows)
    pos = 0
    for b in batches:
        chunk = [Record(rows[i][0], rows[i][1], int(ts[i])) for i in range(pos, pos + b.record_count)]
        assert b.payload == encode_records(chunk, int(ts[pos]))
        assert b.record_count == 1 or RECORD_BATCH_OVERHEAD + len(b.payload) <= batch_size
        assert b.max_timestamp == max(int(t) for t in ts[pos:pos + b.record_count])
        pos += b.record_count


def test_string_large_and_view_types_are_accepted() -> None:
    for t in (pa.string(), pa.large_binary(), pa.large_string(), pa.binary_view(), pa.string_view()):
        (b,) = encode_columns(pa.array(["k", None], t), pa.array(["v", "w"], t), np.array([5, 6]), batch_size=0)
        assert b.payload == encode_records([Record(b"k", b"v", 5), Record(None, b"w", 6)], 5)


def test_wide_varints_and_long_prefixes_equal_reference() -> None:
    # Timestamp deltas past 2**55 take more than 8 varint bytes (the general path); a
    # 20k-record batch has 3-byte offset deltas, so the prefix spans two packed words.
    n = 20_000
    ts = np.arange(n, dtype=np.int64) * 7
    ts[-1] = 2**61
    keys = pa.array([b"k%d" % i for i in range(n)], pa.binary())
    values = pa.array([None if i % 5 == 0 else b"v" * (i % 300) for i in range(n)], pa.binary())
    (batch,) = encode_columns(keys, values, ts, None, batch_size=0)
    expected = [Record(keys[i].as_py(), values[i].as_py(), int(ts[i])) for i in range(n)]
    assert batch.payload == encode_records(expected, 0)
    (batch,) = encode_columns(None, values, ts, None, batch_size=0)
    assert batch.payload == encode_records([Record(None, r.value, r.timestamp) for r in expected], 0)
    # Deltas whose zigzag value has its top bit set (10-byte varints).
    ts = np.array([0, 2**62 + 5, -(2**62), 2**63 - 1], np.int64)
    (batch,) = encode_columns(None, pa.array([b"a", b"b", None, b""]), ts, None, batch_size=0)
    assert batch.payload == encode_records([Record(None, v, int(t)) for v, t in zip([b"a", b"b", None, b""], ts)], 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(0, 20), st.integers(0, 300), st.integers(61, 3000), st.booleans())
def test_uniform_records_split_greedily(n: int, key_size: int, value_size: int, batch_size: int,
                                        with_keys: bool) -> None:
    # Every batch must match the reference bytes, fit batch_size, and be full (one more
    # equal record would not fit).
    keys = [b"k" * key_size] * n if with_keys else [None] * n
    values = [b"v" * value_size] * n
    ts = np.full(n, 1_700_000_000_000, np.int64)
    batches = encode_columns(pa.array(keys, pa.binary()) if with_keys else None, pa.array(values, pa.binary()),
                             ts, None, batch_size=batch_size)
    pos = 0
    for b in batches:
        chunk = [Record(keys[i], values[i], int(ts[i])) for i in range(pos, pos + b.record_count)]
        assert b.payload == encode_records(chunk, int(ts[0]))
        assert b.record_count == 1 or RECORD_BATCH_OVERHEAD + len(b.payload) <= batch_size
        if pos + b.record_count < n:
            grown = encode_records([*chunk, Record(keys[0], values[0], int(ts[0]))], int(ts[0]))
            assert RECORD_BATCH_OVERHEAD + len(grown) > batch_size
        pos += b.record_count
    assert pos == n


def test_records_larger_than_batch_size_get_their_own_batch() -> None:
    # Lengths past 16383 take 3-byte varints, beyond the row loop's lookup table.
    keys = [b"a", b"k" * 17_000, None, b"b"]
    values = [b"1", b"v" * 20_000, b"w" * 16_000, b"2"]
    ts = np.array([10, 11, 9, 12], np.int64)
    batches = encode_columns(pa.array(keys, pa.binary()), pa.array(values, pa.binary()), ts, batch_size=16384)
    assert [b.record_count for b in batches] == [1, 1, 2]
    assert [(b.base_timestamp, b.max_timestamp) for b in batches] == [(10, 10), (11, 11), (9, 12)]
    pos = 0
    for b in batches:
        chunk = [Record(k, v, int(t)) for k, v, t in zip(keys[pos:], values[pos:], ts[pos:])][:b.record_count]
        assert b.payload == encode_records(chunk, int(ts[pos]))
        pos += b.record_count


@settings(max_examples=80, deadline=None)
@given(rows_st, st.data(), st.sampled_from([0, 61, 300, 16384]), st.booleans(), st.booleans())
def test_groups_keep_input_order_in_batches_of_their_own(rows: list[Row], data: st.DataObject, batch_size: int,
                                                         uniform: bool, with_headers: bool) -> None:
    # Several partitions' rows in one pass, in input order: each group gets batches of
    # its own, its rows in input order.
    if uniform:
        rows = [(b"k", b"v" * 30, 7, [("h", b"x")])] * len(rows)
    group_count = data.draw(st.integers(1, 5))
    groups = data.draw(st.lists(st.integers(0, group_count - 1), min_size=len(rows), max_size=len(rows)))
    keys = pa.array([r[0] for r in rows], pa.binary())
    values = pa.array([r[1] for r in rows], pa.binary())
    headers = pa.array([[{"key": k, "value": v} for k, v in r[3]] for r in rows], HEADERS) if with_headers else None
    ts = np.array([r[2] for r in rows], np.int64)
    encoded = encode_groups(keys, values, ts, headers, np.array(groups), group_count, batch_size=batch_size)
    assert len(encoded) == group_count
    for group, batches in enumerate(encoded):
        picked = [(*r[:3], r[3] if with_headers else []) for r, g in zip(rows, groups) if g == group]
        assert sum(b.record_count for b in batches) == len(picked)
        pos = 0
        for b in batches:
            chunk = _reference(picked[pos:pos + b.record_count])
            assert b.payload == encode_records(chunk, picked[pos][2])
            assert (b.base_timestamp, b.max_timestamp) == (picked[pos][2], max(r.timestamp for r in chunk))
            assert batch_size == 0 or b.record_count == 1 or RECORD_BATCH_OVERHEAD + len(b.payload) <= batch_size
            pos += b.record_count
        if batch_size == 0:
            assert len(batches) == (1 if picked else 0)
    # each group's payloads are views of a buffer of its own
    buffers = [{id(_buffer_of(b.payload)) for b in batches} for batches in encoded if batches]
    assert all(len(ids) == 1 for ids in buffers) and len(set.union(*buffers)) == len(buffers)


def _buffer_of(payload: bytes | memoryview) -> object:
    """The buffer an encoded section is a view of."""
    assert isinstance(payload, memoryview), type(payload)
    return payload.obj


def test_null_header_lists_are_empty_even_when_they_span_entries() -> None:
    """Arrow lets a null list's slot span entries: they are not the record's headers."""
    entries = pa.array([{"key": f"h{i}", "value": b"x"} for i in range(4)], HEADERS.value_type)
    offsets = pa.array([0, 1, 3, 3, 4], pa.int32())
    for mask in (None, pa.array([False, True, False, False])):  # row 1 spans entries 1 and 2
        headers = pa.ListArray.from_arrays(offsets, entries, mask=mask)
        rows = [(None, b"v", 7, [] if mask is not None and i == 1 else [(e["key"], e["value"]) for e in h or []])
                for i, h in enumerate(headers.to_pylist())]
        got = encode_columns(None, pa.array([b"v"] * 4), np.full(4, 7), headers, batch_size=0)
        assert bytes(got[0].payload) == encode_records(_reference(rows), 7)


@pytest.mark.parametrize("loops", [_kernels], ids=["extension"], indirect=True)  # as_numpy runs no loop
@settings(max_examples=100, deadline=None)
@given(st.lists(st.none() | st.integers(0, 2**31), max_size=40), st.integers(0, 5),
       st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.bool_()]))
def test_as_numpy_reads_sliced_arrays_and_fills_nulls(items: list[int | None], cut: int,
                                                      arrow_type: pa.DataType) -> None:
    if pa.types.is_boolean(arrow_type):
        items = [None if x is None else x % 2 == 1 for x in items]
    else:  # every value the type holds, negative ones too
        bits, signed = arrow_type.bit_width, pa.types.is_signed_integer(arrow_type)
        items = [None if x is None else x % 2**bits - (2 ** (bits - 1) if signed else 0) for x in items]
    arr = pa.array(items, arrow_type).slice(min(cut, len(items)))
    assert as_numpy(arr, fill=1).tolist() == [1 if x is None else x for x in items[cut:]]
    if arr.null_count:
        with pytest.raises(ValueError, match="null"):
            as_numpy(arr)


def test_write_records_refuses_a_short_buffer_or_a_group_outside_outs(loops: ModuleType) -> None:
    """The loops check every write against its group's buffer: a wrong plan raises
    instead of writing past the end."""
    from spark_sink.encoder.columnar import _ABSENT, _NO_HEADERS, _column

    values = pa.array([b"v" * 10, b"w" * 10], pa.binary())
    ts = np.zeros(2, np.int64)
    opens = np.array([1, 1], np.bool_)
    args = (_ABSENT, _column(values), _NO_HEADERS, ts)
    groups = np.array([0, 1], np.int64)
    assert loops.write_records([np.zeros(64, np.uint8), np.zeros(64, np.uint8)], opens, groups, *args) == [17, 17]
    with pytest.raises(ValueError, match="row 1"):
        loops.write_records([np.zeros(64, np.uint8), np.zeros(16, np.uint8)], opens, groups, *args)
    with pytest.raises(ValueError, match="row 1"):
        loops.write_records([np.zeros(64, np.uint8), None], opens, groups, *args)
    with pytest.raises(ValueError, match="row 1"):
        loops.write_records([np.zeros(64, np.uint8)], opens, groups, *args)


def test_a_large_partitions_buffer_is_reused_only_once_its_payloads_are_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Payloads of a partition's share large enough to be recycled keep their bytes while
    any view of them lives; once all are gone, the next call writes into the same memory."""
    # Buffers of the test's own: one an earlier test's garbage returns to the shared ones
    # meanwhile (the collector, another thread) would be handed out first.
    monkeypatch.setattr(columnar, "_buffers", columnar._RecycledBuffers(16 << 20))
    n = 4_000  # about 450 KB of records: past the recycled buffers' smallest size

    def encode(fill: bytes) -> tuple[EncodedRecords, bytes]:
        values = pa.array([fill * 100 + b"%06d" % i for i in range(n)], pa.binary())
        ts = np.arange(n, dtype=np.int64)
        expected = encode_records([Record(None, values[i].as_py(), i) for i in range(n)], 0)
        (batch,) = encode_columns(None, values, ts, None, batch_size=0)
        assert batch.payload == expected
        return batch, expected

    def address(payload: bytes | memoryview) -> int:
        return np.frombuffer(payload, np.uint8).ctypes.data

    first, first_bytes = encode(b"a")
    second, _ = encode(b"b")
    assert address(second.payload) != address(first.payload)
    assert first.payload == first_bytes  # untouched by the second call
    kept = first.payload[10:20]  # a view of a view keeps the buffer lent
    freed_at = address(first.payload)
    del first
    third, _ = encode(b"c")
    assert address(third.payload) != freed_at and kept == first_bytes[10:20]
    del kept
    fourth, _ = encode(b"d")
    assert address(fourth.payload) == freed_at
