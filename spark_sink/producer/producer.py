"""KafkaProducer: the public producer, per record (``send``) or per Arrow table (``send_arrow``).

Both paths share one accumulator and one Sender thread, so ordering, idempotence,
retries, delivery.timeout.ms and buffer.memory back-pressure behave the same for both.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from spark_sink.client.clock import Clock, now_ms, record_clock
from spark_sink.client.cluster_check import unknown_topic_message
from spark_sink.client.errors import (
    BrokersUnreachableError,
    BufferExhaustedError,
    InvalidPartitionError,
    KafkaTimeoutError,
    ProducerClosedError,
    RecordTooLargeError,
    SerializationError,
    UnknownTopicError,
)
from spark_sink.client.metadata import UNKNOWN_TOPIC_GRACE_MS, Metadata
from spark_sink.client.network import NetworkClient
from spark_sink.producer.accumulator import RecordAccumulator, chunk_bytes_for
from spark_sink.producer.arrow_input import CHUNK_BYTES, SendLimits, plan_arrow_send, screen_arrow_rows
from spark_sink.producer.batch import FutureRecordMetadata, PlainSender, ProducerBatch, SendCallback, headers_size
from spark_sink.producer.buffer_pool import BufferPool
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.metrics import MetricTotals, ProducerMetrics
from spark_sink.producer.partitioner import SEED as MURMUR2_SEED
from spark_sink.producer.partitioner import RowPartitioner, StickyPartitions, murmur2_unsigned, partition_for_key
from spark_sink.producer.producer_record import ProducerRecord
from spark_sink.producer.row_errors import ON_ERROR, RefusedRows, RowRefusals
from spark_sink.producer.sender import KafkaClient, Sender
from spark_sink.producer.transactions.coordinator_requests import TransactionalResult
from spark_sink.producer.transactions.transaction_manager import TransactionManager
from spark_sink.protocol.error_codes import KProdError, TopicAuthorizationFailedError, UnknownTopicOrPartitionError
from spark_sink.protocol.records import MAX_RECORD_OVERHEAD, RECORD_BATCH_OVERHEAD
from spark_sink.protocol.txn_coordinator import PreparedTransaction

if TYPE_CHECKING:
    from spark_sink.encoder.columnar import Continued
    from spark_sink.producer.serializers import ArrowSerializer

log = logging.getLogger(__name__)

# A batch header plus the most a record's own framing can take.
_RECORD_FRAMING = RECORD_BATCH_OVERHEAD + MAX_RECORD_OVERHEAD


def _to_bytes(what: str, value: Any, serializer: Any) -> bytes | None:
    if serializer is not None and value is not None:
        try:
            value = serializer(value)
        except Exception as exc:
            raise SerializationError(f"{what}.serializer failed on the record's {what}: {exc}") from exc
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise SerializationError(
        f"record {what} must be bytes, str or None (or set {what}.serializer), got {type(value).__name__}")


@dataclass(frozen=True)
class ArrowSendResult:
    """What one ``send_arrow`` call wrote: records, bytes of keys and values, and per
    topic-partition ``(count, first_offset, last_offset)``; with ``on_error="skip"``, the
    rows it refused, grouped by reason (``refused``)."""

    records: int
    bytes: int
    partitions: dict[tuple[str, int], tuple[int, int, int]] = field(default_factory=dict)
    refused: tuple[RefusedRows, ...] = ()

    @property
    def refused_rows(self) -> int:
        """How many rows were refused."""
        return sum(len(r) for r in self.refused)


class ArrowSendFuture:
    """Resolves once every record of a ``send_arrow`` call is acknowledged.

    A call that fails after it queued some rows (buffer.memory full for max.block.ms,
    the producer stopped) raises with this future as the error's ``future``: it resolves
    once the rows that were queued are acknowledged or failed, and says which.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()  # done callbacks run under it and may call back in
        self._done = threading.Event()
        self._pending = 0  # batches queued and not yet completed
        self._sealed = False  # no more batches will be queued
        self._records = 0
        self._bytes = 0
        self._failed_records = 0
        self._error: Exception | None = None
        self._refused: tuple[RefusedRows, ...] = ()  # rows refused before any was queued
        # per partition: [count, order of the first batch, its first offset, order of the
        # last batch, its last offset]
        self._ranges: dict[tuple[str, int], list[float]] = {}
        self._callbacks: list[Callable[[ArrowSendFuture], None]] = []
        # Called at the first failed record: wakes the call if it waits for memory.
        self._on_first_error: Callable[[], None] | None = None

    def add_done_callback(self, fn: Callable[[ArrowSendFuture], None]) -> None:
        """Call ``fn(future)`` once every record is acknowledged or failed (at once if so)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def _finish(self) -> None:
        # Called with self._lock held, exactly once.
        self._done.set()
        callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            try:
                fn(self)
            except Exception:
                log.exception("send_arrow done callback failed")

    def _queued(self, records: int, nbytes: int, parts: int) -> None:
        """``parts`` encoded batches holding ``records`` records (``nbytes`` of keys and
        values) are queued, alone or joined to others: they complete from now on, whatever
        happens. (One may complete before this is heard; the count is only read once the
        future is sealed.)"""
        with self._lock:
            self._pending += parts
            self._records += records
            self._bytes += nbytes

    def _seal(self) -> None:
        """Nothing more will be queued: resolve once what was queued has completed."""
        with self._lock:
            self._sealed = True
            if self._pending == 0:
                self._finish()

    def _on_records(self, batch: ProducerBatch, base: int, count: int, order: float) -> None:
        """``count`` of the call's records, the first at offset ``base`` (-1: unknown), have
        completed with ``batch``, at ``order`` in their partition's send order (the
        SegmentListener of every part the call queued)."""
        with self._lock:
            if batch.error is not None:
                self._failed_records += count
                if self._error is None:
                    self._error = batch.error
                    if self._on_first_error is not None:
                        self._on_first_error()
            else:
                # The range runs from the first offset of the partition's first part (in
                # send order) to the last offset of its last; an end whose batch came back
                # without an offset (a retry the broker had already written) is -1.
                first, last = (base, base + count - 1) if base >= 0 else (-1, -1)
                r = self._ranges.get(batch.tp)
                if r is None:
                    self._ranges[batch.tp] = [count, order, first, order, last]
                else:
                    r[0] += count
                    if order < r[1]:
                        r[1], r[2] = order, first
                    if order > r[3]:
                        r[3], r[4] = order, last
            self._pending -= 1
            if self._pending == 0 and self._sealed:
                self._finish()

    def done(self) -> bool:
        return self._done.is_set()

    def take_refused(self) -> tuple[RefusedRows, ...]:
        """The rows the call refused (known when it returns), handed over now and no
        longer kept (nor in ``result().refused``): a caller with many calls in flight deals
        with each call's refused rows at once instead of holding them all."""
        with self._lock:
            refused, self._refused = self._refused, ()
        return refused

    def _failure(self) -> Exception | None:
        """What result() raises once a record has failed (None until then): a broker's or
        the delivery timeout's error says how many of the records queued so far failed."""
        error = self._error
        if error is None or not (hasattr(error, "code") or isinstance(error, KafkaTimeoutError)):
            return error
        return type(error)(f"{self._failed_records} of {self._records} records failed; first error: {error}")

    def result(self, timeout: float | None = None) -> ArrowSendResult:
        """The summary, or the first error (saying how many records failed)."""
        if not self._done.wait(timeout):
            raise KafkaTimeoutError(f"send_arrow not acknowledged within {timeout} s")
        failure = self._failure()
        if failure is not None:
            raise failure
        return ArrowSendResult(self._records, self._bytes,
                               {tp: (int(count), int(first), int(last))
                                for tp, (count, _, first, _, last) in sorted(self._ranges.items())},
                               self._refused)


class KafkaProducer:
    """A Kafka producer with the Java client's configuration names and guarantees.

    ``KafkaProducer({"bootstrap.servers": "host:9092"})``; ``send(record)`` returns a
    future of RecordMetadata; ``send_arrow(table)`` sends a whole Arrow table.
    """

    def __init__(self, config: Mapping[str, Any], *, network_client: KafkaClient | None = None,
                 clock: Clock = now_ms) -> None:
        """``network_client``: the network for tests (an in-process fake cluster, as Java's
        MockClient); by default a NetworkClient to ``bootstrap.servers``. ``clock``: the
        time of timeouts, backoffs and metrics, and with a ``Time``'s wall clock the
        records' timestamps, for tests (a clock they move, as Java's MockTime)."""
        self.config = ProducerConfig.from_dict(config)
        c = self.config
        self._clock = clock
        self._wall_ns = record_clock(clock)
        self._pool = BufferPool(c.buffer_memory, clock=clock)
        self._accumulator = RecordAccumulator(c, self._pool, clock=clock)
        self._metadata = Metadata(c.metadata_max_age_ms, c.retry_backoff_ms, c.metadata_max_idle_ms, clock=clock)
        # Joined batches stay within each topic's max.message.bytes too (a dict shared, not copied).
        self._accumulator.message_limits = self._metadata.message_limits
        self._client = network_client or NetworkClient(c, c.max_in_flight_requests_per_connection, clock=clock)
        self._txn = TransactionManager(c)
        self._metrics = ProducerMetrics(self._pool, clock)
        self._pool.on_waited = self._metrics.buffer_waited
        self._sender = Sender(c, self._accumulator, self._metadata, self._client, self._txn, self._metrics,
                              clock=clock)
        self._pool.on_block = self._sender.wakeup  # only the Sender frees memory while send() waits
        self._accumulator.on_ready = self._sender.batch_ready
        self._sticky = StickyPartitions(self._metadata.available_partitions,
                                        self._partition_load if c.partitioner_adaptive_partitioning_enable else None,
                                        c.batch_size)
        self._partitioner = (RowPartitioner(c.partitioner_class, self._metadata.available_partitions)
                             if c.partitioner_class is not None else None)
        self._send_interceptors = tuple(i for i in c.interceptors if hasattr(i, "on_send"))
        self._ack_interceptors = tuple(i for i in c.interceptors if hasattr(i, "on_acknowledgement"))
        self._max_record_payload = min(c.max_request_size, c.buffer_memory) - _RECORD_FRAMING
        self._arrow_limits = SendLimits(c.batch_size, c.max_request_size, c.buffer_memory, c.compression_codec)
        self._closed = False
        # send() may go the short way: no serializers, interceptors, ignored keys or
        # transaction (whose partitions are added as records go to them), not closed
        plain = not (c.key_serializer or c.value_serializer or c.interceptors or c.partitioner_ignore_keys
                     or c.transactional_id or self._partitioner)
        appender = self._accumulator.compiled_appender
        short_way: Callable[[ProducerRecord, SendCallback | None], FutureRecordMetadata | None]
        self._plain_sender = None
        if not plain:
            short_way = self._no_short_way
        elif appender is not None:
            # send() whole in C: the short way, and the long way called from there.
            self._plain_sender = PlainSender(appender, self._metadata, self._max_record_payload, MURMUR2_SEED,
                                             ProducerRecord, self._send, self._send_new_batch, self._wall_ns)
            short_way = self._plain_sender.send
            if type(self).send is KafkaProducer.send:  # not a subclass's own send()
                self.send = self._plain_sender.send  # type: ignore[method-assign]  # without send()'s Python frame
        else:
            short_way = self._send_plain_py
        self._send_plain = short_way
        self._sender.start()

    def _partition_load(self, topic: str, num_partitions: int) -> tuple[list[int], list[int], int] | None:
        """The queue sizes the adaptive partitioner weighs (None: topic unknown)."""
        leaders = self._metadata.leaders.get(topic)
        if not leaders or len(leaders) != num_partitions:
            return None
        return self._accumulator.partition_load(topic, leaders, self._clock())

    # -- per record -----------------------------------------------------------

    def send(self, record: ProducerRecord, callback: SendCallback | None = None) -> FutureRecordMetadata:
        """Queue one record; ``callback(metadata, exception)`` runs once it is acknowledged or failed."""
        # The common record goes the short way (_send_plain: None if it cannot), every other
        # record, and every error, through _send. With kprod's extension built, __init__
        # puts PlainSender.send, which does all of this, in this method's place.
        return self._send_plain(record, callback) or self._send(record, callback)

    def _send_plain_py(self, record: ProducerRecord, callback: SendCallback | None) -> FutureRecordMetadata | None:
        """send()'s short way: the common record (bytes key and value, nothing else set, a
        topic with known leaders) appended to its partition's open batch if it fits there;
        None otherwise. Taken only while every record may go the short way (see __init__).
        In Python where kprod's extension is not built; _kernels.c's PlainSender.send with it."""
        key = record.key
        value = record.value
        if (type(key) is bytes and type(value) is bytes and record.partition is None and record.timestamp is None
                and not record.headers):
            topic = record.topic
            leaders = self._metadata.leaders.get(topic)
            key_size = len(key)
            value_size = len(value)
            if leaders and key_size + value_size <= self._max_record_payload:
                partition = (murmur2_unsigned(key, MURMUR2_SEED) & 0x7FFFFFFF) % len(leaders)
                timestamp = self._wall_ns() // 1_000_000
                return (self._accumulator.append_plain(topic, partition, timestamp, key, value, callback, key_size,
                                                       value_size)
                        or self._send_new_batch(topic, partition, timestamp, key, value, callback, key_size,
                                                value_size))
        return None

    def _send_new_batch(self, topic: str, partition: int, timestamp: int, key: bytes, value: bytes,
                        callback: SendCallback | None, key_size: int, value_size: int) -> FutureRecordMetadata:
        """send()'s short way for a record its partition's open batch has no room for (or
        the partition's first): a new batch for it, then a round of the sender's work on
        this thread (see Sender.run_in_caller). Everything _send would check is known."""
        try:
            future, batch_ready, new_batch = self._accumulator.append(
                topic, partition, timestamp, key, value, headers=None, callback=callback, key_size=key_size,
                value_size=value_size, headers_size=0, max_block_ms=self._max_block_ms(), full=True)
        except BufferExhaustedError as exc:
            raise self._exhausted_in_callback(exc)  # noqa: B904  # its cause set there
        if new_batch:
            # once per batch: send what filled up, on this thread
            self._sender.run_in_caller((topic, partition), batch_ready)
        else:
            self._sender.batch_ready()  # another thread made a batch meanwhile
        return future

    @staticmethod
    def _no_short_way(record: ProducerRecord, callback: SendCallback | None) -> None:
        """_send_plain when send() must go the long way for every record."""
        return None

    def _send(self, record: ProducerRecord, callback: SendCallback | None) -> FutureRecordMetadata:
        """send() for every record: serializers, interceptors, headers, explicit partitions,
        timestamps, metadata waits and every error."""
        if self._closed:
            raise ProducerClosedError("send() after close()")
        c = self.config
        if self._txn.transactional:
            self._txn.ensure_sendable()
        for interceptor in self._send_interceptors:
            record = interceptor.on_send(record)
        topic = record.topic
        leaders = self._metadata.leaders.get(topic)
        count = len(leaders) if leaders else self._wait_for_topic(topic)
        key, value = record.key, record.value
        if type(key) is not bytes and key is not None or c.key_serializer is not None:
            key = _to_bytes("key", key, c.key_serializer)
        if type(value) is not bytes and value is not None or c.value_serializer is not None:
            value = _to_bytes("value", value, c.value_serializer)
        key_size = len(key) if key is not None else 0
        value_size = len(value) if value is not None else 0
        headers = record.headers
        h_size = 0
        if headers:
            headers = self._check_headers(headers)
            h_size = headers_size(headers)
        if key_size + value_size + h_size > self._max_record_payload:
            raise RecordTooLargeError(
                f"record to {topic} is {key_size + value_size + h_size + _RECORD_FRAMING} bytes serialized, larger "
                f"than max.request.size ({c.max_request_size}) or buffer.memory ({c.buffer_memory})")
        partition = record.partition
        sticky = False
        if partition is None:
            if self._partitioner is not None:
                partition = self._partitioner.partition(topic, key, value, count)
            elif key is not None and not c.partitioner_ignore_keys:
                partition = partition_for_key(key, count)
            else:
                sticky = True
                partition = self._sticky.current(topic, count)
        elif not 0 <= partition < count:
            raise InvalidPartitionError(
                f"record for topic {topic!r} has partition {partition}, "
                f"but the topic has {count} partitions (0..{count - 1})")
        timestamp = record.timestamp
        if timestamp is None:
            timestamp = self._wall_ns() // 1_000_000
        if self._txn.transactional:
            self._txn.maybe_add_partition((topic, partition))
        if self._ack_interceptors:
            callback = self._wrap_callback(callback)
        try:
            future, batch_ready, new_batch = self._accumulator.append(
                topic, partition, timestamp, key, value, headers=headers, callback=callback, key_size=key_size,
                value_size=value_size, headers_size=h_size, max_block_ms=self._max_block_ms())
        except BufferExhaustedError as exc:
            raise self._exhausted_in_callback(exc)  # noqa: B904  # its cause set there
        if sticky:
            self._sticky.appended(topic, count, key_size + value_size + h_size, batch_ready)
        if batch_ready or new_batch:
            if new_batch:
                # once per batch: send what filled up, on this thread. In a transaction
                # always a full round: the partition may be new to it, and only a full
                # round asks the coordinator to add it.
                self._sender.run_in_caller(None if self._txn.transactional else (topic, partition), batch_ready)
            else:
                self._sender.batch_ready()
        return future

    @staticmethod
    def _check_headers(headers: Any) -> list[tuple[str, bytes | None]]:
        checked = []
        for item in headers:
            try:
                k, v = item
            except (TypeError, ValueError):
                raise SerializationError(f"each header must be a (str, bytes) pair, got {item!r}") from None
            if not isinstance(k, str):
                raise SerializationError(f"header key must be str, got {type(k).__name__}")
            checked.append((k, _to_bytes(f"header {k!r} value", v, None)))
        return checked

    def _wrap_callback(self, callback: SendCallback | None) -> SendCallback:
        interceptors = self._ack_interceptors

        def notify(metadata: Any, error: Exception | None) -> None:
            for interceptor in interceptors:
                try:
                    interceptor.on_acknowledgement(metadata, error)
                except Exception:
                    log.exception("interceptor on_acknowledgement failed")
            if callback is not None:
                callback(metadata, error)

        return notify

    # -- per table ------------------------------------------------------------

    def send_arrow(self, data: pa.RecordBatch | pa.Table, topic: str | None = None, *,
                   key_serializer: ArrowSerializer | None = None, value_serializer: ArrowSerializer | None = None,
                   on_error: str = "fail") -> ArrowSendFuture:
        """Send every row of an Arrow table or record batch; see ``arrow_input`` for columns.

        With a serializer (``ArrowSerializer("avro", {"url": ...})``) the ``key`` or
        ``value`` column is a struct, sent in the Schema Registry's wire format (Avro or
        JSON Schema); a row the schema cannot carry fails the call before any row is queued
        (with ``on_error="skip"``: is refused, its columns as given).

        All or nothing at validation: a bad column, a row whose record is larger than
        max.request.size (or buffer.memory), a topic that is missing, invalid or that the
        principal may not describe, or a partition its topic does not have raises before
        any row is queued.
        With ``on_error="skip"`` the rows with such an error of their own (see
        ``row_errors``) are refused instead and the others sent: the result lists them
        (``ArrowSendResult.refused``). Errors of the columns themselves, of the cluster or
        of the connection raise either way. A failure only met on the way (buffer.memory
        still full after max.block.ms, the producer stopped, a record of the call already
        failed) raises with the rows queued so far in flight: the error's ``future`` is
        their ArrowSendFuture.
        """
        if self._closed:
            raise ProducerClosedError("send_arrow() after close()")
        if on_error not in ON_ERROR:
            raise ValueError(f"send_arrow's on_error is {on_error!r}; expected one of {', '.join(ON_ERROR)}")
        skip = on_error == "skip"
        if key_serializer is None and value_serializer is None:
            return self._send_arrow(data, topic, skip)
        from spark_sink.producer.serializers import serialize_columns

        # Rows a format cannot encode are refused with their columns as given.
        refusals = RowRefusals(data) if skip else None
        data = serialize_columns(data, topic, key_serializer, value_serializer, refusals)
        future = self._send_arrow(data, topic, skip)
        if refusals is not None and refusals.refused:
            future._refused = refusals.followed_by(future._refused)
        return future

    def _send_arrow(self, data: pa.RecordBatch | pa.Table, topic: str | None, skip: bool) -> ArrowSendFuture:
        c = self.config
        txn = self._txn if self._txn.transactional else None
        if txn is not None:
            txn.ensure_sendable()

        def partition_count(t: str) -> int:
            count = self._metadata.partition_count(t) or self._wait_for_topic(t)
            if not self._metadata.writable(t):
                # Refused before any row is queued: under a transaction a Produce the broker
                # refuses would leave it abortable, the good rows with it.
                raise TopicAuthorizationFailedError(
                    f"topic {t!r}: the principal may describe it but not write it (WRITE is not among the "
                    "operations the brokers' authorizer allows it there)")
            return count

        # Every check runs on the whole input before any row is queued.
        refusals = topics = bounds = None
        if skip:
            refusals = RowRefusals(data)
            data, topics, bounds = screen_arrow_rows(data, topic, refusals, partition_count=partition_count,
                                                     limits=self._arrow_limits, message_limit=self.max_message_bytes)
        groups = plan_arrow_send(
            data, topic, partition_count=partition_count, sticky_partition=self._sticky.next,
            ignore_keys=c.partitioner_ignore_keys, partitioner=self._partitioner, limits=self._arrow_limits,
            now_ms=self._wall_ns() // 1_000_000, bounds=bounds, topics=topics,
            message_limit=self.max_message_bytes)
        future = ArrowSendFuture()
        # Once a record of the call has failed the call fails too: it stops queueing rows
        # (and waiting for memory to queue them) rather than wait out delivery.timeout.ms
        # again for each buffer.memory's worth of brokers that do not answer.
        future._on_first_error = self._pool.wake_all
        if refusals is not None:
            future._refused = tuple(refusals.refused)
        # Rows encoded at a time: an eighth of buffer.memory, more for a topic of many
        # partitions (each chunk cuts every partition's batch: see chunk_bytes_for).
        chunk_bytes = max(1, min(CHUNK_BYTES, c.buffer_memory // 8))
        batch_bytes = self._arrow_limits.batch_bytes()
        claims: list[Continued] = []  # the claims of the chunk in hand (see RecordAccumulator.continued)

        def continued(topic: str, partitions: Sequence[int]) -> Continued | None:
            made = self._accumulator.continued(topic, partitions)
            claims[:] = () if made is None else (made,)
            return made

        try:
            with self._no_wait_in_callback():
                for rows in groups:
                    cap = min(batch_bytes, rows.message_limit or batch_bytes)  # the topic's max.message.bytes
                    for chunk in rows.encode(cap, c.compression_codec, c.compression_level,
                                             chunk_bytes_for(rows.partition_count, chunk_bytes, c.buffer_memory),
                                             partial(continued, rows.topic)):
                        if (failure := future._failure()) is not None:
                            raise failure
                        if txn is not None:
                            txn.maybe_add_partitions(rows.topic, [partition for partition, _ in chunk])
                        self._accumulator.append_encoded(rows.topic, chunk, self._clock(), self._max_block_ms(),
                                                         future._on_records, future._queued, self._sender.wakeup,
                                                         future._failure)
        except BaseException as exc:
            # Batches the chunk in hand claimed and did not join stay open to the next calls.
            for made in claims:
                self._accumulator.release(made)
            # What was queued is sent (or failed) all the same: hand its future over.
            future._seal()
            if exc is future._error:  # a batch's own error (other calls' records may share it)
                raise
            exc.future = future  # type: ignore[attr-defined]  # kprod's own attribute on what was raised
            exc.add_note(f"{future._records} of {len(data)} rows were queued before this; "
                         "the error's .future resolves once they are acknowledged or failed")
            raise
        future._seal()
        return future

    # -- transactions ---------------------------------------------------------

    def init_transactions(self, timeout: float | None = None) -> None:
        """Get the producer id for transactional.id from its coordinator (once, before the
        first transaction). Fences every earlier producer with the same transactional.id and
        aborts the transaction it left open. May be called again between transactions (or
        after prepare_transaction()) to fence afresh."""
        self._txn_wait(self._txn.init_transactions(), "init_transactions()", timeout)

    def begin_transaction(self) -> None:
        """Open a transaction: records sent from now on commit or abort together."""
        self._txn.begin_transaction()

    def send_offsets_to_transaction(self, offsets: Mapping[tuple[str, int], int | tuple[int, str | None]],
                                    group_id: str, timeout: float | None = None) -> None:
        """Commit ``offsets`` ({(topic, partition): offset or (offset, metadata)}) for the
        consumer group ``group_id`` as part of the open transaction: they become visible
        with its records, or not at all."""
        normal = {tp: (o, None) if isinstance(o, int) else (int(o[0]), o[1]) for tp, o in offsets.items()}
        self._txn_wait(self._txn.send_offsets_to_transaction(normal, group_id), "send_offsets_to_transaction()",
                       timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit the open (or prepared) transaction. Raises
        AbortableTransactionError if a record of it failed (abort_transaction() then), or
        FatalTransactionError if this producer was fenced."""
        self.flush(timeout)
        self._txn_wait(self._txn.end_transaction(commit=True), "commit_transaction()", timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: its records are never visible to read_committed
        consumers; records not yet sent fail with AbortableTransactionError."""
        self._txn_wait(self._txn.end_transaction(commit=False), "abort_transaction()", timeout)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction | None:
        """Flush the open transaction and leave it open, for another process to commit or
        abort with AdminClient.end_transactions(): the first phase of a two-phase commit.
        Raises as commit_transaction() does if the transaction cannot commit. A transaction
        that holds nothing (no record, no offsets) has nothing to end: it ends here, and
        None is returned."""
        self.flush(timeout)
        identity = self._txn.prepare_transaction()
        return None if identity is None else PreparedTransaction(*identity)

    def _txn_wait(self, result: TransactionalResult, what: str, timeout: float | None) -> None:
        self._sender.wakeup()
        result.wait(self.config.max_block_ms / 1000 if timeout is None else timeout, what, self._txn.held_up_by)

    # -- lifecycle ------------------------------------------------------------

    def _limit_wait_error(self) -> Exception | None:
        """Why a wait for a topic's settings cannot end: authentication failed, or the
        producer was closed meanwhile (its sender will never ask)."""
        if self._closed:
            return ProducerClosedError("the producer was closed while send_arrow waited for the settings of a topic")
        return self._client.authentication_error

    def partitions_for(self, topic: str) -> list[int]:
        """Partition ids of ``topic`` (fetching metadata, up to max.block.ms)."""
        return list(range(self._metadata.partition_count(topic) or self._wait_for_topic(topic)))

    def max_message_bytes(self, topic: str) -> int | None:
        """``topic``'s max.message.bytes as the brokers have it (None where they would not
        say), asked once per topic (DescribeConfigs, up to max.block.ms) and kept while the
        topic is in use. send_arrow asks it on its first use of a topic: it sizes its
        batches within it and refuses a record too large for it before any row is queued,
        where a Produce the broker refuses could not be traced back to rows (and would make
        a transaction abortable)."""
        return self._metadata.wait_for_message_limit(topic, self.config.max_block_ms, self._sender.wakeup,
                                                     self._limit_wait_error)

    def _wait_for_topic(self, topic: str) -> int:
        """Partition count once metadata names ``topic``: up to max.block.ms, or until TLS
        or SASL authentication fails (raised at once, as Java does). Past max.block.ms the
        error says why: no broker reached (each address, what happened), or no such topic."""
        try:
            return self._metadata.wait_for_topic(topic, self.config.max_block_ms, self._sender.wakeup,
                                                 lambda: self._client.authentication_error)
        except UnknownTopicError:
            # The brokers said so for a while: no point waiting out max.block.ms.
            raise UnknownTopicError(unknown_topic_message(
                topic, self.config, f"{UNKNOWN_TOPIC_GRACE_MS} ms of UNKNOWN_TOPIC_OR_PARTITION answers")) from None
        except KafkaTimeoutError:
            waited = f"{self.config.max_block_ms} ms (max.block.ms)"
            if not self._metadata.nodes:
                raise BrokersUnreachableError(
                    f"cannot send to topic {topic!r}: no broker answered within {waited}: "
                    f"{self._client.describe_bootstrap()}") from None
            if isinstance(self._metadata.topic_errors.get(topic), UnknownTopicOrPartitionError):
                raise UnknownTopicError(unknown_topic_message(topic, self.config, waited)) from None
            raise

    def metrics(self) -> dict[str, float]:
        """The Java producer's metrics that kprod measures, by their Java names
        (``record-send-rate``, ``request-latency-avg``, ...): see ``producer/metrics.py``."""
        return self._metrics.metrics()

    def metric_totals(self) -> MetricTotals:
        """Records sent, retried and failed, requests and their latency since the start,
        and the largest request latency since the previous call: subtract an earlier
        call's answer (``since``) for what happened in between."""
        return self._metrics.checkpoint()

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until it is acknowledged or failed."""
        if self._in_callback():
            # Java refuses this too: the flush would wait for the very round running it.
            raise KProdError("flush() inside a send callback is not permitted: it would wait for itself")
        deadline = None if timeout is None else now_ms() + timeout * 1000.0
        self._accumulator.begin_flush()
        try:
            self._sender.wakeup()
            for batch in self._accumulator.incomplete():
                remaining = None if deadline is None else max(0.0, deadline - now_ms()) / 1000.0
                if not batch.wait(remaining):
                    raise KafkaTimeoutError(f"flush did not finish within {timeout} s")
        finally:
            self._accumulator.end_flush()
        if self._sender.fatal_error is not None:
            raise self._sender.fatal_error

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (waiting up to ``timeout``), then stop; 0 fails it instead."""
        if self._closed:
            return
        self._closed = True
        self._send_plain = self._no_short_way  # send() then goes the long way, which refuses it
        if self._plain_sender is not None:
            self._plain_sender.close()  # the same for the compiled send()
        if self._in_callback():
            # As Java does: waiting here would wait for the round running this callback.
            log.warning("close() called from a send callback: closing without waiting (close(0))")
            self._sender.force_close()
            return
        if timeout == 0:
            self._sender.force_close()
        else:
            self._sender.initiate_close()
        self._sender.join(timeout)
        if self._sender.is_alive():
            self._sender.force_close()
            self._sender.join()

    def _max_block_ms(self) -> float:
        """How long a send may wait for buffer.memory: not at all from a callback, whose
        thread is the one that frees memory as records are acknowledged."""
        return 0.0 if self._in_callback() else self.config.max_block_ms

    @contextlib.contextmanager
    def _no_wait_in_callback(self) -> Iterator[None]:
        """Say why a send from a callback found no memory, rather than max.block.ms 0."""
        try:
            yield
        except BufferExhaustedError as exc:
            raise self._exhausted_in_callback(exc)  # noqa: B904  # its cause set there

    def _exhausted_in_callback(self, exc: BufferExhaustedError) -> BufferExhaustedError:
        """What to raise for ``exc``: itself, or from a callback, an error saying why it could
        not wait for memory (rather than max.block.ms 0). A function, not only the context
        manager above: send() takes no ``with`` block per batch."""
        if not self._in_callback():
            return exc
        error = BufferExhaustedError(
            f"send() from a send callback found buffer.memory ({self.config.buffer_memory} bytes) full: a "
            "callback runs on the producer's I/O thread, which frees memory as records are acknowledged, so "
            "it cannot wait for memory; send from another thread, or raise buffer.memory")
        error.__cause__ = exc
        return error

    @property
    def usable(self) -> bool:
        """Whether the producer can still send: not closed, its Sender running and not
        failed for good."""
        return not self._closed and self._sender.is_alive() and self._sender.fatal_error is None

    def _in_callback(self) -> bool:
        """True on a thread running the sender's work (and so a send callback)."""
        return self._sender.io_lock.holder == threading.get_ident()

    def __enter__(self) -> KafkaProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and getattr(self, "_sender", None) is not None:
            self._sender.force_close()
