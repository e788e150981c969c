"""TransactionManager: the producer id and epoch, per-partition sequences and in-flight
limits, and what to do when a broker refuses a sequenced batch.

Named after the Java producer's class, and shaped like it: a state machine whose
transitions are a table (:data:`TRANSITIONS`), driven by the Sender. For now it serves the
idempotent producer (and the in-flight limits of every producer); transactions add their
states and events to the same table.

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

Only the thread doing the Sender's work (holding its I/O lock) calls this class.
"""

from __future__ import annotations

import logging
from enum import Enum
from typing import Any

from spark_sink.producer.batch import ProducerBatch, TopicPartition
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.errors import IllegalStateError
from spark_sink.protocol.errors import (
    InvalidProducerEpochError, OutOfOrderSequenceNumberError, ProducerFencedError, UnknownProducerIdError,
    error_for_code,
)

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_PER_PARTITION = 5  # the batches per producer and partition a broker remembers
_SEQUENCE_MASK = 0x7FFFFFFF  # sequences wrap to 0 after the largest int32
_MAX_EPOCH = 0x7FFF
_NO_IDENTITY = (-1, -1)
# Errors saying the broker has no usable state for this producer id and epoch on the
# partition: an idempotent producer goes on under a bumped epoch.
_PRODUCER_STATE_ERRORS = (UnknownProducerIdError, InvalidProducerEpochError, ProducerFencedError)


class State(Enum):
    """Where the producer's identity stands."""

    UNINITIALIZED = "UNINITIALIZED"  # no producer id: one is to be asked for
    INITIALIZING = "INITIALIZING"  # InitProducerId in flight
    READY = "READY"  # batches go out under the current producer id and epoch
    FATAL_ERROR = "FATAL_ERROR"  # the producer can only be closed


class Event(Enum):
    """What moves the state machine."""

    INIT_PRODUCER_ID_SENT = "INIT_PRODUCER_ID_SENT"
    PRODUCER_ID_RECEIVED = "PRODUCER_ID_RECEIVED"
    INIT_PRODUCER_ID_FAILED = "INIT_PRODUCER_ID_FAILED"  # retriably: ask again after a backoff
    EPOCH_BUMPED = "EPOCH_BUMPED"
    EPOCH_EXHAUSTED = "EPOCH_EXHAUSTED"  # the epoch cannot grow: a new producer id is needed
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
        Event.FATAL: State.FATAL_ERROR,
    },
    State.FATAL_ERROR: {},
}


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
        return self.state is State.READY

    @property
    def can_bump_epoch(self) -> bool:
        """An idempotent producer bumps its own epoch, which every broker version accepts."""
        return self.idempotent

    # -- producer id ----------------------------------------------------------

    def should_init_producer_id(self, now: float) -> bool:
        """An InitProducerId request is due now."""
        return self.state is State.UNINITIALIZED and now >= self._init_not_before

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
        if not self._bump_required or self.state is not State.READY:
            return
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
        """May the partition's next batch be drained now? (In-flight limits and ordering.)"""
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

    def handle_failed_batch(self, batch: ProducerBatch, on_wire: bool = True) -> None:
        """A batch will not be sent again: refused for good, out of retries or of
        delivery.timeout.ms (``on_wire`` False: it expired in the accumulator)."""
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
