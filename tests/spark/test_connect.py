"""format("kprod") through Spark Connect: a local Connect server (its own JVM, started
with spark-submit as sbin/start-connect-server.sh does), and a client
(``SparkSession.builder.remote("sc://...")``) in a Python that does not have kprod at all.

The server's Python workers run a Python with kprod installed; they find the data source
on their own (the pyspark_kprod module), so the client makes no register call, and could
not: it cannot import kprod. The sink's commit summaries are in the server's log.
"""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic
from tests.spark_cluster import ConnectServer, spark_env

# Run by make installs (a cluster of JVMs of its own: minutes of the suite's two cores).
pytestmark = [pytest.mark.installs, pytest.mark.timeout(600)]

# Runs in the client's Python: argv[1] is the server's URL, argv[2] a JSON of settings.
_CLIENT_PRELUDE = """
import json, sys
from pyspark.sql import SparkSession, functions as F
try:
    import spark_sink
except ImportError:
    pass
else:
    raise SystemExit("the client must not have kprod: " + spark_sink.__file__)
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
settings = json.loads(sys.argv[2])
kafka = {"kafka.bootstrap.servers": settings["bootstrap"], "topic": settings["topic"], "kafka.linger.ms": "5"}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, installed_python: Path) -> Iterator[ConnectServer]:
    """A Connect server on a local[2] master whose Python workers run ``installed_python``."""
    with ConnectServer(tmp_path_factory.mktemp("connect"), spark_env(str(installed_python))) as running:
        yield running


def run_client(server: ConnectServer, python: Path, body: str, **settings: object) -> None:
    """Run ``body`` (after the prelude) in ``python``; on failure show both sides' output."""
    script = _CLIENT_PRELUDE + textwrap.dedent(body)
    done = subprocess.run([str(python), "-c", script, server.url, json.dumps(settings)], env=spark_env(str(python)),
                          cwd=Path(str(settings.get("cwd", "/"))), capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, f"client failed:\n{done.stderr[-4000:]}\n{server.logs()}"


def test_batch_write_through_connect(server: ConnectServer, kafka: KafkaCluster, deps_only_python: Path,
                                     tmp_path: Path) -> None:
    rows = 3000
    topic = create_topic(kafka.bootstrap, unique_topic("cnb"), 3)
    run_client(server, deps_only_python, """
        df = spark.range(settings["rows"], numPartitions=3).select(
            (F.col("id") % 17).cast("string").alias("key"), F.to_json(F.struct("id")).alias("value"))
        df.write.format("kprod").mode("append").options(**kafka).save()
    """, bootstrap=kafka.bootstrap, topic=topic, rows=rows, cwd=str(tmp_path))
    assert re.search(rf"kprod batch write committed: {rows} records, .* \[{topic}\], from 3 task\(s\)",
                     server.server.text()), server.logs()
    messages = consume_all(kafka.bootstrap, topic, rows, settle=0.5)
    assert sorted(json.loads(m.value())["id"] for m in messages) == list(range(rows))


def test_streaming_write_through_connect(server: ConnectServer, kafka: KafkaCluster, deps_only_python: Path,
                                         tmp_path: Path) -> None:
    """A file source, one file per microbatch, run to completion (available-now) from the
    client; every microbatch committed once, as the delivery report on the server says."""
    files, per_file = 3, 150
    topic = create_topic(kafka.bootstrap, unique_topic("cns"), 2)
    source, report = tmp_path / "in", tmp_path / "report.jsonl"
    source.mkdir()
    for f in range(files):
        (source / f"part-{f}.json").write_text(
            "".join(json.dumps({"id": f * per_file + i}) + "\n" for i in range(per_file)))
    run_client(server, deps_only_python, """
        query = (spark.readStream.schema("id bigint").option("maxFilesPerTrigger", 1).json(settings["source"])
                 .select(F.col("id").cast("string").alias("key"), F.to_json(F.struct("id")).alias("value"))
                 .writeStream.format("kprod").options(**kafka)
                 .option("kprod.deliveryReport.path", settings["report"])
                 .option("checkpointLocation", settings["checkpoint"])
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"the query failed: {query.exception()}")
    """, bootstrap=kafka.bootstrap, topic=topic, source=str(source), report=str(report),
        checkpoint=str(tmp_path / "checkpoint"), cwd=str(tmp_path))
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(e["batchId"], e["records"]) for e in entries] == [(b, per_file) for b in range(files)]
    log = server.server.text()
    for batch in range(files):
        assert re.search(rf"kprod microbatch {batch} committed: {per_file} records, .* \[{topic}\]", log)
    messages = consume_all(kafka.bootstrap, topic, files * per_file, settle=0.5)
    assert sorted(json.loads(m.value())["id"] for m in messages) == list(range(files * per_file))
