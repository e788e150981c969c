"""Sink benchmark: the same cached DataFrame written through each sink in one run.

    python jobs/bench_sink.py --rows 1000000
    spark-submit jobs/bench_sink.py --bootstrap-servers broker:9092 --rows 5000000 --tasks 4

1. kprod: ``df.write.format("kprod")`` (Arrow batches into record batches, columnar);
2. Spark's own Kafka sink, ``df.write.format("kafka")`` (spark-sql-kafka-0-10 of the
   running Spark, fetched with PySpark's Ivy), twice: at its own defaults (what a user gets), and
   with kprod's producer settings (batch.size, linger.ms, acks, enable.idempotence,
   compression.type);
3. confluent-kafka called once per row inside an Arrow writer, with a delivery callback,
   flushed at the end of each task (what a hand-written PySpark Kafka sink does);
4. a no-op Arrow writer that only counts rows: what Spark itself costs to hand the rows
   to Python, the ceiling for any Python sink;
5. for reference, no Spark: one kprod producer in this process sends the same rows (as
   Arrow, in the sink's calls of 100,000 rows) and flushes: what the broker takes from
   a producer that has nothing else to do. A sink cannot beat its broker.

After one untimed write through each sink, every round writes the frame once through
each sink, in a rotating order, each write to a topic of its own. Before any figure is
printed every timed write is read back: each row exactly once. Prints each sink's median
and best rows/s, the median CPU seconds per million rows of Spark's JVM, its Python
workers and the broker, and the ratios of kprod to the others round by round with their
median (each ratio taken within one round). Without
--bootstrap-servers an Apache Kafka node is started for the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from dataclasses import dataclass
from statistics import median

import _common
from _common import say
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

from spark_sink.spark.options import parse_options
from spark_sink.spark.writer import SEND_ROWS  # rows per send_arrow call in a kprod task

PRODUCER_ALONE = "kprod producer alone"
SPARK_DEFAULTS = "Spark's Kafka sink, its defaults"
SPARK_SAME = "Spark's Kafka sink, kprod's settings"
EXACTLY_ONCE = "kprod exactly-once"
TOLERANCE_ALL = "kprod errors.tolerance=all"
# The producer settings a user compares: kprod's effective values go to Spark's sink.
COMPARED_SETTINGS = ("batch.size", "linger.ms", "acks", "enable.idempotence", "compression.type")


@dataclass(frozen=True)
class _Count(WriterCommitMessage):
    rows: int


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
    parser = _common.docstring_parser("bench_sink.py", __doc__)
    _common.add_common_arguments(parser)
    parser.set_defaults(topic="kprod-bench")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows written by each sink (default: %(default)s)")
    parser.add_argument("--value-size", type=int, default=100, help="value bytes (default: %(default)s)")
    parser.add_argument("--key-size", type=int, default=10, help="key bytes, 0 for no key (default: %(default)s)")
    parser.add_argument("--tasks", type=int, default=2, help="write tasks (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds; each writes once through every sink, in a rotating order; medians "
                             "reported (default: %(default)s)")
    parser.add_argument("--skip-confluent", action="store_true", help="leave out the confluent-kafka sink")
    parser.add_argument("--skip-spark-kafka", action="store_true", help="leave out Spark's own Kafka sink")
    parser.add_argument("--skip-exactly-once", action="store_true", help="leave out kprod in exactly-once mode")
    parser.add_argument("--tolerance-all", action="store_true",
                        help="add kprod with kprod.errors.tolerance=all and a dead-letter topic (no row is bad: "
                             "the cost of looking)")
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


def _time_producer_alone(table, producer_config: dict[str, str], topic: str, warm_topic: str) -> float:
    """Seconds for one producer, without Spark, to send ``table`` and have it acknowledged."""
    from spark_sink.producer import KafkaProducer

    with KafkaProducer(producer_config) as producer:
        producer.send_arrow(table.slice(0, 1), warm_topic).result()  # connected, encoder loaded
        producer.partitions_for(topic)  # the topic's metadata too
        started = time.perf_counter()
        futures = [producer.send_arrow(table.slice(i, SEND_ROWS), topic)
                   for i in range(0, table.num_rows, SEND_ROWS)]
        producer.flush()
        for future in futures:
            future.result()  # raises if any row was not delivered
        return time.perf_counter() - started


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process and its waited-for children (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _python_workers(jvm_pid: int) -> list[int]:
    """Spark's Python worker processes: the JVM's descendants running Python."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(jvm_pid, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


class CpuMeter:
    """CPU seconds of Spark's JVM, its Python workers and the broker over one write."""

    def __init__(self, jvm_pid: int, broker_pid: int | None) -> None:
        self.jvm_pid, self.broker_pid = jvm_pid, broker_pid

    def sample(self) -> tuple[float, float, float]:
        workers = sum(_cpu_seconds(p) for p in _python_workers(self.jvm_pid))
        return (_cpu_seconds(self.jvm_pid), workers,
                _cpu_seconds(self.broker_pid) if self.broker_pid else 0.0)


def _compression(kprod_options: dict[str, str]) -> str:
    """kprod's compression.type, which the confluent-kafka writer gets too (same name in
    librdkafka; each codec at its library's default level)."""
    return kprod_options.get("kafka.compression.type", "none").strip().lower()


def _read_back(bootstrap: str, topic: str, rows: int) -> None:
    """Every row of one write is in ``topic`` exactly once, or the run fails."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "check.crcs": True})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        seen: set[bytes] = set()
        count, deadline = 0, time.monotonic() + 120
        while count < rows and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=100_000, timeout=0.5):
                if m.error():
                    raise SystemExit(f"reading back {topic}: {m.error()}")
                seen.add(m.value())
                count += 1
        # A little longer: a writer that wrote too many rows must show it.
        for m in consumer.consume(num_messages=100_000, timeout=1.0):
            if not m.error():
                seen.add(m.value())
                count += 1
    finally:
        consumer.close()
    if count != rows or len(seen) != rows:
        raise SystemExit(f"{topic}: read back {count} records, {len(seen)} distinct, expected {rows} once each")


def run(args: argparse.Namespace, bootstrap: str) -> tuple[dict[str, list[float]], dict[str, list[tuple]], str]:
    """rows/s of each sink and CPU per write, one figure per round, and the compression used."""
    if not args.skip_spark_kafka:
        from kprod_broker import spark_kafka_jars

        # On the driver's class path only if given before its JVM starts (as spark-submit's
        # --jars would); under spark-submit, pass them with --jars yourself.
        jars = ",".join(str(j) for j in spark_kafka_jars())
        if "PYSPARK_GATEWAY_PORT" not in os.environ:
            os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {jars} pyspark-shell"
    spark = _common.spark_session(args, "kprod bench_sink")
    spark.dataSource.register(_common.noop_data_source("bench_noop"))
    spark.dataSource.register(ConfluentDataSource)
    kprod_options = {**_common.producer_options(args, bootstrap), "topic": args.topic}
    compression = _compression(kprod_options)
    alone_config = parse_options(kprod_options).producer_config  # the sink's producer settings

    # Cached once, so every sink reads the same rows from memory.
    df = _frame(spark, args.rows, args.tasks, args.key_size, args.value_size).cache()
    assert df.count() == args.rows
    table = df.toArrow()
    written: list[tuple[str, str]] = []  # (sink, topic) of each timed write

    def new_topic(label: str) -> str:
        if label == "no-op":
            return ""
        topic = f"{args.topic}-{len(written)}-{uuid.uuid4().hex[:4]}"
        _common.create_topic(bootstrap, topic, args.partitions)  # with its leaders and logs
        written.append((label, topic))
        return topic

    def kafka_sink(fmt: str, options: dict[str, str]):
        return lambda topic: _time_write(df, fmt, {**options, "topic": topic})

    sinks = {"no-op": lambda topic: _time_write(df, "bench_noop", {})}
    sinks["kprod"] = kafka_sink("kprod", kprod_options)
    if not args.skip_exactly_once:
        sinks[EXACTLY_ONCE] = kafka_sink("kprod", {**kprod_options, "kprod.deliveryGuarantee": "exactly-once"})
    if args.tolerance_all:
        dead_topic = f"{args.topic}-dlq-{uuid.uuid4().hex[:4]}"
        _common.create_topic(bootstrap, dead_topic, 1)
        sinks[TOLERANCE_ALL] = kafka_sink("kprod", {**kprod_options, "kprod.errors.tolerance": "all",
                                                    "kprod.errors.deadLetterTopic": dead_topic})
    if not args.skip_spark_kafka:
        spark_options = {"kafka.bootstrap.servers": bootstrap}
        sinks[SPARK_DEFAULTS] = kafka_sink("kafka", spark_options)
        same = {f"kafka.{k}": alone_config[k] if k in alone_config else _kprod_default(k) for k in COMPARED_SETTINGS}
        sinks[SPARK_SAME] = kafka_sink("kafka", {**spark_options, **same})
    if not args.skip_confluent:
        sinks["confluent-kafka per row"] = kafka_sink(
            "bench_confluent", {"bootstrap.servers": bootstrap, "compression.type": compression})
    sinks[PRODUCER_ALONE] = lambda topic: _time_producer_alone(table, alone_config, topic, args.topic)
    # One untimed write of the whole frame per sink: Python workers started, modules
    # imported, and the JVM's code paths compiled (the first full write of even the no-op
    # sink runs at half speed).
    for label, timed_write in sinks.items():
        timed_write(new_topic(label))
    written.clear()

    # Rounds, each sink once per round in a rotating order: the sinks share the machine
    # and the broker (whose cost grows as it fills), so no sink always goes first.
    meter = CpuMeter(spark.sparkContext._gateway.proc.pid, getattr(args, "broker_pid", None))
    labels = list(sinks)
    rates: dict[str, list[float]] = {label: [] for label in labels}
    cpu: dict[str, list[tuple]] = {label: [] for label in labels}
    for round_no in range(args.repeat):
        for label in labels[round_no % len(labels):] + labels[:round_no % len(labels)]:
            topic = new_topic(label)
            before = meter.sample()
            seconds = sinks[label](topic)
            cpu[label].append(tuple(b - a for a, b in zip(before, meter.sample())))
            rates[label].append(args.rows / seconds)
            say(f"round {round_no + 1}: {label}: {args.rows} rows in {seconds:.2f} s = {rates[label][-1]:,.0f} rows/s")
    df.unpersist()
    for _label, topic in written:
        _read_back(bootstrap, topic, args.rows)
    say(f"read back {len(written)} timed writes: every row exactly once")
    return rates, cpu, compression


def _kprod_default(key: str) -> str:
    """kprod's own default of a producer setting (for the settings kprod's sink leaves alone)."""
    from spark_sink.producer import ProducerConfig

    value = getattr(ProducerConfig.from_dict({"bootstrap.servers": "x:1"}), key.replace(".", "_"))
    if key == "compression.type":
        return "none" if not value else str(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _common.setup_logging()
    import logging

    logging.getLogger("spark_sink.spark").setLevel(logging.WARNING)
    if not args.bootstrap_servers:
        args.topic = f"{args.topic}-{uuid.uuid4().hex[:6]}"
    with _common.kafka_cluster(args) as bootstrap:
        rates, cpu, compression = run(args, bootstrap)
    broker = args.bootstrap_servers or "a local Apache Kafka node"
    print(f"\nsink benchmark on {broker}: {args.rows} rows, {args.key_size}-byte keys, {args.value_size}-byte values, "
          f"{args.tasks} tasks, {args.partitions} partitions, kprod's compression {compression}, "
          f"{args.repeat} round(s), medians")
    print(f"  {'':<40} {'rows/s':>12} {'best':>12}   CPU s per million rows: {'JVM':>5} {'workers':>8} {'broker':>7}")
    for label, per_round in rates.items():
        jvm, workers, broker_cpu = (median(c[i] for c in cpu[label]) * 1e6 / args.rows for i in range(3))
        print(f"  {label:<40} {median(per_round):>12,.0f} {max(per_round):>12,.0f}   {'':>24}"
              f"{jvm:>5.2f} {workers:>8.2f} {broker_cpu:>7.2f}")
    ours = ("kprod", EXACTLY_ONCE, TOLERANCE_ALL)
    pairs = [("kprod", peer) for peer in rates if peer not in ours]
    pairs += [(sink, "kprod") for sink in ours[1:] if sink in rates]
    for sink, peer in pairs:
        per_round = [k / p for k, p in zip(rates[sink], rates[peer])]
        rounds = " ".join(f"{r:.2f}" for r in per_round)
        print(f"  {sink + ' / ' + peer:<48} median {median(per_round):>5.2f}x   per round {rounds}")
    if TOLERANCE_ALL in rates:
        # Where cores are shared, CPU per row tells more than rows/s: the Python workers' CPU.
        per_round = [t[1] / k[1] for t, k in zip(cpu[TOLERANCE_ALL], cpu["kprod"])]
        rounds = " ".join(f"{r:.2f}" for r in per_round)
        print(f"  {'workers CPU: ' + TOLERANCE_ALL + ' / kprod':<48} median {median(per_round):>5.2f}x   "
              f"per round {rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
