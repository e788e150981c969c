"""The sink benchmark against librdkafka's mock cluster instead of the embedded Tansu broker.

    python bench/bench_sink_mock.py [any jobs/bench_sink.py option but --bootstrap-servers]

On a small machine the broker shares the cores with Spark and the writers, so the sink
benchmark partly measures the broker: Tansu spends ~0.36 s of CPU per million 110-byte
records (mostly the kernel faulting in memory for its store), the mock cluster ~0.04 s.
Run against the mock, the same benchmark shows what the writers themselves cost. The
mock cluster is librdkafka's (confluent-kafka, a dev dependency): three brokers in one
child process, records kept in memory, acks=all honoured; it is the test suite's second
broker (tests/brokers.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.brokers import create_topic, start_mock_cluster  # noqa: E402


def main(argv: list[str]) -> int:
    if any(a.startswith("--bootstrap-servers") for a in argv):
        sys.exit("bench_sink_mock.py starts its own broker: leave out --bootstrap-servers")
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--topic", default="kprod-bench")
    parser.add_argument("--partitions", type=int, default=6)
    known, _ = parser.parse_known_args(argv)
    with start_mock_cluster() as broker:
        for name in (known.topic, f"{known.topic}-confluent", f"{known.topic}-producer"):  # bench_sink.py's topics
            create_topic(broker.bootstrap, name, known.partitions)
        print(f"librdkafka mock cluster (3 brokers) at {broker.bootstrap}", flush=True)
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        return subprocess.run([sys.executable, str(ROOT / "jobs" / "bench_sink.py"), "--bootstrap-servers",
                               broker.bootstrap, *argv], env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
