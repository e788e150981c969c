"""The broker itself: Apache Kafka (the suite's, the demo's and ``kprod-broker``'s) starts,
creates topics and round-trips through confluent-kafka.

If these fail, every integration test would fail for a reason that is not kprod's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from kprod_broker import KafkaCluster
from tests.brokers import (
    consume_all,
    consume_to_marks,
    create_topic,
    discard,
    partition_counts,
    start_kafka,
    subprocess_env,
    unique_topic,
)
from tests.procs import descendants


def test_broker_round_trip_with_reference_client(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("fixture"), partitions=3)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(30):
        p.produce(topic, value=b"v%d" % i, partition=i % 3)
    assert p.flush(30) == 0
    messages = consume_all(kafka.bootstrap, topic, 30)
    assert sorted(m.value() for m in messages) == sorted(b"v%d" % i for i in range(30))
    assert partition_counts(messages) == {0: 10, 1: 10, 2: 10}
    # to_end reads past ``expected`` up to the high watermarks (so a duplicate shows).
    assert len(consume_all(kafka.bootstrap, topic, 1, to_end=True)) == 30


def test_read_until_a_last_record_written_before_a_transactions_marker(kafka: KafkaCluster) -> None:
    """A transaction ended after the last plain record puts its marker after it, out of
    a reader's reach: ``until`` stops at the last record, where the high watermark would not."""
    topic = create_topic(kafka.bootstrap, unique_topic("until"), partitions=1)
    txn = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": unique_topic("until-tid")})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"in-txn", partition=0)
    assert txn.flush(30) == 0
    plain = Producer({"bootstrap.servers": kafka.bootstrap})
    plain.produce(topic, value=b"end", partition=0)
    assert plain.flush(30) == 0
    txn.commit_transaction(30)
    read = consume_all(kafka.bootstrap, topic, 2, timeout=10, until=b"end",
                       overrides={"isolation.level": "read_committed"})
    assert [m.value() for m in read] == [b"in-txn", b"end"]
    with pytest.raises(AssertionError, match="not to the high watermarks"):
        consume_all(kafka.bootstrap, topic, 2, timeout=2, to_end=True, overrides={"isolation.level": "read_committed"})


def test_reads_to_end_marks_leave_every_mark_out(kafka: KafkaCluster) -> None:
    """consume_to_marks reads a topic again after an earlier call left its marks there:
    the same records, none of either call's marks."""
    topic = create_topic(kafka.bootstrap, unique_topic("marks"), partitions=2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(3):
        p.produce(topic, value=b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    for _ in range(2):
        assert sorted(m.value() for m in consume_to_marks(kafka.bootstrap, topic)) == [b"v0", b"v1", b"v2"]


def test_kprod_broker_command_serves_on_its_port_until_ctrl_c() -> None:
    """``kprod-broker --port N`` prints 127.0.0.1:N, an address that serves (a record goes
    in and comes back, through kprod and through confluent-kafka at localhost:N, on topics
    created on first use with --partitions); the JVM takes KAFKA_OPTS. A second
    ``--port N`` meanwhile exits 1 before starting a JVM, its error naming the port. Ctrl-C
    (SIGINT) stops the first: exit status 0, its JVM gone. (One broker for all of it: each
    costs a JVM's start.)"""
    from kprod_broker import free_port

    port = free_port()
    env = subprocess_env()  # KAFKA_OPTS: the suite's JVM options (C1 only, the class archive)
    env["KAFKA_OPTS"] = f"{env['KAFKA_OPTS']} -Dkprod.test=from-kafka-opts"
    broker = subprocess.Popen([sys.executable, "-m", "kprod_broker", "--port", str(port), "--partitions", "2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert broker.stdout is not None and broker.stderr is not None
        bootstrap = broker.stdout.readline().strip()
        assert bootstrap == f"127.0.0.1:{port}", broker.stderr.read() if broker.poll() is not None else bootstrap
        (jvm,) = descendants(broker.pid)  # the Kafka node's JVM
        with open(f"/proc/{jvm}/cmdline", "rb") as cmdline:
            assert b"\0-Dkprod.test=from-kafka-opts\0" in cmdline.read()
        from spark_sink.producer import KafkaProducer, ProducerRecord

        topic = unique_topic("cli")
        with KafkaProducer({"bootstrap.servers": bootstrap}) as producer:
            producer.send(ProducerRecord(topic, b"hello", b"k")).result(30)
        (message,) = consume_all(bootstrap, topic, 1)
        assert (message.key(), message.value()) == (b"k", b"hello")
        assert len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
                   .topics[topic].partitions) == 2
        topic = unique_topic("port")
        p = Producer({"bootstrap.servers": f"localhost:{port}"})
        p.produce(topic, value=b"on a fixed port")
        assert p.flush(30) == 0
        assert [m.value() for m in consume_all(bootstrap, topic, 1)] == [b"on a fixed port"]

        second = subprocess.run([sys.executable, "-m", "kprod_broker", "--port", str(port)], env=subprocess_env(),
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1 and second.stdout == "", second.stdout + second.stderr
        assert f"port {port} on 127.0.0.1 is taken" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr, second.stderr

        broker.send_signal(signal.SIGINT)
        assert broker.wait(60) == 0, broker.stderr.read()
        assert not os.path.exists(f"/proc/{jvm}")  # stopped and reaped, not left to init
    finally:
        if broker.poll() is None:
            # Its node runs in a session of its own: killed with the command, not left to init.
            for pid in descendants(broker.pid):
                os.kill(pid, signal.SIGKILL)
            broker.kill()


def test_kprod_broker_refuses_a_port_out_of_range() -> None:
    done = subprocess.run([sys.executable, "-m", "kprod_broker", "--port", "70000"], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--port must be a TCP port, 1 to 65535, got 70000" in done.stderr, done.stderr


def test_kprod_broker_names_a_taken_registry_port_before_starting_kafka() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "kprod_broker", "--registry-port", str(port)],
                              env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is taken" in done.stderr, done.stderr
    assert "Apache Kafka" not in done.stderr  # refused before the node started


def test_a_node_whose_port_was_taken_before_it_bound_is_started_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's one start failure seen (a secured node: "Socket server failed to bind
    to 127.0.0.1:47985: Address already in use"): a port free when chosen, taken before
    the JVM bound it. The port picker's first port is one a socket here holds: the first
    start fails on it, the second, on other ports, serves."""
    import kprod_broker.cluster as cluster

    real = cluster.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        handed = iter([taken_port])
        monkeypatch.setattr(cluster, "free_port", lambda: next(handed, None) or real())
        node = start_kafka()
    try:
        assert node.nodes[0].port != taken_port
        topic = create_topic(node.bootstrap, unique_topic("rebound"), 1)
        producer = Producer({"bootstrap.servers": node.bootstrap})
        producer.produce(topic, b"x")
        assert producer.flush(30) == 0
    finally:
        discard(node)
