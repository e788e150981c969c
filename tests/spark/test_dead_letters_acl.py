"""A `topic` column naming a topic the principal may describe but not write, with
kprod.errors.tolerance=all, on a real Kafka with an authorizer (StandardAuthorizer) and a
local Spark: its rows (seeded positions and proportions) are dead letters with
TopicAuthorizationFailedError, the good rows arrive once, at-least-once and exactly-once
(the refusal comes before anything is sent, so the transaction commits), and the
driver's check does not refuse the write for it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kprod_broker import KafkaCluster
from tests.brokers import consume_to_marks, create_topic, deny_topic, unique_topic


# One case of each guarantee in the suite; the third in make soak (pytest -m soak).
@pytest.mark.parametrize(("guarantee", "seed"), [("at-least-once", 0), ("exactly-once", 1),
                                                 pytest.param("exactly-once", 2, marks=pytest.mark.soak)])
def test_rows_for_a_topic_the_principal_may_not_write_are_dead_letters(spark: SparkSession, acl_kafka: KafkaCluster,
                                                                       tmp_path: Path, guarantee: str, seed: int) -> None:
    bootstrap = acl_kafka.bootstrap
    rng = random.Random(seed)
    good_topic = create_topic(bootstrap, unique_topic("acl-good"), 3)
    denied = create_topic(bootstrap, unique_topic("acl-denied"), 2)
    dead_topic = create_topic(bootstrap, unique_topic("acl-dlq"), 2)
    deny_topic(bootstrap, denied, "WRITE")
    n = rng.choice([50, 800, 3000])
    share = rng.uniform(0.02, 0.7)
    denied_rows = {i for i in range(n) if rng.random() < share} | {rng.randrange(n)}
    df = spark.range(n).repartition(rng.choice([1, 3])).select(
        F.col("id").cast("string").alias("key"), F.concat(F.lit("row-"), F.col("id").cast("string")).alias("value"),
        F.when(F.col("id").isin(sorted(denied_rows)), F.lit(denied)).otherwise(F.lit(good_topic)).alias("topic"))
    report = tmp_path / "report.jsonl"
    options = {"kafka.bootstrap.servers": bootstrap, "kprod.errors.tolerance": "all",
               "kprod.errors.deadLetterTopic": dead_topic, "kprod.deliveryReport.path": str(report),
               "kprod.deliveryGuarantee": guarantee}
    if guarantee == "exactly-once":
        options["kprod.markerTopic"] = good_topic
    df.write.format("kprod").options(**options).mode("append").save()

    overrides = {"isolation.level": "read_committed"} if guarantee == "exactly-once" else None
    good = sorted(set(range(n)) - denied_rows)
    got = consume_to_marks(bootstrap, good_topic, overrides=overrides)
    assert sorted(m.value() for m in got) == sorted(b"row-%d" % i for i in good)
    letters = consume_to_marks(bootstrap, dead_topic, overrides=overrides)
    assert sorted(int(m.key()) for m in letters) == sorted(denied_rows)
    for m in letters:
        headers = {k: v.decode() for k, v in m.headers()}
        assert headers["kprod.errors.class"] == "TopicAuthorizationFailedError", headers
        assert headers["kprod.errors.topic"] == denied
        assert "not write" in headers["kprod.errors.message"]
        assert m.value() == b"row-%s" % m.key()
    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert sum(line["refusedRows"].get("TopicAuthorizationFailedError", 0) for line in lines) == len(denied_rows)
    assert sum(line["records"] for line in lines) == len(good)
