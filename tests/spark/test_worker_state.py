"""A Spark task through kprod leaves its Python worker's process-wide settings alone: the
cyclic garbage collector (kprod freezes nothing: gc.freeze would keep the worker's other
objects, a user's UDF's among them, from ever being collected, and sets no threshold),
also where its encoder runs on numba (kprod from a --py-files zip), and the GIL's switch
interval, not even while it sends."""

from __future__ import annotations

import gc
import sys

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StructField, StructType

from kprod_broker import KafkaCluster
from spark_sink.spark.writer import plan_write, write_task
from tests.brokers import consume_all, create_topic, unique_topic


def test_a_task_with_numba_loaded_changes_no_process_wide_setting(kafka: KafkaCluster,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_sink.encoder import jit  # loads numba: its ~100,000 long-lived objects

    assert jit.__name__
    topic = create_topic(kafka.bootstrap, unique_topic("gc"), 2)
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
    sink, plan = plan_write({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                             "kprod.clusterCheck": "false",
                             # closed as each task ends: no producer (and its Sender thread)
                             # left in the pool of this test process for later tests to find
                             "kprod.producer.cache.timeout": "0"}, schema, check=False)
    batch = pa.record_batch({"key": [b"k%d" % i for i in range(100)], "value": [b"v"] * 100})
    frozen, thresholds, enabled = gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()
    intervals: list[float] = []  # set while the tasks ran, even if set back after
    monkeypatch.setattr(sys, "setswitchinterval", intervals.append)
    for _ in range(2):  # a reused worker's first and later tasks
        assert write_task(iter([batch]), sink, plan).records == 100
    assert intervals == []
    assert (gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()) == (frozen, thresholds, enabled)
    assert len(consume_all(kafka.bootstrap, topic, 200)) == 200
