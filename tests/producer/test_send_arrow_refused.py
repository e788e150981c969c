"""send_arrow(on_error="skip") on a real Kafka: the rows with an error of their own are
refused and listed, every other row arrives once, and cluster errors still raise."""

import random

import numpy as np
import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition

from kprod_broker import KafkaCluster
from spark_sink.producer import (
    ArrowSerializer,
    BrokersUnreachableError,
    ColumnError,
    InvalidPartitionError,
    KafkaProducer,
    RecordTooLargeError,
    UnknownTopicError,
)
from spark_sink.protocol.error_codes import TopicAuthorizationFailedError
from tests.brokers import consume_all, consume_to_marks, create_topic, deny_topic, unique_topic

MAX_REQUEST = 4096
# A row's kind -> the error class its refusal must name (None: a good row).
KINDS = {
    "good": None,
    "too_large": "RecordTooLargeError",
    "invalid_topic": "InvalidTopicException",
    "bad_partition": "InvalidPartitionError",
    "negative_partition": "InvalidPartitionError",
    "null_topic": "ColumnError",
}


def _rows(rng: random.Random, n: int, kinds: list[str], good_topics: list[str]) -> tuple[pa.Table, list[str]]:
    """``n`` rows, each of a kind drawn from ``kinds`` (weights drawn too)."""
    weights = [rng.random() + 0.05 for _ in kinds]
    drawn = rng.choices(kinds, weights, k=n)
    keys, values, topics, partitions = [], [], [], []
    for i, kind in enumerate(drawn):
        keys.append(b"k%d" % i)
        values.append(b"x" * (MAX_REQUEST + 10) if kind == "too_large" else b"row-%d" % i)
        topics.append({"invalid_topic": "no spaces allowed!", "null_topic": None}.get(kind, good_topics[i % 2]))
        partitions.append({"bad_partition": 7, "negative_partition": -3}.get(kind, rng.choice([None, 0, 1])))
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                      "topic": pa.array(topics, pa.string()), "partition": pa.array(partitions, pa.int32())})
    return table, drawn


@pytest.mark.parametrize("seed", range(4))
def test_bad_rows_refused_good_rows_sent_once(broker: KafkaCluster, seed: int) -> None:
    rng = random.Random(seed)
    good_topics = [create_topic(broker.bootstrap, unique_topic("skip"), partitions=2) for _ in range(2)]
    n = rng.choice([1, 7, 200, 1500])
    table, drawn = _rows(rng, n, list(KINDS), good_topics)
    config = {"bootstrap.servers": broker.bootstrap, "max.request.size": MAX_REQUEST, "batch.size": 1024}
    with KafkaProducer(config) as p:
        result = p.send_arrow(table, on_error="skip").result(60)
    refused = {int(row): r for r in result.refused for row in r.rows}
    expected_bad = {i: KINDS[k] for i, k in enumerate(drawn) if KINDS[k]}
    assert {i: r.error for i, r in refused.items()} == expected_bad
    assert result.refused_rows == len(expected_bad)
    for r in result.refused:
        # The refused rows' own columns come back with them, in row order.
        assert list(r.rows) == sorted(r.rows)
        assert r.data.column("value").to_pylist() == [table.column("value")[int(i)].as_py() for i in r.rows]
        assert r.message
    good = [i for i in range(n) if i not in expected_bad]
    assert result.records == len(good)
    for topic in good_topics:
        want = sorted(b"row-%d" % i for i in good if table.column("topic")[i].as_py() == topic)
        got = consume_all(broker.bootstrap, topic, len(want), to_end=True) if want else []
        assert sorted(m.value() for m in got) == want


# Rows without a topic column (the topic given to the call, as the Spark sink's option
# gives it), where the screen goes its fast way: kinds, their refusals' classes and what
# the message names.
DEFAULT_TOPIC_KINDS = {
    "good": None,
    "too_large": ("RecordTooLargeError", "max.request.size"),
    "over_topic_limit": ("RecordTooLargeError", "max.message.bytes"),  # under max.request.size
    "bad_partition": ("InvalidPartitionError", "column 'partition'"),
    "negative_partition": ("InvalidPartitionError", "column 'partition'"),
}


def _default_topic_rows(rng: random.Random, n: int, bad_share: float) -> tuple[pa.Table, list[str]]:
    """``n`` rows (no topic column), each bad with probability ``bad_share``, of a kind
    drawn; as several record batches, as a Spark task joins them."""
    from tests.producer.test_message_too_large import LIMIT

    bad_kinds = [k for k in DEFAULT_TOPIC_KINDS if k != "good"]
    drawn = [rng.choice(bad_kinds) if rng.random() < bad_share else "good" for _ in range(n)]
    values, partitions = [], []
    for i, kind in enumerate(drawn):
        size = {"too_large": MAX_REQUEST + rng.randrange(1, 50), "over_topic_limit": LIMIT + rng.randrange(0, 500)
                }.get(kind, rng.randrange(0, 200))
        values.append(b"%06d:" % i + bytes(size))
        partitions.append({"bad_partition": 2, "negative_partition": -1 - rng.randrange(5)}.get(
            kind, rng.choice([None, 0, 1])))
    table = pa.table({"key": pa.array([b"k%d" % i for i in range(n)], pa.binary()),
                      "value": pa.array(values, pa.binary()), "partition": pa.array(partitions, pa.int32())})
    cuts = sorted(rng.sample(range(1, n), min(n - 1, rng.randrange(0, 6)))) if n > 1 else []
    batches = [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, n])]
    return pa.concat_tables(batches), drawn


@pytest.mark.parametrize("seed", range(6))
def test_bad_rows_refused_without_a_topic_column(broker: KafkaCluster, seed: int) -> None:
    """The screen's fast way (one topic for every row, given to the call; a table of
    several chunks; no bad row, some, or all): every bad row refused for its reason at
    its index, exactly as the same rows naming their topic in a column are, and every
    good row arrives once."""
    from tests.producer.test_message_too_large import _small_topic

    rng = random.Random(seed)
    topic = _small_topic(broker.bootstrap, 2)
    n = rng.choice([1, 40, 400, 3000]) if seed >= 3 else 400
    bad_share = [0.0, rng.uniform(0.01, 0.5), 1.0][seed % 3]
    table, drawn = _default_topic_rows(rng, n, bad_share)
    config = {"bootstrap.servers": broker.bootstrap, "max.request.size": MAX_REQUEST, "batch.size": 2048}
    with KafkaProducer(config) as p:
        result = p.send_arrow(table, topic, on_error="skip").result(60)
        # The same rows naming their topic in a column: the screen's general way.
        named_result = p.send_arrow(table.append_column("topic", pa.array([topic] * n, pa.string())),
                                    on_error="skip").result(60)
    expected = {i: DEFAULT_TOPIC_KINDS[k] for i, k in enumerate(drawn) if k != "good"}
    named_by = [kind[1] for kind in DEFAULT_TOPIC_KINDS.values() if kind]
    for r in (result, named_result):
        assert {int(row): (g.error, next(m for m in named_by if m in g.message))
                for g in r.refused for row in g.rows} == expected
        assert r.records == n - len(expected)
        for g in r.refused:
            assert g.data.column("value").to_pylist() == [table.column("value")[int(i)].as_py() for i in g.rows]
    assert [(g.error, g.message, list(g.rows)) for g in result.refused] == [
        (g.error, g.message, list(g.rows)) for g in named_result.refused]
    good = sorted(table.column("value")[i].as_py() for i in range(n) if i not in expected)
    got = consume_all(broker.bootstrap, topic, 2 * len(good), to_end=True) if good else []
    assert sorted(m.value() for m in got) == sorted(good * 2)


def test_fail_mode_raises_as_before(broker: KafkaCluster) -> None:
    topic = create_topic(broker.bootstrap, unique_topic("fail"), partitions=2)
    config = {"bootstrap.servers": broker.bootstrap, "max.request.size": MAX_REQUEST}
    with KafkaProducer(config) as p:
        with pytest.raises(RecordTooLargeError):
            p.send_arrow(pa.table({"value": [b"ok", b"x" * MAX_REQUEST]}), topic)
        with pytest.raises(InvalidPartitionError):
            p.send_arrow(pa.table({"value": [b"ok"], "partition": pa.array([5], pa.int32())}), topic)
        with pytest.raises(ColumnError):
            p.send_arrow(pa.table({"value": [b"ok"], "topic": pa.array([None], pa.string())}))
        with pytest.raises(ValueError, match="on_error"):
            p.send_arrow(pa.table({"value": [b"ok"]}), topic, on_error="ignore")
        # A column error of the input itself is never a row's: it raises when skipping too.
        with pytest.raises(ColumnError, match="'colour'"):
            p.send_arrow(pa.table({"value": [b"ok"], "colour": [1]}), topic, on_error="skip")


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_a_call_whose_rows_all_name_invalid_topics_refuses_them_all(broker: KafkaCluster, schema_registry: str,
                                                                   fmt: str) -> None:
    """Break 60: with a value format, a call (or a slice of the sink's) whose every row
    names a topic Kafka refuses left the serializer no row: pyarrow's "Must pass at least
    one array" failed the call instead of refusing them."""
    value = pa.array([{"id": 1}, {"id": 2}], pa.struct([("id", pa.int64())]))
    table = pa.table({"value": value, "topic": ["bad topic!", "bad topic!"]})
    serializer = ArrowSerializer(fmt, {"url": schema_registry})
    with KafkaProducer({"bootstrap.servers": broker.bootstrap}) as p:
        result = p.send_arrow(table, on_error="skip", value_serializer=serializer).result(30)
    assert result.records == 0
    assert [(r.error, r.rows.tolist()) for r in result.refused] == [("InvalidTopicException", [0, 1])]


def test_a_calls_refused_rows_are_handed_over_once(broker: KafkaCluster) -> None:
    """take_refused gives the rows a call refused as it returns and keeps none: the
    sink hands them to its dead letters at once rather than hold them with the call's
    future (break 58: 64 calls' huge refused rows held under a silent broker)."""
    topic = create_topic(broker.bootstrap, unique_topic("handed"), partitions=1)
    config = {"bootstrap.servers": broker.bootstrap, "max.request.size": MAX_REQUEST}
    with KafkaProducer(config) as p:
        future = p.send_arrow(pa.table({"value": [b"ok", b"x" * MAX_REQUEST, b"ok"]}), topic, on_error="skip")
        refused = future.take_refused()
        assert [(r.error, r.rows.tolist()) for r in refused] == [("RecordTooLargeError", [1])]
        assert future.take_refused() == ()
        result = future.result(30)
        assert (result.records, result.refused) == (2, ())


def test_missing_topic_refused_on_a_strict_cluster(strict_kafka: KafkaCluster) -> None:
    """A topic column naming a topic the cluster does not have (and will not create)."""
    real = create_topic(strict_kafka.bootstrap, unique_topic("real"), partitions=1)
    missing = unique_topic("missing")
    rng = np.random.default_rng(5)
    topics = [missing if rng.random() < 0.3 else real for _ in range(300)]
    table = pa.table({"value": [b"v%d" % i for i in range(300)], "topic": topics})
    with KafkaProducer({"bootstrap.servers": strict_kafka.bootstrap}) as p:
        result = p.send_arrow(table, on_error="skip").result(60)
        # Known from then on: the next call refuses the topic's rows at once.
        again = p.send_arrow(table, on_error="skip").result(60)
        with pytest.raises(UnknownTopicError):
            p.send_arrow(table)
        # The missing topic given to the call (no topic column): every row refused.
        alone = p.send_arrow(table.drop_columns(["topic"]), missing, on_error="skip").result(60)
    ((error, rows),) = [(r.error, list(r.rows)) for r in alone.refused]
    assert (error, rows, alone.records) == ("UnknownTopicError", list(range(300)), 0)
    for r in (result, again):
        (refused,) = r.refused
        assert (refused.error, refused.topic) == ("UnknownTopicError", missing)
        assert list(refused.rows) == [i for i, t in enumerate(topics) if t == missing]
        assert r.records == topics.count(real)
    assert len(consume_all(strict_kafka.bootstrap, real, 2 * topics.count(real), to_end=True)) == 2 * topics.count(real)


def test_cluster_errors_are_never_refused_rows() -> None:
    """No broker at all: the call fails, whatever on_error says."""
    with KafkaProducer({"bootstrap.servers": "127.0.0.1:1", "max.block.ms": 500}) as p:
        with pytest.raises(BrokersUnreachableError):
            p.send_arrow(pa.table({"value": [b"a", b"b"]}), "any", on_error="skip")


def test_a_topic_the_principal_may_not_use_is_refused(acl_kafka: KafkaCluster) -> None:
    allowed = create_topic(acl_kafka.bootstrap, unique_topic("allowed"), partitions=1)
    denied = create_topic(acl_kafka.bootstrap, unique_topic("denied"), partitions=1)
    deny_topic(acl_kafka.bootstrap, denied, "ALL")
    topics = [denied if i % 4 == 1 else allowed for i in range(100)]
    table = pa.table({"value": [b"v%d" % i for i in range(100)], "topic": topics})
    with KafkaProducer({"bootstrap.servers": acl_kafka.bootstrap}) as p:
        result = p.send_arrow(table, on_error="skip").result(60)
    (refused,) = result.refused
    assert (refused.error, refused.topic) == ("TopicAuthorizationFailedError", denied)
    assert list(refused.rows) == [i for i in range(100) if i % 4 == 1]
    assert len(consume_all(acl_kafka.bootstrap, allowed, 75, to_end=True)) == 75


@pytest.mark.parametrize("seed", range(3))
def test_rows_a_format_cannot_encode_are_refused_with_their_fields(broker: KafkaCluster, schema_registry: str,
                                                                   seed: int) -> None:
    """A value serializer's refusals (a null the schema has no room for) and the screen's
    (a topic that cannot be) in one call: each row refused once for its first reason, its
    index that of the call's input, its columns as given; the rest arrive and decode. No
    subject is registered for the topic name Kafka refuses."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from spark_sink.producer import ArrowSerializer

    rng = random.Random(seed)
    topic = create_topic(broker.bootstrap, unique_topic("fmt-skip"), partitions=2)
    n = rng.choice([10, 300, 2000])
    weights = [rng.uniform(1, 3), rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0, 0.3)]
    drawn = rng.choices(["good", "null_name", "invalid_topic", "both"], weights, k=n)
    fields = [pa.field("id", pa.int64(), False), pa.field("name", pa.string(), False)]
    value = pa.StructArray.from_arrays(
        [pa.array(range(n), pa.int64()),
         pa.array([None if k in ("null_name", "both") else f"n{i}" for i, k in enumerate(drawn)])], fields=fields)
    topics = [INVALID if k in ("invalid_topic", "both") else topic for k in drawn]
    table = pa.table({"key": [b"%d" % i for i in range(n)], "value": value, "topic": topics})
    with KafkaProducer({"bootstrap.servers": broker.bootstrap}) as p:
        result = p.send_arrow(table, value_serializer=ArrowSerializer("avro", {"url": schema_registry}),
                              on_error="skip").result(60)
    # A row bad twice is refused for the first reason met: its topic's name, checked before
    # its value is encoded (which would name a subject after that topic).
    expected = {i: "InvalidTopicException" if k in ("invalid_topic", "both") else "FormatValueError"
                for i, k in enumerate(drawn) if k != "good"}
    refused = {int(row): r for r in result.refused for row in r.rows}
    assert {i: r.error for i, r in refused.items()} == expected
    for r in result.refused:
        assert r.data.column("key").to_pylist() == [b"%d" % i for i in r.rows]
        if r.error == "FormatValueError":
            assert "value.name" in r.message
            assert r.data.column("value").to_pylist() == [{"id": int(i), "name": None} for i in r.rows]
    good = [i for i, k in enumerate(drawn) if k == "good"]
    assert result.records == len(good)
    messages = consume_all(broker.bootstrap, topic, len(good), to_end=True) if good else []
    registry = SchemaRegistryClient({"url": schema_registry})
    deserializer = AvroDeserializer(registry)
    got = [deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)) for m in messages]
    assert sorted(v["id"] for v in got) == good
    assert not [s for s in registry.get_subjects() if s.startswith(INVALID)]


def test_subjects_are_named_after_the_topic_each_row_goes_to(broker: KafkaCluster, schema_registry: str) -> None:
    """send_arrow(table, topic) with a topic column: a row goes to its column's topic, the
    default where the column is null, and its subject is that topic's; a topic name Kafka
    refuses fails the call (without skip) before any subject is registered."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from spark_sink.producer import ArrowSerializer
    from spark_sink.protocol.error_codes import InvalidTopicException

    default, named = (create_topic(broker.bootstrap, unique_topic(t), partitions=1) for t in ("dflt", "named"))
    rng = random.Random(7)
    topics = [rng.choice([None, named]) for _ in range(50)]
    value = pa.StructArray.from_arrays([pa.array(range(50), pa.int64())], fields=[pa.field("id", pa.int64(), False)])
    serializer = ArrowSerializer("avro", {"url": schema_registry})
    with KafkaProducer({"bootstrap.servers": broker.bootstrap}) as p:
        p.send_arrow(pa.table({"value": value, "topic": pa.array(topics, pa.string())}), default,
                     value_serializer=serializer).result(60)
        with pytest.raises(InvalidTopicException, match="no spaces allowed!"):
            p.send_arrow(pa.table({"value": value, "topic": [INVALID] * 50}), default, value_serializer=serializer)
    registry = SchemaRegistryClient({"url": schema_registry})
    deserializer = AvroDeserializer(registry)
    for topic, ids in ((default, [i for i, t in enumerate(topics) if t is None]),
                       (named, [i for i, t in enumerate(topics) if t == named])):
        messages = consume_all(broker.bootstrap, topic, len(ids), to_end=True)
        got = [deserializer(m.value(), SerializationContext(topic, MessageField.VALUE)) for m in messages]
        assert sorted(v["id"] for v in got) == ids
        # the wire id names the subject of the row's own topic
        assert {int.from_bytes(m.value()[1:5], "big") for m in messages} == {
            registry.get_latest_version(f"{topic}-value").schema_id}
    assert not [s for s in registry.get_subjects() if s.startswith(INVALID)]


INVALID = "no spaces allowed!"


@pytest.mark.parametrize("seed", range(3))
def test_a_topic_the_principal_may_describe_but_not_write_is_refused(acl_kafka: KafkaCluster, seed: int) -> None:
    """WRITE denied, DESCRIBE allowed: the brokers' Produce would refuse the rows
    (TOPIC_AUTHORIZATION_FAILED), leaving a transaction abortable. The metadata's
    authorized operations tell kprod first: the rows are refused before any is queued,
    and the transaction of the good rows commits."""
    from tests.brokers import consumer

    allowed = create_topic(acl_kafka.bootstrap, unique_topic("w-allowed"), partitions=2)
    denied = create_topic(acl_kafka.bootstrap, unique_topic("w-denied"), partitions=2)
    deny_topic(acl_kafka.bootstrap, denied, "WRITE")
    rng = random.Random(seed)
    n = rng.choice([5, 200, 3000])
    share = rng.uniform(0.05, 0.9)
    topics = [denied if rng.random() < share else allowed for _ in range(n)]
    topics[rng.randrange(n)] = denied  # at least one
    table = pa.table({"value": [b"v%d" % i for i in range(n)], "topic": topics})
    config = {"bootstrap.servers": acl_kafka.bootstrap, "transactional.id": unique_topic("txn")}
    with KafkaProducer(config) as p:
        p.init_transactions(30)
        p.begin_transaction()
        result = p.send_arrow(table, on_error="skip").result(60)
        p.commit_transaction(30)
        # Without skipping, the call fails naming the topic before any row is queued.
        p.begin_transaction()
        with pytest.raises(TopicAuthorizationFailedError, match=denied):
            p.send_arrow(table)
        p.commit_transaction(30)
    bad = [i for i, t in enumerate(topics) if t == denied]
    (refused,) = result.refused
    assert (refused.error, refused.topic) == ("TopicAuthorizationFailedError", denied)
    assert list(refused.rows) == bad
    assert "not write" in refused.message
    got = consume_to_marks(acl_kafka.bootstrap, allowed, overrides={"isolation.level": "read_committed"})
    assert sorted(m.value() for m in got) == sorted(b"v%d" % i for i, t in enumerate(topics) if t == allowed)
    # An independent consumer (all operations allowed but WRITE) finds the topic empty.
    c = consumer(acl_kafka.bootstrap)
    try:
        low, high = c.get_watermark_offsets(TopicPartition(denied, 0), timeout=10)
        assert high == 0
    finally:
        c.close()
