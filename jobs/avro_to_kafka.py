"""Streaming job: orders with nested fields written to Kafka as Avro through a Schema
Registry (the Confluent wire format), then read back with confluent-kafka's
AvroDeserializer, which fetches the schema by id from the registry.

    python jobs/avro_to_kafka.py --duration 15
    spark-submit jobs/avro_to_kafka.py --bootstrap-servers broker:9092 --topic orders \\
        --registry-url https://registry:8081 --registry-user-info svc:secret --checkpoint /data/cp/orders

Without --bootstrap-servers it starts a local Apache Kafka node, and without
--registry-url a local Schema Registry (Apicurio Registry, fetched once from Maven
Central into ~/.cache/kprod), each for the job's life. The value is a struct of the
order (a nested customer, an array of line items with decimal prices, a map of tags, a
timestamp), the key the order id as a string; the schema is derived from the DataFrame
as Spark's to_avro derives it, or given with --schema-file.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator

import _common
from _common import say


def build_parser() -> argparse.ArgumentParser:
    parser = _common.docstring_parser("avro_to_kafka.py", __doc__)
    _common.add_common_arguments(parser)
    parser.set_defaults(topic="orders")
    parser.add_argument("--registry-url", help="the Schema Registry (default: a local one for the run)")
    parser.add_argument("--registry-user-info", help="user:password for the registry's basic authentication")
    parser.add_argument("--schema-file", help="the value's Avro schema (JSON); default: derived from the DataFrame")
    parser.add_argument("--rows-per-second", type=int, default=2000, help="orders per second (default: %(default)s)")
    parser.add_argument("--duration", type=float, default=15, help="seconds to run (default: %(default)s)")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: a new temporary directory)")
    parser.add_argument("--no-read-back", action="store_true", help="skip reading the topic back")
    return parser


@contextlib.contextmanager
def registry(args: argparse.Namespace) -> Iterator[str]:
    """The registry's URL: --registry-url, or a local Apicurio Registry for the job's life."""
    if args.registry_url:
        yield args.registry_url
        return
    from kprod_broker import APICURIO_VERSION, start_local_registry

    say(f"no --registry-url given: starting Apicurio Registry {APICURIO_VERSION} on loopback")
    local = start_local_registry()
    say(f"Schema Registry at {local.url} (compatibility BACKWARD)")
    try:
        yield local.url
    finally:
        local.stop()


def orders(spark, rows_per_second: int):
    """The rate source as orders: nested fields of every kind the formats carry."""
    from pyspark.sql import functions as F

    rate = spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).option("numPartitions", 2).load()
    n = F.col("value")
    return rate.select(
        n.cast("string").alias("key"),
        F.struct(
            n.alias("order_id"),
            F.struct((n % 1000).alias("id"), F.concat(F.lit("customer-"), (n % 1000).cast("string")).alias("name"),
                     F.when(n % 7 == 0, F.lit(None)).otherwise(F.lit("NL")).alias("country")).alias("customer"),
            F.array(F.struct(F.lit("pen").alias("sku"), (n % 5 + 1).cast("int").alias("qty"),
                             F.lit(1.25).cast("decimal(10,2)").alias("price")),
                    F.struct(F.lit("ink").alias("sku"), F.lit(1).alias("qty"),
                             (n % 100 / 10).cast("decimal(10,2)").alias("price"))).alias("lines"),
            F.create_map(F.lit("channel"), F.when(n % 2 == 0, "web").otherwise("shop")).alias("tags"),
            F.col("timestamp").alias("placed_at"),
        ).alias("value"))


def read_back(bootstrap: str, topic: str, url: str, user_info: str | None, expected: int) -> int:
    """Records read and decoded by confluent-kafka's AvroDeserializer (schema by id)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    conf = {"url": url, **({"basic.auth.user.info": user_info} if user_info else {})}
    deserializer = AvroDeserializer(SchemaRegistryClient(conf))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kprod-avro-job", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        decoded, first, deadline = 0, None, time.monotonic() + 60
        while decoded < expected and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=10000, timeout=0.5):
                order = deserializer(m.value(), SerializationContext(topic, MessageField.VALUE))
                first = first or order
                decoded += 1
        say(f"first order as decoded: {first}")
        return decoded
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _common.setup_logging()
    spark = _common.spark_session(args, "kprod-avro-to-kafka")
    with _common.kafka_cluster(args) as bootstrap, registry(args) as url:
        writer = orders(spark, args.rows_per_second).writeStream.format("kprod")
        for key, value in _common.producer_options(args, bootstrap).items():
            writer = writer.option(key, value)
        writer = (writer.option("topic", args.topic).option("kprod.value.format", "avro")
                  .option("kprod.schema.registry.url", url)
                  .option("checkpointLocation", args.checkpoint or tempfile.mkdtemp(prefix="kprod-avro-cp-")))
        if args.registry_user_info:
            writer = writer.option("kprod.schema.registry.basic.auth.user.info", args.registry_user_info)
        if args.schema_file:
            with open(args.schema_file) as f:
                writer = writer.option("kprod.value.avro.schema", f.read())
        query = writer.start()
        say(f"streaming orders as Avro into {args.topic} for {args.duration:.0f} s (longer until a microbatch "
            "had rows, 5 minutes at most)")
        started = time.monotonic()
        written = 0
        while query.isActive and time.monotonic() - started < 300:
            query.awaitTermination(1)
            written = sum(p["numInputRows"] for p in query.recentProgress)
            if written and time.monotonic() - started >= args.duration:
                break
        query.stop()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
        say(f"{written:,} orders written")
        if not args.no_read_back and written:
            decoded = read_back(bootstrap, args.topic, url, args.registry_user_info, written)
            say(f"{decoded:,} records read back and decoded with confluent-kafka's AvroDeserializer")
            if decoded < written:
                return 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
