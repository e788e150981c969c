"""A leader at its in-flight limit is waited for on the selector, not polled on a timer.

While every request a connection may have in flight is unanswered, only I/O (the answer,
or the socket taking the rest of a request) can make the leader ready again: the Sender
waits on its selector for that, as Java's does (``connectionDelay`` is infinite for a
connected node). A 5 ms timer there made a slow broker cost kprod a round every 5 ms, each
looking through the queued partitions again (bench/RESULTS.md, issue 55 (4)).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, create_topic, unique_topic

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka


def _wait_for_requests(producer: KafkaProducer, count: int, timeout_s: float = 30.0) -> None:
    """Until the producer has sent ``count`` Produce requests."""
    deadline = time.monotonic() + timeout_s
    while producer.metric_totals().requests < count:
        assert time.monotonic() < deadline, f"{producer.metric_totals().requests} Produce requests of {count}"
        time.sleep(0.01)


# The Sender's wait for a busy leader before the fix, whatever the broker did.
_OLD_TIMER_MS = 5.0


@pytest.mark.parametrize("in_flight", [1, 3, 5])
def test_a_leader_at_its_in_flight_limit_is_waited_for_not_polled(kafka_proxy: ProxiedKafka, in_flight: int) -> None:
    proxy = kafka_proxy.proxy
    topic = create_topic(kafka_proxy.bootstrap, unique_topic("inflight-wait"), partitions=in_flight + 1)
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "linger.ms": 0, "request.timeout.ms": 30000,
              "max.in.flight.requests.per.connection": in_flight}
    with KafkaProducer(config) as producer:
        # Connected, metadata and producer id known, each partition's first batch answered
        # (an idempotent producer sends one batch at a time to a partition until then).
        for partition in range(in_flight + 1):
            producer.send(ProducerRecord(topic, b"first", partition=partition))
        producer.flush(60)
        futures = []
        proxy.stall()
        try:
            sent = producer.metric_totals().requests
            for partition in range(in_flight):  # one request each, none answered
                futures.append(producer.send(ProducerRecord(topic, b"held %d" % partition, partition=partition)))
                _wait_for_requests(producer, sent + partition + 1)
            # Ready to send (linger.ms 0), to a leader that can take no more requests.
            futures.append(producer.send(ProducerRecord(topic, b"queued", partition=in_flight)))
            sender = producer._sender
            # Rounds as the Sender's loop runs them: a round may find a wakeup, a response or
            # another timer (metadata, a request's timeout) due first, all short on a loaded
            # machine; the timer this is about was 5 ms, always, while the leader was busy.
            waits: list[float] = []
            for _ in range(20):
                with sender.io_lock:
                    waits.append(sender.run_once())
                if waits[-1] > _OLD_TIMER_MS:
                    break
                time.sleep(waits[-1] / 1000)
            assert waits[-1] > _OLD_TIMER_MS, waits
            assert producer.metric_totals().requests == sent + in_flight  # the queued batch waits
        finally:
            proxy.stall(False)
        for future in futures:
            future.result(60)
    values = sorted(m.value() for m in consume_all(kafka_proxy.bootstrap, topic, 2 * in_flight + 2, timeout=60))
    assert values == sorted([b"first"] * (in_flight + 1) + [b"held %d" % p for p in range(in_flight)] + [b"queued"])
