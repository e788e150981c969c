"""A fresh process with kprod installed from its wheel encodes without compiling: the
wheel carries the compiled kernels, and they load on any machine of the architecture."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

from tests.brokers import consume_all, create_topic, unique_topic
from tests.installs import venv_with_kprod

_SCRIPT = textwrap.dedent("""
    import json, sys
    import pyarrow as pa
    from spark_sink import KafkaProducer
    from spark_sink.protocol import kernels
    from spark_sink.protocol.columnar import HEADER_TYPE
    n = 1000
    table = pa.table({"key": [b"k%d" % i for i in range(n)], "value": [b"v" * 100] * n,
                      "headers": pa.array([[{"key": "h", "value": b"x"}]] * n, HEADER_TYPE)})
    with KafkaProducer({"bootstrap.servers": sys.argv[1]}) as producer:
        producer.send_arrow(table, sys.argv[2]).result(60)
    print(json.dumps({name: [sum(getattr(kernels, name).stats.cache_hits.values()),
                             sum(getattr(kernels, name).stats.cache_misses.values())]
                      for name in ("write_records", "plan_batches", "murmur2_rows", "header_sizes")}))
""")


def test_a_fresh_process_loads_the_wheels_compiled_kernels(kafka, tmp_path, kprod_wheel):
    python = venv_with_kprod(tmp_path / "venv", kprod_wheel)
    topic = create_topic(kafka.bootstrap, unique_topic("cold"), 2)
    home = tmp_path / "home"  # no per-user cache of any kind
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHONPATH", "KPROD_CACHE"))}
    done = subprocess.run([str(python), "-c", _SCRIPT, kafka.bootstrap, topic], cwd=home,
                          env={**env, "HOME": str(home)}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(hits >= 1 and misses == 0 for hits, misses in stats.values()), stats  # loaded, none compiled
    assert len(consume_all(kafka.bootstrap, topic, 1000)) == 1000
