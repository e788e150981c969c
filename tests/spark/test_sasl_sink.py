"""df.write.format("kprod") with SASL options named as for Spark's Kafka sink
(kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.jaas.config), to Apache
Kafka's SASL_PLAINTEXT listener with SCRAM-SHA-512."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from tests.brokers import consume_all, unique_topic
from tests.secure_kafka import USERS, SecureKafka

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _write(df: DataFrame, bootstrap: str, topic: str, password: str) -> None:
    (df.write.format("kprod").mode("append")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kafka.security.protocol", "SASL_PLAINTEXT").option("kafka.sasl.mechanism", "SCRAM-SHA-512")
     .option("kafka.sasl.jaas.config", f'{SCRAM} required username="spark" password="{password}";')
     .option("kafka.max.block.ms", "20000")
     .save())


def test_batch_write_with_scram_and_a_wrong_password(spark: SparkSession, secure_kafka: SecureKafka) -> None:
    bootstrap = secure_kafka.bootstrap("SASLPLAIN")
    topic = unique_topic("spark-sasl")
    df = spark.range(200, numPartitions=2).select(F.col("id").cast("string").alias("value"))
    _write(df, bootstrap, topic, USERS["spark"])
    messages = consume_all(bootstrap, topic, 200, overrides={
        "security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "spark", "sasl.password": USERS["spark"]})
    assert sorted(int(m.value()) for m in messages) == list(range(200))

    with pytest.raises(Exception, match="SaslAuthenticationError") as info:
        _write(df, bootstrap, unique_topic("spark-sasl"), "guessed-wrong")
    assert "guessed-wrong" not in str(info.value)
