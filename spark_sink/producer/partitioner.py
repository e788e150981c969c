"""Where a record goes: Java's built-in partitioner.

An explicit partition wins; else ``toPositive(murmur2(key)) % partitions`` with Java's
murmur2 (per key, and compiled over a whole column), so keyed records land where Java
clients put them; else the sticky partition, which moves on when a batch fills.

The next sticky partition is chosen as Java's BuiltInPartitioner does (KIP-794): with
adaptive partitioning, at random weighted by how few batches wait in each partition's
queue (a partition whose broker falls behind has more waiting and is chosen less often),
leaving out partitions whose leader is unavailable (``partitioner.availability.timeout.ms``);
otherwise, or when every queue is the same, uniformly among the partitions with a leader.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
import pyarrow as pa
from murmurhash2 import murmurhash2 as _c_murmurhash2

from spark_sink.client.errors import InvalidPartitionError
from spark_sink.encoder import kernels
from spark_sink.encoder.columnar import as_binary, as_numpy, binary_offsets

SEED = 0x9747B28C
# ``murmur2_unsigned(data, SEED)``: the same bits as ``murmur2`` as an unsigned int, without
# a Python frame, for the per-record partitioner (which masks off the sign anyway).
murmur2_unsigned = _c_murmurhash2


def murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2``: the signed 32-bit hash of ``data``.

    Kafka's murmur2 is Austin Appleby's MurmurHash2 with seed 0x9747b28c; the C binding
    costs a fraction of a pure-Python loop on the per-record send() path.
    """
    h = _c_murmurhash2(data, SEED)
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Java's producer picks for a non-null ``key``."""
    return (murmur2_unsigned(key, SEED) & 0x7FFFFFFF) % num_partitions


# (queue sizes, their partition ids, the topic's partition count) for a topic, or None.
PartitionLoad = Callable[[str, int], tuple[list[int], list[int], int] | None]


def load_stats(queue_sizes: Sequence[int], partition_ids: Sequence[int], partition_count: int
               ) -> tuple[list[int], list[int]] | None:
    """Java's updatePartitionLoadStats: the cumulative frequency table of the available
    partitions (``partition_ids``, with the batches waiting in each), or None when the
    choice is uniform (fewer than two partitions in the topic, none available, or every
    partition available with the same queue). Each partition's weight is the largest
    queue plus one minus its own: with queues 0 3 1 the weights are 4 1 3, the table 4 5 8."""
    if not queue_sizes or partition_count < 2:
        return None
    top = max(queue_sizes) + 1
    if len(queue_sizes) == partition_count and min(queue_sizes) == top - 1:
        return None
    return list(itertools.accumulate(top - size for size in queue_sizes)), list(partition_ids)


def weighted_partition(table: Sequence[int], partition_ids: Sequence[int], draw: int) -> int:
    """The partition a non-negative random ``draw`` picks from a cumulative frequency
    table: the first entry greater than ``draw % total``."""
    return partition_ids[bisect.bisect_right(table, draw % table[-1])]


class StickyPartitions:
    """The sticky partition of each topic for records without a key.

    ``available(topic)`` lists the partitions that have a leader; ``load`` (adaptive
    partitioning, or None) gives each topic's queue sizes. Without a load-weighted choice,
    a new sticky partition is picked at random among the available ones, different from
    the current one when possible.
    """

    def __init__(self, available: Callable[[str], list[int]], load: PartitionLoad | None = None,
                 batch_size: int = 16384) -> None:
        self._available = available
        self._load = load
        self._batch_size = max(batch_size, 1)
        self._current: dict[str, int] = {}
        self._produced: dict[str, int] = {}  # bytes sent to the current sticky partition

    def current(self, topic: str, num_partitions: int) -> int:
        partition = self._current.get(topic)
        if partition is None or partition >= num_partitions:
            partition = self.next(topic, num_partitions)
        return partition

    def appended(self, topic: str, num_partitions: int, size: int, batch_ready: bool) -> None:
        """``size`` bytes went to the sticky partition: move on once batch.size bytes went
        there and its batch is ready, or twice that regardless (Java's stickyBatchSize
        rule). Counting bytes rather than reacting to every ready batch keeps a backlog
        from moving each record to a partition of its own."""
        produced = self._produced.get(topic, 0) + size
        if produced >= self._batch_size and batch_ready or produced >= 2 * self._batch_size:
            self.next(topic, num_partitions)
        else:
            self._produced[topic] = produced

    def next(self, topic: str, num_partitions: int) -> int:
        """Move ``topic`` on to another partition (when a batch filled) and return it."""
        stats = self._load(topic, num_partitions) if self._load is not None else None
        weighted = load_stats(*stats) if stats is not None else None
        if weighted is not None:
            partition = weighted_partition(*weighted, random.getrandbits(31))
        else:
            available = [p for p in self._available(topic) if p < num_partitions] or list(range(num_partitions))
            current = self._current.get(topic)
            choices = [p for p in available if p != current] or available
            partition = random.choice(choices)
        self._current[topic] = partition
        self._produced[topic] = 0
        return partition


def partition_for_hash(h: int | np.ndarray, num_partitions: int) -> int | np.ndarray:
    """Java's ``toPositive(murmur2(key)) % numPartitions``."""
    return (h & 0x7FFFFFFF) % num_partitions


_NO_NULLS = np.zeros(0, np.bool_)


def _binary(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``as_binary`` of an array that is there (it returns None for None alone)."""
    return cast(pa.Array, as_binary(arr))


def murmur2_array(keys: pa.Array | pa.ChunkedArray, seed: int = SEED) -> np.ndarray:
    """murmur2 of every value of a binary-like array (nulls hash as empty), as int32; the
    partitioner's with Kafka's seed."""
    keys = _binary(keys)
    if len(keys) == 0:
        return np.zeros(0, np.int32)
    offsets = binary_offsets(keys)
    data_buf = keys.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    nulls = as_numpy(keys.is_null()) if keys.null_count else _NO_NULLS
    for a in (data, offsets, nulls):
        a.flags.writeable = False  # one compiled build for any input (see columnar._frozen)
    hashes = np.empty(len(keys), np.uint32)
    kernels.compiled().murmur2_rows(data, offsets, nulls, seed, hashes)
    return hashes.view(np.int32)


# Java's built-in partitioner classes, by the name a Java job sets in partitioner.class,
# and what kprod does for each. DefaultPartitioner and UniformStickyPartitioner are gone
# from Kafka 4 but still set by older jobs; the built-in partitioner does what they did
# (UniformStickyPartitioner is Java's partitioner.ignore.keys=true).
BUILTIN = "builtin"
UNIFORM_STICKY = "uniform-sticky"
ROUND_ROBIN = "round-robin"
JAVA_PARTITIONERS: dict[str, str] = {
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner": BUILTIN,
    "org.apache.kafka.clients.producer.UniformStickyPartitioner": UNIFORM_STICKY,
    "org.apache.kafka.clients.producer.RoundRobinPartitioner": ROUND_ROBIN,
}

# A custom partitioner: ``partition(topic, key, value, num_partitions) -> int`` (key and
# value as the bytes sent, or None), Java's Partitioner.partition without the cluster.
CustomPartitioner = Callable[[str, "bytes | None", "bytes | None", int], int]


def import_partitioner(path: str) -> CustomPartitioner:
    """The callable named ``package.module:function`` or ``package.module.function``.

    Raises ImportError or AttributeError as importing does, TypeError if it is not callable."""
    import importlib

    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ImportError(f"{path!r} names no module")
    target: object = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{path!r} is a {type(target).__name__}, not a callable")
    return target


class RowPartitioner:
    """``partitioner.class`` other than the built-in one: picks the partition of every
    record without an explicit one, keyed or not.

    ``round-robin`` is Java's RoundRobinPartitioner: a counter per topic, each record to
    the next partition among those with a leader (all partitions when none has one);
    anything else is a custom callable (see :data:`CustomPartitioner`)."""

    def __init__(self, spec: str | CustomPartitioner, available: Callable[[str], list[int]]) -> None:
        self._available = available
        self._counters: dict[str, int] = {}
        self._custom = None if spec == ROUND_ROBIN else spec if callable(spec) else import_partitioner(spec)
        self.name = spec if isinstance(spec, str) else getattr(spec, "__qualname__", repr(spec))

    def _round_robin(self, topic: str, count: int, n: int) -> np.ndarray:
        start = self._counters.get(topic, 0)
        self._counters[topic] = (start + n) & 0x7FFFFFFF  # Java's counter is an int, made positive
        available = [p for p in self._available(topic) if p < count]
        steps = np.arange(start, start + n, dtype=np.int64)
        if available:
            return np.asarray(available, np.int64)[steps % len(available)]
        return steps % count

    def partition(self, topic: str, key: bytes | None, value: bytes | None, count: int) -> int:
        """The partition of one record (``send()``)."""
        if self._custom is None:
            return int(self._round_robin(topic, count, 1)[0])
        return self._checked(topic, self._custom(topic, key, value, count), count)

    def partition_rows(self, topic: str, count: int, keys: pa.Array | None, values: pa.Array,
                       rows: np.ndarray) -> np.ndarray:
        """The partitions of the rows ``rows`` of a ``send_arrow`` call, in order."""
        if self._custom is None:
            return self._round_robin(topic, count, len(rows))
        # A Python call per row: a custom partitioner is Python code, as Java's is a class.
        key_list = keys.take(pa.array(rows)).to_pylist() if keys is not None else [None] * len(rows)
        value_list = _binary(values).take(pa.array(rows)).to_pylist()
        return np.fromiter((self._checked(topic, self._custom(topic, k, v, count), count)
                            for k, v in zip(key_list, value_list)), np.int64, len(rows))

    def _checked(self, topic: str, partition: object, count: int) -> int:
        if isinstance(partition, bool) or not isinstance(partition, (int, np.integer)) or not 0 <= partition < count:
            raise InvalidPartitionError(f"partitioner.class {self.name} returned {partition!r} for topic {topic!r}, "
                                        f"which has {count} partitions (0..{count - 1})")
        return int(partition)
