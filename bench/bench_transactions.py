"""What a transaction costs under Kafka's transaction protocol v2 and v1, in one run.

    python bench/bench_transactions.py [--transactions 200] [--rounds 3]

Starts two local Apache Kafka nodes (kprod_broker): one as Kafka 4.x formats it
(transaction.version 2) and one formatted with transaction.version 1. Each round runs, on
each node in turn, ``--transactions`` small transactions of the two shapes kprod uses:

- *commit*: begin, one record to each of 3 partitions, offsets for one group,
  commit_transaction() (the producer's own transactions);
- *prepared*: begin, one record to each of 3 partitions, prepare_transaction(), then an
  AdminClient ends it (the exactly-once sink's task and driver), init_transactions()
  first as each of its tasks does.

Prints the best milliseconds per transaction of each shape on each protocol and the ratio
v2 / v1 (below 1: v2 is faster). The protocol each node speaks is checked first.
"""

from __future__ import annotations

import argparse
import time
import uuid

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.producer import KafkaProducer, ProducerRecord

PARTITIONS = 3


def _commit(bootstrap: str, topic: str, n: int) -> float:
    """Seconds for ``n`` committed transactions of one producer."""
    with KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                        "linger.ms": 0}) as producer:
        producer.init_transactions()
        started = time.perf_counter()
        for i in range(n):
            producer.begin_transaction()
            for p in range(PARTITIONS):
                producer.send(ProducerRecord(topic, b"v", partition=p))
            producer.send_offsets_to_transaction({(topic, 0): i}, "bench-group")
            producer.commit_transaction()
        return time.perf_counter() - started


def _prepared(bootstrap: str, topic: str, n: int) -> float:
    """Seconds for ``n`` transactions each initialised, prepared and ended by an AdminClient."""
    tid = f"bench-{uuid.uuid4().hex[:8]}"
    with KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 0}) as producer, \
            AdminClient({"bootstrap.servers": bootstrap}) as admin:
        started = time.perf_counter()
        for _ in range(n):
            producer.init_transactions()
            producer.begin_transaction()
            for p in range(PARTITIONS):
                producer.send(ProducerRecord(topic, b"v", partition=p))
            prepared = producer.prepare_transaction()
            admin.end_transactions([prepared], commit=True)
        return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--transactions", type=int, default=200, help="per shape, node and round (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds; the best is kept (default: %(default)s)")
    args = ap.parse_args()
    clusters = {"v2": KafkaCluster(1), "v1": KafkaCluster(1, features={"transaction.version": 1})}
    try:
        topic = "bench-txn"
        for version, cluster in clusters.items():
            cluster.create_topic(topic, PARTITIONS)
            with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
                admin.describe_transactions(["any"])  # connects: the protocol is known then
                spoken = admin.transaction_version
            if spoken != int(version[1]):
                raise SystemExit(f"the {version} node speaks transaction protocol v{spoken}")
            for shape in (_commit, _prepared):
                shape(cluster.bootstrap, topic, 10)  # connections and coordinators found first
        best: dict[tuple[str, str], float] = {}
        for r in range(args.rounds):
            for version, cluster in (clusters.items() if r % 2 == 0 else reversed(clusters.items())):
                for shape in (_commit, _prepared):
                    ms = shape(cluster.bootstrap, topic, args.transactions) / args.transactions * 1000
                    key = (shape.__name__.strip("_"), version)
                    best[key] = min(best.get(key, ms), ms)
                    print(f"round {r + 1}: {key[0]} on protocol {version}: {ms:.2f} ms per transaction", flush=True)
        print(f"\n{args.transactions} transactions per shape, node and round; best of {args.rounds} round(s)")
        for shape in ("commit", "prepared"):
            v2, v1 = best[(shape, "v2")], best[(shape, "v1")]
            print(f"  {shape:9} v2 {v2:6.2f} ms   v1 {v1:6.2f} ms   v2 / v1 {v2 / v1:.2f}x")
    finally:
        for cluster in clusters.values():
            cluster.stop()


if __name__ == "__main__":
    main()
