"""format("kprod") needs no register call once pyspark_kprod is importable; register works too."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from pyspark.sql import functions as F

from spark_sink.spark import KProdDataSource
from tests.brokers import consume_all, create_topic, subprocess_env, unique_topic

ROOT = Path(__file__).resolve().parents[2]


def test_fresh_session_finds_kprod_without_register(kafka, tmp_path):
    # A fresh interpreter, run away from the checkout, with the project on a plain path
    # entry as an installed package would be: PySpark must find pyspark_kprod by itself.
    topic = create_topic(kafka.bootstrap, unique_topic("disc"), 1)
    script = textwrap.dedent(f"""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        (spark.range(5).selectExpr("CAST(id AS STRING) AS value").write.format("kprod").mode("append")
         .option("kafka.bootstrap.servers", "{kafka.bootstrap}").option("topic", "{topic}").save())
        spark.stop()
    """)
    env = subprocess_env()
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(int(m.value()) for m in consume_all(kafka.bootstrap, topic, 5)) == list(range(5))


def test_register_works_too(spark, kafka):
    spark.dataSource.register(KProdDataSource)
    topic = create_topic(kafka.bootstrap, unique_topic("reg"), 1)
    (spark.range(3).select(F.col("id").cast("string").alias("value")).write.format("kprod").mode("append")
     .option("kafka.bootstrap.servers", kafka.bootstrap).option("topic", topic).save())
    assert len(consume_all(kafka.bootstrap, topic, 3)) == 3
