"""Sink benchmark: the same cached DataFrame written three ways in one run.

    python jobs/bench_sink.py --rows 1000000
    spark-submit jobs/bench_sink.py --bootstrap-servers broker:9092 --rows 5000000 --tasks 4

1. kprod: ``df.write.format("kprod")`` (Arrow batches into record batches, columnar);
2. confluent-kafka called once per row inside an Arrow writer, with a delivery callback,
   flushed at the end of each task (what a hand-written PySpark Kafka sink does);
3. a no-op Arrow writer that only counts rows: what Spark itself costs to hand the rows
   to Python, the ceiling for any Python sink;
4. for reference, no Spark: one kprod producer in this process sends the same rows (as
   Arrow, in the sink's calls of 100,000 rows) and flushes: what the broker takes from
   a producer that has nothing else to do. A sink cannot beat its broker.

After one untimed write through each sink, every round writes the frame once through
each sink, in a rotating order. Prints each sink's best rows/s, the ratios of kprod to the
others, and the spread of those ratios within rounds. Both Kafka writers use acks=all with
idempotence and kprod's compression.type (with ``--producer-prop compression.type=lz4``
the confluent-kafka writer compresses too). Without --bootstrap-servers the embedded
local broker is started for the run.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

import _common
from _common import say
from spark_sink.spark.options import parse_options
from spark_sink.spark.writer import SEND_ROWS  # rows per send_arrow call in a kprod task

PRODUCER_ALONE = "kprod producer alone"


@dataclass(frozen=True)
class _Count(WriterCommitMessage):
    rows: int


class _NoopWriter(DataSourceArrowWriter):
    def write(self, iterator):
        return _Count(sum(batch.num_rows for batch in iterator))


class NoopDataSource(DataSource):
    """Takes Spark's Arrow batches and drops them."""

    @classmethod
    def name(cls) -> str:
        return "bench_noop"

    def writer(self, schema, overwrite):
        return _NoopWriter()


class _ConfluentWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator):
        from confluent_kafka import Producer

        topic = self.options["topic"]
        producer = Producer({
            "bootstrap.servers": self.options["bootstrap.servers"], "acks": "all",
            "enable.idempotence": True, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000,
            "partitioner": "murmur2_random",  # keys where Java (and kprod) put them
            "compression.type": self.options["compression.type"],
        })
        delivered = [0]
        errors: list = []

        def on_delivery(err, msg):
            if err is not None:
                errors.append(err)
            else:
                delivered[0] += 1

        sent = 0
        for batch in iterator:
            keys = batch.column("key").to_pylist() if "key" in batch.schema.names else [None] * batch.num_rows
            for key, value in zip(keys, batch.column("value").to_pylist()):
                while True:
                    try:
                        producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.01)
                producer.poll(0)
                sent += 1
        producer.flush()
        if errors or delivered[0] != sent:
            raise RuntimeError(f"confluent-kafka delivered {delivered[0]} of {sent}: {errors[:3]}")
        return _Count(sent)


class ConfluentDataSource(DataSource):
    """confluent-kafka's produce() once per row, as a hand-written Python sink would."""

    @classmethod
    def name(cls) -> str:
        return "bench_confluent"

    def writer(self, schema, overwrite):
        return _ConfluentWriter(dict(self.options))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench_sink.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    _common.add_common_arguments(parser)
    parser.set_defaults(topic="kprod-bench")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows written by each sink (default: %(default)s)")
    parser.add_argument("--value-size", type=int, default=100, help="value bytes (default: %(default)s)")
    parser.add_argument("--key-size", type=int, default=10, help="key bytes, 0 for no key (default: %(default)s)")
    parser.add_argument("--tasks", type=int, default=2, help="write tasks (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each writes once through every sink, in a rotating order; best kept (default: %(default)s)")
    parser.add_argument("--skip-confluent", action="store_true", help="leave out the confluent-kafka sink")
    return parser


def _frame(spark, rows: int, tasks: int, key_size: int, value_size: int):
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=tasks)
    cols = [F.lpad(F.col("id").cast("string"), value_size, "v").cast("binary").alias("value")]
    if key_size:
        cols.insert(0, F.lpad((F.col("id") % 100_000).cast("string"), key_size, "k").cast("binary").alias("key"))
    return df.select(*cols)


def _time_write(df, fmt: str, options: dict[str, str]) -> float:
    started = time.perf_counter()
    df.write.format(fmt).mode("append").options(**options).save()
    return time.perf_counter() - started


def _time_producer_alone(table, producer_config: dict[str, str], topic: str) -> float:
    """Seconds for one producer, without Spark, to send ``table`` and have it acknowledged."""
    from spark_sink.producer import KafkaProducer

    with KafkaProducer(producer_config) as producer:
        producer.send_arrow(table.slice(0, 1), topic).result()  # connected, topic known, encoder loaded
        started = time.perf_counter()
        futures = [producer.send_arrow(table.slice(i, SEND_ROWS), topic)
                   for i in range(0, table.num_rows, SEND_ROWS)]
        producer.flush()
        for future in futures:
            future.result()  # raises if any row was not delivered
        return time.perf_counter() - started


def _compression(kprod_options: dict[str, str]) -> str:
    """kprod's compression.type, which the confluent-kafka writer gets too (same name in
    librdkafka; each codec at its library's default level)."""
    return kprod_options.get("kafka.compression.type", "none").strip().lower()


def run(args: argparse.Namespace, bootstrap: str) -> tuple[dict[str, list[float]], str]:
    """rows/s of each sink, one figure per round, and the compression both Kafka writers used."""
    spark = _common.spark_session(args, "kprod bench_sink")
    spark.dataSource.register(NoopDataSource)
    spark.dataSource.register(ConfluentDataSource)
    kprod_options = {**_common.producer_options(args, bootstrap), "topic": args.topic}
    compression = _compression(kprod_options)
    confluent_topic, alone_topic = f"{args.topic}-confluent", f"{args.topic}-producer"
    for topic in ([] if args.skip_confluent else [confluent_topic]) + [alone_topic]:
        _common.create_topic(bootstrap, topic, args.partitions)

    # Cached once, so every sink reads the same rows from memory.
    df = _frame(spark, args.rows, args.tasks, args.key_size, args.value_size).cache()
    assert df.count() == args.rows
    table = df.toArrow()
    alone_config = parse_options(kprod_options).producer_config  # the sink's producer settings
    sinks = {"no-op": lambda: _time_write(df, "bench_noop", {})}
    sinks["kprod"] = lambda: _time_write(df, "kprod", kprod_options)
    if not args.skip_confluent:
        confluent_options = {"bootstrap.servers": bootstrap, "topic": confluent_topic, "compression.type": compression}
        sinks["confluent-kafka per row"] = lambda: _time_write(df, "bench_confluent", confluent_options)
    sinks[PRODUCER_ALONE] = lambda: _time_producer_alone(table, alone_config, alone_topic)
    # One untimed write of the whole frame per sink: Python workers started, modules
    # imported, and the JVM's code paths compiled (the first full write of even the no-op
    # sink runs at half speed).
    for timed_write in sinks.values():
        timed_write()

    # Rounds, each sink once per round in a rotating order: the sinks share the machine
    # and the broker (whose cost grows as it fills), so no sink always goes first.
    labels = list(sinks)
    rates: dict[str, list[float]] = {label: [] for label in labels}
    for round_no in range(args.repeat):
        for label in labels[round_no % len(labels):] + labels[:round_no % len(labels)]:
            seconds = sinks[label]()
            rates[label].append(args.rows / seconds)
            say(f"round {round_no + 1}: {label}: {args.rows} rows in {seconds:.2f} s = {rates[label][-1]:,.0f} rows/s")
    df.unpersist()
    return rates, compression


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _common.setup_logging()
    import logging

    logging.getLogger("spark_sink.spark").setLevel(logging.WARNING)
    if not args.bootstrap_servers:
        args.topic = f"{args.topic}-{uuid.uuid4().hex[:6]}"
    with _common.kafka_cluster(args) as bootstrap:
        rates, compression = run(args, bootstrap)
    print(f"\nsink benchmark: {args.rows} rows, {args.key_size}-byte keys, {args.value_size}-byte values, "
          f"{args.tasks} tasks, acks=all, idempotence on, compression {compression}, best of {args.repeat} round(s)")
    for label, per_round in rates.items():
        print(f"  {label:<24} {max(per_round):>12,.0f} rows/s")
    for peer in [label for label in rates if label != "kprod"]:
        per_round = [k / p for k, p in zip(rates["kprod"], rates[peer])]
        spread = f"   (per round {min(per_round):.2f}-{max(per_round):.2f})" if len(per_round) > 1 else ""
        print(f"  {'kprod / ' + peer:<32} {max(rates['kprod']) / max(rates[peer]):>6.2f}x{spread}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
