"""A fingerprint of the rows an Arrow table sends, whatever their order: what lets a
replayed exactly-once microbatch tell whether one of its tasks holds the same rows as the
task of the same number in the run that committed it.

Each row hashes what a consumer reads of its record: key, value, topic, partition,
timestamp (when the table has those columns) and headers in their order. A value's hash
is two murmur2s under two seeds (64 bits, in the compiled loops); the columns are
combined with 64-bit mixing in numpy. The digest is the row count and the sum of the
rows' hashes modulo 2**64, so it does not depend on the order of the rows or of the
tables. It tells splits apart, not adversaries: two different row sets share a digest
with a chance of about 2**-64.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from spark_sink.encoder.columnar import HEADER_TYPE, as_numpy
from spark_sink.producer.partitioner import murmur2_array

_MASK = (1 << 64) - 1
# Odd constants that set apart the columns a row's hash takes in, in turn.
_STEP = np.uint64(0x9E3779B97F4A7C15)
_SEEDS = (0x2545F491, 0x6C8E9CF5)
_NULL = np.uint64(0x6E756C6C6E756C6C)  # a null value's hash ("nullnull"), not an empty one's


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, element-wise (uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _binary_hashes(arr: pa.Array) -> np.ndarray:
    """Each value's 64-bit hash (murmur2 under two seeds), a null set apart from empty."""
    high, low = (murmur2_array(arr, seed).view(np.uint32).astype(np.uint64) for seed in _SEEDS)
    hashes = (high << np.uint64(32)) | low
    if arr.null_count:
        hashes[as_numpy(arr.is_null())] = _NULL
    return hashes


def _header_hashes(headers: pa.Array) -> np.ndarray:
    """Each row's headers as one hash: the sum of its entries' hashes, each mixed with the
    entry's place in the row (a consumer reads headers in their order)."""
    if headers.type != HEADER_TYPE:
        headers = headers.cast(HEADER_TYPE)
    if headers.null_count:
        headers = headers.fill_null(pa.scalar([], HEADER_TYPE))
    offsets = as_numpy(headers.offsets).astype(np.int64)
    starts = offsets - offsets[0]
    entries = headers.values.slice(offsets[0], starts[-1])
    place = np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], np.diff(starts))
    entry = _mix(_binary_hashes(entries.field("key")) * _STEP + _binary_hashes(entries.field("value")))
    entry = _mix(entry * _STEP + place.astype(np.uint64))
    sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(entry, dtype=np.uint64)])
    return sums[starts[1:]] - sums[starts[:-1]]


def _int_hashes(column: pa.Array) -> np.ndarray:
    """An integer or timestamp column as uint64, nulls apart from every value."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    values = as_numpy(column, fill=0).astype(np.int64).view(np.uint64)
    if column.null_count:
        values[as_numpy(column.is_null())] = _NULL
    return values


def _column(data: pa.Table | pa.RecordBatch, name: str) -> pa.Array | None:
    if name not in data.column_names:
        return None
    column = data.column(name)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


class RowsDigest:
    """The count and order-free hash of every row added so far."""

    __slots__ = ("rows", "_sum")

    def __init__(self) -> None:
        self.rows = 0
        self._sum = 0

    def add(self, data: pa.Table | pa.RecordBatch) -> None:
        """Take in the rows of ``data`` (columns named as ``send_arrow`` reads them)."""
        n = data.num_rows
        if n == 0:
            return
        row = np.zeros(n, np.uint64)
        for name, hashes in (("key", _binary_hashes), ("value", _binary_hashes), ("topic", _binary_hashes),
                             ("partition", _int_hashes), ("timestamp", _int_hashes),
                             ("headers", _header_hashes)):
            column = _column(data, name)
            if column is not None:
                row = _mix(row * _STEP + hashes(column))
        self.rows += n
        self._sum = (self._sum + int(np.sum(_mix(row), dtype=np.uint64))) & _MASK

    def __str__(self) -> str:
        return f"{self.rows}:{self._sum:016x}"
