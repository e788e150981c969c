"""Per-partition ordering and, with idempotence, producer id and sequence numbers.

The broker keeps the last five batches of each producer per partition, so at most five
batches per partition may be in flight; sequences are assigned when a batch is first
drained and kept across retries, so a retried batch the broker already appended is
acknowledged again instead of being written twice. After a failure a partition sends one
batch at a time until the retried batch is through, so order is never inverted.
"""

from __future__ import annotations

import logging

from spark_sink.producer.batch import ProducerBatch, TopicPartition
from spark_sink.producer.config import ProducerConfig

log = logging.getLogger(__name__)

_MAX_IN_FLIGHT_PER_PARTITION = 5


class PartitionState:
    """In-flight bookkeeping per partition, and the producer id when idempotent."""

    def __init__(self, config: ProducerConfig) -> None:
        self.idempotent = config.enable_idempotence
        if self.idempotent:
            self._limit = _MAX_IN_FLIGHT_PER_PARTITION
        elif config.max_in_flight_requests_per_connection == 1:
            self._limit = 1  # Java's guaranteeMessageOrder: mute the partition while in flight
        else:
            self._limit = 1 << 30
        self.producer_id = -1
        self.producer_epoch = -1
        self._next_sequence: dict[TopicPartition, int] = {}
        self._in_flight: dict[TopicPartition, int] = {}
        self._recovering: set[TopicPartition] = set()
        self._acknowledged: set[TopicPartition] = set()  # some batch acked under this producer id
        self.reset_needed = False

    @property
    def has_producer_id(self) -> bool:
        return not self.idempotent or self.producer_id >= 0

    def set_producer_id(self, producer_id: int, epoch: int) -> None:
        """A new identity: sequences start again at 0 for every partition."""
        log.info("producer id %s epoch %s", producer_id, epoch)
        self.producer_id, self.producer_epoch = producer_id, epoch
        self._next_sequence.clear()
        self._acknowledged.clear()
        self.reset_needed = False

    def can_send(self, tp: TopicPartition) -> bool:
        if tp in self._recovering or (self.idempotent and tp not in self._acknowledged):
            return tp not in self._in_flight
        return self._in_flight.get(tp, 0) < self._limit

    def prepare(self, batch: ProducerBatch) -> None:
        """Called as a batch is drained: count it in flight and give it a sequence."""
        tp = batch.tp
        self._in_flight[tp] = self._in_flight.get(tp, 0) + 1
        if self.idempotent and batch.producer_id != self.producer_id:
            seq = self._next_sequence.get(tp, 0)
            batch.producer_id, batch.producer_epoch, batch.base_sequence = self.producer_id, self.producer_epoch, seq
            self._next_sequence[tp] = (seq + batch.record_count) & 0x7FFFFFFF

    def finished(self, batch: ProducerBatch, retrying: bool, acknowledged: bool = False) -> None:
        """A response (or failure) for an in-flight batch arrived."""
        tp = batch.tp
        left = self._in_flight.get(tp, 1) - 1
        if left:
            self._in_flight[tp] = left
        else:
            self._in_flight.pop(tp, None)
        if retrying:
            self._recovering.add(tp)
        else:
            if acknowledged and batch.producer_id == self.producer_id:
                self._acknowledged.add(tp)
            if not left:
                self._recovering.discard(tp)

    def recovering(self, tp: TopicPartition) -> bool:
        return tp in self._recovering

    def request_reset(self, reason: str) -> None:
        """The broker lost track of this producer (or a sequence gap appeared): get a new
        producer id; queued batches are re-sequenced under it."""
        if self.idempotent and not self.reset_needed:
            log.warning("resetting producer id: %s", reason)
            self.reset_needed = True
