"""Sender: the one I/O thread. It drains ready batches into Produce requests, handles
responses (success, retry, failure), keeps metadata fresh and the producer id valid."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.connections import ClientResponse
from spark_sink.client.errors import AbortableTransactionError, KafkaTimeoutError
from spark_sink.client.metadata import MAX_MESSAGE_BYTES, TOPIC_RESOURCE, Metadata
from spark_sink.producer.accumulator import RecordAccumulator
from spark_sink.producer.batch import ProducerBatch
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.metrics import ProducerMetrics
from spark_sink.producer.transactions.transaction_manager import TransactionManager
from spark_sink.producer.transactions.transaction_states import State
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import (
    NO_ERROR,
    ClusterAuthorizationFailedError,
    DuplicateSequenceNumberError,
    KProdError,
    MessageTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnknownServerError,
    error_for_code,
    failure_for_code,
    is_invalid_metadata,
)
from spark_sink.protocol.kmsg import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeConfigsResponse,
    InitProducerIdResponse,
    MetadataResponse,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from spark_sink.protocol.schema import Request

log = logging.getLogger(__name__)

_MAX_POLL_MS = 100.0
# A partition's answer saying its batch is larger than the topic (or broker) takes.
_TOO_LARGE = frozenset({MessageTooLargeError.code, RecordListTooLargeError.code})
# A transaction in these states takes no more records: those not yet sent fail.
_NO_MORE_SENDS = frozenset({State.ABORTING_TRANSACTION, State.ABORTABLE_ERROR, State.FATAL_ERROR})
# How long after a sending thread last did the sender's work the Sender thread leaves the
# broker connections to it.
_HANDOVER_MS = 10.0

Reply = TypeVar("Reply")


class IoLock:
    """The lock of whichever thread does the Sender's work, knowing which thread holds it
    (a callback asks, to refuse a flush() that would wait for itself).

    Taken blocking on purpose: while a thread waits for it, the GIL goes to the thread
    doing a round, which then finishes sooner. A class, not a generator context manager:
    a sending thread takes it once per batch.
    """

    __slots__ = ("_lock", "holder")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holder: int | None = None

    def __enter__(self) -> None:
        self._lock.acquire()
        self.holder = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        self.holder = None
        self._lock.release()


class KafkaClient(Protocol):
    """What the Sender needs of the network: NetworkClient, or a scripted client in tests
    (as Java's KafkaClient interface, which NetworkClient and MockClient implement)."""

    def wakeup(self) -> None: ...
    def wait(self, timeout_ms: float, io: bool = True) -> None: ...
    def poll(self, timeout_ms: float) -> bool: ...
    def next_timeout_ms(self, now: float) -> float: ...
    def ready(self, node_id: int, now: float) -> bool: ...
    def connection_failed(self, node_id: int) -> bool: ...
    def connection_delay_ms(self, node_id: int, now: float) -> float: ...
    def least_loaded_node(self, now: float) -> int | None: ...
    def send(self, node_id: int, api_key: int, body: Request[Reply],
             callback: Callable[[ClientResponse[Reply]], None] | None,
             expect_response: bool = True, max_version: int | None = None) -> None: ...
    def set_nodes(self, nodes: Mapping[int, tuple[str, int]]) -> None: ...
    def close(self) -> None: ...
    def describe_bootstrap(self) -> str: ...
    def api_version(self, node_id: int, api_key: int) -> int | None: ...
    @property
    def authentication_error(self) -> Exception | None:
        """The last failed authentication: threads waiting for metadata fail at once with it."""

    @property
    def transaction_version(self) -> int:
        """The cluster's transaction protocol (messages.transaction_version)."""


class Sender(threading.Thread):
    """Moves batches from the accumulator to the brokers."""

    def __init__(self, config: ProducerConfig, accumulator: RecordAccumulator, metadata: Metadata,
                 client: KafkaClient, transaction_manager: TransactionManager, metrics: ProducerMetrics, *,
                 clock: Clock = now_ms) -> None:
        super().__init__(name=f"kprod-sender-{config.client_id}", daemon=True)
        self._config = config
        # The time every round reads and hands on to the accumulator, metadata and the
        # TransactionManager (which reads none of its own), as Java's Sender has its Time.
        self._clock = clock
        self._acc = accumulator
        self._metadata = metadata
        self._client = client
        self._txn = transaction_manager
        transaction_manager.transaction_version = lambda: client.transaction_version
        self._running = True
        self._force_close = False
        self._metadata_in_flight = False
        self._limits_in_flight = False
        self._limits_not_before = -1e18  # after a failed DescribeConfigs: retry.backoff.ms
        self._limits_denied_logged = False
        self._in_flight_batches: set[ProducerBatch] = set()
        self.fatal_error: Exception | None = None
        # Held by whichever thread does the sender's work: this one, or a sending thread
        # (run_in_caller). The client, the in-flight state and the producer id are touched
        # only under it.
        self.io_lock = IoLock()
        self._stopped = False
        self._waiting_until = 0.0  # when this thread's current wait on the brokers ends
        self._caller_ran_ms = -1e18  # when a sending thread last did the sender's work
        # What the last full round could not send: the partitions whose batches the
        # in-flight limits held back (of those ready() looked at), and the leaders it had batches ready for that could
        # take no request (at their in-flight limit or still writing one); and until when
        # only an answer can change what a round would do (the round's own wait: linger,
        # backoffs, metadata, timeouts). See run_in_caller.
        self._held: set[tuple[str, int]] = set()
        self._stalled: set[int] = set()
        self._quiet_until = -1e18
        self._metrics = metrics

    # -- lifecycle ------------------------------------------------------------

    def wakeup(self) -> None:
        """Have this thread look at once (flush, close, a new topic): no sending thread is
        going to do the work meanwhile."""
        self._caller_ran_ms = -1e18
        self._quiet_until = -1e18  # something changed that a poll would not show
        self._client.wakeup()

    def batch_ready(self) -> None:
        """A batch is ready to send: wake this thread, unless a sending thread does the work."""
        if self._clock() - self._caller_ran_ms >= _HANDOVER_MS:
            self._client.wakeup()

    def initiate_close(self) -> None:
        """Stop once everything queued is sent."""
        self._running = False
        self._acc.closed = True
        self.wakeup()

    def force_close(self) -> None:
        """Stop now, failing whatever is not yet acknowledged."""
        self._force_close = True
        self.initiate_close()

    def run(self) -> None:
        try:
            while True:
                handover_left = _HANDOVER_MS - (self._clock() - self._caller_ran_ms)
                if handover_left > 0:
                    # A sending thread does the work (run_in_caller): keep off the GIL, and
                    # look again when it may have stopped.
                    self._client.wait(handover_left, io=False)
                    continue
                with self.io_lock:
                    if not (self._running or not self._force_close
                            and (self._acc.has_undrained() or self._in_flight_batches)):
                        break
                    wait_ms = self.run_once()
                    self._waiting_until = self._clock() + wait_ms
                if wait_ms > 0:
                    self._client.wait(wait_ms)  # without the lock: a sending thread may take over
                self._waiting_until = 0.0
        except Exception as exc:  # never die silently: fail everything with the cause
            log.exception("sender thread failed")
            self.fatal_error = exc
        finally:
            with self.io_lock:
                self._stopped = True
                self._force_close = True  # what fails from here on is not retried
                error = self.fatal_error or KProdError("producer closed before these records were acknowledged")
                self._acc.stop(error)
                self._acc.abort_undrained()
                # Every batch not yet completed, wherever it is: queued, in flight, or
                # dropped between the two by a round that was interrupted.
                for batch in self._acc.incomplete():
                    self._fail(batch, error)
                self._client.close()

    def run_in_caller(self, tp: tuple[str, int] | None = None, batch_ready: bool = True) -> None:
        """Do one round of the sender's work on the calling (sending) thread. ``tp``: the
        partition of the batch just made, if that is why, and ``batch_ready``: whether
        that made a batch of it ready (the one before it, still queued, or a full one).

        With the GIL, two threads sharing per-record work are slower than one: each handover
        of the GIL between cores costs more than the work it hands over. So while the
        application sends, its own thread seals and sends the batches it fills and handles
        the responses, and this thread sleeps until the application stops sending.

        Most new batches change nothing a round would act on: the batch before went out
        already and the new one lingers, or the partition's batches wait for the in-flight
        limits or for their leader, which only an answer can change. Until the last full
        round's wait is over, such a round only polls, and goes on as a full round if the
        poll brought anything.
        """
        if self.io_lock.holder == threading.get_ident():
            return  # a send() from a callback of the round this thread is already doing
        with self.io_lock:
            if self._stopped:
                return
            try:
                now = self._clock()
                if tp is not None and now < self._quiet_until:
                    lingering = not batch_ready and self._config.linger_ms > 0
                    if ((lingering or tp in self._held or self._metadata.leader(tp) in self._stalled)
                            and not self._client.poll(0)):
                        if lingering:  # the next full round when the new batch is due, at the latest
                            self._quiet_until = min(self._quiet_until, now + self._config.linger_ms)
                        self._caller_ran_ms = now
                        return
                wait_ms = self.run_once()
            except BaseException as exc:
                # The round may have left a batch half sent: stop the producer and fail
                # every record not acknowledged rather than leave one waiting forever. A
                # bug is the producer's, not the send's (its record is queued): only an
                # interruption (KeyboardInterrupt) goes on up.
                log.exception("sender round failed on a sending thread")
                self.fatal_error = exc if isinstance(exc, Exception) else KProdError(f"producer stopped by {exc!r}")
                self._acc.stop(self.fatal_error)  # now, not once the Sender thread has woken
                self._running = False
                self._force_close = True
                self.wakeup()
                if not isinstance(exc, Exception):
                    raise
                return
            self._caller_ran_ms = self._clock()
        if self._clock() + wait_ms < self._waiting_until:
            self._client.wakeup()  # this thread waits on the brokers beyond something now due

    # -- one loop -------------------------------------------------------------

    def run_once(self) -> float:
        """Send what is ready and handle the I/O that is ready, without blocking; returns
        how long the Sender may wait before the next round. Only with ``io_lock`` held."""
        now = self._clock()
        self._quiet_until = -1e18  # set again only by a round that gets to its end
        poll_ms = _MAX_POLL_MS
        poll_ms = min(poll_ms, self._maybe_update_metadata(now))
        if self._metadata.limits_wanted:
            poll_ms = min(poll_ms, self._maybe_describe_topics(now))
        if self._txn.transactional:
            poll_ms = min(poll_ms, self._maybe_send_transactional_request(now))
        if not self._ensure_producer_id(now):
            self._fail_expired(now)
            if self._client.poll(0):
                return 0.0  # a connection got ready or the producer id came: go on at once
            return min(poll_ms, 50.0, self._client.next_timeout_ms(now))
        leaders = self._metadata.leaders
        can_send = self._txn.can_send
        held: set[tuple[str, int]] = set()
        ready, next_ms, unknown = self._acc.ready(leaders, now, can_send, refused=held)
        if unknown:
            self._metadata.request_update()
        poll_ms = min(poll_ms, next_ms)
        sendable = set()
        stalled = set()
        unreachable = False
        for node in ready:
            if self._client.ready(node, now):
                sendable.add(node)
            else:
                if self._client.connection_failed(node):
                    unreachable = True
                else:
                    stalled.add(node)
                poll_ms = min(poll_ms, max(5.0, self._client.connection_delay_ms(node, now)))
        if unreachable:
            # A leader we cannot reach may be dead, its partitions led by another node by
            # now: refresh, as Java does after every failed connection. Otherwise they would
            # wait for it (or for metadata.max.age.ms) and expire.
            self._metadata.request_update()
            poll_ms = min(poll_ms, self._maybe_update_metadata(now))
        if sendable:
            drained = self._acc.drain(leaders, sendable, self._config.max_request_size, now, can_send,
                                      self._config.compression_codec, self._config.compression_level,
                                      self._txn.prepare_batch)
            self._acc.note_drained(drained, now)
            for node, batches in drained.items():
                self._send_produce(node, batches)
            if drained:
                poll_ms = 0.0
        self._fail_expired(now)
        if self._client.poll(0):
            return 0.0  # responses or a ready connection may have made more sendable: look again
        wait_ms = min(poll_ms, self._client.next_timeout_ms(self._clock()))
        if not unknown and not unreachable:  # see run_in_caller
            self._held, self._stalled = held, stalled
            self._quiet_until = now + wait_ms
        return wait_ms

    def _fail_expired(self, now: float) -> None:
        timeout = self._config.delivery_timeout_ms
        for batch in self._acc.expire(now, timeout):
            error = KafkaTimeoutError(
                f"expiring {batch.record_count} record(s) for {batch.topic}-{batch.partition}: "
                f"{now - batch.created_ms:.0f} ms passed since batch creation (delivery.timeout.ms={timeout}); "
                f"{self._metadata.describe_leader(batch.tp)}")
            self._txn.handle_failed_batch(batch, on_wire=False, error=error)
            self._fail(batch, error)

    # -- transactions ---------------------------------------------------------

    def _maybe_send_transactional_request(self, now: float) -> float:
        """Send the TransactionManager's next coordinator request (finding the coordinator
        first); fail the records of a transaction that can no longer commit. Returns how
        long the loop may wait."""
        txn = self._txn
        if txn.state in _NO_MORE_SENDS and self._acc.has_undrained():
            error = AbortableTransactionError(
                f"the transaction of transactional.id {txn.transactional_id!r} is being aborted or failed "
                f"before these records were sent: {txn.abortable_error or txn.fatal_error or 'aborted'}",
                txn.abortable_error or txn.fatal_error)
            for batch in self._acc.abort_undrained():
                # A batch queued for a retry holds a sequence the broker may never see:
                # the TransactionManager restarts its partition under a new epoch.
                txn.handle_failed_batch(batch, on_wire=False)
                self._fail(batch, error)
        request = txn.next_request(now)
        if request is None:
            return _MAX_POLL_MS
        if request.api_key == ApiKey.END_TXN and self._in_flight_batches:
            return 5.0  # the markers go after every record of the transaction is answered
        node = txn.coordinators.node(self._client, request.coordinator, request.key, now)
        if node is None:
            if not txn.coordinators.find(self._client, request.coordinator, request.key, now,
                                         lambda error: txn.handle_find_coordinator(request, error, self._clock())):
                return 10.0
            txn.request_sent()
            return _MAX_POLL_MS
        if not self._client.ready(node, now):
            return max(5.0, self._client.connection_delay_ms(node, now))
        txn.request_sent()
        request.send(self._client, node, lambda: txn.handle_response(request, self._clock()))
        return _MAX_POLL_MS

    # -- metadata and producer id ---------------------------------------------

    def _maybe_update_metadata(self, now: float) -> float:
        if self._metadata_in_flight:
            return _MAX_POLL_MS
        due = self._metadata.due_in_ms(now)
        if due > 0:
            return due
        node = self._client.least_loaded_node(now)
        if node is None or not self._client.ready(node, now):
            return 10.0  # connecting: come back soon
        self._metadata_in_flight = True
        body = self._metadata.ask_operations(self._metadata.request_body(now),
                                             self._client.api_version(node, ApiKey.METADATA))
        self._client.send(node, ApiKey.METADATA, body, self._on_metadata)
        return _MAX_POLL_MS

    def _on_metadata(self, response: ClientResponse[MetadataResponse]) -> None:
        self._metadata_in_flight = False
        if response.error is not None:
            self._metadata.failed_update(self._clock())
            return
        self._metadata.update(response.reply(), self._clock())
        self._client.set_nodes(self._metadata.nodes)

    def _maybe_describe_topics(self, now: float) -> float:
        """Ask for the max.message.bytes of the topics send_arrow waits for: one
        DescribeConfigs per topic per producer (the answer is kept with the metadata)."""
        if self._limits_in_flight:
            return _MAX_POLL_MS  # its answer wakes the round
        if now < self._limits_not_before:
            return self._limits_not_before - now
        node = self._client.least_loaded_node(now)
        if node is None or not self._client.ready(node, now):
            return 10.0
        topics = sorted(self._metadata.limits_wanted)
        if self._client.api_version(node, ApiKey.DESCRIBE_CONFIGS) is None:
            self._limits_unknown(topics, "the broker does not offer DescribeConfigs v1-v4")
            return _MAX_POLL_MS
        self._limits_in_flight = True
        body = DescribeConfigsRequest([DescribeConfigsResource(TOPIC_RESOURCE, t, [MAX_MESSAGE_BYTES]) for t in topics])
        self._client.send(node, ApiKey.DESCRIBE_CONFIGS, body, self._on_describe_topics)
        return _MAX_POLL_MS

    def _on_describe_topics(self, response: ClientResponse[DescribeConfigsResponse]) -> None:
        self._limits_in_flight = False
        if response.error is not None:  # the connection's: asked again after a backoff
            self._limits_not_before = self._clock() + self._config.retry_backoff_ms
            return
        learnt: dict[str, int | None] = {}
        denied = []
        for result in response.reply().results:
            error = error_for_code(result.error_code, f"DescribeConfigs of topic {result.resource_name!r}")
            if error is None:
                value = next((c.value for c in result.configs if c.name == MAX_MESSAGE_BYTES), None)
                learnt[result.resource_name] = int(value) if value is not None else None
            elif isinstance(error, (TopicAuthorizationFailedError, ClusterAuthorizationFailedError)):
                denied.append(result.resource_name)
            elif error.retriable:
                self._limits_not_before = self._clock() + self._config.retry_backoff_ms
            else:
                learnt[result.resource_name] = None
                log.warning("%s; a record too large for this topic is not refused before sending: the broker "
                            "refuses it and its write fails", error)
        if denied:
            self._limits_unknown(denied, "the principal may not describe their settings (DescribeConfigs)")
        self._metadata.set_message_limits(learnt)

    def _limits_unknown(self, topics: list[str], why: str) -> None:
        """Fall back to the broker's refusal for ``topics``' records too large, saying so once."""
        if not self._limits_denied_logged:
            self._limits_denied_logged = True
            log.warning("max.message.bytes of topics %s unknown: %s. A record too large for such a topic is "
                        "not refused before sending: the broker refuses it and its write fails", topics, why)
        self._metadata.set_message_limits(dict.fromkeys(topics))

    def _ensure_producer_id(self, now: float) -> bool:
        """Whether batches may be drained; asks for a producer id when one is needed."""
        txn = self._txn
        txn.maybe_bump_epoch()
        if txn.has_producer_id:
            return True
        if not txn.should_init_producer_id(now):
            return False  # asked already, backing off, or failed for good
        node = self._client.least_loaded_node(now)
        if node is None or not self._client.ready(node, now):
            return False
        self._client.send(node, ApiKey.INIT_PRODUCER_ID, txn.init_producer_id_request(), self._on_producer_id)
        return False

    def _on_producer_id(self, response: ClientResponse[InitProducerIdResponse]) -> None:
        self._txn.handle_init_producer_id_response(response.body, response.error, self._clock())
        if self._txn.fatal_error is not None:
            self.fatal_error = self._txn.fatal_error
            self._running = False
            self._force_close = True

    # -- produce --------------------------------------------------------------

    def _send_produce(self, node: int, batches: list[ProducerBatch]) -> None:
        topics: dict[str, list[PartitionProduceData]] = {}
        for batch in batches:
            topics.setdefault(batch.topic, []).append(
                PartitionProduceData(batch.partition, batch.to_wire(self._txn.transactional)))
            self._in_flight_batches.add(batch)
        body = ProduceRequest(self._txn.transactional_id, self._config.acks, self._config.request_timeout_ms,
                              [TopicProduceData(t, p) for t, p in topics.items()])
        self._metadata.touch(topics, self._clock())
        by_tp = {b.tp: b for b in batches}
        self._metrics.request_sent(batches)
        acks0 = self._config.acks == 0
        self._client.send(node, ApiKey.PRODUCE, body, lambda r: self._on_produce(r, by_tp), expect_response=not acks0,
                          max_version=self._txn.produce_max_version())

    def _on_produce(self, response: ClientResponse[ProduceResponse], batches: dict[tuple[str, int], ProducerBatch]) -> None:
        now = self._clock()
        if response.error is None and response.body is not None:
            self._metrics.response_received(response.request_latency_ms)
        if response.error is not None:
            for batch in batches.values():
                self._retry_or_fail(batch, response.error, now)
            self._metadata.request_update()
            return
        if response.body is None:  # acks=0: written is all we will ever know
            for batch in batches.values():
                self._succeed(batch, -1, -1)
            self._acc.completed(batches.values())
            return
        succeeded = []
        body: ProduceResponse = response.body
        for topic in body.responses:
            for part in topic.partition_responses:
                found = batches.pop((topic.name, part.index), None)
                if found is None:
                    continue
                batch = found
                code = part.error_code
                if code == NO_ERROR:
                    self._succeed(batch, part.base_offset, part.log_append_time_ms)
                    succeeded.append(batch)
                elif code == DuplicateSequenceNumberError.code:
                    # Written by an earlier attempt whose answer was lost: a success whose
                    # offset this answer does not tell.
                    self._succeed(batch, -1, -1)
                    succeeded.append(batch)
                elif code in _TOO_LARGE and batch.record_count > 1:
                    self._split(batch, now)
                else:
                    message = part.error_message or ""
                    if code in _TOO_LARGE:
                        message = (f"a record batch of {batch.wire_size} bytes holding one record is larger than "
                                   "the topic's max.message.bytes (or the broker's message.max.bytes) allows")
                    error = failure_for_code(code, f"{batch.topic}-{batch.partition}: {message}".rstrip(": "))
                    self._retry_or_fail(batch, error, now)
        self._acc.completed(succeeded)  # their memory, in one go
        for batch in batches.values():  # the broker did not mention these: treat as lost
            self._retry_or_fail(batch, UnknownServerError("no response for this partition"), now)

    def _split(self, batch: ProducerBatch, now: float) -> None:
        """A batch of several records refused as too large goes back as smaller batches
        ahead of the partition's others, as Java's producer does (its records' sequences
        with them); a single record still too large is that record's error."""
        self._in_flight_batches.discard(batch)
        pieces = batch.split(self._config.compression_level, lambda whole: self._acc.completed((whole,)))
        log.info("%s refused as too large: sent again as %d batches", batch, len(pieces))
        self._txn.handle_split(batch, pieces)
        for piece in pieces:  # their orders keep them in their records' order
            self._acc.reenqueue(piece, now, backoff=False)  # no retry: Java waits for none either

    def _succeed(self, batch: ProducerBatch, base_offset: int, log_append_time: int) -> None:
        """Acknowledged: the caller releases its memory (once per response, not per batch)."""
        self._in_flight_batches.discard(batch)
        self._txn.handle_completed_batch(batch)
        batch.complete(base_offset, log_append_time, None)

    def _retry_or_fail(self, batch: ProducerBatch, error: Exception, now: float) -> None:
        """A batch on the wire was refused or lost: back to the accumulator while retries
        and delivery.timeout.ms allow and the TransactionManager says it may be retried."""
        self._in_flight_batches.discard(batch)
        in_time = now - batch.created_ms < self._config.delivery_timeout_ms
        if (in_time and batch.attempts < self._config.retries and not self._force_close
                and self._txn.can_retry(batch, error)):
            log.debug("retrying %s after %s", batch, error)
            self._metrics.batch_retried(batch)
            if is_invalid_metadata(error):
                self._metadata.request_update()
            self._txn.handle_retry(batch)
            self._acc.reenqueue(batch, now)
            return
        self._txn.handle_failed_batch(batch, error=error)
        if isinstance(error, KafkaTimeoutError) and not in_time:
            error = KafkaTimeoutError(f"{batch.topic}-{batch.partition}: delivery.timeout.ms "
                                      f"({self._config.delivery_timeout_ms}) passed; last error: {error}")
        self._fail(batch, error)

    def _fail(self, batch: ProducerBatch, error: Exception) -> None:
        self._metrics.batch_failed(batch)
        self._in_flight_batches.discard(batch)
        # Callbacks first, then out of the incomplete set: flush() waits only for the
        # batches incomplete when it starts, and must not return before these callbacks.
        batch.complete(-1, -1, error)
        self._acc.completed((batch,))
