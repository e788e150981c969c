"""kprod-broker: a local Apache Kafka (one KRaft node) for development.

    kprod-broker [--port 9092] [--partitions 6] [--kafka-version 4.3.1] [--no-auto-create-topics]

Listens on 127.0.0.1, on --port (a taken port is refused, naming it) or else a free port.
Prints the node's bootstrap address on stdout (one line, for scripts), what it is on
stderr, and runs until Ctrl-C (or SIGTERM), which stops the JVM and deletes its data.
Topics are created on first use, unless --no-auto-create-topics (as on most production
clusters: writing to a topic nobody created is then an error). The jars are fetched once into ~/.cache/kprod.
"""

from __future__ import annotations

import argparse
import signal
import sys

from kprod_broker.cluster import start_local_kafka
from kprod_broker.jars import KAFKA_VERSION, KafkaUnavailableError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kprod-broker", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--port", type=int, default=None,
                        help="the plain listener's port on 127.0.0.1, e.g. 9092 (default: a free port)")
    parser.add_argument("--partitions", type=int, default=6,
                        help="partitions of topics created on first use (default: %(default)s)")
    parser.add_argument("--kafka-version", default=KAFKA_VERSION, metavar="VERSION",
                        help="Apache Kafka release, 3.6 or newer (default: %(default)s)")
    parser.add_argument("--heap", default="1g", help="the JVM's heap (default: %(default)s)")
    parser.add_argument("--no-auto-create-topics", dest="auto_create", action="store_false",
                        help="the broker creates no topic on first use (auto.create.topics.enable=false)")
    args = parser.parse_args(argv)
    if args.partitions < 1:
        parser.error(f"--partitions must be at least 1, got {args.partitions}")
    if args.port is not None and not 0 < args.port < 65536:
        parser.error(f"--port must be a TCP port, 1 to 65535, got {args.port}")

    # This process is the command, not a library: SIGTERM stops it as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cluster = start_local_kafka(partitions=args.partitions, heap=args.heap, version=args.kafka_version,
                                    config={"auto.create.topics.enable": str(args.auto_create).lower()},
                                    port=args.port)
    except KafkaUnavailableError as exc:
        print(f"kprod-broker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    try:
        print(cluster.bootstrap, flush=True)
        topics = (f"topics are created on first use with {args.partitions} partitions" if args.auto_create
                  else "topics are not created on first use (create them first)")
        print(f"kprod-broker: Apache Kafka {args.kafka_version} (one KRaft node) at {cluster.bootstrap}; "
              f"{topics}; Ctrl-C stops it",
              file=sys.stderr, flush=True)
        code = cluster.nodes[0].wait()
        print(f"kprod-broker: Kafka exited with code {code}; its log ends:\n{cluster.nodes[0].log_tail()}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kprod-broker: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
