"""kprod leaves its host process alone: after a send_arrow, the program's own numba code
compiles for the host's CPU, no environment variable is set, and an installed wheel
encodes with its compiled loops, writing nothing into site-packages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from kprod_broker import KafkaCluster
from tests.brokers import consume_all, create_topic, unique_topic
from tests.installs import venv_with_kprod

_SEND = """
import json, os, sys
import pyarrow as pa
import spark_sink
from spark_sink import KafkaProducer
from spark_sink.encoder.columnar import HEADER_TYPE
seen = {"after import": os.environ.get("NUMBA_CPU_NAME")}
n = 1000
table = pa.table({"key": [b"k%d" % i for i in range(n)], "value": [b"v" * 100] * n,
                  "headers": pa.array([[{"key": "h", "value": b"x"}]] * n, HEADER_TYPE)})
with KafkaProducer({"bootstrap.servers": sys.argv[1]}) as producer:
    producer.send_arrow(table, sys.argv[2]).result(60)
seen["after send_arrow"] = os.environ.get("NUMBA_CPU_NAME")
seen["numba imported"] = "numba" in sys.modules
"""

_USER_NUMBA = """
import llvmlite.binding as ll
import numpy as np
from numba import config, njit
from numba.core.registry import cpu_target

@njit
def user_sum(a):
    total = 0.0
    for x in a:
        total += x
    return total

user_sum(np.ones(64))
codegen = cpu_target.target_context.codegen()
seen["env"] = {k: v for k, v in os.environ.items() if k.startswith("NUMBA_")}
seen["config"] = [config.CPU_NAME, config.CPU_FEATURES]
seen["cpu"] = [codegen._get_host_cpu_name(), ll.get_host_cpu_name()]
seen["features"] = [codegen._tm_features, ll.get_host_cpu_features().flatten()]
"""


def _run(python: Path | str, script: str, kafka: KafkaCluster, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    topic = create_topic(kafka.bootstrap, unique_topic("host"), 2)
    done = subprocess.run([str(python), "-c", script + "\nprint(json.dumps(seen))", kafka.bootstrap, topic],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(consume_all(kafka.bootstrap, topic, 1000)) == 1000
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_user_numba_code_compiled_after_kprod_gets_the_host_cpu(kafka: KafkaCluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    seen = _run(sys.executable, _SEND + _USER_NUMBA, kafka, tmp_path, env)
    assert seen["after import"] is None and seen["after send_arrow"] is None
    assert not seen["numba imported"]  # this checkout's compiled extension encoded
    assert seen["env"] == {} and seen["config"] == [None, None]
    host_cpu = seen["cpu"][1]
    assert seen["cpu"] == [host_cpu, host_cpu] and host_cpu != "generic"
    assert seen["features"][0] == seen["features"][1] != ""


def test_a_wheel_install_encodes_with_its_compiled_loops_and_writes_nothing(kafka: KafkaCluster, tmp_path: Path,
                                                                            kprod_wheel: Path) -> None:
    python = venv_with_kprod(tmp_path / "venv", kprod_wheel)
    package = Path(subprocess.run([str(python), "-c", "import spark_sink; print(spark_sink.__path__[0])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    installed = sorted(package.rglob("*"))
    assert any(p.name.startswith("_kernels.") and p.suffix == ".so" for p in installed)
    home = tmp_path / "home"  # no per-user cache of any kind
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONPATH"))}
    seen = _run(python, textwrap.dedent(_SEND), kafka, home, {**env, "HOME": str(home)})
    assert seen == {"after import": None, "after send_arrow": None, "numba imported": False}
    assert sorted(package.rglob("*")) == installed  # nothing written into site-packages
    assert list(home.iterdir()) == []


def _every_column(first: str, second: str) -> bytes:
    """1000 rows with every column send_arrow takes, nulls in each, as an Arrow stream."""
    import pyarrow as pa

    from spark_sink.encoder.columnar import HEADER_TYPE

    n = 1000
    table = pa.table({
        "key": [None if i % 3 == 0 else b"k%d" % i for i in range(n)],
        "value": [b"v" * 10_000] * n,  # 10 MB: encoded in two chunks
        "topic": [None if i % 2 else second for i in range(n)],
        "partition": pa.array([None if i % 5 else i % 2 for i in range(n)], pa.int32()),
        "timestamp": pa.array([None if i % 7 == 0 else 1_700_000_000_000 + i for i in range(n)], pa.int64()),
        "headers": pa.array([None if i % 4 == 0 else [{"key": "h", "value": b"x"}] for i in range(n)], HEADER_TYPE),
    })
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as stream:
        stream.write_table(table)
    return sink.getvalue().to_pybytes()


# As a Spark Python worker runs it: an Arrow stream in, send_arrow, nothing else.
_SEND_STREAM = """
import json, sys
import pyarrow as pa
from spark_sink import KafkaProducer
table = pa.ipc.open_stream(sys.stdin.buffer.read()).read_all()
with KafkaProducer({"bootstrap.servers": sys.argv[1]}) as producer:
    producer.send_arrow(table, sys.argv[2]).result(60)
print(json.dumps(sorted(name for name in ("pandas", "numba") if name in sys.modules)))
"""


def test_send_arrow_with_every_column_imports_no_pandas(kafka: KafkaCluster, tmp_path: Path) -> None:
    """pyarrow's to_numpy imports pandas: a third of a second of CPU in every fresh Spark
    Python worker's first write, for nothing. Every path of send_arrow (keys with nulls,
    sticky and explicit partitions, a topic column, null timestamps and headers, more than
    one chunk) reads Arrow buffers itself."""
    first, second = (create_topic(kafka.bootstrap, unique_topic("nopandas"), 2) for _ in range(2))
    done = subprocess.run([sys.executable, "-c", _SEND_STREAM, kafka.bootstrap, first], input=_every_column(first, second),
                          cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:].decode()
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    for topic in (first, second):
        assert len(consume_all(kafka.bootstrap, topic, 500)) == 500
