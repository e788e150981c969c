"""One local SparkSession for every Spark test: starting Spark costs seconds on 2 cores."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.jvms import spark_home, spark_jvm_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def python_wrapper(directory: Path) -> Path:
    """A ``python`` for the session's workers that runs ``-m pyspark.daemon MODULE`` as
    ``-m tests.spark.daemon MODULE`` (tests/spark/daemon.py says why), anything else as
    this interpreter would."""
    wrapper = directory / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = pyspark.daemon ]; then shift 2; set -- -m tests.spark.daemon "$@"; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """local[2], few shuffle partitions, no UI, Spark's Kafka connector and spark-avro on the classpath;
    stopped at the end of the session."""
    from pyspark.sql import SparkSession

    from kprod_broker import spark_avro_jars, spark_kafka_jars

    # Spark's JVM takes its planning workers' Python from its environment as it starts,
    # the context its task workers' as it starts; the tests' child processes keep ours.
    # PySpark launches the JVM from SPARK_HOME: the machine's, whose jars the class archive
    # matches (tests/jvms.py); a user's install that a test makes keeps its own.
    python = str(python_wrapper(tmp_path_factory.mktemp("python")))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYSPARK_PYTHON", python)
        patch.setenv("PYSPARK_DRIVER_PYTHON", python)
        patch.setenv("SPARK_HOME", str(spark_home()))
        session = (
            SparkSession.builder.master("local[2]")
            .appName("kprod-tests")
            # Spark's own Kafka sink beside kprod, for the side-by-side tests, and spark-avro
            # (to_avro, from_avro: the formats' bodies checked against Spark's), fetched once
            # into ~/.cache/kprod: one session for the suite, so they are on it from the start.
            .config("spark.jars", ",".join(str(jar) for jar in [*spark_kafka_jars(), *spark_avro_jars()]))
            .config("spark.ui.enabled", "false")
            .config("spark.driver.extraJavaOptions", " ".join(spark_jvm_options()))
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.python.worker.reuse", "true")
            .config("spark.python.unix.domain.socket.enabled", "true")  # as conf/spark-defaults.conf
            .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def installed_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with kprod installed as the README's install does (editable), and nothing
    else of this checkout on its path: the Python of Spark services that must find kprod."""
    from tests.installs import venv_with_kprod

    return venv_with_kprod(tmp_path_factory.mktemp("venv-installed") / "venv", "editable")


@pytest.fixture(scope="session")
def deps_only_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with kprod's dependencies but not kprod: a Spark Connect client, or
    executors that get kprod only from what a job ships."""
    from tests.installs import venv_with_kprod

    return venv_with_kprod(tmp_path_factory.mktemp("venv-deps") / "venv", None)
