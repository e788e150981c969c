"""Columnar record encoding: Arrow columns straight into record batch v2 records sections.

No Python code runs per record: compiled loops (:mod:`spark_sink.encoder.kernels`) read
the Arrow buffers of keys, values and headers, first to split the rows into batches
(exact sizes, greedy, as the accumulator fills a batch), then to write every record into a
buffer that *is* the records section. The bytes equal
:func:`spark_sink.protocol.records.encode_records`. (send()'s batches are encoded record
by record as they fill: see :func:`spark_sink.protocol.records.record_parts`.)
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from spark_sink.encoder import kernels
from spark_sink.protocol.compression import compress
from spark_sink.protocol.records import MAX_HEADER_OVERHEAD, MAX_RECORD_OVERHEAD, RECORD_BATCH_OVERHEAD

# The headers column as the encoder reads it; other list and string types are cast to it.
HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@dataclass(slots=True)
class EncodedRecords:
    """A finished records section for one record batch, compressed with ``codec``. Not
    changed once made (not frozen: a frozen dataclass costs twice as much to make, and
    send_arrow makes one per partition and call)."""

    # An uncompressed section is a view of its partition's encoded buffer, or where batches
    # are joined (encode_groups' continued) a RecordBuffer: one holding these records alone,
    # or, with first_offset, the claimed one they were written past the end of.
    payload: bytes | memoryview | Any
    codec: int
    record_count: int
    base_timestamp: int
    max_timestamp: int
    uncompressed_size: int
    # Above 0: the records continue a batch holding this many, their offset deltas from
    # here on and their timestamp deltas from base_timestamp, that batch's first timestamp
    # (encode_groups' continued), written past the end of its RecordBuffer (the payload):
    # not part of it until committed there (the Joiner, or ProducerBatch.join), nor a
    # batch of their own until moved out (the Joiner, or RecordBuffer.pending, then
    # append_section).
    first_offset: int = 0

    @property
    def last_offset_delta(self) -> int:
        return self.record_count - 1

    @property
    def size_in_bytes(self) -> int:
        """Bytes of the batch on the wire, header included."""
        return RECORD_BATCH_OVERHEAD + (len(self.payload) if self.codec else self.uncompressed_size)


@dataclass(slots=True)
class Continued:
    """What a call's rows may continue, per group (partition): the batch queued last for
    it, whose RecordBuffer is claimed for them (RecordAccumulator.continued)."""

    held: np.ndarray  # int64, 3 x groups: record count (0: none), records section bytes, first timestamp
    targets: list[Any]  # per group: the claimed RecordBuffer of that batch, or None


def _frozen(a: np.ndarray) -> np.ndarray:
    """A read-only view. numba compiles a kernel once per combination of argument types,
    writability included: every input is passed read-only, so one build serves all."""
    a = a.view()
    a.flags.writeable = False
    return a


_NO_BYTES = _frozen(np.zeros(0, np.uint8))
_NO_OFFSETS = _frozen(np.zeros(0, np.int32))
_NO_LENGTHS = _frozen(np.zeros(0, np.int64))
_ABSENT = (_NO_BYTES, _NO_OFFSETS, _NO_LENGTHS)  # a column that is not there: every value null
_NO_HEADERS = (_NO_OFFSETS, _NO_OFFSETS, _NO_LENGTHS, _ABSENT, _ABSENT)
_NO_GROUPS = _NO_LENGTHS  # every row in group 0


def binary_offsets(arr: pa.Array) -> np.ndarray:
    """The int32 offsets of a binary array, honouring a sliced array's offset."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + len(arr) + 1]


def as_numpy(arr: pa.Array | pa.ChunkedArray, fill: int | None = None) -> np.ndarray:
    """An integer or boolean array as numpy, read from its buffers (a view where the layouts
    agree), its nulls set to ``fill``. Not pyarrow's ``to_numpy``, nor ``pa.array`` or a
    Python scalar given to a compute function: each imports pandas, a third of a second
    of CPU in every fresh Spark Python worker's first write."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count and fill is None:
        raise ValueError(f"an array with {arr.null_count} null(s) and no fill value")
    t, lo, hi = arr.type, arr.offset, arr.offset + len(arr)
    data = arr.buffers()[1]
    if pa.types.is_boolean(t):
        bits = np.zeros(0, np.uint8) if data is None else np.unpackbits(np.frombuffer(data, np.uint8), bitorder="little")
        out = bits[lo:hi].view(np.bool_)
    elif pa.types.is_integer(t):
        dtype = np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
        out = np.zeros(0, dtype) if data is None else np.frombuffer(data, dtype)[lo:hi]
    else:
        raise TypeError(f"no numpy form here for Arrow type {t}")
    if arr.null_count:
        out = out.copy()
        out[as_numpy(arr.is_null())] = fill
    return out


def as_arrow_indices(rows: np.ndarray) -> pa.Array:
    """Row numbers as an int64 Arrow array for ``take``, over the numpy buffer (no
    ``pa.array``: see :func:`as_numpy`)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def value_lengths(arr: pa.Array) -> np.ndarray:
    """Bytes of each value of a binary array, 0 for a null (int64)."""
    return np.maximum(_column(arr)[2], 0)


def as_binary(arr: pa.Array | pa.ChunkedArray | None) -> pa.Array | None:
    """A plain ``binary`` array (string, large and view variants cast without per-row work)."""
    if arr is None:
        return None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != pa.binary():
        arr = arr.cast(pa.binary())
    return arr


def _column(arr: pa.Array | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary array as the compiled loops read it: (data, start of each value, length of
    each value, -1 for null)."""
    if arr is None:
        return _ABSENT
    offsets = binary_offsets(arr)
    starts, lengths = offsets[:-1], np.diff(offsets).astype(np.int64)
    if arr.null_count:
        lengths[as_numpy(arr.is_null())] = -1
    data = arr.buffers()[2]
    return _NO_BYTES if data is None else _frozen(np.frombuffer(data, np.uint8)), _frozen(starts), _frozen(lengths)


def _header_entries(headers: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, tuple, tuple]:
    """A list<struct<key, value>> array as (each row's first entry, then the end of the
    last: int32), and the entries' key and value columns as :func:`_column` reads them."""
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    if headers.type != HEADER_TYPE:
        headers = headers.cast(HEADER_TYPE)
    offsets = as_numpy(headers.offsets)
    if headers.null_count and np.diff(offsets)[as_numpy(headers.is_null())].any():
        # A null list spanning entries (Arrow allows it; builders leave it empty): make it
        # empty. Only here a Python scalar is converted (see as_numpy).
        headers = headers.fill_null(pa.scalar([], HEADER_TYPE))
        offsets = as_numpy(headers.offsets)
    entries = headers.values.slice(offsets[0], offsets[-1] - offsets[0])
    entry_offsets = _frozen((offsets - offsets[0]).astype(np.int32))
    return entry_offsets, _column(as_binary(entries.field("key"))), _column(as_binary(entries.field("value")))


def _header_column(headers: pa.Array | None) -> tuple:
    """A list<struct<key, value>> array as the compiled loops read it (see kernels)."""
    if headers is None:
        return _NO_HEADERS
    entry_offsets, keys, values = _header_entries(headers)
    sizes = np.empty(len(entry_offsets) - 1, np.int64)
    kernels.compiled().header_sizes(entry_offsets, keys[2], values[2], sizes)
    return entry_offsets[:-1], entry_offsets[1:], _frozen(sizes), keys, values


def record_size_bounds(keys: pa.Array | None, values: pa.Array, headers: pa.Array | None) -> np.ndarray:
    """The most bytes each row's record can take in a batch (its length and every varint
    at their widest): what a record is checked by before it is queued, as send() does.
    ``keys`` and ``values`` are binary arrays (see :func:`as_binary`)."""
    sizes = value_lengths(values) + MAX_RECORD_OVERHEAD
    if keys is not None:
        sizes += value_lengths(keys)
    if headers is not None:
        entry_offsets, header_keys, header_values = _header_entries(headers)
        entry_sizes = np.maximum(header_keys[2], 0) + np.maximum(header_values[2], 0) + MAX_HEADER_OVERHEAD
        ends = np.concatenate(([0], np.cumsum(entry_sizes)))
        sizes += ends[entry_offsets[1:]] - ends[entry_offsets[:-1]]
    return sizes


_scratch_buffers = threading.local()


def _scratch(size: int) -> np.ndarray:
    """This thread's scratch buffer, at least ``size`` bytes: written over by every call
    that copies its output out, so that its pages are touched once, not once per call
    (fresh pages cost more to fault in than to copy)."""
    buffer = getattr(_scratch_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _scratch_buffers.buffer = np.empty(max(size, 1 << 20), np.uint8)
    return buffer


class _RecycledBuffers:
    """Buffers for uncompressed records, each used again once no payload views it.

    An uncompressed payload lives until its batch is acknowledged, then its buffer is
    freed, and a new one faults its pages in afresh: the kernel's page faults and page
    clearing cost more than writing the records. A buffer taken here comes back when the
    last view of it dies (in whichever thread drops it) and is handed out again, up to
    ``idle_bytes`` of them held while unused; smaller buffers come from the allocator,
    which reuses those itself.
    """

    MIN_BYTES = 256 << 10

    def __init__(self, idle_bytes: int) -> None:
        self._idle_max = idle_bytes
        self._idle = 0
        self._free: dict[int, list[np.ndarray]] = {}  # by capacity
        self._lent: dict[int, tuple[weakref.ref, np.ndarray]] = {}  # by id of the weak reference
        self._lock = threading.Lock()

    @staticmethod
    def capacity(size: int) -> int:
        """``size`` rounded up to the next eighth of its power of two: few sizes, so that
        buffers match again, at most an eighth of each unused."""
        step = max(1, (1 << (size - 1).bit_length()) // 8)
        return -(-size // step) * step

    def take(self, size: int) -> np.ndarray:
        """A writable uint8 array of ``size`` bytes."""
        if size < self.MIN_BYTES:
            return np.empty(size, np.uint8)
        capacity = self.capacity(size)
        backing = None
        with self._lock:
            # Its own size, else the next larger one (rows of one size spread a partition's
            # share of a chunk over two neighbouring sizes).
            for fits in (capacity, self.capacity(capacity + 1)):
                free = self._free.get(fits)
                if free:
                    backing = free.pop()
                    self._idle -= fits
                    break
        if backing is None:
            backing = np.empty(capacity, np.uint8)
        lent = backing[:size]
        ref = weakref.ref(lent, self._returned)
        self._lent[id(ref)] = (ref, backing)
        return lent

    def _returned(self, ref: weakref.ref) -> None:
        _, backing = self._lent.pop(id(ref))
        with self._lock:
            if self._idle + len(backing) <= self._idle_max:
                self._free.setdefault(len(backing), []).append(backing)
                self._idle += len(backing)


# Unused buffers kept for reuse: half of buffer.memory's default. Measured with 1 MB
# batches over 6 partitions (bench/RESULTS.md): 9,000 page faults per million rows with
# none kept, about 1,000 with 8 MiB, a few hundred with 16 MiB.
_buffers = _RecycledBuffers(16 << 20)


def encode_groups(keys: pa.Array | None, values: pa.Array, timestamps: np.ndarray, headers: pa.Array | None,
                  groups: np.ndarray | None, group_count: int, *, batch_size: int, codec: int = 0,
                  level: int | None = None, continued: Continued | None = None) -> list[list[EncodedRecords]]:
    """Encode rows into record batches of at most ``batch_size`` bytes each (0: no limit),
    each row into the batches of its group (its partition): returns each group's batches.

    ``keys``/``values`` are binary-like arrays (nulls allowed), ``timestamps`` int64
    milliseconds, ``headers`` a list<struct<key, value>> array or None, ``groups`` each
    row's group, 0 up to ``group_count`` (None: all in group 0). Rows are read in input
    order, and each group's batches keep it: grouping rows per partition needs no copy of
    the columns. A group's uncompressed payloads are views of one buffer of its own, which
    lives as long as any of them (and is then reused: see :class:`_RecycledBuffers`).

    ``continued`` (uncompressed, and only where :func:`can_join`): per group the record
    count, records section bytes and first timestamp of a batch it already holds, and its
    claimed RecordBuffer (see :class:`Continued`), which the group's first rows continue while
    it stays within ``batch_size``: they are written past the end of that buffer, and their
    EncodedRecords say so (``first_offset``, the buffer as payload). Then a group's only
    new batch is written into a RecordBuffer of its own, which later rows may continue.
    """
    loops = kernels.compiled()
    values = as_binary(values)
    keys = as_binary(keys)
    out: list[list[EncodedRecords]] = [[] for _ in range(group_count)]
    if len(values) == 0:
        return out
    timestamps = _frozen(np.ascontiguousarray(timestamps, dtype=np.int64))
    group_ids = _NO_GROUPS if groups is None else _frozen(np.ascontiguousarray(groups, dtype=np.int64))
    if len(group_ids) and not (0 <= group_ids.min() and group_ids.max() < group_count):
        # the compiled loops do not check their indices
        raise ValueError(f"groups must lie in 0..{group_count - 1}, got {group_ids.min()}..{group_ids.max()}")
    columns = (_column(keys), _column(values), _header_column(headers), timestamps)
    limit = max(1, batch_size - RECORD_BATCH_OVERHEAD) if batch_size > 0 else 1 << 62
    extra: tuple = ()
    if continued is not None:
        if codec:
            raise ValueError("compressed batches cannot be continued")
        extra = (_frozen(np.ascontiguousarray(continued.held, dtype=np.int64).reshape(-1)),)
    opens, plan = np.zeros(len(values), np.bool_), np.empty((5 + len(extra), len(values)), np.int64)
    batches = loops.plan_batches(columns[0][2], columns[1][2], columns[2][2], timestamps, group_ids, group_count,
                                 limit, opens, plan, *extra)
    batch_group, counts, sizes, base_ts, max_ts = plan[:5, :batches]
    group_bytes = np.bincount(batch_group, weights=sizes, minlength=group_count).astype(np.int64).tolist()
    # Each group's records go straight into a buffer of its own, so that one partition's
    # unsent batches never keep another's bytes alive; compressed payloads are copies, so
    # their records are written into this thread's scratch buffer instead.
    if codec:
        scratch, offset, buffers = _scratch(sum(group_bytes)), 0, []
        for size in group_bytes:
            buffers.append(scratch[offset:offset + size] if size else None)
            offset += size
        written = loops.write_records(buffers, opens, group_ids, *columns)
    elif continued is None:
        buffers = [_buffers.take(size) if size else None for size in group_bytes]
        written = loops.write_records(buffers, opens, group_ids, *columns)
    else:
        # A continuation goes past the end of its batch's RecordBuffer (no copy when it is
        # joined), a group's one new batch into a RecordBuffer of its own (which the next
        # call's rows continue so), more than one into a buffer they share as views.
        own = plan[5, :batches] == 0
        room = np.zeros(group_count, np.int64)
        room[batch_group[~own]] = sizes[~own]  # a group's continuation: at most one
        own_bytes = np.bincount(batch_group[own], weights=sizes[own], minlength=group_count).astype(np.int64)
        own_batches = np.bincount(batch_group[own], minlength=group_count)
        record_buffer = loops.RecordBuffer
        buffers = [None if not size else record_buffer(batch_size, size) if n == 1 else _buffers.take(size)
                   for size, n in zip(own_bytes.tolist(), own_batches.tolist())]
        targets = list(continued.targets)  # write_records replaces one whose batch was taken meanwhile
        written = loops.write_records(buffers, opens, group_ids, *columns, *extra, targets, room, limit)
    if written != group_bytes:  # the loops check that no write overruns; this, that none falls short
        raise RuntimeError(f"the encoder wrote {written} bytes per partition where it planned {group_bytes}")
    if continued is not None:
        # Each group's batches as EncodedRecords, in C (no Python per partition): a
        # continuation past the end of the batch it continues (committed there when
        # queued), a RecordBuffer of its own committed, the others views of their buffer.
        loops.encoded_records(EncodedRecords, plan, batches, buffers, targets, out)
        return out
    # Each group's batches in the order they were opened, which is input order.
    starts = [0] * group_count
    for group, count, size, first_ts, largest in zip(batch_group.tolist(), counts.tolist(), sizes.tolist(),
                                                     base_ts.tolist(), max_ts.tolist()):
        start = starts[group]
        starts[group] = start + size
        section = buffers[group].data[start:start + size]
        payload = compress(codec, section, level) if codec else section
        out[group].append(EncodedRecords(payload, codec, count, first_ts, largest, size))
    return out


def encode_columns(keys: pa.Array | None, values: pa.Array, timestamps: np.ndarray, headers: pa.Array | None = None,
                   *, batch_size: int, codec: int = 0, level: int | None = None) -> list[EncodedRecords]:
    """:func:`encode_groups` for rows that all go to one partition."""
    return encode_groups(keys, values, timestamps, headers, None, 1, batch_size=batch_size, codec=codec,
                         level=level)[0]


def can_join() -> bool:
    """Whether batches' records sections can be joined here (RecordBuffer.append_section:
    the C extension's; numba's loops have none)."""
    return hasattr(getattr(kernels.compiled(), "RecordBuffer", None), "append_section")
