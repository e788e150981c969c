"""kprod on a Spark standalone cluster: a master and two workers, each its own JVM started
with PySpark's spark-class on loopback, and the jobs in jobs/ submitted to it with
``spark-submit --master spark://...`` as a user would.

Two ways of getting kprod to the executors are exercised: shipped with ``--py-files``
(their Python has kprod's dependencies only), and installed in their Python. Nothing of
this checkout reaches them through PYTHONPATH. What the JVMs logged is printed when a
test fails.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic
from tests.installs import ROOT, kprod_zip
from tests.jvms import spark_jvm_options
from tests.spark_cluster import SPARK_SUBMIT, StandaloneCluster, spark_env

JOBS = ROOT / "jobs"

# Starting three JVMs, then a driver and two executors per job, on a shared machine.
# Run by make installs (a cluster of JVMs of its own: minutes of the suite's two cores).
pytestmark = [pytest.mark.installs, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A master and two workers of one core and 1 GiB each, stopped after the module."""
    with StandaloneCluster(tmp_path_factory.mktemp("standalone"), spark_env(sys.executable)) as running:
        yield running


@contextlib.contextmanager
def logs_on_failure(cluster: StandaloneCluster, done: list[subprocess.CompletedProcess]) -> Iterator[None]:
    """Print the driver's and the cluster's logs if the block fails (pytest shows them)."""
    try:
        yield
    except BaseException:
        for run in done:
            print(f"--- driver stdout\n{run.stdout[-3000:]}\n--- driver stderr\n{run.stderr[-8000:]}")
        print(cluster.logs())
        raise


def submit(cluster: StandaloneCluster, python: Path, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    """spark-submit to the cluster; the driver and the executors run ``python``."""
    command = [str(SPARK_SUBMIT), "--master", cluster.url, "--driver-memory", "512m",
               "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
               # A worker starts its executors with the application's options, not its own.
               "--conf", f"spark.executor.extraJavaOptions={' '.join(spark_jvm_options())}",
               # Schedule only once both executors are there, so both run tasks.
               "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
               *map(str, args)]
    return subprocess.run(command, env=spark_env(str(python)), cwd=cwd, capture_output=True, text=True, timeout=480)


def workers_that_ran_tasks(cluster: StandaloneCluster, driver_stderr: str) -> set[str]:
    """The workers whose executor for this application finished at least one task."""
    connected = re.search(r"Connected to Spark cluster with app ID (\S+)", driver_stderr)
    assert connected is not None, driver_stderr[-4000:]
    app = connected.group(1)
    return {path.parts[-4] for path in cluster.directory.glob(f"worker-*/{app}/*/stderr")
            if "Finished task" in path.read_text(errors="replace")}


def test_batch_job_with_kprod_shipped_by_py_files(cluster: StandaloneCluster, kafka: KafkaCluster, tmp_path: Path,
                                                  deps_only_python: Path) -> None:
    """file_to_kafka.py with kprod in a --py-files zip: the driver and the executors run a
    Python that has kprod's dependencies but not kprod. The job registers the data source
    itself (as every job in jobs/ does): Spark's lookup of format("kprod") does not see
    --py-files, so without that call the write fails with DATA_SOURCE_NOT_FOUND. Each
    row's columns become a JSON value keyed by the key column, with a delivery report."""
    rows = 4000
    topic = create_topic(kafka.bootstrap, unique_topic("cb"), 4)
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"n": list(range(rows)), "user": [f"u{i % 13}" for i in range(rows)]}), source)
    report = tmp_path / "report.jsonl"
    done = submit(cluster, deps_only_python, "--py-files", kprod_zip(tmp_path / "kprod.zip"),
                  JOBS / "file_to_kafka.py", source, "--bootstrap-servers", kafka.bootstrap, "--topic", topic,
                  "--key-column", "user", "--tasks", "4", "--producer-prop", "linger.ms=5", "--report", report,
                  cwd=tmp_path)
    with logs_on_failure(cluster, [done]):
        assert done.returncode == 0
        assert f"wrote {rows} records to {topic}" in done.stdout
        assert json.loads(report.read_text())["records"] == rows
        # The sink's summary, from the commit on the driver.
        assert re.search(rf"kprod batch write committed: {rows} records, \d+ bytes of keys and values, "
                         rf"\d partition\(s\) of 1 topic\(s\) \[{topic}\], from 4 task\(s\); "
                         r"0 record\(s\) retried, 0 failed; \d+ request\(s\), latency avg [\d.]+ ms, max [\d.]+ ms",
                         done.stderr)
        assert workers_that_ran_tasks(cluster, done.stderr) == {"worker-0", "worker-1"}
        messages = consume_all(kafka.bootstrap, topic, rows, settle=0.5)
        assert sorted(json.loads(m.value())["n"] for m in messages) == list(range(rows))
        assert all(m.key() == f"u{json.loads(m.value())['n'] % 13}".encode() for m in messages)


def test_streaming_job_with_kprod_installed(cluster: StandaloneCluster, kafka: KafkaCluster, tmp_path: Path,
                                            installed_python: Path) -> None:
    """stream_to_kafka.py over three JSON files, one per microbatch (available-now), with
    kprod installed in the Python of the driver and the executors: every microbatch's
    summary on the driver, every row in Kafka once."""
    files, per_file = 3, 200
    topic = create_topic(kafka.bootstrap, unique_topic("cs"), 2)
    source = tmp_path / "in"
    source.mkdir()
    for f in range(files):
        (source / f"part-{f}.json").write_text(
            "".join(json.dumps({"id": f * per_file + i}) + "\n" for i in range(per_file)))
    done = submit(cluster, installed_python, JOBS / "stream_to_kafka.py", "--bootstrap-servers", kafka.bootstrap,
                  "--topic", topic, "--source", "files", "--input-dir", source, "--max-files-per-trigger", "1",
                  "--trigger", "available-now", "--checkpoint", tmp_path / "checkpoint", cwd=tmp_path)
    with logs_on_failure(cluster, [done]):
        assert done.returncode == 0
        assert f"committed {files * per_file} records" in done.stdout and f"in {files} microbatches" in done.stdout
        for batch in range(files):
            assert re.search(rf"kprod microbatch {batch} committed: {per_file} records, .* \[{topic}\]", done.stderr)
        assert workers_that_ran_tasks(cluster, done.stderr) == {"worker-0", "worker-1"}
        messages = consume_all(kafka.bootstrap, topic, files * per_file, settle=0.5)
        assert sorted(json.loads(m.value())["id"] for m in messages) == list(range(files * per_file))


FIRST_MICROBATCH = Path(__file__).with_name("first_microbatch.py")


@pytest.mark.bench
def test_first_microbatch_on_fresh_executors(cluster: StandaloneCluster, kafka: KafkaCluster, tmp_path: Path,
                                             kprod_wheel: Path) -> None:
    """One streaming microbatch (two tasks, one per file) in a new application, so on
    executors and Python workers that have just started, by kprod installed from its
    wheel, by kprod shipped with --py-files, by Spark's own Kafka sink, and by a no-op
    Python sink (Spark's own cost for a Python sink). Prints each addBatch time (for
    bench/RESULTS.md; no timing is asserted) and checks every row arrived."""
    from kprod_broker import spark_kafka_jars
    from tests.installs import venv_with_kprod

    files, per_file = 2, 500
    source = tmp_path / "in"
    source.mkdir()
    for f in range(files):
        (source / f"part-{f}.json").write_text(
            "".join(json.dumps({"id": f * per_file + i}) + "\n" for i in range(per_file)))
    wheel_python = venv_with_kprod(tmp_path / "venv-wheel", kprod_wheel)
    deps_python = venv_with_kprod(tmp_path / "venv-deps", None)
    jars = ",".join(str(j) for j in spark_kafka_jars())
    runs: dict[str, tuple[Path, str, list[str | Path]]] = {
        "kprod (wheel installed)": (wheel_python, "kprod", []),
        "Spark's Kafka sink": (wheel_python, "kafka", ["--jars", jars]),
        "kprod (--py-files zip)": (deps_python, "kprod", ["--py-files", kprod_zip(tmp_path / "kprod.zip")]),
        "no-op Python sink": (wheel_python, "kprodnoop", []),
    }
    timings: dict[str, float] = {}
    done: list[subprocess.CompletedProcess] = []
    with logs_on_failure(cluster, done):
        for n, (name, (python, sink, ship)) in enumerate(runs.items()):
            topic = create_topic(kafka.bootstrap, unique_topic(f"first-{sink}"), 2)
            done.append(submit(cluster, python, *ship, FIRST_MICROBATCH, sink, kafka.bootstrap, topic, source,
                               tmp_path / f"checkpoint-{n}", cwd=tmp_path))
            assert done[-1].returncode == 0
            result = json.loads(done[-1].stdout.strip().splitlines()[-1])
            assert result["rows"] == files * per_file
            if sink != "kprodnoop":
                assert len(consume_all(kafka.bootstrap, topic, files * per_file, settle=0.5)) == files * per_file
            timings[name] = result["addBatchMs"]
    print("first microbatch's addBatch on fresh executors (ms):", json.dumps(timings))
