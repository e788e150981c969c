"""RecordAccumulator: one deque of batches per partition between send() and the Sender.

send() appends to the last batch of its partition; the Sender asks which leaders have a
batch ready (full, lingered long enough, or flushing) and drains at most one batch per
partition per request, up to max.request.size per broker.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.errors import ProducerClosedError, RecordTooLargeError
from spark_sink.encoder.columnar import Continued, EncodedRecords, can_join
from spark_sink.producer.arrow_input import SendLimits
from spark_sink.producer.batch import (
    FutureRecordMetadata,
    Joiner,
    PlainAppender,
    ProducerBatch,
    PyRecordBuffer,
    RecordBuffer,
    SegmentListener,
    SendCallback,
    SharedReservation,
    TopicPartition,
    new_future,
)
from spark_sink.producer.buffer_pool import BufferPool
from spark_sink.producer.config import ProducerConfig
from spark_sink.protocol.records import MAX_RECORD_OVERHEAD, RECORD_BATCH_OVERHEAD, record_parts


def retry_backoff_ms(config: ProducerConfig, attempts: int) -> float:
    """Exponential backoff from retry.backoff.ms to retry.backoff.max.ms."""
    return min(config.retry_backoff_max_ms, config.retry_backoff_ms * (2 ** max(0, attempts - 1)))


# The input a partition of a many-partition topic should have per chunk of send_arrow's
# encoding: each chunk ends every partition's record batch, and at 512 partitions 4 MiB
# chunks made batches of ~70 records, which cost a broker (and the Sender) more per record
# than the Java producer's 16 KiB batches (bench/RESULTS.md, issue 55).
PARTITION_CHUNK_SHARE = 64 << 10
# Partitions queued under one taking of the lock (append_encoded): joining a call's records
# to the batches queued before moves them, which the Sender's drain would otherwise wait for.
RUN_PARTITIONS = 64


def chunk_bytes_for(partition_count: int, chunk_bytes: int, buffer_memory: int) -> int:
    """Input bytes to encode at a time for a topic of ``partition_count`` partitions:
    ``chunk_bytes``, or up to half of buffer.memory where that leaves each partition less
    than PARTITION_CHUNK_SHARE (append_encoded reserves a large chunk in runs of partitions)."""
    return max(chunk_bytes, min(partition_count * PARTITION_CHUNK_SHARE, buffer_memory // 2))


class RecordAccumulator:
    """Batches waiting to be sent, per partition, in send order."""

    def __init__(self, config: ProducerConfig, pool: BufferPool, compiled: bool = True, *,
                 clock: Clock = now_ms) -> None:
        """``compiled``: send()'s records go through the compiled RecordBuffer and
        append_plain where kprod's extension is built (False: Python's, as without it).
        ``clock``: what a new batch's creation time (its linger and delivery timeout) is
        read from."""
        self._config = config
        self._clock = clock
        self._pool = pool
        self._lock = threading.Lock()
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        # The same deques by topic, then partition: send()'s lookup without a tuple key.
        self._by_topic: dict[str, dict[int, deque[ProducerBatch]]] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._order = itertools.count()
        self._flushes = 0
        self._drain_starts: dict[int, int] = {}  # per node, where in its partitions the next drain starts
        # The deques by leader (see _groups), and the Metadata's leaders they were made from.
        self._leader_groups: dict[int | None, list[tuple[TopicPartition, deque[ProducerBatch]]]] = {}
        self._groups_of: Mapping[str, Sequence[int]] | None = None
        self._next_expiry_ms = float("-inf")  # before it, no queued batch has expired (see expire)
        self.closed = False
        self._stopped: Exception | None = None  # why the Sender stopped, once it has
        self.on_ready: Callable[[], None] = lambda: None  # append_plain filled a batch
        self._drained_ms: dict[int, float] = {}  # when each node last took a batch (adaptive partitioning)
        self._record_buffer: type = RecordBuffer if compiled else PyRecordBuffer
        # send_arrow's batches join the one queued last for their partition (see
        # ProducerBatch.join) where the encoder can join them: the C extension, unless
        # compression.
        self._join = config.compression_codec == 0 and compiled and Joiner is not None and can_join()
        # The most a joined batch holds: what send_arrow's encoder plans a batch by
        # (batch.size, within max.request.size and buffer.memory), each topic's
        # max.message.bytes too (see _enqueue).
        self._join_bytes = SendLimits(config.batch_size, config.max_request_size, config.buffer_memory,
                                      config.compression_codec).batch_bytes()
        # topic -> its max.message.bytes where known (the metadata's): no joined batch is larger
        self.message_limits: Mapping[str, int | None] = {}
        # continued's claims and _enqueue's common cases, compiled (None: in Python)
        self._joiner = Joiner(ProducerBatch, EncodedRecords) if compiled and Joiner is not None else None
        # append_plain below, in C: the same steps without a Python frame per record (and
        # the producer's PlainSender appends through it)
        self.compiled_appender = (PlainAppender(self, self._by_topic, self._lock, FutureRecordMetadata, ProducerBatch)
                                  if compiled and PlainAppender is not None else None)
        if self.compiled_appender is not None:
            self.append_plain = self.compiled_appender.append  # type: ignore[method-assign]

    # -- appending (user threads) ---------------------------------------------

    def append(self, topic: str, partition: int, timestamp: int, key: bytes | None, value: bytes | None, *,
               headers: list | None, callback: SendCallback | None, key_size: int, value_size: int,
               headers_size: int, max_block_ms: float, full: bool = False
               ) -> tuple[FutureRecordMetadata, bool, bool]:
        """Append one record; returns (future, a batch is ready to send, a new batch was made).
        ``full``: the caller found no room for it in the partition's open batch just now
        (append_plain did), so it goes straight to a new one."""
        tp = (topic, partition)
        if not full:
            # acquire/release rather than ``with``: half the cost on the per-record path.
            self._lock.acquire()
            try:
                if self._stopped is not None:
                    self._raise_stopped()
                dq = self._batches.get(tp)
                if dq:
                    last = dq[-1]
                    future = last.try_append(timestamp, key, value, headers, callback, key_size, value_size)
                    if future is not None:
                        return future, last.estimated_size >= last.batch_size or len(dq) > 1, False
            finally:
                self._lock.release()
        # A new batch needs memory, which may block: never wait while holding the lock.
        size = max(self._config.batch_size,
                   key_size + value_size + headers_size + MAX_RECORD_OVERHEAD + RECORD_BATCH_OVERHEAD)
        self._pool.allocate(size, max_block_ms)
        with self._lock:
            if self._stopped is not None:
                self._pool.deallocate(size)
                self._raise_stopped()
            dq = self._deque(tp)
            if dq:
                future = dq[-1].try_append(timestamp, key, value, headers, callback, key_size, value_size)
                if future is not None:  # another thread made room meanwhile
                    self._pool.deallocate(size)
                    return future, len(dq) > 1 or dq[-1].is_full, False
            batch = ProducerBatch(topic, partition, self._clock(), next(self._order), size, self._config.batch_size,
                                  records=self._record_buffer(self._config.batch_size))
            future = batch.try_append(timestamp, key, value, headers, callback, key_size, value_size)
            if future is None:  # sized for the record above: cannot happen
                raise RecordTooLargeError(f"a record of {size} bytes does not fit a batch made for it")
            dq.append(batch)
            self._incomplete.add(batch)
            return future, len(dq) > 1 or batch.is_full, True

    def append_plain(self, topic: str, partition: int, timestamp: int, key: bytes, value: bytes,
                     callback: SendCallback | None, key_size: int, value_size: int) -> FutureRecordMetadata | None:
        """append() for a header-less record that fits the open batch of its partition:
        returns its future (having called ``on_ready`` if the record filled its batch), or
        None when it needs append() (no open batch with room for it, or the producer has
        stopped).

        send()'s common case, once per record: no memory to reserve, no tuple to return,
        and ProducerBatch.try_append's bookkeeping done here rather than called. This is
        the Python version, for PyRecordBuffer; with kprod's extension built, __init__ puts
        the compiled one (_kernels.c's PlainAppender.append) in its place.
        """
        lock = self._lock
        lock.acquire()  # acquire/release rather than ``with``: half the cost
        try:
            try:
                dq = self._by_topic[topic][partition]
            except KeyError:  # the partition's first record
                return None
            if not dq or self._stopped is not None:
                return None
            last = dq[-1]
            records = last.records
            if records is None or last.closed:  # sealed (records None) or closed
                return None
            index = records.record_count
            parts, size = record_parts(index, timestamp - records.base_timestamp, key, value)
            size += records.estimated_size
            if size > records.batch_size:
                return None
            records.record_count = index + 1
            records.estimated_size = size
            records.parts.extend(parts)
            if timestamp > records.max_timestamp:
                records.max_timestamp = timestamp
            if callback is not None:
                last.callbacks += (callback, index, timestamp, key_size, value_size)
            future = new_future(FutureRecordMetadata, (last, index, timestamp, key_size, value_size))
            if size < records.batch_size:
                # Only a batch this record filled is news: one with batches after it was
                # announced when the next was made (the Sender's round for a new batch).
                return future
        finally:
            lock.release()
        self.on_ready()
        return future

    def append_encoded(self, topic: str, groups: list[tuple[int, list[EncodedRecords]]], now: float,
                       max_block_ms: float, listener: SegmentListener,
                       queued: Callable[[int, int, int], None], wakeup: Callable[[], None],
                       abandon: Callable[[], BaseException | None] | None = None) -> None:
        """Append already-encoded batches, ``(partition, batches)`` per partition, each
        after whatever its partition holds: a partition's lone batch joins the records of
        the send_arrow batch queued last for it where they fit (see ProducerBatch.join).

        ``queued(records, bytes, parts)`` hears of batches once they are queued (from
        then on they complete, whatever happens), ``listener`` of each one's records when
        their batch completes, and ``wakeup`` tells the sender there is something to send.
        Raises BufferExhaustedError or ProducerClosedError with part of ``groups`` queued, as
        ``queued`` heard, or what ``abandon()`` returns while waiting for memory.
        """
        most = self._pool.total // 4
        joiner = self._joiner
        sizes = (joiner.sizes(groups) if joiner is not None
                 else [sum(e.size_in_bytes for e in encoded) for _, encoded in groups])
        start, n = 0, len(groups)
        while start < n:
            # A run of partitions reserved at once, at most a quarter of buffer.memory: a
            # producer running ahead of the brokers waits (and wakes) once per run instead
            # of once per batch; at most RUN_PARTITIONS, as the run is queued under the lock
            # the Sender drains by.
            end, total = start, 0
            while end < n and end - start < RUN_PARTITIONS and total + sizes[end] <= most:
                total += sizes[end]
                end += 1
            if end == start:  # one partition's batches larger than that: one by one
                partition, encoded = groups[start]
                self._append_one_by_one(topic, partition, encoded, now, max_block_ms, listener, queued, wakeup,
                                        abandon)
                start += 1
                continue
            self._pool.allocate(total, max_block_ms, abandon)
            self._enqueue(topic, groups, start, end, sizes, total, now, listener, queued)
            wakeup()
            start = end

    def _append_one_by_one(self, topic: str, partition: int, encoded: list[EncodedRecords], now: float,
                           max_block_ms: float, listener: SegmentListener,
                           queued: Callable[[int, int, int], None], wakeup: Callable[[], None],
                           abandon: Callable[[], BaseException | None] | None) -> None:
        """A partition's batches too large to reserve at once: batch by batch, each sendable
        before the next waits."""
        for records in encoded:
            if isinstance(records.payload, memoryview):
                # Its own copy, so that its memory is really free when the batch completes.
                records = dataclasses.replace(records, payload=bytes(records.payload))
            size = records.size_in_bytes
            self._pool.allocate(size, max_block_ms, abandon)
            self._enqueue(topic, [(partition, [records])], 0, 1, [size], size, now, listener, queued, join=False)
            wakeup()

    def _enqueue(self, topic: str, groups: list[tuple[int, list[EncodedRecords]]], start: int, end: int,
                 sizes: list[int], reserved: int, now: float, listener: SegmentListener,
                 queued: Callable[[int, int, int], None], join: bool = True) -> None:
        """Queue encoded batches, ``groups[start:end]`` ((partition, its batches) each,
        ``sizes`` the bytes reserved for them), under one taking of the lock, in order, and
        tell ``queued`` what was: all of them, or the partitions before whatever raised
        (the producer has stopped, a fault). The ``reserved`` bytes (the run's) go with the
        batches they were queued in, the rest back to the pool, so each byte is freed once.
        A partition's first batch joins its last queued one where it can (see
        ProducerBatch.join); several batches share one buffer, so their reservation is
        freed with the last of them (SharedReservation). Records written as the
        continuation of a batch (encode_groups' continued: past the end of its
        RecordBuffer) that is no longer queued, or not to be joined here, are moved into a
        batch of their own. The compiled Joiner does the common cases (a partition's one
        batch, joined or new) and leaves the others here, at the partition it stops at."""
        batch_size = self._config.batch_size
        join = join and self._join
        limit = min(self._join_bytes, self.message_limits.get(topic) or self._join_bytes)
        joiner = self._joiner
        tally = np.zeros(4, np.int64)  # the Joiner's: records, their bytes, parts, bytes reserved
        records = uncompressed = parts = 0
        try:
            with self._lock:
                if self._stopped is not None:
                    self._raise_stopped()
                self._created(now)  # the run's creation time, for expire()
                order, incomplete, queues = self._order, self._incomplete, self._by_topic.get(topic, {})
                k = start
                while k < end:
                    if joiner is not None and queues:
                        k = joiner.enqueue(queues, groups, k, end, sizes, join, limit, listener, topic, now, order,
                                           batch_size, incomplete, tally)
                        if k == end:
                            break
                    partition, encoded = groups[k]
                    size = sizes[k]
                    k += 1
                    dq = queues.get(partition)
                    if dq is None:  # the partition's first batch
                        dq = self._deque((topic, partition))
                        queues = self._by_topic[topic]
                    elif dq:
                        first = encoded[0]
                        last = None
                        if join and first.first_offset:
                            last = dq[-1]
                            if last.records is not first.payload:  # another call queued batches after it
                                last = _holding(dq, first.payload)
                        if last is not None and last.join(first, limit, listener):
                            joined = size if len(encoded) == 1 else first.size_in_bytes
                            assert isinstance(last.memory, int)  # as Joiner.claim found it when claimed
                            last.memory += joined  # its reservation goes with its records
                            reserved -= joined
                            records += first.record_count
                            uncompressed += first.uncompressed_size
                            parts += 1
                            if len(encoded) == 1:
                                continue
                            encoded, size = encoded[1:], size - joined
                        dq[-1].closed = True  # later send() records must not overtake these batches
                    memory: int | SharedReservation = size if len(encoded) == 1 else SharedReservation(size, len(encoded))
                    # Every batch made before any is queued: a fault leaves none holding the reservation.
                    batches = []
                    for e in encoded:
                        payload: Any = e.payload
                        if e.first_offset:  # it continued a batch taken since: moved into a RecordBuffer of its own
                            own = RecordBuffer(batch_size)
                            own.append_section(payload.pending(e.uncompressed_size), e.record_count, e.base_timestamp,
                                               e.max_timestamp, limit, e.first_offset)
                            payload = own
                        buffer = type(payload) is RecordBuffer
                        batch = ProducerBatch(topic, partition, now, next(order), memory, batch_size,
                                              None if buffer else e, records=payload if buffer else None,
                                              segments=[listener, e.record_count])
                        batch.closed = True  # send_arrow's: no send() record joins it
                        batches.append(batch)
                    dq.extend(batches)
                    incomplete.update(batches)
                    reserved -= size
                    for e in encoded:
                        records += e.record_count
                        uncompressed += e.uncompressed_size
                    parts += len(encoded)
        finally:
            records, uncompressed, parts = (records + int(tally[0]), uncompressed + int(tally[1]),
                                            parts + int(tally[2]))
            reserved -= int(tally[3])
            if reserved:  # the partitions not queued: their reservation back
                self._pool.deallocate(reserved)
            if parts:
                queued(records, uncompressed, parts)

    def continued(self, topic: str, partitions: Sequence[int]) -> Continued | None:
        """What send_arrow's next records for ``partitions`` of ``topic`` may continue: per
        partition the record count, records section bytes and first timestamp of the
        send_arrow batch queued last for it, if it can still take records (a count of 0 if
        not; int64, 3 x partitions), and its RecordBuffer, claimed for those records (None if
        none can); None if batches are not joined here. The encoder writes them as that
        batch's next ones past the end of its buffer, and joining them there is no copy (see
        ProducerBatch.join); if the batch is taken meanwhile (sent, expired), they are moved
        into a batch of their own instead. Where none can, the encoder still writes each
        partition's one new batch into a RecordBuffer, which the next call's rows continue."""
        joiner = self._joiner
        if not self._join or joiner is None:  # joins need the Joiner: never without it
            return None
        n = len(partitions)
        continued = Continued(np.zeros((3, n), np.int64), [None] * n)
        queues = self._by_topic.get(topic)
        if not queues:
            return continued
        with self._lock:  # the Joiner's claims (one writer at a time: a claimed buffer is skipped)
            continued.targets = joiner.claim(queues, partitions, continued, continued.held)
        return continued

    def release(self, continued: Continued) -> None:
        """End the claims ``continued`` still holds, none of whose records were queued: the
        send_arrow call that made them raised. A claim its records were committed or moved
        by has ended already, and another call may hold the buffer since: untouched."""
        with self._lock:
            for records in continued.targets:
                if records is not None:
                    records.release(continued)

    # -- sender side ----------------------------------------------------------

    def _groups(self, leaders: Mapping[str, Sequence[int]]) -> dict[int | None, list[tuple[TopicPartition, deque]]]:
        """The partitions' deques by leader (None: unknown), in the order they were made.
        Made again only when a partition is new or the metadata's leaders changed (the
        Metadata replaces its ``leaders`` whole), not every round: with hundreds of
        partitions a leader lookup per partition was most of ready()'s time, as Java keeps
        the partitions of each node for its drain. Only with the lock held."""
        if self._groups_of is leaders:
            return self._leader_groups
        groups: dict[int | None, list[tuple[TopicPartition, deque]]] = {}
        for tp, dq in self._batches.items():
            nodes = leaders.get(tp[0])
            node = nodes[tp[1]] if nodes is not None and tp[1] < len(nodes) else -1
            groups.setdefault(node if node >= 0 else None, []).append((tp, dq))
        self._leader_groups, self._groups_of = groups, leaders
        return groups

    def ready(self, leaders: Mapping[str, Sequence[int]], now: float, can_send: Callable[[TopicPartition], bool], *,
              refused: set[TopicPartition] | None = None) -> tuple[set[int], float, set[str]]:
        """(leaders with a sendable batch, ms until the next batch may become ready,
        topics whose leader is unknown), from ``leaders`` (topic -> each partition's
        leader, -1 for none: the Metadata's). ``refused`` gets partitions holding batches
        that ``can_send`` refused, up to the first sendable one of their leader.

        A leader's partitions are looked at until one has a batch to send (Java's ready()
        skips the rest of a ready leader's partitions too): with many partitions a round
        no longer goes through all of them while batches keep coming."""
        ready: set[int] = set()
        unknown: set[str] = set()
        next_ms = float("inf")
        linger = self._config.linger_ms
        urgent = self._flushes > 0 or self.closed or self._pool.exhausted
        with self._lock:
            for leader, members in self._groups(leaders).items():
                if leader is None:
                    unknown.update(tp[0] for tp, dq in members if dq)
                    continue
                for tp, dq in members:
                    if not dq:
                        continue
                    if not can_send(tp):
                        if refused is not None:
                            refused.add(tp)
                        continue
                    batch = dq[0]
                    if batch.attempts:
                        wait_ms = retry_backoff_ms(self._config, batch.attempts)
                        waited = now - batch.last_attempt_ms
                        if waited < wait_ms:
                            next_ms = min(next_ms, wait_ms - waited)
                            continue
                        ready.add(leader)
                        break
                    waited = now - batch.created_ms
                    if urgent or len(dq) > 1 or batch.is_full or waited >= linger:
                        ready.add(leader)
                        break
                    next_ms = min(next_ms, linger - waited)
        return ready, next_ms, unknown

    def drain(self, leaders: Mapping[str, Sequence[int]], nodes: set[int], max_request_size: int, now: float,
              can_send: Callable[[TopicPartition], bool], codec: int, level: int | None,
              prepare: Callable[[ProducerBatch], None]) -> dict[int, list[ProducerBatch]]:
        """Take at most one batch per partition for each node, up to max.request.size."""
        drained: dict[int, list[ProducerBatch]] = {}
        with self._lock:
            groups = self._groups(leaders)
            for node in nodes:
                members = groups.get(node)
                if not members:
                    continue
                taken: list[ProducerBatch] = []
                size = 0
                # Each drain of a node starts where its last one first ran out of room
                # (Java's per-node drainIndex), else one further, so that partitions late
                # in the order are not always left for later.
                start = self._drain_starts.get(node, 0) % len(members)
                self._drain_starts[node] = start + 1
                for i in range(len(members)):
                    tp, dq = members[(start + i) % len(members)]
                    if not dq or not can_send(tp):
                        continue
                    batch = dq[0]
                    if batch.attempts and now - batch.last_attempt_ms < retry_backoff_ms(self._config, batch.attempts):
                        continue
                    wire_size = batch.wire_size  # an open batch's estimate bounds it from above
                    if size + wire_size > max_request_size and taken:
                        self._drain_starts[node] = start + i
                        break
                    dq.popleft()
                    batch.closed = True  # its records are final: prepare() numbers them
                    prepare(batch)
                    size += wire_size
                    taken.append(batch)
                if taken:
                    drained[node] = taken
        # Encoding happens outside the lock: send() keeps appending to the next batches
        # meanwhile instead of waiting for (and handing the GIL back and forth with) it.
        for batches in drained.values():
            for batch in batches:
                batch.seal(codec, level)
        return drained

    def reenqueue(self, batch: ProducerBatch, now: float, backoff: bool = True) -> None:
        """Put a batch back for a retry, ahead of later batches of its partition (to be
        sent at once, without ``backoff``: a piece of a batch split as too large)."""
        batch.attempts += 1  # never joined by another call's records either
        batch.last_attempt_ms = now if backoff else -math.inf
        with self._lock:
            self._created(batch.created_ms)
            dq = self._deque(batch.tp)
            i = 0
            while i < len(dq) and dq[i].order < batch.order:
                i += 1
            dq.insert(i, batch)

    def expire(self, now: float, delivery_timeout_ms: float) -> list[ProducerBatch]:
        """Remove queued batches older than delivery.timeout.ms; the caller fails them.

        Every partition is looked at only once the oldest batch queued at the last look
        (or queued since with an earlier creation time) may have expired: the Sender asks
        every round, and with hundreds of partitions the look cost more than the rest of
        its round."""
        if now < self._next_expiry_ms:
            return []
        expired = []
        with self._lock:
            earliest = now  # appended from here on: created no earlier, or they say so
            for dq in self._batches.values():
                while dq and now - dq[0].created_ms >= delivery_timeout_ms:
                    expired.append(dq.popleft())
                if dq and dq[0].created_ms < earliest:
                    earliest = dq[0].created_ms
            self._next_expiry_ms = earliest + delivery_timeout_ms
        return expired

    def _created(self, created_ms: float) -> None:
        """A batch created at ``created_ms``, perhaps before the last look for expired ones,
        is queued. Only with the lock held."""
        expiry = created_ms + self._config.delivery_timeout_ms
        if expiry < self._next_expiry_ms:
            self._next_expiry_ms = expiry

    def completed(self, batches: Iterable[ProducerBatch]) -> None:
        """Batches finished (either way): release their memory, once each."""
        freed = 0
        with self._lock:
            incomplete = self._incomplete
            for batch in batches:
                if batch in incomplete:
                    incomplete.remove(batch)
                    memory = batch.memory
                    freed += memory if isinstance(memory, int) else memory.release_one()
        if freed:
            self._pool.deallocate(freed)

    def _deque(self, tp: TopicPartition) -> deque[ProducerBatch]:
        """The partition's deque, made on first use. Only with the lock held."""
        dq = self._batches.get(tp)
        if dq is None:
            dq = self._batches[tp] = deque()
            self._groups_of = None  # a partition to place by its leader
            self._by_topic.setdefault(tp[0], {})[tp[1]] = dq
        return dq

    def stop(self, reason: Exception) -> None:
        """The Sender has stopped: appends fail from now on, naming ``reason``."""
        with self._lock:
            self._stopped = reason
            if self.compiled_appender is not None:
                self.compiled_appender.stop()  # its own flag: no attribute read per record

    def _raise_stopped(self) -> None:
        raise ProducerClosedError(f"the producer has stopped sending: {self._stopped}")

    def abort_undrained(self) -> list[ProducerBatch]:
        """Remove every queued batch (for a forced close); the caller fails them."""
        with self._lock:
            batches = [b for dq in self._batches.values() for b in dq]
            for dq in self._batches.values():
                dq.clear()
        return batches

    def has_undrained(self) -> bool:
        with self._lock:
            return any(self._batches.values())

    def incomplete(self) -> list[ProducerBatch]:
        with self._lock:
            return list(self._incomplete)

    def begin_flush(self) -> None:
        with self._lock:
            self._flushes += 1

    def end_flush(self) -> None:
        with self._lock:
            self._flushes -= 1

    # -- adaptive partitioning (KIP-794) -------------------------------------------

    def note_drained(self, nodes: Iterable[int], now: float) -> None:
        """The Sender drained batches for ``nodes``: they are taking records."""
        for node in nodes:
            self._drained_ms[node] = now

    def partition_load(self, topic: str, leaders: Sequence[int], now: float) -> tuple[list[int], list[int], int]:
        """(batches waiting per available partition, those partitions, the partition count)
        of ``topic``, as Java's RecordAccumulator gathers them for its BuiltInPartitioner.

        Available: the partition has a leader and, with partitioner.availability.timeout.ms,
        the leader is not overdue. Java calls a node overdue when it had batches ready but
        could not take them for that long; kprod's ready() leaves out partitions at their
        in-flight limit, so a node is overdue when a batch has been due for it (lingered)
        for longer than the timeout and the node took no batch in that time."""
        timeout = self._config.partitioner_availability_timeout_ms
        queues = self._by_topic.get(topic, {})
        sizes: list[int] = []
        ids: list[int] = []
        overdue: set[int] = set()
        with self._lock:
            if timeout:
                due_since: dict[int, float] = {}
                for partition, dq in queues.items():
                    if dq and partition < len(leaders) and leaders[partition] >= 0:
                        node = leaders[partition]
                        due_since[node] = min(due_since.get(node, now), dq[0].created_ms + self._config.linger_ms)
                overdue = {node for node, since in due_since.items()
                           if now - max(since, self._drained_ms.get(node, since)) > timeout}
            for partition, node in enumerate(leaders):
                if node >= 0 and node not in overdue:
                    waiting = queues.get(partition)
                    sizes.append(len(waiting) if waiting else 0)
                    ids.append(partition)
        return sizes, ids, len(leaders)


def _holding(dq: deque[ProducerBatch], records: object) -> ProducerBatch | None:
    """The batch of ``dq`` whose records buffer ``records`` is (the last, unless another
    call queued batches after it), None if it is not queued any more."""
    for batch in reversed(dq):
        if batch.records is records:
            return batch
    return None
