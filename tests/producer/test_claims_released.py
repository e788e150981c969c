"""A send_arrow call that raises after its chunk claimed the batches queued for its
partitions (RecordAccumulator.continued) hands the claims back: the next calls' records
join those batches, nothing stays claimed until the batch is sent. Against a real broker
(the call's fault: its second chunk's queueing raises, as an early stop at a failed record
or a full buffer.memory does) and, randomized, against the scripted network's model."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.encoder.columnar import can_join, encode_groups
from spark_sink.producer import KafkaProducer
from tests.brokers import consume_all, create_topic, unique_topic
from tests.producer.test_joined_batches import _started
from tests.producer.test_sender_scripted import TOPIC, ack_one_by_one

pytestmark = pytest.mark.skipif(not can_join(), reason="batches are joined by the C extension")


def _queued(p: KafkaProducer, topic: str) -> dict[int, object]:
    """Each partition's last queued batch's records buffer."""
    return {q: dq[-1].records for q, dq in p._accumulator._by_topic[topic].items() if dq}


def test_a_call_that_raises_between_chunks_releases_its_claims(kafka: KafkaCluster) -> None:
    partitions = 8
    topic = create_topic(kafka.bootstrap, unique_topic("claims"), partitions=partitions)
    rng = random.Random(55)

    def table(tag: str, rows: int) -> pa.Table:
        return pa.table({"value": pa.array([b"%s-%06d-" % (tag.encode(), i) + bytes(rng.randrange(80, 120))
                                            for i in range(rows)], pa.binary()),
                         "partition": pa.array([rng.randrange(partitions) for _ in range(rows)], pa.int32())})

    # A small buffer.memory: a call of 1.5 MB is encoded in chunks (chunk_bytes_for).
    config = {"bootstrap.servers": kafka.bootstrap, "buffer.memory": 4 << 20, "batch.size": 1_000_000}
    with KafkaProducer(config) as p:
        warm, first, second, third = table("w", 100), table("a", 2_000), table("b", 12_000), table("c", 2_000)
        p.send_arrow(warm, topic).result(60)  # the topic's metadata, before the Sender is held
        accumulator = p._accumulator
        real, chunks = accumulator.append_encoded, []

        def second_chunk_fails(*args: object, **kwargs: object) -> None:
            chunks.append(args[1])
            if len(chunks) == 2:
                raise MemoryError("the test's fault: the second chunk is not queued")
            real(*args, **kwargs)  # type: ignore[arg-type]

        # The Sender held (as while it waits on the brokers): the calls' batches stay queued.
        with p._sender.io_lock:
            futures = [p.send_arrow(first, topic)]
            buffers = _queued(p, topic)
            assert len(buffers) == partitions
            accumulator.append_encoded = second_chunk_fails  # type: ignore[method-assign]
            try:
                with pytest.raises(MemoryError, match="test's fault") as raised:
                    p.send_arrow(second, topic)
            finally:
                del accumulator.append_encoded
            assert len(chunks) == 2, "the call was meant to raise between chunks"
            futures.append(raised.value.future)  # type: ignore[attr-defined]
            # nothing left claimed: the next call continues the same batches, in place
            assert not any(b.claimed for b in buffers.values())  # type: ignore[attr-defined]
            futures.append(p.send_arrow(third, topic))
            assert _queued(p, topic) == buffers
            assert all(len(dq) == 1 for dq in accumulator._by_topic[topic].values())
        p.flush(60)
        queued_second = futures[1].result(60).records
    assert 0 < queued_second < len(second)
    got: dict[int, list[bytes]] = {}
    for m in sorted(consume_all(kafka.bootstrap, topic, len(warm) + len(first) + queued_second + len(third)),
                    key=lambda m: (m.partition(), m.offset())):
        got.setdefault(m.partition(), []).append(m.value())
    sent_second = second.slice(0, queued_second)  # the first chunk's rows: a prefix of the call
    for q in range(partitions):
        expected = [v for t in (warm, first, sent_second, third)
                    for v, r in zip(t.column("value").to_pylist(), t.column("partition").to_pylist()) if r == q]
        assert got.get(q, []) == expected


@pytest.mark.parametrize("seed", range(12))
def test_abandoned_calls_leave_no_claim_and_later_calls_join(seed: int) -> None:
    """Calls claimed and then abandoned (before or after their encoding, as a call that
    raises) among calls that go through and Sender rounds: once released, no buffer is
    left claimed by them, later calls still join the batches, and the model holds (every
    record once, in order, memory all back)."""
    rng = random.Random(5500 + seed)
    h, calls = _started(rng.choice([1, 4, 24]), **{"batch.size": rng.choice([900, 1_000_000])})
    abandoned = 0
    for _ in range(rng.randrange(4, 12)):
        step = rng.random()
        if step < 0.35:
            continued = h.accumulator.continued(TOPIC, range(calls.partitions))
            assert continued is not None
            if rng.random() < 0.5:  # encoded, then abandoned: its rows past the buffers' end
                encode_groups(None, pa.array([b"x" * rng.randrange(1, 50)] * 20), np.zeros(20, np.int64), None,
                              np.array([rng.randrange(calls.partitions) for _ in range(20)], np.int64),
                              calls.partitions, batch_size=h.config.batch_size, continued=continued)
            if rng.random() < 0.3:
                calls.rounds(1)
            h.accumulator.release(continued)
            abandoned += 1
        elif step < 0.85:
            calls.call(rng.randrange(1, 200), rng, rounds_between=rng.choice([0, 0, 1]))
        else:
            calls.rounds(1)
        queued = [b for dq in h.accumulator._batches.values() for b in dq]
        assert not any(getattr(b.records, "claimed", 0) for b in queued)
    # a last call joins what is queued (where batch.size leaves room)
    before = {p: dq[-1].records for p, dq in h.accumulator._by_topic.get(TOPIC, {}).items() if dq}
    claims = h.accumulator.continued(TOPIC, range(calls.partitions))
    assert claims is not None
    joinable = [p for p, dq in h.accumulator._by_topic.get(TOPIC, {}).items()  # send_arrow's, never sent
                if dq and dq[-1].records is not None and dq[-1].segments is not None and not dq[-1].attempts]
    assert all(claims.targets[p] is before[p] for p in joinable)
    h.accumulator.release(claims)
    ack_one_by_one(h)
    calls.check_delivered()
