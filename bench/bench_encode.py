"""Encoding alone: Arrow columns -> record batch v2 bytes on one core, next to a memcpy.

    python bench/bench_encode.py [--num-records 1000000] [--record-size 100] [--key-size 10]
                                 [--batch-size 16384] [--codec none|gzip|snappy|lz4|zstd]
                                 [--partitions 1] [--runs 3] [--cpu-time]

Two figures for the encoder:
  records  the records sections, encoded as ``send_arrow`` does it in the caller's thread
           (chunk by chunk, each row into its partition's batches, split at batch.size;
           with --partitions N the rows go where Java's murmur2 of their keys puts them);
  wire     the same plus each batch's header and CRC-32C (done at drain time in the
           producer, when the sequence number is known): the bytes that go on the wire;
  numba    records with numba's compiled loops instead of the C extension (what kprod
           run from a --py-files zip uses; skipped if numba is not installed).
The memcpy of the same number of bytes into a preallocated buffer is the physical floor:
the ratio shows how far each is from just moving the data once. Each figure is the best
of --runs; --cpu-time times the thread's CPU instead of the wall clock (on a shared
machine: everything here runs in the calling thread).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from spark_sink.perf import make_data
from spark_sink.producer.arrow_input import TopicRows
from spark_sink.producer.partitioner import murmur2_array, partition_for_hash
from spark_sink.protocol.compression import codec_from_name
from spark_sink.protocol.records import encode_record_batch


def best_of(runs: int, fn, clock=time.perf_counter) -> float:
    times = []
    for _ in range(runs):
        started = clock()
        fn()
        times.append(clock() - started)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--key-size", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--codec", default="none")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cpu-time", action="store_true", help="time the thread's CPU, not the wall clock")
    args = ap.parse_args()
    if args.partitions > 1 and not args.key_size:
        ap.error("--partitions spreads rows by their keys: give --key-size above 0")
    pa.set_cpu_count(1)  # one core: Arrow kernels must not fan out to a thread pool
    codec = int(codec_from_name(args.codec))
    clock = time.thread_time if args.cpu_time else time.perf_counter

    table = make_data(args.num_records, args.record_size, args.key_size)
    keys = table.column("key").chunk(0) if args.key_size else None
    partitions = 0
    if args.partitions > 1:
        partitions = partition_for_hash(murmur2_array(keys).astype(np.int64), args.partitions)
    rows = TopicRows(
        topic="bench", keys=keys, values=table.column("value").chunk(0),
        timestamps=np.full(args.num_records, 1_700_000_000_000, dtype=np.int64), headers=None,
        partitions=partitions, partition_count=max(1, args.partitions))

    def records() -> list:
        return [b for chunk in rows.encode(args.batch_size, codec) for _, encoded in chunk for b in encoded]

    def wire() -> list[bytes]:
        return [encode_record_batch(e.payload, record_count=e.record_count, last_offset_delta=e.last_offset_delta,
                                    base_timestamp=e.base_timestamp, max_timestamp=e.max_timestamp, codec=e.codec,
                                    producer_id=1, producer_epoch=0, base_sequence=0)
                for e in records()]

    batches = records()
    payload = sum(len(b.payload) for b in batches)
    total = sum(len(w) for w in wire())
    records_s = best_of(args.runs, records, clock)
    wire_s = best_of(args.runs, wire, clock)
    figures = [("records", records_s), ("wire", wire_s)]
    try:
        from spark_sink.encoder import jit, kernels
    except ImportError:
        pass
    else:
        extension, kernels.compiled = kernels.compiled, lambda: jit
        records()  # numba compiles here
        figures.append(("numba", best_of(args.runs, records, clock)))
        kernels.compiled = extension
    src = np.frombuffer(np.random.default_rng(1).bytes(total), np.uint8)
    dst = np.empty_like(src)
    copy_s = best_of(args.runs, lambda: np.copyto(dst, src), clock)
    n = args.num_records
    print(f"{n:,} records ({args.key_size} B keys, {args.record_size} B values), codec {args.codec}, "
          f"{args.partitions} partition(s), batch.size {args.batch_size}: {len(batches):,} batches, "
          f"{payload / 1e6:.1f} MB records, "
          f"{total / 1e6:.1f} MB on the wire; one core, {'CPU' if args.cpu_time else 'wall'} time")
    for name, seconds in (*figures, ("memcpy", copy_s)):
        print(f"{name:8s} {n / seconds / 1e6:8.2f} M records/s {total / seconds / 1e6:9.0f} MB/s"
              f"   {seconds / copy_s:6.1f}x memcpy time")


if __name__ == "__main__":
    main()
