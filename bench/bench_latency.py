"""Small writes, where Spark's overhead per microbatch and per task shows: kprod beside
Spark's own Kafka sink (and a no-op Python sink) in the same run.

    python bench/bench_latency.py [--seconds 40] [--rows-per-second 2000] [--delay-ms 20] [--rounds 3]
                                  [--warmup-seconds 15] [--python-sockets unix|tcp]
                                  [--listeners plain,tls] [--tiny-rows 5] [--tiny-partitions 200]
                                  [--tiny-seconds 30] [--tiny-rounds 3] [--skip-stream] [--skip-tiny]

Small microbatches: a rate source (2 partitions) with a 1 s trigger is written to Apache
Kafka through a plaintext listener and a TLS listener (--listeners), each behind a proxy
that delivers every broker reply --delay-ms late (a remote cluster's round trip). Each
sink first runs one uncounted query of --warmup-seconds, then --rounds queries of
--seconds, alternating, each on a new topic and checkpoint; the script prints each
query's first addBatch and the p50 and p95 of the rest, and kprod's ratio to Spark's sink.

Tiny writes over many tasks: --tiny-rows rows hashed over --tiny-partitions shuffle
partitions (``spark.sql.shuffle.partitions``, adaptive execution off, as in every
streaming microbatch and foreachBatch write), so that most tasks are empty; over the
plaintext listener without the delay. Once as batch writes (--tiny-rounds each,
alternating, wall time of ``save()``), once as a streaming query of --tiny-seconds per
sink (median addBatch).

Before any figure is printed every row is read back (rows a microbatch or write reported
must all be in its topic). --python-sockets tcp measures Spark's default transport to its
Python workers; unix is what conf/spark-defaults.conf sets. The no-op Python sink, a
Python data source whose tasks only read their rows, shows what any Python sink pays in
Spark itself (Python workers on the driver and the executors), whatever it writes to.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from kprod_broker import (  # noqa: E402  # noqa: E402
    KAFKA_VERSION,
    KafkaCluster,
    Listener,
    free_port,
    make_tls_files,
    spark_kafka_jars,
    ssl_listener_config,
)
from tests.brokers import consume_all  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402
from tests.spark.first_microbatch import register_noop  # noqa: E402

SINKS = ("kprod", "kafka", "noop-python")
NAMES = {"kprod": "kprod", "kafka": "Spark's Kafka sink", "noop-python": "no-op Python sink"}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _sink_options(sink: str, bootstrap: str, topic: str, tls: dict[str, str]) -> dict[str, str]:
    if sink == "noop-python":
        return {}
    return {"kafka.bootstrap.servers": bootstrap, "topic": topic, **tls}


def run_query(spark, sink: str, options: dict[str, str], seconds: float, rate: int, checkpoint: str,
              warmup: bool = False, shuffle: bool = False) -> tuple[list[float], int]:
    """One streaming query for ``seconds``; returns each microbatch's addBatch ms and the rows
    written. ``shuffle`` hashes the rows by key over spark.sql.shuffle.partitions first."""
    df = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", 2).load()
          .selectExpr("CAST(value AS STRING) AS key", "CAST(value AS STRING) AS value"))
    if shuffle:
        df = df.repartition("key")
    writer = df.writeStream.format(sink).option("checkpointLocation", checkpoint).trigger(processingTime="1 second")
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.start()
    try:
        time.sleep(seconds)
        end = time.monotonic() + 30
        while query.status["isTriggerActive"] and time.monotonic() < end:
            time.sleep(0.01)  # stop between microbatches, not in the middle of one
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    durations = [float(p["durationMs"]["addBatch"]) for p in progress if "addBatch" in p.get("durationMs", {})]
    if len(durations) < 2 and not warmup:
        raise SystemExit(f"{sink}: {len(durations)} microbatch(es) with rows in {seconds:.0f} s; give it more seconds")
    return durations, sum(int(p["numInputRows"]) for p in progress)


def streaming_rounds(spark, args, cluster: KafkaCluster, label: str, bootstrap: str,
                     tls: dict[str, str], work: Path) -> dict[str, list[tuple[list[float], int, str]]]:
    """Warm-up, then --rounds queries per sink, alternating."""
    results: dict[str, list[tuple[list[float], int, str]]] = {sink: [] for sink in SINKS}
    for sink in SINKS:
        if args.warmup_seconds > 0:
            topic = f"latency-{label}-{sink}-warmup"
            cluster.create_topic(topic, 2)
            run_query(spark, sink, _sink_options(sink, bootstrap, topic, tls), args.warmup_seconds,
                      args.rows_per_second, str(work / f"cp-{topic}"), warmup=True)
    for round_no in range(args.rounds):
        for sink in SINKS if round_no % 2 == 0 else SINKS[::-1]:
            topic = f"latency-{label}-{sink}-{round_no}"
            cluster.create_topic(topic, 2)
            durations, rows = run_query(spark, sink, _sink_options(sink, bootstrap, topic, tls), args.seconds,
                                        args.rows_per_second, str(work / f"cp-{topic}"))
            results[sink].append((durations, rows, topic))
    return results


def print_streaming(title: str, results: dict[str, list[tuple[list[float], int, str]]]) -> None:
    print(f"\n{title}")
    print(f"{'sink':<22}{'query':>6}{'batches':>9}{'first ms':>10}{'p50 ms':>9}{'p95 ms':>9}")
    medians: dict[str, list[float]] = {}
    for sink, runs in results.items():
        for i, (durations, _rows, _topic) in enumerate(runs):
            rest = durations[1:]
            medians.setdefault(sink, []).append(statistics.median(rest))
            print(f"{NAMES[sink]:<22}{i + 1:>6}{len(durations):>9}{durations[0]:>10.0f}"
                  f"{statistics.median(rest):>9.0f}{_percentile(rest, 0.95):>9.0f}")
    ratio = statistics.median(medians["kprod"]) / statistics.median(medians["kafka"])
    floor = statistics.median(medians["noop-python"]) / statistics.median(medians["kafka"])
    print(f"median addBatch / Spark's Kafka sink's: kprod {ratio:.2f}, no-op Python sink {floor:.2f} "
          "(lower is better)")


def tiny_writes(spark, args, cluster: KafkaCluster, bootstrap: str,
                work: Path) -> tuple[list[tuple[str, int, str]], list[str]]:
    """--tiny-rows rows over --tiny-partitions shuffle partitions, as batch writes and as a
    streaming query, per sink; returns (sink, rows, topic) to read back and the report's lines."""
    written: list[tuple[str, int, str]] = []
    saved = {key: spark.conf.get(key) for key in ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled")}
    spark.conf.set("spark.sql.shuffle.partitions", str(args.tiny_partitions))
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # as in microbatches: no partitions coalesced
    try:
        df = (spark.range(args.tiny_rows).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
              .repartition("key"))
        seconds: dict[str, list[float]] = {sink: [] for sink in SINKS}
        for round_no in range(args.tiny_rounds + 1):  # round 0 warms each sink up, uncounted
            for sink in SINKS if round_no % 2 == 0 else SINKS[::-1]:
                topic = f"tiny-{sink}-{round_no}"
                if sink != "noop-python":
                    cluster.create_topic(topic, 2)
                writer = df.write.format(sink).mode("append")
                for key, value in _sink_options(sink, bootstrap, topic, {}).items():
                    writer = writer.option(key, value)
                started = time.monotonic()
                writer.save()
                if round_no:
                    seconds[sink].append(time.monotonic() - started)
                if sink != "noop-python":
                    written.append((sink, args.tiny_rows, topic))
        stream: dict[str, tuple[list[float], int]] = {}
        for sink in SINKS:
            topic = f"tiny-stream-{sink}"
            if sink != "noop-python":
                cluster.create_topic(topic, 2)
            durations, rows = run_query(spark, sink, _sink_options(sink, bootstrap, topic, {}), args.tiny_seconds,
                                        args.tiny_rows, str(work / f"cp-{topic}"), shuffle=True)
            stream[sink] = (durations, rows)
            if sink != "noop-python":
                written.append((sink, rows, topic))
    finally:
        for key, value in saved.items():
            spark.conf.set(key, value)
    lines = [f"\n{args.tiny_rows} rows over {args.tiny_partitions} shuffle partitions (adaptive execution off), "
             "plaintext, no delay",
             f"{'sink':<22}{'batch write s (median)':>24}{'microbatches':>14}{'rows/batch':>12}{'addBatch p50 ms':>17}"]
    for sink in SINKS:
        durations, rows = stream[sink]
        rest = durations[1:] or durations
        lines.append(f"{NAMES[sink]:<22}{statistics.median(seconds[sink]):>24.2f}{len(durations):>14}"
                     f"{rows / max(1, len(durations)):>12.1f}{statistics.median(rest):>17.0f}")
    batch = statistics.median(seconds["kprod"]) / statistics.median(seconds["kafka"])
    batch_floor = statistics.median(seconds["noop-python"]) / statistics.median(seconds["kafka"])
    p50 = {sink: statistics.median(stream[sink][0][1:] or stream[sink][0]) for sink in SINKS}
    lines.append(f"batch write / Spark's Kafka sink's: kprod {batch:.2f}, no-op Python sink {batch_floor:.2f}; "
                 f"median addBatch / Spark's Kafka sink's: kprod {p50['kprod'] / p50['kafka']:.2f}, "
                 f"no-op Python sink {p50['noop-python'] / p50['kafka']:.2f} (lower is better)")
    return written, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=40.0, help="length of each query (default: %(default)s)")
    ap.add_argument("--rows-per-second", type=int, default=2000, help="rate source rows/s (default: %(default)s)")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="added to every broker reply (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="queries per sink, alternating (default: %(default)s)")
    ap.add_argument("--warmup-seconds", type=float, default=15.0,
                    help="an uncounted query per sink first, so that no sink pays the JVM's warm-up alone "
                         "(default: %(default)s)")
    ap.add_argument("--python-sockets", choices=("unix", "tcp"), default="unix",
                    help="how Spark talks to its Python workers: spark.python.unix.domain.socket.enabled, "
                         "which kprod's conf/spark-defaults.conf sets (default: %(default)s)")
    ap.add_argument("--listeners", default="plain,tls",
                    help="the listeners the small microbatches go through, comma-separated (default: %(default)s)")
    ap.add_argument("--tiny-rows", type=int, default=5, help="rows of each tiny write (default: %(default)s)")
    ap.add_argument("--tiny-partitions", type=int, default=200,
                    help="spark.sql.shuffle.partitions for the tiny writes (default: %(default)s)")
    ap.add_argument("--tiny-seconds", type=float, default=30.0,
                    help="length of each tiny streaming query (default: %(default)s)")
    ap.add_argument("--tiny-rounds", type=int, default=3, help="tiny batch writes per sink (default: %(default)s)")
    ap.add_argument("--skip-stream", action="store_true", help="no small-microbatch queries")
    ap.add_argument("--skip-tiny", action="store_true", help="no tiny writes")
    args = ap.parse_args(argv)
    listeners = [name.strip().lower() for name in args.listeners.split(",") if name.strip()]
    if set(listeners) - {"plain", "tls"}:
        ap.error(f"--listeners: plain and/or tls, got {args.listeners!r}")

    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="kprod-latency-"))
    tls_files = make_tls_files(work / "tls")
    ports = {"plain": free_port(), "tls": free_port()}
    with FaultProxy("127.0.0.1", ports["plain"]) as plain_proxy, \
            FaultProxy("127.0.0.1", ports["tls"]) as tls_proxy, \
            KafkaCluster(1, heap="1g", listeners=[
                Listener("PROXIED", port=ports["plain"], advertised_port=plain_proxy.port),
                Listener("TLS", "SSL", ssl_listener_config(tls_files), port=ports["tls"],
                         advertised_port=tls_proxy.port)]) as cluster:
        proxies = {"plain": plain_proxy, "tls": tls_proxy}
        client_tls = {"plain": {}, "tls": {"kafka.security.protocol": "SSL", "kafka.ssl.truststore.type": "PEM",
                                           "kafka.ssl.truststore.location": str(tls_files.ca)}}
        print(f"Apache Kafka {KAFKA_VERSION} (1 node), plaintext listener "
              f"at 127.0.0.1:{plain_proxy.port}, TLS at 127.0.0.1:{tls_proxy.port}; Python workers over "
              f"{args.python_sockets} sockets", flush=True)
        spark = (SparkSession.builder.master("local[2]").appName("kprod-bench-latency")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.jars", ",".join(str(j) for j in spark_kafka_jars()))
                 .config("spark.sql.streaming.minBatchesToRetain", "2")
                 .config("spark.python.unix.domain.socket.enabled", str(args.python_sockets == "unix").lower())
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register_noop(spark, "noop-python")
        streaming: dict[str, dict[str, list[tuple[list[float], int, str]]]] = {}
        tiny: list[tuple[str, int, str]] = []
        tiny_report: list[str] = []
        try:
            if not args.skip_stream:
                for label in listeners:
                    for proxy in proxies.values():
                        proxy.set_delay(args.delay_ms, replies_only=True)
                    streaming[label] = streaming_rounds(spark, args, cluster, label,
                                                        f"127.0.0.1:{proxies[label].port}", client_tls[label], work)
            if not args.skip_tiny:
                for proxy in proxies.values():
                    proxy.set_delay(0)
                tiny, tiny_report = tiny_writes(spark, args, cluster, f"127.0.0.1:{plain_proxy.port}", work)
        finally:
            spark.stop()
        for results in streaming.values():
            for sink, runs in results.items():
                for _durations, rows, topic in runs:
                    if sink != "noop-python":
                        consume_all(cluster.bootstrap, topic, rows, timeout=120)  # raises if any is missing
        for _sink, rows, topic in tiny:
            consume_all(cluster.bootstrap, topic, rows, timeout=120)
        for label, results in streaming.items():
            print_streaming(f"rate source {args.rows_per_second} rows/s in 2 partitions, 1 s trigger, "
                            f"{'TLS' if label == 'tls' else 'plaintext'}, replies delayed {args.delay_ms:.0f} ms",
                            results)
        print("\n".join(tiny_report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
