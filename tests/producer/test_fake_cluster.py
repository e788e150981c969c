"""A whole KafkaProducer (its threads, accumulator, buffer pool, Sender and transactions)
against the in-process fake cluster: what the client decides on its own, in milliseconds
and without a JVM (``make unit``). What a broker decides is tested on real Kafka."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from spark_sink.producer import KafkaProducer, ProducerClosedError, ProducerRecord, RecordMetadata
from spark_sink.producer.batch import SendCallback
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import NotLeaderOrFollowerError
from tests.clock import MovedClock
from tests.producer.fake_cluster import FakeCluster

TOPIC = "t"


def _producer(cluster: FakeCluster, **config: object) -> KafkaProducer:
    return KafkaProducer({"bootstrap.servers": "fake:9092", "linger.ms": 0, **config}, network_client=cluster)


def _acked_at(md: RecordMetadata | None) -> tuple[int, int]:
    """(partition, offset) of an acknowledged record."""
    assert md is not None
    return md.partition, md.offset


def test_records_land_in_order_with_their_offsets_and_callbacks() -> None:
    cluster = FakeCluster(topics={TOPIC: [0, 0]})
    seen = []
    with _producer(cluster) as producer:
        futures = [producer.send(ProducerRecord(TOPIC, b"%d" % i, partition=i % 2),
                                 lambda md, err: seen.append((*_acked_at(md), err)))
                   for i in range(2000)]
        producer.flush(10)
        offsets = [(f.result(0).partition, f.result(0).offset) for f in futures]
    assert cluster.values((TOPIC, 0)) == [b"%d" % i for i in range(0, 2000, 2)]
    assert cluster.values((TOPIC, 1)) == [b"%d" % i for i in range(1, 2000, 2)]
    assert offsets == [(i % 2, i // 2) for i in range(2000)]
    assert sorted(seen) == sorted((p, o, None) for p, o in offsets)


def test_a_lost_answer_is_retried_and_written_once() -> None:
    cluster = FakeCluster(topics={TOPIC: [0]}, lose_answers=1)
    with _producer(cluster) as producer:
        first = producer.send(ProducerRecord(TOPIC, b"a"))
        assert first.result(10).offset == 0  # the broker's first write, recognised by its sequence
        producer.send(ProducerRecord(TOPIC, b"b")).result(10)
    assert cluster.values((TOPIC, 0)) == [b"a", b"b"]


def test_a_retriable_error_is_retried_within_the_delivery_timeout() -> None:
    cluster = FakeCluster(topics={TOPIC: [0]}, fail_next={(TOPIC, 0): [NotLeaderOrFollowerError] * 3})
    with _producer(cluster, **{"retry.backoff.ms": 1}) as producer:
        assert producer.send(ProducerRecord(TOPIC, b"a")).result(10).offset == 0
        assert producer.metrics()["record-retry-total"] == 3
    assert cluster.values((TOPIC, 0)) == [b"a"]


@pytest.mark.parametrize("protocol", [1, 2])
def test_send_arrow_and_a_committed_transaction(protocol: int) -> None:
    cluster = FakeCluster(topics={TOPIC: [0, 0, 0]}, transaction_version=protocol)
    with _producer(cluster, **{"transactional.id": "tx"}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_arrow(pa.table({"key": [b"k%d" % i for i in range(300)], "value": [b"v"] * 300}),
                            topic=TOPIC).result(10)
        producer.commit_transaction()
    assert sum(len(cluster.values((TOPIC, p))) for p in range(3)) == 300
    ended = [r.body for r in cluster.requests if r.api_key == ApiKey.END_TXN]
    assert [e.committed for e in ended] == [True]
    # v1 adds the partitions before producing; v2's Produce adds them itself (KIP-890)
    added = [r for r in cluster.requests if r.api_key == ApiKey.ADD_PARTITIONS_TO_TXN]
    assert bool(added) == (protocol == 1)


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_every_acks_setting_completes_every_future(acks: str) -> None:
    cluster = FakeCluster(topics={TOPIC: [0]})
    with _producer(cluster, acks=acks, **({"enable.idempotence": "false"} if acks != "all" else {})) as producer:
        futures = [producer.send(ProducerRecord(TOPIC, b"x")) for _ in range(100)]
        producer.flush(10)
    assert all(f.done() for f in futures)
    assert len(cluster.values((TOPIC, 0))) == 100


def test_threads_sending_at_once_lose_and_reorder_nothing() -> None:
    """send()'s short way (compiled: without the accumulator's lock while no thread holds
    it) from several threads at once while batches fill, are drained and complete: every
    record lands once, each thread's records of a key in send order, and every callback
    says where its record is."""
    cluster = FakeCluster(topics={TOPIC: [0, 0, 0]})
    senders, per_sender = 4, 3000
    where: dict[bytes, tuple[int, int]] = {}
    errors: list[Exception] = []

    def on_ack(value: bytes) -> SendCallback:
        def callback(md: RecordMetadata | None, err: Exception | None) -> None:
            if err is not None:
                errors.append(err)
            else:
                where[value] = _acked_at(md)
        return callback

    with _producer(cluster, **{"batch.size": 512, "linger.ms": 1}) as producer:
        def send_all(sender: int) -> None:
            for i in range(per_sender):
                value = b"%d-%d" % (sender, i)
                producer.send(ProducerRecord(TOPIC, value, key=b"k%d" % (i % 5)), on_ack(value))

        threads = [threading.Thread(target=send_all, args=(n,)) for n in range(senders)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        producer.flush(30)
    logs = {p: cluster.values((TOPIC, p)) for p in range(3)}
    assert not errors
    assert sorted(v for log in logs.values() for v in log) == sorted(where)
    assert len(where) == senders * per_sender
    assert all(where[v] == (p, offset) for p, log in logs.items() for offset, v in enumerate(log))
    for key in range(5):  # one key's records go to one partition, each sender's in send order
        assert len({where[v][0] for v in where if int(v.split(b"-")[1]) % 5 == key}) == 1
    for log in logs.values():
        for sender in range(senders):
            numbers = [int(v.split(b"-")[1]) for v in log if v.startswith(b"%d-" % sender)]
            for key in range(5):
                of_key = [i for i in numbers if i % 5 == key]
                assert of_key == sorted(of_key)


def test_send_takes_its_callback_by_position_or_name_and_refuses_after_close() -> None:
    """send()'s calling conventions (compiled: PlainSender.send in send()'s place)."""
    cluster = FakeCluster(topics={TOPIC: [0]})
    heard: list[int] = []
    record = ProducerRecord(TOPIC, b"v", key=b"k")
    with _producer(cluster) as producer:
        futures = [producer.send(record), producer.send(record, lambda md, err: heard.append(_acked_at(md)[1])),
                   producer.send(record, callback=lambda md, err: heard.append(_acked_at(md)[1]))]
        with pytest.raises(TypeError):
            producer.send()  # type: ignore[call-arg]  # wrong on purpose
        with pytest.raises(TypeError):
            producer.send(record, None, None)  # type: ignore[call-arg]  # wrong on purpose
        with pytest.raises(TypeError):
            producer.send(record, on_ack=None)  # type: ignore[call-arg]  # wrong on purpose
        producer.flush(10)
    assert [f.result(0).offset for f in futures] == [0, 1, 2]
    assert heard == [1, 2]
    with pytest.raises(ProducerClosedError):
        producer.send(record)


def test_a_batch_lingers_on_the_producers_clock() -> None:
    """The accumulator stamps a new batch with the producer's clock: a batch started after
    the clock moved two minutes lingers its linger.ms from there (stamped with the real
    time, it would look two minutes old and go at once)."""
    cluster, clock = FakeCluster(topics={"t": [0]}), MovedClock()
    config = {"bootstrap.servers": "fake:9092", "linger.ms": 60_000, "batch.size": 1 << 20}
    with KafkaProducer(config, network_client=cluster, clock=clock) as p:
        p.send(ProducerRecord("t", b"first"))
        p.flush(10)  # the metadata, and one batch out
        clock.advance(120_000)
        future = p.send(ProducerRecord("t", b"lingering"))
        time.sleep(0.5)  # rounds of the Sender: none may send the batch yet
        assert not future.done(), "the batch went before its linger.ms on the producer's clock"
        p.flush(10)
        assert future.result(0).offset == 1
    assert cluster.values(("t", 0)) == [b"first", b"lingering"]
