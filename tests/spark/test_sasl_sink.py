"""df.write.format("kprod") with SASL options named as for Spark's Kafka sink
(kafka.security.protocol, kafka.sasl.mechanism, kafka.sasl.jaas.config), through the test
SASL proxy in front of Tansu."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from tests.brokers import consume_all, free_port, start_tansu, unique_topic
from tests.saslproxy import SaslProxy

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _write(df, bootstrap, topic, password):
    (df.write.format("kprod").mode("append")
     .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
     .option("kafka.security.protocol", "SASL_PLAINTEXT").option("kafka.sasl.mechanism", "SCRAM-SHA-512")
     .option("kafka.sasl.jaas.config", f'{SCRAM} required username="spark" password="{password}";')
     .option("kafka.max.block.ms", "20000")
     .save())


def test_batch_write_with_scram_and_a_wrong_password(spark):
    port = free_port()
    with SaslProxy("127.0.0.1", port, {"spark": "s3cret"}) as proxy, \
            start_tansu(port=port, advertised_port=proxy.port) as broker:
        topic = unique_topic("spark-sasl")
        df = spark.range(200, numPartitions=2).select(F.col("id").cast("string").alias("value"))
        _write(df, broker.bootstrap, topic, "s3cret")
        messages = consume_all(broker.bootstrap, topic, 200, overrides={
            "security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "spark", "sasl.password": "s3cret"})
        assert sorted(int(m.value()) for m in messages) == list(range(200))

        with pytest.raises(Exception, match="SaslAuthenticationError") as info:
            _write(df, broker.bootstrap, unique_topic("spark-sasl"), "guessed-wrong")
        assert "guessed-wrong" not in str(info.value)
