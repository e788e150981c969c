"""A fresh process's first send_arrow: seconds from the start of this script to the
result of one send_arrow of 1,000 keyed rows with a header, kprod imported, a producer
made and connected on the way. Run it in a new process each time, with the kprod under
test (a wheel installed in a fresh virtualenv, say), against a running broker:

    python bench/bench_first_send.py --bootstrap-servers 127.0.0.1:9092 [--topic first]
"""

from __future__ import annotations

import time

started = time.perf_counter()

import argparse  # noqa: E402
import os  # noqa: E402

import pyarrow as pa  # noqa: E402

from spark_sink import KafkaProducer  # noqa: E402

imported = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--topic", default="first")
    args = ap.parse_args()
    n = 1000
    headers = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    table = pa.table({"key": [b"k%d" % i for i in range(n)], "value": [b"v" * 100] * n,
                      "headers": pa.array([[{"key": "h", "value": b"x"}]] * n, headers)})
    with KafkaProducer({"bootstrap.servers": args.bootstrap_servers}) as producer:
        producer.send_arrow(table, args.topic).result(60)
        done = time.perf_counter()
    print(f"imports {imported - started:.3f} s, first send_arrow's result {done - started:.3f} s; "
          f"NUMBA_CPU_NAME={os.environ.get('NUMBA_CPU_NAME')}")


if __name__ == "__main__":
    main()
