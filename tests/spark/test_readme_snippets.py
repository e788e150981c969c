"""The README's snippets (and the producer doc's transactions snippet), run as written.

Each is read from the document under its heading, so an edit that breaks a snippet fails
here. The only changes made to run them in the suite: ``127.0.0.1:9092`` becomes the
suite's broker, the topics get names of their own (the suite's broker is shared), the
checkpoint goes to a temporary directory, and the stream runs until a microbatch with rows
is committed rather than for 10 s (on a loaded machine the first may take longer). What
the snippets wrote is read back with an independent client (confluent-kafka).
"""

from __future__ import annotations

import contextlib
import io
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import consume_all

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

pytestmark = pytest.mark.jvm

ROOT = Path(__file__).resolve().parents[2]


def snippet(document: str, heading: str) -> str:
    """The first ```python block after ``heading`` in ``document``."""
    text = (ROOT / document).read_text()
    start = text.index(f"\n{heading}\n")
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found, f"no python block under {heading!r} in {document}"
    return found.group(1)


def run(code: str, substitutions: dict[str, str], **names: object) -> str:
    """Runs ``code`` with ``substitutions`` made (each must occur) and ``names`` defined,
    returning what it printed."""
    for old, new in substitutions.items():
        assert old in code, f"the snippet no longer contains {old!r}"
        code = code.replace(old, new)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__", **names})
    return printed.getvalue()


def test_the_producer_in_ten_lines(kafka: KafkaCluster) -> None:
    topic = f"readme-producer-{uuid.uuid4().hex[:8]}"
    printed = run(snippet("README.md", "### The producer in ten lines"),
                  {"127.0.0.1:9092": kafka.bootstrap, '"events"': repr(topic)})
    assert printed.startswith("2 {"), printed  # records, then the offset ranges
    values = sorted(m.value() for m in consume_all(kafka.bootstrap, topic, 3, settle=0.5))
    assert values == [b"one", b"two", b"value"]


def wait_for_rows(query: StreamingQuery, timeout: float = 180.0) -> None:
    """Until a microbatch with rows is committed (the query's progress counts them)."""
    deadline = time.monotonic() + timeout
    while not any(p["numInputRows"] for p in query.recentProgress):
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, "no microbatch with rows committed"
        time.sleep(0.5)


def test_the_sink_in_ten_lines(kafka: KafkaCluster, spark: SparkSession, tmp_path: Path) -> None:
    topic = f"readme-sink-{uuid.uuid4().hex[:8]}"
    run(snippet("README.md", "### The sink in ten lines"),
        {"127.0.0.1:9092": kafka.bootstrap, '"events"': repr(topic),
         "/tmp/kprod-quickstart-checkpoint": str(tmp_path / "checkpoint"),
         "query.awaitTermination(10)": "wait_for_rows(query)"}, wait_for_rows=wait_for_rows)
    records = consume_all(kafka.bootstrap, topic, 1001, settle=0.5)
    keys = {m.key() for m in records if m.key() is not None}
    assert keys == {str(i).encode() for i in range(1000)}  # the batch write, every row once
    assert len(records) > 1000  # and the stream wrote too


def test_the_transactions_snippet(kafka: KafkaCluster) -> None:
    suffix = uuid.uuid4().hex[:8]
    topic, source = f"readme-orders-{suffix}", f"readme-input-{suffix}"
    run(snippet("docs/producer.md", "## Transactions"),
        {"127.0.0.1:9092": kafka.bootstrap, '"orders"': repr(topic), '"input"': repr(source),
         '"orders-7"': repr(f"readme-{suffix}")})
    records = consume_all(kafka.bootstrap, topic, 3, settle=0.5, overrides={"isolation.level": "read_committed"})
    assert sorted(m.value() for m in records) == [b"...", b"one", b"two"]


def test_the_value_formats_snippet(kafka: KafkaCluster, spark: SparkSession, schema_registry: str) -> None:
    from decimal import Decimal

    from tests.spark.test_formats_sink import _decode

    topic = f"readme-orders-{uuid.uuid4().hex[:8]}"
    run(snippet("README.md", "## Value formats: Avro and JSON Schema"),
        {"127.0.0.1:9092": kafka.bootstrap, '"orders"': repr(topic),
         "http://127.0.0.1:8081/apis/ccompat/v7": schema_registry})
    [record] = consume_all(kafka.bootstrap, topic, 1, settle=0.5)
    [value] = _decode(schema_registry, "avro", [record])
    assert record.key() == b"1"
    assert value["order_id"] == 1 and value["customer"] == {"name": "Ada", "country": "UK"}
    assert value["amount"] == Decimal("12.50")
