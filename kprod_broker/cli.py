"""kprod-broker: a local Apache Kafka (one KRaft node) for development.

    kprod-broker [--port 9092] [--partitions 6] [--kafka-version 4.3.1] [--no-auto-create-topics]
                 [--registry-port 8081]

Listens on 127.0.0.1, on --port (a taken port is refused, naming it) or else a free port.
Prints the node's bootstrap address on stdout (one line, for scripts), what it is on
stderr, and runs until Ctrl-C (or SIGTERM), which stops the JVM and deletes its data.
Topics are created on first use, unless --no-auto-create-topics (as on most production
clusters: writing to a topic nobody created is then an error). The jars are fetched once into ~/.cache/kprod.
With --registry-port, a Schema Registry (Apicurio, Confluent's REST API, in memory; 142 MB
fetched once) runs beside it on that port, its URL printed on a second line.
"""

from __future__ import annotations

import argparse
import signal
import sys

from kprod_broker.cluster import check_port_free, start_local_kafka
from kprod_broker.jars import KAFKA_VERSION, KafkaUnavailableError
from kprod_broker.registry import APICURIO_VERSION, start_local_registry


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
    parser.add_argument("--registry-port", type=int, default=None, metavar="PORT",
                        help="also run a Schema Registry on 127.0.0.1:PORT, e.g. 8081 (its URL is printed)")
    args = parser.parse_args(argv)
    if args.partitions < 1:
        parser.error(f"--partitions must be at least 1, got {args.partitions}")
    for option, port in (("--port", args.port), ("--registry-port", args.registry_port)):
        if port is not None and not 0 < port < 65536:
            parser.error(f"{option} must be a TCP port, 1 to 65535, got {port}")

    # This process is the command, not a library: SIGTERM stops it as Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if args.registry_port is not None:
            check_port_free(args.registry_port)  # said before Kafka starts
        cluster = start_local_kafka(partitions=args.partitions, heap=args.heap, version=args.kafka_version,
                                    config={"auto.create.topics.enable": str(args.auto_create).lower()},
                                    port=args.port)
    except KafkaUnavailableError as exc:
        print(f"kprod-broker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    registry = None
    try:
        if args.registry_port is not None:
            registry = start_local_registry(port=args.registry_port)
        print(cluster.bootstrap, flush=True)
        if registry is not None:
            print(registry.url, flush=True)
            print(f"kprod-broker: a Schema Registry (Apicurio {APICURIO_VERSION}) at {registry.url}", file=sys.stderr)
        topics = (f"topics are created on first use with {args.partitions} partitions" if args.auto_create
                  else "topics are not created on first use (create them first)")
        print(f"kprod-broker: Apache Kafka {args.kafka_version} (one KRaft node) at {cluster.bootstrap}; "
              f"{topics}; Ctrl-C stops it",
              file=sys.stderr, flush=True)
        code = cluster.nodes[0].wait()
        print(f"kprod-broker: Kafka exited with code {code}; its log ends:\n{cluster.nodes[0].log_tail()}",
              file=sys.stderr)
        return 1
    except KafkaUnavailableError as exc:  # the registry's (RegistryServerError)
        print(f"kprod-broker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kprod-broker: stopping", file=sys.stderr, flush=True)
        return 0
    finally:
        if registry is not None:
            registry.stop()
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
