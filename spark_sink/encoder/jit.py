"""The columnar encoder's loops for numba: what runs where kprod's compiled extension
(``_kernels.c``, built with the wheel) is not there, as when kprod is shipped to Spark in
a ``--py-files`` zip. Same functions, arguments and results as the extension, whose
docstrings describe them; tests/encoder/test_columnar.py checks both.

numba compiles these on their first call in a process, for the host's CPU, and keeps the
code where numba's own cache settings say (``cache=True``; for a zip, numba's per-user
cache directory). kprod sets no numba option for the process: a program's own numba
functions compile as they would without kprod.

Hot loops read their input arrays themselves rather than through helpers: numba may then
count references on every call, which costs many times the lookup itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

_JIT: dict[str, Any] = {"cache": True, "nogil": True, "boundscheck": False}

# A binary column as the loops read it: (data, each row's start, each row's length or -1).
Column = tuple[np.ndarray, np.ndarray, np.ndarray]
# Headers: each row's first and end entry, each row's header section size, keys, values.
Headers = tuple[np.ndarray, np.ndarray, np.ndarray, Column, Column]
# A scalar, from Python or from an int64 array.
Int = int | np.integer

# Varints are computed in int64 arithmetic: numba compares uint64 with int64 as floats.
# A zigzag value with its top bit set (|value| >= 2**62) reads as negative; it takes 10 bytes.
_LOW_57_BITS = (1 << 57) - 1


@njit(inline="always")
def _varint_size(value: Int) -> int:
    """Bytes of the zigzag varint of an int64."""
    u = (value << 1) ^ (value >> 63)
    if u < 0:
        return 10
    size = 1
    while u >= 128:
        u >>= 7
        size += 1
    return size


@njit(inline="always")
def _field_size(length: Int) -> int:
    """A length-prefixed field: its varint and its bytes (none for null, length -1)."""
    return _varint_size(length) + (length if length > 0 else 0)


@njit(inline="always")
def _put_varint(out: np.ndarray, pos: Int, value: Int) -> int:
    """Write the zigzag varint of an int64 at ``pos``; returns the position after it."""
    u = (value << 1) ^ (value >> 63)
    if u < 0:  # a logical shift for the first group, then u is non-negative
        out[pos] = (u & 0x7F) | 0x80
        u = (u >> 7) & _LOW_57_BITS
        pos += 1
    while u >= 128:
        out[pos] = (u & 0x7F) | 0x80
        u >>= 7
        pos += 1
    out[pos] = u
    return pos + 1


@njit(inline="always")
def _record_size(fixed: Int, timestamp_delta: Int, offset_delta: Int) -> int:
    """A whole record, its length varint included, from the bytes that do not depend on
    where it lands in a batch (attributes, key, value, headers) and its two deltas."""
    body = fixed + _varint_size(timestamp_delta) + _varint_size(offset_delta)
    return body + _varint_size(body)


@njit(**_JIT)
def header_sizes(entry_offsets: np.ndarray, key_lengths: np.ndarray, value_lengths: np.ndarray,
                 sizes: np.ndarray) -> None:
    """Bytes of each row's header section into ``sizes``, its count included (a null key
    is written empty)."""
    n = len(entry_offsets) - 1
    for row in range(n):
        first, end = entry_offsets[row], entry_offsets[row + 1]
        size = _varint_size(np.int64(end - first))
        for e in range(first, end):
            key_length = key_lengths[e]
            size += _field_size(key_length if key_length > 0 else 0) + _field_size(value_lengths[e])
        sizes[row] = size


@njit(**_JIT)
def plan_batches(key_lengths: np.ndarray, value_lengths: np.ndarray, header_sizes: np.ndarray, timestamps: np.ndarray,
                 groups: np.ndarray, group_count: int, limit: int, opens: np.ndarray, plan: np.ndarray) -> int:
    """Split rows into record batches, each row in its group's (a partition's) batches:
    which rows open a batch into ``opens``, per batch its group, record count, records
    section size, first and largest timestamp into the rows of ``plan``; returns the
    number of batches."""
    has_keys = len(key_lengths) != 0
    has_headers = len(header_sizes) != 0
    has_groups = len(groups) != 0
    n = len(value_lengths)
    batch_group, counts, sizes, base_ts, max_ts = plan[0], plan[1], plan[2], plan[3], plan[4]
    current = np.full(group_count, -1, np.int64)  # each group's open batch
    batches = 0
    for i in range(n):
        group = groups[i] if has_groups else 0
        ts = timestamps[i]
        # attributes, key, value, headers: all but the two deltas
        fixed = (1 + _field_size(key_lengths[i] if has_keys else -1) + _field_size(value_lengths[i])
                 + (header_sizes[i] if has_headers else 1))
        batch = current[group]
        size = 0
        if batch >= 0:
            size = _record_size(fixed, ts - base_ts[batch], counts[batch])
            if sizes[batch] + size > limit:
                batch = -1
        if batch < 0:
            batch = batches
            batches += 1
            current[group] = batch
            opens[i] = True
            batch_group[batch] = group
            counts[batch] = 0
            sizes[batch] = 0
            base_ts[batch] = ts
            max_ts[batch] = ts
            size = _record_size(fixed, np.int64(0), np.int64(0))
        counts[batch] += 1
        sizes[batch] += size
        if ts > max_ts[batch]:
            max_ts[batch] = ts
    return batches


def write_records(outs: Sequence[bytearray | memoryview | None], opens: np.ndarray, groups: np.ndarray,
                  keys: Column, values: Column, headers: Headers, timestamps: np.ndarray) -> list[int]:
    """Write every row's record into its group's buffer in ``outs`` (None for a group
    without rows), split into batches where ``opens`` says; returns the bytes written per
    group. numba's loop writes all groups into one array, each from its start on, which
    is then copied into the groups' buffers."""
    capacity = np.array([0 if b is None else memoryview(b).nbytes for b in outs], np.int64)
    ends = np.cumsum(capacity)
    starts = ends - capacity
    out = np.empty(int(ends[-1]) if len(ends) else 0, np.uint8)
    cursor = _write_records(out, starts, ends, opens, groups, keys, values, headers, timestamps)
    if cursor[0] < 0:
        raise ValueError(f"write_records: row {-1 - cursor[0]}: its group is outside outs or its buffer is full")
    written = (cursor - starts).tolist()
    for group, buffer in enumerate(outs):
        if written[group] and buffer is not None:
            np.frombuffer(buffer, np.uint8)[:written[group]] = out[starts[group]:starts[group] + written[group]]
    return written


@njit(**_JIT)
def _write_records(out: np.ndarray, group_starts: np.ndarray, group_ends: np.ndarray, opens: np.ndarray,
                   groups: np.ndarray, keys: Column, values: Column, headers: Headers,
                   timestamps: np.ndarray) -> np.ndarray:
    """Write every row's record into ``out``, each group's records from its start in
    ``group_starts`` on and before its end in ``group_ends``, split into batches where
    ``opens`` says; returns where each group's records end, or [-1 - row, ...] for the
    first row whose group is out of range or has no room left.

    The four field copies are written out: through a helper that takes the data array the
    loop runs 45% slower (reference counting, see the module docstring)."""
    key_data, key_starts, key_lengths = keys
    value_data, value_starts, value_lengths = values
    first_entry, end_entry, header_sizes, (hkey_data, hkey_starts, hkey_lengths), hvalues = headers
    hvalue_data, hvalue_starts, hvalue_lengths = hvalues
    has_keys = len(key_lengths) != 0
    has_headers = len(header_sizes) != 0
    has_groups = len(groups) != 0
    cursor = group_starts.copy()
    in_batch = np.zeros(len(group_starts), np.int64)  # records so far in each group's batch
    base = np.zeros(len(group_starts), np.int64)  # and its first timestamp
    for i in range(len(value_lengths)):
        group = groups[i] if has_groups else 0
        if group < 0 or group >= len(group_starts):
            cursor[:] = -1
            cursor[0] = -1 - i
            return cursor
        if opens[i]:
            in_batch[group] = 0
            base[group] = timestamps[i]
        offset_delta = in_batch[group]
        in_batch[group] = offset_delta + 1
        timestamp_delta = timestamps[i] - base[group]
        key_length = key_lengths[i] if has_keys else -1
        value_length = value_lengths[i]
        fixed = 1 + _field_size(key_length) + _field_size(value_length) + (header_sizes[i] if has_headers else 1)
        body = fixed + _varint_size(timestamp_delta) + _varint_size(offset_delta)
        if cursor[group] + _varint_size(body) + body > group_ends[group]:
            cursor[:] = -1
            cursor[0] = -1 - i
            return cursor
        pos = cursor[group]
        pos = _put_varint(out, pos, body)
        out[pos] = 0  # attributes
        pos = _put_varint(out, pos + 1, timestamp_delta)
        pos = _put_varint(out, pos, offset_delta)
        # The copies loop over two local slices: numba compiles that to a vectorised copy,
        # and indexing ``out`` and the data directly to a much slower byte loop.
        pos = _put_varint(out, pos, key_length)
        if key_length > 0:
            src = key_data[key_starts[i]:key_starts[i] + key_length]
            dst = out[pos:pos + key_length]
            for k in range(key_length):
                dst[k] = src[k]
            pos += key_length
        pos = _put_varint(out, pos, value_length)
        if value_length > 0:
            src = value_data[value_starts[i]:value_starts[i] + value_length]
            dst = out[pos:pos + value_length]
            for k in range(value_length):
                dst[k] = src[k]
            pos += value_length
        if not has_headers:
            out[pos] = 0  # no headers
            cursor[group] = pos + 1
            continue
        pos = _put_varint(out, pos, np.int64(end_entry[i] - first_entry[i]))
        for e in range(first_entry[i], end_entry[i]):
            length = hkey_lengths[e] if hkey_lengths[e] > 0 else 0  # a null key is written empty
            pos = _put_varint(out, pos, length)
            src = hkey_data[hkey_starts[e]:hkey_starts[e] + length]
            dst = out[pos:pos + length]
            for k in range(length):
                dst[k] = src[k]
            pos += length
            length = hvalue_lengths[e]
            pos = _put_varint(out, pos, length)
            if length > 0:
                src = hvalue_data[hvalue_starts[e]:hvalue_starts[e] + length]
                dst = out[pos:pos + length]
                for k in range(length):
                    dst[k] = src[k]
                pos += length
        cursor[group] = pos
    return cursor


# MurmurHash2's multiplier (Kafka's seed is the partitioner's: it is passed in).
_MURMUR2_M = 0x5BD1E995


@njit(**_JIT)
def murmur2_rows(data: np.ndarray, offsets: np.ndarray, nulls: np.ndarray, seed: int, out: np.ndarray) -> None:
    """MurmurHash2 with ``seed`` of each value of a binary column into ``out``. 32-bit
    arithmetic in int64, masked after each multiply."""
    n = len(offsets) - 1
    for row in range(n):
        start = np.int64(offsets[row])
        length = 0 if len(nulls) != 0 and nulls[row] else np.int64(offsets[row + 1]) - start
        h = (seed ^ length) & 0xFFFFFFFF
        end = start + (length & ~3)
        for i in range(start, end, 4):
            k = (np.int64(data[i]) | (np.int64(data[i + 1]) << 8) | (np.int64(data[i + 2]) << 16)
                 | (np.int64(data[i + 3]) << 24))
            k = (k * _MURMUR2_M) & 0xFFFFFFFF
            k ^= k >> 24
            k = (k * _MURMUR2_M) & 0xFFFFFFFF
            h = ((h * _MURMUR2_M) & 0xFFFFFFFF) ^ k
        rest = length & 3
        if rest == 3:
            h ^= np.int64(data[end + 2]) << 16
        if rest >= 2:
            h ^= np.int64(data[end + 1]) << 8
        if rest >= 1:
            h ^= np.int64(data[end])
            h = (h * _MURMUR2_M) & 0xFFFFFFFF
        h ^= h >> 13
        h = (h * _MURMUR2_M) & 0xFFFFFFFF
        h ^= h >> 15
        out[row] = h
