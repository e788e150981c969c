"""KafkaProducer.send against both real brokers, read back with confluent-kafka (CRC checked)."""

from __future__ import annotations

import os
import threading

import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import (
    ConfigError,
    InvalidPartitionError,
    KafkaProducer,
    KafkaTimeoutError,
    ProducerClosedError,
    ProducerRecord,
    RecordMetadata,
    RecordTooLargeError,
    SerializationError,
)
from spark_sink.producer import accumulator as accumulator_module
from spark_sink.producer import batch as batch_module
from spark_sink.producer.batch import PyRecordBuffer, SendCallback
from spark_sink.producer.partitioner import murmur2
from spark_sink.protocol.error_codes import KProdError
from tests.brokers import consume_all, create_topic, free_port, unique_topic

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
SIZES = [0, 1, 100, 1000, 20_000, 200_000]


def _records(topic: str) -> list[ProducerRecord]:
    out = []
    for i, size in enumerate(SIZES * 4):
        value = os.urandom(size)
        headers = [("h", b"x%d" % i), ("n", None)] if i % 2 else None
        if i % 3 == 0:
            out.append(ProducerRecord(topic, value, key=b"key-%d" % (i % 5),
                                       headers=headers, timestamp=1_600_000_000_000 + i))
        elif i % 3 == 1:
            out.append(ProducerRecord(topic, value, headers=headers, timestamp=1_600_000_000_000 + i))
        else:
            out.append(ProducerRecord(topic, value, partition=i % 3, headers=headers))
    return out


@pytest.mark.parametrize("codec, level", [(c, None) for c in CODECS] + [("gzip", 1), ("lz4", 12), ("zstd", -3)])
def test_round_trip_every_codec(broker: KafkaCluster, codec: str, level: int | None) -> None:
    topic = create_topic(broker.bootstrap, unique_topic(codec), partitions=3)
    records = _records(topic)
    callbacks = []
    config = {"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 2}
    if level is not None:
        config[f"compression.{codec}.level"] = level
    with KafkaProducer(config) as p:
        futures = [p.send(r, callback=lambda md, err: callbacks.append((md, err))) for r in records]
        p.flush(60)
        metadata = [f.result(10) for f in futures]
    assert len(callbacks) == len(records) and all(err is None for _, err in callbacks)
    consumed = {(m.partition(), m.offset()): m for m in consume_all(broker.bootstrap, topic, len(records))}
    assert len(consumed) == len(records)
    for record, md in zip(records, metadata):
        m = consumed[(md.partition, md.offset)]  # the offset we were told is where it is read
        assert m.value() == record.value
        assert m.key() == record.key
        assert (m.headers() or None) == (record.headers or None)
        if record.timestamp is not None:
            assert m.timestamp()[1] == record.timestamp
        if record.partition is not None:
            assert md.partition == record.partition
        elif record.key is not None:
            assert md.partition == (murmur2(record.key) & 0x7FFFFFFF) % 3
    # per-key order: offsets grow in send order within each key
    by_key: dict[bytes, list[int]] = {}
    for record, md in zip(records, metadata):
        if record.key is not None:
            by_key.setdefault(record.key, []).append(md.offset)
    assert all(offsets == sorted(offsets) for offsets in by_key.values())


class _RecordSubclass(ProducerRecord):
    @property
    def topic(self) -> str:
        return self._topic

    @topic.setter
    def topic(self, value: str) -> None:
        self._topic = value


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_keyed_order_and_no_duplicates_many_records(broker: KafkaCluster, compiled: bool,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """send()'s short way, compiled and (as where kprod's extension is not built) Python's:
    every record once, in order per key, each callback told where its record is."""
    if not compiled:
        monkeypatch.setattr(accumulator_module, "PlainAppender", None)
        monkeypatch.setattr(accumulator_module, "RecordBuffer", PyRecordBuffer)
        monkeypatch.setattr(batch_module, "run_callbacks", None)
    topic = create_topic(broker.bootstrap, unique_topic("order"), partitions=4)
    n = 20_000
    acked: dict[tuple[int, int], int] = {}
    errors = []

    def on_ack(i: int) -> SendCallback:
        def callback(md: RecordMetadata | None, err: Exception | None) -> None:
            if err is not None:
                errors.append(err)
            else:
                assert md is not None
                acked[(md.partition, md.offset)] = i
        return callback

    with KafkaProducer({"bootstrap.servers": broker.bootstrap, "batch.size": 4096}) as p:
        assert (getattr(p._send_plain, "__func__", None) is KafkaProducer._send_plain_py) != compiled
        # Compiled, send() itself is PlainSender's (no Python frame per record).
        assert (getattr(p.send, "__func__", None) is KafkaProducer.send) != compiled
        for i in range(n):
            # Now and then a record of a subclass: read by attribute name, not by ProducerRecord's slots.
            kind = _RecordSubclass if i % 1000 == 999 else ProducerRecord
            p.send(kind(topic, b"%d" % i, key=b"k%d" % (i % 7)), on_ack(i))
        p.flush(60)
    messages = consume_all(broker.bootstrap, topic, n, settle=0.5)
    assert len(messages) == n
    assert not errors and acked == {(m.partition(), m.offset()): int(m.value()) for m in messages}
    seen: dict[bytes, list[int]] = {}
    for m in sorted(messages, key=lambda m: (m.partition(), m.offset())):
        seen.setdefault(m.key(), []).append(int(m.value()))
    assert all(v == sorted(v) for v in seen.values())
    assert sorted(x for v in seen.values() for x in v) == list(range(n))


def test_str_values_and_serializers(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("ser"), partitions=1)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "key.serializer": lambda k: str(k).encode()}) as p:
        p.send(ProducerRecord(topic, "héllo", key=42)).result(30)
    (m,) = consume_all(kafka.bootstrap, topic, 1)
    assert (m.key(), m.value()) == (b"42", "héllo".encode())


def test_bad_input_names_what_is_wrong(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("bad"), partitions=2)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap, "max.request.size": 10_000}) as p:
        with pytest.raises(SerializationError, match="value must be bytes, str or None"):
            p.send(ProducerRecord(topic, 12))
        with pytest.raises(SerializationError, match="key"):
            p.send(ProducerRecord(topic, b"v", key=object()))
        with pytest.raises(RecordTooLargeError, match="max.request.size"):
            p.send(ProducerRecord(topic, b"x" * 20_000))
        with pytest.raises(InvalidPartitionError, match="partition 5.*2 partitions"):
            p.send(ProducerRecord(topic, b"v", partition=5))
        # nothing acknowledged is lost by the rejected sends
        assert p.send(ProducerRecord(topic, b"ok", partition=0)).result(30).offset == 0
    with pytest.raises(ProducerClosedError):
        p.send(ProducerRecord(topic, b"late"))


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        KafkaProducer({})
    with pytest.raises(ConfigError, match="lingerms"):
        KafkaProducer({"bootstrap.servers": "127.0.0.1:1", "lingerms": 5})


def test_unreachable_bootstrap_fails_within_max_block() -> None:
    with KafkaProducer({"bootstrap.servers": f"127.0.0.1:{free_port()}", "max.block.ms": 1500}) as p:
        with pytest.raises(KafkaTimeoutError, match="max.block.ms"):
            p.send(ProducerRecord("nowhere", b"v"))


def test_acks_zero_and_one(broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("acks"), partitions=1)
    for acks in ("0", "1"):
        called: list[tuple[RecordMetadata | None, Exception | None]] = []
        with KafkaProducer({"bootstrap.servers": broker.bootstrap, "acks": acks}) as p:
            def record(md: RecordMetadata | None, err: Exception | None, called: list = called) -> None:
                called.append((md, err))

            futures = [p.send(ProducerRecord(topic, b"a%s" % acks.encode()), record) for _ in range(10)]
            p.flush(30)
            metadata = [f.result(5) for f in futures]
            offsets = [md.offset for md in metadata]
            assert offsets == ([-1] * 10 if acks == "0" else list(range(offsets[0], offsets[0] + 10)))
            assert called == [(md, None) for md in metadata]  # callbacks get what the futures give
    assert len(consume_all(broker.bootstrap, topic, 20)) == 20


def test_callbacks_from_many_threads(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("threads"), partitions=3)
    calls = []
    lock = threading.Lock()

    def cb(md: RecordMetadata | None, err: Exception | None) -> None:
        with lock:
            calls.append(err)

    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        threads = [threading.Thread(target=lambda: [p.send(ProducerRecord(topic, b"v"), cb) for _ in range(2000)])
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        p.flush(60)
    assert len(calls) == 8000 and not any(calls)


def test_the_sending_thread_does_the_io_while_it_sends(kafka: KafkaCluster) -> None:
    """While an application sends, its own thread seals, sends and acknowledges the batches
    it fills (so the two threads do not trade the GIL per record); every record still gets
    exactly one callback."""
    topic = create_topic(kafka.bootstrap, unique_topic("caller-io"), partitions=3)
    calls: list[tuple[RecordMetadata | None, Exception | None, int]] = []
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        p.partitions_for(topic)
        for i in range(50_000):
            p.send(ProducerRecord(topic, b"v" * 100, key=b"%d" % i),
                   lambda md, err: calls.append((md, err, threading.get_ident())))
        acknowledged_while_sending = len(calls)
        p.flush(60)
    assert len(calls) == 50_000 and not any(err for _, err, _ in calls)
    assert len({(md.partition, md.offset) for md, _, _ in calls if md is not None}) == 50_000
    assert acknowledged_while_sending > 0
    on_this_thread = sum(thread == threading.get_ident() for _, _, thread in calls[:acknowledged_while_sending])
    assert on_this_thread > acknowledged_while_sending // 2


def test_callbacks_may_send_but_not_flush_or_wait_for_close(kafka: KafkaCluster) -> None:
    """A callback runs on whichever thread does the sender's work, the sending thread
    included: send() from it works, flush() raises instead of waiting for itself (as in
    Java), close() closes without waiting."""
    topic = create_topic(kafka.bootstrap, unique_topic("cb-reentry"), partitions=3)
    outcomes: list[Exception | None] = []
    flush_errors: list[Exception] = []
    resent: list[Exception | None] = []

    def resend(md: RecordMetadata | None, err: Exception | None) -> None:
        resent.append(err)

    def callback(md: RecordMetadata | None, err: Exception | None) -> None:
        outcomes.append(err)
        if len(outcomes) % 500 == 1:
            p.send(ProducerRecord(topic, b"from a callback"), resend)
            try:
                p.flush(5)
            except Exception as exc:
                flush_errors.append(exc)

    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as p:
        for i in range(5000):
            p.send(ProducerRecord(topic, b"%d" % i), callback)
        p.flush(60)
    assert len(outcomes) == 5000 and not any(outcomes)
    assert resent and not any(resent) and len(flush_errors) == len(resent)
    assert all(isinstance(e, KProdError) and "callback" in str(e) for e in flush_errors)
    assert len(consume_all(kafka.bootstrap, topic, 5000 + len(resent))) == 5000 + len(resent)

    closed = threading.Event()

    def close_on_first(md: RecordMetadata | None, err: Exception | None) -> None:
        if not closed.is_set():
            closed.set()
            q.close()

    q = KafkaProducer({"bootstrap.servers": kafka.bootstrap})
    futures = []
    try:
        for i in range(100_000):
            futures.append(q.send(ProducerRecord(topic, b"%d" % i), close_on_first))
    except ProducerClosedError:
        pass
    assert closed.wait(30)
    q.close(30)
    # Closed without waiting: every record is acknowledged or failed, none left hanging.
    assert all(f.exception(30) is None or "closed" in str(f.exception()) for f in futures)


def test_an_interrupted_round_fails_what_is_pending_and_never_hangs(kafka: KafkaCluster) -> None:
    """Ctrl-C can land while the sending thread does the sender's work (here: raised from a
    callback). The producer then stops: every record is acknowledged or failed, none left
    waiting, and a later send() says the producer stopped."""
    topic = create_topic(kafka.bootstrap, unique_topic("interrupted"), partitions=3)
    this_thread = threading.get_ident()

    def interrupt(md: RecordMetadata | None, err: Exception | None) -> None:
        if threading.get_ident() == this_thread:
            raise KeyboardInterrupt

    p = KafkaProducer({"bootstrap.servers": kafka.bootstrap})
    futures = []
    with pytest.raises(KeyboardInterrupt):
        for i in range(1_000_000):
            futures.append(p.send(ProducerRecord(topic, b"%d" % i), interrupt))
    # Each is settled (none waits forever): acknowledged, or failed because the producer
    # stopped. (Whether any was still pending when the interrupt came depends on timing.)
    for f in futures:
        assert f.exception(30) is None or "stopped" in str(f.exception())
    assert not p.usable  # stopped by the interrupted round itself, on this thread
    with pytest.raises(ProducerClosedError, match="stopped"):
        p.send(ProducerRecord(topic, b"after"))
    p.close(30)
