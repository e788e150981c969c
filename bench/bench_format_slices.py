"""What serializing a formats call in slices (the sink's ``WireSlices``) costs, against
serializing it whole, in one run.

    python bench/bench_format_slices.py [--rows 100000] [--rounds 8] [--value-format json|avro]
                                        [--shape flags|mixed] [--buffer-memory 33554432]
                                        [--bootstrap-servers HOST:PORT]

One producer (the given buffer.memory) sends the same call round after round, each round
once per mode in alternating order (whole, sliced, then sliced, whole), flushing after
each: ``whole`` is the sink before slicing (``serialize_columns`` over the call, one
``send_arrow``), ``sliced`` is the sink's ``_TaskWrite.send`` now (``WireSlices`` of half
the call size for that buffer.memory, as the writer's, one ``send_arrow`` per part). Each with a
``RowRefusals``, as under kprod.errors.tolerance=all. Per call, the whole process's CPU
seconds over the call and its flush (the Sender thread too): prints each mode's median
per million rows and the median of the per-round ratios sliced / whole. Shapes:
``flags`` (break 56b's: a string key and 48 booleans with an id), ``mixed`` (id, a
100-character name, a score). A local Apache Kafka node and Schema Registry (Apicurio)
are started for the run unless --bootstrap-servers is given (the registry always is).
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

from spark_sink.producer import ArrowSerializer, KafkaProducer, RowRefusals, serialize_columns
from spark_sink.spark.writer import WireSlices, send_bytes_for


def _table(rows: int, shape: str) -> pa.Table:
    ids = pa.array(range(rows), pa.int64())
    if shape == "flags":
        flags = [pa.array([r % (i + 2) == 0 for r in range(rows)]) for i in range(48)]
        value = pa.StructArray.from_arrays([ids, *flags], ["id", *(f"flag_{i:02d}" for i in range(48))])
    else:
        value = pa.StructArray.from_arrays([ids, pa.array([f"name-{i:095d}" for i in range(rows)]),
                                            pa.array([i * 0.25 for i in range(rows)])], ["id", "name", "score"])
    return pa.table({"key": pa.array([str(r) for r in range(rows)]), "value": value})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--value-format", choices=("avro", "json"), default="json")
    parser.add_argument("--shape", choices=("flags", "mixed"), default="flags")
    parser.add_argument("--buffer-memory", type=int, default=32 << 20)
    parser.add_argument("--bootstrap-servers")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        from kprod_broker import start_local_registry

        bootstrap = stack.enter_context(_common.given_or_local_kafka(args.bootstrap_servers))
        registry = start_local_registry()
        stack.callback(registry.stop)
        serializer = ArrowSerializer(args.value_format, {"url": registry.url})
        topic = f"bench-format-slices-{uuid.uuid4().hex[:6]}"
        table = _table(args.rows, args.shape)
        producer = stack.enter_context(KafkaProducer({"bootstrap.servers": bootstrap,
                                                      "buffer.memory": args.buffer_memory}))
        call = send_bytes_for(args.buffer_memory) // 2  # the writer's slices with a format

        def serialize(rows: pa.Table) -> pa.Table:
            return serialize_columns(rows, topic, None, serializer, RowRefusals(rows))

        def whole() -> list:
            return [producer.send_arrow(serialize(table), topic, on_error="skip")]

        def sliced() -> list:
            return [producer.send_arrow(part, topic, on_error="skip")
                    for part in WireSlices(call).parts(table, serialize)]

        modes = {"whole": whole, "sliced": sliced}
        whole()  # warm: metadata, connections, topic created, schema registered
        producer.flush()
        cpu: dict[str, list[float]] = {"whole": [], "sliced": []}
        parts = 0
        for r in range(args.rounds):
            for mode in ("whole", "sliced") if r % 2 == 0 else ("sliced", "whole"):
                p0 = time.process_time()
                futures = modes[mode]()
                producer.flush()
                assert sum(f.result(60).records for f in futures) == args.rows
                cpu[mode].append(time.process_time() - p0)
                parts = len(futures) if mode == "sliced" else parts
    scale = 1e6 / args.rows
    ratios = [s / w for s, w in zip(cpu["sliced"], cpu["whole"])]
    print(f"{args.value_format} {args.shape} values to {bootstrap}: {args.rows} rows a call "
          f"({table.nbytes / 2**20:.1f} MiB Arrow), buffer.memory {args.buffer_memory >> 20} MiB "
          f"(slices of {call / 2**20:g} MiB: {parts} parts), {args.rounds} rounds; process CPU s per million rows, medians")
    print(f"  whole {median(cpu['whole']) * scale:.3f}  sliced {median(cpu['sliced']) * scale:.3f}"
          f"  sliced / whole median {median(ratios):.3f}x (per round: {', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
