"""A batch completes in Java's order: its records' callbacks and its listener run first,
then its waiters are released, so whoever returns from result() or flush() sees every
callback of those records done; and any number of threads may wait on one batch."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import FutureRecordMetadata, KafkaProducer, ProducerRecord
from spark_sink.producer import batch as batch_module
from spark_sink.producer.batch import ProducerBatch, PyRecordBuffer, SendCallback
from spark_sink.producer.producer_record import RecordMetadata
from tests.brokers import create_topic, unique_topic


def _one_batch(producer: KafkaProducer, topic: str, count: int,
               callback: Callable[[int], SendCallback]) -> list[FutureRecordMetadata]:
    """``count`` records that share one batch (one partition, a long linger)."""
    return [producer.send(ProducerRecord(topic, b"%d" % i, partition=0), callback(i)) for i in range(count)]


def _appended(batch: ProducerBatch, timestamp: int, callback: SendCallback | None,
              value_size: int = 1) -> FutureRecordMetadata:
    """A record of key b"k" and value b"v" (of the ``value_size`` given) appended to ``batch``, which has room."""
    future = batch.try_append(timestamp, b"k", b"v", None, callback, 1, value_size)
    assert future is not None
    return future

def test_result_and_flush_return_only_after_the_batchs_callbacks_ran(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("cb-order"), partitions=1)
    ran: list[tuple[int, int]] = []

    def slow(i: int) -> SendCallback:
        def callback(metadata: RecordMetadata | None, error: Exception | None) -> None:
            assert error is None
            time.sleep(0.3 if i == 0 else 0.01)  # the first holds the batch's completion up
            ran.append((i, threading.get_ident()))
        return callback

    config = {"bootstrap.servers": kafka.bootstrap, "linger.ms": 200}
    with KafkaProducer(config) as p:
        p.partitions_for(topic)
        futures = _one_batch(p, topic, 20, slow)
        futures[-1].result(30)
        assert len(ran) == 20  # the record waited on is the last of its batch's callbacks
        assert all(thread != threading.get_ident() for _, thread in ran)  # they ran on the sender thread
        assert [i for i, _ in ran] == list(range(20))

        ran.clear()
        _one_batch(p, topic, 20, slow)
        p.flush(30)
        assert len(ran) == 20


def test_threads_waiting_on_one_batch_are_all_released_after_its_callbacks(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("waiters"), partitions=1)
    ran: list[int] = []

    def slow(i: int) -> SendCallback:
        def callback(metadata: RecordMetadata | None, error: Exception | None) -> None:
            time.sleep(0.2)
            ran.append(i)
        return callback

    seen: dict[int, int] = {}
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 200}) as p:
        p.partitions_for(topic)
        futures = _one_batch(p, topic, 3, slow)
        assert len({f[0] for f in futures}) == 1  # one batch under all three

        def wait(n: int) -> None:
            futures[n].result(30)
            seen[n] = len(ran)

        waiters = [threading.Thread(target=wait, args=(n,)) for n in (0, 2)]
        for t in waiters:
            t.start()
        for t in waiters:
            t.join(30)
    assert seen == {0: 3, 2: 3}


def test_lazy_wait_events_lose_no_waiter() -> None:
    """Many threads start waiting on a batch at once, as it completes: each returns true.
    (A wait event made twice would leave the threads on the first one waiting out their
    timeout.)"""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, to meet the race
    try:
        for round_ in range(100):
            batch = ProducerBatch("t", 0, 0.0, round_, 0, 16384)
            start = threading.Barrier(5)
            results: list[bool] = []

            def wait(start: threading.Barrier = start, results: list[bool] = results,
                     batch: ProducerBatch = batch) -> None:
                start.wait()
                results.append(batch.wait(5))

            threads = [threading.Thread(target=wait) for _ in range(4)]
            for t in threads:
                t.start()
            start.wait()
            time.sleep(0.002)  # let them start waiting
            batch.complete(round_, -1, None)
            for t in threads:
                t.join()
            assert results == [True] * 4, f"round {round_}: {results}"
    finally:
        sys.setswitchinterval(interval)


def test_a_callback_waiting_on_its_own_record_does_not_wait_for_itself() -> None:
    batch = ProducerBatch("t", 0, 0.0, 0, 0, 16384)
    seen: list[int] = []
    future = _appended(batch, 5, lambda md, err: seen.append(future.result(1).offset))
    batch.complete(42, -1, None)
    assert seen == [42]


def test_an_interrupted_callback_still_releases_listener_and_waiters() -> None:
    heard: list[ProducerBatch] = []
    batch = ProducerBatch("t", 0, 0.0, 0, 0, 16384, listener=heard.append)

    def interrupt(md: RecordMetadata | None, err: Exception | None) -> None:
        raise KeyboardInterrupt

    batch.try_append(5, b"k", b"v", None, interrupt, 1, 1)
    try:
        batch.complete(7, -1, None)
    except KeyboardInterrupt:
        pass
    assert heard == [batch] and batch.wait(0)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_raising_callback_is_logged_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture, compiled: bool) -> None:
    """Both ways of running an acknowledged batch's callbacks: the compiled loop (with
    kprod's extension) and Python's."""
    if compiled:
        assert batch_module.run_callbacks is not None, "kprod's extension is not built: make venv builds it"
    else:
        monkeypatch.setattr(batch_module, "run_callbacks", None)
    batch = ProducerBatch("t", 3, 0.0, 0, 0, 16384, records=None if compiled else PyRecordBuffer(16384))
    seen = []

    def ok(md: RecordMetadata | None, err: Exception | None) -> None:
        seen.append((md, err))

    def bad(md: RecordMetadata | None, err: Exception | None) -> None:
        raise ValueError("boom")

    for i, callback in enumerate([ok, bad, ok, None, ok]):
        batch.try_append(100 + i, b"k", b"v%d" % i, None, callback, 1, 2)
    with caplog.at_level(logging.ERROR, logger="spark_sink.producer.batch"):
        batch.complete(42, -1, None)
    assert seen == [(RecordMetadata("t", 3, 42 + i, 100 + i, 1, 2), None) for i in (0, 2, 4)]
    assert all(type(md) is RecordMetadata for md, _ in seen)
    (logged,) = caplog.records
    assert logged.getMessage() == "send callback raised" and logged.exc_info and str(logged.exc_info[1]) == "boom"


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_metadata_a_callback_keeps_stays_as_it_was_told(monkeypatch: pytest.MonkeyPatch, compiled: bool) -> None:
    """The compiled loop reuses a RecordMetadata that no callback kept for the next
    record: one a callback did keep is never changed afterwards."""
    if not compiled:
        monkeypatch.setattr(batch_module, "run_callbacks", None)
    batch = ProducerBatch("t", 1, 0.0, 0, 0, 16384, records=None if compiled else PyRecordBuffer(16384))
    kept: list[RecordMetadata] = []
    told: list[tuple] = []

    def keep(md: RecordMetadata | None, err: Exception | None) -> None:
        assert md is not None
        kept.append(md)

    def glance(md: RecordMetadata | None, err: Exception | None) -> None:
        assert md is not None
        told.append(tuple(md))

    for i in range(40):
        batch.try_append(100 + i, b"k", b"v" * i, None, keep if i % 3 == 0 else glance, 1, i)
    batch.complete(1000, -1, None)
    expected = [RecordMetadata("t", 1, 1000 + i, 100 + i, 1, i) for i in range(40)]
    assert kept == [md for i, md in enumerate(expected) if i % 3 == 0]
    assert len({id(md) for md in kept}) == len(kept)
    assert told == [tuple(md) for i, md in enumerate(expected) if i % 3]


def test_futures_kept_are_not_reused_and_answer_for_their_record() -> None:
    """Compiled, futures freed by the application are kept for the next records: one the
    application holds answers for its own record whatever was freed and made since."""
    batch = ProducerBatch("t", 2, 0.0, 0, 0, 16384)
    kept: list[tuple[int, FutureRecordMetadata]] = []
    for i in range(200):
        future = _appended(batch, 100 + i, None, i)
        if i % 7 == 0:
            kept.append((i, future))
        del future  # the others are freed at once
    batch.complete(500, -1, None)
    assert [f.result(0) for _, f in kept] == [RecordMetadata("t", 2, 500 + i, 100 + i, 1, i) for i, _ in kept]
    i, future = kept[1]
    assert future.done() and future.exception(0) is None and tuple(future)[1:] == (i, 100 + i, 1, i)
    assert repr(future) == f"FutureRecordMetadata(t-2, index={i}, done=True)"
    assert isinstance(future, batch_module.FutureRecordMetadata)
