"""Avro through a Schema Registry, end to end: kprod's sink beside what a PySpark user has.

    python bench/bench_avro.py                       # 1 M rows, 3 alternating rounds
    python bench/bench_avro.py --rows 200000 --rounds 5
    python bench/bench_avro.py --quick               # what the suite runs: small and short

The same cached DataFrame (10 fields: long, int, double, boolean, string, a nullable
string, decimal(10,2), timestamp, a nested struct and an array of ints; nulls in seven of
them) is written through each sink, each write to a new topic of --partitions partitions
on the same broker:

- ``kprod``: ``df.write.format("kprod")`` with ``kprod.value.format=avro``, the schema
  derived and registered on the driver, the rows encoded in kprod's compiled loops;
- ``Spark to_avro + Kafka sink``: ``to_avro`` of spark-avro and ``format("kafka")`` of
  spark-sql-kafka (the running Spark's, fetched once into ~/.cache/kprod): bare Avro,
  no registry, the nearest thing Spark has;
- ``confluent-kafka per row``: a Python data source whose tasks turn each Arrow batch into
  dicts and call confluent-kafka's ``AvroSerializer`` (registry client, cached schema id)
  and ``Producer.produce`` once per row, as a hand-written PySpark sink does;
- ``no-op``: a Python data source that takes the value column's Arrow batches and drops
  them: Spark's own share of kprod's cost (reading the cache, the column into Arrow, the
  batches to a Python worker), which no Python sink can go below.

Every sink writes once untimed (workers started, code compiled, the schema registered),
then each round writes once through every sink in a rotating order. Every timed write is
read back with confluent-kafka's consumer: each record counted, kprod's and confluent's
framed with a registry id (a sample decoded by confluent's AvroDeserializer), and the Avro
bodies of every write the same multiset as Spark's ``to_avro`` bytes. Prints the median
rows/s, the median CPU seconds per million rows of Spark's side (the driver JVM and its
Python workers, from /proc; each apart too) and the broker's, and kprod's ratios to the
others (medians of per-round ratios). Without --bootstrap-servers an Apache Kafka node is
started for the run, without --registry-url an Apicurio Registry.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time
import uuid
from pathlib import Path
from statistics import median

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "jobs"))
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402  (jobs/ on the path first)
from avro_to_kafka import registry  # noqa: E402
from bench_partitions import TreeCpu, _cpu, _cpu_model  # noqa: E402

KPROD, SPARK, CONFLUENT = "kprod", "Spark to_avro + Kafka sink", "confluent-kafka per row"
NOOP = "no-op (Spark's share)"
QUICK = ["--rows", "20000", "--rounds", "1", "--partitions", "2"]
MASK = (1 << 64) - 1


def build_parser() -> argparse.ArgumentParser:
    parser = _common.docstring_parser("bench_avro.py", __doc__)
    _common.add_common_arguments(parser)
    parser.set_defaults(topic="kprod-avro-bench", partitions=8)
    parser.add_argument("--registry-url", help="the Schema Registry (default: a local Apicurio Registry for the run)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per write (default: %(default)s)")
    parser.add_argument("--tasks", type=int, default=2, help="write tasks (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default: %(default)s)")
    parser.add_argument("--skip-spark-kafka", action="store_true", help="leave out to_avro + Spark's Kafka sink")
    parser.add_argument("--skip-confluent", action="store_true", help="leave out confluent-kafka per row")
    parser.add_argument("--quick", action="store_true", help=f"a short run for the suite: {' '.join(QUICK)}")
    return parser


def frame(spark, rows: int, tasks: int):
    """The rows, cached: 10 columns of mixed types, nulls in seven, all from the row's id."""
    from pyspark.sql import functions as F

    n = F.col("id")

    def null_every(k: int, value):
        return F.when(n % k == 0, F.lit(None)).otherwise(value)

    df = spark.range(rows, numPartitions=tasks).select(
        n.alias("id"),
        null_every(10, (n % 1000).cast("int")).alias("qty"),
        null_every(11, (n % 10007) * 0.37).alias("price"),
        (n % 2 == 0).alias("active"),
        F.concat(F.lit("customer-"), (n % 1000).cast("string")).alias("name"),
        null_every(5, F.concat(F.lit("note "), (n % 97).cast("string"), F.lit(" é"))).alias("note"),
        null_every(13, ((n % 100_000) / 100).cast("decimal(10,2)")).alias("amount"),
        null_every(17, F.timestamp_micros(n * 1_000_003 + 1_700_000_000_000_000)).alias("placed_at"),
        F.struct((n % 5000).cast("int").alias("id"), null_every(7, F.lit("NL")).alias("country")).alias("customer"),
        null_every(19, F.expr("slice(array(cast(id % 100 as int), cast(id % 101 as int), cast(id % 103 as int)), "
                              "1, cast(id % 4 as int))")).alias("scores"),
    )
    return df.cache()


def register_sinks(spark):
    """The confluent-kafka per-row data source and the no-op floor, registered with the session. The
    former is defined in a function: Spark's workers cannot import bench/, and a class of an
    imported module is pickled by reference (cloudpickle pickles this one by value)."""
    from dataclasses import dataclass

    from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

    @dataclass(frozen=True)
    class _Count(WriterCommitMessage):
        rows: int

    class _ConfluentAvroWriter(DataSourceArrowWriter):
        def __init__(self, options: dict[str, str]) -> None:
            self.options = options

        def write(self, iterator):
            from confluent_kafka import Producer
            from confluent_kafka.schema_registry import SchemaRegistryClient
            from confluent_kafka.schema_registry.avro import AvroSerializer
            from confluent_kafka.serialization import MessageField, SerializationContext

            topic = self.options["topic"]
            serializer = AvroSerializer(SchemaRegistryClient({"url": self.options["registry"]}),
                                        self.options["schema"])
            context = SerializationContext(topic, MessageField.VALUE)
            producer = Producer({
                "bootstrap.servers": self.options["bootstrap.servers"], "acks": "all", "enable.idempotence": True,
                "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
            errors: list = []
            delivered = [0]

            def on_delivery(err, msg):
                if err is not None:
                    errors.append(err)
                else:
                    delivered[0] += 1

            sent = 0
            for batch in iterator:
                for row in batch.to_pylist():
                    value = serializer(row, context)
                    while True:
                        try:
                            producer.produce(topic, value=value, on_delivery=on_delivery)
                            break
                        except BufferError:
                            producer.poll(0.01)
                    producer.poll(0)
                    sent += 1
            producer.flush()
            if errors or delivered[0] != sent:
                raise RuntimeError(f"confluent-kafka delivered {delivered[0]} of {sent}: {errors[:3]}")
            return _Count(sent)

    class ConfluentAvroDataSource(DataSource):
        """confluent-kafka's AvroSerializer and produce() once per row."""

        @classmethod
        def name(cls) -> str:
            return "bench_confluent_avro"

        def writer(self, schema, overwrite):
            return _ConfluentAvroWriter(dict(self.options))

    spark.dataSource.register(ConfluentAvroDataSource)
    spark.dataSource.register(_common.noop_data_source("bench_avro_noop"))


def read_back(bootstrap: str, topic: str, rows: int, framed: bool, url: str) -> int:
    """Every record of one write read and counted; returns an order-free digest of the Avro
    bodies (the frame stripped). Framed records must carry byte 0 and one schema id, and a
    sample must decode with confluent-kafka's AvroDeserializer."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-avro-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "check.crcs": True})
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": url})) if framed else None
    context = SerializationContext(topic, MessageField.VALUE)
    digest, count, frames, ids = 0, 0, set(), set()
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        deadline = time.monotonic() + 120
        while True:
            # Past the count, one more look: a writer that wrote too many rows must show it.
            timeout = 0.5 if count < rows else 1.0
            messages = consumer.consume(num_messages=100_000, timeout=timeout)
            for m in messages:
                if m.error():
                    raise SystemExit(f"reading back {topic}: {m.error()}")
                value = m.value()
                if framed:
                    frames.add(value[:5])
                    if count < 1000:
                        ids.add(deserializer(value, context)["id"])
                    value = value[5:]
                digest = (digest + hash(value)) & MASK
                count += 1
            if count > rows or count == rows and not messages or time.monotonic() > deadline:
                break
    finally:
        consumer.close()
    if count != rows:
        raise SystemExit(f"{topic}: read back {count} records, expected {rows}")
    if framed and (len(frames) != 1 or next(iter(frames))[:1] != b"\x00" or len(ids) != min(rows, 1000)):
        raise SystemExit(f"{topic}: frames {frames}, {len(ids)} distinct ids among the first 1000 decoded")
    return digest


def run(args: argparse.Namespace, bootstrap: str, url: str) -> tuple[dict[str, list[float]], dict[str, list]]:
    """rows/s of each sink per round, and (Spark-side, broker, Spark's JVM alone) CPU seconds
    per write."""
    from kprod_broker import spark_avro_jars, spark_kafka_jars

    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        jars = [*spark_avro_jars(), *([] if args.skip_spark_kafka else spark_kafka_jars())]
        # On the driver's class path only if given before its JVM starts.
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(str(j) for j in jars)} pyspark-shell"
    spark = _common.spark_session(args, "kprod bench_avro")
    register_sinks(spark)
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    from spark_sink.encoder.formats import avro_schema_for

    df = frame(spark, args.rows, args.tasks)
    assert df.count() == args.rows
    value = F.struct(*df.columns).alias("value")
    schema = json.dumps(avro_schema_for(df.limit(1).select(value).toArrow().schema.field("value").type))
    kprod_options = {**_common.producer_options(args, bootstrap), "kprod.value.format": "avro",
                     "kprod.schema.registry.url": url}

    def write(label: str, topic: str) -> float:
        started = time.perf_counter()
        if label == NOOP:
            df.select(value).write.format("bench_avro_noop").mode("append").save()
        elif label == KPROD:
            df.select(value).write.format("kprod").mode("append").options(**kprod_options, topic=topic).save()
        elif label == SPARK:
            (df.select(to_avro(value).alias("value")).write.format("kafka").mode("append")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())
        else:
            # Registered here first: two tasks' AvroSerializers registering a new subject at
            # once can meet Apicurio's 409 "already exists" (the suite's run, 2026-11-29),
            # which confluent-kafka does not retry (kprod's registry client looks it up). Untimed;
            # each task's serializer then gets the id with one call, as on any later write.
            from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

            SchemaRegistryClient({"url": url}).register_schema(f"{topic}-value", Schema(schema, "AVRO"))
            started = time.perf_counter()
            (df.write.format("bench_confluent_avro").mode("append")
             .options(**{"bootstrap.servers": bootstrap, "topic": topic, "registry": url, "schema": schema}).save())
        return time.perf_counter() - started

    labels = [NOOP, KPROD] + ([] if args.skip_spark_kafka else [SPARK]) + ([] if args.skip_confluent else [CONFLUENT])
    written: list[tuple[str, str]] = []

    def new_topic(label: str) -> str:
        if label == NOOP:
            return ""
        topic = f"{args.topic}-{uuid.uuid4().hex[:8]}"
        _common.create_topics(bootstrap, [topic], args.partitions)
        written.append((label, topic))
        return topic

    for label in labels:  # untimed: workers, imports, JIT, the schema registered
        write(label, new_topic(label))
    written.clear()
    jvm, broker = spark.sparkContext._gateway.proc.pid, getattr(args, "broker_pid", None)
    rates: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[tuple[float, ...]]] = {label: [] for label in labels}
    for round_no in range(args.rounds):
        turn = round_no % len(labels)
        for label in labels[turn:] + labels[:turn]:
            topic = new_topic(label)
            before = (_cpu(broker) if broker else 0.0, _cpu(jvm))
            with TreeCpu(jvm) as spark_cpu:
                seconds = write(label, topic)
            after = (_cpu(broker) if broker else 0.0, _cpu(jvm))
            rates[label].append(args.rows / seconds)
            cpu[label].append((spark_cpu.seconds, *(b - a for a, b in zip(before, after))))
            _common.say(f"round {round_no + 1}: {label}: {rates[label][-1]:,.0f} rows/s, "
                        f"Spark side {cpu[label][-1][0]:.2f} CPU s, broker {cpu[label][-1][1]:.2f} CPU s")
    df.unpersist()
    digests = {(label, topic): read_back(bootstrap, topic, args.rows, label != SPARK, url)
               for label, topic in written}
    if len(set(digests.values())) != 1:
        raise SystemExit(f"the writes' Avro bodies differ: {digests}")
    _common.say(f"read back {len(written)} timed writes: every record counted, the same Avro bodies in each")
    spark.stop()  # before the broker: Spark's cached Kafka producers would try it until the process ends
    return rates, cpu


def report(args: argparse.Namespace, rates: dict[str, list[float]], cpu: dict[str, list], broker: str,
           command: str) -> None:
    have_broker = getattr(args, "broker_pid", None) is not None
    per_m = {label: [tuple(v * 1e6 / args.rows for v in c) for c in cpu[label]] for label in cpu}
    print(f"\nAvro benchmark: {command}")
    print(f"  broker {broker}; registry {args.registry_name}; machine {platform.machine()}, {os.cpu_count()} cores "
          f"({_cpu_model()}), load average {args.load_before:.1f} before, {os.getloadavg()[0]:.1f} at the end; "
          f"{args.rows} rows of 10 fields, {args.tasks} tasks, {args.partitions} partitions, "
          f"{args.rounds} alternating round(s), medians")
    print(f"  {'sink':<28} {'rows/s':>10} {'Spark CPU s/M':>14} {'(JVM':>6} {'workers)':>9} {'broker CPU s/M':>15}")
    for label in rates:
        broker_cpu = f"{median(c[1] for c in per_m[label]):>15.2f}" if have_broker and label != NOOP else ""
        spark_cpu, jvm_cpu = (median(c[i] for c in per_m[label]) for i in (0, 2))
        print(f"  {label:<28} {median(rates[label]):>10,.0f} {spark_cpu:>14.2f} {jvm_cpu:>6.2f}"
              f" {spark_cpu - jvm_cpu:>9.2f} {broker_cpu}")
    own = median(k[0] - n[0] for k, n in zip(per_m[KPROD], per_m[NOOP]))
    print(f"  kprod's own Spark-side CPU (kprod less no-op, per round): {own:.2f} s/M")
    print("\n  kprod's ratios (medians of per-round ratios):")
    for peer in rates:
        if peer in (KPROD, NOOP):
            continue
        speed = median(k / p for k, p in zip(rates[KPROD], rates[peer]))
        cost = median(p[0] / k[0] if k[0] else math.inf for k, p in zip(cpu[KPROD], cpu[peer]))
        print(f"  kprod vs {peer:<28} rows/s {speed:>6.2f}x   Spark-side CPU per row, the peer's over kprod's "
              f"{cost:>6.2f}x")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args = parser.parse_args(QUICK + argv)
    if args.rows < args.tasks or args.rounds < 1:
        parser.error("--rows must be at least --tasks and --rounds at least 1")
    _common.setup_logging()
    import logging

    logging.getLogger("spark_sink.spark").setLevel(logging.WARNING)
    from kprod_broker import APICURIO_VERSION, KAFKA_VERSION

    args.load_before = os.getloadavg()[0]
    broker = args.bootstrap_servers or f"Apache Kafka {KAFKA_VERSION}, one local KRaft node"
    args.registry_name = args.registry_url or f"Apicurio Registry {APICURIO_VERSION}, local"
    with _common.kafka_cluster(args) as bootstrap, registry(args) as url:
        rates, cpu = run(args, bootstrap, url)
    report(args, rates, cpu, broker, "python bench/bench_avro.py " + shlex.join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
