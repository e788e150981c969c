"""Arrow input for ``send_arrow``: check the columns, pick partitions for whole columns,
and encode rows lazily, chunk by chunk, into each partition's record batches.

Columns (the Spark Kafka sink's, plus ``timestamp``): value (required), key, topic,
partition, headers, timestamp.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa

from spark_sink.client.errors import ColumnError, InvalidPartitionError, RecordTooLargeError
from spark_sink.encoder.columnar import (
    HEADER_TYPE,
    Continued,
    EncodedRecords,
    as_arrow_indices,
    as_binary,
    as_numpy,
    encode_groups,
    record_size_bounds,
    value_lengths,
)
from spark_sink.producer.partitioner import RowPartitioner, murmur2_array, partition_for_hash
from spark_sink.producer.row_errors import RowRefusals, screen_topics
from spark_sink.protocol.compression import compressed_bound, largest_input
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD, record_parts

# The columns send_arrow takes, and the Arrow types of each.
ACCEPTED_TYPES = {
    "value": "binary or string (large and view variants too)",
    "key": "binary or string (large and view variants too)",
    "topic": "string",
    "partition": "int32 or int64",
    "headers": "list<struct<key: string, value: binary>>",
    "timestamp": "timestamp (any unit) or int64 epoch milliseconds",
}

# Rows encoded at a time: bounds the memory of encoded-but-not-yet-buffered bytes.
CHUNK_BYTES = 8 * 1024 * 1024


def _is_binary_like(t: pa.DataType) -> bool:
    return (pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t)
            or pa.types.is_large_string(t) or pa.types.is_binary_view(t) or pa.types.is_string_view(t))


def _is_string_like(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _headers_ok(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_struct(t.value_type):
        return False
    fields = {f.name: f.type for f in t.value_type}
    return set(fields) == {"key", "value"} and _is_string_like(fields["key"]) and _is_binary_like(fields["value"])


_CHECKS: dict[str, Callable[[pa.DataType], bool]] = {
    "value": _is_binary_like,
    "key": _is_binary_like,
    "topic": _is_string_like,
    "partition": lambda t: pa.types.is_int32(t) or pa.types.is_int64(t),
    "headers": _headers_ok,
    "timestamp": lambda t: pa.types.is_timestamp(t) or pa.types.is_int64(t),
}


def check_arrow_column(name: str, data_type: pa.DataType) -> None:
    """Raise ColumnError if ``send_arrow`` does not take a column ``name`` of ``data_type``,
    naming the column and what it accepts."""
    check = _CHECKS.get(name)
    if check is None:
        raise ColumnError(
            f"column {name!r} is not accepted; columns are {', '.join(ACCEPTED_TYPES)}. "
            "Pack other columns into the value, e.g. to_json(struct(...)) AS value")
    if not check(data_type):
        raise ColumnError(f"column {name!r} has type {data_type}; expected {ACCEPTED_TYPES[name]}")


def check_arrow_schema(schema: pa.Schema, default_topic: str | None) -> None:
    """Raise ColumnError naming the first column that is unknown, repeated, mistyped or
    missing from ``send_arrow`` input of ``schema``."""
    seen: set[str] = set()
    for field in schema:
        if field.name in seen:
            raise ColumnError(f"column {field.name!r} appears more than once; keep one")
        seen.add(field.name)
        check_arrow_column(field.name, field.type)
    if "value" not in seen:
        raise ColumnError(f"column 'value' is required ({ACCEPTED_TYPES['value']})")
    if "topic" not in seen and not default_topic:
        raise ColumnError("no topic: give a 'topic' column (string) or a default topic")


@dataclass(frozen=True)
class SendLimits:
    """The producer settings that bound what one ``send_arrow`` call makes."""

    batch_size: int
    max_request_size: int
    buffer_memory: int
    codec: int

    def largest_record(self) -> tuple[int, str, int]:
        """The most bytes a row's record may take (batch header not counted), the setting
        that says so and its value. As Java's producer does, a record is checked by its
        size before compression against max.request.size; against buffer.memory, which
        holds the compressed batch, by the most it could compress into."""
        by_request = self.max_request_size - RECORD_BATCH_OVERHEAD
        by_memory = largest_input(self.codec, self.buffer_memory - RECORD_BATCH_OVERHEAD)
        if by_memory < by_request:
            return by_memory, "buffer.memory", self.buffer_memory
        return by_request, "max.request.size", self.max_request_size

    def batch_bytes(self) -> int:
        """batch.size, or less where a batch that full could compress into more than
        max.request.size or buffer.memory: a batch of several records never does."""
        fits = min(self.max_request_size, self.buffer_memory) - RECORD_BATCH_OVERHEAD
        return min(self.batch_size, RECORD_BATCH_OVERHEAD + largest_input(self.codec, fits))


@dataclass(frozen=True)
class TopicRows:
    """The rows of one call bound for one topic, in input order, and each row's partition
    (``partitions``: an array, or one int for every row)."""

    topic: str
    keys: pa.Array | None
    values: pa.Array
    timestamps: np.ndarray
    headers: pa.Array | None
    partitions: np.ndarray | int
    partition_count: int
    message_limit: int | None = None  # the topic's max.message.bytes, where known: caps its batches

    def __len__(self) -> int:
        return len(self.values)

    def encode(self, batch_size: int, codec: int, level: int | None = None, chunk_bytes: int = CHUNK_BYTES,
               continued: Callable[[Sequence[int]], Continued | None] | None = None
               ) -> Iterator[list[tuple[int, list[EncodedRecords]]]]:
        """The rows of about ``chunk_bytes`` of input at a time, in input order, as record
        batches per partition: ``[(partition, its batches), ...]`` for each partition among
        them. A partition spanning two chunks comes in two pieces, in order. ``continued``
        (partitions): the batches queued for them that a chunk's rows may continue, asked
        just before each chunk is encoded (see RecordAccumulator.continued), where a
        partition's share of a chunk is under half a batch: joining larger shares would copy
        every row to save few batches."""
        n = len(self.values)
        bounds = [0]
        data_bytes = _data_bytes(self.values) + (0 if self.keys is None else _data_bytes(self.keys))
        shares = 1 if isinstance(self.partitions, int) else self.partition_count
        if 2 * min(data_bytes, chunk_bytes) >= batch_size * shares:
            continued = None
        if data_bytes > chunk_bytes:
            sizes = value_lengths(self.values)
            if self.keys is not None:
                sizes += value_lengths(self.keys)
            chunk = np.cumsum(sizes) // chunk_bytes
            bounds += (np.flatnonzero(np.diff(chunk)) + 1).tolist()
        bounds.append(n)
        for lo, hi in itertools.pairwise(bounds):
            def cut(a: pa.Array | None, lo: int = lo, hi: int = hi) -> pa.Array | None:
                return None if a is None else a.slice(lo, hi - lo)

            partitions = self.partitions
            members: Sequence[int]
            if isinstance(partitions, int):
                rows, group_count, members = None, 1, [partitions]
            else:
                rows, group_count, members = partitions[lo:hi], self.partition_count, range(self.partition_count)
            groups = encode_groups(
                cut(self.keys), cut(self.values), self.timestamps[lo:hi], cut(self.headers), rows, group_count,
                batch_size=batch_size, codec=codec, level=level,
                continued=None if continued is None else continued(members))
            if isinstance(partitions, int):
                yield [(partitions, groups[0])]
            else:
                yield [(partition, batches) for partition, batches in enumerate(groups) if batches]


def _data_bytes(arr: pa.Array) -> int:
    """Bytes of the values of a binary-like array (its buffers' total for view types)."""
    if pa.types.is_binary(arr.type) or pa.types.is_string(arr.type):
        offsets = np.frombuffer(arr.buffers()[1], np.int32)
        return int(offsets[arr.offset + len(arr)] - offsets[arr.offset])
    return arr.nbytes


def _column(data: pa.RecordBatch | pa.Table, name: str) -> pa.Array | None:
    if name not in data.schema.names:
        return None
    col = data.column(name)
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def _timestamps(col: pa.Array | None, n: int, now_ms: int) -> np.ndarray:
    if col is None:
        return np.full(n, now_ms, dtype=np.int64)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ms", tz=col.type.tz), safe=False).cast(pa.int64())
    return as_numpy(col, fill=now_ms).astype(np.int64, copy=False)


def _check_input(data: pa.RecordBatch | pa.Table, default_topic: str | None) -> None:
    if not isinstance(data, (pa.RecordBatch, pa.Table)):
        raise ColumnError(f"send_arrow takes a pyarrow RecordBatch or Table, got {type(data).__name__}")
    check_arrow_schema(data.schema, default_topic)


def _topic_codes(topic_col: pa.Array, default_topic: str | None) -> tuple[np.ndarray, list[str]]:
    """Each row's index into the topic names of a ``topic`` column: a null is the default
    topic, or -1 without one."""
    encoded = topic_col.cast(pa.string()).dictionary_encode()
    codes, names = as_numpy(encoded.indices, fill=-1), encoded.dictionary.to_pylist()
    if encoded.indices.null_count and default_topic:
        if default_topic not in names:
            names.append(default_topic)
        codes[codes < 0] = names.index(default_topic)
    return codes, names


def _alone_batch_sizes(keys: pa.Array | None, values: pa.Array, headers: pa.Array | None,
                       rows: np.ndarray) -> np.ndarray:
    """The exact bytes of a record batch holding ``rows``' record alone, uncompressed (one
    Python record each: only for the few rows whose bound is over a topic's limit)."""
    out = np.empty(len(rows), np.int64)
    for j, i in enumerate(rows.tolist()):
        entries = [] if headers is None else headers[i].as_py() or []
        _, size = record_parts(0, 0, None if keys is None else keys[i].as_py(), values[i].as_py(),
                               [(h["key"], h["value"]) for h in entries])
        out[j] = RECORD_BATCH_OVERHEAD + size
    return out


def _over_topic_limit(keys: pa.Array | None, values: pa.Array, headers: pa.Array | None, bounds: np.ndarray,
                      limit: int, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Of ``rows`` (all: None), those whose record alone makes a batch larger than
    ``limit`` (a topic's max.message.bytes, which the broker checks the batch against,
    compressed: compression is assumed not to help), and those batches' sizes.
    ``bounds``: each row's record size bound (``record_size_bounds``); only rows over
    the limit by their bound are sized exactly."""
    over = bounds > limit - RECORD_BATCH_OVERHEAD
    maybe = np.flatnonzero(over) if rows is None else rows[over[rows]]
    if not len(maybe):
        return maybe, maybe
    sizes = _alone_batch_sizes(keys, values, headers, maybe)
    return maybe[sizes > limit], sizes[sizes > limit]


def screen_arrow_rows(data: pa.RecordBatch | pa.Table, default_topic: str | None, refusals: RowRefusals, *,
                      partition_count: Callable[[str], int], limits: SendLimits,
                      message_limit: Callable[[str], int | None] = lambda topic: None,
                      ) -> tuple[pa.RecordBatch | pa.Table, tuple[np.ndarray, list[str]] | None, np.ndarray | None]:
    """``data`` without the rows that carry an error of their own (see ``row_errors``),
    each refused through ``refusals``: a record too large (for a request, the buffer, or
    alone in a batch for its topic's ``message_limit``), a null topic with no default,
    a topic missing, invalid or not the principal's to describe, a partition its topic
    does not have; and
    the rows' topics (see ``_topic_codes``) if a column names them and each row's record
    size bound (``record_size_bounds``), for ``plan_arrow_send``. What is left passes its
    row checks (sizes need not be checked again); a table's columns come back in one
    chunk each."""
    _check_input(data, default_topic)
    n = data.num_rows
    if n == 0:
        return data, None, None
    if isinstance(data, pa.Table):
        # A table of many batches (a Spark task's joined ones): each column joined once
        # here, which plan_arrow_send then reads as it is, instead of joined twice.
        data = data.combine_chunks()
    keys = as_binary(_column(data, "key"))
    headers = _column(data, "headers")
    if headers is not None and headers.type != HEADER_TYPE:
        headers = headers.cast(HEADER_TYPE)
    largest, setting, value = limits.largest_record()
    values = as_binary(_column(data, "value"))
    bounds = record_size_bounds(keys, values, headers)
    # Where no row is bad (the common case) the screen makes no per-row index array:
    # rows are looked for only once a whole-column test says some exist.
    biggest = int(bounds.max())
    if biggest > largest:
        refusals.refuse(np.flatnonzero(bounds > largest), RecordTooLargeError(
            f"the row's record is larger than {setting} ({value}) allows"))
    topic_col = _column(data, "topic")
    codes: np.ndarray | None = None  # each row's index into names; None: every row is names[0]'s
    if topic_col is None:
        names = [cast(str, default_topic)]
    else:
        codes, names = _topic_codes(topic_col, default_topic)
        if topic_col.null_count and not default_topic:
            refusals.refuse(np.flatnonzero(codes < 0), ColumnError(
                "column 'topic' is null and no default topic is set"))
    counts = screen_topics(refusals, codes, names, partition_count)
    for i, topic in enumerate(names):
        limit = message_limit(topic) if topic in counts else None
        if limit is not None and biggest > limit - RECORD_BATCH_OVERHEAD:
            candidates = ~refusals.mask if codes is None else (codes == i) & ~refusals.mask
            over, _ = _over_topic_limit(keys, values, headers, bounds, limit, np.flatnonzero(candidates))
            if len(over):
                refusals.refuse(over, RecordTooLargeError(
                    f"the row's record alone makes a record batch larger than topic {topic!r}'s max.message.bytes "
                    f"({limit}) allows"), topic)
    explicit = _column(data, "partition")
    if explicit is not None:
        given = as_numpy(explicit.cast(pa.int64()), fill=-1)
        malformed = (given < -1) | ((given == -1) & ~as_numpy(explicit.is_null()))
        for i, topic in enumerate(names):
            if topic in counts:
                count = counts[topic]
                bad = malformed | (given >= count)
                if codes is not None:
                    bad &= codes == i
                if bad.any():
                    refusals.refuse(np.flatnonzero(bad), InvalidPartitionError(
                        f"column 'partition' names a partition topic {topic!r} does not have: it has {count} "
                        f"partitions (0..{count - 1})"), topic)
    topics = None if codes is None else (codes, names)
    if not refusals.refused:
        return data, topics, bounds
    keep = np.flatnonzero(~refusals.mask)
    return data.take(as_arrow_indices(keep)), None if codes is None else (codes[keep], names), bounds[keep]


def plan_arrow_send(data: pa.RecordBatch | pa.Table, default_topic: str | None, *,
                    partition_count: Callable[[str], int], sticky_partition: Callable[[str, int], int],
                    ignore_keys: bool, limits: SendLimits, now_ms: int,
                    partitioner: RowPartitioner | None = None, bounds: np.ndarray | None = None,
                    topics: tuple[np.ndarray, list[str]] | None = None,
                    message_limit: Callable[[str], int | None] = lambda topic: None) -> list[TopicRows]:
    """Check all of ``data`` (columns, each row's record size against the request, the
    buffer and its topic's ``message_limit``; explicit partitions), split its rows per
    topic and pick each row's partition (input order kept). ``topics`` and ``bounds``:
    the rows' topics and record size bounds as ``screen_arrow_rows`` found them; with
    ``bounds`` the sizes it checked are not checked again."""
    _check_input(data, default_topic)
    n = data.num_rows
    if n == 0:
        return []
    values = as_binary(_column(data, "value"))
    keys = as_binary(_column(data, "key"))
    if keys is not None and keys.null_count == n:
        keys = None
    headers = _column(data, "headers")
    if headers is not None:
        headers = headers.cast(HEADER_TYPE) if headers.type != HEADER_TYPE else headers
        if headers.null_count == n:
            headers = None
    # The screen's bounds are held until the plan is made, as the plan's own would be:
    # freed before it, the plan's arrays faulted fresh pages in (glibc had handed the
    # freed ones back), +50% page faults per call (bench/RESULTS.md, issue 53).
    screened = bounds is not None
    if bounds is None:
        bounds = _check_record_sizes(keys, values, headers, limits)
    timestamps = _timestamps(_column(data, "timestamp"), n, now_ms)
    explicit = _column(data, "partition")
    batch_size = limits.batch_bytes()

    topic_col = _column(data, "topic")
    if topic_col is None:
        # check_arrow_schema refused a write with neither a topic column nor a default.
        groups: list[tuple[str, np.ndarray | None]] = [(cast(str, default_topic), None)]
    else:
        if topics is None:
            codes, names = _topic_codes(topic_col, default_topic)
            if topic_col.null_count and not default_topic:
                row = int(np.flatnonzero(codes < 0)[0])
                raise ColumnError(f"column 'topic' is null at row {row} and no default topic is set")
        else:
            codes, names = topics
        found = ((t, np.flatnonzero(codes == i)) for i, t in enumerate(names))
        groups = [(t, rows) for t, rows in found if len(rows)]
        if len(groups) == 1:
            groups = [(groups[0][0], None)]

    out: list[TopicRows] = []
    for topic, rows in groups:
        def take(a: pa.Array | None, rows: np.ndarray | None = rows) -> pa.Array | None:
            return a if rows is None or a is None else a.take(as_arrow_indices(rows))

        t_values, t_keys, t_headers = take(values), take(keys), take(headers)
        t_ts = timestamps if rows is None else timestamps[rows]
        count = partition_count(topic)
        parts = _partitions(topic, count, take(explicit), t_keys, t_values, ignore_keys=ignore_keys,
                            batch_size=batch_size, sticky=sticky_partition, partitioner=partitioner)
        limit = message_limit(topic)
        if not screened and limit is not None:
            _check_topic_limit(topic, limit, parts, rows, keys, values, headers, bounds)
        one = int(parts[0]) if (parts == parts[0]).all() else None
        out.append(TopicRows(topic, t_keys, t_values, t_ts, t_headers, parts if one is None else one, count, limit))
    return out


def _check_topic_limit(topic: str, limit: int, parts: np.ndarray, rows: np.ndarray | None, keys: pa.Array | None,
                       values: pa.Array, headers: pa.Array | None, bounds: np.ndarray) -> None:
    """Raise RecordTooLargeError naming the first of ``rows`` (all: None) whose record
    alone makes a batch larger than ``topic``'s max.message.bytes (``limit``), its
    partition (``parts``: each of ``rows``') and the batch's size."""
    over, sizes = _over_topic_limit(keys, values, headers, bounds, limit, rows)
    if len(over):
        row = int(over[0])
        partition = int(parts[row if rows is None else int(np.searchsorted(rows, row))])
        raise RecordTooLargeError(
            f"row {row} makes a record batch of {int(sizes[0])} bytes for {topic}-{partition} holding it alone, "
            f"larger than the topic's max.message.bytes ({limit}; the broker's message.max.bytes where the topic "
            "has no override); no row of this send_arrow call was sent")


def _check_record_sizes(keys: pa.Array | None, values: pa.Array, headers: pa.Array | None,
                        limits: SendLimits) -> np.ndarray:
    """Raise RecordTooLargeError naming the first row whose record may not fit a request
    (or the buffer), before any row is queued; else each row's record size bound."""
    largest, setting, value = limits.largest_record()
    sizes = record_size_bounds(keys, values, headers)
    too_large = sizes > largest
    if too_large.any():
        row = int(np.argmax(too_large))
        size = int(sizes[row])
        made = size if setting == "max.request.size" else compressed_bound(limits.codec, size)
        raise RecordTooLargeError(
            f"row {row} makes a record of up to {made + RECORD_BATCH_OVERHEAD} bytes in its batch, larger than "
            f"{setting} ({value}); no row of this send_arrow call was sent")
    return sizes


def _partitions(topic: str, count: int, explicit: pa.Array | None, keys: pa.Array | None, values: pa.Array, *,
                ignore_keys: bool, batch_size: int, sticky: Callable[[str, int], int],
                partitioner: RowPartitioner | None = None) -> np.ndarray:
    """Partition of every row: explicit, else partitioner.class's choice if one is set,
    else murmur2 of the key, else sticky runs."""
    hashed = keys if keys is not None and not ignore_keys and partitioner is None else None
    if hashed is not None and explicit is None and not hashed.null_count:  # the common case: every row by its key
        return np.asarray(partition_for_hash(murmur2_array(hashed).astype(np.int64), count))
    n = len(values)
    parts = np.full(n, -1, dtype=np.int64)
    if explicit is not None:
        given = as_numpy(explicit.cast(pa.int64()), fill=-1)
        bad = (given < -1) | (given >= count) | ((given == -1) & ~as_numpy(explicit.is_null()))
        if bad.any():
            p = int(given[np.flatnonzero(bad)[0]])
            raise InvalidPartitionError(
                f"column 'partition' has {p} for topic {topic!r}, which has {count} partitions (0..{count - 1})")
        parts[:] = given
    if partitioner is not None:
        todo = np.flatnonzero(parts < 0)
        if len(todo):
            parts[todo] = partitioner.partition_rows(topic, count, keys, values, todo)
        return parts
    if hashed is not None:
        keyed = (parts < 0) & ~as_numpy(hashed.is_null())
        if keyed.any():
            parts[keyed] = partition_for_hash(murmur2_array(hashed).astype(np.int64)[keyed], count)
    todo = np.flatnonzero(parts < 0)
    if len(todo):
        # Sticky for keyless rows, as the Java partitioner does: a run of about one
        # batch to one partition, then the next run to another.
        sizes = value_lengths(values)[todo] + 16
        run = np.cumsum(sizes) // max(batch_size, 1)
        run_ids, first = np.unique(run, return_index=True)
        chosen = np.array([sticky(topic, count) for _ in run_ids], dtype=np.int64)
        parts[todo] = chosen[np.searchsorted(run_ids, run)]
    return parts
