"""TransactionManager: the producer id and epoch, per-partition sequences and in-flight
limits, and what to do when a broker refuses a sequenced batch.

Named after the Java producer's class, and shaped like it: a state machine whose
transitions are a table (:data:`TRANSITIONS`), driven by the Sender. It serves the
idempotent producer (and the in-flight limits of every producer) and transactions.

Transactions (transactional.id set), as Java's: init_transactions() asks the transaction
coordinator for the producer id under the transactional id, which bumps its epoch and so
fences every earlier producer with that id (aborting the transaction it left open). Within
a transaction, each partition is added (AddPartitionsToTxn) before its first batch is
drained; offsets are added with AddOffsetsToTxn and committed, pending, with
TxnOffsetCommit; EndTxn commits or aborts. The requests to coordinators wait in
``_queue``, one in flight at a time; the Sender sends them (finding the coordinator
first) and hands back the answers. A failure inside a transaction makes it abortable
(ABORTABLE_ERROR: abort, then go on); being fenced or unauthorised is fatal. A
transaction may also be flushed and left open (PREPARED_TRANSACTION) for another process
to end, given the transactional id, producer id and epoch (two-phase commit).

Idempotence, as the broker sees it: it keeps the last five batches of each producer id and
epoch per partition, appends a batch only if its sequence follows the last one, and
answers a batch it already has as written. So at most five batches per partition are in
flight; sequences are given when a batch is first drained and kept across retries, so a
retried batch the broker already appended is acknowledged again instead of being written
twice; after a failure a partition sends one batch at a time until the retried batch is
through, so order is never inverted. And until a partition's first batch under a producer
id and epoch is acknowledged, it is sent alone: a broker that holds no state for that
producer on the partition appends whatever sequence comes first, so a batch pipelined
behind a refused first one (NOT_LEADER_OR_FOLLOWER, on a topic just created) would be
written before it.

When a partition's sequences can no longer go on (a sequenced batch failed and left a gap,
or the broker lost or fenced the producer's state there), the epoch is bumped, as Java's
idempotent producer does (KIP-360): the broker takes a higher epoch starting again at
sequence 0. The partitions that need it start over under the new epoch as soon as none of
their batches is on the wire, their unacknowledged batches numbered again in order; the
others keep their current sequences until every batch they hold a sequence for is settled
(a retry of a batch whose answer was lost must reach the broker as the same batch, to be
recognised as written), then start at 0 too. An epoch that has reached its maximum is
replaced by a new producer id (InitProducerId).

The thread doing the Sender's work (holding its I/O lock) calls this class; the
application's threads call only the transaction methods (begin, commit, ...), which take
``_lock``, and maybe_add_partition.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from spark_sink.producer.batch import ProducerBatch, TopicPartition
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.errors import (
    AbortableTransactionError, FatalTransactionError, IllegalStateError, KafkaTimeoutError, TransactionError,
)
from spark_sink.protocol.errors import (
    ClusterAuthorizationFailedError, CoordinatorNotAvailableError, InvalidProducerEpochError,
    InvalidProducerIdMappingError, InvalidTransactionTimeoutError, InvalidTxnStateError, KafkaConnectionError,
    NotCoordinatorError, OperationNotAttemptedError, OutOfOrderSequenceNumberError, ProducerFencedError,
    TransactionalIdAuthorizationFailedError, UnknownProducerIdError, UnsupportedVersionError, error_for_code,
)
from spark_sink.protocol.messages import ApiKey

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_PER_PARTITION = 5  # the batches per producer and partition a broker remembers
_SEQUENCE_MASK = 0x7FFFFFFF  # sequences wrap to 0 after the largest int32
_MAX_EPOCH = 0x7FFF
_NO_IDENTITY = (-1, -1)
# Errors saying the broker has no usable state for this producer id and epoch on the
# partition: an idempotent producer goes on under a bumped epoch.
_PRODUCER_STATE_ERRORS = (UnknownProducerIdError, InvalidProducerEpochError, ProducerFencedError)
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
# The coordinator a request went to is not (or no longer) the one: find it again.
COORDINATOR_MOVED = (NotCoordinatorError, CoordinatorNotAvailableError, KafkaConnectionError)
TRANSACTION_COORDINATOR, GROUP_COORDINATOR = 1, 0  # FindCoordinator key types


class State(Enum):
    """Where the producer's identity stands."""

    UNINITIALIZED = "UNINITIALIZED"  # no producer id: one is to be asked for
    INITIALIZING = "INITIALIZING"  # InitProducerId in flight
    READY = "READY"  # batches go out under the current producer id and epoch (transactional: none open)
    IN_TRANSACTION = "IN_TRANSACTION"
    PREPARED_TRANSACTION = "PREPARED_TRANSACTION"  # flushed, left open for another process to end
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"  # the transaction failed: only abort_transaction() goes on
    FATAL_ERROR = "FATAL_ERROR"  # the producer can only be closed


class Event(Enum):
    """What moves the state machine."""

    INIT_PRODUCER_ID_SENT = "INIT_PRODUCER_ID_SENT"
    PRODUCER_ID_RECEIVED = "PRODUCER_ID_RECEIVED"
    INIT_PRODUCER_ID_FAILED = "INIT_PRODUCER_ID_FAILED"  # retriably: ask again after a backoff
    EPOCH_BUMPED = "EPOCH_BUMPED"
    EPOCH_EXHAUSTED = "EPOCH_EXHAUSTED"  # the epoch cannot grow: a new producer id is needed
    BEGIN = "BEGIN"
    PREPARE = "PREPARE"
    BEGIN_COMMIT = "BEGIN_COMMIT"
    BEGIN_ABORT = "BEGIN_ABORT"
    ENDED = "ENDED"  # EndTxn answered
    ABORTABLE = "ABORTABLE"
    FATAL = "FATAL"


# State -> event -> next state. An event a state does not list is a bug: IllegalStateError.
TRANSITIONS: dict[State, dict[Event, State]] = {
    State.UNINITIALIZED: {Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING, Event.FATAL: State.FATAL_ERROR},
    State.INITIALIZING: {
        Event.PRODUCER_ID_RECEIVED: State.READY,
        Event.INIT_PRODUCER_ID_FAILED: State.UNINITIALIZED,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.READY: {
        Event.EPOCH_BUMPED: State.READY,
        Event.EPOCH_EXHAUSTED: State.UNINITIALIZED,
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,  # a transactional producer initialised again
        Event.BEGIN: State.IN_TRANSACTION,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.IN_TRANSACTION: {
        Event.PREPARE: State.PREPARED_TRANSACTION,
        Event.BEGIN_COMMIT: State.COMMITTING_TRANSACTION,
        Event.BEGIN_ABORT: State.ABORTING_TRANSACTION,
        Event.ABORTABLE: State.ABORTABLE_ERROR,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.PREPARED_TRANSACTION: {
        Event.BEGIN_COMMIT: State.COMMITTING_TRANSACTION,
        Event.BEGIN_ABORT: State.ABORTING_TRANSACTION,
        # Ended by another process: initialising again fences and starts afresh.
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.COMMITTING_TRANSACTION: {
        Event.ENDED: State.READY,
        Event.ABORTABLE: State.ABORTABLE_ERROR,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.ABORTING_TRANSACTION: {
        Event.ENDED: State.READY,
        Event.INIT_PRODUCER_ID_SENT: State.INITIALIZING,  # aborted with a sequence gap: new epoch
        Event.FATAL: State.FATAL_ERROR,
    },
    State.ABORTABLE_ERROR: {
        Event.BEGIN_ABORT: State.ABORTING_TRANSACTION,
        Event.ABORTABLE: State.ABORTABLE_ERROR,
        Event.FATAL: State.FATAL_ERROR,
    },
    State.FATAL_ERROR: {},
}

# Requests whose result another request completes (AddOffsetsToTxn: its TxnOffsetCommit).
# EndTxn: _ended() completes it, after a new epoch if it needs one.
_CHAINED = frozenset({ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN})

_HAS_PRODUCER_ID = frozenset({
    State.READY, State.IN_TRANSACTION, State.PREPARED_TRANSACTION, State.COMMITTING_TRANSACTION,
    State.ABORTING_TRANSACTION, State.ABORTABLE_ERROR})

# Where the application's transaction calls may start: anything else is IllegalStateError.
_CALL_STATES: dict[str, frozenset[State]] = {
    "init_transactions": frozenset({State.UNINITIALIZED, State.READY, State.PREPARED_TRANSACTION}),
    "begin_transaction": frozenset({State.READY}),
    "send_offsets_to_transaction": frozenset({State.IN_TRANSACTION}),
    "prepare_transaction": frozenset({State.IN_TRANSACTION}),
    "commit_transaction": frozenset({State.IN_TRANSACTION, State.PREPARED_TRANSACTION}),
    "abort_transaction": frozenset({State.IN_TRANSACTION, State.PREPARED_TRANSACTION, State.ABORTABLE_ERROR}),
}


# -- request bodies (the AdminClient builds the same ones for another process) ---------


def add_offsets_body(transactional_id: str, producer_id: int, epoch: int, group_id: str) -> dict[str, Any]:
    return {"transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": epoch,
            "group_id": group_id}


def end_txn_body(transactional_id: str, producer_id: int, epoch: int, commit: bool) -> dict[str, Any]:
    return {"transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": epoch,
            "committed": commit}


def by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """Partition numbers per topic, as the requests list them."""
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(partition)
    return topics


def partition_error(body: dict[str, Any], what: str) -> Exception | None:
    """The first per-partition error of an answer listing ``topics`` of ``partitions``."""
    return next((error_for_code(p["error_code"], f"{what}: {t['name']}-{p['partition_index']}")
                 for t in body["topics"] for p in t["partitions"] if p["error_code"]), None)


def offset_topics(offsets: Mapping[TopicPartition, tuple[int, str | None]]) -> list[dict[str, Any]]:
    """The ``topics`` of an offset commit: ``offsets`` maps (topic, partition) to (offset, metadata)."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (offset, metadata) in offsets.items():
        topics.setdefault(topic, []).append(
            {"partition_index": partition, "committed_offset": offset, "committed_metadata": metadata})
    return [{"name": t, "partitions": ps} for t, ps in topics.items()]


def txn_offset_commit_body(transactional_id: str, group_id: str, producer_id: int, epoch: int,
                           offsets: Mapping[TopicPartition, tuple[int, str | None]]) -> dict[str, Any]:
    """A TxnOffsetCommit request."""
    return {"transactional_id": transactional_id, "group_id": group_id, "producer_id": producer_id,
            "producer_epoch": epoch, "topics": offset_topics(offsets)}


class TransactionalResult:
    """The outcome of one transaction call, which the application waits for."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: Exception | None = None

    def done(self, error: Exception | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout_s: float | None, what: str) -> None:
        if not self._done.wait(timeout_s):
            raise KafkaTimeoutError(f"{what} did not finish within {timeout_s * 1000:.0f} ms (max.block.ms)")
        if self.error is not None:
            raise self.error


@dataclass
class TxnRequest:
    """A request to a coordinator, queued until the Sender can send it."""

    api_key: ApiKey
    coordinator: int  # TRANSACTION_COORDINATOR or GROUP_COORDINATOR
    key: str  # the transactional id or group id the coordinator is found by
    body: dict[str, Any]
    handle: Callable[[dict[str, Any]], Exception | None]  # the answer's error, None when done
    result: TransactionalResult | None = None
    not_before: float = 0.0
    partitions: set = field(default_factory=set)  # AddPartitionsToTxn: the partitions it adds


class _Partition:
    """What the manager knows of one partition."""

    __slots__ = ("identity", "next_sequence", "last_acked", "unsettled", "on_wire", "recovering", "rewrite")

    def __init__(self, identity: tuple[int, int]) -> None:
        self.start(identity)
        self.on_wire = 0  # batches sent and not answered, under any identity
        self.recovering = False  # a batch was put back for a retry: one at a time until it is through

    def start(self, identity: tuple[int, int]) -> None:
        """Sequences from 0 under ``identity`` (producer id, epoch)."""
        self.identity = identity
        self.next_sequence = 0
        self.last_acked = -1  # last sequence acknowledged under this identity
        self.unsettled = 0  # batches holding a sequence under this identity, not yet completed
        self.rewrite = False  # its sequences cannot go on: start over under the current identity

    def is_next(self, sequence: int) -> bool:
        return sequence == (self.last_acked + 1) & _SEQUENCE_MASK


class TransactionManager:
    """The producer id and epoch, sequences and in-flight limits per partition, and the
    recovery decisions for refused batches."""

    def __init__(self, config: ProducerConfig) -> None:
        self.idempotent = config.enable_idempotence
        if self.idempotent:
            self._limit = MAX_IN_FLIGHT_PER_PARTITION
        elif config.max_in_flight_requests_per_connection == 1:
            self._limit = 1  # Java's guaranteeMessageOrder: mute the partition while in flight
        else:
            self._limit = 1 << 30
        self._retry_backoff_ms = config.retry_backoff_ms
        # Without idempotence there is no identity to get: batches may go at once.
        self.state = State.UNINITIALIZED if self.idempotent else State.READY
        self._identity = _NO_IDENTITY
        self._partitions: dict[TopicPartition, _Partition] = {}
        self._bump_required = False
        self._init_not_before = 0.0
        self.fatal_error: Exception | None = None
        # Transactions
        self.transactional_id = config.transactional_id
        self.transactional = self.transactional_id is not None
        self._transaction_timeout_ms = config.transaction_timeout_ms
        self._lock = threading.RLock()
        self._queue: deque[TxnRequest] = deque()
        self.request_in_flight = False
        self._coordinators: dict[tuple[int, str], int] = {}
        self._in_transaction: set[TopicPartition] = set()  # added to the open transaction
        self._to_add: set[TopicPartition] = set()  # sent to, not yet in an AddPartitionsToTxn
        # The coordinator holds the open transaction: a partition or offsets were added to
        # it. Until then it knows of none, and EndTxn is answered INVALID_TXN_STATE: an
        # empty transaction ends here, without a request (Java's transactionStarted).
        self._started = False
        self.abortable_error: Exception | None = None

    # -- the state machine ----------------------------------------------------

    def _transition(self, event: Event) -> None:
        target = TRANSITIONS[self.state].get(event)
        if target is None:
            raise IllegalStateError(f"producer state {self.state.name} does not allow {event.name}")
        log.debug("transaction manager: %s --%s--> %s", self.state.name, event.name, target.name)
        self.state = target

    @property
    def producer_id(self) -> int:
        return self._identity[0]

    @property
    def producer_epoch(self) -> int:
        return self._identity[1]

    @property
    def has_producer_id(self) -> bool:
        """Batches may be drained: the identity they need (if any) is known."""
        return self.state in _HAS_PRODUCER_ID

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

    def init_producer_id_request(self) -> dict[str, Any]:
        """The InitProducerId request to send now (no transactional id: idempotence only)."""
        self._transition(Event.INIT_PRODUCER_ID_SENT)
        return {"transactional_id": None, "transaction_timeout_ms": 60000}

    def handle_init_producer_id_response(self, body: dict[str, Any] | None, error: Exception | None,
                                         now: float) -> None:
        """The answer to InitProducerId: the new identity, a retry later, or a fatal error."""
        if error is None and body is not None:
            error = error_for_code(body["error_code"], "InitProducerId")
        if error is None:
            self._identity = (body["producer_id"], body["producer_epoch"])
            log.info("producer id %s epoch %s", *self._identity)
            self._transition(Event.PRODUCER_ID_RECEIVED)
        elif getattr(error, "retriable", False):
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
        if not self._bump_required or self.state is not State.READY or self.transactional:
            return  # (a transactional producer's new epoch comes from its coordinator)
        self._bump_required = False
        producer_id, epoch = self._identity
        if epoch >= _MAX_EPOCH:
            log.info("producer id %s has used every epoch: asking for a new one", producer_id)
            self._identity = _NO_IDENTITY
            self._transition(Event.EPOCH_EXHAUSTED)
            return
        self._identity = (producer_id, epoch + 1)
        log.info("producer id %s: epoch bumped to %s, sequences start again at 0", producer_id, epoch + 1)
        self._transition(Event.EPOCH_BUMPED)

    def _request_bump(self, partition: _Partition, batch: ProducerBatch) -> None:
        """``batch``'s partition cannot go on with its sequences: it starts over under the
        current identity, bumped first if ``batch`` was sent under it."""
        partition.rewrite = True
        if (batch.producer_id, batch.producer_epoch) == self._identity:
            self._bump_required = True

    # -- batches --------------------------------------------------------------

    def can_send(self, tp: TopicPartition) -> bool:
        """May the partition's next batch be drained now? (In-flight limits, ordering and,
        in a transaction, the partition added to it.)"""
        if self.transactional and tp not in self._in_transaction:
            return False
        p = self._partitions.get(tp)
        if p is None or not p.on_wire:
            return True
        if p.recovering:
            return False
        if self.idempotent and (p.last_acked < 0 or p.rewrite or p.identity != self._identity):
            return False  # one at a time: see the module's docstring
        return p.on_wire < self._limit

    def prepare_batch(self, batch: ProducerBatch) -> None:
        """Called as a batch is drained: count it on the wire and, with idempotence, give it
        its producer id, epoch and sequence (kept if it already holds them)."""
        p = self._partitions.get(batch.tp)
        if p is None:
            p = self._partitions[batch.tp] = _Partition(self._identity)
        if self.idempotent:
            if p.identity != self._identity and not p.on_wire and (p.rewrite or not p.unsettled):
                p.start(self._identity)
            if (batch.producer_id, batch.producer_epoch) != p.identity:
                sequence = p.next_sequence
                batch.producer_id, batch.producer_epoch = p.identity
                batch.base_sequence = sequence
                p.next_sequence = (sequence + batch.record_count) & _SEQUENCE_MASK
                p.unsettled += 1
        p.on_wire += 1

    def can_retry(self, batch: ProducerBatch, error: Exception) -> bool:
        """Whether a batch refused with ``error`` may be sent again (the Sender checks
        retries and delivery.timeout.ms first). Asks for an epoch bump where the
        partition's sequences cannot go on."""
        if not self.idempotent or batch.base_sequence < 0:
            return getattr(error, "retriable", False)
        p = self._partitions[batch.tp]
        current = (batch.producer_id, batch.producer_epoch) == p.identity and not p.rewrite
        if isinstance(error, OutOfOrderSequenceNumberError):
            if current and p.is_next(batch.base_sequence):
                # The batch the broker should take next, refused: a gap it will never fill.
                if not self.can_bump_epoch:
                    return False
                self._request_bump(p, batch)
            # Otherwise an earlier batch is being retried (refused only because of that
            # gap), or the partition's sequences are being written again anyway.
            return True
        if isinstance(error, _PRODUCER_STATE_ERRORS):
            if self.transactional:
                return False  # fenced, or the transaction is lost: see handle_failed_batch
            if current:
                self._request_bump(p, batch)
            return True
        return getattr(error, "retriable", False)

    def handle_retry(self, batch: ProducerBatch) -> None:
        """A batch that was on the wire goes back to the accumulator for another attempt."""
        p = self._partitions[batch.tp]
        p.on_wire -= 1
        p.recovering = True

    def handle_completed_batch(self, batch: ProducerBatch) -> None:
        """A batch on the wire was acknowledged (or recognised as a duplicate)."""
        p = self._partitions[batch.tp]
        p.on_wire -= 1
        if not p.on_wire:
            p.recovering = False
        if batch.base_sequence >= 0 and (batch.producer_id, batch.producer_epoch) == p.identity:
            p.last_acked = (batch.base_sequence + batch.record_count - 1) & _SEQUENCE_MASK
            p.unsettled -= 1

    def handle_failed_batch(self, batch: ProducerBatch, on_wire: bool = True, error: Exception | None = None) -> None:
        """A batch will not be sent again: refused for good, out of retries or of
        delivery.timeout.ms (``on_wire`` False: it expired in the accumulator). In a
        transaction, the transaction cannot commit any more: it becomes abortable, or the
        producer fatal if ``error`` says it was fenced."""
        if self.transactional and error is not None:
            with self._lock:
                self._transaction_failed(error, isinstance(error, _FATAL_PRODUCE_ERRORS), produce=True)
        p = self._partitions.get(batch.tp)
        if p is None:
            return  # never drained
        if on_wire:
            p.on_wire -= 1
            if not p.on_wire:
                p.recovering = False
        if batch.base_sequence >= 0 and (batch.producer_id, batch.producer_epoch) == p.identity:
            # Its sequence leaves a gap the broker would refuse every later batch for.
            p.unsettled -= 1
            log.warning("%s failed holding sequence %s: its partition starts over under a bumped epoch",
                        batch, batch.base_sequence)
            self._request_bump(p, batch)

    # -- transactions: the application's calls --------------------------------

    def _check_call(self, call: str) -> None:
        """Raise unless ``call`` may start in the current state (with ``_lock`` held)."""
        if self.transactional_id is None:
            raise IllegalStateError(f"{call}() needs transactional.id to be set")
        if self.state in _CALL_STATES[call]:
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

    def init_transactions(self) -> TransactionalResult:
        """Ask the coordinator for the producer id under transactional.id: the epoch it
        gives fences every earlier producer with that id and aborts its open transaction."""
        with self._lock:
            self._check_call("init_transactions")
            self._transition(Event.INIT_PRODUCER_ID_SENT)
            return self._enqueue_init(-1, -1)

    def _enqueue_init(self, producer_id: int, epoch: int,
                      result: TransactionalResult | None = None) -> TransactionalResult:
        self._new_transaction()
        result = result or TransactionalResult()
        self._enqueue(TxnRequest(ApiKey.INIT_PRODUCER_ID, TRANSACTION_COORDINATOR, self.transactional_id, {
            "transactional_id": self.transactional_id, "transaction_timeout_ms": self._transaction_timeout_ms,
            "producer_id": producer_id, "producer_epoch": epoch}, self._on_init_producer_id, result))
        return result

    def begin_transaction(self) -> None:
        with self._lock:
            self._check_call("begin_transaction")
            self._new_transaction()
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
        with self._lock:
            self.ensure_sendable()
            self._to_add.add(tp)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, tuple[int, str | None]],
                                    group_id: str) -> TransactionalResult:
        """Commit ``offsets`` for ``group_id`` as part of the open transaction."""
        with self._lock:
            self._check_call("send_offsets_to_transaction")
            result = TransactionalResult()
            pid, epoch = self._identity
            commit = TxnRequest(ApiKey.TXN_OFFSET_COMMIT, GROUP_COORDINATOR, group_id,
                                txn_offset_commit_body(self.transactional_id, group_id, pid, epoch, offsets),
                                self._on_txn_offset_commit, result)

            def added(body: dict[str, Any]) -> Exception | None:
                error = error_for_code(body["error_code"], f"AddOffsetsToTxn for group {group_id}")
                if error is None:
                    self._started = True  # the group's offsets partition is in the transaction
                    self._queue.appendleft(commit)  # next: the offsets themselves, to the group's coordinator
                return error

            self._enqueue(TxnRequest(ApiKey.ADD_OFFSETS_TO_TXN, TRANSACTION_COORDINATOR, self.transactional_id,
                                     add_offsets_body(self.transactional_id, pid, epoch, group_id), added, result))
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
            return self.transactional_id, self._identity[0], self._identity[1]

    def end_transaction(self, commit: bool) -> TransactionalResult:
        """EndTxn: commit or abort the open transaction (its records already flushed)."""
        with self._lock:
            self._check_call("commit_transaction" if commit else "abort_transaction")
            self._transition(Event.BEGIN_COMMIT if commit else Event.BEGIN_ABORT)
            self._to_add.clear()
            result = TransactionalResult()
            if not commit and isinstance(self.abortable_error, InvalidProducerEpochError):
                # The coordinator aborted the transaction itself (transaction.timeout.ms) and
                # bumped the epoch: EndTxn under the old one is refused as fenced. InitProducerId
                # under it is how a producer goes on (KIP-360, KIP-588): the coordinator aborts
                # whatever is still open and answers with the epoch to use.
                self._transition(Event.INIT_PRODUCER_ID_SENT)
                return self._enqueue_init(*self._identity, result)
            self._enqueue(TxnRequest(ApiKey.END_TXN, TRANSACTION_COORDINATOR, self.transactional_id,
                                     end_txn_body(self.transactional_id, *self._identity, commit),
                                     lambda body: self._on_end_txn(body, result), result))
            return result

    # -- transactions: the Sender's side --------------------------------------

    def _enqueue(self, request: TxnRequest) -> None:
        self._queue.append(request)

    def next_request(self, now: float) -> TxnRequest | None:
        """The coordinator request to send now, if any (one at a time)."""
        with self._lock:
            if self.request_in_flight:
                return None
            if self._to_add and self.state is State.IN_TRANSACTION and not any(
                    r.api_key == ApiKey.ADD_PARTITIONS_TO_TXN for r in self._queue):
                self._queue.appendleft(self._add_partitions_request())
            while self._queue and self._queue[0].api_key == ApiKey.END_TXN and not self._started:
                # Nothing was added (the requests before it have been answered): the
                # coordinator holds no transaction, so it ends here.
                end = self._queue.popleft()
                self._ended(end.result)
            if not self._queue or now < self._queue[0].not_before:
                return None
            return self._queue[0]

    def _add_partitions_request(self) -> TxnRequest:
        partitions, self._to_add = self._to_add, set()
        topics = by_topic(sorted(partitions))
        pid, epoch = self._identity
        request = TxnRequest(ApiKey.ADD_PARTITIONS_TO_TXN, TRANSACTION_COORDINATOR, self.transactional_id, {
            "transactional_id": self.transactional_id, "producer_id": pid, "producer_epoch": epoch,
            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}, self._on_add_partitions)
        request.partitions = partitions
        return request

    def coordinator(self, request: TxnRequest) -> int | None:
        """The node to send ``request`` to, if its coordinator is known."""
        return self._coordinators.get((request.coordinator, request.key))

    def find_coordinator_body(self, request: TxnRequest) -> dict[str, Any]:
        return {"key": request.key, "key_type": request.coordinator}

    def handle_find_coordinator(self, request: TxnRequest, body: dict[str, Any] | None, error: Exception | None,
                                now: float) -> tuple[int, str, int] | None:
        """The coordinator's node id, host and port, or None if it must be asked again."""
        with self._lock:
            self.request_in_flight = False
            if error is None:
                error = error_for_code(body["error_code"], f"FindCoordinator for {request.key}: "
                                                           f"{body.get('error_message') or ''}".rstrip(": "))
            if error is None:
                self._coordinators[(request.coordinator, request.key)] = body["node_id"]
                return body["node_id"], body["host"], body["port"]
            self._request_failed(request, error, now)
            return None

    def handle_response(self, request: TxnRequest, body: dict[str, Any] | None, error: Exception | None,
                        now: float) -> None:
        """The answer to ``request``: done, retried later, or failing its transaction."""
        with self._lock:
            self.request_in_flight = False
            if error is None:
                error = request.handle(body)
            if error is None:
                if self._queue and self._queue[0] is request:
                    self._queue.popleft()
                else:  # the head changed (an answer queued its follow-up first)
                    self._queue.remove(request)
                if request.result is not None and request.api_key not in _CHAINED:
                    request.result.done()
                return
            self._request_failed(request, error, now)

    def _request_failed(self, request: TxnRequest, error: Exception, now: float) -> None:
        if isinstance(error, COORDINATOR_MOVED):
            self._coordinators.pop((request.coordinator, request.key), None)
        if getattr(error, "retriable", False) or isinstance(error, OperationNotAttemptedError):
            log.debug("%s for %s: %s; retrying", request.api_key.name, request.key, error)
            request.not_before = now + self._retry_backoff_ms
            return
        self._queue.remove(request)
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

    def _on_init_producer_id(self, body: dict[str, Any]) -> Exception | None:
        error = error_for_code(body["error_code"], f"InitProducerId for transactional.id {self.transactional_id!r}")
        if error is not None:
            return error
        self._identity = (body["producer_id"], body["producer_epoch"])
        self.abortable_error = None
        self._bump_required = False
        log.info("transactional.id %r: producer id %s epoch %s", self.transactional_id, *self._identity)
        self._transition(Event.PRODUCER_ID_RECEIVED)
        return None

    def _on_add_partitions(self, body: dict[str, Any]) -> Exception | None:
        first: Exception | None = None
        for topic in body["topics"]:
            for part in topic["partitions"]:
                tp = (topic["name"], part["partition_index"])
                error = error_for_code(part["error_code"], f"AddPartitionsToTxn {tp[0]}-{tp[1]}")
                if error is None:
                    self._in_transaction.add(tp)
                    self._started = True
                elif first is None or isinstance(first, OperationNotAttemptedError):
                    first = error
        return first

    def _on_txn_offset_commit(self, body: dict[str, Any]) -> Exception | None:
        return partition_error(body, "TxnOffsetCommit")

    def _on_end_txn(self, body: dict[str, Any], result: TransactionalResult) -> Exception | None:
        error = error_for_code(body["error_code"], f"EndTxn for transactional.id {self.transactional_id!r}")
        if error is None:
            self._ended(result)
        return error

    def _ended(self, result: TransactionalResult) -> None:
        """The transaction is over. After an abort that left a sequence gap, the coordinator
        gives a new epoch first (KIP-360), so that sequences start again at 0."""
        self._in_transaction.clear()
        aborting = self.state is State.ABORTING_TRANSACTION
        if aborting and (self._bump_required or any(p.rewrite for p in self._partitions.values())):
            self._transition(Event.INIT_PRODUCER_ID_SENT)
            self._enqueue_init(*self._identity, result)
            return
        self.abortable_error = None
        self._transition(Event.ENDED)
        result.done()
