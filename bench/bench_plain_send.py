"""send()'s compiled short way alone (``_kernels.PlainSender.send``), two builds of the
extension in one process, timed in turn: CPU per million records.

    python bench/bench_plain_send.py BEFORE.so [AFTER.so] [--records 1000000] [--rounds 7]
                                     [--partitions 6] [--batch-size 16384]

BEFORE.so and AFTER.so are builds of spark_sink/encoder/_kernels.c (AFTER: the one this
checkout imports). Each round sends the same prebuilt records (bytes key and value, no
callback) through each build's PlainSender into its own PlainAppender; a full batch is
dropped for a new one instead of being sent: no network, no sender thread. The figure is
the calling thread's CPU time (time.thread_time) per million records; a round runs the
builds in turn, which one first alternating from round to round. It prints each round's
figures and the median of the rounds' ratios (after / before). A build whose PlainSender
takes the record timestamps' clock (eight arguments) is given ``time.time_ns``, as
KafkaProducer gives it with the system's clock.
"""

from __future__ import annotations

import argparse
import collections
import importlib.machinery
import importlib.util
import statistics
import threading
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

from spark_sink.encoder import _kernels as imported
from spark_sink.producer.batch import ProducerBatch
from spark_sink.producer.partitioner import SEED as MURMUR2_SEED
from spark_sink.producer.producer_record import ProducerRecord

TOPIC = "bench"


def load_build(path: str) -> ModuleType:
    """A build of _kernels from ``path``, beside the one the producer imports."""
    name = imported.__name__  # its init function is named after the last part
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def sender(build: ModuleType, partitions: int, batch_size: int) -> Any:
    """A PlainSender of ``build``, appending into batches that are dropped once full."""
    by_topic: dict[str, dict[int, collections.deque]] = {TOPIC: {p: collections.deque() for p in range(partitions)}}
    accumulator = SimpleNamespace(on_ready=lambda: None)
    appender = build.PlainAppender(accumulator, by_topic, threading.Lock(), build.FutureRecordMetadata, ProducerBatch)
    metadata = SimpleNamespace(leaders={TOPIC: [0] * partitions})

    def new_batch(topic: str, partition: int, timestamp: int, key: bytes, value: bytes, callback: object,
                  key_size: int, value_size: int) -> object:
        batch = ProducerBatch(topic, partition, 0.0, 0.0, batch_size, batch_size,
                              records=build.RecordBuffer(batch_size))
        future = batch.try_append(timestamp, key, value, None, None, key_size, value_size)
        queue = by_topic[topic][partition]
        queue.clear()
        queue.append(batch)
        return future

    def long_way(record: object, callback: object) -> object:
        raise AssertionError(f"a benchmark record went the long way: {record!r}")

    args: list[object] = [appender, metadata, 1 << 20, MURMUR2_SEED, ProducerRecord, long_way, new_batch]
    try:
        return build.PlainSender(*args, time.time_ns)
    except TypeError:  # a build that reads the clock itself
        return build.PlainSender(*args)


def cpu_per_million(send: Any, records: list[ProducerRecord]) -> float:
    started = time.thread_time()
    for record in records:
        send(record)
    return (time.thread_time() - started) / len(records) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default=imported.__file__)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=16384)
    args = ap.parse_args()
    builds = {"before": load_build(args.before),
              "after": imported if Path(args.after) == Path(imported.__file__) else load_build(args.after)}
    records = [ProducerRecord(TOPIC, b"v" * 100, key=b"key-%d" % (i % 1000)) for i in range(args.records)]
    senders = {name: sender(build, args.partitions, args.batch_size) for name, build in builds.items()}
    for send in senders.values():  # warm up: every partition's first batch, the caches
        cpu_per_million(send.send, records[:50_000])
    ratios = []
    for round_ in range(args.rounds):
        order = list(senders) if round_ % 2 == 0 else list(senders)[::-1]
        cpu = {name: cpu_per_million(senders[name].send, records) for name in order}
        ratios.append(cpu["after"] / cpu["before"])
        print(f"round {round_ + 1}: before {cpu['before']:.3f} s, after {cpu['after']:.3f} s CPU per M records, "
              f"after/before {ratios[-1]:.3f}")
    print(f"after/before, median of {args.rounds} rounds: {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
