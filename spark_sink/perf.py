"""kprod-perf: producer throughput and latency, in the spirit of kafka-producer-perf-test.

    kprod-perf --num-records 1000000 --record-size 100 --key-size 10 --mode arrow --compare

Without --bootstrap-servers it starts a local Apache Kafka node (KRaft) for the run.
With --compare (the bench extra: ``pip install -e '.[bench]'`` in a clone of kprod, which
``make venv`` includes; and Java) it also runs confluent-kafka
(per-record produce with a delivery callback), kafka-python and the Java producer
(Kafka's own ProducerPerformance, values without keys) on the same data in the same run,
and prints kprod's throughput as a ratio of each. Every client's delivery of every
record is checked (a delivery callback, kafka-python's errback, kprod's futures), and
with --compare every client's records are also counted on the broker after its run; a
run with a failed or missing record prints no figure. With --repeat N each client runs
N times, in rounds of a rotating order, and the ratios also show their spread over the
rounds.

Progress shows on a terminal only; each run ends with one plain line. Mistakes in the
command line, the settings, the address or the topic end with one line and exit status
2; a run that fails ends with one line and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple, NoReturn

import numpy as np
import pyarrow as pa

from spark_sink.client.clock import SYSTEM_TIME
from spark_sink.producer import KafkaProducer, ProducerRecord
from spark_sink.producer.config import ProducerConfig
from spark_sink.protocol.error_codes import ERRORS_BY_CODE, KProdError

_PEERS = (("confluent_kafka", "confluent-kafka"), ("kafka", "kafka-python"))  # (module, package)


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit status 2."""


class RunFailed(RuntimeError):
    """A client lost records or could not run: reported in one line, exit status 1."""


@dataclass
class Result:
    """One client's run."""

    client: str
    records: int
    seconds: float
    payload_bytes: int
    latencies_ms: list[float]
    quantiles_ms: dict[float, float] | None = None  # a client that reports its own percentiles
    # CPU seconds of this process (every thread: the caller's and the client's own I/O
    # threads) over the timed run; for a client in a process of its own (Java's), that
    # whole process's (``whole_process``: its start-up included, so no CPU ratio is given).
    cpu_seconds: float | None = None
    whole_process: bool = False

    @property
    def cpu_us_per_record(self) -> float:
        return self.cpu_seconds / self.records * 1e6 if self.cpu_seconds is not None else float("nan")

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.seconds / 1e6

    def percentile(self, q: float) -> float:
        if self.quantiles_ms is not None:
            return self.quantiles_ms.get(q, float("nan"))
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


class Progress:
    """Records handed to a client so far: on a terminal, a line rewritten at most every
    ``interval`` seconds; elsewhere (a log file) nothing until ``close``, which writes
    one plain line either way."""

    interval = 1.0

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.done = label, total, 0
        self.stream = sys.stderr
        self.tty = self.stream.isatty()
        self.started = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if self.tty and now - self.last >= self.interval:
            self.last = now
            rate = done / max(now - self.started, 1e-9)
            print(f"\r{self.label}: {done:,}/{self.total:,} records sent, {rate:,.0f} records/s", end="",
                  file=self.stream, flush=True)

    def close(self) -> None:
        seconds = time.perf_counter() - self.started
        print(("\r\033[K" if self.tty else "") + f"{self.label}: {self.done:,} records sent in {seconds:.1f} s",
              file=self.stream, flush=True)


def make_data(num_records: int, record_size: int, key_size: int) -> pa.Table:
    """Keys are distinct-ish random bytes; values are random bytes (incompressible)."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 256, record_size * num_records, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (num_records + 1) * record_size, record_size, dtype=np.int32)
    cols = {"value": pa.Array.from_buffers(pa.binary(), num_records, [None, pa.py_buffer(offsets), pa.py_buffer(values)])}
    if key_size:
        kdata = rng.integers(0, 256, key_size * num_records, dtype=np.uint8).tobytes()
        koff = np.arange(0, (num_records + 1) * key_size, key_size, dtype=np.int32)
        cols["key"] = pa.Array.from_buffers(pa.binary(), num_records, [None, pa.py_buffer(koff), pa.py_buffer(kdata)])
    return pa.table(cols)


class Rows(NamedTuple):
    """The table as the per-record clients send it, built once, before any run is timed or
    its memory measured."""

    values: list[bytes]
    keys: list[bytes | None]
    payload_bytes: int

    @classmethod
    def of(cls, table: pa.Table) -> Rows:
        values = table.column("value").to_pylist()
        keys = table.column("key").to_pylist() if "key" in table.column_names else [None] * len(values)
        return cls(values, keys, _payload(table))


def run_kprod_arrow(bootstrap: str, topic: str, table: pa.Table, props: dict[str, str], chunk: int = 50_000) -> Result:
    latencies: list[float] = []
    progress = Progress("kprod arrow", table.num_rows)
    with KafkaProducer({"bootstrap.servers": bootstrap, **props}) as producer:
        producer.partitions_for(topic)  # metadata first, as the others connect before timing too
        started, cpu = time.perf_counter(), time.process_time()
        futures = []
        for start in range(0, table.num_rows, chunk):
            sent_at = time.perf_counter()
            future = producer.send_arrow(table.slice(start, chunk), topic=topic)
            def done(_: object, t: float = sent_at) -> None:
                latencies.append((time.perf_counter() - t) * 1000)

            future.add_done_callback(done)
            futures.append(future)
            progress.update(min(start + chunk, table.num_rows))
        for f in futures:
            f.result()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    progress.close()
    return Result("kprod send_arrow", table.num_rows, seconds, _payload(table), latencies, cpu_seconds=cpu)


_SAMPLE_EVERY = 1000  # records between two whose latency is measured


class _Deliveries:
    """The records to send with their delivery callbacks, for a client whose callback takes
    (error, message) (librdkafka) or (metadata, error) (kprod): errors collected, and the
    latency of every thousandth record."""

    __slots__ = ("errors", "latencies", "_progress", "_error_first")

    def __init__(self, latencies: list[float], progress: Progress, error_first: bool) -> None:
        self.errors: list[object] = []
        self.latencies = latencies
        self._progress = progress
        self._error_first = error_first

    def on_delivery(self, first: object, second: object) -> None:
        error = first if self._error_first else second
        if error is not None:
            self.errors.append(error)

    def records(self, keys: list, values: list) -> Iterator[tuple[Any, Any, Callable[[object, object], None]]]:
        """(key, value, callback) per row, the callback timed for every thousandth."""
        plain = self.on_delivery
        for start in range(0, len(values), _SAMPLE_EVERY):
            yield keys[start], values[start], self._sampled(time.perf_counter())
            end = start + _SAMPLE_EVERY
            yield from zip(keys[start + 1:end], values[start + 1:end], repeat(plain))  # C speed between samples
            self._progress.update(min(end, len(values)))

    def _sampled(self, sent_at: float) -> Callable[[object, object], None]:
        def on_sampled(first: object, second: object) -> None:
            self.on_delivery(first, second)
            self.latencies.append((time.perf_counter() - sent_at) * 1000)
        return on_sampled


def run_kprod_record(bootstrap: str, topic: str, rows: Rows, props: dict[str, str]) -> Result:
    values, keys, payload = rows
    latencies: list[float] = []
    progress = Progress("kprod send", len(values))
    deliveries = _Deliveries(latencies, progress, error_first=False)
    with KafkaProducer({"bootstrap.servers": bootstrap, **props}) as producer:
        producer.partitions_for(topic)
        started, cpu = time.perf_counter(), time.process_time()
        for k, v, callback in deliveries.records(keys, values):
            producer.send(ProducerRecord(topic, v, k), callback)  # positional, as for the other clients
        producer.flush()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    progress.close()
    _raise_if_failed("kprod", deliveries.errors)
    return Result("kprod send", len(values), seconds, payload, latencies, cpu_seconds=cpu)


def run_confluent(bootstrap: str, topic: str, rows: Rows, batch_size: int = 16384, linger_ms: int = 5) -> Result:
    from confluent_kafka import Producer

    values, keys, payload = rows
    latencies: list[float] = []
    # murmur2_random is librdkafka's Java-compatible partitioner: every client puts each
    # key where Java would (librdkafka's default hashes with CRC32).
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": linger_ms, "batch.size": batch_size, "partitioner": "murmur2_random"})
    producer.list_topics(topic, timeout=30)
    progress = Progress("confluent-kafka", len(values))
    deliveries = _Deliveries(latencies, progress, error_first=True)
    started, cpu = time.perf_counter(), time.process_time()
    try:
        for k, v, callback in deliveries.records(keys, values):
            while True:
                try:
                    producer.produce(topic, v, k, on_delivery=callback)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    finally:
        producer.flush()  # librdkafka's producer has no close: this ends what it holds
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    progress.close()
    _raise_if_failed("confluent-kafka", deliveries.errors)
    return Result("confluent-kafka produce", len(values), seconds, payload, latencies, cpu_seconds=cpu)


def _high_watermarks(bootstrap: str, topic: str) -> int:
    """The sum of the topic's partitions' end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kprod-perf-{uuid.uuid4().hex[:8]}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        return sum(_end_offset(consumer, TopicPartition(topic, p)) for p in partitions)
    finally:
        consumer.close()


def _end_offset(consumer: Any, partition: object, attempts: int = 50) -> int:
    """A partition's high watermark, asked again while the answer is a retriable error:
    right after the topic is created its leader may not be elected everywhere yet
    (NOT_LEADER_OR_FOLLOWER)."""
    from confluent_kafka import KafkaException

    for _ in range(attempts - 1):
        try:
            return consumer.get_watermark_offsets(partition, timeout=30)[1]
        except KafkaException as exc:
            error = exc.args[0]
            known = ERRORS_BY_CODE.get(error.code())  # librdkafka keeps the broker's codes
            if not (error.retriable() or known is not None and known.retriable):
                raise
            SYSTEM_TIME.sleep(0.2)
    return consumer.get_watermark_offsets(partition, timeout=30)[1]


def run_java(bootstrap: str, topic: str, num_records: int, record_size: int, props: dict[str, str], *,
             batch_size: int = 16384, linger_ms: int = 5) -> Result:
    """The Java producer: Kafka's own ProducerPerformance (kafka-tools), in a JVM of its own.
    It sends values without keys."""
    import re
    import resource
    import subprocess

    from kprod_broker import KAFKA_VERSION, java, kafka_classpath

    settings = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": "true",
                "batch.size": str(batch_size), "linger.ms": str(linger_ms),
                **{k: v for k, v in props.items() if k in ("compression.type", "acks", "enable.idempotence")}}
    # Its CPU: what the children this process waited for used, before and after (the JVM
    # is the only one waited for meanwhile; a local broker runs on).
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [java(), "-Xmx1g", "-cp", kafka_classpath(), "org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
         "--num-records", str(num_records), "--record-size", str(record_size), "--throughput", "-1",
         "--producer-props", *(f"{k}={v}" for k, v in settings.items())],
        capture_output=True, text=True, timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    summary = re.search(r"(\d+) records sent, ([\d.]+) records/sec .*?([\d.]+) ms 50th, ([\d.]+) ms 95th, "
                        r"([\d.]+) ms 99th", done.stdout)
    if done.returncode != 0 or summary is None:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise RunFailed(f"Java's ProducerPerformance failed (exit status {done.returncode}): {tail[0]}")
    sent, rate = int(summary.group(1)), float(summary.group(2))
    return Result(f"Java producer {KAFKA_VERSION}", sent, sent / rate, sent * record_size, [],
                  {50: float(summary.group(3)), 99: float(summary.group(5))}, cpu_seconds=cpu, whole_process=True)


def run_kafka_python(bootstrap: str, topic: str, rows: Rows, batch_size: int = 16384, linger_ms: int = 5) -> Result:
    from kafka import KafkaProducer as KP

    values, keys, payload = rows
    latencies: list[float] = []
    producer = KP(bootstrap_servers=bootstrap, acks="all", linger_ms=linger_ms, batch_size=batch_size)
    try:
        producer.partitions_for(topic)
        progress = Progress("kafka-python", len(values))
        errors: list[Exception] = []
        started, cpu = time.perf_counter(), time.process_time()
        for i, (k, v) in enumerate(zip(keys, values)):
            future = producer.send(topic, v, k)
            future.add_errback(errors.append)
            if i % 1000 == 0:
                t = time.perf_counter()
                future.add_callback(lambda md, t=t: latencies.append((time.perf_counter() - t) * 1000))
                progress.update(i + 1)
        progress.update(len(values))
        producer.flush()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        producer.close()
    progress.close()
    _raise_if_failed("kafka-python", errors)
    return Result("kafka-python send", len(values), seconds, payload, latencies, cpu_seconds=cpu)


def _raise_if_failed(client: str, errors: list) -> None:
    """Every client checks every record's delivery (as a real application must): a run
    that lost records has no figure."""
    if errors:
        raise RunFailed(f"{client} failed {len(errors)} records: {errors[0]}")


def _payload(table: pa.Table) -> int:
    return sum(col.nbytes for col in table.columns)


@contextlib.contextmanager
def _cluster(bootstrap: str | None, partitions: int) -> Iterator[str]:
    """``bootstrap``, or a local Kafka node for the run whose topics are created on first
    use with ``partitions`` partitions."""
    if bootstrap:
        yield bootstrap
        return
    from kprod_broker import KAFKA_VERSION, KafkaUnavailableError, start_local_kafka

    try:
        broker = start_local_kafka(partitions=partitions, heap="1g")
    except KafkaUnavailableError as exc:
        raise UsageError(f"no --bootstrap-servers given, and a local Apache Kafka cannot start: {exc}") from exc
    with broker:
        print(f"started Apache Kafka {KAFKA_VERSION} (one KRaft node) at {broker.bootstrap}", file=sys.stderr)
        yield broker.bootstrap


def _proc_status_kb(field: str) -> float:
    """A memory figure of this process from /proc/self/status, in KiB (0 if unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


class _PeakRss:
    """Peak RSS while the block runs, without a sampling thread (one would take the GIL
    from the client it measures): the kernel's high-water mark, reset on entry so that it
    excludes building the input data. Linux only (zeros elsewhere); where the reset is
    refused, the figure includes the process's earlier peaks."""

    def __enter__(self) -> _PeakRss:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except OSError:
            pass
        self.start = _proc_status_kb("VmRSS") / 1024
        self.peak = self.start
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = max(self.start, _proc_status_kb("VmHWM") / 1024)


def _load_kernels() -> float:
    """Load send_arrow's compiled loops (once per process, as any program's first
    send_arrow would) before anything is timed; returns the MiB of RSS
    that took."""
    from spark_sink.encoder.columnar import encode_columns
    from spark_sink.producer.partitioner import murmur2_array

    before = _proc_status_kb("VmRSS")
    keys = pa.array([b"k"], pa.binary())
    murmur2_array(keys)
    encode_columns(keys, keys, np.zeros(1, np.int64), batch_size=0)
    return (_proc_status_kb("VmRSS") - before) / 1024


def parse_props(items: list[str]) -> dict[str, str]:
    props = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--producer-props: expected key=value, got {item!r}")
        props[key] = value
    return props


def report(rounds: list[list[Result]]) -> str:
    """Each client's best round, then kprod's ratio to each other client (best to best,
    and its spread over the rounds, where each ratio compares runs of the same round);
    then client CPU per record (the median over the rounds) and kprod's ratio to each
    in-process client's, round by round (median and spread)."""
    best = [max(runs, key=lambda r: r.records_per_s) for runs in zip(*rounds)]
    cpu = [float(np.median([r.cpu_us_per_record for r in runs])) for runs in zip(*rounds)]
    lines = [f"{'client':<26}{'records/s':>14}{'MB/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/rec':>12}"]
    for r, c in zip(best, cpu):
        lines.append(f"{r.client:<26}{r.records_per_s:>14,.0f}{r.mb_per_s:>10.1f}{r.percentile(50):>10.1f}"
                     f"{r.percentile(99):>10.1f}{c:>12.2f}{'*' if r.whole_process else ''}")
    if any(r.whole_process for r in best):
        lines.append("* its whole JVM's CPU over the run, start-up and ProducerPerformance's own record making "
                     "included: no CPU ratio is given for it")
    for i, other in enumerate(best[1:], start=1):
        line = f"{best[0].client} / {other.client}: {best[0].records_per_s / other.records_per_s:.2f}x"
        if len(rounds) > 1:
            per_round = [runs[0].records_per_s / runs[i].records_per_s for runs in rounds]
            line += f" (per round {min(per_round):.2f}-{max(per_round):.2f}x)"
        lines.append(line)
    for i, other in enumerate(best[1:], start=1):
        if other.cpu_seconds is None or other.whole_process:
            continue
        per_round = [runs[0].cpu_us_per_record / runs[i].cpu_us_per_record for runs in rounds]
        line = (f"CPU per record, {best[0].client} / {other.client}: {float(np.median(per_round)):.2f}x"
                + (f" (median of {len(rounds)} rounds, per round {min(per_round):.2f}-{max(per_round):.2f}x)"
                   if len(rounds) > 1 else ""))
        lines.append(line)
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not the usage text as well
        raise UsageError(f"{message} (see kprod-perf --help)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(prog="kprod-perf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", help="host:port list; default: start a local Apache Kafka node for the run")
    ap.add_argument("--topic", default=None, help="topic to write (default: a new one, created on first use)")
    ap.add_argument("--partitions", type=int, default=6, help="partitions of the topic created on the local broker")
    ap.add_argument("--num-records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=100, help="value size in bytes")
    ap.add_argument("--key-size", type=int, default=10, help="key size in bytes (0: no key)")
    ap.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE",
                    help="kprod producer settings (Java names)")
    ap.add_argument("--mode", choices=["arrow", "record"], default="arrow", help="send_arrow or per-record send()")
    ap.add_argument("--compare", action="store_true",
                    help="also run confluent-kafka, kafka-python and the Java producer (ProducerPerformance, "
                         "values without keys) on the same data; needs Java and the bench extra "
                         "(pip install -e '.[bench]' in a clone of kprod)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="rounds, each running every client once in a rotating order; the best round of each "
                         "client is reported (default: %(default)s)")
    args = ap.parse_args(argv)
    for name, least in (("num_records", 1), ("record_size", 1), ("key_size", 0), ("partitions", 1), ("repeat", 1)):
        if getattr(args, name) < least:
            ap.error(f"--{name.replace('_', '-')} must be at least {least}, got {getattr(args, name)}")
    return args


def _check_peers() -> None:
    """--compare's peers are there: the Python clients (the bench extra) and Java."""
    from kprod_broker import KafkaUnavailableError, java

    missing = []
    for module, package in _PEERS:
        try:
            __import__(module)
        except ImportError:
            missing.append(package)
    if missing:
        raise UsageError(f"--compare runs {' and '.join(missing)}, not installed: pip install -e '.[bench]' "
                         "in a clone of kprod (make venv includes it)")
    try:
        java()
    except KafkaUnavailableError as exc:
        raise UsageError(f"--compare runs Java's producer: {exc}") from exc


def _preflight(bootstrap: str, topic: str, props: dict[str, str]) -> None:
    """Reach the cluster and the topic once before anything is timed: a wrong address or
    topic is the user's to fix, not a failed run."""
    try:
        with KafkaProducer({"bootstrap.servers": bootstrap, **props}) as producer:
            producer.partitions_for(topic)
    except KProdError as exc:
        raise UsageError(f"topic {topic} at {bootstrap}: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(parse_args(argv))
    except UsageError as exc:
        message, code = f"error: {exc}", 2
    except (RunFailed, KProdError) as exc:
        message, code = f"run failed: {exc}", 1
    except KeyboardInterrupt:
        message, code = "interrupted", 130
    print(f"kprod-perf: {message.splitlines()[0]}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> int:
    props = {"acks": "all", "enable.idempotence": "true", **parse_props(args.producer_props)}
    # The other clients get kprod's batch.size and linger.ms: librdkafka's own default
    # batch.size is 1 MB against Java's (and kprod's) 16 KiB, which would compare
    # different batching rather than the clients.
    try:
        effective = ProducerConfig.from_dict({"bootstrap.servers": "localhost:9092", **props})
    except KProdError as exc:
        raise UsageError(f"--producer-props: {exc}") from exc
    if args.compare:
        _check_peers()
    batching = {"batch_size": effective.batch_size, "linger_ms": effective.linger_ms}
    table = make_data(args.num_records, args.record_size, args.key_size)
    topic = args.topic or f"kprod-perf-{uuid.uuid4().hex[:8]}"
    rows = Rows.of(table) if args.mode == "record" or args.compare else None
    memory = [0.0, 0.0]  # peak RSS and its growth, of the kprod run that grew it most
    compiled_mib = _load_kernels() if args.mode == "arrow" else 0.0

    def kprod(bootstrap: str) -> Result:
        with _PeakRss() as sampler:
            if args.mode == "arrow":
                result = run_kprod_arrow(bootstrap, topic, table, props)
            else:
                assert rows is not None  # built for the record mode
                result = run_kprod_record(bootstrap, topic, rows, props)
        if sampler.peak - sampler.start >= memory[1]:
            memory[:] = [sampler.peak, sampler.peak - sampler.start]
        return result

    clients: list[Callable[[str], Result]] = [kprod]
    if args.compare:
        assert rows is not None  # built for the peers
        peer_rows = rows
        clients.append(lambda bootstrap: run_confluent(bootstrap, topic, peer_rows, **batching))
        clients.append(lambda bootstrap: run_kafka_python(bootstrap, topic, peer_rows, **batching))
        clients.append(lambda bootstrap: run_java(bootstrap, topic, args.num_records, args.record_size, props,
                                                  **batching))
    rounds: list[list[Result]] = []

    def counted(client: Callable[[str], Result], bootstrap: str) -> Result:
        """The client's run, and with --compare its records counted on the broker (by
        confluent-kafka) before any figure."""
        if not args.compare:
            return client(bootstrap)
        before = _high_watermarks(bootstrap, topic)
        result = client(bootstrap)
        written = _high_watermarks(bootstrap, topic) - before
        if written != result.records:
            raise RunFailed(f"{result.client}: the broker holds {written} of its {result.records} records")
        return result

    with _cluster(args.bootstrap_servers, args.partitions) as bootstrap:
        _preflight(bootstrap, topic, props)
        for n in range(args.repeat):
            # A rotating order: the broker slows as it fills, so no client always goes first.
            order = [(n + k) % len(clients) for k in range(len(clients))]
            results = {i: counted(clients[i], bootstrap) for i in order}
            rounds.append([results[i] for i in range(len(clients))])
    print(f"{args.num_records:,} records, {args.record_size} B values, {args.key_size} B keys, acks=all, "
          f"idempotence on, batch.size {effective.batch_size}, linger.ms {effective.linger_ms} (every client)"
          + (f", best of {len(rounds)} rounds" if len(rounds) > 1 else ""))
    print(report(rounds))
    print(f"memory: input table {table.nbytes / 2**20:,.0f} MiB, buffer.memory {effective.buffer_memory / 2**20:,.0f} MiB; "
          f"peak RSS during the kprod run {memory[0]:,.0f} MiB, {memory[1]:+,.0f} MiB over the RSS "
          f"before it (which already held the input data"
          + (f" and the compiled encoder, {compiled_mib:+,.0f} MiB once per process" if compiled_mib else "") + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
