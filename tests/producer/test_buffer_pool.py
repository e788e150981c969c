"""BufferPool: buffer.memory accounting, blocking up to max.block.ms, waiters in order;
and back-pressure end to end against a stalled broker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.client.errors import BufferExhaustedError, KafkaTimeoutError, RecordTooLargeError
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.producer.buffer_pool import BufferPool
from tests.brokers import consume_all, create_topic, unique_topic

if TYPE_CHECKING:
    from spark_sink.encoder.columnar import EncodedRecords
    from spark_sink.producer.accumulator import RecordAccumulator
    from tests.conftest import ProxiedKafka


def _allocate_in_thread(pool: BufferPool, size: int, done: list, max_block_ms: float = 10_000) -> threading.Thread:
    def run() -> None:
        pool.allocate(size, max_block_ms)
        done.append(size)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _wait_for(condition: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_a_caller_about_to_wait_tells_on_block_once() -> None:
    """The producer sets on_block to wake its sender thread: a sending thread that had been
    doing the sender's work is about to stop doing it."""
    pool = BufferPool(100)
    calls = []
    pool.on_block = lambda: calls.append(1)
    pool.allocate(60, 1000)
    pool.allocate(40, 1000)
    assert calls == []  # no wait, no call
    done: list[int] = []
    _allocate_in_thread(pool, 50, done)
    _wait_for(lambda: pool.exhausted)
    assert calls == [1]
    pool.deallocate(60)
    _wait_for(lambda: done == [50])
    assert calls == [1]


def test_allocate_blocks_until_enough_is_freed() -> None:
    pool = BufferPool(100)
    pool.allocate(80, 0)
    done: list = []
    thread = _allocate_in_thread(pool, 50, done)
    _wait_for(lambda: pool.exhausted)
    pool.deallocate(20)  # 40 available: still not enough for 50
    time.sleep(0.05)
    assert done == [] and pool.exhausted
    pool.deallocate(20)
    thread.join(5)
    assert done == [50] and pool.available == 10 and not pool.exhausted


def test_waiters_are_served_in_arrival_order() -> None:
    pool = BufferPool(100)
    pool.allocate(100, 0)
    done: list = []
    big = _allocate_in_thread(pool, 90, done)
    _wait_for(lambda: pool.exhausted)
    small = _allocate_in_thread(pool, 10, done)
    time.sleep(0.05)
    pool.deallocate(50)  # enough for the small one, but the big one came first
    time.sleep(0.05)
    assert done == []
    pool.deallocate(50)
    big.join(5)
    small.join(5)
    assert done == [90, 10] and pool.available == 0


def test_timeout_names_buffer_memory_and_max_block_ms_and_lets_the_next_waiter_go() -> None:
    pool = BufferPool(100)
    pool.allocate(60, 0)
    done: list = []
    with pytest.raises(BufferExhaustedError, match=r"max.block.ms \(50 ms\).*buffer.memory \(100 bytes\)"):
        pool.allocate(70, 50)
    assert not pool.exhausted and pool.available == 40
    pool.allocate(40, 0)  # nothing left waiting: served at once
    with pytest.raises(RecordTooLargeError, match="buffer.memory"):
        pool.allocate(101, 1000)
    assert done == []


def test_a_waiter_that_abandons_stops_waiting_when_woken_and_the_next_is_served() -> None:
    """allocate(..., abandon): woken by wake_all() it raises what abandon() says, leaves the
    queue, and the waiter behind it gets the memory; until abandon says so it keeps waiting."""
    pool = BufferPool(100)
    pool.allocate(90, 0)
    reason: list[Exception] = []
    raised: list[BaseException] = []

    def abandoning() -> None:
        try:
            pool.allocate(50, 60_000, lambda: reason[0] if reason else None)
        except BaseException as exc:  # what the waiter raised is what is checked
            raised.append(exc)

    first = threading.Thread(target=abandoning, daemon=True)
    first.start()
    _wait_for(lambda: pool.exhausted)
    done: list = []
    second = _allocate_in_thread(pool, 10, done)
    pool.wake_all()  # nothing to abandon yet: both still wait (10 bytes are free, but the first waiter is first)
    time.sleep(0.05)
    assert not raised and done == []
    reason.append(KafkaTimeoutError("records of the call failed"))
    pool.wake_all()
    first.join(5)
    second.join(5)
    assert [str(e) for e in raised] == ["records of the call failed"]
    assert done == [10] and pool.available == 0


def test_send_blocks_on_a_stalled_broker_then_fails_and_keeps_what_was_acknowledged(kafka_proxy: ProxiedKafka) -> None:
    proxy, broker = kafka_proxy.proxy, kafka_proxy
    topic = create_topic(broker.bootstrap, unique_topic("backpressure"), partitions=1)
    config = {"bootstrap.servers": broker.bootstrap, "buffer.memory": 64 * 1024, "batch.size": 4096,
              "max.block.ms": 300, "linger.ms": 0}
    with KafkaProducer(config) as producer:
        before = [producer.send(ProducerRecord(topic, b"before-%d" % i)) for i in range(20)]
        producer.flush(30)
        proxy.stall()
        accepted = []
        # After the 300 ms given (not the 60 s default, nor a hang pytest-timeout would fail).
        with pytest.raises(BufferExhaustedError, match=r"within max.block.ms \(300 ms\): buffer.memory"):
            for i in range(10_000):  # 1 KiB each: far more than 64 KiB
                accepted.append(producer.send(ProducerRecord(topic, b"%05d" % i + b"x" * 1019)))
        assert 0 < len(accepted) < 64
        proxy.stall(False)
        producer.flush(60)
    assert [f.result(0).offset for f in before] == list(range(20))
    assert [f.result(0).offset for f in accepted] == list(range(20, 20 + len(accepted)))
    got = consume_all(broker.bootstrap, topic, expected=20 + len(accepted))
    assert [m.value() for m in got[:20]] == [b"before-%d" % i for i in range(20)]
    assert [m.value()[:5] for m in got[20:]] == [b"%05d" % i for i in range(len(accepted))]


def test_send_arrow_larger_than_buffer_memory_is_delivered_whole(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("arrow-backpressure"), partitions=2)
    n = 20_000
    values = pa.array([b"%08d" % i + b"v" * 92 for i in range(n)], pa.binary())  # ~2 MB against 256 KiB
    config = {"bootstrap.servers": kafka.bootstrap, "buffer.memory": 256 * 1024, "batch.size": 16384}
    with KafkaProducer(config) as producer:
        result = producer.send_arrow(pa.table({"value": values}), topic=topic).result(60)
    assert result.records == n
    got = consume_all(kafka.bootstrap, topic, expected=n)
    assert sorted(m.value()[:8] for m in got) == [b"%08d" % i for i in range(n)]


def _accumulator(buffer_memory: int) -> tuple[RecordAccumulator, BufferPool]:
    from spark_sink.producer.accumulator import RecordAccumulator
    from spark_sink.producer.config import ProducerConfig

    config = ProducerConfig.from_dict({"bootstrap.servers": "localhost:9092", "buffer.memory": buffer_memory,
                                       "batch.size": 16384})
    pool = BufferPool(buffer_memory)
    return RecordAccumulator(config, pool), pool


def _encoded_groups(rows: int) -> list:
    """(partition, batches) for two partitions, each partition's payloads views of one buffer."""
    import numpy as np

    from spark_sink.encoder.columnar import encode_groups

    values = pa.array([b"v" * 100] * rows, pa.binary())
    groups = encode_groups(None, values, np.zeros(rows, np.int64), None, np.arange(rows) % 2, 2, batch_size=16384)
    return list(enumerate(groups))


def _append_and_take(accumulator: RecordAccumulator, groups: list[tuple[int, list[EncodedRecords]]]) -> list:
    accumulator.append_encoded("t", groups, 0.0, 1000, listener=lambda *heard: None, queued=lambda *counts: None,
                               wakeup=lambda: None)
    return accumulator.abort_undrained()


def test_batches_sharing_one_encoded_buffer_hold_its_memory_until_the_last_completes() -> None:
    accumulator, pool = _accumulator(1 << 20)
    groups = _encoded_groups(1000)  # ~110 KB in 8 batches of two partitions, each its own buffer
    for _, encoded in groups:
        assert len(encoded) > 2 and len({id(e.payload.obj) for e in encoded}) == 1
    assert groups[0][1][0].payload.obj is not groups[1][1][0].payload.obj
    sizes = {p: sum(e.size_in_bytes for e in encoded) for p, encoded in groups}
    batches = _append_and_take(accumulator, groups)
    assert pool.available == pool.total - sum(sizes.values())
    first, second = ([b for b in batches if b.partition == p] for p in (0, 1))
    for batch in first[:-1]:
        accumulator.completed([batch])
        assert pool.available == pool.total - sum(sizes.values())  # partition 0's buffer is still alive
    accumulator.completed(first[-1:] + first[:1])  # a batch completed twice frees nothing more
    assert pool.available == pool.total - sizes[1]  # partition 1's batches still hold theirs
    accumulator.completed(second)
    assert pool.available == pool.total


def test_a_group_too_large_to_reserve_at_once_is_copied_and_freed_batch_by_batch() -> None:
    accumulator, pool = _accumulator(100_000)
    groups = _encoded_groups(1000)  # ~110 KB: more than a quarter of buffer.memory (and all of it)
    sizes = [e.size_in_bytes for _, batches in groups for e in batches]
    appended: list = []

    def append() -> None:
        accumulator.append_encoded("t", groups, 0.0, 10_000, listener=lambda *heard: None, queued=lambda *counts: None,
                                   wakeup=lambda: None)

    thread = threading.Thread(target=append, daemon=True)
    thread.start()
    while thread.is_alive() or accumulator.has_undrained():
        for batch in accumulator.abort_undrained():  # as the sender would, one at a time
            assert batch.encoded is not None and isinstance(batch.encoded.payload, bytes)
            accumulator.completed([batch])
            appended.append(batch)
        time.sleep(0.001)
    thread.join()
    assert [b.encoded.size_in_bytes for b in appended] == sizes
    assert pool.available == pool.total
