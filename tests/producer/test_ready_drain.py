"""RecordAccumulator.ready() and drain() over partitions kept grouped by leader, against a
model that looks at every partition: random appends, leader moves (the Metadata's leaders
replaced, or a partition without one), partitions the in-flight limits hold, and drains."""

from __future__ import annotations

import functools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.producer.accumulator import RecordAccumulator
from spark_sink.producer.buffer_pool import BufferPool
from spark_sink.producer.config import ProducerConfig

TOPICS = ("a", "b")
PARTITIONS = 6
NODES = (1, 2, 3)
VALUE = 200  # each record alone in a batch of batch.size 100


def _accumulator() -> RecordAccumulator:
    config = ProducerConfig.from_dict({"bootstrap.servers": "h:1", "linger.ms": 0, "batch.size": 100})
    return RecordAccumulator(config, BufferPool(config.buffer_memory))


def _append(acc: RecordAccumulator, tp: tuple[str, int], serial: int) -> None:
    acc.append(tp[0], tp[1], serial, None, b"v" * VALUE, headers=None, callback=None, key_size=0,
               value_size=VALUE, headers_size=0, max_block_ms=1000)


def _not_in(held: set[tuple[str, int]], tp: tuple[str, int]) -> bool:
    return tp not in held


def _run(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    acc = _accumulator()
    leaders = {t: [rng.choice(NODES) for _ in range(PARTITIONS)] for t in TOPICS}
    queued: dict[tuple[str, int], list[int]] = {}  # the model: each partition's records, in order
    serial = 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.5:
            tp = (rng.choice(TOPICS), rng.randrange(PARTITIONS))
            _append(acc, tp, serial)
            queued.setdefault(tp, []).append(serial)
            serial += 1
            continue
        if op < 0.65:  # a leader moves or is lost: the Metadata's leaders replaced whole
            topic = rng.choice(TOPICS)
            changed = list(leaders[topic])
            changed[rng.randrange(PARTITIONS)] = rng.choice(NODES + (-1,))
            leaders = {**leaders, topic: changed}
            continue
        held = {(t, p) for t in TOPICS for p in range(PARTITIONS) if rng.random() < 0.3}
        can_send = functools.partial(_not_in, held)
        waiting = {tp for tp, records in queued.items() if records}
        refused: set[tuple[str, int]] = set()
        ready, _, unknown = acc.ready(leaders, 0.0, can_send, refused=refused)
        assert ready == {leaders[t][p] for t, p in waiting if leaders[t][p] >= 0 and (t, p) not in held}
        assert unknown == {t for t, p in waiting if leaders[t][p] < 0}
        assert refused <= waiting & held
        nodes = {n for n in ready if rng.random() < 0.8}
        max_request = rng.choice((150, 400, 1 << 20))
        drained = acc.drain(leaders, nodes, max_request, 0.0, can_send, 0, None, lambda batch: None)
        assert set(drained) <= nodes
        for node in nodes:
            batches = drained.get(node, [])
            assert batches, f"node {node} was ready but gave no batch"
            assert len({b.tp for b in batches}) == len(batches), "two batches of one partition in a request"
            assert len(batches) == 1 or sum(b.wire_size for b in batches) <= max_request
            for batch in batches:
                assert leaders[batch.topic][batch.partition] == node and batch.tp not in held
                first = batch.seal(0).base_timestamp  # the record's serial
                assert queued[batch.tp][0] == first, "a partition's batches out of order"
                queued[batch.tp].pop(0)
    # Everything left comes out once every partition has a leader and nothing is held.
    leaders = {t: [1] * PARTITIONS for t in TOPICS}
    while any(queued.values()):
        drained = acc.drain(leaders, {1}, 1 << 20, 0.0, lambda tp: True, 0, None, lambda batch: None)
        assert drained
        for batch in drained[1]:
            assert queued[batch.tp].pop(0) == batch.seal(0).base_timestamp
    assert not acc.has_undrained()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 120))
def test_ready_and_drain_follow_the_leaders_as_a_full_walk_would(seed: int, steps: int) -> None:
    _run(seed, steps)


def test_a_long_run_of_appends_moves_and_drains() -> None:
    _run(55, 3000)
