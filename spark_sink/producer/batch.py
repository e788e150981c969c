"""ProducerBatch: records for one partition that travel and are acknowledged together.

A batch is either *open* (the per-record path writes each record into the batch's
RecordBuffer as it is appended; sealing at drain time takes the records section from it)
or *sealed* (bytes already encoded, e.g. by the columnar path). Its header, which carries
the producer id, epoch and base sequence, is written only when the batch is sent.

RecordBuffer is compiled (spark_sink/encoder/_kernels.c, with the wheel and the editable
install) where it can be, and then send()'s common record is appended by compiled code
alone (RecordAccumulator.append_plain); PyRecordBuffer is the same in Python, for kprod
running from its source files (a --py-files zip).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from spark_sink.client.errors import IllegalStateError, KafkaTimeoutError
from spark_sink.encoder.columnar import EncodedRecords
from spark_sink.producer.producer_record import RecordMetadata
from spark_sink.protocol.compression import compress
from spark_sink.protocol.records import (
    MAX_HEADER_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    record_batch_header,
    record_parts,
    split_records,
)

log = logging.getLogger(__name__)


class PyRecordBuffer:
    """The records section of an open batch, in Python: the pieces whose join is its bytes
    (key and value referenced, not copied), joined once by ``take``. The compiled
    RecordBuffer has the same interface and writes the bytes as records come."""

    __slots__ = ("parts", "record_count", "base_timestamp", "max_timestamp", "estimated_size", "batch_size")

    def __init__(self, batch_size: int) -> None:
        self.parts: list[bytes] = []
        self.record_count = 0
        self.base_timestamp = self.max_timestamp = -1  # set by the first record
        self.estimated_size = RECORD_BATCH_OVERHEAD  # the batch's: its header and the records so far
        self.batch_size = batch_size

    def append(self, timestamp: int, key: bytes | None, value: bytes | None,
               headers: list[tuple[str, bytes | None]] | None) -> int:
        """Add one record: the bytes it took, or 0 if it would take the batch past
        batch.size (the first record always fits)."""
        index = self.record_count
        if not index:
            self.base_timestamp = self.max_timestamp = timestamp
        parts, size = record_parts(index, timestamp - self.base_timestamp, key, value, headers or ())
        if index and self.estimated_size + size > self.batch_size:
            return 0
        self.parts += parts
        if timestamp > self.max_timestamp:
            self.max_timestamp = timestamp
        self.record_count = index + 1
        self.estimated_size += size
        return size

    def append_section(self, payload: bytes | memoryview, count: int, base_timestamp: int, max_timestamp: int,
                       limit: int, first_offset: int = 0) -> int:
        """Another batch's records section joined to this one's: only the compiled
        RecordBuffer's (batches are joined only where kprod's extension is built)."""
        raise TypeError("records sections are joined by kprod's extension (RecordBuffer.append_section)")

    def take(self) -> bytes:
        """The records section; the pieces are dropped."""
        section = b"".join(self.parts)
        self.parts = []
        return section


try:
    from spark_sink.encoder._kernels import FutureRecordMetadata as _CompiledFuture
    from spark_sink.encoder._kernels import Joiner, PlainAppender, PlainSender, RecordBuffer, run_callbacks
except ImportError:  # running from source files: Python's
    Joiner = PlainAppender = PlainSender = run_callbacks = _CompiledFuture = None
    RecordBuffer = PyRecordBuffer


def _callback_raised(exc: Exception) -> None:
    log.error("send callback raised", exc_info=exc)

# Guards the lazy creation of a batch's wait event and its release: rarely taken (only
# when someone waits on a batch record by record), so one lock serves every batch.
_EVENT_LOCK = threading.Lock()

TopicPartition = tuple[str, int]
SendCallback = Callable[[RecordMetadata | None, Exception | None], None]
# A send_arrow call's listener of its records in a batch: (the batch, the first record's
# offset or -1, how many, their place in the partition's send order), once it completes.
SegmentListener = Callable[["ProducerBatch", int, int, float], None]


class FutureRecordMetadata(tuple):
    """The result of one ``send()``: ``result(timeout)`` returns RecordMetadata or raises.

    A sequence (batch, index in it, timestamp, key size, value size) underneath: send()
    makes one per record. With kprod's extension built, this name is the extension's
    FutureRecordMetadata type (which keeps freed ones for the next records) with these
    methods; without it, a tuple subclass (``tuple.__new__`` costs half of a slotted
    ``__init__``).
    """

    __slots__ = ()

    def done(self) -> bool:
        return self[0].completed

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the acknowledgement; raises the send's error, or KafkaTimeoutError."""
        batch = self[0]
        if not batch.wait(timeout):
            raise KafkaTimeoutError(f"no acknowledgement within {timeout} s for a record to {batch.topic}-{batch.partition}")
        if batch.error is not None:
            raise batch.error
        return self.metadata()

    def exception(self, timeout: float | None = None) -> Exception | None:
        self[0].wait(timeout)
        return self[0].error

    def metadata(self) -> RecordMetadata:
        batch, index, timestamp, key_size, value_size = self
        offset = batch.base_offset + index if batch.base_offset >= 0 else -1
        if batch.log_append_time >= 0:
            timestamp = batch.log_append_time
        return _new_metadata(RecordMetadata, (batch.topic, batch.partition, offset, timestamp, key_size, value_size))

    def __repr__(self) -> str:
        return f"FutureRecordMetadata({self[0].topic}-{self[0].partition}, index={self[1]}, done={self.done()})"


_new_metadata = tuple.__new__  # a tuple subclass made without __init__


def _tuple_future(cls: type, fields: tuple) -> FutureRecordMetadata:
    return tuple.__new__(cls, fields)


def _compiled_future(cls: type, fields: tuple) -> FutureRecordMetadata:
    return cls(*fields)


new_future = _tuple_future
if _CompiledFuture is not None:
    for _name in ("done", "result", "exception", "metadata", "__repr__"):
        setattr(_CompiledFuture, _name, FutureRecordMetadata.__dict__[_name])
    _CompiledFuture.__doc__ = FutureRecordMetadata.__doc__
    FutureRecordMetadata = _CompiledFuture  # type: ignore[misc]
    new_future = _compiled_future


class SharedReservation:
    """buffer.memory reserved once for batches whose payloads are views of one encoded
    buffer: the buffer lives until the last of them completes, and so does the reservation."""

    __slots__ = ("size", "holders")

    def __init__(self, size: int, holders: int) -> None:
        self.size = size
        self.holders = holders

    def release_one(self) -> int:
        """Bytes to give back to the pool now that one holder is done."""
        self.holders -= 1
        return 0 if self.holders else self.size


class ProducerBatch:
    """Records for one topic-partition, sent in one record batch."""

    __slots__ = (
        "topic", "partition", "tp", "created_ms", "order", "order_span", "memory", "batch_size", "records", "callbacks",
        "encoded", "closed", "listener", "segments",
        "attempts", "last_attempt_ms", "producer_id", "producer_epoch", "base_sequence",
        "base_offset", "log_append_time", "error", "completed", "_completing", "_event",
    )

    def __init__(self, topic: str, partition: int, created_ms: float, order: float, memory: int | SharedReservation,
                 batch_size: int, encoded: EncodedRecords | None = None,
                 listener: Callable[[ProducerBatch], None] | None = None,
                 records: RecordBuffer | PyRecordBuffer | None = None, segments: list[Any] | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.tp: TopicPartition = (topic, partition)
        self.created_ms = created_ms
        self.order = order  # creation order within the partition: retries go back in this order
        # The orders up to order + order_span are this batch's: the pieces it may be split
        # into take orders between, so that they go back in the order of their records.
        self.order_span = 1.0
        self.memory = memory  # bytes reserved in the BufferPool for this batch alone, or a share
        self.batch_size = batch_size
        # The records so far, encoded, while the batch is open; None once it is sealed.
        self.records = None if encoded is not None else records if records is not None else RecordBuffer(batch_size)
        # Flat: callback, index, timestamp, key size, value size, then the next record's.
        # A tuple (or future) per record kept until the batch completes would be one more
        # object for the cyclic GC to walk on every collection while the batch is in flight.
        self.callbacks: list[Any] = []
        self.encoded = encoded
        self.closed = encoded is not None  # no more appends
        self.listener = listener
        # send_arrow's calls whose records this batch holds, in order, flat: a
        # SegmentListener, its record count, then the next call's (see join).
        self.segments = segments
        self.attempts = 0
        self.last_attempt_ms = 0.0
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        self.base_offset = -1
        self.log_append_time = -1
        self.error: Exception | None = None
        self.completed = False  # outcome known, callbacks run: waiters return
        self._completing = 0  # the thread running the callbacks, while it does
        self._event: threading.Event | None = None

    def join(self, e: EncodedRecords, limit: int, listener: SegmentListener) -> bool:
        """Another send_arrow call's records for this partition after this batch's own, as
        one batch of at most ``limit`` bytes (batch.size, the topic's max.message.bytes):
        ``e``, written as its next records past the end of its RecordBuffer, which
        RecordAccumulator.continued claimed for them (encode_groups' continued), become part
        of it there, without a copy. False (nothing changed) if they were written elsewhere
        or do not fit. As Java's producer appends to the open batch of a partition: with
        many partitions each call holds a small part of every partition's records, and a
        batch per part would cost the brokers and the Sender about as much as a full one.
        Only for a queued batch of send_arrow's never sent, with the accumulator's lock held."""
        segments = self.segments
        if segments is None:
            raise IllegalStateError(f"{self!r} is not send_arrow's: no call's records can join it")
        records = self.records
        target: Any = e.payload  # the RecordBuffer the encoder wrote them past the end of
        if records is None or records.estimated_size + e.uncompressed_size > limit or target is not records:
            return False
        records.commit(e.uncompressed_size, e.record_count, e.base_timestamp, e.max_timestamp)
        segments += (listener, e.record_count)
        return True

    def split(self, codec_level: int | None, done: Callable[[ProducerBatch], None]) -> list[ProducerBatch]:
        """Smaller batches with this batch's records, in order, for a broker refused it as
        too large (Java's ProducerBatch.split): its records cut in two halves, each taking
        the send() callbacks of its records. This batch then
        completes once both halves have (``done(self)`` after), at the first half's offset
        if the second's follows it, else at -1 (another producer wrote in between)."""
        e = self._sealed()
        at = e.record_count // 2
        join = _SplitJoin(self, done)
        span = self.order_span / 2
        for k, (piece, first) in enumerate(zip(split_records(e.payload, e.record_count, e.codec, at, codec_level),
                                               (0, at))):
            half = ProducerBatch(self.topic, self.partition, self.created_ms, self.order + k * span, 0,
                                 self.batch_size, listener=join,
                                 encoded=EncodedRecords(piece.payload, e.codec, piece.record_count, e.base_timestamp,
                                                        e.base_timestamp + piece.max_timestamp_delta,
                                                        piece.uncompressed_size))
            half.order_span = span
            half.attempts, half.last_attempt_ms = self.attempts, self.last_attempt_ms
            entries = iter(self.callbacks)
            for callback, index, timestamp, key_size, value_size in zip(entries, entries, entries, entries, entries):
                if first <= index < first + piece.record_count:
                    half.callbacks += (callback, index - first, timestamp, key_size, value_size)
            join.halves.append(half)
        self.callbacks = []  # the halves run them
        return list(join.halves)

    @property
    def record_count(self) -> int:
        records = self.records  # read once: the Sender may seal the batch meanwhile
        return records.record_count if records is not None else self._sealed().record_count

    @property
    def estimated_size(self) -> int:
        """Bytes of the batch: exact once sealed, an upper bound of the compressed size before."""
        records = self.records
        return records.estimated_size if records is not None else self._sealed().size_in_bytes

    def _sealed(self) -> EncodedRecords:
        """The encoded records of a batch whose records buffer is gone (set before it is)."""
        encoded = self.encoded
        if encoded is None:
            raise IllegalStateError(f"batch of {self.topic}-{self.partition} has neither records nor encoded records")
        return encoded

    @property
    def is_full(self) -> bool:
        return self.closed or self.estimated_size >= self.batch_size

    def try_append(self, timestamp: int, key: bytes | None, value: bytes | None,
                   headers: list[tuple[str, bytes | None]] | None, callback: SendCallback | None,
                   key_size: int, value_size: int) -> FutureRecordMetadata | None:
        """Encode and add a record, or return None if it would overflow batch.size (or the
        batch is closed). RecordAccumulator.append_plain does the same for send()'s common
        record."""
        records = self.records
        if self.closed or records is None:
            return None
        index = records.record_count
        if not records.append(timestamp, key, value, headers or None):
            return None
        future = new_future(FutureRecordMetadata, (self, index, timestamp, key_size, value_size))
        if callback is not None:
            self.callbacks += (callback, index, timestamp, key_size, value_size)
        return future

    def seal(self, codec: int, level: int | None = None) -> EncodedRecords:
        """Take (and compress) the records section, once."""
        if self.encoded is None:
            records = self.records
            if records is None:
                return self._sealed()  # neither records nor encoded records: raises
            section = records.take()  # compiled: a view of the buffer's bytes, not a copy
            payload = compress(codec, section, level) if codec else section
            self.encoded = EncodedRecords(payload, codec, records.record_count, records.base_timestamp,
                                          records.max_timestamp, len(section))
            self.records = None  # after encoded: record_count and estimated_size read one or the other
        self.closed = True
        return self._sealed()

    def to_wire(self, transactional: bool = False) -> tuple[bytes, bytes | memoryview]:
        """The record batch as sent, as (header, payload): the header carries this attempt's
        producer id, epoch and sequence (and whether it belongs to a transaction); the
        payload is written as it is, never copied."""
        e = self._sealed()
        header = record_batch_header(
            e.payload, record_count=e.record_count, last_offset_delta=e.last_offset_delta,
            base_timestamp=e.base_timestamp, max_timestamp=e.max_timestamp, codec=e.codec,
            producer_id=self.producer_id, producer_epoch=self.producer_epoch, base_sequence=self.base_sequence,
            transactional=transactional)
        return header, e.payload

    @property
    def wire_size(self) -> int:
        return self.encoded.size_in_bytes if self.encoded is not None else self.estimated_size

    def complete(self, base_offset: int, log_append_time: int, error: Exception | None) -> None:
        """Record the outcome once, then, as Java does, run the records' callbacks in send
        order and the listener, and only then release the waiters: whoever returns from
        ``result()`` or ``flush()`` sees every callback of these records done."""
        if self.completed or self._completing:
            return
        self._completing = threading.get_ident()
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        try:
            if self.callbacks:
                self._run_callbacks(error)
            if self.segments is not None:
                self._complete_segments(base_offset)
        finally:  # an interrupted callback must not leave the listener or the waiters hanging
            try:
                if self.listener is not None:
                    self.listener(self)
            finally:
                self._release_waiters()

    def _release_waiters(self) -> None:
        """Completed: whoever waits in ``result()`` or ``flush()`` returns (the event, if one
        was made, is read under the lock that making it takes)."""
        with _EVENT_LOCK:
            self.completed = True
            event = self._event
        if event is not None:
            event.set()

    def _complete_segments(self, base_offset: int) -> None:
        """Each send_arrow call's records hear their offsets (and the batch's outcome), in
        order, at places in the send order between this batch's and the next one's."""
        segments = self.segments or ()
        offset, order, step = base_offset, self.order, self.order_span * 2 / max(2, len(segments))
        entries = iter(segments)
        for listener, count in zip(entries, entries):
            listener(self, offset, count, order)
            if offset >= 0:
                offset += count
            order += step

    def _run_callbacks(self, error: Exception | None) -> None:
        # Once per acknowledged record: FutureRecordMetadata.metadata() inlined.
        topic, partition, base, append_time = self.topic, self.partition, self.base_offset, self.log_append_time
        common = error is None and base >= 0 and append_time < 0
        if common and run_callbacks is not None:
            run_callbacks(self.callbacks, topic, partition, base, RecordMetadata, _callback_raised)
            return
        entries = iter(self.callbacks)
        records = zip(entries, entries, entries, entries, entries)
        if common:
            # The common case without a branch per record: offsets known, create time kept.
            for callback, index, timestamp, key_size, value_size in records:
                try:
                    callback(_new_metadata(RecordMetadata, (
                        topic, partition, base + index, timestamp, key_size, value_size)), None)
                except Exception:  # a user callback must not break delivery of the others
                    log.exception("send callback raised")
            return
        for callback, index, timestamp, key_size, value_size in records:
            try:
                if error is None:
                    callback(_new_metadata(RecordMetadata, (
                        topic, partition, base + index if base >= 0 else -1,
                        append_time if append_time >= 0 else timestamp, key_size, value_size)), None)
                else:
                    callback(None, error)
            except Exception:
                log.exception("send callback raised")

    def wait(self, timeout: float | None) -> bool:
        """Wait until the batch has completed (its callbacks run); False on timeout. On the
        thread running its callbacks, a callback waiting on its own record returns at once."""
        if self.completed or self._completing == threading.get_ident():
            return True
        with _EVENT_LOCK:
            if self.completed:
                return True
            event = self._event
            if event is None:
                # Created lazily, once, under the lock that complete() releases waiters by:
                # most batches are never waited on record by record.
                event = self._event = threading.Event()
        return event.wait(timeout)

    def __repr__(self) -> str:
        return f"ProducerBatch({self.topic}-{self.partition}, records={self.record_count}, seq={self.base_sequence})"


class _SplitJoin:
    """The listener of a split batch's halves: completes the batch once every half has."""

    __slots__ = ("whole", "done", "halves", "finished")

    def __init__(self, whole: ProducerBatch, done: Callable[[ProducerBatch], None]) -> None:
        self.whole = whole
        self.done = done
        self.halves: list[ProducerBatch] = []
        self.finished = 0

    def __call__(self, half: ProducerBatch) -> None:
        self.finished += 1
        if self.finished < len(self.halves):
            return
        halves = self.halves
        error = next((h.error for h in halves if h.error is not None), None)
        follows = all(a.base_offset >= 0 and b.base_offset == a.base_offset + a.record_count
                      for a, b in zip(halves, halves[1:]))
        self.whole.complete(halves[0].base_offset if error is None and follows else -1,
                            halves[0].log_append_time, error)
        self.done(self.whole)


def headers_size(headers: Any) -> int:
    """Bytes a header list adds to a record at most, for batch sizing (``str`` keys count
    as UTF-8)."""
    return sum(len(k.encode()) + (len(v) if v is not None else 0) + MAX_HEADER_OVERHEAD
               for k, v in headers) if headers else 0
