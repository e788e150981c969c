"""Local Apache Kafka for kprod's tests, demo, jobs and benchmarks, and for development
(``kprod-broker``): KRaft nodes on loopback, their jars fetched with PySpark's Ivy; and a
local Schema Registry (Apicurio, fetched the same way).

Shipped beside ``spark_sink`` but not part of it: nothing here is needed to talk to a
cluster you already run.
"""

from kprod_broker.cluster import KafkaCluster, KafkaNode, Listener, free_port, running_kafka, start_local_kafka
from kprod_broker.jars import (
    KAFKA_VERSION,
    KafkaUnavailableError,
    cache_dir,
    java,
    kafka_classpath,
    kafka_clients_jar,
    maven_archive,
    maven_jars,
    spark_avro_jars,
    spark_kafka_jars,
)
from kprod_broker.registry import APICURIO_VERSION, LocalRegistry, RegistryServerError, start_local_registry
from kprod_broker.tls import TlsFiles, make_tls_files, ssl_listener_config

__all__ = [
    "APICURIO_VERSION", "KAFKA_VERSION", "KafkaCluster", "KafkaNode", "KafkaUnavailableError", "Listener",
    "LocalRegistry", "RegistryServerError", "TlsFiles", "cache_dir", "free_port", "java", "kafka_classpath",
    "kafka_clients_jar", "make_tls_files", "maven_archive", "maven_jars", "running_kafka", "spark_avro_jars",
    "spark_kafka_jars", "ssl_listener_config", "start_local_kafka", "start_local_registry",
]
