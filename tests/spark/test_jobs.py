"""The jobs in jobs/: real runs against Apache Kafka as a user would start them (each
one's --help: tests/jobs/test_job_scripts.py; file_to_kafka.py and stream_to_kafka.py run
under spark-submit on a standalone cluster, in test_cluster.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer.partitioner import partition_for_key
from tests.brokers import consume_all, subprocess_env, unique_topic

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def run_job(name: str, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(JOBS / name), *args], env={**subprocess_env(), **env},
                          capture_output=True, text=True, timeout=timeout)


def test_file_job_asks_for_the_format_before_starting_anything(tmp_path: Path) -> None:
    """No Kafka node, no Spark: the job stops at once, naming --format."""
    done = run_job("file_to_kafka.py", str(tmp_path / "events.dat"), timeout=60)
    assert done.returncode != 0 and "give --format parquet|csv|json" in done.stderr
    assert "starting Apache Kafka" not in done.stderr and "SparkContext" not in done.stderr


def _import_job(name: str) -> ModuleType:
    sys.path.insert(0, str(JOBS))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(JOBS))


def test_demo_starts_its_own_kafka_and_shows_steady_and_first_microbatch_rates() -> None:
    """``make demo``'s script, as a newcomer runs it: no address given, so it starts a
    local Apache Kafka node, streams, reads everything back, and labels kprod's steady
    rate apart from the first microbatch's (which includes starting Python workers). Two
    seconds end before Spark has started: the demo goes on until a microbatch had rows."""
    # Spark's WARN lines shown (the demo's own default is ERROR), as in the other jobs.
    done = run_job("demo.py", "--duration", "2", "--rows-per-second", "3000", "--partitions", "2",
                   KPROD_SPARK_LOG_LEVEL="WARN")
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "starting Apache Kafka" in done.stderr and "local broker stopped" in done.stderr
    assert "every committed record was read back, once" in done.stdout, done.stdout
    # It ends with its summary: Spark stopped in order, before the process exits, so no
    # worker or accumulator server prints a traceback; no WARN for registering kprod over
    # the installed (statically registered) data source; no WARNING or ERROR of kprod's.
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr[-3000:]
    assert "replaced a statically registered data source" not in done.stderr, done.stderr[-3000:]
    assert not re.search(r"(WARNING|ERROR) spark_sink", done.stderr), done.stderr[-3000:]
    # The steady-state line needs a second microbatch with rows, which a slow machine may
    # not reach within the run; the rates themselves are computed below, on fixed input.
    assert "kprod, first microbatch: " in done.stdout, done.stdout


def test_demo_rates_leave_out_empty_microbatches_and_put_the_first_apart() -> None:
    demo = _import_job("demo")
    steady, first = demo.kprod_rates([(0, 0.01), (1000, 2.0), (3000, 0.5), (0, 0.0), (1000, 0.5)])
    assert steady.startswith("  kprod, steady state:     4,000 records/s") and "2 microbatches: 4,000 records" in steady
    assert first.startswith("  kprod, first microbatch: 500 records/s (1,000 records in 2.0 s")
    assert demo.kprod_rates([(0, 0.0)]) == []


@pytest.mark.bench  # a Spark session and a Kafka node of its own for a minute: make bench
def test_bench_sink_delivers_every_row_it_times(kafka: KafkaCluster) -> None:
    """The benchmark's figures stand for real deliveries: each Kafka writer's every write
    (the untimed one and one per round) went to a topic of its own, which holds each row
    exactly once, on Java's partition; the script checks this itself and so does this
    test. Every sink gets a rate and CPU figures, kprod its ratios; Spark's own Kafka sink
    runs at its defaults and with kprod's settings; kprod runs exactly-once too (read back
    read_committed, librdkafka's default). The Kafka writers compress with lz4."""
    from confluent_kafka.admin import AdminClient

    topic = unique_topic("jb")
    rows, rounds = 3000, 1
    done = run_job("bench_sink.py", "--bootstrap-servers", kafka.bootstrap, "--topic", topic, "--create-topic",
                   "--partitions", "3", "--rows", str(rows), "--repeat", str(rounds), "--conf", "spark.master=local[2]",
                   "--producer-prop", "compression.type=lz4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compression lz4" in done.stdout
    assert f"read back {6 * rounds} timed writes: every row exactly once" in done.stderr
    for label in ("no-op", "kprod", "Spark's Kafka sink, its defaults", "Spark's Kafka sink, kprod's settings",
                  "confluent-kafka per row", "kprod producer alone", "kprod / no-op",
                  "kprod / Spark's Kafka sink, its defaults", "kprod / Spark's Kafka sink, kprod's settings",
                  "kprod / confluent-kafka per row", "kprod / kprod producer alone", "kprod exactly-once",
                  "kprod exactly-once / kprod"):
        assert f"  {label} " in done.stdout, done.stdout
    written = sorted(t for t in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=30).topics
                     if t.startswith(f"{topic}-"))
    assert len(written) == 6 * (1 + rounds)
    for name in written:
        messages = consume_all(kafka.bootstrap, name, rows, settle=0.3)
        assert Counter(m.value() for m in messages) == {f"{i:v>100}".encode(): 1 for i in range(rows)}, name
        assert all(m.partition() == partition_for_key(m.key(), 3) for m in messages), name


def test_conf_files_are_read_as_their_formats_say(tmp_path: Path) -> None:
    _common = _import_job("_common")
    props = tmp_path / "producer.properties"
    props.write_text("# comment\n! also a comment\n\nlinger.ms = 10\nacks: all\nclient.id=a=b\n")
    assert _common.read_properties(str(props)) == {"linger.ms": "10", "acks": "all", "client.id": "a=b"}
    props.write_text("linger.ms 10\n")
    with pytest.raises(SystemExit, match=r"producer.properties: expected key=value, got 'linger.ms 10'"):
        _common.read_properties(str(props))
    defaults = tmp_path / "spark-defaults.conf"
    defaults.write_text("# comment\nspark.master   local[2]\nspark.ui.enabled\tfalse\nspark.flag\n")
    assert _common.read_spark_defaults(str(defaults)) == {
        "spark.master": "local[2]", "spark.ui.enabled": "false", "spark.flag": ""}
    assert _common.read_properties(str(tmp_path / "missing")) == {} == _common.read_spark_defaults(str(tmp_path / "x"))


def test_producer_properties_lists_every_setting_a_file_can_hold() -> None:
    # Callables, the bootstrap servers and PEM text cannot come from the file; every other
    # key is there, commented out at its default, so that the file documents the producer.
    from spark_sink.producer.config import KEYS, ProducerConfig

    text = (JOBS.parent / "conf" / "producer.properties").read_text()
    listed = {line.lstrip("#").split("=", 1)[0]: line.split("=", 1)[1]
              for line in text.splitlines() if "=" in line and not line.startswith("# ")}
    not_in_file = {"bootstrap.servers", "interceptors", "key.serializer", "value.serializer", "transactional.id",
                   "ssl.truststore.certificates"}
    assert set(listed) == set(KEYS) - not_in_file
    defaults = ProducerConfig.from_dict({"bootstrap.servers": "h:1"})
    assert ProducerConfig.from_dict({"bootstrap.servers": "h:1", **listed}) == defaults
