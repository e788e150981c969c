"""Attacks on the README's promises about bad rows (kprod.errors.*), on real Kafka: every
kind of bad row the README lists mixed with good rows at seeded random positions, batch
and streaming, at-least-once and exactly-once, and shapes chosen to hurt. Each test reads
back with an independent client (confluent-kafka; read_committed under exactly-once): the
good rows where they belong (once), each bad row once in the dead-letter topic with the
README's headers, and the delivery report's counts matching."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, start_kafka, unique_topic

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_REQUEST = 100_000  # kafka.max.request.size of these writes
SMALL_TOPIC_LIMIT = 3_000  # max.message.bytes of the small topic
ROW_SCHEMA = "key string, value string, topic string, partition int, headers array<struct<key: string, value: binary>>"
README_HEADERS = ("topic", "class", "message", "stage.id", "task.id", "timestamp")

# Each kind of bad row: the error class the README's reasons come out as.
KINDS = {
    "request": "RecordTooLargeError",     # larger than max.request.size
    "topic_limit": "RecordTooLargeError",  # larger than its topic's max.message.bytes
    "missing": "UnknownTopicError",        # a topic column naming a topic that does not exist
    "invalid": "InvalidTopicException",    # ... a name Kafka refuses
    "null_topic": "ColumnError",           # a null topic and no topic option
    "partition": "InvalidPartitionError",  # a partition its topic does not have
}
INVALID_NAMES = ("bad topic!", "..", "x" * 250, "é")


def create_topic_with(bootstrap: str, name: str, partitions: int, config: dict[str, str]) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])[name].result(30)
    return create_topic_wait(bootstrap, name)


def create_topic_wait(bootstrap: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for _ in range(300):
        t = admin.list_topics(name, timeout=10).topics.get(name)
        if t and t.error is None and t.partitions and all(p.leader >= 0 for p in t.partitions.values()):
            return name
        import time
        time.sleep(0.1)
    raise AssertionError(f"topic {name} has no leaders")


@pytest.fixture(scope="module")
def attack_kafka() -> Iterator[KafkaCluster]:
    """One node as production clusters run: no topic created on first use, and Kafka's
    authorizer (allowing what no ACL denies: ``tests.brokers.deny_topic``)."""
    cluster = start_kafka(config={
        "auto.create.topics.enable": "false",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"})
    yield cluster
    cluster.stop()


@dataclass
class Topics:
    """The topics of one attack: good rows to ``good`` (3 partitions) and ``small`` (a low
    max.message.bytes), dead letters to ``dead``, and a name that does not exist."""

    good: str
    small: str
    dead: str
    missing: str = field(default_factory=lambda: unique_topic("missing"))

    @classmethod
    def create(cls, bootstrap: str) -> Topics:
        return cls(create_topic(bootstrap, unique_topic("good"), 3),
                   create_topic_with(bootstrap, unique_topic("small"), 2, {"max.message.bytes": str(SMALL_TOPIC_LIMIT)}),
                   create_topic(bootstrap, unique_topic("dead"), 2))


@dataclass
class Rows:
    """Rows to write and what each must become: ``good`` keys per topic, ``bad`` key -> kind."""

    rows: list[dict[str, object]]
    good: dict[str, set[str]]
    bad: dict[str, str]


def make_rows(rng: random.Random, n: int, topics: Topics, bad_share: float, kinds: tuple[str, ...] = tuple(KINDS),
              tag: str = "", headers: bool = True) -> Rows:
    """``n`` rows, each bad with probability ``bad_share`` (of a kind drawn from ``kinds``)."""
    rows: list[dict[str, object]] = []
    good: dict[str, set[str]] = {topics.good: set(), topics.small: set()}
    bad: dict[str, str] = {}
    for i in range(n):
        key = f"{tag}r{i}"
        row: dict[str, object] = {"key": key, "value": f"v{i}-" + "a" * rng.randrange(0, 50),
                                  "topic": rng.choice((topics.good, topics.small)), "partition": None,
                                  "headers": [{"key": "own", "value": key.encode()}] if headers and rng.random() < 0.3
                                  else None}
        if rng.random() < bad_share:
            kind = rng.choice(kinds)
            bad[key] = kind
            if kind == "request":
                row["value"] = "R" * rng.randrange(MAX_REQUEST + 1, MAX_REQUEST + 5000)
                row["topic"] = topics.good
            elif kind == "topic_limit":
                row["value"] = "L" * rng.randrange(SMALL_TOPIC_LIMIT + 1, 2 * SMALL_TOPIC_LIMIT)
                row["topic"] = topics.small
            elif kind == "missing":
                row["topic"] = topics.missing
            elif kind == "invalid":
                row["topic"] = rng.choice(INVALID_NAMES)
            elif kind == "null_topic":
                row["topic"] = None
            elif kind == "partition":
                row["topic"] = topics.good
                row["partition"] = rng.choice((3, 4, 1000, -2))
        else:
            if rng.random() < 0.2:
                row["partition"] = rng.randrange(3 if row["topic"] == topics.good else 2)
            good[str(row["topic"])].add(key)
        rows.append(row)
    return Rows(rows, good, bad)


def sink_options(bootstrap: str, topics: Topics, report: Path, **extra: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": bootstrap, "kafka.max.request.size": str(MAX_REQUEST),
            "kprod.errors.tolerance": "all", "kprod.errors.deadLetterTopic": topics.dead,
            "kprod.deliveryReport.path": str(report), **extra}


def read(bootstrap: str, topic: str, expected: int, committed: bool = False, settle: float = 1.0) -> list:
    overrides = {"isolation.level": "read_committed"} if committed else {}
    if expected == 0:
        return consume_all(bootstrap, topic, 0, timeout=settle + 1, settle=settle, overrides=overrides)
    return consume_all(bootstrap, topic, expected, timeout=60, settle=settle, overrides=overrides)


def headers_of(message) -> list[tuple[str, bytes]]:  # type: ignore[no-untyped-def]
    return list(message.headers() or [])


def check_good(bootstrap: str, rows: Rows, committed: bool = False) -> None:
    """Every good row once in its topic, nothing else there."""
    for topic, keys in rows.good.items():
        got = Counter(m.key().decode() for m in read(bootstrap, topic, len(keys), committed))
        dupes = {k: c for k, c in got.items() if c > 1}
        assert not dupes, f"good rows written twice to {topic}: {dupes}"
        assert set(got) == keys, (f"{topic}: missing {sorted(keys - set(got))[:5]}, "
                                  f"unexpected {sorted(set(got) - keys)[:5]}")


def check_dead_letters(bootstrap: str, topics: Topics, rows: Rows, committed: bool = False,
                       streaming: bool = False) -> list:
    """Every bad row once in the dead-letter topic, with the README's headers."""
    by_key = {str(r["key"]): r for r in rows.rows}
    messages = read(bootstrap, topics.dead, len(rows.bad), committed)
    got = Counter(m.key().decode() for m in messages)
    dupes = {k: c for k, c in got.items() if c > 1}
    assert not dupes, f"dead letters written twice: {dupes}"
    assert set(got) == set(rows.bad), (f"dead letters missing {sorted(set(rows.bad) - set(got))[:5]}, "
                                       f"unexpected {sorted(set(got) - set(rows.bad))[:5]}")
    for m in messages:
        key = m.key().decode()
        row, kind = by_key[key], rows.bad[key]
        hs = headers_of(m)
        ours = {k[len("kprod.errors."):]: v.decode() for k, v in hs if k.startswith("kprod.errors.")}
        own = [(k, v) for k, v in hs if not k.startswith("kprod.errors.")]
        assert own == [(h["key"], h["value"]) for h in row["headers"] or []], (key, hs)
        assert all(not k.startswith("kprod.errors.") for k, _ in hs[:len(own)]), f"row's own headers first: {hs}"
        # A row with no topic has no topic header.
        wanted = tuple(h for h in README_HEADERS if kind != "null_topic" or h != "topic") + (
            ("batch.id", "query.id") if streaming else ())
        assert set(wanted) <= set(ours), f"{kind} row {key}: headers {sorted(ours)} lack {set(wanted) - set(ours)}"
        assert ours["class"] == KINDS[kind], (kind, ours)
        if kind != "null_topic":
            assert ours["topic"] == row["topic"], (kind, ours["topic"], row["topic"])
        if kind in ("request", "topic_limit"):
            assert m.value() is None, f"a record too large keeps no value ({kind})"
        else:
            assert m.value() == str(row["value"]).encode(), (kind, key)
        if kind == "partition":
            assert ours["partition"] == str(row["partition"]), ours
    return messages


def report_lines(report: Path) -> list[dict]:
    return [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []


def check_report(lines: list[dict], rows: Rows, dead_letters: bool = True) -> None:
    """The report's counts, summed over its lines, match the rows."""
    records = sum(line["records"] for line in lines)
    refused: Counter[str] = Counter()
    for line in lines:
        refused.update(line["refusedRows"])
    assert records == sum(len(k) for k in rows.good.values()), lines
    assert dict(refused) == dict(Counter(KINDS[k] for k in rows.bad.values())), lines
    assert sum(line["deadLetters"] for line in lines) == (len(rows.bad) if dead_letters else 0), lines


# -- batch writes ----------------------------------------------------------------------------


def batch_write(spark: SparkSession, rows: Rows, options: dict[str, str], partitions: int) -> None:
    df = spark.createDataFrame(rows.rows, ROW_SCHEMA).repartition(partitions) if partitions > 2 else \
        spark.createDataFrame(rows.rows, ROW_SCHEMA).coalesce(partitions)
    df.write.format("kprod").mode("append").options(**options).save()


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
@pytest.mark.parametrize("seed", [1, 2])
def test_batch_random_mix(spark: SparkSession, attack_kafka: KafkaCluster, tmp_path: Path, guarantee: str,
                          seed: int) -> None:
    """Every kind of bad row at random positions and shares: good rows once, dead letters once."""
    rng = random.Random(seed)
    topics = Topics.create(attack_kafka.bootstrap)
    rows = make_rows(rng, rng.randrange(50, 300), topics, rng.choice((0.05, 0.3, 0.7)))
    report = tmp_path / "report.jsonl"
    extra = {"kprod.deliveryGuarantee": guarantee}
    if guarantee == "exactly-once":
        extra["kprod.markerTopic"] = topics.good
    batch_write(spark, rows, sink_options(attack_kafka.bootstrap, topics, report, **extra), rng.choice((1, 2, 5)))
    committed = guarantee == "exactly-once"
    check_good(attack_kafka.bootstrap, rows, committed)
    check_dead_letters(attack_kafka.bootstrap, topics, rows, committed)
    check_report(report_lines(report), rows)
