"""format("kprod") is found with no register call, from any working directory, however
kprod was installed: editable (what `make` and `pip install -e .` do) or from its wheel."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.spark import KProdDataSource
from tests.brokers import consume_all, create_topic, subprocess_env, unique_topic
from tests.installs import venv_with_kprod

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.mark.installs  # builds a venv: make installs
@pytest.mark.parametrize("mode", ["editable", "wheel"])
def test_installed_kprod_is_found_from_a_foreign_directory(kafka: KafkaCluster, tmp_path: Path, mode: str,
                                                           kprod_wheel: Path, installed_python: Path) -> None:
    # installed_python is the session's editable install (one build of the checkout fewer).
    python = installed_python if mode == "editable" else venv_with_kprod(tmp_path / "venv", kprod_wheel)
    topic = create_topic(kafka.bootstrap, unique_topic("disc"), 1)
    script = textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        (spark.range(5).selectExpr("CAST(id AS STRING) AS value").write.format("kprod").mode("append")
         .option("kafka.bootstrap.servers", "{kafka.bootstrap}").option("topic", "{topic}").save())
        spark.stop()
    """)
    env = subprocess_env(str(python))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([str(python), "-c", script], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(int(m.value()) for m in consume_all(kafka.bootstrap, topic, 5)) == list(range(5))


def test_register_works_too(spark: SparkSession, kafka: KafkaCluster) -> None:
    spark.dataSource.register(KProdDataSource)
    topic = create_topic(kafka.bootstrap, unique_topic("reg"), 1)
    (spark.range(3).select(F.col("id").cast("string").alias("value")).write.format("kprod").mode("append")
     .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic).save())
    assert len(consume_all(kafka.bootstrap, topic, 3)) == 3
