"""Encoding alone: Arrow columns -> record batch v2 bytes on one core, next to a memcpy.

    python bench/bench_encode.py [--num-records 1000000] [--record-size 100] [--key-size 10]

The memcpy of the same number of bytes is the physical floor: the ratio shows how far
the encoder is from just moving the data once.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from spark_sink.perf import make_data
from spark_sink.protocol.columnar import encode_columns


def best_of(runs: int, fn) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--key-size", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    table = make_data(args.num_records, args.record_size, args.key_size)
    keys = table.column("key").chunk(0) if args.key_size else None
    values = table.column("value").chunk(0)
    timestamps = np.full(args.num_records, 1_700_000_000_000, dtype=np.int64)
    out = encode_columns(keys, values, timestamps, batch_size=args.batch_size)
    total = sum(len(b.payload) for b in out)
    encode_s = best_of(args.runs, lambda: encode_columns(keys, values, timestamps, batch_size=args.batch_size))
    src = np.frombuffer(np.random.default_rng(1).bytes(total), np.uint8)
    dst = np.empty_like(src)
    copy_s = best_of(args.runs, lambda: np.copyto(dst, src))
    n = args.num_records
    print(f"{n:,} records ({args.key_size} B keys, {args.record_size} B values) -> {len(out):,} batches, "
          f"{total / 1e6:.1f} MB, batch.size {args.batch_size}")
    print(f"encode  {n / encode_s / 1e6:8.2f} M records/s {total / encode_s / 1e6:9.0f} MB/s")
    print(f"memcpy  {n / copy_s / 1e6:8.2f} M records/s {total / copy_s / 1e6:9.0f} MB/s")
    print(f"encode / memcpy: {copy_s / encode_s:.3f}")


if __name__ == "__main__":
    main()
