"""A record without a timestamp of its own carries the producer's clock's wall time: the
clock KafkaProducer takes (a test's here), on every path (send()'s compiled and Python
short ways, the long way, send_arrow), read back from a real broker with confluent-kafka;
and the system's when the producer is given no clock (the compiled path reads it itself
then: the same clock as ``time.time_ns``)."""

from __future__ import annotations

import random
import time

import pyarrow as pa
import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.producer import accumulator as accumulator_module
from spark_sink.producer import batch as batch_module
from spark_sink.producer.batch import PyRecordBuffer
from tests.brokers import consume_all, create_topic, unique_topic
from tests.clock import MovedClock
from tests.producer.fake_cluster import FakeCluster

_YEAR_MS = 365 * 86_400_000


class SetWallClock(MovedClock):
    """The system's monotonic clock (the producer's waits stay real) and a wall clock that
    reads whatever the test last set."""

    def __init__(self, wall: int) -> None:
        super().__init__()
        self.wall = wall

    def wall_ms(self) -> float:
        return float(self.wall)


def _python_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """send() as where kprod's extension is not built."""
    monkeypatch.setattr(accumulator_module, "PlainAppender", None)
    monkeypatch.setattr(accumulator_module, "RecordBuffer", PyRecordBuffer)
    monkeypatch.setattr(batch_module, "run_callbacks", None)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_without_a_clock_records_carry_the_systems_time(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:
        _python_paths(monkeypatch)
    with KafkaProducer({"bootstrap.servers": "fake:9092"}, network_client=FakeCluster(topics={"t": [0, 0]})) as p:
        assert (getattr(p.send, "__func__", None) is KafkaProducer.send) != compiled
        before = time.time_ns() // 1_000_000
        futures = [p.send(ProducerRecord("t", b"v", key=b"%d" % i)) for i in range(1000)]
        after = time.time_ns() // 1_000_000
        p.flush(10)
    stamps = [f.result(0).timestamp for f in futures]
    assert before <= min(stamps) and max(stamps) <= after


def test_a_failing_clock_fails_the_send() -> None:
    class Broken(SetWallClock):
        def wall_ms(self) -> float:
            raise RuntimeError("no time")

    with KafkaProducer({"bootstrap.servers": "fake:9092"}, network_client=FakeCluster(topics={"t": [0]}),
                       clock=Broken(0)) as p:
        for record in (ProducerRecord("t", b"v", key=b"k"), ProducerRecord("t", b"v", partition=0)):
            with pytest.raises(RuntimeError, match="no time"):
                p.send(record)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("seed", range(3))
def test_records_carry_the_producers_clock(kafka: KafkaCluster, compiled: bool, seed: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:
        _python_paths(monkeypatch)
    rng = random.Random(seed)
    topic = create_topic(kafka.bootstrap, unique_topic(f"clock{seed}"), partitions=3)
    # Times from four years ago to now, in any order (a batch's deltas go both ways), often
    # several records in one millisecond as a fast producer's are.
    now = time.time_ns() // 1_000_000
    clock = SetWallClock(now - _YEAR_MS)
    expected: dict[bytes, int] = {}
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "batch.size": rng.choice([512, 16384])},
                       clock=clock) as p:
        assert (getattr(p.send, "__func__", None) is KafkaProducer.send) != compiled
        for i in range(rng.randint(200, 600)):
            if rng.random() < 0.7:
                clock.wall = now - rng.randrange(4 * _YEAR_MS)
            value = b"%d" % i
            shape = rng.random()
            if shape < 0.6:  # the short way: bytes key and value, nothing else
                record = ProducerRecord(topic, value, key=b"k%d" % rng.randrange(9))
            elif shape < 0.8:
                record = ProducerRecord(topic, value, headers=[("h", b"%d" % i)])
            else:
                record = ProducerRecord(topic, value, partition=rng.randrange(3))
            p.send(record)
            expected[value] = clock.wall
        for j in range(rng.randint(1, 3)):  # rows without a timestamp column: the call's time
            clock.wall = now - rng.randrange(4 * _YEAR_MS)
            values = [b"arrow-%d-%d" % (j, r) for r in range(rng.randint(1, 300))]
            p.send_arrow(pa.table({"value": values}), topic).result(60)
            expected.update(dict.fromkeys(values, clock.wall))
        p.flush(60)
    messages = consume_all(kafka.bootstrap, topic, len(expected))
    assert {m.value(): m.timestamp() for m in messages} == {
        value: (TIMESTAMP_CREATE_TIME, ms) for value, ms in expected.items()}
