"""Streaming job: a rate source (or files in a directory) written to a Kafka topic by kprod.

    python jobs/stream_to_kafka.py --duration 20
    spark-submit jobs/stream_to_kafka.py --bootstrap-servers broker:9092 --topic events \\
        --rows-per-second 50000 --checkpoint /data/cp/events
    python jobs/stream_to_kafka.py --source files --input-dir /data/in --input-format json \\
        --trigger available-now

Without --bootstrap-servers it starts a local Apache Kafka node for the run. Every
microbatch is committed only after Kafka acknowledged all its records; its summary goes
to the log and one JSON line to the delivery report (--report).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import _common
from _common import say


def build_parser() -> argparse.ArgumentParser:
    parser = _common.docstring_parser("stream_to_kafka.py", __doc__)
    _common.add_common_arguments(parser)
    parser.add_argument("--source", choices=["rate", "files"], default="rate", help="input (default: %(default)s)")
    parser.add_argument("--rows-per-second", type=int, default=20000, help="rate source speed (default: %(default)s)")
    parser.add_argument("--rate-partitions", type=int, default=2,
                        help="rate source partitions = write tasks per microbatch (default: %(default)s)")
    parser.add_argument("--value-size", type=int, default=100, help="rate source value bytes (default: %(default)s)")
    parser.add_argument("--no-key", action="store_true", help="rate source: send records without keys")
    parser.add_argument("--input-dir", help="files source: directory watched for new files")
    parser.add_argument("--input-format", choices=["json", "csv", "parquet"], default="json",
                        help="files source format (default: %(default)s)")
    parser.add_argument("--max-files-per-trigger", type=int, help="files source: files per microbatch")
    parser.add_argument("--trigger", default="1 second",
                        help="processing-time interval such as '1 second', or 'available-now' "
                             "(default: %(default)s)")
    parser.add_argument("--duration", type=float, default=0,
                        help="seconds to run, then stop between two microbatches; 0 runs until the source "
                             "is done (available-now) or Ctrl-C (default: %(default)s)")
    parser.add_argument("--checkpoint", help="checkpoint directory (default: a new temporary directory)")
    parser.add_argument("--report", help="delivery report, one JSON line per microbatch "
                                         "(default: kprod-delivery.jsonl in the checkpoint directory)")
    parser.add_argument("--output-mode", choices=["append", "complete"], default="append")
    return parser


@dataclass
class StreamStats:
    """What the delivery report says was committed, and how long the query ran."""

    microbatches: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    task_seconds: float = 0.0  # summed over microbatches: the slowest task of each
    batches: list[tuple[int, float]] = field(default_factory=list)  # (records, slowest task's seconds) of each
    per_partition: dict[tuple[str, int], int] = field(default_factory=dict)
    report: str = ""

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0


def _source(spark, args: argparse.Namespace):
    from pyspark.sql import functions as F

    if args.source == "rate":
        df = (spark.readStream.format("rate").option("rowsPerSecond", args.rows_per_second)
              .option("numPartitions", args.rate_partitions).load())
        cols = [F.lpad(F.col("value").cast("string"), args.value_size, "x").alias("value"), "timestamp"]
        if not args.no_key:
            cols.insert(0, (F.col("value") % 1000).cast("string").alias("key"))
        return df.select(*cols)
    if not args.input_dir:
        raise SystemExit("--source files needs --input-dir")
    # A streaming file source needs a schema: take it from the files already there.
    schema = spark.read.format(args.input_format).option("header", True).load(args.input_dir).schema
    reader = spark.readStream.format(args.input_format).schema(schema).option("header", True)
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    df = reader.load(args.input_dir)
    if "value" in df.columns:
        return df
    # Columns kprod does not know go into a JSON value, as the sink's error suggests.
    return df.select(F.to_json(F.struct(*df.columns)).alias("value"))


def _stop_between_batches(query, deadline: float, until_rows: bool = False) -> None:
    """Wait for the deadline (and, with ``until_rows``, for a microbatch with rows, at most
    a minute longer), then stop while no microbatch runs, so none is cut short."""
    def waiting() -> bool:
        now = time.monotonic()
        if now < deadline:
            return True
        return until_rows and now < deadline + 60 and not any(p["numInputRows"] for p in query.recentProgress)

    while query.isActive and waiting():
        time.sleep(0.2)
    # Stop just after a microbatch has ended, at the start of the pause before the next
    # trigger: a query merely seen idle may be at the pause's end, and the next microbatch
    # start (and be cancelled, its tasks logging errors) as stop() runs.
    last = (query.lastProgress or {}).get("batchId")
    give_up = time.monotonic() + 60
    while query.isActive and time.monotonic() < give_up:
        ended = (query.lastProgress or {}).get("batchId") != last
        if ended and not query.status.get("isTriggerActive"):
            break
        time.sleep(0.01)
    query.stop()


def read_report(path: str) -> list[dict]:
    file = Path(path)
    return [json.loads(line) for line in file.read_text().splitlines()] if file.exists() else []


def run(args: argparse.Namespace, bootstrap: str, until_rows: bool = False) -> StreamStats:
    """Run the streaming query against ``bootstrap`` and return what was committed; with
    ``until_rows``, past ``--duration`` until a microbatch had rows (see
    :func:`_stop_between_batches`)."""
    spark = _common.spark_session(args, "kprod stream_to_kafka")
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="kprod-checkpoint-")
    report = args.report or str(Path(checkpoint) / "kprod-delivery.jsonl")
    already = len(read_report(report))
    writer = (_source(spark, args).writeStream.format("kprod").outputMode(args.output_mode)
              .options(**_common.producer_options(args, bootstrap))
              .option("topic", args.topic)
              .option("kprod.deliveryReport.path", report)
              .option("checkpointLocation", checkpoint))
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=args.trigger)
    say(f"streaming {args.source} -> topic {args.topic} at {bootstrap}; checkpoint {checkpoint}")
    started = time.monotonic()
    query = writer.start()
    last_batch = -1
    try:
        if args.duration > 0:
            _stop_between_batches(query, started + args.duration, until_rows)
        else:
            while query.isActive:
                query.awaitTermination(1)
                progress = query.lastProgress
                if progress and progress["batchId"] != last_batch:
                    last_batch = progress["batchId"]
                    say(f"microbatch {last_batch}: {progress['numInputRows']} rows")
    except KeyboardInterrupt:
        say("interrupted: stopping the query")
        query.stop()
    seconds = time.monotonic() - started
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")
    stats = StreamStats(seconds=seconds, report=report)
    for entry in read_report(report)[already:]:
        stats.microbatches += 1
        stats.records += entry["records"]
        stats.bytes += entry["bytes"]
        stats.task_seconds += entry.get("maxTaskSeconds", 0.0)
        stats.batches.append((entry["records"], entry.get("maxTaskSeconds", 0.0)))
        for p in entry["partitions"]:
            tp = (p["topic"], p["partition"])
            stats.per_partition[tp] = stats.per_partition.get(tp, 0) + p["count"]
    return stats


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _common.setup_logging()
    with _common.kafka_cluster(args) as bootstrap:
        stats = run(args, bootstrap)
    print(f"committed {stats.records} records ({stats.bytes / 1e6:.1f} MB of keys and values) in "
          f"{stats.microbatches} microbatches over {stats.seconds:.1f} s: {stats.records_per_s:,.0f} records/s")
    print(f"delivery report: {stats.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
