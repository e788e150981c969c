"""Python partitioners named by import path in tests (as kafka.partitioner.class)."""

from __future__ import annotations


def always_zero(topic: str, key: bytes | None, value: bytes | None, num_partitions: int) -> int:
    """Spark's KafkaSinkSuite's TestKafkaPartitioner: every record to partition 0."""
    return 0
