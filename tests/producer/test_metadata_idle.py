"""metadata.max.idle.ms: topics not produced to for that long leave the Metadata requests,
so a job writing to many topics over time does not ask for all of them forever."""

from __future__ import annotations

import sys
import threading
import time

from spark_sink.client.metadata import Metadata
from spark_sink.producer import KafkaProducer, KafkaTimeoutError, ProducerRecord
from tests.clock import MovedClock
from tests.producer.fake_cluster import FakeCluster


def _requested(metadata: Metadata, now: float) -> list[str]:
    topics = metadata.request_body(now).topics
    assert topics is not None
    return [t.name or "" for t in topics]


def test_idle_topics_leave_the_request_and_used_ones_stay() -> None:
    metadata = Metadata(max_age_ms=300_000, refresh_backoff_ms=100, max_idle_ms=5_000)
    metadata.topics |= {"a", "b"}
    metadata.leaders.update({"a": [1], "b": [1]})
    metadata.touch(["a", "b"], now=0.0)
    assert _requested(metadata, 4_000.0) == ["a", "b"]
    metadata.touch(["b"], now=4_000.0)
    assert _requested(metadata, 6_000.0) == ["b"]  # a: idle 6 s; b: 2 s
    assert "a" not in metadata.leaders and metadata.partition_count("a") is None  # its next record asks again
    assert _requested(metadata, 9_500.0) == []


def test_a_producer_forgets_a_topic_it_stopped_writing_and_finds_it_again() -> None:
    """A whole producer on the fake cluster, its clock moved past metadata.max.idle.ms
    (the idle limit is the client's own: no broker, and no waiting for it)."""
    cluster, clock = FakeCluster(topics={"first": [0], "second": [0], "third": [0]}), MovedClock()
    config = {"bootstrap.servers": "fake:9092", "linger.ms": 0, "metadata.max.idle.ms": 5000}
    with KafkaProducer(config, network_client=cluster, clock=clock) as p:
        p.send(ProducerRecord("first", b"before")).result(10)
        p.send(ProducerRecord("second", b"x")).result(10)
        assert p._metadata.topics == {"first", "second"}
        clock.advance(4000)
        p.send(ProducerRecord("second", b"y")).result(10)  # only the second topic from here on
        clock.advance(2000)
        # A new topic's Metadata request leaves out the one idle for 6 s, not the one idle for 2.
        p.send(ProducerRecord("third", b"z")).result(10)
        assert p._metadata.topics == {"second", "third"}
        p.send(ProducerRecord("first", b"after")).result(10)  # its metadata comes back on demand
    assert cluster.values(("first", 0)) == [b"before", b"after"]


def test_a_new_topic_is_asked_for_at_once_not_after_the_refresh_backoff() -> None:
    """As Java's requestUpdateForNewTopics: a producer's first send to a topic does not wait
    retry.backoff.ms after its start-up request (that cost every exactly-once batch write,
    whose producers are new, a tenth of a second); a topic already asked for still waits."""
    import pytest

    from spark_sink.producer import KafkaTimeoutError

    metadata = Metadata(max_age_ms=300_000, refresh_backoff_ms=100, max_idle_ms=5_000)
    metadata.request_body(time.monotonic() * 1000)  # the start-up request, just sent
    with pytest.raises(KafkaTimeoutError):
        metadata.wait_for_topic("new", max_block_ms=1, wakeup=lambda: None)
    assert metadata.due_in_ms(time.monotonic() * 1000) == 0.0
    assert _requested(metadata, time.monotonic() * 1000) == ["new"]
    with pytest.raises(KafkaTimeoutError):
        metadata.wait_for_topic("new", max_block_ms=1, wakeup=lambda: None)
    assert metadata.due_in_ms(time.monotonic() * 1000) > 0.0  # asked for moments ago: backs off


def test_the_request_is_built_while_a_task_adds_its_topics() -> None:
    """Break 57: the Sender built its Metadata request iterating the topics while a task's
    thread added one (wait_for_topic), and died of "Set changed size during iteration".
    Thread switches forced every microsecond (this test's process only, restored) make the
    race near certain without the lock."""
    metadata = Metadata(max_age_ms=300_000, refresh_backoff_ms=100, max_idle_ms=3_600_000)
    metadata.topics |= {f"t{i}" for i in range(3000)}
    done = threading.Event()
    errors: list[BaseException] = []

    def add_topics() -> None:
        for i in range(3000):
            if done.is_set():
                return
            try:
                metadata.wait_for_topic(f"new{i}", 0, wakeup=lambda: None)
            except KafkaTimeoutError:
                pass  # added, and no broker to answer: what this thread is for

    def build() -> None:
        try:
            while not done.is_set():
                metadata.request_body(0.0)
        except BaseException as exc:  # the race's error, reported below
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=add_topics), threading.Thread(target=build)]
        for thread in threads:
            thread.start()
        threads[0].join(60)
        done.set()
        threads[1].join(60)
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors
    assert {f"new{i}" for i in range(3000)} <= metadata.topics
