"""Columnar record encoding: Arrow columns straight into record batch v2 records sections.

No Python code runs per record. Every varint of every record is computed as a numpy
array, laid out as a fixed-width byte matrix and compacted with a mask (row-major order
keeps each record's bytes together); keys, values and headers are then spliced between
those varints by Arrow's element-wise binary join, whose output buffer *is* the records
section. The bytes equal :func:`spark_sink.protocol.records.encode_records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_sink.protocol.compression import compress
from spark_sink.protocol.primitives import write_uvarint, write_varint
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD

_EMPTY = pa.scalar(b"", pa.binary())


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """A finished records section for one record batch, compressed with ``codec``."""

    payload: bytes | memoryview  # uncompressed sections are views of one encoded buffer
    codec: int
    record_count: int
    base_timestamp: int
    max_timestamp: int
    uncompressed_size: int

    @property
    def last_offset_delta(self) -> int:
        return self.record_count - 1

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the batch on the wire, header included."""
        return RECORD_BATCH_OVERHEAD + len(self.payload)


def _zigzag(values: np.ndarray) -> np.ndarray:
    v = values.astype(np.int64, copy=False)
    return ((v << 1) ^ (v >> 63)).view(np.uint64)


def _uvarint_sizes(u: np.ndarray) -> np.ndarray:
    sizes = np.ones(len(u), dtype=np.int64)
    top = int(u.max()) if len(u) else 0
    threshold = 128
    while threshold <= top:  # one comparison per byte the largest value needs
        sizes += u >= np.uint64(threshold)
        threshold <<= 7
    return sizes


def varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes each zigzag varint of ``values`` takes."""
    return _uvarint_sizes(_zigzag(values))


def _varint_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(bytes matrix n×width, mask of used bytes) of the zigzag varints of ``values``;
    width is the longest varint present, and a column of one repeated value (a fixed key
    or value length, a zero timestamp delta) is a single broadcast row."""
    u = _zigzag(values)
    n = len(u)
    lo, hi = (int(u.min()), int(u.max())) if n else (0, 0)
    if lo == hi:
        encoded = np.frombuffer(write_uvarint(lo), dtype=np.uint8)
        return np.broadcast_to(encoded, (n, len(encoded))), np.broadcast_to(True, (n, len(encoded)))
    sizes = _uvarint_sizes(u)
    width = int(sizes.max())
    word = np.uint32 if width <= 4 else np.uint64
    shifts = (np.arange(width) * 7).astype(word)
    groups = ((u.astype(word)[:, None] >> shifts) & word(0x7F)).astype(np.uint8)
    columns = np.arange(width)[None, :]
    used = columns < sizes[:, None]
    groups |= (columns < (sizes - 1)[:, None]).view(np.uint8) << 7
    return groups, used


def _varints_to_binary(columns: Sequence[tuple[np.ndarray, np.ndarray]], n: int) -> pa.Array:
    """One binary value per row: the concatenation of several varints (matrix + mask)."""
    matrix = np.concatenate([c[0] for c in columns], axis=1) if len(columns) > 1 else columns[0][0]
    mask = np.concatenate([c[1] for c in columns], axis=1) if len(columns) > 1 else columns[0][1]
    data = matrix[mask]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(mask.sum(axis=1, dtype=np.int32), out=offsets[1:])
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# _BYTE_MASKS[w] is a uint64 whose first w bytes are 0x01: viewed as 8 bools it selects
# the used bytes of a varint packed little-endian into a uint64 word.
_BYTE_MASKS = np.array([int.from_bytes(b"\x01" * w + b"\x00" * (8 - w), "little") for w in range(9)], np.uint64)
_WORD_BYTES = 8


def _fold(values: np.ndarray) -> np.ndarray | int:
    """``values`` as one int when every row holds the same number (fixed key or value
    lengths, a constant timestamp delta): later passes then broadcast a scalar."""
    if len(values) and values.min() == values.max():
        return int(values[0])
    return values


def _widths(values: np.ndarray | int) -> np.ndarray | int:
    """Bytes of the zigzag varint of each value (a scalar for a scalar)."""
    if isinstance(values, (int, np.integer)):
        return len(write_varint(int(values)))
    lo, hi = int(values.min()), int(values.max())
    if lo >= -1:  # zigzag(v) = 2v for v >= 0 and 1 for -1: compare v itself, no zigzag pass
        widths = np.ones(len(values), dtype=np.int64)
        threshold = 64
        while threshold <= hi:
            widths += values >= threshold
            threshold <<= 7
        return widths
    return _uvarint_sizes(_zigzag(values))


@dataclass(frozen=True, slots=True)
class _Varints:
    """The zigzag varints of one field of every row: each packed little-endian into a
    uint64 ``word`` (valid when ``widest`` <= 8) and its byte count ``width``."""

    values: np.ndarray | int
    word: np.ndarray | int
    width: np.ndarray | int
    widest: int

    @classmethod
    def of(cls, values: np.ndarray | int) -> _Varints:
        if isinstance(values, (int, np.integer)):
            encoded = write_varint(int(values))
            return cls(int(values), int.from_bytes(encoded[:_WORD_BYTES], "little"), len(encoded), len(encoded))
        u = _zigzag(values)
        hi = int(u.max()) if len(u) else 0
        widest = max(1, (hi.bit_length() + 6) // 7)
        width = _widths(values)
        if widest > _WORD_BYTES:
            return cls(values, 0, width, widest)
        seven = np.uint64(0x7F)
        word = u & seven
        for j in range(1, widest):
            # the j-th 7-bit group, and the previous byte's continuation bit when it exists
            word |= ((u >> np.uint64(7 * j)) & seven) << np.uint64(8 * j)
            word |= (u >= np.uint64(1 << (7 * j))).astype(np.uint64) << np.uint64(8 * j - 1)
        return cls(values, word, width, widest)


def _varint_parts(fields: Sequence[_Varints | int], n: int) -> list[pa.Array]:
    """Binary arrays whose element-wise concatenation is, per row, the zigzag varints of
    ``fields`` in order. Fields are packed side by side into one uint64 word per row (with
    per-row shifts) while they fit 8 bytes, and each word is cut to its used bytes with a
    single boolean mask: a handful of numpy passes instead of one per byte."""
    parts: list[pa.Array] = []
    word: np.ndarray | int = 0
    width: np.ndarray | int = 0
    room = 0  # widest total of the current word

    for field in fields:
        f = field if isinstance(field, _Varints) else _Varints.of(field)
        if room and room + f.widest > _WORD_BYTES:
            parts.append(_word_to_binary(word, width, n))
            word, width, room = 0, 0, 0
        if f.widest > _WORD_BYTES:  # a delta beyond 2**55: the general byte-matrix path
            values = np.broadcast_to(np.int64(f.values), n) if isinstance(f.values, int) else f.values
            parts.append(_varints_to_binary([_varint_columns(values)], n))
            continue
        if room == 0:
            word, width = f.word, f.width
        elif isinstance(width, int) and isinstance(f.word, int):
            word, width = word | (f.word << (8 * width)), width + f.width
        else:
            shift = np.uint64(8 * width) if isinstance(width, int) else (width << 3).astype(np.uint64)
            f_word = np.uint64(f.word) if isinstance(f.word, int) else f.word
            word = np.bitwise_or(word, np.left_shift(f_word, shift, dtype=np.uint64), dtype=np.uint64)
            width = width + f.width
        room += f.widest
    if room:
        parts.append(_word_to_binary(word, width, n))
    return parts


def _word_to_binary(word: np.ndarray | int, width: np.ndarray | int, n: int) -> pa.Array:
    """A binary array of the first ``width`` bytes of each little-endian uint64 ``word``."""
    if isinstance(word, int) and isinstance(width, int):
        one = word.to_bytes(_WORD_BYTES, "little")[:width]
        data = np.frombuffer(one * n, dtype=np.uint8) if n else np.zeros(0, np.uint8)
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32) if width else np.zeros(n + 1, np.int32)
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    words = np.broadcast_to(np.asarray(word, dtype=np.uint64), n)
    matrix = np.ascontiguousarray(words).view(np.uint8).reshape(n, _WORD_BYTES)
    offsets = np.zeros(n + 1, dtype=np.int32)
    if isinstance(width, int):
        data = matrix[:, :width]
        offsets[1:] = np.arange(width, (n + 1) * width, width, dtype=np.int32)
    else:
        data = matrix[_BYTE_MASKS[width].view(np.bool_).reshape(n, _WORD_BYTES)]
        np.cumsum(width, out=offsets[1:], dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))])


def _offsets(arr: pa.Array) -> np.ndarray:
    """The int32 offsets of a binary array, honouring a sliced array's offset."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]


def _lengths(arr: pa.Array | None, n: int) -> np.ndarray:
    """Byte length of each value, -1 for null (as the record format encodes it)."""
    if arr is None:
        return np.full(n, -1, dtype=np.int64)
    lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False)
    if arr.null_count:
        return np.where(pc.is_null(arr).to_numpy(zero_copy_only=False), -1, lengths).astype(np.int64)
    return lengths.astype(np.int64)


def as_binary(arr: pa.Array | pa.ChunkedArray | None) -> pa.Array | None:
    """A plain ``binary`` array (string, large and view variants cast without per-row work)."""
    if arr is None:
        return None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    return arr


def _header_blobs(headers: pa.Array, n: int) -> tuple[np.ndarray, pa.Array]:
    """(header count per row, encoded header section per row without its count)."""
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    headers = pc.fill_null(headers, pa.scalar([], headers.type)) if headers.null_count else headers
    offsets = headers.offsets.to_numpy()
    counts = np.diff(offsets).astype(np.int64)
    entries = headers.values.slice(offsets[0], offsets[-1] - offsets[0])
    hkeys = as_binary(entries.field("key"))
    hvalues = as_binary(entries.field("value"))
    m = len(entries)
    if m == 0:
        empty = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.zeros(n + 1, np.int32)), pa.py_buffer(b"")])
        return counts, empty
    klen = _lengths(hkeys, m)
    klen[klen < 0] = 0  # header keys are strings; a null key is written as empty
    (key_prefix,) = _varint_parts([_Varints.of(_fold(klen))], m)
    (value_prefix,) = _varint_parts([_Varints.of(_fold(_lengths(hvalues, m)))], m)
    joined = pc.binary_join_element_wise(key_prefix, hkeys, value_prefix, hvalues, _EMPTY,
                                         null_handling="replace", null_replacement="")
    entry_offsets = _offsets(joined)
    row_offsets = entry_offsets[offsets - offsets[0]].astype(np.int32)
    blob = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(row_offsets), joined.buffers()[2]])
    return counts, blob


@dataclass(frozen=True, slots=True)
class _Columns:
    """Rows to encode, with what every pass needs: the varints of the lengths and the
    bytes of each record that do not depend on where its batch starts."""

    keys: pa.Array | None
    values: pa.Array
    key_lengths: _Varints
    value_lengths: _Varints
    header_counts: _Varints
    header_blobs: pa.Array | None
    fixed: np.ndarray | int  # record bytes after the attributes, offset and timestamp deltas

    @classmethod
    def of(cls, keys: pa.Array | None, values: pa.Array, headers: pa.Array | None) -> _Columns:
        n = len(values)
        if headers is not None:
            counts, blobs = _header_blobs(headers, n)
            header_bytes = _fold(np.diff(_offsets(blobs)).astype(np.int64))
            counts = _fold(counts)
        else:
            counts, blobs, header_bytes = 0, None, 0
        klen = _Varints.of(_fold(_lengths(keys, n)))
        vlen = _Varints.of(_fold(_lengths(values, n)))
        hcount = _Varints.of(counts)
        fixed = (klen.width + np.maximum(klen.values, 0) + vlen.width + np.maximum(vlen.values, 0)
                 + hcount.width + header_bytes)
        return cls(keys, values, klen, vlen, hcount, blobs, fixed if isinstance(fixed, np.ndarray) else int(fixed))

    def record_sizes(self, timestamp_deltas: np.ndarray | int, offset_deltas: np.ndarray | int) -> np.ndarray | int:
        """Whole size of each record (length varint included) with these deltas."""
        body = 1 + _widths(timestamp_deltas) + _widths(offset_deltas) + self.fixed
        return body + _widths(body)

    def encode(self, timestamp_deltas: np.ndarray | int, offset_deltas: np.ndarray,
               segments: Sequence[int] = (0,)) -> list[pa.Array]:
        """Every record, one binary value each, with the given deltas: one array per
        segment (rows from each of ``segments`` up to the next), each in a buffer of its own."""
        n = len(self.values)
        td, od = _Varints.of(timestamp_deltas), _Varints.of(offset_deltas)
        body = 1 + td.width + od.width + self.fixed
        head = [_Varints.of(body), 0, td, od, self.key_lengths]
        # The element-wise join costs per part: runs of varints are packed into one part,
        # and without keys the value length joins the prefix.
        if self.keys is None:
            parts = [*_varint_parts([*head, self.value_lengths], n), self.values]
        else:
            parts = [*_varint_parts(head, n), self.keys, *_varint_parts([self.value_lengths], n), self.values]
        parts += _varint_parts([self.header_counts], n)
        if self.header_blobs is not None:
            parts.append(self.header_blobs)
        return [pc.binary_join_element_wise(*(p.slice(lo, hi - lo) for p in parts), _EMPTY,
                                            null_handling="replace", null_replacement="")
                for lo, hi in zip(segments, [*segments[1:], n])]


# Average rows per segment from which each segment is joined into a buffer of its own,
# rather than all at once and copied out (110-byte records: 70,000 rows in 6 segments
# 91-97 against 102-108 ns a row; 10,000 in 48 140-181 against 118).
_SEPARATE_JOIN_ROWS = 4096


def _split(sizes: np.ndarray, limit: int) -> np.ndarray:
    """Start row of each batch: greedy runs whose sizes sum to at most ``limit`` (a row
    larger than the limit gets a batch of its own)."""
    cumulative = np.cumsum(sizes)
    starts = [0]
    n = len(sizes)
    start, consumed = 0, 0
    while True:
        end = int(np.searchsorted(cumulative, consumed + limit, side="right"))
        end = max(end, start + 1)
        if end >= n:
            break
        starts.append(end)
        start, consumed = end, int(cumulative[end - 1])
    return np.asarray(starts, dtype=np.int64)


def encode_columns(keys: pa.Array | None, values: pa.Array, timestamps: np.ndarray, headers: pa.Array | None = None,
                   *, batch_size: int, codec: int = 0, level: int | None = None,
                   segments: Sequence[int] = (0,)) -> list[EncodedRecords]:
    """Encode rows, in order, into record batches of at most ``batch_size`` bytes each.

    ``keys``/``values`` are binary-like arrays (nulls allowed), ``timestamps`` int64
    milliseconds, ``headers`` a list<struct<key, value>> array or None. ``segments`` are
    the rows that start a batch whatever its size (0 first): several partitions' rows are
    encoded in one pass, numpy's fixed cost paid once. No batch spans two segments, and the
    uncompressed payloads of a segment are views of a buffer of its own, so that one
    partition's unsent batches never keep another's bytes alive.
    """
    values = as_binary(values)
    keys = as_binary(keys)
    n = len(values)
    if n == 0:
        return []
    ends = [*segments[1:], n]
    if n <= _ROW_LOOP_MAX and headers is None:
        # Few rows (a partition's share of a small table): numpy's fixed cost per call
        # (~300 us for this function) would outweigh the rows' own.
        key_list = keys.to_pylist() if keys is not None else [None] * n
        value_list, ts_list = values.to_pylist(), np.asarray(timestamps, dtype=np.int64).tolist()
        return [e for lo, hi in zip(segments, ends)
                for e in _encode_small(key_list[lo:hi], value_list[lo:hi], ts_list[lo:hi], batch_size, codec, level)]
    timestamps = np.asarray(timestamps, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    columns = _Columns.of(keys, values, headers)
    limit = max(1, batch_size - RECORD_BATCH_OVERHEAD)
    seg = np.asarray(segments, dtype=np.int64)
    starts = seg
    if 0 < batch_size and limit < 2**31:
        # Size every record with deltas at least as long as the ones it can get in any
        # batch, so no batch overflows: an offset delta is below the count of records that
        # fit in a batch; a timestamp delta is bounded by the spread of the timestamps.
        td_bound = _timestamp_delta_bound(timestamps)
        if isinstance(td_bound, int) and isinstance(columns.fixed, int):
            # Records differ only by their offset delta: every batch holds the same count,
            # found once by sizing offset deltas 0, 1, 2, ... (the greedy split, exactly).
            cap = min(n, limit // 7 + 1)
            per_batch = max(1, int(np.searchsorted(np.cumsum(columns.record_sizes(td_bound, np.arange(cap))),
                                                   limit, "right")))
            per_segment = -(-(np.asarray(ends) - seg) // per_batch)
            within = np.arange(int(per_segment.sum())) - np.repeat(np.cumsum(per_segment) - per_segment, per_segment)
            starts = np.repeat(seg, per_segment) + within * per_batch
        else:
            sizes = np.broadcast_to(columns.record_sizes(td_bound, np.minimum(rows, limit // 7)), n)
            totals = np.add.reduceat(sizes, seg).tolist()
            starts = np.concatenate([_split(sizes[lo:hi], limit) + lo if total > limit else [lo]
                                     for lo, hi, total in zip(segments, ends, totals)]).astype(np.int64)
    counts = np.diff(np.append(starts, n))
    base_ts = timestamps[starts]
    if len(starts) == 1:
        offset_deltas, timestamp_deltas = rows, _fold(timestamps - base_ts[0])
    else:
        batch_of_row = np.repeat(np.arange(len(starts)), counts)
        offset_deltas = rows - starts[batch_of_row]
        timestamp_deltas = _fold(timestamps - base_ts[batch_of_row])
    # Uncompressed payloads are views, not copies: together they keep their buffer alive
    # until the last of them is sent (the accumulator reserves memory for a partition's
    # group as a whole, and frees it with its last batch), so each segment needs a buffer
    # of its own. Large segments are joined apart; small ones are joined together and
    # copied out, as a join call costs ~12 us, more than copying a few KiB. Compressed
    # payloads are copies anyway.
    apart = len(seg) > 1 and not codec
    separate = apart and n >= _SEPARATE_JOIN_ROWS * len(seg)
    joined = columns.encode(timestamp_deltas, offset_deltas, segments if separate else (0,))
    max_ts = np.maximum.reduceat(timestamps, starts).tolist()
    counts_list, base_list = counts.tolist(), base_ts.tolist()
    batch_rows = np.append(starts, n)
    first_batches = [*np.searchsorted(starts, seg).tolist(), len(starts)]
    if not separate:
        whole = memoryview(joined[0].buffers()[2]).cast("B")  # pyarrow exports signed bytes
        all_bounds = _offsets(joined[0])[batch_rows].tolist()
    out = []
    for k, (b0, b1) in enumerate(zip(first_batches, first_batches[1:])):
        base = 0
        if separate:
            data = memoryview(joined[k].buffers()[2]).cast("B")
            bounds = _offsets(joined[k])[batch_rows[b0:b1 + 1] - segments[k]].tolist()
        else:
            data, bounds = whole, all_bounds[b0:b1 + 1]
            if apart:
                base = bounds[0]
                data = memoryview(bytes(whole[base:bounds[-1]]))
        for b, lo, hi in zip(range(b0, b1), bounds, bounds[1:]):
            section = data[lo - base:hi - base]
            payload = compress(codec, section, level) if codec else section
            out.append(EncodedRecords(payload, codec, counts_list[b], base_list[b], max_ts[b], hi - lo))
    return out


def _timestamp_delta_bound(timestamps: np.ndarray) -> np.ndarray | int:
    """Per row, a value whose varint is at least as long as the row's timestamp delta
    from any earlier row of the input (the base of whichever batch it lands in)."""
    lo, hi = int(timestamps.min()), int(timestamps.max())
    if lo == hi:
        return 0
    if (timestamps[1:] >= timestamps[:-1]).all():
        return timestamps - timestamps[0]
    return np.maximum(timestamps - lo, hi - timestamps)


_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


# Zigzag varints of small non-negative numbers (offset deltas, lengths, small
# timestamp deltas): the per-record path looks them up instead of computing them.
_SMALL_VARINTS = [write_varint(i) for i in range(1 << 14)]
_NULL_LENGTH = write_varint(-1)
# Below this many records a Python loop over table lookups beats numpy's per-call cost
# (measured crossover: 400-600 records of ~100 bytes).
_ROW_LOOP_MAX = 512


# For n < 2**14: how many bytes n's varint takes, and those plus n (a length-prefixed field).
_VARINT_SIZE = [len(v) for v in _SMALL_VARINTS]
_FIELD_SIZE = [len(v) + n for n, v in enumerate(_SMALL_VARINTS)]


def _encode_rows_loop(keys: list[bytes | None], values: list[bytes | None], timestamps: list[int],
                      max_timestamp: int) -> bytes:
    """Header-less records of a small batch; same bytes as the vectorised path."""
    base = timestamps[0]
    if len(values) < 1 << 14 and max_timestamp - base < 1 << 14 and min(timestamps) >= base:
        # Every offset and timestamp delta has a ready-made varint. The short loops
        # below raise TypeError on a null value (or a null key among others) and
        # IndexError on a field of 16 KiB or more: such batches take the general loop.
        try:
            if keys.count(None) == len(keys):
                return _encode_keyless_rows(values, timestamps)
            return _encode_keyed_rows(keys, values, timestamps)
        except (TypeError, IndexError):
            pass
    return _encode_any_rows(keys, values, timestamps)


def _encode_keyed_rows(keys: list[bytes], values: list[bytes], timestamps: list[int]) -> bytes:
    """_encode_any_rows for records with a key and a value each, whose fields, offset and
    timestamp deltas are all below 2**14: table lookups, no branches (~30% faster)."""
    base = timestamps[0]
    parts: list[bytes] = []
    extend = parts.extend
    varint, varint_size, field_size = _SMALL_VARINTS, _VARINT_SIZE, _FIELD_SIZE
    for i, key, value, ts in zip(range(len(values)), keys, values, timestamps):
        key_size, value_size, delta = len(key), len(value), ts - base
        # size: attributes and header count (one byte each), the deltas, key and value
        size = 2 + varint_size[delta] + varint_size[i] + field_size[key_size] + field_size[value_size]
        extend((varint[size], b"\x00", varint[delta], varint[i], varint[key_size], key, varint[value_size], value,
                b"\x00"))
    return b"".join(parts)


def _encode_keyless_rows(values: list[bytes], timestamps: list[int]) -> bytes:
    """_encode_keyed_rows for records without a key."""
    base = timestamps[0]
    parts: list[bytes] = []
    extend = parts.extend
    varint, varint_size, field_size = _SMALL_VARINTS, _VARINT_SIZE, _FIELD_SIZE
    null_size = 2 + len(_NULL_LENGTH)
    for i, value, ts in zip(range(len(values)), values, timestamps):
        value_size, delta = len(value), ts - base
        size = null_size + varint_size[delta] + varint_size[i] + field_size[value_size]
        extend((varint[size], b"\x00", varint[delta], varint[i], _NULL_LENGTH, varint[value_size], value, b"\x00"))
    return b"".join(parts)


def _encode_any_rows(keys: list[bytes | None], values: list[bytes | None], timestamps: list[int]) -> bytes:
    """Header-less records, any of them null or large, any timestamps.

    Every piece of a record goes into one list and is copied once, by the final join:
    no per-record concatenation (cold 100-byte values: ~25% faster than joining a body
    first, and ~10% faster again than concatenating the varints).
    """
    base = timestamps[0]
    parts: list[bytes] = []
    extend = parts.extend
    small = _SMALL_VARINTS
    for i, (key, value, ts) in enumerate(zip(keys, values, timestamps)):
        delta = ts - base
        delta_varint = small[delta] if 0 <= delta < 16384 else write_varint(delta)
        offset_varint = small[i] if i < 16384 else write_varint(i)
        if key is None:
            key_length, key = _NULL_LENGTH, b""
        else:
            key_length = small[len(key)] if len(key) < 16384 else write_varint(len(key))
        if value is None:
            value_length, value = _NULL_LENGTH, b""
        else:
            value_length = small[len(value)] if len(value) < 16384 else write_varint(len(value))
        # attributes and the header count are one byte each
        size = 2 + len(delta_varint) + len(offset_varint) + len(key_length) + len(key) + len(value_length) + len(value)
        extend((small[size] if size < 16384 else write_varint(size), b"\x00", delta_varint, offset_varint,
                key_length, key, value_length, value, b"\x00"))
    return b"".join(parts)


def _encode_small(keys: list[bytes | None], values: list[bytes | None], timestamps: list[int], batch_size: int,
                  codec: int, level: int | None) -> list[EncodedRecords]:
    """encode_columns() for a few header-less rows, row by row: records laid out as in
    _encode_rows_loop, split greedily at batch_size (exact sizes, as the accumulator would).

    Kept apart from _encode_rows_loop, which seals every send() batch and needs no split:
    this loop's bookkeeping would cost it ~11% (593 against 533 ns a record).
    """
    limit = max(1, batch_size - RECORD_BATCH_OVERHEAD) if batch_size > 0 else 1 << 62
    sections: list[tuple[bytes, int, int]] = []  # (records section, first row, rows)
    parts: list[bytes] = []
    extend = parts.extend
    small = _SMALL_VARINTS
    first, base, total = 0, timestamps[0], 0
    for i, (key, value, ts) in enumerate(zip(keys, values, timestamps)):
        if key is None:
            key_length, key = _NULL_LENGTH, b""
        else:
            key_length = small[len(key)] if len(key) < 16384 else write_varint(len(key))
        if value is None:
            value_length, value = _NULL_LENGTH, b""
        else:
            value_length = small[len(value)] if len(value) < 16384 else write_varint(len(value))
        delta, offset = ts - base, i - first
        delta_varint = small[delta] if 0 <= delta < 16384 else write_varint(delta)
        offset_varint = small[offset] if offset < 16384 else write_varint(offset)
        fixed = 2 + len(key_length) + len(key) + len(value_length) + len(value)  # + attributes, header count
        size = fixed + len(delta_varint) + len(offset_varint)
        length = small[size] if size < 16384 else write_varint(size)
        total += len(length) + size
        if total > limit and offset:
            # Full: this record opens the next batch, as its first (both deltas 0).
            sections.append((b"".join(parts), first, offset))
            parts.clear()
            first, base = i, ts
            delta_varint = offset_varint = b"\x00"
            size = fixed + 2
            length = small[size] if size < 16384 else write_varint(size)
            total = len(length) + size
        extend((length, b"\x00", delta_varint, offset_varint, key_length, key, value_length, value, b"\x00"))
    sections.append((b"".join(parts), first, len(values) - first))
    return [EncodedRecords(compress(codec, section, level) if codec else section, codec, count, timestamps[lo],
                           max(timestamps[lo:lo + count]), len(section))
            for section, lo, count in sections]


def encode_rows(keys: list[bytes | None], values: list[bytes | None], timestamps: list[int],
                headers: list[Sequence[tuple[str, bytes | None]]] | None = None, codec: int = 0,
                level: int | None = None) -> EncodedRecords:
    """One record batch from Python lists (how the per-record send() path seals a batch)."""
    n = len(values)
    if n <= _ROW_LOOP_MAX and not (headers is not None and any(headers)):
        max_timestamp = max(timestamps)
        section = _encode_rows_loop(keys, values, timestamps, max_timestamp)
        payload = compress(codec, section, level) if codec else section
        return EncodedRecords(payload, codec, n, timestamps[0], max_timestamp, len(section))
    key_array = None if all(k is None for k in keys) else pa.array(keys, pa.binary())
    header_array = None
    if headers is not None and any(headers):
        header_array = pa.array([[{"key": k, "value": v} for k, v in h] if h else [] for h in headers], _HEADER_TYPE)
    (encoded,) = encode_columns(key_array, pa.array(values, pa.binary()), np.fromiter(timestamps, np.int64, n),
                                header_array, batch_size=0, codec=codec, level=level)
    return encoded
