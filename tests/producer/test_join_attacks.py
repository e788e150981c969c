"""Attacks on send_arrow's joined batches on a real Kafka node (behind the fault proxy):
several threads mixing send_arrow calls (partition column, keys, null keys, headers,
timestamps going back and forth, empty tables) with send() records, at odd batch.size and
linger.ms, with the broker's replies delayed and connections cut, so that the Sender
drains a partition's batch between a call's encoding (RecordAccumulator.continued) and
its queueing. Read back with confluent-kafka: every record once, each thread's records in
send order per partition, at the offset and timestamp its future or its call's summary
reports."""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, consume_to_marks, consumer, unique_topic

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka

BASE_TS = int(time.time() * 1000) - 10 * 86_400_000  # ten days ago: within any broker's timestamp window


def make_topic(bootstrap: str, partitions: int, config: dict[str, str] | None = None) -> str:
    """A new topic with ``config`` (max.message.bytes, say), every partition led."""
    name = unique_topic("join")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                  config=config or {})])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if t and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return name
        time.sleep(0.1)
    raise AssertionError(f"{name} has no leaders")


@dataclass
class Sent:
    """What the threads sent and what they heard back."""

    rows: dict[bytes, dict[str, Any]] = field(default_factory=dict)  # value tag -> what it was sent with
    record_futures: list[tuple[bytes, Any]] = field(default_factory=list)  # send(): tag, its future
    calls: list[tuple[list[bytes], Any]] = field(default_factory=list)  # send_arrow: its tags, its future
    callbacks: collections.Counter = field(default_factory=collections.Counter)  # tag -> callbacks heard
    callback_meta: dict[bytes, tuple[int, int, int]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def tag_of(value: bytes) -> bytes:
    return value.split(b"|", 1)[0]


def worker(producer: KafkaProducer, topic: str, partitions: int, thread: int, calls: int, rng: random.Random,
           sent: Sent, mode: str) -> None:
    """``calls`` send_arrow calls or runs of send() from one thread, shapes from ``rng``."""
    seq = 0
    ts = BASE_TS + rng.randrange(0, 86_400_000)
    for _ in range(calls):
        use_send = mode != "arrow" and rng.random() < 0.3
        n = rng.choice([0, 1, 1, 2, 3, 7, 20, 60, 200, 700]) if not use_send else rng.randrange(1, 25)
        pad = rng.choice([0, 5, 40, 300, 1500])
        skew = rng.random() < 0.4
        routing = rng.choice(["partition", "partition", "key", "nullkey"])
        with_headers = rng.random() < 0.3
        with_ts = rng.random() < 0.7
        tags, values, keys, parts, stamps, headers = [], [], [], [], [], []
        for _ in range(n):
            tag = b"%d:%d" % (thread, seq)
            seq += 1
            tags.append(tag)
            values.append(tag + b"|" + bytes(rng.randrange(0, pad + 1)))
            parts.append(0 if skew and rng.random() < 0.8 else rng.randrange(partitions))
            keys.append(None if routing == "nullkey" or rng.random() < 0.1 else b"k%d" % rng.randrange(50))
            # Timestamps back and forth by up to a day: deltas of either sign and any width.
            ts += rng.choice([0, 1, -1, 7, -300, 60_000, -3_600_000, 86_400_000 // 2])
            ts = max(BASE_TS - 86_400_000, min(ts, BASE_TS + 2 * 86_400_000))
            stamps.append(ts)
            headers.append([{"key": "h", "value": tag}, {"key": "e", "value": None}] if with_headers else [])
        for i, tag in enumerate(tags):
            sent.rows[tag] = {"partition": parts[i] if routing == "partition" else None,
                              "key": keys[i] if routing != "partition" else None,
                              "timestamp": stamps[i] if with_ts else None,
                              "headers": with_headers, "value": values[i]}
        if use_send:
            for i, tag in enumerate(tags):
                def cb(md: Any, err: Exception | None, tag: bytes = tag) -> None:
                    with sent.lock:
                        sent.callbacks[tag] += 1
                        if err is None:
                            sent.callback_meta[tag] = (md.partition, md.offset, md.timestamp)
                record = ProducerRecord(topic, values[i], key=sent.rows[tag]["key"],
                                        partition=parts[i] if routing == "partition" else None,
                                        headers=[("h", tag), ("e", None)] if with_headers else None,
                                        timestamp=stamps[i] if with_ts else None)
                sent.record_futures.append((tag, producer.send(record, cb)))
            continue
        columns: dict[str, Any] = {"value": pa.array(values, pa.binary())}
        if routing == "partition":
            columns["partition"] = pa.array(parts, pa.int32())
        else:
            columns["key"] = pa.array([sent.rows[t]["key"] for t in tags], pa.binary())
        if with_ts:
            columns["timestamp"] = pa.array(stamps, pa.int64())
        if with_headers:
            columns["headers"] = pa.array(headers, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
        data = pa.record_batch(columns) if rng.random() < 0.3 else pa.table(columns)
        sent.calls.append((tags, producer.send_arrow(data, topic=topic)))
        if rng.random() < 0.05:
            producer.flush(60)


def read_back(bootstrap: str, topic: str, expected: int, **overrides: object) -> list:
    return consume_all(bootstrap, topic, expected, timeout=60, to_end=True, overrides=overrides)


def check(bootstrap: str, topic: str, sent: Sent, *, timeout: float = 120) -> None:
    """Every acknowledged record once, in each thread's order per partition, where its
    future or its call's summary says, with the timestamp, key and headers it was sent with."""
    results = [(tags, f.result(timeout)) for tags, f in sent.calls]
    metas = {tag: f.result(timeout) for tag, f in sent.record_futures}
    messages = read_back(bootstrap, topic, len(sent.rows))
    where: dict[bytes, tuple[int, int]] = {}
    by_partition: dict[int, list[tuple[int, bytes]]] = collections.defaultdict(list)
    for m in messages:
        tag = tag_of(m.value())
        assert tag not in where, f"{tag!r} twice: at {where[tag]} and {(m.partition(), m.offset())}"
        where[tag] = (m.partition(), m.offset())
        by_partition[m.partition()].append((m.offset(), tag))
        row = sent.rows[tag]
        assert m.value() == row["value"]
        if row["partition"] is not None:
            assert m.partition() == row["partition"], tag
        if row["key"] is not None:
            assert m.key() == row["key"], tag
        if row["timestamp"] is not None:
            assert m.timestamp()[1] == row["timestamp"], (tag, m.timestamp(), row["timestamp"])
        hs = m.headers() or []
        assert hs == ([("h", tag), ("e", None)] if row["headers"] else []), (tag, hs)
    assert set(where) == set(sent.rows), f"missing {len(set(sent.rows) - set(where))}"
    # Each thread's records in the order it sent them, per partition.
    for partition, entries in by_partition.items():
        last: dict[bytes, int] = {}
        for _, tag in sorted(entries):
            if tag == b"warm":
                continue
            thread, seq = tag.split(b":")
            assert last.get(thread, -1) < int(seq), f"partition {partition}: {tag!r} after {thread!r}:{last[thread]}"
            last[thread] = int(seq)
    for tag, md in metas.items():
        assert (md.partition, md.offset) in (where[tag], (where[tag][0], -1)), (tag, md, where[tag])
        assert sent.callbacks[tag] == 1 and sent.callback_meta[tag][:2] == (md.partition, md.offset)
    for tags, r in results:
        assert r.records == len(tags)
        offsets: dict[int, list[int]] = collections.defaultdict(list)
        for tag in tags:
            offsets[where[tag][0]].append(where[tag][1])
        assert {p for _, p in r.partitions} == set(offsets), (r.partitions, sorted(offsets))
        for (_, p), (count, first, last) in r.partitions.items():
            assert count == len(offsets[p]), (p, count, len(offsets[p]))
            assert first in (-1, min(offsets[p])) and last in (-1, max(offsets[p])), (p, first, last, offsets[p])


def run(kafka_proxy: ProxiedKafka, seed: int, *, partitions: int, config: dict[str, Any], threads: int = 3,
        calls: int = 25, delay_ms: float = 0, cut_every_s: float | None = None, mode: str = "mixed",
        topic_config: dict[str, str] | None = None) -> Sent:
    print(f"seed={seed} partitions={partitions} config={config} delay={delay_ms} cuts={cut_every_s}")
    proxy = kafka_proxy.proxy
    topic = make_topic(kafka_proxy.bootstrap, partitions, topic_config)
    sent = Sent()
    producer_config = {"bootstrap.servers": kafka_proxy.bootstrap, "request.timeout.ms": 5000,
                       "delivery.timeout.ms": 120000, "retry.backoff.ms": 20, "reconnect.backoff.ms": 10,
                       "reconnect.backoff.max.ms": 100, **config}
    with KafkaProducer(producer_config) as producer:
        producer.send(ProducerRecord(topic, b"warm|", partition=0)).result(30)  # metadata and limits learnt
        sent.rows[b"warm"] = {"partition": 0, "key": None, "timestamp": None, "headers": False, "value": b"warm|"}
        proxy.set_delay(delay_ms, replies_only=True)
        errors: list[BaseException] = []

        def go(t: int) -> None:
            try:
                worker(producer, topic, partitions, t, calls, random.Random(seed * 100 + t), sent, mode)
            except BaseException as exc:  # reported below
                errors.append(exc)

        pool = [threading.Thread(target=go, args=(t,)) for t in range(threads)]
        with proxy.cutting(cut_every_s) if cut_every_s else contextlib.nullcontext():
            for t in pool:
                t.start()
            for t in pool:
                t.join()
            producer.flush(120)
        proxy.set_delay(0)
        assert not errors, errors
    check(kafka_proxy.bootstrap, topic, sent)
    return sent


SEEDS = [11, 12, 13, 14, 15, 16]


def suite_first(*seeds: int) -> list[object]:
    """The first seed in the suite, the others in make soak (-m soak)."""
    return [seeds[0], *(pytest.param(seed, marks=pytest.mark.soak) for seed in seeds[1:])]


@pytest.mark.parametrize("seed", suite_first(*SEEDS))
def test_mixed_threads_with_delayed_replies(kafka_proxy: ProxiedKafka, seed: int) -> None:
    rng = random.Random(seed)
    config = {"linger.ms": rng.choice([0, 1, 3, 17]), "batch.size": rng.choice([97, 200, 1000, 4096, 16384, 65536])}
    run(kafka_proxy, seed, partitions=rng.choice([1, 2, 5, 40]), config=config,
        delay_ms=rng.choice([0, 2, 10, 30]))


@pytest.mark.parametrize("seed", suite_first(21, 22, 23))
def test_mixed_threads_with_cut_connections(kafka_proxy: ProxiedKafka, seed: int) -> None:
    rng = random.Random(seed)
    config = {"linger.ms": rng.choice([0, 2]), "batch.size": rng.choice([300, 2048, 16384])}
    run(kafka_proxy, seed, partitions=rng.choice([1, 3, 12]), config=config, delay_ms=rng.choice([0, 5]),
        cut_every_s=0.3, calls=40)


@pytest.mark.parametrize("seed", suite_first(31, 32))
def test_joins_up_to_a_small_max_message_bytes(kafka_proxy: ProxiedKafka, seed: int) -> None:
    """batch.size far above the topic's max.message.bytes: no joined batch may outgrow the topic's limit."""
    rng = random.Random(seed)
    run(kafka_proxy, seed, partitions=rng.choice([1, 4]), config={"linger.ms": 5, "batch.size": 1 << 20},
        delay_ms=10, topic_config={"max.message.bytes": str(rng.choice([2000, 5000]))}, mode="arrow")


def read_committed(bootstrap: str, topic: str, partitions: int) -> list:
    """Everything a read_committed consumer sees of ``topic``, to its end."""
    c = consumer(bootstrap, **{"isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out: list = []
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < partitions and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=0.2):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition() or 0)
                        continue
                    raise AssertionError(error)
                out.append(m)
        assert len(eof) == partitions
        return out
    finally:
        c.close()


@pytest.mark.parametrize("seed", suite_first(41, 42, 43))
def test_transactions_commit_and_abort_joined_batches(kafka_proxy: ProxiedKafka, seed: int) -> None:
    """A transactional producer's send_arrow calls (and send()s) joined into batches, some
    transactions aborted: read_committed sees the committed ones' records exactly, in order."""
    rng = random.Random(seed)
    print(f"seed={seed}")
    partitions = rng.choice([1, 3, 8])
    topic = make_topic(kafka_proxy.bootstrap, partitions)
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "transactional.id": f"join-{seed}-{time.time_ns()}",
              "linger.ms": rng.choice([0, 5]), "batch.size": rng.choice([500, 4096, 65536])}
    kafka_proxy.proxy.set_delay(rng.choice([0, 5]), replies_only=True)
    committed: list[bytes] = []
    seq = 0
    with KafkaProducer(config) as p:
        p.init_transactions(30)
        for _ in range(8):
            p.begin_transaction()
            values: list[bytes] = []
            futures: list[Any] = []
            for _ in range(rng.randrange(1, 8)):
                n = rng.choice([0, 1, 5, 40, 300])
                vs = [b"%d" % (seq + i) for i in range(n)]
                seq += n
                values += vs
                parts = [rng.randrange(partitions) for _ in vs]
                if rng.random() < 0.2:
                    for v, part in zip(vs, parts):
                        futures.append(p.send(ProducerRecord(topic, v, partition=part)))
                else:
                    futures.append(p.send_arrow(pa.table({"value": pa.array(vs, pa.binary()),
                                                          "partition": pa.array(parts, pa.int32())}), topic=topic))
            if rng.random() < 0.4:
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
                for f in futures:
                    f.result(30)
                committed += values
    kafka_proxy.proxy.set_delay(0)
    got = read_committed(kafka_proxy.bootstrap, topic, partitions)
    numbers = [int(m.value()) for m in got]
    assert sorted(numbers) == sorted(int(v) for v in committed)
    per_partition: dict[int, list[int]] = collections.defaultdict(list)
    for m in sorted(got, key=lambda m: (m.partition(), m.offset())):
        per_partition[m.partition()].append(int(m.value()))
    assert all(v == sorted(v) for v in per_partition.values())


def test_compression_on_and_off_between_producers_into_one_partition(kafka_proxy: ProxiedKafka) -> None:
    """Two producers, one compressing (no joins) and one not (joins), into the same partitions
    at once: each one's records once and in order."""
    topic = make_topic(kafka_proxy.bootstrap, 2)
    base = {"bootstrap.servers": kafka_proxy.bootstrap, "linger.ms": 1, "batch.size": 1000}
    kafka_proxy.proxy.set_delay(5, replies_only=True)
    n = 0
    with KafkaProducer({**base, "compression.type": "lz4"}) as a, KafkaProducer(base) as b:
        futures = []
        for i in range(60):
            rows = [b"%d:%d" % (i % 2, n + j) for j in range(i % 7 * 11)]
            n += len(rows)
            producer = a if i % 2 else b
            futures.append(producer.send_arrow(pa.table({"value": pa.array(rows, pa.binary()),
                                                         "partition": pa.array([j % 2 for j in range(len(rows))],
                                                                               pa.int32())}), topic=topic))
        for f in futures:
            f.result(60)
    kafka_proxy.proxy.set_delay(0)
    messages = consume_all(kafka_proxy.bootstrap, topic, n, timeout=60, to_end=True)
    assert len(messages) == n
    last: dict[tuple[int, bytes], int] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        who, num = m.value().split(b":")
        assert last.get((m.partition(), who), -1) < int(num)
        last[(m.partition(), who)] = int(num)


@pytest.mark.parametrize("seed", suite_first(51, 52))
def test_joined_batches_split_after_the_topics_limit_is_lowered(kafka_proxy: ProxiedKafka, seed: int,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """max.message.bytes lowered after the producer learnt it: joined batches the broker
    refuses as too large are split and sent again, each record still once and in order."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    caplog.set_level(logging.INFO, logger="spark_sink.producer.sender")

    rng = random.Random(seed)
    print(f"seed={seed}")
    partitions = rng.choice([1, 3])
    topic = make_topic(kafka_proxy.bootstrap, partitions)
    admin = AdminClient({"bootstrap.servers": kafka_proxy.bootstrap})
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "linger.ms": 20, "batch.size": 65536,
              "retry.backoff.ms": 10}
    if rng.random() < 0.5:
        config["transactional.id"] = f"split-{seed}-{time.time_ns()}"
    n = 0
    with KafkaProducer(config) as p:
        txn = "transactional.id" in config
        if txn:
            p.init_transactions(30)
            p.begin_transaction()
        p.send_arrow(pa.table({"value": [b"warm"]}), topic=topic).result(30)  # the limit learnt: 1 MB
        n += 1
        lowered = ConfigEntry("max.message.bytes", "3000", incremental_operation=AlterConfigOpType.SET)
        for future in admin.incremental_alter_configs([ConfigResource("topic", topic,
                                                                      incremental_configs=[lowered])]).values():
            future.result(30)
        time.sleep(1)  # the broker applies topic configs asynchronously
        kafka_proxy.proxy.set_delay(10, replies_only=True)
        futures = []
        for _ in range(60):
            rows = [b"%d|" % (n + j) + bytes(rng.randrange(10, 200)) for j in range(rng.choice([1, 3, 10, 25]))]
            n += len(rows)
            futures.append((rows, p.send_arrow(pa.table({
                "value": pa.array(rows, pa.binary()),
                "partition": pa.array([rng.randrange(partitions) for _ in rows], pa.int32())}), topic=topic)))
        if txn:
            p.commit_transaction(60)
        results = [(rows, f.result(60)) for rows, f in futures]
    kafka_proxy.proxy.set_delay(0)
    assert "refused as too large" in caplog.text  # joined batches were split
    messages = consume_to_marks(kafka_proxy.bootstrap, topic, overrides={"isolation.level": "read_committed"})
    numbers = [int(m.value().split(b"|")[0]) if m.value() != b"warm" else -1 for m in messages]
    assert sorted(numbers) == [-1, *range(1, n)]
    where = {num: (m.partition(), m.offset()) for num, m in zip(numbers, messages)}
    per_partition: dict[int, list[int]] = collections.defaultdict(list)
    for num, m in sorted(zip(numbers, messages), key=lambda x: where[x[0]]):
        per_partition[m.partition()].append(num)
    assert all(v == sorted(v) for v in per_partition.values())
    for rows, r in results:
        offs: dict[int, list[int]] = collections.defaultdict(list)
        for row in rows:
            part, off = where[int(row.split(b"|")[0])]
            offs[part].append(off)
        for (_, part), (count, first, last) in r.partitions.items():
            assert count == len(offs[part])
            assert first in (-1, min(offs[part])) and last in (-1, max(offs[part])), (part, first, last, offs[part])


@pytest.mark.parametrize("seed", suite_first(61, 62))
def test_many_partitions_and_a_small_buffer_memory(kafka_proxy: ProxiedKafka, seed: int) -> None:
    """Hundreds of partitions (runs of RUN_PARTITIONS queued at a time) and a buffer.memory
    that makes calls wait for the Sender between runs: joins and drains interleave."""
    rng = random.Random(seed)
    run(kafka_proxy, seed, partitions=rng.choice([130, 200]), threads=2, calls=15, mode="arrow",
        config={"linger.ms": rng.choice([0, 2]), "batch.size": rng.choice([512, 2048]),
                "buffer.memory": rng.choice([48_000, 100_000]), "max.block.ms": 60_000},
        delay_ms=rng.choice([2, 10]))


@pytest.mark.parametrize("batch_size", [0, 1, 61, 62, 100])
def test_batch_size_at_and_around_a_batch_header(kafka_proxy: ProxiedKafka, batch_size: int) -> None:
    """batch.size 0, 1 or about one record batch header (61 bytes): nothing can be joined,
    and every record still goes once, in order."""
    run(kafka_proxy, 70 + batch_size, partitions=3, config={"linger.ms": 1, "batch.size": batch_size},
        delay_ms=3, calls=12, threads=2)
