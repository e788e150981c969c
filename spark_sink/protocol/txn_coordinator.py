"""Transactions as the coordinators see them: a prepared transaction's identity, a
transactional id's state, and the request bodies and answer checks of the transaction
and offset requests.

Sans-IO: instances of :mod:`spark_sink.protocol.kmsg`'s classes. The producer's
TransactionManager and the AdminClient (which ends or extends another process's
transaction) build the same requests from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spark_sink.protocol import kmsg
from spark_sink.protocol.error_codes import error_for_code

TopicPartition = tuple[str, int]

TRANSACTION_COORDINATOR, GROUP_COORDINATOR = 1, 0  # FindCoordinator key types
MAX_EPOCH = 0x7FFF  # a producer id's epochs: the one that would reach it gets a new producer id instead


@dataclass(frozen=True)
class PreparedTransaction:
    """A transaction flushed and left open: what another process needs to end it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class TransactionState:
    """A transactional id's state as its coordinator holds it (DescribeTransactions):
    ``state`` is Kafka's name ("Ongoing", "PrepareCommit", "CompleteAbort", "Empty", ...), or
    None where the coordinator has never heard of the id. Times are the coordinator's
    wall clock, in ms."""

    transactional_id: str
    state: str | None
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = 0
    start_time_ms: int = -1

    @property
    def deadline_ms(self) -> float | None:
        """When the coordinator may abort the open transaction on its timeout (None: not open)."""
        if self.state != "Ongoing" or self.start_time_ms < 0:
            return None
        return self.start_time_ms + self.timeout_ms


def add_offsets_body(transactional_id: str, producer_id: int, epoch: int, group_id: str) -> kmsg.AddOffsetsToTxnRequest:
    """An AddOffsetsToTxn request."""
    return kmsg.AddOffsetsToTxnRequest(transactional_id=transactional_id, producer_id=producer_id,
                                       producer_epoch=epoch, group_id=group_id)


def end_txn_body(transactional_id: str, producer_id: int, epoch: int, commit: bool) -> kmsg.EndTxnRequest:
    """An EndTxn request: commit, or abort."""
    return kmsg.EndTxnRequest(transactional_id=transactional_id, producer_id=producer_id, producer_epoch=epoch,
                              committed=commit)


def by_topic(partitions: Iterable[TopicPartition]) -> dict[str, list[int]]:
    """Partition numbers per topic, as the requests list them."""
    topics: dict[str, list[int]] = {}
    for topic, partition in partitions:
        topics.setdefault(topic, []).append(partition)
    return topics


def partition_error(body: kmsg.TxnOffsetCommitResponse | kmsg.OffsetCommitResponse | kmsg.OffsetFetchResponse,
                    what: str) -> Exception | None:
    """The first per-partition error of an offset commit's or fetch's answer."""
    return next((error_for_code(p.error_code, f"{what}: {t.name}-{p.partition_index}")
                 for t in body.topics for p in t.partitions if p.error_code), None)


def txn_offset_commit_body(transactional_id: str, group_id: str, producer_id: int, epoch: int,
                           offsets: Mapping[TopicPartition, tuple[int, str | None]]) -> kmsg.TxnOffsetCommitRequest:
    """A TxnOffsetCommit request: ``offsets`` maps (topic, partition) to (offset, metadata)."""
    topics: dict[str, list[kmsg.TxnOffsetCommitRequestPartition]] = {}
    for (topic, partition), (offset, metadata) in offsets.items():
        topics.setdefault(topic, []).append(kmsg.TxnOffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_metadata=metadata))
    return kmsg.TxnOffsetCommitRequest(
        transactional_id=transactional_id, group_id=group_id, producer_id=producer_id, producer_epoch=epoch,
        topics=[kmsg.TxnOffsetCommitRequestTopic(t, ps) for t, ps in topics.items()])


def find_coordinator_body(key_type: int, key: str) -> kmsg.FindCoordinatorRequest:
    """A FindCoordinator request for the coordinator of ``key`` (a transactional id or group id)."""
    return kmsg.FindCoordinatorRequest(key=key, key_type=key_type)


def coordinator_error(body: kmsg.FindCoordinatorResponse, key: str) -> Exception | None:
    """The error of a FindCoordinator answer, if any."""
    return error_for_code(body.error_code, f"FindCoordinator for {key}: {body.error_message or ''}".rstrip(": "))


def ended_by(transaction: PreparedTransaction, state: TransactionState, version: int) -> bool:
    """Whether ``state`` is ``transaction``'s id as an EndTxn of ``transaction`` under
    transaction protocol ``version`` left it: the same producer id and epoch under v1; under
    v2 the next epoch (EndTxn v5 bumps it) or, when that bump exhausted the epochs, a new
    producer id at epoch 0. Another producer's end comes after its own InitProducerId
    bump (and under v2 its own EndTxn): at least two epochs later, or epoch 1 of a new
    producer id."""
    pid, epoch = state.producer_id, state.producer_epoch
    if version < 2:
        return (pid, epoch) == (transaction.producer_id, transaction.producer_epoch)
    if transaction.producer_epoch + 1 >= MAX_EPOCH:
        return pid != transaction.producer_id and epoch == 0
    return (pid, epoch) == (transaction.producer_id, transaction.producer_epoch + 1)
