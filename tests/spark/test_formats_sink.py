"""The sink's value and key formats against a real Schema Registry (Apicurio, started by
the suite): rows of every supported type land in Kafka in the Confluent wire format and
decode exactly with confluent-kafka's own deserializers, which fetch the schema by id
from the registry; schemas evolve as the registry allows; every error is raised on the
driver before anything is sent, naming what is wrong."""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import json
import math
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, consume_to_marks, create_topic, unique_topic
from tests.spark.test_formats_spark import _row, _spark_types

if TYPE_CHECKING:
    from confluent_kafka import Message
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql import DataFrame, DataFrameWriter, SparkSession
    from pyspark.sql.streaming import DataStreamWriter
    from pyspark.sql.types import DataType

# A batch or a streaming writer: option() gives back the same kind.
Writer = TypeVar("Writer", "DataFrameWriter", "DataStreamWriter")
# For one format: the frame (struct columns key and value), the rows Spark collects of it
# by key id (key and value as _plain gives them), and the directory of its Parquet files.
TypedRows = tuple["DataFrame", dict[int, tuple[Any, Any]], Path]


def _registry_client(url: str) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url})


def _decode(url: str, fmt: str, messages: list[Message], field: str = "value") -> list[Any]:
    """Each record's key or value decoded by confluent-kafka's deserializer for ``fmt``."""
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = _registry_client(url)
    if fmt == "avro":
        deserializer = AvroDeserializer(client)
    else:  # numbers as Decimal: a decimal(38, 6)'s text exactly, a double's shortest text
        deserializer = JSONDeserializer(None, schema_registry_client=client,
                                        json_decode=lambda text: json.loads(text, parse_float=decimal.Decimal))
    where = MessageField.VALUE if field == "value" else MessageField.KEY
    out: list[Any] = []
    for m in messages:
        data = m.value() if field == "value" else m.key()
        topic = m.topic()
        assert topic is not None  # None only on an error event, which consume_all never returns
        out.append(None if data is None else deserializer(data, SerializationContext(topic, where)))
    return out


def _latest_id(client: SchemaRegistryClient, subject: str) -> int:
    """The id of ``subject``'s latest schema."""
    schema_id = client.get_latest_version(subject).schema_id
    assert schema_id is not None, subject
    return schema_id


def _plain(value: Any) -> Any:
    """A Spark row's value, or a decoded one, in one form: dicts, lists, bytes, naive UTC
    datetimes (Spark collects timestamps naive, in its session's zone: UTC in the suite),
    NaN by name (NaN != NaN)."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"  # NaN != NaN: compared by name
    return value


def _options(writer: Writer, bootstrap: str, topic: str | None, url: str, **options: str) -> Writer:
    writer = writer.option("kafka.bootstrap.servers", bootstrap).option("kprod.schema.registry.url", url)
    if topic is not None:
        writer = writer.option("topic", topic)
    for key, value in options.items():
        writer = writer.option(key.replace("_", "."), value)
    return writer


def _json_decoded(value: Any, spark_type: DataType) -> Any:
    """A JSONDeserializer's value (numbers as Decimal, every number's text exact) in the
    form Spark collects the column of ``spark_type``: the inverse of the JSON mapping."""
    from pyspark.sql import types as T

    if value is None:
        return None
    if isinstance(spark_type, T.StructType):
        assert set(value) == set(spark_type.names), (sorted(value), spark_type.names)  # every field, no other
        return {f.name: _json_decoded(value[f.name], f.dataType) for f in spark_type.fields}
    if isinstance(spark_type, T.ArrayType):
        return [_json_decoded(v, spark_type.elementType) for v in value]
    if isinstance(spark_type, T.MapType):
        return {k: _json_decoded(v, spark_type.valueType) for k, v in value.items()}
    if isinstance(spark_type, T.FloatType):
        return float(np.float32(value))  # the shortest text that reads back as the same float32
    if isinstance(spark_type, T.DoubleType):
        return float(value)
    if isinstance(spark_type, T.DecimalType):
        return decimal.Decimal(value)
    if isinstance(spark_type, T.BinaryType):
        return base64.b64decode(value, validate=True)
    if isinstance(spark_type, T.DateType):
        return datetime.date.fromisoformat(value)
    if isinstance(spark_type, T.TimestampType):
        assert value.endswith("Z"), value
        return datetime.datetime.fromisoformat(value).astimezone(datetime.UTC).replace(tzinfo=None)
    if isinstance(spark_type, T.TimestampNTZType):
        return datetime.datetime.fromisoformat(value)
    return value


def _finite(row: tuple) -> tuple:
    """The row with its float and double finite: JSON has no NaN nor infinities (kprod
    refuses them: tests/encoder/test_formats.py)."""
    return tuple(v if i not in (5, 6) or v is None or math.isfinite(v) else -1.5 for i, v in enumerate(row))


@pytest.fixture(scope="module")
def typed_rows(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], TypedRows]:
    """300 rows of every supported type (nulls, nested values, decimals, timestamps, maps,
    binary), NaN and infinities left out for JSON: for a format, a frame of a struct
    ``key`` (an id and every type) and a struct ``value`` (every type), the rows as Spark
    collects them, and the same frame in 2 Parquet files for a stream to read. Made on a
    format's first use: the suite's cases use each format once."""
    schema = _spark_types()

    @functools.cache
    def make(fmt: str) -> TypedRows:
        rng = random.Random(1129)
        rows = [_row(rng, 0.0), _row(rng, 1.0)] + [_row(rng, 0.2) for _ in range(298)]
        if fmt == "json":
            rows = [_finite(r) for r in rows]
        df = spark.createDataFrame(rows, schema).withColumn("n", F.monotonically_increasing_id())
        framed = df.select(F.struct(F.col("n").alias("id"), *schema.names).alias("key"),
                           F.struct(*schema.names).alias("value"))
        expected = {r["key"]["id"]: (_plain(r["key"]), _plain(r["value"])) for r in framed.collect()}
        files = tmp_path_factory.mktemp(f"typed-{fmt}")
        framed.repartition(2).write.mode("overwrite").parquet(str(files / "in"))
        return framed, expected, files

    return make


# Each format and each kind of write once in the suite; the other two pairs in make soak
# (the streaming writer hands the encoder the same Arrow batches as the batch writer;
# JSON in a stream and Avro in a batch have cases of their own below).
@pytest.mark.parametrize(("fmt", "mode"), [
    ("avro", "stream"), ("json", "batch"),
    *(pytest.param(fmt, mode, marks=pytest.mark.soak) for fmt, mode in (("avro", "batch"), ("json", "stream")))])
def test_keys_and_values_of_every_type_decode_with_confluents_deserializers(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str, typed_rows: Callable[[str], TypedRows],
        fmt: str, mode: str) -> None:
    """Every record's key and value, written by a batch or a streaming write, decoded by
    confluent-kafka's AvroDeserializer or JSONDeserializer (the schema fetched by id from
    the registry; JSON validated against it) back to the row Spark collects."""
    framed, expected, files = typed_rows(fmt)
    topic = create_topic(kafka.bootstrap, unique_topic(f"{fmt}-{mode}"), partitions=3)
    options = {"kprod.value.format": fmt, "kprod.key.format": fmt}
    if mode == "batch":
        _options(framed.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
                 **options).save()
    else:
        stream = spark.readStream.schema(framed.schema).option("maxFilesPerTrigger", 1).parquet(str(files / "in"))
        query = _options(stream.writeStream.format("kprod"), kafka.bootstrap, topic, schema_registry, **options,
                         checkpointLocation=str(files / f"chk-{uuid.uuid4().hex}")).trigger(availableNow=True).start()
        query.awaitTermination(300)
        assert query.exception() is None
        assert len([p for p in query.recentProgress if p["numInputRows"]]) == 2  # one microbatch per file
    messages = consume_all(kafka.bootstrap, topic, len(expected), to_end=True)
    assert len(messages) == len(expected)
    client = _registry_client(schema_registry)
    # The wire format: the magic byte, then the id of the subject's one version.
    assert {m.value()[:5] for m in messages} == {b"\x00" + _latest_id(client, f"{topic}-value").to_bytes(4, "big")}
    assert {m.key()[:5] for m in messages} == {b"\x00" + _latest_id(client, f"{topic}-key").to_bytes(4, "big")}
    keys, values = _decode(schema_registry, fmt, messages, "key"), _decode(schema_registry, fmt, messages)
    if fmt == "json":
        key_type, value_type = (framed.schema[c].dataType for c in ("key", "value"))
        keys = [_json_decoded(k, key_type) for k in keys]
        values = [_json_decoded(v, value_type) for v in values]
    got = {k["id"]: (_plain(k), _plain(v)) for k, v in zip(keys, values)}
    assert got.keys() == expected.keys()
    for n, (key, value) in expected.items():
        assert got[n] == (key, value), n
    for subject in (f"{topic}-key", f"{topic}-value"):
        latest = client.get_latest_version(subject)
        assert (latest.version, latest.schema.schema_type) == (1, fmt.upper()), subject


def test_the_bodies_are_what_spark_from_avro_reads(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str) -> None:
    from pyspark.sql.avro.functions import from_avro

    topic = create_topic(kafka.bootstrap, unique_topic("avro-spark"), partitions=2)
    df = spark.range(50).select(F.struct(F.col("id"), (F.col("id") * 1.5).alias("x"),
                                         F.col("id").cast("string").alias("s")).alias("value"))
    _options(df.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
             **{"kprod.value.format": "avro"}).save()
    schema = _registry_client(schema_registry).get_latest_version(f"{topic}-value").schema.schema_str
    assert schema is not None
    read = (spark.read.format("kafka").option("kafka.bootstrap.servers", kafka.bootstrap).option("subscribe", topic)
            .load().select(from_avro(F.expr("substring(value, 6)"), schema).alias("v")).select("v.*"))
    assert sorted(tuple(r) for r in read.collect()) == [(i, i * 1.5, str(i)) for i in range(50)]


def test_json_schema_values_in_a_stream(spark: SparkSession, kafka: KafkaCluster, schema_registry: str,
                                      tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("json"), partitions=2)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(2):
        (source / f"{f}.json").write_text("".join(
            json.dumps({"id": f * 10 + i, "name": f"n{i}", "price": f"{i}.25"}) + "\n" for i in range(10)))
    rows = (spark.readStream.schema("id LONG, name STRING, price STRING").option("maxFilesPerTrigger", 1)
            .json(str(source))
            .select(F.col("id").cast("string").alias("key"),
                    F.struct("id", "name", F.col("price").cast("decimal(6,2)").alias("price"),
                             F.array(F.col("id"), F.lit(None).cast("long")).alias("ids")).alias("value")))
    query = (_options(rows.writeStream.format("kprod"), kafka.bootstrap, topic, schema_registry,
                      **{"kprod.value.format": "json", "checkpointLocation": str(tmp_path / "chk")})
             .trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    messages = consume_all(kafka.bootstrap, topic, 20, to_end=True)
    values = _decode(schema_registry, "json", messages)
    assert sorted((v["id"], v["name"], decimal.Decimal(str(v["price"])), v["ids"]) for v in values) == sorted(
        (n, f"n{n % 10}", decimal.Decimal(f"{n % 10}.25"), [n, None]) for n in range(20))
    assert {m.key().decode() for m in messages} == {str(n) for n in range(20)}


def test_a_topic_column_gets_one_schema_id_per_subject(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str) -> None:
    topics = [create_topic(kafka.bootstrap, unique_topic(f"avro-t{i}"), partitions=1) for i in range(3)]
    df = spark.range(90).select(F.element_at(F.array(*map(F.lit, topics)), (F.col("id") % 3 + 1).cast("int"))
                                .alias("topic"), F.struct("id").alias("value"))
    _options(df.write.format("kprod").mode("append"), kafka.bootstrap, None, schema_registry,
             **{"kprod.value.format": "avro"}).save()
    client = _registry_client(schema_registry)
    ids = {client.get_latest_version(f"{t}-value").schema_id for t in topics}
    for i, t in enumerate(topics):
        messages = consume_all(kafka.bootstrap, t, 30, to_end=True)
        assert sorted(v["id"] for v in _decode(schema_registry, "avro", messages)) == list(range(i, 90, 3))
        assert {int.from_bytes(m.value()[1:5], "big") for m in messages} == \
            {client.get_latest_version(f"{t}-value").schema_id}
    assert len(ids) >= 1


def test_a_given_schema_evolves_as_the_registry_allows(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("avro-evolve"), partitions=1)
    v1 = {"type": "record", "name": "Order", "namespace": "shop",
          "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "qty", "type": "int", "default": 1}]}
    df1 = spark.range(3).select(F.struct("id", F.lit("pen").alias("item")).alias("value"))
    df2 = spark.range(3, 6).select(F.struct("id", F.lit("ink").alias("item"), F.lit(5).alias("qty")).alias("value"))
    for df, schema in ((df1, v1), (df2, v2)):
        _options(df.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
                 **{"kprod.value.format": "avro", "kprod.value.avro.schema": json.dumps(schema)}).save()
    client = _registry_client(schema_registry)
    assert client.get_versions(f"{topic}-value") == [1, 2]
    values = _decode(schema_registry, "avro", consume_all(kafka.bootstrap, topic, 6, to_end=True))
    assert sorted(values, key=lambda v: v["id"]) == [
        {"id": 0, "item": "pen"}, {"id": 1, "item": "pen"}, {"id": 2, "item": "pen"},
        {"id": 3, "item": "ink", "qty": 5}, {"id": 4, "item": "ink", "qty": 5}, {"id": 5, "item": "ink", "qty": 5}]
    # An incompatible change (BACKWARD: a new field without a default) fails on the driver.
    v3 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": "string"}]}
    df3 = spark.range(1).select(F.struct("id", F.lit("x").alias("item"), F.lit("n").alias("note")).alias("value"))
    with pytest.raises(Exception, match=rf"(?s){topic}-value.*") as failure:
        _options(df3.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
                 **{"kprod.value.format": "avro", "kprod.value.avro.schema": json.dumps(v3)}).save()
    assert "ncompatible" in str(failure.value)
    assert len(consume_all(kafka.bootstrap, topic, 6, to_end=True)) == 6  # nothing more was sent


def test_a_derived_schema_change_is_refused_pointing_at_a_given_schema(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("avro-derived"), partitions=1)
    base = spark.range(2).select(F.struct("id").alias("value"))
    _options(base.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
             **{"kprod.value.format": "avro"}).save()
    wider = spark.range(2).select(F.struct("id", F.col("id").cast("string").alias("name")).alias("value"))
    with pytest.raises(Exception, match="kprod.value.avro.schema") as failure:
        _options(wider.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
                 **{"kprod.value.format": "avro"}).save()
    assert f"{topic}-value" in str(failure.value)


@pytest.mark.parametrize("case", ["unreachable", "column", "nullable", "not a struct", "no url", "bad format"])
def test_errors_on_the_driver_name_what_is_wrong(spark: SparkSession, kafka: KafkaCluster, schema_registry: str,
                                               case: str) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("avro-err"), partitions=1)
    given: dict[str, Any] = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"},
                                                       {"name": "name", "type": "string"}]}
    df = spark.range(3).select(F.struct("id", F.col("id").cast("string").alias("name")).alias("value"))
    options = {"kprod.value.format": "avro"}
    url: str | None = schema_registry
    expected = ""
    if case == "unreachable":
        url, expected = "http://127.0.0.1:9", "127.0.0.1:9"
    elif case == "column":
        given["fields"][1]["type"] = "int"
        options["kprod.value.avro.schema"], expected = json.dumps(given), "value.name"
    elif case == "nullable":  # a nullable column into a field with no null
        options["kprod.value.avro.schema"], expected = json.dumps(given), "value.name"
        df = spark.range(3).select(F.struct("id", F.when(F.col("id") > 0, "x").alias("name")).alias("value"))
    elif case == "not a struct":
        df, expected = spark.range(3).select(F.col("id").cast("string").alias("value")), "struct"
    elif case == "no url":
        url, expected = None, "kprod.schema.registry.url"
    elif case == "bad format":
        options["kprod.value.format"], expected = "protobuf", "kprod.value.format"
    writer = df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka.bootstrap) \
        .option("topic", topic)
    if url is not None:
        writer = writer.option("kprod.schema.registry.url", url).option("kprod.schema.registry.timeout.ms", "3000")
    for key, value in options.items():
        writer = writer.option(key, value)
    with pytest.raises(Exception) as failure:
        writer.save()
    assert expected in str(failure.value), str(failure.value)[:3000]
    assert consume_all(kafka.bootstrap, topic, 0, timeout=10, to_end=True) == []  # nothing was sent


def test_send_arrow_refuses_a_null_the_schema_has_no_room_for(kafka: KafkaCluster, schema_registry: str) -> None:
    """The producer's own path (Spark refuses such a row itself, before kprod sees it): a
    null in a field declared non-nullable fails the call naming the column and the row,
    before any row is queued."""
    import pyarrow as pa

    from spark_sink.encoder.formats import FormatValueError
    from spark_sink.producer import ArrowSerializer, KafkaProducer

    topic = create_topic(kafka.bootstrap, unique_topic("avro-null"), partitions=1)
    fields = [pa.field("id", pa.int64(), False), pa.field("name", pa.string(), False)]
    value = pa.StructArray.from_arrays(
        [pa.array(range(10), pa.int64()), pa.array([None if i == 7 else "x" for i in range(10)])], fields=fields)
    serializer = ArrowSerializer("avro", {"url": schema_registry})
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as producer:
        with pytest.raises(FormatValueError, match="value.name") as failure:
            producer.send_arrow(pa.table({"value": value}), topic, value_serializer=serializer)
        assert "7" in str(failure.value)
        good = pa.StructArray.from_arrays([pa.array(range(3), pa.int64()), pa.array(["a", "b", "c"])],
                                          fields=fields)
        producer.send_arrow(pa.table({"value": good}), topic, value_serializer=serializer).result(30)
    values = _decode(schema_registry, "avro", consume_all(kafka.bootstrap, topic, 3, to_end=True))
    assert values == [{"id": 0, "name": "a"}, {"id": 1, "name": "b"}, {"id": 2, "name": "c"}]


def test_exactly_once_writes_keep_their_guarantee_with_a_format(
        spark: SparkSession, kafka: KafkaCluster, schema_registry: str) -> None:
    from tests.spark.readback import assert_nothing_left_open

    topic = create_topic(kafka.bootstrap, unique_topic("avro-eos"), partitions=2)
    df = spark.range(1000, numPartitions=3).select(F.struct("id").alias("value"))
    _options(df.write.format("kprod").mode("append"), kafka.bootstrap, topic, schema_registry,
             **{"kprod.value.format": "avro", "kprod.deliveryGuarantee": "exactly-once"}).save()
    messages = consume_to_marks(kafka.bootstrap, topic, overrides={"isolation.level": "read_committed"})
    assert sorted(v["id"] for v in _decode(schema_registry, "avro", messages)) == list(range(1000))
    assert_nothing_left_open(kafka.bootstrap, topic, 2)
