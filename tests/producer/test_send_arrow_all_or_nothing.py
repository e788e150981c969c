"""send_arrow is all or nothing at validation: a row too large, a bad partition or a bad
column anywhere in a table stops the call before a single row is queued. A failure only
met on the way (buffer.memory full past max.block.ms, the producer closed) raises with
the future of the rows already queued, which resolves. Read back with confluent-kafka."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import (
    BufferExhaustedError,
    InvalidPartitionError,
    KafkaProducer,
    ProducerClosedError,
    RecordTooLargeError,
)
from tests.brokers import consume_all, create_topic, unique_topic

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka

N = 300_000
MIDDLE = 200_000


def _table(n: int) -> pa.Table:
    """Keyed rows whose value starts with the row number."""
    values = pa.array([b"%07d" % i + b"v" * 93 for i in range(n)], pa.binary())
    keys = pa.array([b"k%d" % (i % 1000) for i in range(n)], pa.binary())
    return pa.table({"key": keys, "value": values})


def _with_row(table: pa.Table, row: int, column: str, value: object) -> pa.Table:
    """``table`` with one cell replaced."""
    index = table.schema.get_field_index(column)
    cells = table.column(column).to_pylist()
    cells[row] = value
    return table.set_column(index, column, pa.array(cells, table.schema.field(column).type))


def test_one_row_over_max_request_size_sends_no_row_and_the_table_without_it_arrives_whole(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("oversized"), partitions=3)
    table = _table(N)
    oversized = _with_row(table, MIDDLE, "value", b"x" * 1_100_000)  # default max.request.size: 1 MiB
    bad_partition = table.append_column("partition", pa.array([7 if i == MIDDLE else 0 for i in range(N)], pa.int32()))
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        with pytest.raises(RecordTooLargeError, match=rf"row {MIDDLE} .*max.request.size \(1048576\)") as err:
            p.send_arrow(oversized, topic=topic)
        assert not hasattr(err.value, "future")  # nothing was queued
        with pytest.raises(InvalidPartitionError, match="has 7"):
            p.send_arrow(bad_partition, topic=topic)
        p.flush(30)
        without = pa.concat_tables([table.slice(0, MIDDLE), table.slice(MIDDLE + 1)])
        result = p.send_arrow(without, topic=topic).result(120)
    assert result.records == N - 1
    # Each partition's first offset is 0: no row of the failed calls was written before.
    assert sorted(result.partitions) == [(topic, 0), (topic, 1), (topic, 2)]
    assert all(first == 0 for _, first, _ in result.partitions.values())
    got = consume_all(kafka.bootstrap, topic, N - 1, timeout=120, settle=1.0)
    assert len(got) == N - 1
    assert sorted(int(m.value()[:7]) for m in got) == [i for i in range(N) if i != MIDDLE]


def test_buffer_exhausted_mid_call_hands_over_the_future_of_what_was_queued(kafka_proxy: ProxiedKafka) -> None:
    proxy = kafka_proxy.proxy
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("partial"), partitions=1)
    n = 20_000  # 2 MB against 256 KiB of buffer.memory
    table = pa.table({"value": pa.array([b"%07d" % i + b"v" * 93 for i in range(n)], pa.binary())})
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "buffer.memory": 256 * 1024, "batch.size": 16384,
              "max.block.ms": 500}
    with KafkaProducer(config) as p:
        p.partitions_for(topic)
        assert p.max_message_bytes(topic) == 1048588  # Kafka's default; asked before the stall, as send_arrow would
        proxy.stall()
        try:
            with pytest.raises(BufferExhaustedError, match="max.block.ms") as err:
                p.send_arrow(table, topic=topic)
        finally:
            proxy.stall(False)
        future = err.value.future  # type: ignore[attr-defined]  # kprod sets it on what send_arrow raised
        assert any("rows were queued" in note for note in err.value.__notes__)
        result = future.result(60)
    assert 0 < result.records < n
    assert result.partitions == {(topic, 0): (result.records, 0, result.records - 1)}
    got = sorted(consume_all(kafka_proxy.bootstrap, topic, result.records, settle=1.0), key=lambda m: m.offset())
    assert [int(m.value()[:7]) for m in got] == list(range(result.records))  # the rows queued, in order


def test_a_producer_closed_mid_call_fails_what_was_queued_and_leaves_nothing_waiting(kafka_proxy: ProxiedKafka) -> None:
    proxy = kafka_proxy.proxy
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("closed-mid"), partitions=1)
    values = pa.array(np.full(20_000, b"v" * 100, dtype=object), pa.binary())
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "buffer.memory": 256 * 1024, "batch.size": 16384,
              "max.block.ms": 60_000}
    with KafkaProducer(config) as p:
        p.partitions_for(topic)
        assert p.max_message_bytes(topic) == 1048588  # Kafka's default; asked before the stall, as send_arrow would
        proxy.stall()
        def close_once_blocked() -> None:
            _wait_until_blocked(p)
            p.close(0)

        closer = threading.Thread(target=close_once_blocked)
        closer.start()
        try:
            with pytest.raises(ProducerClosedError) as err:
                p.send_arrow(pa.table({"value": values}), topic=topic)
        finally:
            closer.join(30)
            proxy.stall(False)
    future = err.value.future  # type: ignore[attr-defined]  # kprod sets it on what send_arrow raised
    with pytest.raises(Exception, match="closed before these records were acknowledged"):
        future.result(30)  # resolves: every queued batch was failed by the close
    assert future.done()
    assert any(note.startswith(tuple("123456789")) for note in err.value.__notes__)  # some rows were queued


def _wait_until_blocked(producer: KafkaProducer) -> None:
    """Until the sending thread waits for buffer.memory."""
    deadline = time.monotonic() + 30
    while not producer._pool.exhausted:
        assert time.monotonic() < deadline, "send_arrow never blocked on buffer.memory"
        time.sleep(0.01)
