"""The version matrix, left out of the default run (``make versions``, ``pytest -m versions``).

- The sink's batch and streaming round trips on each PySpark that ``pip install
  'kprod[spark]'`` can give a user, each in a virtualenv of its own (PySpark from PyPI,
  kprod editable, the rest shared with this venv).
- The producer's round trip (``send`` and ``send_arrow``) and transactions (one
  committed, one aborted) on the Kafka lines users still run beside 4.x, in KRaft mode.

Everything is read back with confluent-kafka from this process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, create_topic, start_kafka, subprocess_env, unique_topic

pytestmark = pytest.mark.versions

PYSPARK = ["4.1.4", "4.2.1", "4.3.0"]  # the newest of each line on PyPI
KAFKA = ["3.9.2", "3.6.2"]
ROWS = 1000
ROUNDTRIP = Path(__file__).resolve().parent / "spark" / "version_roundtrip.py"


def _spark_python(where: Path, version: str) -> Path:
    """A venv with kprod (editable) and PySpark ``version`` (with the py4j it pins)."""
    from tests.installs import venv_with_kprod

    python = venv_with_kprod(where, "editable")
    # --ignore-installed: the shared dependencies' PySpark is visible through the path
    # line; the venv's own copy comes first on sys.path.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--ignore-installed",
                    f"pyspark=={version}"], check=True, capture_output=True)
    return python


@pytest.mark.parametrize("version", PYSPARK)
def test_sink_round_trips_on_pyspark(version, kafka, tmp_path):
    python = _spark_python(tmp_path / "venv", version)
    batch = create_topic(kafka.bootstrap, unique_topic(f"v{version}-batch"), 2)
    stream = create_topic(kafka.bootstrap, unique_topic(f"v{version}-stream"), 2)
    env = {**subprocess_env(), "PYSPARK_PYTHON": str(python), "PYSPARK_DRIVER_PYTHON": str(python)}
    done = subprocess.run([str(python), str(ROUNDTRIP), kafka.bootstrap, batch, stream, str(ROWS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == version
    for topic in (batch, stream):
        messages = consume_all(kafka.bootstrap, topic, ROWS, settle=0.5)
        assert sorted(int(m.value()) for m in messages) == list(range(ROWS)), topic
        assert all(m.key() == m.value() for m in messages)


@pytest.fixture(scope="module", params=KAFKA)
def old_kafka(request) -> Iterator[KafkaCluster]:
    cluster = start_kafka(version=request.param)
    yield cluster
    cluster.stop()


def test_producer_round_trip_and_transactions_on_kafka(old_kafka):
    bootstrap = old_kafka.bootstrap
    topic = create_topic(bootstrap, unique_topic(f"k{old_kafka.version}"), 3)
    with KafkaProducer({"bootstrap.servers": bootstrap, "compression.type": "lz4"}) as producer:
        futures = [producer.send(ProducerRecord(topic, b"r%d" % i, key=b"k%d" % i)) for i in range(100)]
        table = pa.table({"key": [b"a%d" % i for i in range(100)], "value": [b"a%d" % i for i in range(100)]})
        assert producer.send_arrow(table, topic=topic).result(60).records == 100
        assert all(f.result(60).offset >= 0 for f in futures)
    values = sorted(m.value() for m in consume_all(bootstrap, topic, 200, settle=0.3))
    assert values == sorted([b"r%d" % i for i in range(100)] + [b"a%d" % i for i in range(100)])

    txn_topic = create_topic(bootstrap, unique_topic(f"t{old_kafka.version}"), 2)
    with KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": unique_topic("txn")}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(ProducerRecord(txn_topic, b"aborted"))
        producer.flush()  # on the broker, so that its abort marker is what hides it
        producer.abort_transaction()
        producer.begin_transaction()
        for i in range(10):
            producer.send(ProducerRecord(txn_topic, b"committed-%d" % i))
        producer.commit_transaction()
    committed = consume_all(bootstrap, txn_topic, 10, settle=0.5, overrides={"isolation.level": "read_committed"})
    assert sorted(m.value() for m in committed) == sorted(b"committed-%d" % i for i in range(10))
