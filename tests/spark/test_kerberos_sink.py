"""A job written for format("kafka") in a Java shop, run through Spark's own Kafka sink and
through kprod with the same options, changing only the format name (and ``.mode("append")``,
which both get here): SASL_SSL with SCRAM and with Kerberos (a keytab), a JKS truststore,
Java's RoundRobinPartitioner, columns beside key and value, and a dozen Java producer
keys, to Apache Kafka's own listeners and a MIT KDC on loopback (tests/secure_kafka.py);
confluent-kafka reads back the same records from both. A wrong principal fails kprod's
write on the driver.

The Spark application runs in a process of its own (tests/kerberos_spark_job.py) whose
KRB5_CONFIG names the test KDC's krb5.conf."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.brokers import consume_all, create_topic, subprocess_env, unique_topic
from tests.producer.test_tls import _jks_stores, needs_keytool
from tests.secure_kafka import JAAS, KERBEROS_SERVICE, USERS, Kerberos, SecureKafka

_ROOT = Path(__file__).resolve().parents[2]
ROWS, PARTITIONS = 400, 4
# What select("*") of an orders table brings: key and value, and columns both sinks ignore.
COLUMNS = ["CAST(id % 7 AS STRING) AS key", "to_json(named_struct('order', id, 'amount', id * 3)) AS value",
           "id", "CAST(id * 3 AS DOUBLE) AS amount",
           "TIMESTAMP '2026-01-01 00:00:00' + make_interval(0, 0, 0, 0, 0, 0, id) AS event_time"]
# A dozen keys of Java's ProducerConfig such jobs carry; the last three configure the JVM
# client only (kprod accepts them with one driver warning).
JAVA_KEYS = {"kafka.acks": "all", "kafka.enable.idempotence": "true", "kafka.linger.ms": "5",
             "kafka.batch.size": "65536", "kafka.compression.type": "lz4", "kafka.buffer.memory": "33554432",
             "kafka.max.in.flight.requests.per.connection": "5", "kafka.retries": "2147483647",
             "kafka.delivery.timeout.ms": "120000", "kafka.request.timeout.ms": "30000",
             "kafka.max.request.size": "1048576", "kafka.client.id": "orders-to-kafka",
             "kafka.ssl.endpoint.identification.algorithm": "https", "kafka.client.dns.lookup": "use_all_dns_ips",
             "kafka.ssl.enabled.protocols": "TLSv1.2,TLSv1.3", "kafka.metric.reporters": ""}


@needs_keytool
def test_a_format_kafka_job_writes_the_same_records_through_kprod(secure_kafka: SecureKafka, kerberos: Kerberos,
                                                                  tmp_path: Path) -> None:
    truststore, _ = _jks_stores(secure_kafka.tls, tmp_path)
    job = {"kafka.security.protocol": "SASL_SSL", "kafka.ssl.truststore.location": str(truststore),
           "kafka.ssl.truststore.password": "trust-secret",
           "kafka.partitioner.class": "org.apache.kafka.clients.producer.RoundRobinPartitioner", **JAVA_KEYS}
    logins = {
        "scram": {"kafka.bootstrap.servers": secure_kafka.bootstrap("SASLSSL"), "kafka.sasl.mechanism": "SCRAM-SHA-512",
                  "kafka.sasl.jaas.config": f'{JAAS["SCRAM-SHA-512"]} required username="spark" '
                                            f'password="{USERS["spark"]}";'},
        "kerberos": {"kafka.bootstrap.servers": secure_kafka.bootstrap("KRBSSL"), "kafka.sasl.mechanism": "GSSAPI",
                     "kafka.sasl.kerberos.service.name": KERBEROS_SERVICE, "kafka.sasl.jaas.config": kerberos.jaas()},
    }
    plain = secure_kafka.cluster.bootstrap
    topics = {(login, fmt): create_topic(plain, unique_topic(f"job-{login}-{fmt}"), PARTITIONS)
              for login in logins for fmt in ("kafka", "kprod")}
    writes = [{"format": fmt, "rows": ROWS, "columns": COLUMNS, "options": {**job, **logins[login], "topic": topic}}
              for (login, fmt), topic in topics.items()]
    wrong = {**job, **logins["kerberos"], "topic": topics["kerberos", "kprod"],
             "kafka.sasl.jaas.config": kerberos.jaas(principal="intruder")}
    writes.append({"rows": 5, "options": wrong})
    env = {**subprocess_env(), **{k: v for k, v in kerberos.kdc.env().items() if k.startswith("KRB5")}}
    done = subprocess.run([sys.executable, "-m", "tests.kerberos_spark_job"], input=json.dumps(writes), env=env,
                          cwd=_ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    *results, refused = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(result.get("ok") and result["jobs"] for result in results), results

    expected = sorted((str(i % 7).encode(), json.dumps({"order": i, "amount": i * 3}, separators=(",", ":")).encode())
                      for i in range(ROWS))
    for login in logins:
        for fmt in ("kafka", "kprod"):
            read = consume_all(plain, topics[login, fmt], ROWS, to_end=True)
            assert sorted((m.key(), m.value()) for m in read) == expected, (login, fmt)
            assert all(not m.headers() for m in read), (login, fmt)
            # RoundRobinPartitioner: the keys do not decide, every partition gets records.
            assert {m.partition() for m in read} == set(range(PARTITIONS)), (login, fmt)
    # kprod: the extra columns and the JVM-only keys named once on the driver.
    assert "kprod ignores column(s) 'id', 'amount', 'event_time', as Spark's Kafka sink does" in done.stderr
    assert "kprod ignores these Java producer settings: kafka.client.dns.lookup (" in done.stderr

    # The driver's check acquires the credentials before any task runs.
    assert refused.get("error", "").startswith(
        "spark_sink.client.errors.SaslAuthenticationError: sasl.jaas.config: no Kerberos credentials for "
        "principal 'intruder@KPROD.TEST'"), refused
    assert refused["jobs"] == 0, refused  # no task waited out max.block.ms
    assert "trust-secret" not in done.stdout + done.stderr
    assert USERS["spark"] not in done.stdout + done.stderr
