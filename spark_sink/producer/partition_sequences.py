"""PartitionSequences: per-partition sequences, in-flight limits, and what to do when a
broker refuses a sequenced batch (the Java producer's TxnPartitionMap and the
TransactionManager's decisions over it).

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

Only the thread doing the Sender's work uses it.
"""

from __future__ import annotations

import logging

from spark_sink.producer.batch import ProducerBatch, TopicPartition
from spark_sink.protocol.error_codes import (
    InvalidProducerEpochError,
    OutOfOrderSequenceNumberError,
    ProducerFencedError,
    UnknownProducerIdError,
    is_retriable,
)
from spark_sink.protocol.txn_coordinator import MAX_EPOCH

log = logging.getLogger(__name__)

MAX_IN_FLIGHT_PER_PARTITION = 5  # the batches per producer and partition a broker remembers
_SEQUENCE_MASK = 0x7FFFFFFF  # sequences wrap to 0 after the largest int32
NO_IDENTITY = (-1, -1)
# Errors saying the broker has no usable state for this producer id and epoch on the
# partition: an idempotent producer goes on under a bumped epoch.
_PRODUCER_STATE_ERRORS = (UnknownProducerIdError, InvalidProducerEpochError, ProducerFencedError)


class _Partition:
    """What is known of one partition."""

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


class PartitionSequences:
    """The identity batches are numbered under, and each partition's sequences and
    batches on the wire."""

    def __init__(self, idempotent: bool, max_in_flight_requests_per_connection: int) -> None:
        self.idempotent = idempotent
        if idempotent:
            self._limit = MAX_IN_FLIGHT_PER_PARTITION
        elif max_in_flight_requests_per_connection == 1:
            self._limit = 1  # Java's guaranteeMessageOrder: mute the partition while in flight
        else:
            self._limit = 1 << 30
        self.identity = NO_IDENTITY  # (producer id, epoch)
        # A refused batch sent under the current identity left its partition unable to go
        # on: the epoch is to be bumped.
        self.bump_required = False
        self._partitions: dict[TopicPartition, _Partition] = {}

    @property
    def needs_new_epoch(self) -> bool:
        """Some partition's sequences cannot go on under the current identity."""
        return self.bump_required or any(p.rewrite for p in self._partitions.values())

    def bump_epoch(self) -> bool:
        """The identity's epoch plus one; False if it has used every epoch (the identity is
        dropped: a new producer id is needed)."""
        self.bump_required = False
        producer_id, epoch = self.identity
        if epoch >= MAX_EPOCH:
            log.info("producer id %s has used every epoch: asking for a new one", producer_id)
            self.identity = NO_IDENTITY
            return False
        self.identity = (producer_id, epoch + 1)
        log.info("producer id %s: epoch bumped to %s, sequences start again at 0", producer_id, epoch + 1)
        return True

    def _request_bump(self, partition: _Partition, batch: ProducerBatch) -> None:
        """``batch``'s partition cannot go on with its sequences: it starts over under the
        current identity, bumped first if ``batch`` was sent under it."""
        partition.rewrite = True
        if (batch.producer_id, batch.producer_epoch) == self.identity:
            self.bump_required = True

    def can_send(self, tp: TopicPartition) -> bool:
        """May the partition's next batch be drained now? (In-flight limits and ordering.)"""
        p = self._partitions.get(tp)
        if p is None or not p.on_wire:
            return True
        if p.recovering:
            return False
        if self.idempotent and (p.last_acked < 0 or p.rewrite or p.identity != self.identity):
            return False  # one at a time: see the module's docstring
        return p.on_wire < self._limit

    def prepare_batch(self, batch: ProducerBatch) -> None:
        """Called as a batch is drained: count it on the wire and, with idempotence, give it
        its producer id, epoch and sequence (kept if it already holds them)."""
        p = self._partitions.get(batch.tp)
        if p is None:
            p = self._partitions[batch.tp] = _Partition(self.identity)
        if self.idempotent:
            if p.identity != self.identity and not p.on_wire and (p.rewrite or not p.unsettled):
                p.start(self.identity)
            if (batch.producer_id, batch.producer_epoch) != p.identity:
                sequence = p.next_sequence
                batch.producer_id, batch.producer_epoch = p.identity
                batch.base_sequence = sequence
                p.next_sequence = (sequence + batch.record_count) & _SEQUENCE_MASK
                p.unsettled += 1
        p.on_wire += 1

    def can_retry(self, batch: ProducerBatch, error: Exception, can_bump_epoch: bool, transactional: bool) -> bool:
        """Whether a batch refused with ``error`` may be sent again. Asks for an epoch bump
        where the partition's sequences cannot go on (if ``can_bump_epoch``: the producer
        bumps its own epoch)."""
        if not self.idempotent or batch.base_sequence < 0:
            return is_retriable(error)
        p = self._partitions[batch.tp]
        current = (batch.producer_id, batch.producer_epoch) == p.identity and not p.rewrite
        if isinstance(error, OutOfOrderSequenceNumberError):
            if current and p.is_next(batch.base_sequence):
                # The batch the broker should take next, refused: a gap it will never fill.
                if not can_bump_epoch:
                    return False
                self._request_bump(p, batch)
            # Otherwise an earlier batch is being retried (refused only because of that
            # gap), or the partition's sequences are being written again anyway.
            return True
        if isinstance(error, _PRODUCER_STATE_ERRORS):
            if transactional:
                return False  # fenced, or the transaction is lost: the transaction fails
            if current:
                self._request_bump(p, batch)
            return True
        return is_retriable(error)

    def handle_retry(self, batch: ProducerBatch) -> None:
        """A batch that was on the wire goes back to the accumulator for another attempt."""
        p = self._partitions[batch.tp]
        p.on_wire -= 1
        p.recovering = True

    def handle_split(self, batch: ProducerBatch, pieces: list[ProducerBatch]) -> None:
        """A batch on the wire, refused as too large, goes back as ``pieces`` (its records
        in order): as Java's split, they take its sequences one after another, so that no
        gap is left and the batches behind it keep theirs."""
        p = self._partitions[batch.tp]
        p.on_wire -= 1
        p.recovering = True
        if batch.base_sequence >= 0 and (batch.producer_id, batch.producer_epoch) == p.identity:
            sequence = batch.base_sequence
            for piece in pieces:
                piece.producer_id, piece.producer_epoch, piece.base_sequence = batch.producer_id, \
                    batch.producer_epoch, sequence
                sequence = (sequence + piece.record_count) & _SEQUENCE_MASK
            p.unsettled += len(pieces) - 1

    def handle_completed_batch(self, batch: ProducerBatch) -> None:
        """A batch on the wire was acknowledged (or recognised as a duplicate)."""
        p = self._partitions[batch.tp]
        p.on_wire -= 1
        if not p.on_wire:
            p.recovering = False
        if batch.base_sequence >= 0 and (batch.producer_id, batch.producer_epoch) == p.identity:
            p.last_acked = (batch.base_sequence + batch.record_count - 1) & _SEQUENCE_MASK
            p.unsettled -= 1

    def handle_failed_batch(self, batch: ProducerBatch, on_wire: bool) -> None:
        """A batch will not be sent again (``on_wire`` False: it never left the accumulator
        this time). A sequence it held leaves a gap: its partition starts over."""
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
