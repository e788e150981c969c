"""A task joins Spark's small Arrow batches into larger send_arrow calls, in order."""

from __future__ import annotations

import pyarrow as pa

from spark_sink.spark.writer import coalesce


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
    assert [t.num_rows for t in tables] == [20, 10, 30, 10]  # the 30-row batch alone is larger
    assert all(t.nbytes <= bound for t in tables if t.num_rows != 30)


def test_nothing_in_nothing_out() -> None:
    assert list(coalesce(iter(_batches([0, 0])))) == []
