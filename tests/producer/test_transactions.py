"""Transactions on Apache Kafka, read back by an independent read_committed consumer."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.producer import (
    AbortableTransactionError,
    FatalTransactionError,
    IllegalStateError,
    KafkaProducer,
    PreparedTransaction,
    ProducerRecord,
)
from spark_sink.protocol.error_codes import InvalidProducerEpochError, ProducerFencedError
from tests.brokers import consume_all, consumer, create_topic, unique_topic

COMMITTED = {"isolation.level": "read_committed"}


def _producer(bootstrap: str, txn_id: str, **extra: object) -> KafkaProducer:
    return KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 0, **extra})


def _values(bootstrap: str, topic: str, expected: int, settle: float = 1.0) -> list[bytes]:
    return sorted(m.value() for m in consume_all(bootstrap, topic, expected, settle=settle, overrides=COMMITTED))


def test_committed_is_visible_and_aborted_is_not(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("txn"), partitions=3)
    with _producer(kafka.bootstrap, unique_topic("tid")) as p:
        p.init_transactions()
        p.begin_transaction()
        for i in range(30):
            p.send(ProducerRecord(topic, b"committed-%02d" % i, key=b"%d" % i))
        p.send_arrow(pa.table({"value": [b"arrow-%02d" % i for i in range(20)]}), topic)
        p.commit_transaction()
        p.begin_transaction()
        futures = [p.send(ProducerRecord(topic, b"aborted-%02d" % i)) for i in range(10)]
        p.flush()  # written to the log, then aborted: read_committed readers skip them
        assert all(f.exception() is None for f in futures)
        p.abort_transaction()
        p.begin_transaction()
        p.send(ProducerRecord(topic, b"last"))
        p.commit_transaction()
    got = _values(kafka.bootstrap, topic, 51)
    assert got == sorted([b"committed-%02d" % i for i in range(30)] + [b"arrow-%02d" % i for i in range(20)] + [b"last"])
    # read_uncommitted sees the aborted records too: they were written, not dropped
    uncommitted = consume_all(kafka.bootstrap, topic, 61, settle=0.5, overrides={"isolation.level": "read_uncommitted"})
    assert sum(m.value().startswith(b"aborted") for m in uncommitted) == 10


def test_a_second_producer_with_the_same_id_fences_the_first(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("fence"), partitions=1)
    tid = unique_topic("tid")
    first = _producer(kafka.bootstrap, tid)
    second = _producer(kafka.bootstrap, tid)
    try:
        first.init_transactions()
        first.begin_transaction()
        first.send(ProducerRecord(topic, b"from-first")).result(30)
        second.init_transactions()  # aborts first's open transaction and fences it
        with pytest.raises(FatalTransactionError) as raised:
            first.commit_transaction()
        assert isinstance(raised.value.error, (ProducerFencedError, InvalidProducerEpochError))
        assert "fenced" in str(raised.value)
        with pytest.raises(FatalTransactionError):
            first.begin_transaction()  # fatal: it can only be closed
        second.begin_transaction()
        second.send(ProducerRecord(topic, b"from-second"))
        second.commit_transaction()
    finally:
        first.close(0)
        second.close()
    assert _values(kafka.bootstrap, topic, 1) == [b"from-second"]


def test_fenced_producer_send_fails(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("fence-send"), partitions=1)
    tid = unique_topic("tid")
    with _producer(kafka.bootstrap, tid) as first, _producer(kafka.bootstrap, tid) as second:
        first.init_transactions()
        first.begin_transaction()
        first.send(ProducerRecord(topic, b"a")).result(30)
        second.init_transactions()
        late = first.send(ProducerRecord(topic, b"late"))
        error = late.exception(30)
        assert isinstance(error, (ProducerFencedError, InvalidProducerEpochError, FatalTransactionError,
                                  AbortableTransactionError)), error
        # INVALID_PRODUCER_EPOCH on Produce is abortable (as Java has it): the abort then
        # learns from the coordinator that a newer producer took the id.
        with pytest.raises((FatalTransactionError, AbortableTransactionError)):
            first.commit_transaction()
        with pytest.raises(FatalTransactionError, match="fenced"):
            first.abort_transaction()


def test_offsets_commit_atomically_with_the_records(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("offsets"), partitions=2)
    group = unique_topic("group")
    with _producer(kafka.bootstrap, unique_topic("tid")) as p, AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        p.init_transactions()
        p.begin_transaction()
        p.send(ProducerRecord(topic, b"r1"))
        p.send_offsets_to_transaction({(topic, 0): 7, (topic, 1): (9, "meta")}, group)
        p.abort_transaction()
        assert admin.committed_offsets({group: [(topic, 0), (topic, 1)]})[group] == {
            (topic, 0): (-1, None), (topic, 1): (-1, None)}
        p.begin_transaction()
        p.send(ProducerRecord(topic, b"r2"))
        p.send_offsets_to_transaction({(topic, 0): 7, (topic, 1): (9, "meta")}, group)
        p.commit_transaction()
        assert admin.committed_offsets({group: [(topic, 0), (topic, 1)]})[group] == {
            (topic, 0): (7, ""), (topic, 1): (9, "meta")}
    assert _values(kafka.bootstrap, topic, 1) == [b"r2"]
    # an ordinary consumer of the group starts where the transaction said
    c = consumer(kafka.bootstrap, **{"group.id": group})
    try:
        from confluent_kafka import TopicPartition
        committed = c.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
        assert [tp.offset for tp in committed] == [7, 9]
    finally:
        c.close()


def test_prepared_transaction_is_ended_by_another_client(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("2pc"), partitions=2)
    prepared: list[PreparedTransaction] = []
    for name, n in (("commit", 5), ("abort", 3)):
        with _producer(kafka.bootstrap, unique_topic(f"tid-{name}")) as p:
            p.init_transactions()
            p.begin_transaction()
            for i in range(n):
                p.send(ProducerRecord(topic, f"{name}-{i}".encode()))
            transaction = p.prepare_transaction()
            assert transaction is not None
            prepared.append(transaction)
            with pytest.raises(IllegalStateError):
                p.send(ProducerRecord(topic, b"after prepare"))
    assert all(t.producer_id >= 0 and t.producer_epoch >= 0 for t in prepared)
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        admin.end_transactions([prepared[0]], commit=True)
        admin.end_transactions([prepared[0]], commit=True)  # a retry after a lost answer is harmless
        admin.end_transactions([prepared[1]], commit=False)
    assert _values(kafka.bootstrap, topic, 5) == [f"commit-{i}".encode() for i in range(5)]


def test_calls_out_of_order_name_the_state(kafka: KafkaCluster) -> None:
    with _producer(kafka.bootstrap, unique_topic("tid")) as p:
        with pytest.raises(IllegalStateError, match="UNINITIALIZED"):
            p.begin_transaction()
        p.init_transactions()
        with pytest.raises(IllegalStateError, match="open transaction"):
            p.send(ProducerRecord("any", b"x"))
        with pytest.raises(IllegalStateError, match="READY"):
            p.commit_transaction()
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as plain, pytest.raises(IllegalStateError,
                                                                                      match="transactional.id"):
        plain.init_transactions()
