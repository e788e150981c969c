"""A new user's try of the value formats, with only the README's "Value formats" section:
a streaming job of nested types through a registry that asks for basic authentication
(Apicurio 2.6 has none of its own: tests/registry/front.py checks the Authorization
header and forwards to the suite's real registry), a wrong password, and a schema
change: compatible with a given schema (a new version; both decode), incompatible (the
subject named, the pointer to kprod.value.avro.schema)."""

from __future__ import annotations

import decimal
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic
from tests.registry.front import Front

if TYPE_CHECKING:
    from confluent_kafka import Message
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from pyspark.sql import DataFrame, SparkSession

USER, PASSWORD = "svc-orders", "s3cret:with-colon"


@pytest.fixture
def front(schema_registry: str) -> Iterator[Front]:
    """The suite's registry behind basic authentication."""
    with Front(schema_registry, user_info=(USER, PASSWORD)) as front:
        yield front


def _client(url: str) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "basic.auth.user.info": f"{USER}:{PASSWORD}"})


def _decoded(url: str, messages: list[Message]) -> list[dict[str, Any]]:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(_client(url))
    return [deserializer(m.value(), SerializationContext(m.topic() or "", MessageField.VALUE)) for m in messages]


def _orders(df: DataFrame) -> DataFrame:
    """Orders as the README's snippet builds them, nested: a customer struct, an array of
    line structs with decimal prices, a map of tags, a timestamp."""
    n = F.col("id")
    return df.select(
        n.cast("string").alias("key"),
        F.struct(
            n.alias("order_id"),
            F.struct((n % 10).alias("id"), F.when(n % 3 == 0, F.lit(None)).otherwise(F.lit("NL")).alias("country"))
            .alias("customer"),
            F.array(F.struct(F.lit("pen").alias("sku"), (n % 4 + 1).cast("int").alias("qty"),
                             (n / 4).cast("decimal(10,2)").alias("price"))).alias("lines"),
            F.create_map(F.lit("channel"), F.when(n % 2 == 0, "web").otherwise("shop")).alias("tags"),
            F.timestamp_seconds(n + 1_700_000_000).alias("placed_at"),
        ).alias("value"))


def test_a_stream_of_nested_orders_through_a_registry_with_basic_auth(spark: SparkSession, kafka: KafkaCluster,
                                                                      front: Front, tmp_path: Path) -> None:
    """The topic comes from a column, so the tasks, not only the driver, ask the registry:
    the credentials travel to them too."""
    topics = [create_topic(kafka.bootstrap, unique_topic(f"orders-auth{i}"), partitions=2) for i in range(2)]
    spark.range(40, numPartitions=2).write.parquet(str(tmp_path / "in"))
    source = spark.readStream.schema("id LONG").option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
    rows = _orders(source).withColumn(
        "topic", F.element_at(F.array(*map(F.lit, topics)), (F.col("key").cast("long") % 2 + 1).cast("int")))
    query = (rows.writeStream.format("kprod").option("kafka.bootstrap.servers", kafka.bootstrap)
             .option("kprod.value.format", "avro").option("kprod.schema.registry.url", front.url)
             .option("kprod.schema.registry.basic.auth.user.info", f"{USER}:{PASSWORD}")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True).start())
    query.awaitTermination(300)
    assert query.exception() is None
    decoded = []
    for i, topic in enumerate(topics):
        decoded += [(i, v) for v in _decoded(front.url, consume_all(kafka.bootstrap, topic, 20, settle=0.3))]
    assert sorted(v["order_id"] for _, v in decoded) == list(range(40))
    for i, v in decoded:
        n = v["order_id"]
        assert n % 2 == i
        assert v["customer"] == {"id": n % 10, "country": None if n % 3 == 0 else "NL"}
        assert v["lines"] == [{"sku": "pen", "qty": n % 4 + 1, "price": decimal.Decimal(n / 4).quantize(
            decimal.Decimal("0.01"), decimal.ROUND_HALF_UP)}]
        assert v["tags"] == {"channel": "web" if n % 2 == 0 else "shop"}
        assert v["placed_at"].timestamp() == n + 1_700_000_000
    # With a topic column the driver only checks the column; the tasks registered the
    # subjects, through the front and its authentication.
    assert {p.rsplit("/subjects/", 1)[1].split("/")[0] for m, p in front.requests if m == "POST"} >= {
        f"{t}-value" for t in topics}


def test_a_wrong_password_fails_on_the_driver_naming_the_url_and_401(spark: SparkSession, kafka: KafkaCluster,
                                                                     front: Front) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("orders-badauth"), partitions=1)
    with pytest.raises(Exception) as failure:
        (_orders(spark.range(5)).write.format("kprod").mode("append")
         .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic)
         .option("kprod.value.format", "avro").option("kprod.schema.registry.url", front.url)
         .option("kprod.schema.registry.basic.auth.user.info", f"{USER}:wrong-password").save())
    message = str(failure.value)
    assert front.url in message and "401" in message and "basic.auth.user.info" in message, message[:3000]
    assert "wrong-password" not in message  # no secret in an error
    assert "Python worker" not in message and "Task" not in message, message[:3000]  # the driver's, no task's
    assert consume_all(kafka.bootstrap, topic, 0, timeout=10, to_end=True) == []  # nothing was sent


def test_a_given_schema_changes_compatibly_and_not(spark: SparkSession, kafka: KafkaCluster, front: Front) -> None:
    """v1 given; v2 adds a field with a default (BACKWARD): a new version, and records of
    both decode; v3 adds one without: refused on the driver, naming the subject and
    pointing to kprod.value.avro.schema."""
    topic = create_topic(kafka.bootstrap, unique_topic("orders-evolve"), partitions=1)
    v1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
            {"name": "id", "type": "long"}, {"name": "country", "type": ["null", "string"], "default": None}]}}]}
    v2 = {**v1, "fields": [*v1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
    v3 = {**v1, "fields": [*v1["fields"], {"name": "note", "type": "string"}]}

    def write(df: DataFrame, schema: dict[str, Any]) -> None:
        (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", kafka.bootstrap)
         .option("topic", topic).option("kprod.value.format", "avro").option("kprod.schema.registry.url", front.url)
         .option("kprod.schema.registry.basic.auth.user.info", f"{USER}:{PASSWORD}")
         .option("kprod.value.avro.schema", json.dumps(schema)).save())

    # F.col("id") % 10 would be nullable (a modulo by zero is null in Spark), and a nullable
    # column into the schema's "long" is refused on the driver, naming value.customer.id.
    customer = F.struct(F.col("id").alias("id"), F.lit("NL").alias("country")).alias("customer")
    write(spark.range(3).select(F.struct(F.col("id").alias("order_id"), customer).alias("value")), v1)
    write(spark.range(3, 6).select(F.struct(F.col("id").alias("order_id"), customer,
                                            F.lit("shop").alias("channel")).alias("value")), v2)
    client = _client(front.url)
    assert client.get_versions(f"{topic}-value") == [1, 2]
    values = sorted(_decoded(front.url, consume_all(kafka.bootstrap, topic, 6, settle=0.3)),
                    key=lambda v: v["order_id"])
    assert values == [{"order_id": n, "customer": {"id": n, "country": "NL"}} for n in range(3)] + [
        {"order_id": n, "customer": {"id": n, "country": "NL"}, "channel": "shop"} for n in range(3, 6)]
    with pytest.raises(Exception) as failure:
        write(spark.range(1).select(F.struct(F.col("id").alias("order_id"), customer,
                                             F.lit("x").alias("note")).alias("value")), v3)
    message = str(failure.value)
    assert f"{topic}-value" in message and "kprod.value.avro.schema" in message, message[:3000]
    assert "note" in message, message[:3000]  # the field, where the registry says
    assert len(consume_all(kafka.bootstrap, topic, 6, settle=0.3)) == 6  # nothing more was sent
