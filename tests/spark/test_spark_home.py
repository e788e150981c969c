"""The suite's session runs Spark from the machine's home (tests/jvms.py), the one its
class archive is made for: its JVM's jars, and its Python workers' path (the session's
workers leave the zips out: tests/spark/daemon.py; jobs in child processes use them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.jvms import spark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_the_session_runs_the_machines_spark_home(spark: SparkSession) -> None:
    home = str(spark_home())
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    assert jvm.java.lang.System.getenv("SPARK_HOME") == home
    classpath = str(jvm.java.lang.System.getProperty("java.class.path")).split(":")
    assert any(entry.startswith(f"{home}/jars/") for entry in classpath), classpath
    paths = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("os").environ["PYTHONPATH"]).collect()
    assert f"{home}/python/lib/pyspark.zip" in paths[0].split(":"), paths
