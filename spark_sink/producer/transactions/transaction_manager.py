"""TransactionManager: the producer's identity (producer id and epoch) and its
transactions, driven by the Sender. Named after the Java producer's class, and shaped
like it; its parts live beside it:

- :mod:`~spark_sink.producer.transactions.transaction_states`: the state machine, a table of
  transitions, and which application calls each state allows;
- :mod:`~spark_sink.producer.partition_sequences`: per-partition sequences and in-flight
  limits, and the epoch bumps a refused batch calls for (the idempotent producer);
- :mod:`~spark_sink.producer.transactions.coordinator_requests`: the queue of requests to coordinators,
  with :mod:`~spark_sink.client.coordinators` finding them; the request bodies are
  :mod:`spark_sink.protocol.txn_coordinator`.

Transactions (transactional.id set), as Java's: init_transactions() asks the transaction
coordinator for the producer id under the transactional id, which bumps its epoch and so
fences every earlier producer with that id (aborting the transaction it left open). Each
transaction speaks the protocol the cluster finalizes when it begins (``v2``). Protocol
v1: each partition is added (AddPartitionsToTxn) before its first batch is drained;
offsets are added with AddOffsetsToTxn and committed, pending, with TxnOffsetCommit;
EndTxn commits or aborts. Protocol v2 (KIP-890 part 2, transaction.version 2): Produce
v12 and TxnOffsetCommit v5 add their partitions themselves, and EndTxn v5 bumps the epoch,
answering with the identity the next transaction uses. A failure inside a transaction makes it
abortable (ABORTABLE_ERROR: abort, then go on); being fenced or unauthorised is fatal. A
transaction may also be flushed and left open (PREPARED_TRANSACTION) for another process
to end, given the transactional id, producer id and epoch (two-phase commit).

The thread doing the Sender's work (holding its I/O lock) calls this class; the
application's threads call only the transaction methods (begin, commit, ...), which take
``_lock``, and maybe_add_partition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping

from spark_sink.client.coordinators import Coordinators
from spark_sink.client.errors import (
    AbortableTransactionError,
    FatalTransactionError,
    IllegalStateError,
    TransactionError,
)
from spark_sink.producer.batch import ProducerBatch, TopicPartition
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.partition_sequences import PartitionSequences
from spark_sink.producer.transactions.coordinator_requests import (
    CoordinatorRequest,
    CoordinatorRequests,
    TransactionalResult,
    TxnRequest,
)
from spark_sink.producer.transactions.transaction_states import CALL_STATES, HAS_PRODUCER_ID, Event, State, next_state
from spark_sink.protocol import kmsg
from spark_sink.protocol.apis import V1_MAX_VERSIONS, ApiKey
from spark_sink.protocol.error_codes import (
    ClusterAuthorizationFailedError,
    InvalidProducerEpochError,
    InvalidProducerIdMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    OperationNotAttemptedError,
    ProducerFencedError,
    TransactionalIdAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
    error_for_code,
    is_retriable,
)
from spark_sink.protocol.txn_coordinator import (
    GROUP_COORDINATOR,
    TRANSACTION_COORDINATOR,
    add_offsets_body,
    by_topic,
    end_txn_body,
    partition_error,
    txn_offset_commit_body,
)

log = logging.getLogger(__name__)

# Errors from a coordinator that end a transactional producer: fenced by a newer one with
# its id, not allowed, or holding a state the coordinator does not know.
_FATAL_TXN_ERRORS = (ProducerFencedError, InvalidProducerEpochError, TransactionalIdAuthorizationFailedError,
                     ClusterAuthorizationFailedError, InvalidTxnStateError, InvalidProducerIdMappingError,
                     InvalidTransactionTimeoutError, UnsupportedVersionError)
# The errors of a refused batch that end it too, as Java classifies them (KIP-1050). Any
# other makes only the transaction abortable: INVALID_PRODUCER_EPOCH on Produce is what a
# transaction aborted by its coordinator (transaction.timeout.ms) causes, and the producer
# goes on after abort_transaction() under a bumped epoch (KIP-588).
_FATAL_PRODUCE_ERRORS = (ProducerFencedError, TransactionalIdAuthorizationFailedError,
                         ClusterAuthorizationFailedError, UnsupportedVersionError)


class TransactionManager:
    """The producer's identity and transactions; the per-partition sequences and the
    coordinator requests it drives."""

    def __init__(self, config: ProducerConfig) -> None:
        self.idempotent = config.enable_idempotence
        self._sequences = PartitionSequences(self.idempotent, config.max_in_flight_requests_per_connection)
        self._retry_backoff_ms = config.retry_backoff_ms
        # Without idempotence there is no identity to get: batches may go at once.
        self.state = State.UNINITIALIZED if self.idempotent else State.READY
        self._init_not_before = 0.0
        self.fatal_error: Exception | None = None
        # Transactions
        self.transactional_id = config.transactional_id
        self.transactional = self.transactional_id is not None
        self._transaction_timeout_ms = config.transaction_timeout_ms
        self._lock = threading.RLock()
        self._requests = CoordinatorRequests(config.retry_backoff_ms)
        self._in_transaction: set[TopicPartition] = set()  # added to the open transaction
        self._to_add: set[TopicPartition] = set()  # sent to, not yet in an AddPartitionsToTxn
        # The coordinator holds the open transaction: a partition or offsets were added to
        # it. Until then it knows of none, and EndTxn is answered INVALID_TXN_STATE: an
        # empty transaction ends here, without a request (Java's transactionStarted).
        self._started = False
        self.abortable_error: Exception | None = None
        # The last init, commit or abort call and its result: one that timed out
        # (max.block.ms) goes on in the Sender, and calling it again waits for that same
        # result, until a wait returns its outcome (Java's pendingTransition).
        self._pending: tuple[str, TransactionalResult] | None = None
        # The transaction protocol the cluster speaks (the Sender's network client tells),
        # and whether the current transaction speaks v2: fixed when it begins, as Java does.
        self.transaction_version: Callable[[], int] = lambda: 0
        self.v2 = False

    # -- the state machine ----------------------------------------------------

    def _transition(self, event: Event) -> None:
        target = next_state(self.state, event)
        log.debug("transaction manager: %s --%s--> %s", self.state.name, event.name, target.name)
        self.state = target

    @property
    def _identity(self) -> tuple[int, int]:
        return self._sequences.identity

    @property
    def producer_id(self) -> int:
        return self._identity[0]

    @property
    def producer_epoch(self) -> int:
        return self._identity[1]

    @property
    def has_producer_id(self) -> bool:
        """Batches may be drained: the identity they need (if any) is known."""
        return self.state in HAS_PRODUCER_ID

    @property
    def can_bump_epoch(self) -> bool:
        """An idempotent producer bumps its own epoch, which every broker version accepts; a
        transactional one gets a new epoch from its coordinator, after an abort."""
        return self.idempotent and not self.transactional

    # -- producer id ----------------------------------------------------------

    def should_init_producer_id(self, now: float) -> bool:
        """An InitProducerId request is due now (a transactional producer asks for its
        producer id in init_transactions(), through its coordinator)."""
        return self.state is State.UNINITIALIZED and not self.transactional and now >= self._init_not_before

    def init_producer_id_request(self) -> kmsg.InitProducerIdRequest:
        """The InitProducerId request to send now (no transactional id: idempotence only)."""
        self._transition(Event.INIT_PRODUCER_ID_SENT)
        return kmsg.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000)

    def handle_init_producer_id_response(self, body: kmsg.InitProducerIdResponse | None, error: Exception | None,
                                         now: float) -> None:
        """The answer to InitProducerId: the new identity, a retry later, or a fatal error."""
        if error is None and body is not None:
            error = error_for_code(body.error_code, "InitProducerId")
        if error is None:
            assert body is not None
            self._sequences.identity = (body.producer_id, body.producer_epoch)
            log.info("producer id %s epoch %s", *self._identity)
            self._transition(Event.PRODUCER_ID_RECEIVED)
        elif is_retriable(error):
            log.info("InitProducerId failed, trying again: %s", error)
            self._init_not_before = now + self._retry_backoff_ms
            self._transition(Event.INIT_PRODUCER_ID_FAILED)
        else:
            self.transition_to_fatal(error)

    def transition_to_fatal(self, error: Exception) -> None:
        """Nothing more can be sent: the producer fails what it holds with ``error``."""
        if self.state is not State.FATAL_ERROR:
            log.error("producer failed: %s", error)
            self.fatal_error = error
            self._transition(Event.FATAL)

    def maybe_bump_epoch(self) -> None:
        """Bump the epoch if a refused batch asked for it (Java's
        bumpIdempotentEpochAndResetIdIfNeeded), once for every request since the last."""
        if not self._sequences.bump_required or self.state is not State.READY or self.transactional:
            return  # (a transactional producer's new epoch comes from its coordinator)
        self._transition(Event.EPOCH_BUMPED if self._sequences.bump_epoch() else Event.EPOCH_EXHAUSTED)

    # -- batches (see partition_sequences) -------------------------------------

    def can_send(self, tp: TopicPartition) -> bool:
        """May the partition's next batch be drained now? (In-flight limits, ordering and,
        in a transaction, the partition added to it.)"""
        if self.transactional and tp not in self._in_transaction:
            return False
        return self._sequences.can_send(tp)

    def prepare_batch(self, batch: ProducerBatch) -> None:
        """Called as a batch is drained: count it on the wire and, with idempotence, give it
        its producer id, epoch and sequence (kept if it already holds them)."""
        self._sequences.prepare_batch(batch)

    def can_retry(self, batch: ProducerBatch, error: Exception) -> bool:
        """Whether a batch refused with ``error`` may be sent again (the Sender checks
        retries and delivery.timeout.ms first)."""
        return self._sequences.can_retry(batch, error, self.can_bump_epoch, self.transactional)

    def handle_retry(self, batch: ProducerBatch) -> None:
        """A batch that was on the wire goes back to the accumulator for another attempt."""
        self._sequences.handle_retry(batch)

    def handle_split(self, batch: ProducerBatch, pieces: list[ProducerBatch]) -> None:
        """A batch on the wire, refused as too large, goes back as smaller ``pieces``."""
        self._sequences.handle_split(batch, pieces)

    def handle_completed_batch(self, batch: ProducerBatch) -> None:
        """A batch on the wire was acknowledged (or recognised as a duplicate)."""
        self._sequences.handle_completed_batch(batch)

    def handle_failed_batch(self, batch: ProducerBatch, on_wire: bool = True, error: Exception | None = None) -> None:
        """A batch will not be sent again: refused for good, out of retries or of
        delivery.timeout.ms (``on_wire`` False: it expired in the accumulator). In a
        transaction, the transaction cannot commit any more: it becomes abortable, or the
        producer fatal if ``error`` says it was fenced."""
        if self.transactional and error is not None:
            with self._lock:
                self._transaction_failed(error, isinstance(error, _FATAL_PRODUCE_ERRORS), produce=True)
        self._sequences.handle_failed_batch(batch, on_wire)

    # -- transactions: the application's calls --------------------------------

    @property
    def _txn_id(self) -> str:
        """The transactional.id, which every transaction request names (_check_call lets
        no transaction call in without it)."""
        if self.transactional_id is None:
            raise IllegalStateError("transactions need transactional.id to be set")
        return self.transactional_id

    def _check_call(self, call: str) -> None:
        """Raise unless ``call`` may start in the current state (with ``_lock`` held)."""
        if self.transactional_id is None:
            raise IllegalStateError(f"{call}() needs transactional.id to be set")
        if self._pending is not None and self._pending[1].retry_due and self._pending[0] != call:
            # The state it left (INITIALIZING, COMMITTING_TRANSACTION, ...) allows no other
            # call until it is retried to its outcome: Java's producer refuses them too.
            raise IllegalStateError(f"{call}() is not allowed: the previous {self._pending[0]}() timed out and "
                                    f"must be called again until it finishes")
        if self.state in CALL_STATES[call]:
            return
        self._raise_failure(call)
        raise IllegalStateError(f"{call}() is not allowed while the producer is in state {self.state.name}")

    def _raise_failure(self, call: str) -> None:
        """Raise the error behind an abortable or fatal state."""
        if self.state is State.FATAL_ERROR:
            raise self.fatal_error if isinstance(self.fatal_error, TransactionError) else FatalTransactionError(
                f"{call}(): the producer failed earlier and can only be closed: {self.fatal_error}", self.fatal_error)
        if self.state is State.ABORTABLE_ERROR:
            raise AbortableTransactionError(
                f"{call}(): the transaction failed and must be aborted first: {self.abortable_error}",
                self.abortable_error)

    def _retried(self, call: str) -> TransactionalResult | None:
        """The result of an earlier ``call`` that timed out, if this call retries it (with
        ``_lock`` held); :meth:`_check_call` refuses a call of another kind meanwhile."""
        if self._pending is None:
            return None
        pending, result = self._pending
        if not result.retry_due:
            self._pending = None
            return None
        return result if pending == call else None

    def _pend(self, call: str, result: TransactionalResult) -> TransactionalResult:
        self._pending = (call, result)
        return result

    def init_transactions(self) -> TransactionalResult:
        """Ask the coordinator for the producer id under transactional.id: the epoch it
        gives fences every earlier producer with that id and aborts its open transaction.
        After a timeout, calling it again waits for the same request."""
        with self._lock:
            if (retried := self._retried("init_transactions")) is not None:
                return retried
            self._check_call("init_transactions")
            self._transition(Event.INIT_PRODUCER_ID_SENT)
            return self._pend("init_transactions", self._enqueue_init(-1, -1))

    def _enqueue_init(self, producer_id: int, epoch: int,
                      result: TransactionalResult | None = None) -> TransactionalResult:
        self._new_transaction()
        result = result or TransactionalResult()
        body = kmsg.InitProducerIdRequest(transactional_id=self._txn_id,
                                          transaction_timeout_ms=self._transaction_timeout_ms,
                                          producer_id=producer_id, producer_epoch=epoch)
        self._requests.append(CoordinatorRequest(ApiKey.INIT_PRODUCER_ID, TRANSACTION_COORDINATOR, self._txn_id, body,
                                                 self._on_init_producer_id, result=result))
        return result

    def begin_transaction(self) -> None:
        with self._lock:
            self._check_call("begin_transaction")
            self._new_transaction()
            self.v2 = self.transaction_version() >= 2
            self._transition(Event.BEGIN)

    def _new_transaction(self) -> None:
        """Forget the partitions of the transaction before."""
        self._in_transaction.clear()
        self._to_add.clear()
        self._started = False

    def ensure_sendable(self) -> None:
        """Raise unless records may be sent now: inside an open transaction."""
        if self.state is not State.IN_TRANSACTION:
            with self._lock:
                if self.state is State.IN_TRANSACTION:
                    return
                self._raise_failure("send")
                raise IllegalStateError(f"send() with transactional.id set needs an open transaction "
                                        f"(begin_transaction()); the producer is in state {self.state.name}")

    def maybe_add_partition(self, tp: TopicPartition) -> None:
        """The open transaction will hold records of ``tp``: add it before they are drained."""
        if tp in self._in_transaction or tp in self._to_add:
            return
        self._add({tp})

    def maybe_add_partitions(self, topic: str, partitions: Iterable[int]) -> None:
        """maybe_add_partition for each of ``partitions`` of ``topic`` (a send_arrow chunk's):
        the ones already in the transaction or on their way found by set operations, not by
        a Python step per partition."""
        tps = {(topic, p) for p in partitions}
        tps -= self._in_transaction
        if self._to_add:
            tps -= self._to_add
        if tps:
            self._add(tps)

    def _add(self, tps: set[TopicPartition]) -> None:
        with self._lock:
            self.ensure_sendable()
            if self.v2:
                # Produce v12 adds them: the transaction is open at the coordinator once its
                # first batch is written, and must be ended then (Java sets it here too).
                self._in_transaction |= tps
                self._started = True
            else:
                self._to_add |= tps

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, tuple[int, str | None]],
                                    group_id: str) -> TransactionalResult:
        """Commit ``offsets`` for ``group_id`` as part of the open transaction."""
        with self._lock:
            self._check_call("send_offsets_to_transaction")
            result = TransactionalResult()
            pid, epoch = self._identity
            commit = CoordinatorRequest(ApiKey.TXN_OFFSET_COMMIT, GROUP_COORDINATOR, group_id,
                                        txn_offset_commit_body(self._txn_id, group_id, pid, epoch, offsets),
                                        self._on_txn_offset_commit, result=result,
                                        max_version=self._v1_max(ApiKey.TXN_OFFSET_COMMIT))
            if self.v2:
                # TxnOffsetCommit v5 adds the group's offsets partition itself (no AddOffsetsToTxn).
                self._started = True
                self._requests.append(commit)
                return result

            def added(body: kmsg.AddOffsetsToTxnResponse) -> Exception | None:
                error = error_for_code(body.error_code, f"AddOffsetsToTxn for group {group_id}")
                if error is None:
                    self._started = True  # the group's offsets partition is in the transaction
                return error

            # Then the offsets themselves, to the group's coordinator: that answer settles ``result``.
            self._requests.append(CoordinatorRequest(
                ApiKey.ADD_OFFSETS_TO_TXN, TRANSACTION_COORDINATOR, self._txn_id,
                add_offsets_body(self._txn_id, pid, epoch, group_id), added, result=result, then=commit))
            return result

    def prepare_transaction(self) -> tuple[str, int, int] | None:
        """Leave the (flushed) transaction open for another process to end; its identity.
        None if it holds nothing: the coordinator knows of no transaction to end, so it
        ends here and the producer may begin the next one."""
        with self._lock:
            self._check_call("prepare_transaction")
            if not self._started and not self._to_add:
                self._transition(Event.BEGIN_COMMIT)
                self._ended(TransactionalResult())
                return None
            self._transition(Event.PREPARE)
            return self._txn_id, self._identity[0], self._identity[1]

    def end_transaction(self, commit: bool) -> TransactionalResult:
        """EndTxn: commit or abort the open transaction (its records already flushed).
        After a timeout, calling it again waits for the same end (it may have happened)."""
        call = "commit_transaction" if commit else "abort_transaction"
        with self._lock:
            if (retried := self._retried(call)) is not None:
                return retried
            self._check_call(call)
            self._transition(Event.BEGIN_COMMIT if commit else Event.BEGIN_ABORT)
            self._to_add.clear()
            result = self._pend(call, TransactionalResult())
            if not commit and isinstance(self.abortable_error, InvalidProducerEpochError):
                # The coordinator aborted the transaction itself (transaction.timeout.ms) and
                # bumped the epoch: EndTxn under the old one is refused as fenced. InitProducerId
                # under it is how a producer goes on (KIP-360, KIP-588): the coordinator aborts
                # whatever is still open and answers with the epoch to use.
                self._transition(Event.INIT_PRODUCER_ID_SENT)
                return self._enqueue_init(*self._identity, result)
            # _ended() settles ``result``, after a new epoch if the transaction needs one.
            self._requests.append(CoordinatorRequest(ApiKey.END_TXN, TRANSACTION_COORDINATOR, self._txn_id,
                                                     end_txn_body(self._txn_id, *self._identity, commit),
                                                     lambda body: self._on_end_txn(body, result), result=result,
                                                     settles=False, max_version=self._v1_max(ApiKey.END_TXN)))
            return result

    def _v1_max(self, api_key: ApiKey) -> int | None:
        """The highest version of ``api_key`` the current transaction may use (None: any)."""
        return None if self.v2 else V1_MAX_VERSIONS[api_key]

    def produce_max_version(self) -> int | None:
        """The highest Produce version the current batches may go in (None: any): a
        transaction of protocol v1 stops below v12, which would add partitions itself."""
        return V1_MAX_VERSIONS[ApiKey.PRODUCE] if self.transactional and not self.v2 else None

    # -- transactions: the Sender's side --------------------------------------

    @property
    def coordinators(self) -> Coordinators:
        """Where the coordinators of the queued requests are."""
        return self._requests.coordinators

    def next_request(self, now: float) -> TxnRequest | None:
        """The coordinator request to send now, if any (one at a time)."""
        with self._lock:
            requests = self._requests
            if requests.in_flight:
                return None
            if (self._to_add and self.state is State.IN_TRANSACTION
                    and not requests.holds(ApiKey.ADD_PARTITIONS_TO_TXN)):
                requests.push_first(self._add_partitions_request())
            while (head := requests.head) is not None and head.api_key == ApiKey.END_TXN and not self._started:
                # Nothing was added (the requests before it have been answered): the
                # coordinator holds no transaction, so it ends here.
                self._ended(requests.pop_head().result)
            return requests.due(now)

    def held_up_by(self) -> str | None:
        """The retriable error the queued requests are being retried on, if any (a call
        waits behind every request queued before its own)."""
        with self._lock:
            return self._requests.retrying()

    def request_sent(self) -> None:
        """The Sender sent the due request, or a FindCoordinator for it."""
        self._requests.in_flight = True

    def _add_partitions_request(self) -> TxnRequest:
        partitions, self._to_add = self._to_add, set()
        topics = by_topic(sorted(partitions))
        pid, epoch = self._identity
        body = kmsg.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self._txn_id, v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=[kmsg.AddPartitionsToTxnTopic(t, ps) for t, ps in topics.items()])
        return CoordinatorRequest(ApiKey.ADD_PARTITIONS_TO_TXN, TRANSACTION_COORDINATOR, self._txn_id, body,
                                  self._on_add_partitions, partitions=partitions)

    def handle_find_coordinator(self, request: TxnRequest, error: Exception | None, now: float) -> None:
        """The coordinator of ``request`` was found (:attr:`coordinators` knows it), or
        ``error`` says why not."""
        with self._lock:
            if error is None:
                self._requests.in_flight = False
            else:
                self._request_failed(request, self._requests.failed(request, error, now))

    def handle_response(self, request: TxnRequest, now: float) -> None:
        """The answer to ``request`` is in: done, retried later, or failing its transaction."""
        with self._lock:
            self._request_failed(request, self._requests.answered(request, now))

    def _request_failed(self, request: TxnRequest, error: Exception | None) -> None:
        """``request`` failed for good with ``error`` (None: it did not): so does its
        transaction, or the producer."""
        if error is None:
            return
        if request.api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            self._to_add |= request.partitions - self._in_transaction
        failure = self._transaction_failed(error, request.api_key == ApiKey.INIT_PRODUCER_ID)
        if request.result is not None:
            request.result.done(failure)

    def _transaction_failed(self, error: Exception, fatal: bool = False, produce: bool = False) -> TransactionError:
        """The open transaction cannot commit: abortable, or fatal for the producer (a
        refused batch, ``produce``, is fatal only if ``fatal`` says so)."""
        if fatal or not produce and isinstance(error, _FATAL_TXN_ERRORS):
            failure = FatalTransactionError(
                f"transactional.id {self.transactional_id!r}: "
                + ("fenced by a newer producer with the same transactional.id: "
                   if isinstance(error, (ProducerFencedError, InvalidProducerEpochError)) else "")
                + f"{error}; the producer can only be closed", error)
            self.transition_to_fatal(failure)
            return failure
        if self.state in (State.IN_TRANSACTION, State.COMMITTING_TRANSACTION, State.ABORTABLE_ERROR):
            self.abortable_error = self.abortable_error or error
            self._transition(Event.ABORTABLE)
        return AbortableTransactionError(
            f"transactional.id {self.transactional_id!r}: the transaction failed and must be aborted: {error}", error)

    # -- transactions: answers ------------------------------------------------

    def _on_init_producer_id(self, body: kmsg.InitProducerIdResponse) -> Exception | None:
        error = error_for_code(body.error_code, f"InitProducerId for transactional.id {self.transactional_id!r}")
        if error is not None:
            return error
        self._sequences.identity = (body.producer_id, body.producer_epoch)
        self.abortable_error = None
        self._sequences.bump_required = False
        log.info("transactional.id %r: producer id %s epoch %s", self.transactional_id, *self._identity)
        self._transition(Event.PRODUCER_ID_RECEIVED)
        return None

    def _on_add_partitions(self, body: kmsg.AddPartitionsToTxnResponse) -> Exception | None:
        first: Exception | None = None
        for topic in body.results_by_topic_v3_and_below:
            for part in topic.results_by_partition:
                tp = (topic.name, part.partition_index)
                error = error_for_code(part.partition_error_code, f"AddPartitionsToTxn {tp[0]}-{tp[1]}")
                if error is None:
                    self._in_transaction.add(tp)
                    self._started = True
                elif first is None or isinstance(first, OperationNotAttemptedError):
                    first = error
        return first

    def _on_txn_offset_commit(self, body: kmsg.TxnOffsetCommitResponse) -> Exception | None:
        unknown = sorted({t.name for t in body.topics for p in t.partitions
                          if p.error_code == UnknownTopicOrPartitionError.code})
        if unknown:
            # Every topic the coordinator does not know, by name: the error the call ends
            # with if they stay unknown (CoordinatorRequests.failed).
            return UnknownTopicOrPartitionError(f"topic{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}")
        return partition_error(body, "TxnOffsetCommit")

    def _on_end_txn(self, body: kmsg.EndTxnResponse, result: TransactionalResult) -> Exception | None:
        error = error_for_code(body.error_code, f"EndTxn for transactional.id {self.transactional_id!r}")
        if error is None:
            if body.producer_id >= 0:
                # Protocol v2: the coordinator bumped the epoch (or, the epoch exhausted, gave
                # a new producer id); the next transaction's sequences start at 0 under it.
                self._sequences.identity = (body.producer_id, body.producer_epoch)
                self._sequences.bump_required = False
                log.debug("transactional.id %r: producer id %s epoch %s", self.transactional_id, *self._identity)
            self._ended(result)
        return error

    def _ended(self, result: TransactionalResult | None) -> None:
        """The transaction is over; ``result`` is the call waiting for that, if any. After
        an abort that left a sequence gap, the coordinator gives a new epoch first
        (KIP-360), so that sequences start again at 0."""
        self._in_transaction.clear()
        aborting = self.state is State.ABORTING_TRANSACTION
        # (Under protocol v2, EndTxn gave the new epoch already.) A cluster that moved to
        # protocol v2 during a v1 transaction gets a new epoch before the first v2 one, as
        # Java's producer does (its clientSideEpochBumpRequired).
        if not self.v2 and (aborting and self._sequences.needs_new_epoch or self.transaction_version() >= 2):
            self._transition(Event.INIT_PRODUCER_ID_SENT)
            self._enqueue_init(*self._identity, result)
            return
        self.abortable_error = None
        self._transition(Event.ENDED)
        if result is not None:
            result.done()
