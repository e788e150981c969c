"""The quick-start demo (``make demo``): stream into Kafka through kprod, read it back.

    python jobs/demo.py [--duration 20] [--rows-per-second 50000]

Starts a local Apache Kafka node (its jars are fetched once into ~/.cache/kprod), runs
jobs/stream_to_kafka.py's query for about 20 seconds, then reads the topic back with an
independent client (confluent-kafka) and prints, per partition, the records the delivery
report says were committed next to the records read, and the throughput of both: kprod's
steady rate (every microbatch after the first) beside the first microbatch's, which
includes starting Spark's Python workers. Exits non-zero if they differ.
"""

from __future__ import annotations

import os
import sys
import time

import _common
import stream_to_kafka
from _common import say


def read_back(bootstrap: str, topic: str, expected: int, timeout: float = 120.0) -> tuple[dict[int, int], float]:
    """Records per partition read from the beginning, and the seconds it took."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kprod-demo-reader",
                         "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 50})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        counts = dict.fromkeys(partitions, 0)
        total, started = 0, time.monotonic()
        last_record = started
        while time.monotonic() - started < timeout:
            messages = consumer.consume(num_messages=10000, timeout=0.2)
            for m in messages:
                if m.error():
                    raise KafkaException(m.error())
                counts[m.partition()] += 1
            total += len(messages)
            if messages:
                last_record = time.monotonic()
            # Done when everything arrived and a second passed with nothing more (duplicates would show).
            elif total >= expected and time.monotonic() - last_record > 1.0:
                break
        return counts, last_record - started
    finally:
        consumer.close()


def kprod_rates(batches: list[tuple[int, float]]) -> list[str]:
    """kprod's rate while its tasks ran: the steady state (every microbatch after the first
    that had records) and, apart, that first one, whose tasks also start Spark's Python
    workers and load kprod."""
    written = [(records, seconds) for records, seconds in batches if records and seconds > 0]
    lines = []
    if len(written) > 1:
        records, seconds = sum(r for r, _ in written[1:]), sum(s for _, s in written[1:])
        lines.append(f"  kprod, steady state:     {records / seconds:,.0f} records/s while its tasks ran "
                     f"({len(written) - 1} microbatches: {records:,} records in {seconds:.1f} s of task time; "
                     "the rest is Spark waiting for the next trigger)")
    if written:
        records, seconds = written[0]
        lines.append(f"  kprod, first microbatch: {records / seconds:,.0f} records/s ({records:,} records in "
                     f"{seconds:.1f} s, including starting Spark's Python workers, once per executor)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = _common.docstring_parser("demo.py", __doc__)
    parser.add_argument("--duration", type=float, default=20,
                        help="seconds of streaming, longer until a microbatch had rows (default: %(default)s)")
    parser.add_argument("--rows-per-second", type=int, default=50000, help="rate source speed (default: %(default)s)")
    parser.add_argument("--partitions", type=int, default=6, help="topic partitions (default: %(default)s)")
    demo = parser.parse_args(argv)
    args = stream_to_kafka.build_parser().parse_args([
        "--topic", "kprod-demo", "--partitions", str(demo.partitions), "--duration", str(demo.duration),
        "--rows-per-second", str(demo.rows_per_second),
        # Loopback TCP to Spark's Python workers, not conf/spark-defaults.conf's Unix domain
        # sockets: over those, PySpark 4.2 closing its idle workers at spark.stop() makes
        # each that sees the close before its daemon's SIGHUP print a BrokenPipeError
        # traceback (pyspark/daemon.py, spark.python.daemon.killWorkerOnFlushFailure). The
        # demo measures throughput, which the sockets' latency gain hardly moves.
        "--conf", "spark.python.unix.domain.socket.enabled=false"])
    _common.setup_logging()
    os.environ.setdefault("KPROD_SPARK_LOG_LEVEL", "ERROR")

    with _common.kafka_cluster(args) as bootstrap:
        say(f"streaming for {demo.duration:.0f} s from Spark's rate source ({demo.rows_per_second} rows/s, "
            "100-byte values, keys 0-999) through kprod")
        # A run that ends before any row (a slow machine still starting Spark's Python
        # workers) would show no rate: it goes on until a microbatch had rows.
        stats = stream_to_kafka.run(args, bootstrap, until_rows=True)
        say(f"reading topic {args.topic} back with confluent-kafka")
        read, read_seconds = read_back(bootstrap, args.topic, stats.records)

    written = {p: c for (_, p), c in stats.per_partition.items()}
    total_read = sum(read.values())
    print(f"\nkprod demo: topic {args.topic}, {stats.microbatches} microbatches committed")
    print(f"  {'partition':>9} {'written':>10} {'read':>10}")
    for p in sorted(set(written) | set(read)):
        print(f"  {p:>9} {written.get(p, 0):>10,} {read.get(p, 0):>10,}")
    print(f"  {'total':>9} {stats.records:>10,} {total_read:>10,}")
    print(f"  written: {stats.records:,} records in {stats.seconds:.1f} s = {stats.records_per_s:,.0f} records/s "
          f"(Spark start-up included; the rate source offers {demo.rows_per_second:,}/s)")
    for line in kprod_rates(stats.batches):
        print(line)
    print(f"  read:    {total_read:,} records in {read_seconds:.1f} s = "
          f"{total_read / max(read_seconds, 1e-9):,.0f} records/s")
    print(f"  delivery report: {stats.report}")
    if total_read == stats.records and read == {p: written.get(p, 0) for p in read}:
        print("  every committed record was read back, once")
        return 0
    if total_read > stats.records:
        print("  more records read than committed: a microbatch cut short when the query stopped had "
              "already delivered part of its records (at-least-once); a restart from the checkpoint "
              "would write that microbatch again")
        return 0
    print("  MISMATCH: fewer records read than committed")
    return 1


if __name__ == "__main__":
    sys.exit(main())
