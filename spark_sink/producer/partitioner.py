"""Where a record goes: Java's built-in partitioner.

An explicit partition wins; else ``toPositive(murmur2(key)) % partitions`` with Java's
murmur2 (scalar and vectorised), so keyed records land where Java clients put them; else
the sticky partition, which moves on when a batch fills.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import pyarrow as pa
from murmurhash2 import murmurhash2 as _c_murmurhash2

SEED = 0x9747B28C
# ``murmur2_unsigned(data, SEED)``: the same bits as ``murmur2`` as an unsigned int, without
# a Python frame, for the per-record partitioner (which masks off the sign anyway).
murmur2_unsigned = _c_murmurhash2
_M = 0x5BD1E995


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


class StickyPartitions:
    """The sticky partition of each topic for records without a key.

    ``available(topic)`` lists the partitions that have a leader; a new sticky partition
    is picked at random among them, different from the current one when possible.
    """

    def __init__(self, available: Callable[[str], list[int]]) -> None:
        self._available = available
        self._current: dict[str, int] = {}

    def current(self, topic: str, num_partitions: int) -> int:
        partition = self._current.get(topic)
        if partition is None or partition >= num_partitions:
            partition = self.next(topic, num_partitions)
        return partition

    def next(self, topic: str, num_partitions: int) -> int:
        """Move ``topic`` on to another partition (when a batch filled) and return it."""
        available = [p for p in self._available(topic) if p < num_partitions] or list(range(num_partitions))
        current = self._current.get(topic)
        choices = [p for p in available if p != current] or available
        partition = random.choice(choices)
        self._current[topic] = partition
        return partition


def partition_for_hash(h: int | np.ndarray, num_partitions: int) -> int | np.ndarray:
    """Java's ``toPositive(murmur2(key)) % numPartitions``."""
    return (h & 0x7FFFFFFF) % num_partitions


def _mix_blocks(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    """One murmur2 body step for a 4-byte little-endian block ``k`` of every hashed key."""
    m = np.uint32(_M)
    k = k * m
    k ^= k >> np.uint32(24)
    k *= m
    return (h * m) ^ k


def murmur2_array(keys: pa.Array) -> np.ndarray:
    """murmur2 of every value of a binary-like array (nulls hash as empty), as int32.

    Vectorised across keys: one numpy pass per 4-byte block of the longest key. Keys of
    one length (the usual case) are a plain matrix view of Arrow's data buffer; keys of
    mixed lengths read each block with one gather of 4 bytes.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if keys.type != pa.binary():
        keys = keys.cast(pa.binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int32)
    offsets = np.frombuffer(keys.buffers()[1], np.int32)[keys.offset : keys.offset + n + 1].astype(np.int64)
    data_buf = keys.buffers()[2]
    raw = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    if keys.null_count:
        lengths = np.where(np.asarray(keys.is_null()), 0, lengths)
    m = np.uint32(_M)
    with np.errstate(over="ignore"):
        lo, hi = int(lengths.min()), int(lengths.max())
        if lo == hi and offsets[-1] - offsets[0] == n * lo:
            # Every key has the same length: an n x length matrix, whole columns per step.
            matrix = raw[offsets[0] : offsets[0] + n * lo].reshape(n, lo)
            h = np.full(n, np.uint32(SEED) ^ np.uint32(lo & 0xFFFFFFFF), dtype=np.uint32)
            nblocks = lo >> 2
            if nblocks:
                blocks = np.ascontiguousarray(matrix[:, : 4 * nblocks]).view("<u4")
                for j in range(nblocks):
                    h = _mix_blocks(h, blocks[:, j])
            tail = matrix[:, 4 * nblocks :].astype(np.uint32)
            rest = lo & 3
            if rest:
                for r in range(rest - 1, 0, -1):  # bytes 3 and 2 of the tail, then byte 1
                    h ^= tail[:, r] << np.uint32(8 * r)
                h ^= tail[:, 0]
                h *= m
        else:
            # Pad so a 4-byte read at any key position stays in bounds, and read blocks
            # as rows of a 1-byte-stride window view.
            data = np.concatenate([raw, np.zeros(4, np.uint8)])
            windows = np.lib.stride_tricks.as_strided(data, shape=(max(len(data) - 3, 0), 4), strides=(1, 1))
            h = np.uint32(SEED) ^ lengths.astype(np.uint32)
            blocks = lengths >> 2
            for j in range(hi >> 2):
                active = np.flatnonzero(blocks > j) if j >= (lo >> 2) else None
                pos = (starts if active is None else starts[active]) + 4 * j
                k = np.ascontiguousarray(windows[pos]).view("<u4").ravel()
                if active is None:
                    h = _mix_blocks(h, k)
                else:
                    h[active] = _mix_blocks(h[active], k)
            rest = lengths & 3
            tail = starts + (blocks << 2)
            for r, shift in ((3, 16), (2, 8)):
                sel = rest >= r
                h[sel] ^= data[tail[sel] + (r - 1)].astype(np.uint32) << np.uint32(shift)
            sel = rest >= 1
            h[sel] ^= data[tail[sel]].astype(np.uint32)
            h[sel] *= m
        h ^= h >> np.uint32(13)
        h *= m
        h ^= h >> np.uint32(15)
    return h.view(np.int32)
