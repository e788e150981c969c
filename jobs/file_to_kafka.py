"""Batch job: Parquet, CSV or JSON files written to a Kafka topic by kprod.

    python jobs/file_to_kafka.py data/events.parquet --key-column user_id
    spark-submit jobs/file_to_kafka.py --bootstrap-servers broker:9092 --topic events \\
        --format csv /data/in/*.csv

If the files already have kprod's columns (value, and optionally key, topic, partition,
headers, timestamp) they are sent as they are; otherwise every column is packed into a
JSON value, with --key-column as the key. Without --bootstrap-servers a local Apache
Kafka node is started for the run (and the records are gone when it stops).
"""

from __future__ import annotations

import argparse
import sys
import time

import _common
from _common import say

KPROD_COLUMNS = {"value", "key", "topic", "partition", "headers", "timestamp"}


def build_parser() -> argparse.ArgumentParser:
    parser = _common.docstring_parser("file_to_kafka.py", __doc__)
    parser.add_argument("paths", nargs="+", help="files or directories to read")
    _common.add_common_arguments(parser)
    parser.add_argument("--format", choices=["parquet", "csv", "json"],
                        help="input format (default: from the first path's extension)")
    parser.add_argument("--key-column", help="column sent as the record key (cast to string)")
    parser.add_argument("--tasks", type=int, help="repartition to this many write tasks first")
    parser.add_argument("--report", help="append one JSON line with per-partition offset ranges to this file")
    return parser


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    for ext in ("parquet", "csv", "json"):
        if any(p.rstrip("/").endswith("." + ext) or p.endswith(".jsonl") and ext == "json" for p in args.paths):
            return ext
    raise SystemExit("cannot tell the input format from the paths; give --format parquet|csv|json")


def as_records(df, key_column: str | None):
    """kprod's columns: as they are, or all columns as a JSON value (plus the key)."""
    from pyspark.sql import functions as F

    if set(c.lower() for c in df.columns) <= KPROD_COLUMNS and "value" in (c.lower() for c in df.columns):
        return df
    if key_column and key_column not in df.columns:
        raise SystemExit(f"--key-column {key_column!r} is not a column; the columns are {', '.join(df.columns)}")
    value = F.to_json(F.struct(*df.columns)).alias("value")
    if key_column:
        return df.select(F.col(key_column).cast("string").alias("key"), value)
    return df.select(value)


def run(args: argparse.Namespace, bootstrap: str) -> tuple[int, float]:
    """Write the files; return (rows, seconds of the write)."""
    spark = _common.spark_session(args, "kprod file_to_kafka")
    fmt = _format(args)
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", True).option("inferSchema", True)
    df = as_records(reader.load(args.paths), args.key_column)
    if args.tasks:
        df = df.repartition(args.tasks)
    rows = df.count()
    writer = (df.write.format("kprod").mode("append")
              .options(**_common.producer_options(args, bootstrap)).option("topic", args.topic))
    if args.report:
        writer = writer.option("kprod.deliveryReport.path", args.report)
    say(f"writing {rows} rows from {', '.join(args.paths)} ({fmt}) to topic {args.topic} at {bootstrap}")
    started = time.monotonic()
    writer.save()
    return rows, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Before Kafka and Spark start (20 s on a small machine): a path without a known
    # extension needs --format, and saying so should not wait for them.
    args.format = _format(args)
    _common.setup_logging()
    with _common.kafka_cluster(args) as bootstrap:
        rows, seconds = run(args, bootstrap)
    print(f"wrote {rows} records to {args.topic} in {seconds:.1f} s ({rows / max(seconds, 1e-9):,.0f} records/s), "
          "all acknowledged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
