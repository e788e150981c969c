"""df.write.format("kprod") with OAUTHBEARER through kafka.* options, as Spark's Kafka
sink takes them: OIDC client credentials over SASL_SSL, a token provider named for the
workers to import over SASL_PLAINTEXT, and a wrong client secret, to Apache Kafka's
listeners validated by its own OIDC validator (tests/oauth_kafka.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from pyspark.sql import functions as F

from tests.brokers import consume_all, unique_topic
from tests.oauth_kafka import LOGIN_MODULE, OAuthKafka
from tests.oidc import CLIENTS, IdentityProvider

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _write(df: DataFrame, bootstrap: str, topic: str, options: dict[str, str]) -> None:
    writer = (df.write.format("kprod").mode("append").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", topic).option("kafka.sasl.mechanism", "OAUTHBEARER")
              .option("kafka.max.block.ms", "20000"))
    for key, value in options.items():
        writer = writer.option(f"kafka.{key}", value)
    writer.save()


def _frame(spark: SparkSession) -> DataFrame:
    return spark.range(200, numPartitions=2).select(F.col("id").cast("string").alias("value"))


def _client_credentials(idp: IdentityProvider, secret: str, ca: str) -> dict[str, str]:
    return {"security.protocol": "SASL_SSL", "ssl.truststore.location": ca,
            "sasl.oauthbearer.token.endpoint.url": idp.https_token_url,
            "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="kprod-app" clientSecret="{secret}" '
                                f'ssl.truststore.location="{ca}";'}


def test_write_with_oidc_client_credentials_over_tls(spark: SparkSession, oauth_kafka: OAuthKafka) -> None:
    idp, ca, topic = oauth_kafka.idp, str(oauth_kafka.tls.ca), unique_topic("spark-oauth")
    _write(_frame(spark), oauth_kafka.bootstrap("OAUTHSSL"), topic, _client_credentials(idp, CLIENTS["kprod-app"], ca))
    messages = consume_all(oauth_kafka.cluster.bootstrap, topic, 200)
    assert sorted(int(m.value()) for m in messages) == list(range(200))


def test_write_with_a_token_provider_named_for_the_workers(spark: SparkSession, oauth_kafka: OAuthKafka) -> None:
    idp, topic = oauth_kafka.idp, unique_topic("spark-oauth-provider")
    fetched = idp.fetches["kprod-app"]
    _write(_frame(spark), oauth_kafka.bootstrap("OAUTHPLAIN"), topic, {
        "security.protocol": "SASL_PLAINTEXT", "sasl.oauthbearer.token.provider": "tests.oidc:client_credentials_provider",
        "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="kprod-app" clientSecret="{CLIENTS["kprod-app"]}" '
                            f'tokenUrl="{idp.token_url}";'})
    assert idp.fetches["kprod-app"] > fetched  # the workers called the provider
    messages = consume_all(oauth_kafka.cluster.bootstrap, topic, 200)
    assert sorted(int(m.value()) for m in messages) == list(range(200))


def test_wrong_client_secret_fails_the_write_naming_the_endpoint(spark: SparkSession, oauth_kafka: OAuthKafka) -> None:
    idp, ca = oauth_kafka.idp, str(oauth_kafka.tls.ca)
    with pytest.raises(Exception, match="SaslAuthenticationError.*refused client 'kprod-app'") as info:
        _write(_frame(spark), oauth_kafka.bootstrap("OAUTHSSL"), unique_topic("spark-oauth"),
               _client_credentials(idp, "guessed-wrong", ca))
    assert "guessed-wrong" not in str(info.value)
