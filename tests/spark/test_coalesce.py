"""A task joins Spark's small Arrow batches into larger send_arrow calls, in order."""

from __future__ import annotations

from random import Random

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.spark.writer import COMPACT_BATCHES, coalesce


def _batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        out.append(pa.record_batch({"value": pa.array([b"%d" % i for i in range(start, start + n)], pa.binary())}))
        start += n
    return out


def test_batches_are_joined_in_order_up_to_the_row_bound() -> None:
    tables = list(coalesce(iter(_batches([4, 0, 3, 5, 2, 0, 1])), max_rows=7, max_bytes=1 << 30))
    assert [t.num_rows for t in tables] == [7, 7, 1]  # 4+3, 5+2, then what is left
    values = [v for t in tables for v in t.column("value").to_pylist()]
    assert values == [b"%d" % i for i in range(15)]


def test_no_table_passes_the_byte_bound() -> None:
    batches = _batches([10, 10, 10, 30, 10])
    bound = batches[0].nbytes + batches[1].nbytes
    tables = list(coalesce(iter(batches), max_rows=1 << 30, max_bytes=bound))
    assert [t.num_rows for t in tables] == [20, 10, 18, 12, 10]  # the 30-row batch alone is larger: sliced
    assert all(t.nbytes <= bound for t in tables)


def test_a_batch_of_more_rows_than_a_call_goes_in_calls_of_its_rows() -> None:
    """send_arrow makes arrays of a few int64 per row of a call: one Arrow batch of
    millions of tiny rows would make them for all (breaker 56b: 2 M one-byte rows grew a
    writer by 118 MiB against a 49 MiB bound)."""
    tables = list(coalesce(iter(_batches([1, 1, 1, 5000, 600, 400, 1])), max_rows=1000, max_bytes=1 << 30))
    assert [t.num_rows for t in tables] == [3, 1000, 1000, 1000, 1000, 1000, 1000, 1]  # then joined as before


def test_ten_thousand_one_row_batches_are_held_in_few_chunks() -> None:
    tables = list(coalesce(iter(_batches([1] * 10_000)), max_rows=1 << 30, max_bytes=1 << 30))
    assert [t.num_rows for t in tables] == [10_000]
    assert tables[0].column("value").num_chunks == 10_000 // COMPACT_BATCHES + 10_000 % COMPACT_BATCHES


def test_nothing_in_nothing_out() -> None:
    assert list(coalesce(iter(_batches([0, 0])))) == []


@settings(max_examples=25, deadline=None)
@given(count=st.integers(0, 1500), largest=st.sampled_from([1, 3, 400]), max_rows=st.integers(1, 3000),
       bytes_rows=st.integers(1, 3000), rng=st.randoms(use_true_random=False))
def test_any_batches_are_joined_in_order_within_the_bounds_and_few_chunks(count: int, largest: int, max_rows: int,
                                                                          bytes_rows: int, rng: Random) -> None:
    """Whatever Spark's batches: every row once and in order; no table passes a bound
    unless it is one batch alone; and a table of many tiny batches holds them in few
    chunks (each run of COMPACT_BATCHES copied into one: an Arrow batch costs KiBs
    beyond its bytes, which thousands of one-row batches would hold several times over)."""
    sizes = [rng.randint(0, largest) for _ in range(count)]
    batches = _batches(sizes)
    max_bytes = bytes_rows * 8  # about that many of these rows' values and offsets
    tables = list(coalesce(iter(batches), max_rows=max_rows, max_bytes=max_bytes))
    values = [v for t in tables for v in t.column("value").to_pylist()]
    assert values == [b"%d" % i for i in range(sum(sizes))]
    for t in tables:
        assert t.num_rows > 0
        assert t.num_rows <= max_rows
        assert t.nbytes <= max_bytes or t.column("value").num_chunks == 1  # a slice of one batch: about
        assert t.column("value").num_chunks < COMPACT_BATCHES + t.num_rows / COMPACT_BATCHES
