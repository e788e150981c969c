"""Failover on three Apache Kafka nodes: the leader of a partition is killed with SIGKILL
mid-run and restarted, twice, while one thread sends record by record and another sends
Arrow tables. With acks=all and idempotence, nothing acknowledged is lost, nothing is
written twice, per-key order holds and every send gets exactly one callback."""

from __future__ import annotations

import logging
import threading
import time

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, consume_to_marks, unique_topic
from tests.failover import (
    FAILOVER_CONFIG,
    Deliveries,
    assert_arrow_offsets_match,
    assert_order_per_key,
    bounce_leader,
    transaction_coordinator,
    wait_in_sync,
)


def test_both_send_paths_survive_the_leader_killed_twice(kafka3: KafkaCluster) -> None:
    records_topic = kafka3.create_topic(unique_topic("failover"), 3)
    arrow_topic = kafka3.create_topic(unique_topic("failover-arrow"), 3)
    deliveries = Deliveries()
    stop = threading.Event()
    sent = 0
    futures = []
    chunk = 500

    config = {**FAILOVER_CONFIG, "bootstrap.servers": kafka3.bootstrap, "batch.size": 4096}
    with KafkaProducer(config) as producer:
        # Steady streams at a bounded rate, so that what is read back stays small whatever
        # the bounces cost: records are in flight at every kill all the same.
        def per_record() -> None:
            nonlocal sent
            while not stop.is_set():
                producer.send(ProducerRecord(records_topic, b"%d" % sent, key=b"k%d" % (sent % 17)),
                              deliveries.callback(sent))
                sent += 1
                if sent % 25 == 0:  # up to about 1,000 a second: a batch in flight at any moment
                    time.sleep(0.02)

        def per_table() -> None:
            start = 0
            while not stop.is_set():
                rows = range(start, start + chunk)
                table = pa.table({"key": [b"k%d" % (i % 17) for i in rows], "value": [b"%d" % i for i in rows]})
                futures.append(producer.send_arrow(table, arrow_topic))
                start += chunk
                time.sleep(0.1)

        threads = [threading.Thread(target=per_record), threading.Thread(target=per_table)]
        for t in threads:
            t.start()
        try:
            killed = bounce_leader(kafka3, records_topic, pause=0.5)
        finally:
            stop.set()
            for t in threads:
                t.join()
        producer.flush(120)
        results = [f.result(0) for f in futures]
    assert len(killed) == 2 and killed[0] != killed[1]  # the second kill hit the node that took over
    assert not deliveries.errors, deliveries.errors[:3]
    deliveries.assert_one_callback_each(sent)
    messages = consume_all(kafka3.bootstrap, records_topic, sent, timeout=90, to_end=True)
    values = [int(m.value()) for m in messages]
    assert len(values) == len(set(values)) == sent  # nothing lost, nothing twice
    deliveries.assert_offsets_match(messages)
    assert_order_per_key(messages)

    n = chunk * len(futures)
    assert sum(r.records for r in results) == n
    arrow_messages = consume_all(kafka3.bootstrap, arrow_topic, n, timeout=90, to_end=True)
    arrow_values = [int(m.value()) for m in arrow_messages]
    assert len(arrow_values) == len(set(arrow_values)) == n
    assert_order_per_key(arrow_messages)
    assert_arrow_offsets_match(results, arrow_messages, chunk)


def test_records_reach_the_new_leader_while_the_old_one_stays_dead(kafka3: KafkaCluster) -> None:
    """A killed leader that does not come back: the producer must learn the new leader
    itself (Java refreshes metadata whenever a connection fails), not wait for the dead
    node or for metadata.max.age.ms (five minutes here, the default)."""
    topic = kafka3.create_topic(unique_topic("dead-leader"), 3)
    deliveries = Deliveries()
    config = {"bootstrap.servers": kafka3.bootstrap, "linger.ms": 2, "request.timeout.ms": 10000,
              "delivery.timeout.ms": 30000}
    before, n = 300, 3000
    with KafkaProducer(config) as producer:
        for i in range(before):  # connections, metadata and producer id in place
            producer.send(ProducerRecord(topic, b"%d" % i, key=b"k%d" % (i % 17)), deliveries.callback(i))
        producer.flush(30)
        victim = kafka3.leader(topic, 0)
        kafka3.node(victim).kill()
        try:
            for i in range(before, n):
                producer.send(ProducerRecord(topic, b"%d" % i, key=b"k%d" % (i % 17)), deliveries.callback(i))
            producer.flush(60)
        finally:
            kafka3.node(victim).start()
    kafka3.wait_ready()
    wait_in_sync(kafka3, topic)
    assert not deliveries.errors, deliveries.errors[:3]
    deliveries.assert_one_callback_each(n)
    messages = consume_all(kafka3.bootstrap, topic, n, timeout=60, to_end=True)
    values = [int(m.value()) for m in messages]
    assert len(values) == len(set(values)) == n
    assert {m.partition() for m in messages if int(m.value()) >= before} == {0, 1, 2}
    deliveries.assert_offsets_match(messages)
    assert_order_per_key(messages)


def test_too_few_replicas_in_sync_is_retried_until_the_follower_returns(kafka3: KafkaCluster,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """min.insync.replicas 3 and a follower killed: the leader answers
    NOT_ENOUGH_REPLICAS (or NOT_ENOUGH_REPLICAS_AFTER_APPEND for what it had appended
    already) until the follower is back in sync; each record is then written exactly once."""
    topic = kafka3.create_topic(unique_topic("min-isr"), 1, config={"min.insync.replicas": "3"})
    deliveries = Deliveries()
    config = {**FAILOVER_CONFIG, "bootstrap.servers": kafka3.bootstrap, "batch.size": 1024}
    n = 4000
    caplog.set_level(logging.DEBUG, logger="spark_sink.producer.sender")
    with KafkaProducer(config) as producer:
        for i in range(n // 4):
            producer.send(ProducerRecord(topic, b"%d" % i, key=b"k%d" % (i % 17)), deliveries.callback(i))
        producer.flush(30)
        leader = kafka3.leader(topic, 0)
        follower = next(node.node_id for node in kafka3.nodes if node.node_id != leader)
        kafka3.node(follower).kill()
        try:
            for i in range(n // 4, n):
                producer.send(ProducerRecord(topic, b"%d" % i, key=b"k%d" % (i % 17)), deliveries.callback(i))
                if i % 100 == 0:
                    time.sleep(0.01)
            deadline = time.monotonic() + 30
            while "NOT_ENOUGH_REPLICAS" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            kafka3.node(follower).start()
        producer.flush(90)
    kafka3.wait_ready()
    wait_in_sync(kafka3, topic)
    assert "NOT_ENOUGH_REPLICAS" in caplog.text  # the broker did refuse, and it was retried
    assert not deliveries.errors, deliveries.errors[:3]
    deliveries.assert_one_callback_each(n)
    messages = consume_all(kafka3.bootstrap, topic, n, timeout=60, to_end=True)
    values = [int(m.value()) for m in messages]
    assert len(values) == len(set(values)) == n
    deliveries.assert_offsets_match(messages)
    assert_order_per_key(messages)


def test_transactions_go_on_when_their_coordinator_is_killed(kafka3: KafkaCluster) -> None:
    """The node coordinating a transaction dies (SIGKILL) after its records were sent: the
    commit finds the new coordinator (the transaction log's new leader) and completes, and
    the next transaction runs on it. Read committed, every record is there once."""
    topic = kafka3.create_topic(unique_topic("txn-failover"), 3)
    transactional_id = unique_topic("txn-failover")
    config = {**FAILOVER_CONFIG, "bootstrap.servers": kafka3.bootstrap, "transactional.id": transactional_id}
    with KafkaProducer(config) as producer:
        producer.init_transactions()  # creates __transaction_state on first use
        coordinator = transaction_coordinator(kafka3, transactional_id)
        assert coordinator > 0
        producer.begin_transaction()
        futures = [producer.send(ProducerRecord(topic, b"a%d" % i, key=b"%d" % i)) for i in range(300)]
        producer.flush(60)
        kafka3.node(coordinator).kill()
        try:
            futures += [producer.send(ProducerRecord(topic, b"b%d" % i, key=b"%d" % i)) for i in range(300)]
            producer.commit_transaction()
            producer.begin_transaction()
            futures += [producer.send(ProducerRecord(topic, b"c%d" % i, key=b"%d" % i)) for i in range(300)]
            producer.commit_transaction()
        finally:
            kafka3.node(coordinator).start()
        assert all(f.exception(0) is None for f in futures)
    wait_in_sync(kafka3, "__transaction_state")
    messages = consume_to_marks(kafka3.bootstrap, topic, timeout=90, overrides={"isolation.level": "read_committed"})
    assert sorted(m.value() for m in messages) == sorted(b"%s%d" % (p, i) for p in (b"a", b"b", b"c") for i in range(300))
