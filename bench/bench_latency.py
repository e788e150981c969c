"""Small microbatches over a slow link: per-microbatch addBatch time of kprod and of Spark's
own Kafka sink, in the same run.

    python bench/bench_latency.py [--seconds 40] [--rows-per-second 2000] [--delay-ms 20] [--rounds 3]
                                  [--warmup-seconds 15] [--python-sockets unix|tcp]

A rate source (2 partitions) with a 1 s trigger is written to Apache Kafka through a TLS
listener, behind a proxy that delivers every broker reply --delay-ms late (a remote
cluster's round trip). Each sink first runs one uncounted query of --warmup-seconds, then
--rounds queries of --seconds, alternating, each on a new topic and checkpoint; the script
prints each query's first addBatch and the p50 and p95 of the rest, and kprod's ratio to
Spark's sink. Before any figure is printed every row is read back (rows a microbatch
reported must all be in its topic). --python-sockets tcp measures Spark's default
transport to its Python workers; unix is what conf/spark-defaults.conf sets.

A third sink, a Python data source whose tasks only read their rows, shows what any
Python streaming sink pays per microbatch in Spark itself (Python workers on the driver
and the executors), whatever it writes to.
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

from kprod_broker import KafkaCluster, Listener, make_tls_files, spark_kafka_jars, ssl_listener_config  # noqa: E402
from kprod_broker import free_port  # noqa: E402
from tests.brokers import consume_all  # noqa: E402
from tests.faultproxy import FaultProxy  # noqa: E402
from tests.spark.first_microbatch import register_noop  # noqa: E402


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_query(spark, sink: str, bootstrap: str, ca: Path, topic: str, seconds: float, rate: int,
              checkpoint: str, warmup: bool = False) -> tuple[list[float], int]:
    """One streaming query for ``seconds``; returns each microbatch's addBatch ms and the rows written."""
    df = (spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", 2).load()
          .selectExpr("CAST(value AS STRING) AS key", "CAST(value AS STRING) AS value"))
    tls = {"kafka.security.protocol": "SSL", "kafka.ssl.truststore.type": "PEM",
           "kafka.ssl.truststore.location": str(ca)}
    writer = df.writeStream.format(sink).option("checkpointLocation", checkpoint).trigger(processingTime="1 second")
    if sink != "noop-python":
        writer = writer.option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
        for key, value in tls.items():
            writer = writer.option(key, value)
    query = writer.start()
    try:
        time.sleep(seconds)
        end = time.monotonic() + 5
        while query.status["isTriggerActive"] and time.monotonic() < end:
            time.sleep(0.01)  # stop between microbatches, not in the middle of one
    finally:
        query.stop()
    progress = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    durations = [float(p["durationMs"]["addBatch"]) for p in progress if "addBatch" in p.get("durationMs", {})]
    if len(durations) < 2 and not warmup:
        raise SystemExit(f"{sink}: {len(durations)} microbatch(es) with rows in {seconds:.0f} s; give it more --seconds")
    return durations, sum(int(p["numInputRows"]) for p in progress)


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
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="kprod-latency-"))
    tls = make_tls_files(work / "tls")
    port = free_port()
    with FaultProxy("127.0.0.1", port) as proxy, KafkaCluster(
            1, heap="1g", listeners=[Listener("TLS", "SSL", ssl_listener_config(tls), port=port,
                                              advertised_port=proxy.port)]) as cluster:
        proxy.set_delay(args.delay_ms, replies_only=True)
        bootstrap = f"127.0.0.1:{proxy.port}"
        print(f"Apache Kafka (1 node, TLS listener) at {bootstrap}, replies delayed {args.delay_ms:.0f} ms; "
              f"rate source {args.rows_per_second} rows/s in 2 partitions, 1 s trigger; Python workers over "
              f"{args.python_sockets} sockets", flush=True)
        spark = (SparkSession.builder.master("local[2]").appName("kprod-bench-latency")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.jars", ",".join(str(j) for j in spark_kafka_jars()))
                 .config("spark.sql.streaming.minBatchesToRetain", "2")
                 .config("spark.python.unix.domain.socket.enabled", str(args.python_sockets == "unix").lower())
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register_noop(spark, "noop-python")
        results: dict[str, list[tuple[list[float], int, str]]] = {"kprod": [], "kafka": [], "noop-python": []}
        try:
            for sink in ("kprod", "kafka", "noop-python"):
                if args.warmup_seconds > 0:
                    topic = f"latency-{sink}-warmup"
                    cluster.create_topic(topic, 2)
                    run_query(spark, sink, bootstrap, tls.ca, topic, args.warmup_seconds, args.rows_per_second,
                              str(work / f"cp-{topic}"), warmup=True)
            for round_no in range(args.rounds):
                order = ("kprod", "kafka", "noop-python")
                for sink in order if round_no % 2 == 0 else order[::-1]:
                    topic = f"latency-{sink}-{round_no}"
                    cluster.create_topic(topic, 2)
                    durations, rows = run_query(spark, sink, bootstrap, tls.ca, topic, args.seconds,
                                                args.rows_per_second, str(work / f"cp-{topic}"))
                    results[sink].append((durations, rows, topic))
        finally:
            spark.stop()
        for sink, runs in results.items():
            for _durations, rows, topic in runs:
                if sink != "noop-python":
                    consume_all(cluster.bootstrap, topic, rows, timeout=120)  # raises if any is missing
        print(f"\n{'sink':<22}{'query':>6}{'batches':>9}{'first ms':>10}{'p50 ms':>9}{'p95 ms':>9}")
        medians: dict[str, list[float]] = {}
        for sink, runs in results.items():
            name = {"kprod": "kprod", "kafka": "Spark's Kafka sink", "noop-python": "no-op Python sink"}[sink]
            for i, (durations, _rows, _topic) in enumerate(runs):
                rest = durations[1:]
                medians.setdefault(sink, []).append(statistics.median(rest))
                print(f"{name:<22}{i + 1:>6}{len(durations):>9}{durations[0]:>10.0f}"
                      f"{statistics.median(rest):>9.0f}{_percentile(rest, 0.95):>9.0f}")
        ratio = statistics.median(medians["kprod"]) / statistics.median(medians["kafka"])
        floor = statistics.median(medians["noop-python"]) / statistics.median(medians["kafka"])
        print(f"\nmedian addBatch / Spark's Kafka sink's: kprod {ratio:.2f}, no-op Python sink {floor:.2f} "
              "(lower is better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
