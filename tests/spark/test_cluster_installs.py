"""The README's cluster installs, run as written against a Spark standalone cluster (a
master and two workers, tests/spark_cluster.py) with spark-submit, left out of the default
run (``make installs``, ``pytest -m installs``): they build virtualenvs from the package
index and pack one of them (half a gigabyte, with PySpark).

- kprod's wheel in a virtualenv packed with venv-pack and shipped with
  ``--archives kprod_env.tar.gz#environment``: the executors unpack it and run its Python,
  format("kprod") is found with no register call, and they load the compiled encoder.
- kprod zipped from a clone with ``zip -r kprod.zip spark_sink pyspark_kprod.py`` and
  shipped with ``--py-files``, to executors whose Python has kprod's dependencies and
  numba only: the job registers the data source, and numba compiles the encoder.

Every row is read back with confluent-kafka.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic
from tests.installs import ROOT
from tests.jvms import spark_jvm_options
from tests.spark.test_cluster import logs_on_failure, workers_that_ran_tasks
from tests.spark_cluster import SPARK_SUBMIT, StandaloneCluster, spark_env

pytestmark = [pytest.mark.installs, pytest.mark.timeout(1200)]

JOB = Path(__file__).with_name("cluster_install_job.py")
ROWS = 2000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(tmp_path_factory.mktemp("standalone"), spark_env(sys.executable)) as running:
        yield running


def _run(*command: str | Path, cwd: Path) -> None:
    subprocess.run([str(c) for c in command], cwd=cwd, check=True, capture_output=True, text=True)


def _submit(cluster: StandaloneCluster, driver_python: str, executor_python: str, *args: str | Path,
            cwd: Path) -> subprocess.CompletedProcess:
    """spark-submit as the README writes it, plus the suite's JVM options and a wait for
    both executors (so both run tasks)."""
    env = {**spark_env(driver_python), "PYSPARK_DRIVER_PYTHON": driver_python, "PYSPARK_PYTHON": executor_python}
    command = [str(SPARK_SUBMIT), "--master", cluster.url, "--driver-memory", "512m",
               "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
               "--conf", f"spark.executor.extraJavaOptions={' '.join(spark_jvm_options())}",
               "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0", *map(str, args)]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)


def _check(cluster: StandaloneCluster, kafka: KafkaCluster, done: subprocess.CompletedProcess, topic: str,
           encoder: str) -> None:
    with logs_on_failure(cluster, [done]):
        assert done.returncode == 0
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {"encoders": [encoder]}
        assert workers_that_ran_tasks(cluster, done.stderr) == {"worker-0", "worker-1"}
        values = sorted(int(m.value()) for m in consume_all(kafka.bootstrap, topic, ROWS, settle=0.5))
        assert values == list(range(ROWS))


def test_wheel_in_a_virtualenv_shipped_with_archives(cluster: StandaloneCluster, kafka: KafkaCluster, kprod_wheel: Path,
                                                     tmp_path: Path) -> None:
    """README, "On a cluster": a virtualenv with the wheel, packed and shipped with --archives."""
    _run(sys.executable, "-m", "venv", "kprod_env", cwd=tmp_path)
    _run("kprod_env/bin/pip", "install", "-q", f"{kprod_wheel}[spark]", "venv-pack", cwd=tmp_path)
    _run("kprod_env/bin/venv-pack", "-q", "-p", "kprod_env", "-o", "kprod_env.tar.gz", cwd=tmp_path)
    # The driver's Python is the archive's too, unpacked beside the job: Spark runs a data
    # source found by name with the driver's Python path on the executors as well.
    (tmp_path / "environment").mkdir()
    _run("tar", "-xzf", "kprod_env.tar.gz", "-C", "environment", cwd=tmp_path)
    topic = create_topic(kafka.bootstrap, unique_topic("archives"), 4)
    done = _submit(cluster, "./environment/bin/python", "./environment/bin/python",
                   "--archives", "kprod_env.tar.gz#environment", JOB, kafka.bootstrap, topic, str(ROWS), cwd=tmp_path)
    _check(cluster, kafka, done, topic, "spark_sink.encoder._kernels")


def test_zip_shipped_with_py_files(cluster: StandaloneCluster, kafka: KafkaCluster, deps_only_python: Path,
                                   tmp_path: Path) -> None:
    """README, "On a cluster": ``zip -r kprod.zip spark_sink pyspark_kprod.py`` in a clone,
    shipped with --py-files to a Python with kprod's dependencies and numba only."""
    clone = tmp_path / "kprod"
    _run("git", "clone", "-q", ROOT, clone, cwd=tmp_path)
    _run("zip", "-q", "-r", "kprod.zip", "spark_sink", "pyspark_kprod.py", cwd=clone)
    topic = create_topic(kafka.bootstrap, unique_topic("py-files"), 4)
    done = _submit(cluster, str(deps_only_python), str(deps_only_python), "--py-files", clone / "kprod.zip", JOB,
                   kafka.bootstrap, topic, str(ROWS), "--register", cwd=tmp_path)
    _check(cluster, kafka, done, topic, "spark_sink.encoder.jit")
