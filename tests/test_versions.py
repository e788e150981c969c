"""The version matrix, left out of the default run (``make versions``, ``pytest -m versions``).

- The sink's batch and streaming round trips on each PySpark that ``pip install
  'kprod[spark]'`` can give a user, each in a virtualenv of its own (PySpark from PyPI,
  kprod editable, the rest shared with this venv).
- kprod's wheel on each CPython it supports (3.11, 3.12, 3.13; pyenv's or the PATH's):
  built by that interpreter from a copy of the checkout, installed with its ``spark`` and
  ``kerberos`` extras (no numba) into a fresh virtualenv, its compiled encoder the one the
  driver and Spark's Python workers load; the sink's round trips with that Python as
  PYSPARK_PYTHON, and (where a KDC can start) the producer over SASL_SSL with Kerberos
  and a JKS truststore.
- The producer's round trip (``send`` and ``send_arrow``) and transactions (one
  committed, one aborted) on the Kafka lines users still run beside 4.x, in KRaft mode.

Everything is read back with confluent-kafka from this process.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, create_topic, start_kafka, subprocess_env, unique_topic
from tests.installs import ROOT
from tests.producer.test_tls import _jks_stores
from tests.secure_kafka import KERBEROS_SERVICE, Kerberos, SecureKafka

pytestmark = pytest.mark.versions

PYSPARK = ["4.1.4", "4.2.1", "4.3.0"]  # the newest of each line on PyPI
KAFKA = ["3.9.2", "3.6.2"]
PYTHONS = ["3.11", "3.12", "3.13"]
ROWS = 1000
ROUNDTRIP = Path(__file__).resolve().parent / "spark" / "version_roundtrip.py"
KERBEROS_CLIENT = Path(__file__).resolve().parent / "kerberos_client.py"
C_ENCODER = "spark_sink.encoder._kernels"


def _round_trip(python: Path, kafka: KafkaCluster, name: str) -> dict:
    """version_roundtrip.py with ``python`` as the driver's and the workers' Python, run
    by path (not -m from the checkout, which would put the checkout's kprod first on
    sys.path); every row read back once. Its report (the last line)."""
    batch = create_topic(kafka.bootstrap, unique_topic(f"{name}-batch"), 2)
    stream = create_topic(kafka.bootstrap, unique_topic(f"{name}-stream"), 2)
    env = subprocess_env(str(python))
    done = subprocess.run([str(python), str(ROUNDTRIP), kafka.bootstrap, batch, stream, str(ROWS)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    for topic in (batch, stream):
        messages = consume_all(kafka.bootstrap, topic, ROWS, settle=0.5)
        assert sorted(int(m.value()) for m in messages) == list(range(ROWS)), topic
        assert all(m.key() == m.value() for m in messages)
    return json.loads(done.stdout.strip().splitlines()[-1])


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
def test_sink_round_trips_on_pyspark(version: str, kafka: KafkaCluster, tmp_path: Path) -> None:
    python = _spark_python(tmp_path / "venv", version)
    assert _round_trip(python, kafka, f"v{version}")["pyspark"] == version


def _interpreter(minor: str) -> str | None:
    """CPython ``minor`` (e.g. "3.12"): pyenv's newest build of it, else ``python3.12`` on
    PATH if it runs (a pyenv shim for a version not selected does not)."""
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    builds = sorted(glob.glob(f"{root}/versions/{minor}.*/bin/python{minor}"),
                    key=lambda p: [int(n) for n in Path(p).parts[-3].split(".") if n.isdigit()])
    for candidate in [*reversed(builds), shutil.which(f"python{minor}")]:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def _checkout_copy(where: Path) -> Path:
    """The checkout's files that git tracks or would track (uncommitted edits included),
    without build/, *.so or caches: a build from it compiles everything anew."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, where / name)
    return where


def _wheel_venv(interpreter: str, where: Path) -> Path:
    """A fresh venv of ``interpreter`` with the wheel that interpreter built, installed as
    the README's Install section does, with the spark and kerberos extras (dependencies
    from the package index). Returns its python."""
    source = _checkout_copy(where / "src")
    subprocess.run([interpreter, "-m", "venv", str(where / "venv")], check=True)
    python = where / "venv" / "bin" / "python"
    run = lambda *args: subprocess.run([str(python), "-m", "pip", *args], cwd=source, check=True,  # noqa: E731
                                       capture_output=True, text=True)
    run("install", "-q", "--upgrade", "pip")
    run("wheel", "-q", "--no-deps", "-w", "dist", ".")
    (wheel,) = (source / "dist").glob("kprod-*.whl")
    run("install", "-q", f"{wheel}[spark,kerberos]")
    return python


@pytest.fixture(scope="module", params=PYTHONS)
def wheel_python(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """(minor, python): a venv of CPython ``minor`` with the wheel that Python built."""
    minor = request.param
    interpreter = _interpreter(minor)
    if interpreter is None:
        if os.environ.get("CI"):
            pytest.fail(f"no Python {minor} for the version matrix", pytrace=False)
        pytest.skip(f"no Python {minor} (pyenv install {minor}, or python{minor} on PATH)")
    where = tmp_path_factory.mktemp(f"py{minor}")
    return minor, _wheel_venv(interpreter, where)


def test_wheel_on_python(wheel_python: tuple[str, Path], kafka: KafkaCluster, tmp_path: Path) -> None:
    """kprod's wheel built and used by CPython ``minor``: its compiled encoder loaded (numba
    is not even installed), batch and streaming writes through Spark with it as
    PYSPARK_PYTHON."""
    minor, python = wheel_python
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys, spark_sink; "
                            "print(sys.version_info[:2], importlib.util.find_spec('numba'), spark_sink.__file__)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True).stdout.split()
    assert probe[:3] == ["(3,", f"{minor.split('.')[1]})", "None"], probe
    assert probe[3].startswith(str(python.parents[1])), probe  # kprod from the wheel, not this checkout

    report = _round_trip(python, kafka, f"py{minor}")
    assert report["python"].startswith(f"{minor}.") and report["worker_python"].startswith(f"{minor}."), report
    assert report["driver_encoder"] == report["worker_encoder"] == C_ENCODER, report


def test_kerberos_and_jks_on_python(wheel_python: tuple[str, Path], secure_kafka: SecureKafka, kerberos: Kerberos,
                                    tmp_path: Path) -> None:
    """The same venv's producer over SASL_SSL with Kerberos (gssapi) and a JKS truststore
    (pyjks), each a dependency built or read differently on each Python."""
    minor, python = wheel_python
    truststore, _ = _jks_stores(secure_kafka.tls, tmp_path)
    topic = unique_topic(f"py{minor}-krb")
    config = {"bootstrap.servers": secure_kafka.bootstrap("KRBSSL"), "security.protocol": "SASL_SSL",
              "sasl.mechanism": "GSSAPI", "sasl.kerberos.service.name": KERBEROS_SERVICE,
              "sasl.jaas.config": kerberos.jaas(), "ssl.truststore.location": str(truststore),
              "ssl.truststore.password": "trust-secret"}
    done = subprocess.run([str(python), str(KERBEROS_CLIENT)], input=json.dumps([{"config": config, "topic": topic,
                                                                                  "count": 50}]),
                          env=kerberos.kdc.env(), cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    (result,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in result, result
    values = sorted(m.value() for m in consume_all(secure_kafka.cluster.bootstrap, topic, 50))
    assert values == sorted(b"krb-%d" % i for i in range(50))


@pytest.fixture(scope="module", params=KAFKA)
def old_kafka(request: pytest.FixtureRequest) -> Iterator[KafkaCluster]:
    cluster = start_kafka(version=request.param)
    yield cluster
    cluster.stop()


def test_producer_round_trip_and_transactions_on_kafka(old_kafka: KafkaCluster) -> None:
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
