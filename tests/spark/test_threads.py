"""Writes from a thread pool, a common ETL pattern: several DataFrames written at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from spark_sink.spark import use_session_in_this_thread
from tests.brokers import consume_all, create_topic, unique_topic

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

N = 50


def _write(df: DataFrame, bootstrap: str, topic: str) -> None:
    (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).save())


def test_spark_alone_does_not_find_kprod_from_another_thread(spark: SparkSession) -> None:
    """Spark's lookup needs the JVM thread's active session (see spark_sink.spark.threads).
    If this starts passing, Spark fixed it and the README's workaround can go."""
    df = spark.range(1).select(F.col("id").cast("string").alias("value"))
    with ThreadPoolExecutor(1) as pool:
        error = pool.submit(_write, df, "127.0.0.1:9", "t").exception(120)
    assert error is not None and "DATA_SOURCE_NOT_FOUND" in str(error) and "kprod" in str(error)


def test_a_thread_pool_writes_several_dataframes(spark: SparkSession, kafka: KafkaCluster) -> None:
    topics = [create_topic(kafka.bootstrap, unique_topic("pool"), 2) for _ in range(3)]
    frames = [spark.range(N, numPartitions=2).select(F.concat(F.lit(f"{i}-"), F.col("id")).alias("value"))
              for i in range(len(topics))]
    with ThreadPoolExecutor(len(topics), initializer=use_session_in_this_thread, initargs=(spark,)) as pool:
        for future in [pool.submit(_write, df, kafka.bootstrap, t) for df, t in zip(frames, topics)]:
            future.result(180)
    for i, topic in enumerate(topics):
        values = sorted(m.value().decode() for m in consume_all(kafka.bootstrap, topic, N, settle=0.5))
        assert values == sorted(f"{i}-{n}" for n in range(N))


def test_without_a_session_given_the_default_one_is_made_active(spark: SparkSession) -> None:
    jvm = spark._jvm
    assert jvm is not None  # a classic session, not a Connect client

    def active_before_and_after() -> tuple[bool, bool]:
        before = jvm.SparkSession.getActiveSession().isDefined()
        use_session_in_this_thread()
        return before, jvm.SparkSession.getActiveSession().get().equals(spark._jsparkSession)

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(active_before_and_after).result(30) == (False, True)
