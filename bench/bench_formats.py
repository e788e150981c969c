"""Avro encoding speed: kprod's AvroEncoder (compiled, over Arrow's buffers) beside the
per-row serializers a PySpark user reaches for today, on the same rows in one process.

    python bench/bench_formats.py [--rows 1000000] [--runs 3]

The rows: 10 fields of mixed types (long, int, double, boolean, string, nullable string,
decimal(10,2), date, timestamp, array<int>), about 10% nulls where nullable, random with
a fixed seed. Timed, each the best of --runs, on this thread's CPU (the machine's cores
are shared, so CPU time per row is what compares; every peer runs on one thread):

- kprod: ``AvroEncoder.encode`` over the whole Arrow column, with the 5-byte Confluent
  frame (magic byte and schema id) as prefix;
- fastavro: ``schemaless_writer`` per row into a reused buffer (the bare body);
- confluent-kafka: ``AvroSerializer`` per row (fastavro underneath, plus the frame),
  against confluent-kafka's in-process registry (``mock://``: the schema is registered
  once, then cached, as against a real registry).

The peers are handed the rows as Python dicts made beforehand, untimed (a Spark UDF
would also pay for making them). kprod's bodies are decoded by fastavro for a sample of
rows and checked against the rows before any figure is printed.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spark_sink.encoder.formats import AvroEncoder, avro_schema_for

TYPE = pa.struct([
    pa.field("id", pa.int64(), False), pa.field("qty", pa.int32()), pa.field("price", pa.float64()),
    pa.field("active", pa.bool_()), pa.field("name", pa.string(), False), pa.field("note", pa.string()),
    pa.field("amount", pa.decimal128(10, 2)), pa.field("day", pa.date32()),
    pa.field("at", pa.timestamp("us", "UTC")), pa.field("scores", pa.list_(pa.int32()))])
PREFIX = b"\x00\x00\x00\x00\x01"


def make_rows(n: int) -> pa.StructArray:
    rng = np.random.default_rng(52)

    def nulls() -> np.ndarray:
        return rng.random(n) < 0.1

    words = np.array(["alpha", "beta", "gamma", "delta", "épsilon", "zeta-long-name-of-a-product"])
    lengths = rng.integers(0, 5, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    scores = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(-1000, 1000, offsets[-1], np.int32)),
                                      mask=pa.array(nulls()))
    amount = pa.array(rng.integers(-10 ** 9, 10 ** 9, n)).cast(pa.decimal128(19, 0)).view(pa.decimal128(10, 2))
    children = [
        pa.array(rng.integers(0, 2 ** 40, n)),
        pa.array(rng.integers(-2 ** 31, 2 ** 31, n, np.int32), mask=nulls()),
        pa.array(rng.normal(100, 50, n), mask=nulls()),
        pa.array(rng.random(n) < 0.5, mask=nulls()),
        pa.array(words[rng.integers(0, len(words), n)]),
        pa.array(words[rng.integers(0, len(words), n)], mask=nulls()),
        pa.compute.if_else(pa.array(nulls()), pa.scalar(None, pa.decimal128(10, 2)), amount),
        pa.array(rng.integers(0, 30000, n, np.int32), mask=nulls()).cast(pa.date32()),
        pa.array(rng.integers(0, 2 * 10 ** 15, n), mask=nulls()).cast(pa.timestamp("us", "UTC")),
        scores,
    ]
    return pa.StructArray.from_arrays(children, fields=list(TYPE))


def best(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    pa.set_cpu_count(1)

    import fastavro
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    column = make_rows(args.rows)
    schema = avro_schema_for(TYPE)
    encoder = AvroEncoder(schema, TYPE)
    dicts = column.to_pylist()

    # Correctness first: kprod's bodies read back by fastavro and by confluent-kafka.
    bodies = encoder.encode(column, PREFIX)
    parsed = fastavro.parse_schema(schema)
    sample = range(0, args.rows, max(1, args.rows // 2000))
    for i in sample:
        assert fastavro.schemaless_reader(io.BytesIO(bodies[i].as_py()[5:]), parsed, None) == dicts[i], i

    registry = SchemaRegistryClient.new_client({"url": "mock://bench"})
    serializer = AvroSerializer(registry, json.dumps(schema), conf={"auto.register.schemas": True})
    context = SerializationContext("bench", MessageField.VALUE)
    framed = serializer(dicts[0], context)
    deserializer = AvroDeserializer(registry)
    schema_id = framed[1:5]
    for i in sample:
        assert deserializer(b"\x00" + schema_id + bodies[i].as_py()[5:], context) == dicts[i], i

    def kprod() -> None:
        encoder.encode(column, PREFIX)

    def fastavro_rows() -> None:
        out = io.BytesIO()
        write = fastavro.schemaless_writer
        for row in dicts:
            out.seek(0)
            out.truncate()
            write(out, parsed, row)
            out.getvalue()

    def confluent_rows() -> None:
        for row in dicts:
            serializer(row, context)

    results = {"kprod AvroEncoder.encode": best(args.runs, kprod),
               "fastavro schemaless_writer per row": best(args.runs, fastavro_rows),
               "confluent-kafka AvroSerializer per row": best(args.runs, confluent_rows)}
    mb = sum(len(b) for b in bodies.to_pylist() if b) / 1e6
    print(f"{args.rows} rows, 10 fields ({mb:.1f} MB of framed Avro), best of {args.runs}, this thread's CPU time, "
          f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}")
    ours = results["kprod AvroEncoder.encode"]
    for name, seconds in results.items():
        print(f"  {name:40s} {seconds:8.3f} s  {args.rows / seconds / 1e6:8.3f} M rows/s  "
              f"kprod x{seconds / ours:6.1f}")


if __name__ == "__main__":
    decimal.getcontext().prec = 40
    main()
