"""How a sink's cost grows with partitions: kprod, Spark's Kafka sink and a no-op sink.

    python bench/bench_partitions.py                        # 1 M rows, 8/64/512/2048 partitions, 16x64
    python bench/bench_partitions.py --rows 200000 --shapes 512 --rounds 4
    python bench/bench_partitions.py --quick                # what the suite runs: small and short

Each shape is one topic of N partitions, or ``TxP``: T topics of P partitions each,
chosen per row through a ``topic`` column. For every shape the same cached DataFrame
(10-byte keys, 100-byte values, ``local[2]``, 2 tasks) is written through each sink:

- ``kprod``: ``df.write.format("kprod")`` at the sink's defaults;
- ``kprod exactly-once`` (the shapes of --exactly-once, 512 by default): the same with
  ``kprod.deliveryGuarantee=exactly-once`` (one transaction per task);
- ``Spark's sink``: ``df.write.format("kafka")`` (spark-sql-kafka-0-10 of the running
  Spark, fetched by kprod_broker.spark_kafka_jars) at its own defaults;
- ``no-op``: a Python data source that takes Spark's Arrow batches and drops them, the
  floor of any Python sink.

Rounds alternate: every round writes once through each sink, the order rotating from
round to round (A B C, B C A, ...); the figures are medians over the rounds, the ratios
medians of per-round ratios. Each sink writes topics of its own at each shape,
--warm-writes times (2) untimed first, in passes over the sinks (A B C, A B C): a
broker's first writes to a new partition cost it far more than later ones (page faults on
each partition's index files, in system CPU; at 2,048 partitions the second write still
paid some, and so may a write after the topics rested: bench/RESULTS.md, issue 55 (4) and
(6)); every write says the broker's CPU and major faults (--fresh-topics: every write to
new topics, as bench_sink.py does). CPU is read from /proc: Spark's
side is the driver JVM with all its descendants (the Python workers), the broker's its
own process (a separate JVM, started for the run unless --bootstrap-servers is given; then
no broker figure). Every write is checked afterwards by its topics' end offsets:
exactly the rows written (at-least-once), at least that many (exactly-once, whose
offsets include commit markers).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shlex
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

JOBS = Path(__file__).resolve().parent.parent / "jobs"
sys.path.insert(0, str(JOBS))

import _common  # noqa: E402  (jobs/ on the path first)

NOOP, KPROD, EOS, SPARK = "no-op", "kprod", "kprod exactly-once", "Spark's sink"
NAN = math.nan
QUICK = ["--rows", "10000", "--shapes", "4,2x2", "--rounds", "1", "--exactly-once", "4", "--warm-writes", "1"]


@dataclass(frozen=True)
class Shape:
    """``topics`` topics of ``partitions`` partitions each (topics > 1: a ``topic`` column)."""

    topics: int
    partitions: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        count, sep, partitions = text.strip().partition("x")
        try:
            shape = cls(int(count), int(partitions)) if sep else cls(1, int(count))
        except ValueError:
            raise argparse.ArgumentTypeError(f"shape {text!r}: expected PARTITIONS or TOPICSxPARTITIONS") from None
        if shape.topics < 1 or shape.partitions < 1:
            raise argparse.ArgumentTypeError(f"shape {text!r}: counts must be at least 1")
        return shape

    def __str__(self) -> str:
        return str(self.partitions) if self.topics == 1 else f"{self.topics}x{self.partitions}"


@dataclass
class TopicSet:
    """The topics a sink writes at one shape, and how many whole writes they hold."""

    label: str
    prefix: str
    names: list[str]
    partitions: int
    writes: int = 0
    clean: bool = True  # no failed write in them: their end offsets are checked


@dataclass
class Figures:
    """Per round: rows/s, Spark-side CPU s and broker CPU s of one sink at one shape."""

    rates: list[float] = field(default_factory=list)
    spark_cpu: list[float] = field(default_factory=list)
    broker_cpu: list[float] = field(default_factory=list)


def build_parser() -> argparse.ArgumentParser:
    parser = _common.docstring_parser("bench_partitions.py", __doc__)
    _common.add_common_arguments(parser)
    parser.set_defaults(topic="kprod-parts", partitions=1)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per write (default: %(default)s)")
    parser.add_argument("--value-size", type=int, default=100, help="value bytes (default: %(default)s)")
    parser.add_argument("--key-size", type=int, default=10, help="key bytes, 0 for none (default: %(default)s)")
    parser.add_argument("--tasks", type=int, default=2, help="write tasks (default: %(default)s)")
    parser.add_argument("--shapes", default="8,64,512,2048,16x64",
                        help="comma-separated PARTITIONS or TOPICSxPARTITIONS (default: %(default)s)")
    parser.add_argument("--exactly-once", default="512", metavar="SHAPES",
                        help="shapes also written by kprod in exactly-once mode, '' for none (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per shape (default: %(default)s)")
    parser.add_argument("--skip-spark-kafka", action="store_true", help="leave out Spark's own Kafka sink")
    parser.add_argument("--warm-writes", type=int, default=2,
                        help="untimed writes into each sink's topics of a shape first (default: %(default)s)")
    parser.add_argument("--fresh-topics", action="store_true",
                        help="every write to new topics (default: each sink writes its own topics of a shape, "
                             "--warm-writes times untimed first)")
    parser.add_argument("--quick", action="store_true", help=f"a short run for the suite: {' '.join(QUICK)}")
    return parser


def _frame(spark, args: argparse.Namespace, shape: Shape):
    """The rows, cached; with several topics, a ``topic`` column naming ``<prefix>-<i>``
    (the prefix, a literal per write, is added later)."""
    from pyspark.sql import functions as F

    df = spark.range(args.rows, numPartitions=args.tasks)
    cols = [F.lpad(F.col("id").cast("string"), args.value_size, "v").cast("binary").alias("value")]
    if args.key_size:
        cols.insert(0, F.lpad((F.col("id") % 100_000).cast("string"), args.key_size, "k").cast("binary").alias("key"))
    if shape.topics > 1:
        cols.append((F.col("id") % shape.topics).cast("string").alias("topic_index"))
    return df.select(*cols).cache()


def _with_topic(df, prefix: str, topics: int):
    from pyspark.sql import functions as F

    if topics == 1:
        return df
    return df.select(*[c for c in df.columns if c != "topic_index"],
                     F.concat(F.lit(prefix + "-"), F.col("topic_index")).alias("topic"))


def _cpu(pid: int) -> float:
    """User plus system CPU seconds of a process and its reaped children."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _major_faults(pid: int) -> int:
    """Major page faults of a process so far (the broker's first writes into a partition
    fault its index files in: system CPU, not the records' handling)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[9])
    except OSError:
        return 0


def _own_cpu(pid: str) -> tuple[tuple[str, str], int, float] | None:
    """(pid, start time), parent and own user plus system CPU seconds of a process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (pid, fields[19]), int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class TreeCpu:
    """CPU seconds of ``root`` and every descendant while the block runs (Spark's JVM, its
    Python daemons and workers), sampled every ``interval`` s from a thread. Reading the
    tree only before and after lost a process that ended between (a task's Python worker
    reaped by no process of the tree), and a round's figure could come out negative: each
    process is counted up to its last sample instead, so one ending loses at most an
    interval, and one living less than that is missed (a spawned Python takes longer)."""

    def __init__(self, root: int, interval: float = 0.1) -> None:
        self.root, self.interval = str(root), interval
        self._first: dict[tuple[str, str], float] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._members: set[str] = {self.root}
        self._outside: set[str] = set()  # pids seen outside the tree: not read again
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)

    def _sample(self, first: bool = False) -> None:
        # A process stays in the tree or out of it (a parent never changes but to init), so
        # only the tree's processes and pids new since the last sample are read: a few
        # milliseconds of the benchmark's own CPU a second.
        pids = [p for p in os.listdir("/proc") if p.isdigit() and p not in self._outside]
        stats = {pid: found for pid in pids if (found := _own_cpu(pid)) is not None}
        new = {pid for pid in stats if pid not in self._members}
        while joined := {pid for pid in new if str(stats[pid][1]) in self._members}:
            self._members |= joined  # pids wrap: a child's may be below its parent's
            new -= joined
        self._outside |= new
        for pid in self._members & stats.keys():
            key, _ppid, cpu_s = stats[pid]
            if first:
                self._first[key] = cpu_s
            self._last[key] = cpu_s

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> TreeCpu:
        self._sample(first=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def seconds(self) -> float:
        return sum(cpu_s - self._first.get(key, 0.0) for key, cpu_s in self._last.items())


class _Sinks:
    """The sinks of one run and how each writes a frame to given topics."""

    def __init__(self, spark, args: argparse.Namespace, bootstrap: str) -> None:
        spark.dataSource.register(_common.noop_data_source("bench_parts_noop"))
        self.kprod_options = _common.producer_options(args, bootstrap)
        self.bootstrap = bootstrap
        self.labels = [NOOP, KPROD] + ([] if args.skip_spark_kafka else [SPARK])

    def write(self, label: str, df, topic: str | None) -> float:
        """Seconds to write ``df`` (to ``topic``, or by its topic column)."""
        if label == NOOP:
            fmt, options = "bench_parts_noop", {}
        elif label == SPARK:
            # Its defaults but delivery.timeout.ms: a write that fails (below) fails in 40 s, not 120.
            fmt, options = "kafka", {"kafka.bootstrap.servers": self.bootstrap, "kafka.delivery.timeout.ms": "40000"}
        else:
            fmt, options = "kprod", dict(self.kprod_options)
            if label == EOS:
                options["kprod.deliveryGuarantee"] = "exactly-once"
        if topic is not None and label != NOOP:
            options["topic"] = topic
        started = time.perf_counter()
        df.write.format(fmt).mode("append").options(**options).save()
        return time.perf_counter() - started


def run(args: argparse.Namespace, bootstrap: str) -> dict[Shape, dict[str, Figures]]:
    if not args.skip_spark_kafka and "PYSPARK_GATEWAY_PORT" not in os.environ:
        from kprod_broker import spark_kafka_jars

        # On the driver's class path only if given before its JVM starts.
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {','.join(str(j) for j in spark_kafka_jars())} pyspark-shell"
    spark = _common.spark_session(args, "kprod bench_partitions")
    sinks = _Sinks(spark, args, bootstrap)
    jvm = spark.sparkContext._gateway.proc.pid
    broker = getattr(args, "broker_pid", None)
    eos_shapes = {Shape.parse(s) for s in args.exactly_once.split(",") if s.strip()}
    topic_sets: list[TopicSet] = []  # every set of topics written, for the check at the end
    results: dict[Shape, dict[str, Figures]] = {}
    warmed: set[str] = set()
    failures = args.failures = []
    for shape in args.shapes:
        labels = sinks.labels + ([EOS] if shape in eos_shapes else [])
        df = _frame(spark, args, shape)
        assert df.count() == args.rows
        figures = results[shape] = {label: Figures() for label in labels}
        current: dict[str, TopicSet] = {}  # each sink's topics at this shape

        def write(label: str, timed: bool, shape: Shape = shape, current: dict[str, TopicSet] = current
                  ) -> tuple[float, float, float] | None:
            """One write; one that fails is said and done again, to new topics; None if that
            failed too. (Spark's sink has met NOT_LEADER_OR_FOLLOWER on a new topic's
            partitions until its batches expired: bench/RESULTS.md, 2026-11-28.)"""
            for _attempt in range(2):
                try:
                    return write_once(label, timed)
                except Exception as exc:  # Py4JJavaError: the job failed
                    failures.append(f"{shape} {label}: {_cause(exc)}")
                    _common.say(f"{shape} partitions: {label} failed, writing again to new topics: {failures[-1]}")
                    broken = current.pop(label, None)
                    if broken is not None:
                        broken.clean = False  # rows of the failed write may be there: not counted
            return None

        def write_once(label: str, timed: bool, shape: Shape = shape, df=df, current: dict[str, TopicSet] = current
                       ) -> tuple[float, float, float]:
            topics = current.get(label)
            if topics is None or args.fresh_topics:
                prefix = f"{args.topic}-{shape}-{uuid.uuid4().hex[:6]}"
                names = [prefix] if shape.topics == 1 else [f"{prefix}-{i}" for i in range(shape.topics)]
                topics = current[label] = TopicSet(label, prefix, names, shape.partitions)
                if label != NOOP:
                    _common.create_topics(bootstrap, names, shape.partitions)
                    topic_sets.append(topics)
            frame = _with_topic(df, topics.prefix, shape.topics)
            faults = _major_faults(broker) if broker else 0
            broker_before = _cpu(broker) if broker else 0.0
            with TreeCpu(jvm) as spark_cpu:
                seconds = sinks.write(label, frame, topics.prefix if shape.topics == 1 else None)
            broker_cpu = (_cpu(broker) if broker else 0.0) - broker_before
            topics.writes += 1
            if broker:
                _common.say(f"{shape} partitions, {'timed' if timed else 'untimed'} {label}: broker "
                            f"{broker_cpu:.2f} CPU s, {_major_faults(broker) - faults} major page faults")
            return seconds, spark_cpu.seconds, broker_cpu

        # Untimed: workers started and code paths compiled (once per sink), and unless
        # --fresh-topics, each sink's topics of this shape written --warm-writes times: a
        # broker's first writes to a new partition cost it far more than the next ones
        # (bench/RESULTS.md, issue 55 and 55 (4)), which would swamp what a sink costs it.
        # In passes over the sinks, as the rounds go: sink by sink, the second sink's topics
        # rested through the third's warm writes before its first timed one, and pages of
        # its index files dropped meanwhile were faulted back in on its count (issue 55 (6)).
        unwarmed = [label for label in labels if label not in warmed or not args.fresh_topics]
        for _ in range(1 if args.fresh_topics else max(1, args.warm_writes)):
            for label in unwarmed:
                write(label, timed=False)
        warmed.update(labels)
        for round_no in range(args.rounds):
            turn = round_no % len(labels)
            for label in labels[turn:] + labels[:turn]:
                done = write(label, timed=True)
                f = figures[label]
                if done is None:  # failed twice: no figure this round (NaN keeps the rounds aligned)
                    f.rates.append(NAN)
                    f.spark_cpu.append(NAN)
                    f.broker_cpu.append(NAN)
                    continue
                seconds, spark_cpu, broker_cpu = done
                f.rates.append(args.rows / seconds)
                f.spark_cpu.append(spark_cpu)
                f.broker_cpu.append(broker_cpu)
                _common.say(f"{shape} partitions, round {round_no + 1}: {label}: {args.rows / seconds:,.0f} rows/s, "
                            f"Spark side {spark_cpu:.2f} CPU s, broker {broker_cpu:.2f} CPU s")
        df.unpersist()
    checked = [t for t in topic_sets if t.clean]
    for t in checked:
        ends, expected = _common.end_offsets(bootstrap, t.names, t.partitions), args.rows * t.writes
        if ends < expected or (ends != expected and t.label != EOS):
            raise SystemExit(f"{t.label} wrote {ends} records to {t.names[0]}..., expected {expected}")
    _common.say(f"checked {sum(t.writes for t in checked)} writes by their topics' end offsets")
    return results


def _cause(exc: Exception) -> str:
    """The last line naming an error in a failed job's message (its root cause)."""
    lines = [line for line in str(exc).splitlines() if "Error" in line or "Exception" in line]
    return (lines[-1] if lines else str(exc).splitlines()[0]).strip()[:300]


def _median(values: list[float]) -> float:
    """The median of the rounds that have a figure (NaN if none)."""
    known = [v for v in values if not math.isnan(v)]
    return median(known) if known else NAN


def _per_m(seconds: list[float], rows: int) -> float:
    return _median(seconds) * 1e6 / rows


def _ratio(a: list[float], b: list[float]) -> float:
    """The median of per-round ratios a/b (rounds where both wrote)."""
    return _median([x / y if y else math.inf for x, y in zip(a, b)])


def report(args: argparse.Namespace, results: dict[Shape, dict[str, Figures]], broker: str, command: str) -> None:
    print(f"\npartitions benchmark: {command}")
    print(f"  broker {broker}; machine {platform.machine()}, {os.cpu_count()} cores "
          f"({_cpu_model()}), load average {os.getloadavg()[0]:.1f} at the end; "
          f"{args.rows} rows of {args.key_size}-byte keys and {args.value_size}-byte values, {args.tasks} tasks, "
          f"{args.rounds} alternating round(s), medians")
    for failure in getattr(args, "failures", []):
        print(f"  a write failed and was done again: {failure}")
    have_broker = getattr(args, "broker_pid", None) is not None
    print(f"  {'shape':>6} {'sink':<20} {'rows/s':>10} {'Spark CPU s/M':>14} {'broker CPU s/M':>15}")
    for shape, figures in results.items():
        for label, f in figures.items():
            broker_cpu = f"{_per_m(f.broker_cpu, args.rows):>15.2f}" if have_broker and label != NOOP else f"{'':>15}"
            rate = f"{_median(f.rates):>10,.0f}" if not math.isnan(_median(f.rates)) else f"{'failed':>10}"
            print(f"  {str(shape):>6} {label:<20} {rate} {_per_m(f.spark_cpu, args.rows):>14.2f}"
                  f" {broker_cpu}")
    print("\n  ratios (medians of per-round ratios):")
    print(f"  {'shape':>6} {'sink':<20} {'CPU/row vs no-op':>17} {'vs Spark':>9} {'broker vs Spark':>16}"
          f" {'rows/s vs Spark':>16}")
    for shape, figures in results.items():
        for label in (KPROD, EOS):
            if label not in figures:
                continue
            f, noop, spark = figures[label], figures[NOOP], figures.get(SPARK)
            line = f"  {str(shape):>6} {label:<20} {_ratio(f.spark_cpu, noop.spark_cpu):>16.2f}x"
            if spark is not None:
                broker_ratio = f"{_ratio(f.broker_cpu, spark.broker_cpu):>15.2f}x" if have_broker else f"{'':>16}"
                line += (f" {_ratio(f.spark_cpu, spark.spark_cpu):>8.2f}x {broker_ratio}"
                         f" {_ratio(f.rates, spark.rates):>15.2f}x")
            print(line)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args = parser.parse_args(QUICK + argv)
    try:
        args.shapes = [Shape.parse(s) for s in args.shapes.split(",") if s.strip()]
        for s in args.exactly_once.split(","):
            if s.strip():
                Shape.parse(s)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    if args.rows < args.tasks or args.rounds < 1:
        parser.error("--rows must be at least --tasks and --rounds at least 1")
    _common.setup_logging()
    import logging

    logging.getLogger("spark_sink.spark").setLevel(logging.WARNING)
    from kprod_broker import KAFKA_VERSION

    broker = args.bootstrap_servers or f"Apache Kafka {KAFKA_VERSION}, one local KRaft node"
    with _common.kafka_cluster(args) as bootstrap:
        results = run(args, bootstrap)
    report(args, results, broker, "python bench/bench_partitions.py " + shlex.join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
