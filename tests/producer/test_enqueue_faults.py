"""A fault while send_arrow's batches are being queued (RecordAccumulator._enqueue), between
one partition and the next: the partitions queued before it are sent and heard (their
records counted by ``queued``, their reservation freed once, when their batches
complete), the rest's reservation is given back, and buffer.memory ends where it began.
The fault is a partition whose join raises (a MemoryError growing the batch it joins),
against the scripted network of test_sender_scripted."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from spark_sink.encoder.columnar import can_join, encode_groups
from spark_sink.producer.accumulator import RUN_PARTITIONS
from spark_sink.producer.batch import ProducerBatch
from tests.producer.test_sender_scripted import TOPIC, Harness, ack_one_by_one

pytestmark = pytest.mark.skipif(not can_join(), reason="batches are joined by the C extension")


class Queued:
    """What ``queued`` heard, added up: records and parts."""

    def __init__(self) -> None:
        self.records = self.parts = 0

    def __call__(self, records: int, nbytes: int, parts: int) -> None:
        self.records += records
        self.parts += parts


def _call(h: Harness, partitions: int, rows: int, rng: random.Random, tag: int, queued: Queued,
          heard: list[int]) -> tuple[list[tuple[int, list[bytes]]], Exception | None]:
    """One send_arrow-like call of a row for every partition and ``rows`` more at random
    ones, encoded as the continuation of what is queued (as send_arrow does) and queued
    straight into the accumulator: its partitions' values in queueing order, and what it
    raised."""
    parts = np.array(list(range(partitions)) + [rng.randrange(partitions) for _ in range(rows)], np.int64)
    values = [b"c%d-r%d-" % (tag, i) + bytes(rng.randrange(0, 40)) for i in range(len(parts))]
    groups = encode_groups(None, pa.array(values, pa.binary()), np.full(len(parts), 1_000 + tag, np.int64), None,
                           parts, partitions, batch_size=h.config.batch_size,
                           continued=h.accumulator.continued(TOPIC, range(partitions)))
    by_partition = {p: [v for q, v in zip(parts.tolist(), values) if q == p] for p in range(partitions)}

    def listener(batch: ProducerBatch, offset: int, count: int, order: float) -> None:
        assert batch.error is None
        heard.append(count)

    chunk = [(p, b) for p, b in enumerate(groups) if b]
    try:
        h.accumulator.append_encoded(TOPIC, chunk, h.clock(), 1000, listener, queued, lambda: None)
    except Exception as exc:  # the test's own fault, checked by the caller
        return [(p, by_partition[p]) for p, _ in chunk], exc
    return [(p, by_partition[p]) for p, _ in chunk], None


class FaultyJoiner:
    """The accumulator's compiled Joiner, raising where it comes to the ``faulty``
    partition's records (as a MemoryError there would): the partitions before it done, that
    one and the rest left as they were."""

    def __init__(self, joiner: Any, faulty: int) -> None:
        self.joiner, self.faulty = joiner, faulty
        self.claim, self.sizes = joiner.claim, joiner.sizes

    def enqueue(self, queues: Any, groups: list, start: int, end: int, *rest: Any) -> int:
        at = next((k for k in range(start, end) if groups[k][0] == self.faulty), end)
        reached = self.joiner.enqueue(queues, groups, start, at, *rest)
        if reached == at < end:
            raise MemoryError(f"injected: no memory to join partition {self.faulty}'s records")
        return reached


@pytest.mark.parametrize("seed", range(12))
def test_a_join_that_raises_between_partitions_frees_each_reservation_once(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    # More partitions than a run, at times: the fault in the second run as well as the first.
    partitions = rng.choice([4, 16, RUN_PARTITIONS + rng.randrange(1, 40)])
    h = Harness(leaders=[p % 2 for p in range(partitions)], nodes=2,
                settings={"batch.size": 1_000_000, "max.in.flight.requests.per.connection": 5})
    h.run()
    pool = h.accumulator._pool
    queued, heard = Queued(), list[int]()
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}

    def delivered(chunk: list[tuple[int, list[bytes]]], upto: int) -> None:
        for p, values in chunk[:upto]:
            sent[p] += values

    # Earlier calls, queued and left undrained: the faulty call's partitions join them.
    for tag in range(rng.randrange(1, 3)):
        chunk, error = _call(h, partitions, rng.randrange(partitions, 6 * partitions), rng, tag, queued, heard)
        assert error is None
        delivered(chunk, len(chunk))

    faulty = rng.randrange(partitions)
    real_join = ProducerBatch.join

    def join(self: ProducerBatch, *args: object, **kwargs: object) -> bool:
        if self.partition == faulty:
            raise MemoryError(f"injected: no memory to join partition {faulty}'s records")
        return real_join(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ProducerBatch, "join", join)
    monkeypatch.setattr(h.accumulator, "_joiner", FaultyJoiner(h.accumulator._joiner, faulty))
    chunk, error = _call(h, partitions, rng.randrange(2 * partitions, 8 * partitions), rng, 99, queued, heard)
    monkeypatch.setattr(ProducerBatch, "join", real_join)
    monkeypatch.undo()
    at = [p for p, _ in chunk].index(faulty)
    assert isinstance(error, MemoryError), error
    delivered(chunk, at)  # the partitions before the fault's: queued, the rest not

    ack_one_by_one(h)
    for p in range(partitions):
        assert h.client.values((TOPIC, p)) == sent[p], p
    assert h.accumulator.incomplete() == []
    assert pool.available == pool.total, f"{pool.available - pool.total} bytes freed twice"
    # Everything queued is counted as queued: what the call's future waits for.
    assert queued.records == sum(map(len, sent.values()))
    assert len(heard) == queued.parts and sum(heard) == queued.records


@pytest.mark.parametrize("seed", range(4))
def test_a_fault_after_a_partitions_join_keeps_the_joined_records(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition whose records join its queued batch and then need a batch of their own
    (batch.size cut them), and making that batch fails: the joined records are queued and
    counted, the rest of the partition and of the run are not, and their memory comes back."""
    rng = random.Random(seed)
    partitions = 4
    h = Harness(leaders=[0] * partitions, settings={"batch.size": 2_000, "max.in.flight.requests.per.connection": 5})
    h.run()
    pool = h.accumulator._pool
    queued, heard = Queued(), list[int]()
    first, error = _call(h, partitions, 8, rng, 0, queued, heard)
    assert error is None
    faulty = rng.randrange(partitions)
    real_init = ProducerBatch.__init__

    def init(self: ProducerBatch, topic: str, partition: int, *args: object, **kwargs: object) -> None:
        if partition == faulty:
            raise MemoryError(f"injected: no memory for a batch of partition {faulty}")
        real_init(self, topic, partition, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ProducerBatch, "__init__", init)
    chunk, error = _call(h, partitions, 600, rng, 1, queued, heard)
    monkeypatch.setattr(ProducerBatch, "__init__", real_init)
    assert isinstance(error, MemoryError), error
    ack_one_by_one(h)
    got = {p: h.client.values((TOPIC, p)) for p in range(partitions)}
    at = [p for p, _ in chunk].index(faulty)
    for i, (p, values) in enumerate(chunk):
        before = [v for q, vs in first if q == p for v in vs]
        if i < at:
            assert got[p] == before + values, p
        elif i > at:
            assert got[p] == before, p
        else:  # its first records joined the batch queued before, the rest went nowhere
            assert got[p][:len(before)] == before and got[p] == before + values[:len(got[p]) - len(before)], p
    assert h.accumulator.incomplete() == []
    assert pool.available == pool.total, f"{pool.available - pool.total} bytes freed twice"
    assert sum(map(len, got.values())) == queued.records
    assert len(heard) == queued.parts and sum(heard) == queued.records
