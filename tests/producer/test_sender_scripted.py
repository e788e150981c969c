"""The Sender against a scripted network: each broker answer that drives the idempotence
decisions (retry, keep the sequence, bump the epoch) chosen by the test, so each case is
deterministic. What is asserted is what a broker would see (producer id, epoch and
sequence of every batch on the wire, in order) and what the application sees (offsets and
callback order). The scripted client is a test seam for the Sender only: every other
producer test runs against a real broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from spark_sink.client.errors import KafkaTimeoutError
from spark_sink.client.metadata import Metadata
from spark_sink.producer import RecordMetadata
from spark_sink.producer.accumulator import RecordAccumulator
from spark_sink.producer.buffer_pool import BufferPool
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.metrics import ProducerMetrics
from spark_sink.producer.sender import Sender
from spark_sink.producer.transactions.transaction_manager import State, TransactionManager
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import (
    DuplicateSequenceNumberError,
    InvalidRecordError,
    NotCoordinatorError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    UnknownProducerIdError,
)
from tests.clock import MovedClock
from tests.producer.scripted_client import Request, ScriptedClient

TOPIC = "t"
TP0, TP1 = (TOPIC, 0), (TOPIC, 1)


@dataclass(frozen=True)
class Sent:
    """One batch as it went on the wire."""

    node: int
    tp: tuple[str, int]
    producer_id: int
    epoch: int
    sequence: int
    values: tuple[bytes | None, ...]


class Harness:
    """A Sender, its accumulator and TransactionManager, and a scripted client; the test
    drives the rounds (no Sender thread) and moves the Sender's clock."""

    def __init__(self, leaders: list[int] | None = None, nodes: int = 1, settings: Mapping[str, object] | None = None,
                 **config: object) -> None:
        self.config = ProducerConfig.from_dict({
            "bootstrap.servers": "scripted:9092", "linger.ms": 0, "batch.size": 0,  # one record a batch
            "retry.backoff.ms": 0, **(settings or {}), **config})
        c = self.config
        self.client = ScriptedClient(nodes={n: ("scripted", 9092 + n) for n in range(nodes)},
                                     topics={TOPIC: leaders or [0]})
        pool = BufferPool(c.buffer_memory)
        self.accumulator = RecordAccumulator(c, pool)
        self.clock = MovedClock()
        self.metadata = Metadata(c.metadata_max_age_ms, c.retry_backoff_ms, c.metadata_max_idle_ms, clock=self.clock)
        self.metadata.topics.add(TOPIC)
        self.txn = TransactionManager(c)
        self.metrics = ProducerMetrics(pool, self.clock)
        self.sender = Sender(c, self.accumulator, self.metadata, self.client, self.txn, self.metrics,
                             clock=self.clock)
        # (value, offset, error) in the order the callbacks ran
        self.callbacks: list[tuple[bytes, int | None, Exception | None]] = []

    def send(self, *values: bytes, partition: int = 0) -> None:
        for value in values:
            def callback(md: RecordMetadata | None, error: Exception | None, value: bytes = value) -> None:
                self.callbacks.append((value, md.offset if md is not None else None, error))
            self.accumulator.append(TOPIC, partition, 0, None, value, headers=None, callback=callback, key_size=0,
                                    value_size=len(value), headers_size=0, max_block_ms=1000)

    def run(self, rounds: int = 4) -> None:
        """Sender rounds: enough for metadata, InitProducerId and every sendable batch."""
        for _ in range(rounds):
            with self.sender.io_lock:
                self.sender.run_once()

    def in_flight(self) -> list[Request]:
        return self.client.in_flight(ApiKey.PRODUCE)

    def only_in_flight(self) -> Request:
        (request,) = self.in_flight()
        return request

    def wire(self) -> list[Sent]:
        """Every batch of every Produce request, in the order sent."""
        return [Sent(r.node, tp, b.producer_id, b.producer_epoch, b.base_sequence, tuple(x.value for x in b.records))
                for r in self.client.requests if r.api_key == ApiKey.PRODUCE for tp, b in r.batches().items()]

    def sequences(self, tp: tuple[str, int] = TP0) -> list[tuple[int, int, tuple[bytes | None, ...]]]:
        """(epoch, sequence, values) of each batch of ``tp`` on the wire, in order."""
        return [(s.epoch, s.sequence, s.values) for s in self.wire() if s.tp == tp]

    def init_producer_id_requests(self) -> int:
        return sum(r.api_key == ApiKey.INIT_PRODUCER_ID for r in self.client.requests)


def acked_in_order(h: Harness, *values: bytes) -> None:
    """Each of ``values`` acknowledged once, in send order, at consecutive offsets from 0,
    and the partition's log holds exactly them in that order."""
    assert h.callbacks == [(v, i, None) for i, v in enumerate(values)]
    assert h.client.values(TP0) == list(values)


def ack_one_by_one(h: Harness) -> None:
    """Answer every Produce request with success until none is left."""
    for _ in range(20):
        h.run()
        if not h.in_flight():
            return
        for request in h.in_flight():
            h.client.respond_produce(request)
    raise AssertionError("Produce requests kept coming")


def started(h: Harness, *values: bytes) -> None:
    """The producer has its id and ``values`` acknowledged on partition 0 (so it pipelines)."""
    h.send(*values)
    ack_one_by_one(h)
    assert h.txn.state is State.READY


def pipelined(h: Harness) -> tuple[Request, Request]:
    """"a" acknowledged, then "b" and "c" on the wire together: their two requests."""
    started(h, b"a")
    h.send(b"b", b"c")
    h.run()
    b, c = h.in_flight()
    return b, c


def test_first_batch_goes_alone_until_acknowledged_then_batches_pipeline() -> None:
    h = Harness()
    h.send(b"a", b"b", b"c")
    h.run()
    assert h.init_producer_id_requests() == 1
    first = h.only_in_flight()  # a broker with no state for us would append any sequence first
    h.client.respond_produce(first)
    h.run()
    assert len(h.in_flight()) == 2  # acknowledged once: the rest go together
    ack_one_by_one(h)
    assert h.sequences() == [(0, 0, (b"a",)), (0, 1, (b"b",)), (0, 2, (b"c",))]
    acked_in_order(h, b"a", b"b", b"c")


def test_out_of_order_sequence_for_the_next_batch_bumps_the_epoch() -> None:
    """The broker refuses the very batch it should take next: it lost what came before
    (say an unclean leader election). That gap never fills: the partition starts over at
    sequence 0 under the next epoch, with the same producer id."""
    h = Harness()
    b, c = pipelined(h)
    h.client.respond_produce(b, {TP0: OutOfOrderSequenceNumberError})
    h.client.respond_produce(c, {TP0: OutOfOrderSequenceNumberError})
    ack_one_by_one(h)
    assert h.sequences() == [(0, 0, (b"a",)), (0, 1, (b"b",)), (0, 2, (b"c",)), (1, 0, (b"b",)), (1, 1, (b"c",))]
    assert h.init_producer_id_requests() == 1 and h.txn.producer_epoch == 1
    acked_in_order(h, b"a", b"b", b"c")


def test_out_of_order_sequence_behind_a_retried_batch_is_retried_without_a_bump() -> None:
    """Refused only because the batch before it was refused (not written): both go again,
    in order, under the same epoch and sequences."""
    h = Harness()
    b, c = pipelined(h)
    h.client.respond_produce(b, {TP0: NotEnoughReplicasError})
    h.client.respond_produce(c, {TP0: OutOfOrderSequenceNumberError})
    h.run()
    assert h.only_in_flight().batches()[TP0].base_sequence == 1  # the retry goes alone
    ack_one_by_one(h)
    assert h.sequences()[3:] == [(0, 1, (b"b",)), (0, 2, (b"c",))]
    assert h.txn.producer_epoch == 0
    acked_in_order(h, b"a", b"b", b"c")


def test_unknown_producer_id_bumps_the_epoch_and_sequences_go_on_from_0() -> None:
    """The broker no longer knows this producer on the partition (its state expired with
    the log's retention): the refused batch goes again as sequence 0 of the next epoch."""
    h = Harness()
    started(h, b"a", b"b")
    h.send(b"c")
    h.run()
    h.client.respond_produce(h.only_in_flight(), {TP0: UnknownProducerIdError})
    h.run()
    h.send(b"d")
    ack_one_by_one(h)
    assert h.sequences()[2:] == [(0, 2, (b"c",)), (1, 0, (b"c",)), (1, 1, (b"d",))]
    assert h.init_producer_id_requests() == 1
    assert {s.producer_id for s in h.wire()} == {h.client.producer_id}
    acked_in_order(h, b"a", b"b", b"c", b"d")


def test_duplicate_sequence_is_a_success_without_an_offset() -> None:
    """An older broker answers a batch it already wrote, past the five it keeps offsets
    for, with DUPLICATE_SEQUENCE_NUMBER: written once, its offset unknown; not retried and
    the sequences go on."""
    h = Harness()
    started(h, b"a")
    h.send(b"b")
    h.run()
    h.client.write(h.only_in_flight())  # written by an attempt whose answer was lost
    h.client.respond_produce(h.only_in_flight(), {TP0: DuplicateSequenceNumberError})
    h.send(b"c")
    ack_one_by_one(h)
    assert h.sequences() == [(0, 0, (b"a",)), (0, 1, (b"b",)), (0, 2, (b"c",))]
    assert h.callbacks == [(b"a", 0, None), (b"b", -1, None), (b"c", 2, None)]
    assert h.txn.producer_epoch == 0


def test_lost_reply_the_retry_is_the_same_batch_and_recognised_as_written() -> None:
    """The broker wrote two pipelined batches but the connection dropped before their
    answers: each goes again with the producer id, epoch and sequence it had, one at a
    time, and the broker answers each with the offset it wrote it at. Nothing twice."""
    h = Harness()
    b, c = pipelined(h)
    h.client.write(b)
    h.client.write(c)
    h.client.disconnect(0)
    h.run()
    assert h.only_in_flight().batches()[TP0].base_sequence == 1  # the retries go one at a time
    ack_one_by_one(h)
    assert h.sequences() == [(0, 0, (b"a",)), (0, 1, (b"b",)), (0, 2, (b"c",)), (0, 1, (b"b",)), (0, 2, (b"c",))]
    acked_in_order(h, b"a", b"b", b"c")


def test_not_leader_the_batch_follows_the_new_leader_with_its_sequence() -> None:
    h = Harness(nodes=2)
    b, c = pipelined(h)
    h.client.topics[TOPIC] = [1]  # leadership moved to node 1
    h.client.respond_produce(b, {TP0: NotLeaderOrFollowerError})
    h.client.respond_produce(c, {TP0: NotLeaderOrFollowerError})
    ack_one_by_one(h)
    # Retried on node 0 until the new metadata came (refused there again), then on node 1.
    assert [(s.sequence, s.values) for s in h.wire() if s.node == 1] == [(1, (b"b",)), (2, (b"c",))]
    retried = [seq for _, seq, _ in h.sequences()[3:]]
    assert retried == sorted(retried)  # b again until it is through; c never ahead of it
    assert h.txn.producer_epoch == 0
    acked_in_order(h, b"a", b"b", b"c")


def test_sequence_0_refused_with_not_leader_is_not_overtaken() -> None:
    """On a partition the broker holds no state for, it appends whatever sequence comes
    first. So while sequence 0 is unanswered nothing goes behind it: refused with
    NOT_LEADER_OR_FOLLOWER (a topic just created), it is still written first."""
    h = Harness(nodes=2)
    h.send(b"a", b"b", b"c")
    h.run()
    first = h.only_in_flight()
    h.run()
    assert h.in_flight() == [first]  # nothing pipelined behind sequence 0
    h.client.topics[TOPIC] = [1]
    h.client.respond_produce(first, {TP0: NotLeaderOrFollowerError})
    for _ in range(3):  # until the new metadata is in, a retry may go to node 0 again
        h.run()
        retry = h.only_in_flight()  # still alone
        assert retry.batches()[TP0].base_sequence == 0
        h.client.respond_produce(retry)
        if retry.node == 1:
            break
    ack_one_by_one(h)
    assert [(s.sequence, s.values) for s in h.wire() if s.node == 1] == [(0, (b"a",)), (1, (b"b",)), (2, (b"c",))]
    assert [s.sequence for s in h.wire() if s.node == 0] == [0] * (len(h.wire()) - 3)
    acked_in_order(h, b"a", b"b", b"c")


def test_a_failed_batch_leaves_a_gap_the_partition_starts_over_under_the_next_epoch() -> None:
    """A sequenced batch refused for good: its sequence will never be written, so later
    batches go under the next epoch from 0. Another partition's batch on the wire under
    the old epoch finishes as it is, and that partition moves to the new epoch after."""
    h = Harness(leaders=[0, 0])
    h.send(b"a")
    h.send(b"x", partition=1)
    ack_one_by_one(h)
    h.send(b"b", b"c")
    h.send(b"y", partition=1)
    h.run()
    (request,) = [r for r in h.in_flight() if TP1 in r.batches()]
    h.client.respond_produce(request, {TP0: InvalidRecordError})  # b refused for good; y written
    h.run(1)  # the answer is in: the epoch is bumped on the next round
    h.send(b"z", partition=1)
    ack_one_by_one(h)
    # c, pipelined behind b, is refused for the gap b left, and goes again as 0 of epoch 1.
    assert h.sequences(TP0) == [(0, 0, (b"a",)), (0, 1, (b"b",)), (0, 2, (b"c",)), (1, 0, (b"c",))]
    assert h.sequences(TP1) == [(0, 0, (b"x",)), (0, 1, (b"y",)), (1, 0, (b"z",))]
    (failed,) = [e for v, o, e in h.callbacks if v == b"b"]
    assert isinstance(failed, InvalidRecordError)
    acked = [(v, o) for v, o, e in h.callbacks if e is None]
    assert [a for a in acked if a[0] in b"abc"] == [(b"a", 0), (b"c", 1)]
    assert [a for a in acked if a[0] in b"xyz"] == [(b"x", 0), (b"y", 1), (b"z", 2)]
    assert h.client.values(TP0) == [b"a", b"c"]


def test_an_exhausted_epoch_gets_a_new_producer_id() -> None:
    h = Harness()
    h.client.init_producer_id_script = [(77, 0x7FFF)]
    started(h, b"a")
    h.send(b"b")
    h.run()
    h.client.respond_produce(h.only_in_flight(), {TP0: UnknownProducerIdError})
    ack_one_by_one(h)
    assert h.init_producer_id_requests() == 2
    assert [(s.producer_id, s.epoch, s.sequence) for s in h.wire()] == [
        (77, 0x7FFF, 0), (77, 0x7FFF, 1), (h.client.producer_id, 0, 0)]
    assert h.client.producer_id != 77
    acked_in_order(h, b"a", b"b")


def test_a_failing_batch_runs_its_callbacks_before_it_leaves_the_incomplete_set() -> None:
    """flush() waits for the batches incomplete when it starts: a failed batch must still
    count until its callbacks have run, or flush() could return before them."""
    h = Harness()
    seen: list[int] = []
    started(h, b"a")
    h.accumulator.append(TOPIC, 0, 0, None, b"b", headers=None,
                         callback=lambda md, error: seen.append(len(h.accumulator.incomplete())),
                         key_size=0, value_size=1, headers_size=0, max_block_ms=1000)
    h.run()
    h.client.respond_produce(h.only_in_flight(), {TP0: InvalidRecordError})
    h.run()
    assert seen == [1]
    assert h.accumulator.incomplete() == []


@pytest.mark.parametrize("idempotent", [True, False])
def test_retries_exhausted_fail_the_batch_with_the_broker_error(idempotent: bool) -> None:
    h = Harness(retries=1, settings=({} if idempotent else {"enable.idempotence": False}))
    h.send(b"a")
    h.run()
    for _ in range(2):
        h.client.respond_produce(h.only_in_flight(), {TP0: NotEnoughReplicasError})
        h.run()
    assert h.in_flight() == []
    ((value, offset, error),) = h.callbacks
    assert isinstance(error, NotEnoughReplicasError) and offset is None


def test_a_retried_batch_waits_out_the_growing_backoff_on_the_senders_clock() -> None:
    """retry.backoff.ms, doubling per attempt: the batch goes again only once the Sender's
    clock has moved past each backoff."""
    h = Harness(settings={"retry.backoff.ms": 60_000, "retry.backoff.max.ms": 600_000, "delivery.timeout.ms": 3_600_000})
    h.send(b"a")
    h.run()
    h.client.respond_produce(h.only_in_flight(), {TP0: NotEnoughReplicasError})
    h.run()
    assert h.in_flight() == []  # backing off
    h.clock.advance(60_000)
    h.run()
    h.client.respond_produce(h.only_in_flight(), {TP0: NotEnoughReplicasError})
    h.run()
    h.clock.advance(60_000)
    h.run()
    assert h.in_flight() == []  # the second backoff is twice the first
    h.clock.advance(60_000)
    h.run()
    h.client.respond_produce(h.only_in_flight())
    h.run()
    acked_in_order(h, b"a")
    assert h.sequences() == [(0, 0, (b"a",))] * 3  # the same batch each time


def test_a_batch_without_a_leader_expires_after_the_delivery_timeout() -> None:
    h = Harness(leaders=[-1])
    h.send(b"a")
    h.run()
    assert h.callbacks == [] and h.in_flight() == []
    h.clock.advance(h.config.delivery_timeout_ms - 1000)
    h.run()
    assert h.callbacks == []
    h.clock.advance(1000)
    h.run()
    ((value, offset, error),) = h.callbacks
    assert isinstance(error, KafkaTimeoutError) and "delivery.timeout.ms=120000" in str(error)
    assert "the partition has no known leader" in str(error)


def _send_offsets_and_commit(h: Harness) -> None:
    """Add a consumer group's offsets to the open transaction, then commit it."""
    offsets = h.txn.send_offsets_to_transaction({("in", 0): (5, None)}, "group")
    h.run()
    offsets.wait(0, "send_offsets_to_transaction")
    committed = h.txn.end_transaction(commit=True)
    h.run()
    committed.wait(0, "commit")


def _transaction_with(h: Harness, *values: bytes) -> None:
    h.txn.begin_transaction()
    h.txn.maybe_add_partition(TP0)
    h.send(*values)
    h.run()


@pytest.mark.parametrize("transaction_version", [1, 2])
def test_an_abort_that_drops_a_batch_queued_for_retry_starts_its_partition_over(transaction_version: int) -> None:
    """The retried batch held sequence 0 and is never sent again: the next transaction's
    first batch must not carry sequence 1 under the same epoch (a gap the broker refuses
    with OUT_OF_ORDER_SEQUENCE_NUMBER), so the abort bumps the epoch first: with
    InitProducerId under protocol v1, by EndTxn itself under v2."""
    h = Harness(settings={"transactional.id": "tx", "retry.backoff.ms": 60_000})
    h.client.transaction_version = transaction_version
    h.txn.init_transactions()
    h.run()
    _transaction_with(h, b"a")
    h.client.respond_produce(h.only_in_flight(), {TP0: NotLeaderOrFollowerError})
    h.run()  # "a" is queued for a retry, a minute away
    assert h.sequences() == [(0, 0, (b"a",))] and not h.in_flight()
    aborted = h.txn.end_transaction(commit=False)
    h.run()
    aborted.wait(0, "abort")
    assert [e for v, o, e in h.callbacks if v == b"a"] and h.callbacks[0][2] is not None
    _transaction_with(h, b"b")
    assert h.sequences()[-1] == (1, 0, (b"b",))
    assert h.init_producer_id_requests() == (2 if transaction_version == 1 else 1)
    h.client.respond_produce(h.only_in_flight())
    h.run()
    assert h.callbacks[-1] == (b"b", 0, None)


def _versions(h: Harness, api_key: ApiKey) -> list[int]:
    return [r.version for r in h.client.requests if r.api_key == api_key]


def test_protocol_v2_adds_partitions_by_produce_and_takes_the_epoch_endtxn_gives() -> None:
    """Where the cluster finalizes transaction.version 2: no AddPartitionsToTxn (Produce
    v12 adds the partition), offsets by TxnOffsetCommit v5 alone, and EndTxn v5, whose
    bumped epoch the next transaction's batches carry from sequence 0."""
    h = Harness(settings={"transactional.id": "tx"})
    h.client.transaction_version = 2
    h.txn.init_transactions()
    h.run()
    for epoch in (0, 1):
        _transaction_with(h, b"a", b"b")
        h.client.respond_produce(h.only_in_flight())
        h.run()
        h.client.respond_produce(h.only_in_flight())
        _send_offsets_and_commit(h)
        assert h.sequences()[-2:] == [(epoch, 0, (b"a",)), (epoch, 1, (b"b",))]
        assert h.txn.producer_epoch == epoch + 1
    assert not [r for r in h.client.requests
                if r.api_key in (ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN)]
    assert set(_versions(h, ApiKey.PRODUCE)) == {12}
    assert _versions(h, ApiKey.END_TXN) == [5, 5] and _versions(h, ApiKey.TXN_OFFSET_COMMIT) == [5, 5]
    assert h.init_producer_id_requests() == 1


def test_a_cluster_that_moves_to_protocol_v2_mid_transaction_gets_a_new_epoch_first() -> None:
    """transaction.version went to 2 during a v1 transaction: it ends as v1 (EndTxn v4),
    then InitProducerId bumps the epoch before the first v2 transaction, as Java does."""
    h = Harness(settings={"transactional.id": "tx"})
    h.client.transaction_version = 1
    h.txn.init_transactions()
    h.run()
    _transaction_with(h, b"a")
    h.client.respond_produce(h.only_in_flight())
    h.client.transaction_version = 2
    committed = h.txn.end_transaction(commit=True)
    h.run()
    committed.wait(0, "commit")
    assert _versions(h, ApiKey.END_TXN) == [4] and h.init_producer_id_requests() == 2
    assert h.txn.state is State.READY and h.txn.producer_epoch == 1
    _transaction_with(h, b"b")
    assert _versions(h, ApiKey.PRODUCE) == [11, 12] and h.sequences()[-1] == (1, 0, (b"b",))


def test_protocol_v1_stays_below_v2s_versions() -> None:
    """Where the cluster does not finalize transaction.version 2, a transaction adds its
    partitions and offsets itself and ends with EndTxn v4 under an unchanged epoch."""
    h = Harness(settings={"transactional.id": "tx"})
    h.client.transaction_version = 1
    h.txn.init_transactions()
    h.run()
    _transaction_with(h, b"a")
    h.client.respond_produce(h.only_in_flight())
    _send_offsets_and_commit(h)
    assert [ApiKey(r.api_key) for r in h.client.requests if r.api_key in (
        ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.PRODUCE, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT,
        ApiKey.END_TXN)] == [ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.PRODUCE, ApiKey.ADD_OFFSETS_TO_TXN,
                             ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN]
    assert (_versions(h, ApiKey.PRODUCE), _versions(h, ApiKey.TXN_OFFSET_COMMIT), _versions(h, ApiKey.END_TXN)
            ) == ([11], [4], [4])
    assert h.txn.producer_epoch == 0


def test_a_coordinator_that_moved_is_found_again() -> None:
    """EndTxn answered NOT_COORDINATOR: the cached coordinator is forgotten, found again
    with FindCoordinator, and EndTxn sent again; the commit then succeeds."""
    h = Harness(settings={"transactional.id": "tx"})
    h.client.end_txn_script = [NotCoordinatorError]
    h.txn.init_transactions()
    h.run()
    _transaction_with(h, b"a")
    h.client.respond_produce(h.only_in_flight())
    committed = h.txn.end_transaction(commit=True)
    h.run()
    committed.wait(0, "commit")
    assert [ApiKey(r.api_key) for r in h.client.requests if r.api_key in (ApiKey.FIND_COORDINATOR, ApiKey.END_TXN)
            ] == [ApiKey.FIND_COORDINATOR, ApiKey.END_TXN, ApiKey.FIND_COORDINATOR, ApiKey.END_TXN]
    assert h.txn.state is State.READY


def test_a_coordinator_that_cannot_be_reached_is_found_again() -> None:
    """The coordinator's node went down before EndTxn could be sent, and another node
    took over its transaction log: the commit looks the coordinator up again (as Java's
    Sender does) instead of waiting for the dead node, and succeeds on the new one."""
    h = Harness(nodes=2, leaders=[1], settings={"transactional.id": "tx"})
    h.txn.init_transactions()
    h.run()
    _transaction_with(h, b"a")
    h.client.respond_produce(h.only_in_flight())
    h.client.down.add(0)
    h.client.coordinator = 1
    committed = h.txn.end_transaction(commit=True)
    h.run(6)
    committed.wait(0, "commit")
    assert [(ApiKey(r.api_key), r.node) for r in h.client.requests
            if r.api_key in (ApiKey.FIND_COORDINATOR, ApiKey.END_TXN)][-2:] == [
        (ApiKey.FIND_COORDINATOR, 1), (ApiKey.END_TXN, 1)]
    assert h.txn.state is State.READY


def test_an_empty_transaction_ends_without_a_request() -> None:
    """Java's transactionStarted: EndTxn for a transaction the coordinator never heard
    of is refused with INVALID_TXN_STATE, so nothing is sent, for a commit or an abort."""
    h = Harness(settings={"transactional.id": "tx"})
    h.txn.init_transactions()
    h.run()
    for commit in (True, False, True):
        h.txn.begin_transaction()
        ended = h.txn.end_transaction(commit=commit)
        h.run()
        ended.wait(0, "end")
        assert h.txn.state is State.READY
    h.txn.begin_transaction()
    assert h.txn.prepare_transaction() is None and h.txn.state is State.READY
    assert not [r for r in h.client.requests if r.api_key == ApiKey.END_TXN]


def test_drain_starts_where_the_last_one_ran_out_of_room() -> None:
    """Twelve partitions with three batches each on one node, and room for a few batches a
    request: every partition has its first batch sent before any has its second, not the
    first few again and again while the others wait."""
    h = Harness(leaders=[0] * 12, settings={"max.request.size": 400, "enable.idempotence": False, "acks": 1})
    for p in range(12):
        h.send(b"x1" * 30, b"x2" * 30, b"x3" * 30, partition=p)
    h.run(8)  # metadata, then a request a round
    order = [tp[1] for r in h.in_flight() for tp in r.batches()]
    assert sorted(order[:12]) == list(range(12)), order
