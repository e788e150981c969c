"""What ``send_arrow(on_error="skip")`` costs when no row is bad, against ``"fail"``, in one run.

    python bench/bench_on_error.py [--rows 100000] [--rounds 20] [--topic-column]
                                   [--value-format avro|json] [--bootstrap-servers HOST:PORT]

One producer sends the same table (10-byte keys, 100-byte values, as jobs/bench_sink.py)
round after round, each round once per mode in alternating order, and flushes after each
call. Per call: the calling thread's CPU seconds inside ``send_arrow`` (the screen for bad
rows runs there, before anything is queued) and the whole process's CPU seconds over the
call and its flush (the Sender thread too). Prints each mode's median per million rows
and the median of the per-round ratios skip / fail. Without --bootstrap-servers a local
Apache Kafka node is started for the run. With --value-format the value is a struct
(id, name, score) sent in that format through a local Schema Registry (Apicurio, started
for the run): skipping then also lets the format's loop list rows it cannot encode.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import uuid
from pathlib import Path
from statistics import median

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "jobs"))

import _common  # jobs/ (on the path above): a local Kafka node unless one is given

from spark_sink.producer import KafkaProducer


def _table(rows: int, topic: str | None, structs: bool = False) -> pa.Table:
    value = pa.array([b"%0100d" % i for i in range(rows)], pa.binary())
    if structs:  # about the same 100 bytes, as fields
        value = pa.StructArray.from_arrays(
            [pa.array(range(rows), pa.int64()), pa.array([f"name-{i:080d}" for i in range(rows)]),
             pa.array([i * 0.25 for i in range(rows)], pa.float64())], names=["id", "name", "score"])
    cols = {"key": pa.array([b"k%09d" % (i % 1000) for i in range(rows)], pa.binary()), "value": value}
    if topic is not None:
        cols["topic"] = pa.array([topic] * rows, pa.string())
    return pa.table(cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--topic-column", action="store_true", help="name the topic in a column of every row")
    parser.add_argument("--value-format", choices=("avro", "json"), help="a struct value in this format")
    parser.add_argument("--bootstrap-servers")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        bootstrap = stack.enter_context(_common.given_or_local_kafka(args.bootstrap_servers))
        serializer = None
        if args.value_format is not None:
            from kprod_broker import start_local_registry
            from spark_sink.producer import ArrowSerializer

            registry = start_local_registry()
            stack.callback(registry.stop)
            serializer = ArrowSerializer(args.value_format, {"url": registry.url})
        topic = f"bench-on-error-{uuid.uuid4().hex[:6]}"
        table = _table(args.rows, topic if args.topic_column else None, serializer is not None)
        producer = stack.enter_context(KafkaProducer({"bootstrap.servers": bootstrap, "batch.size": 1_000_000}))
        # Warm: metadata, connections, topic created, schema registered.
        producer.send_arrow(table, topic, value_serializer=serializer).result(60)
        thread: dict[str, list[float]] = {"fail": [], "skip": []}
        process: dict[str, list[float]] = {"fail": [], "skip": []}
        for r in range(args.rounds):
            for mode in ("fail", "skip") if r % 2 == 0 else ("skip", "fail"):
                t0, p0 = time.thread_time(), time.process_time()
                future = producer.send_arrow(table, None if args.topic_column else topic, on_error=mode,
                                             value_serializer=serializer)
                t1 = time.thread_time()
                producer.flush()
                assert future.result(60).records == args.rows
                thread[mode].append(t1 - t0)
                process[mode].append(time.process_time() - p0)
    scale = 1e6 / args.rows
    print(f"send_arrow on {bootstrap}: {args.rows} rows a call, {args.rounds} rounds, "
          f"{'topic column' if args.topic_column else 'topic argument'}, "
          f"{args.value_format or 'binary'} values; CPU s per million rows, medians")
    for name, figures in (("calling thread (send_arrow)", thread), ("process (send_arrow + flush)", process)):
        ratios = [s / f for s, f in zip(figures["skip"], figures["fail"])]
        print(f"  {name:<30} fail {median(figures['fail']) * scale:.3f}  skip {median(figures['skip']) * scale:.3f}"
              f"  skip / fail median {median(ratios):.3f}x")


if __name__ == "__main__":
    main()
