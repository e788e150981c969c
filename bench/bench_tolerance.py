"""What ``kprod.errors.tolerance=all`` costs a Spark task when no row is bad, against
``none``, in one process and without Spark's noise.

    python bench/bench_tolerance.py [--rows 1000000] [--rounds 10] [--batch-rows 10000]
                                    [--profile] [--bootstrap-servers HOST:PORT]

The sink's task function itself (``spark_sink.spark.writer.write_task``) is given Arrow
record batches of ``--batch-rows`` rows (as Spark hands a task: 10,000 unless
spark.sql.execution.arrow.maxRecordsPerBatch says otherwise), 10-byte keys and 100-byte
values as jobs/bench_sink.py writes, once per setting in alternating order each round, to
a topic of its own per round. Per write: the calling thread's CPU seconds (the task's:
the screen for bad rows runs there), the whole process's (the Sender thread too) and its
minor page faults. Prints each setting's medians per million rows and the median of the
per-round ratios all / none. With --profile, cProfile of one more write of each
setting (the calling thread), the top functions by their own time. Without
--bootstrap-servers a local Apache Kafka node is started for the run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import resource
import sys
import time
import uuid
from pathlib import Path
from statistics import median

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

import _common  # jobs/ (on the path above): the benchmarks' topic creation
from pyspark.sql.types import BinaryType, StructField, StructType

from spark_sink.spark.writer import plan_write, write_task

SETTINGS = ("none", "all")


def _batches(rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    """The task's input as Spark would hand it: record batches of ``batch_rows`` rows."""
    out = []
    for start in range(0, rows, batch_rows):
        ids = range(start, min(rows, start + batch_rows))
        out.append(pa.record_batch({
            "key": pa.array([b"%010d" % (i % 100_000) for i in ids], pa.binary()),
            "value": pa.array([b"%0100d" % i for i in ids], pa.binary())}))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--bootstrap-servers")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(_common.given_or_local_kafka(args.bootstrap_servers))
        base = f"bench-tolerance-{uuid.uuid4().hex[:6]}"
        dead = f"{base}-dlq"
        _common.create_topic(bootstrap, dead, 1)
        schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
        batches = _batches(args.rows, args.batch_rows)
        counter = iter(range(1_000_000))

        def write(setting: str) -> tuple[float, float, float]:
            """One task's write to a new topic: its thread's and the process's CPU seconds,
            and the process's minor page faults."""
            topic = f"{base}-{next(counter)}"
            _common.create_topic(bootstrap, topic, 6)  # as bench_sink's topics
            options = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "kprod.clusterCheck": "false"}
            if setting == "all":
                options |= {"kprod.errors.tolerance": "all", "kprod.errors.deadLetterTopic": dead}
            sink, plan = plan_write(options, schema, check=False)
            t0, p0 = time.thread_time(), time.process_time()
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            message = write_task(iter(batches), sink, plan)
            figures = (time.thread_time() - t0, time.process_time() - p0,
                       resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
            assert message.records == args.rows and not message.refused, message
            return figures

        for setting in SETTINGS:  # warm: connections, encoder loaded, the pool's producer
            write(setting)
        cpu: dict[str, list[tuple[float, float, float]]] = {s: [] for s in SETTINGS}
        for r in range(args.rounds):
            for setting in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                cpu[setting].append(write(setting))
        profiles = {}
        if args.profile:
            for setting in SETTINGS:
                profiler = cProfile.Profile()
                profiler.enable()
                write(setting)
                profiler.disable()
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(18)
                profiles[setting] = out.getvalue()
    scale = 1e6 / args.rows
    print(f"write_task on {bootstrap}: {args.rows} rows in batches of {args.batch_rows}, 10-byte keys, 100-byte "
          f"values, {args.rounds} rounds; per million rows, medians")
    for i, name in enumerate(("task thread CPU s", "process CPU s", "minor page faults")):
        none, all_ = ([c[i] * scale for c in cpu[s]] for s in SETTINGS)
        ratios = [a / n for a, n in zip(all_, none) if n]
        print(f"  {name:<18} none {median(none):9.3f}  all {median(all_):9.3f}  all / none median {median(ratios):.3f}x "
              f"(per round {' '.join(f'{r:.2f}' for r in ratios)})")
    for setting, text in profiles.items():
        print(f"\n--- cProfile, tolerance={setting} ---\n{text}")


if __name__ == "__main__":
    main()
