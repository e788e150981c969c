"""Adaptive partitioning (KIP-794) without a broker: Java's load-weighted choice from the
batches waiting per partition, and which partitions the accumulator offers it."""

import collections
import random

import pytest

from spark_sink.producer.accumulator import RecordAccumulator
from spark_sink.producer.buffer_pool import BufferPool
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.partitioner import StickyPartitions, load_stats, weighted_partition


def test_cumulative_frequency_table_as_javas_example() -> None:
    # BuiltInPartitioner's own example: queues 0 3 1 -> weights 4 1 3 -> table 4 5 8.
    stats = load_stats([0, 3, 1], [0, 1, 2], 3)
    assert stats == ([4, 5, 8], [0, 1, 2])
    table, ids = stats
    assert [weighted_partition(table, ids, draw) for draw in range(8)] == [0, 0, 0, 0, 1, 2, 2, 2]
    assert weighted_partition(table, ids, 8 + 4) == 1  # the draw is taken modulo the total


@pytest.mark.parametrize("sizes, ids, count", [
    ([2, 2, 2], [0, 1, 2], 3),  # every partition available, equal queues: uniform
    ([5], [0], 1),  # a single partition: nothing to choose
    ([], [], 4),  # nothing available: the caller falls back to uniform
])
def test_uniform_cases_have_no_table(sizes: list[int], ids: list[int], count: int) -> None:
    assert load_stats(sizes, ids, count) is None


def test_a_left_out_partition_keeps_the_table_even_with_equal_queues() -> None:
    assert load_stats([1, 1], [0, 2], 3) == ([1, 2], [0, 2])  # partition 1 unavailable: (table, ids)


def test_sticky_choice_follows_the_load() -> None:
    random.seed(7)
    queues = {0: 0, 1: 9, 2: 0}  # partition 1's broker is behind
    sticky = StickyPartitions(lambda topic: [0, 1, 2], lambda topic, n: (list(queues.values()), list(queues), n))
    counts = collections.Counter(sticky.next("t", 3) for _ in range(3000))
    # weights 10, 1, 10 out of 21
    assert counts[1] < 3000 * 2 / 21 and min(counts[0], counts[2]) > 3000 * 8 / 21


def _accumulator(**settings: object) -> RecordAccumulator:
    config = ProducerConfig.from_dict({"bootstrap.servers": "h:1", "linger.ms": 10, **settings})
    return RecordAccumulator(config, BufferPool(config.buffer_memory))


def _fill(acc: RecordAccumulator, topic: str, partition: int, batches: int) -> None:
    for _ in range(batches):
        acc.append(topic, partition, 0, None, b"x" * 20000, headers=None, callback=None, key_size=0,  # one batch each
                   value_size=20000, headers_size=0, max_block_ms=1000)


def test_queue_sizes_per_partition_with_a_leader() -> None:
    acc = _accumulator()
    _fill(acc, "t", 0, 3)
    _fill(acc, "t", 2, 1)
    assert acc.partition_load("t", [1, 2, 3, -1], 0.0) == ([3, 0, 1], [0, 1, 2], 4)


def test_an_overdue_leader_is_left_out_only_with_the_availability_timeout() -> None:
    leaders = [1, 2, 1, 2]
    for timeout, expected in ((0, [0, 1, 2, 3]), (500, [1, 3])):
        acc = _accumulator(**{"partitioner.availability.timeout.ms": timeout})
        _fill(acc, "t", 0, 2)  # due for node 1 since it was made (+ linger)
        _fill(acc, "t", 1, 2)
        created = acc.incomplete()[0].created_ms
        acc.note_drained([2], created + 900)  # node 2 took a batch lately; node 1 never
        assert acc.partition_load("t", leaders, created + 1000)[1] == expected
    acc.note_drained([1], created + 900)
    assert acc.partition_load("t", leaders, created + 1000)[1] == [0, 1, 2, 3]
    # 501 ms later both nodes have had batches due and taken none: both are left out.
    assert acc.partition_load("t", leaders, created + 1401)[1] == []


def test_a_leader_with_nothing_due_is_not_overdue() -> None:
    acc = _accumulator(**{"partitioner.availability.timeout.ms": 500})
    acc.note_drained([1], 0.0)  # long ago, then idle
    _fill(acc, "t", 0, 1)
    now = acc.incomplete()[0].created_ms
    assert acc.partition_load("t", [1, 2], now + 100)[1] == [0, 1]
