"""Options and columns are checked on the driver: pure checks, then through real Spark."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
)

from spark_sink.client.errors import ColumnError, ConfigError
from spark_sink.producer import ARROW_COLUMNS
from spark_sink.spark.columns import ACCEPTED, plan_columns
from spark_sink.spark.options import ExactlyOnce, parse_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

BOOT = {"kafka.bootstrap.servers": "127.0.0.1:9"}

# Every key of Java's ProducerConfig in Kafka 4.3.1 (ProducerConfig.configNames()).
JAVA_PRODUCER_KEYS = frozenset("""
acks batch.size bootstrap.servers buffer.memory client.dns.lookup client.id compression.gzip.level
compression.lz4.level compression.type compression.zstd.level config.providers connections.max.idle.ms
delivery.timeout.ms enable.idempotence enable.metrics.push interceptor.classes key.serializer linger.ms
max.block.ms max.in.flight.requests.per.connection max.request.size metadata.max.age.ms metadata.max.idle.ms
metadata.recovery.rebootstrap.trigger.ms metadata.recovery.strategy metric.reporters metrics.num.samples
metrics.recording.level metrics.sample.window.ms partitioner.adaptive.partitioning.enable
partitioner.availability.timeout.ms partitioner.class partitioner.ignore.keys receive.buffer.bytes
reconnect.backoff.max.ms reconnect.backoff.ms request.timeout.ms retries retry.backoff.max.ms retry.backoff.ms
sasl.client.callback.handler.class sasl.jaas.config sasl.kerberos.kinit.cmd sasl.kerberos.min.time.before.relogin
sasl.kerberos.service.name sasl.kerberos.ticket.renew.jitter sasl.kerberos.ticket.renew.window.factor
sasl.login.callback.handler.class sasl.login.class sasl.login.connect.timeout.ms sasl.login.read.timeout.ms
sasl.login.refresh.buffer.seconds sasl.login.refresh.min.period.seconds sasl.login.refresh.window.factor
sasl.login.refresh.window.jitter sasl.login.retry.backoff.max.ms sasl.login.retry.backoff.ms sasl.mechanism
sasl.oauthbearer.assertion.algorithm sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub sasl.oauthbearer.assertion.file
sasl.oauthbearer.assertion.private.key.file sasl.oauthbearer.assertion.private.key.passphrase
sasl.oauthbearer.assertion.template.file sasl.oauthbearer.client.credentials.client.id
sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.clock.skew.seconds
sasl.oauthbearer.expected.audience sasl.oauthbearer.expected.issuer sasl.oauthbearer.header.urlencode
sasl.oauthbearer.jwks.endpoint.refresh.ms sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms
sasl.oauthbearer.jwks.endpoint.retry.backoff.ms sasl.oauthbearer.jwks.endpoint.url
sasl.oauthbearer.jwt.retriever.class sasl.oauthbearer.jwt.validator.class sasl.oauthbearer.scope
sasl.oauthbearer.scope.claim.name sasl.oauthbearer.sub.claim.name sasl.oauthbearer.token.endpoint.url
security.protocol security.providers send.buffer.bytes socket.connection.setup.timeout.max.ms
socket.connection.setup.timeout.ms ssl.cipher.suites ssl.enabled.protocols ssl.endpoint.identification.algorithm
ssl.engine.factory.class ssl.key.password ssl.keymanager.algorithm ssl.keystore.certificate.chain ssl.keystore.key
ssl.keystore.location ssl.keystore.password ssl.keystore.type ssl.protocol ssl.provider
ssl.secure.random.implementation ssl.trustmanager.algorithm ssl.truststore.certificates ssl.truststore.location
ssl.truststore.password ssl.truststore.type transaction.timeout.ms transaction.two.phase.commit.enable
transactional.id value.serializer
""".split())
HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def schema(**cols: DataType) -> StructType:
    return StructType([StructField(n, t) for n, t in cols.items()])


def test_kafka_options_reach_the_producer_without_prefix() -> None:
    opts = parse_options({**BOOT, "topic": "t", "kafka.linger.ms": "20", "kafka.compression.type": "zstd",
                          "kprod.deliveryreport.path": "/tmp/r.jsonl", "checkpointlocation": "/tmp/cp"})
    assert opts.producer_config == {"bootstrap.servers": "127.0.0.1:9", "linger.ms": "20", "compression.type": "zstd",
                                     "batch.size": "1000000"}
    assert opts.topic == "t"
    assert opts.delivery_report_path == "/tmp/r.jsonl"


def test_sink_default_batch_size_yields_to_the_option() -> None:
    assert parse_options({**BOOT, "topic": "t"}).producer_config["batch.size"] == "1000000"
    assert parse_options({**BOOT, "topic": "t", "kafka.batch.size": "16384"}).producer_config["batch.size"] == "16384"


@pytest.mark.parametrize(("options", "names"), [
    ({}, ["kafka.bootstrap.servers", "required"]),
    ({**BOOT, "kafka.linger.ms": "soon"}, ["kafka.linger.ms", "integer"]),
    ({**BOOT, "kafka.acks": "2"}, ["kafka.acks", "all"]),
    ({**BOOT, "kafka.no.such.key": "1"}, ["kafka.no.such.key", "kafka.linger.ms"]),
    ({**BOOT, "kafka.value.serializer": "x"}, ["kafka.value.serializer", "'value' column"]),
    ({**BOOT, "kafka.bootstrap.servers": "nohost"}, ["kafka.bootstrap.servers", "host:port"]),
    ({**BOOT, "topic": "a b"}, ["topic", "valid Kafka topic name"]),
    ({**BOOT, "topics": "t"}, ["'topics'", "kprod.deliveryReport.path"]),
    ({**BOOT, "kprod.flush.timeout.ms": "-1"}, ["kprod.flush.timeout.ms", "positive"]),
    ({**BOOT, "kprod.deliveryguarantee": "twice"}, ["kprod.deliveryGuarantee", "exactly-once"]),
    ({**BOOT, "kprod.deliveryguarantee": "exactly-once"}, ["kprod.markerTopic", "'topic'"]),
    ({**BOOT, "topic": "t", "kprod.markertopic": "m"}, ["kprod.markerTopic", "exactly-once"]),
    ({**BOOT, "topic": "t", "kprod.deliveryguarantee": "exactly-once", "kafka.acks": "1"}, ["kafka.acks", "all"]),
    ({**BOOT, "kafka.transactional.id": "x"}, ["kafka.transactional.id", "kprod.deliveryGuarantee"]),
    ({**BOOT, "topic": "t", "kprod.deliveryguarantee": "exactly-once", "kafka.retries": "0",
      "kafka.enable.idempotence": "false", "kafka.max.in.flight.requests.per.connection": "6"},
     ["kprod.deliveryGuarantee=exactly-once conflicts with kafka.enable.idempotence=false", "kafka.retries=0",
      "kafka.max.in.flight.requests.per.connection=6 (transactions need an idempotent producer, whose "
      "max.in.flight.requests.per.connection must be at most 5)"]),
    ({**BOOT, "kprod.clustercheck": "maybe"}, ["kprod.clusterCheck", "true or false"]),
    ({**BOOT, "topic": "t", "kprod.deliveryguarantee": "exactly-once", "kprod.replaymatch": "keys"},
     ["kprod.replayMatch", "rows or tasks", "'keys'"]),
    ({**BOOT, "topic": "t", "kprod.replaymatch": "tasks"}, ["kprod.replayMatch", "exactly-once"]),
    ({**BOOT, "kafka.interceptor.classes": "com.acme.Audit"}, ["kafka.interceptor.classes", "change or drop records"]),
    ({**BOOT, "kafka.partitioner.class": "com.acme.MyPartitioner"},
     ["kafka.partitioner.class", "'com.acme.MyPartitioner'", "No module named 'com'", "module:function"]),
    ({**BOOT, "kafka.partitioner.class": "tests.spark.test_options:BOOT"}, ["kafka.partitioner.class", "not a callable"]),
])
def test_bad_options_name_the_option(options: dict[str, str], names: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_options(options)
    for name in names:
        assert name in str(err.value)


def test_extra_columns_are_dropped_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """Spark's Kafka sink ignores columns it does not write; so does kprod, in one line."""
    with caplog.at_level("WARNING", "spark_sink.spark.columns"):
        plan = plan_columns(schema(id=LongType(), value=StringType(), m=MapType(StringType(), StringType()),
                                   topic=StringType()), "t")
    assert plan.drop == (0, 2, 3)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "'id', 'm'" in line and "Spark's Kafka sink" in line


def test_jvm_only_keys_are_accepted_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Every key of Java's ProducerConfig (Kafka 4.3) is a producer setting, a JVM-only key
    (one warning on the driver saying what kprod does instead) or refused with a reason."""
    from spark_sink.producer import CONFIG_KEYS
    from spark_sink.spark.options import _REFUSED_PRODUCER_KEYS, JVM_ONLY_KEYS

    assert not JAVA_PRODUCER_KEYS - CONFIG_KEYS - JVM_ONLY_KEYS.keys() - _REFUSED_PRODUCER_KEYS.keys()
    options = {**BOOT, "topic": "t", "kafka.metric.reporters": "com.acme.Reporter",
               "kafka.client.dns.lookup": "use_all_dns_ips", "kafka.linger.ms": "20", "includeheaders": "true",
               "startingoffsets": "earliest"}
    with caplog.at_level("WARNING", "spark_sink.spark.options"):
        opts = parse_options(options)
    assert opts.producer_config == {"bootstrap.servers": "127.0.0.1:9", "linger.ms": "20", "batch.size": "1000000"}
    (line,) = [r.getMessage() for r in caplog.records]
    assert "kafka.client.dns.lookup (kprod tries each address" in line and "kafka.metric.reporters (kprod's metrics" in line


@pytest.mark.parametrize(("name", "spec"), [
    ("org.apache.kafka.clients.producer.RoundRobinPartitioner", "round-robin"),
    ("org.apache.kafka.clients.producer.internals.DefaultPartitioner", None),
    ("org.apache.kafka.clients.producer.UniformStickyPartitioner", None),
    ("tests.spark.partitioners:always_zero", "tests.spark.partitioners:always_zero"),
    ("tests.spark.partitioners.always_zero", "tests.spark.partitioners.always_zero"),
])
def test_partitioner_classes_map_to_kprods(name: str, spec: str | None) -> None:
    from spark_sink.producer import ProducerConfig

    config = ProducerConfig.from_dict(parse_options({**BOOT, "kafka.partitioner.class": name}).producer_config)
    assert config.partitioner_class == spec
    assert config.partitioner_ignore_keys == name.endswith("UniformStickyPartitioner")


def test_every_column_with_its_types_is_accepted() -> None:
    plan = plan_columns(schema(Key=BinaryType(), value=StringType(), topic=StringType(), partition=LongType(),
                               headers=HEADERS, timestamp=TimestampType()), None)
    assert plan.names == ("key", "value", "topic", "partition", "headers", "timestamp")
    assert plan.renamed and plan.drop == ()


def test_the_spark_columns_are_the_producers() -> None:
    """Spark only describes the producer's columns in its own types; the producer decides."""
    assert list(ACCEPTED) == list(ARROW_COLUMNS)
    string_headers = ArrayType(StructType([StructField("key", StringType()), StructField("value", StringType())]))
    plan = plan_columns(schema(value=BinaryType(), key=StringType(), partition=IntegerType(), headers=string_headers,
                               timestamp=TimestampNTZType()), "t")
    assert plan.names == ("value", "key", "partition", "headers", "timestamp") and not plan.renamed
    assert plan_columns(schema(value=StringType(), timestamp=LongType()), "t").drop == ()


def test_topic_option_overrides_the_topic_column() -> None:
    plan = plan_columns(schema(value=BinaryType(), topic=StringType()), "t")
    assert plan.drop == (1,)


@pytest.mark.parametrize(("cols", "topic", "names"), [
    (dict(key=StringType()), "t", ["'value' is required", "'key'"]),
    (dict(value=DoubleType()), "t", ["'value'", "double", "string or binary"]),
    (dict(value=StringType(), partition=StringType()), "t", ["'partition'", "int or bigint"]),
    (dict(value=StringType(), headers=ArrayType(StringType())), "t", ["'headers'", "array<struct<key: string"]),
    (dict(value=StringType(), timestamp=StringType()), "t", ["'timestamp'", "timestamp"]),
    (dict(value=StringType()), None, ["no topic", "'topic' option", "'topic' column"]),
    (dict(value=StringType(), VALUE=BinaryType()), "t", ["'value'", "'VALUE'"]),
    (dict(value=StringType(), key=MapType(StringType(), StringType())), "t", ["'key'", "map<string,string>"]),
    (dict(value=VariantType()), "t", ["'value'", "variant", "to_json"]),
    (dict(value=StringType(), topic=StringType(), TOPIC=StringType()), None, ["'topic'", "'TOPIC'"]),
])
def test_bad_columns_name_the_column_and_what_is_accepted(cols: dict[str, DataType], topic: str | None,
                                                          names: list[str]) -> None:
    with pytest.raises(ColumnError) as err:
        plan_columns(schema(**cols), topic)
    for name in names:
        assert name in str(err.value)


# Through Spark: the same errors stop the write at planning time, before any task runs.
# The bootstrap address is a closed port: a record sent would fail, not pass silently.

def _write(df: DataFrame, mode: str = "append", **options: str) -> None:
    writer = df.write.format("kprod").mode(mode)
    for k, v in {**BOOT, **options}.items():
        writer = writer.option(k, v)
    writer.save()


def test_spark_rejects_missing_topic(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match="no topic"):
        _write(df)


def test_spark_rejects_bad_producer_option(spark: SparkSession) -> None:
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match="kafka.batch.size"):
        _write(df, topic="t", **{"kafka.batch.size": "-5"})


def test_streaming_rejects_bad_column_at_start(spark: SparkSession, tmp_path: Path) -> None:
    df = spark.readStream.format("rate").load()  # columns timestamp, value (bigint)
    with pytest.raises(Exception, match=r"column 'value' has type bigint"):
        q = (df.writeStream.format("kprod").option("kafka.bootstrap.servers", "127.0.0.1:9")
             .option("topic", "t").option("checkpointLocation", str(tmp_path)).start())
        try:
            q.awaitTermination(60)
        finally:
            q.stop()


def _exactly_once(options: dict[str, str], streaming: bool = False) -> ExactlyOnce:
    """The exactly-once settings ``options`` ask for."""
    eo = parse_options(options, streaming=streaming).exactly_once
    assert eo is not None
    return eo


def test_exactly_once_prefix_comes_from_the_query_id_and_is_new_for_each_batch_write() -> None:
    eo = {**BOOT, "topic": "t", "kprod.deliveryguarantee": "exactly-once"}
    # A streaming query's prefix: from its id (kept in its checkpoint), however the
    # checkpoint is spelled, and with no checkpointLocation option at all.
    for checkpoint in ("/tmp/cp", "chk", "s3a://bucket/chk", None):
        options = {**eo, "checkpointlocation": checkpoint} if checkpoint else eo
        streaming = _exactly_once(options, streaming=True)
        assert streaming.prefix is None and streaming.marker_topic == "t"
        assert streaming.prefix_for("q-1") == streaming.prefix_for("q-1") != streaming.prefix_for("q-2")
    with pytest.raises(ConfigError, match="kprod.transactionalIdPrefix"):
        streaming.prefix_for(None)
    batch = _exactly_once(eo)
    assert batch.prefix and batch.one_write and batch.prefix != _exactly_once(eo).prefix
    assert batch.prefix_for(None) == batch.prefix
    named = _exactly_once({**eo, "kprod.transactionalidprefix": "orders", "kprod.markertopic": "m"}, streaming=True)
    assert named.prefix_for("q-1") == "orders" and named.marker_topic == "m"
    assert parse_options({**BOOT, "topic": "t"}).exactly_once is None


def test_the_cluster_check_is_bounded_and_can_be_skipped() -> None:
    assert parse_options({**BOOT, "topic": "t"}).check_timeout_ms == 15_000
    assert parse_options({**BOOT, "topic": "t", "kafka.max.block.ms": "2000"}).check_timeout_ms == 2000
    assert parse_options({**BOOT, "topic": "t", "kprod.clustercheck": "false"}).check_timeout_ms == 0
