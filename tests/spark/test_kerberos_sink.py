"""format("kprod") as a job written for format("kafka") in a Java shop has it: SASL_SSL with
Kerberos (a keytab) and a JKS truststore, to Apache Kafka's own GSSAPI listener and a MIT
KDC on loopback (tests/secure_kafka.py); a wrong principal fails the write on the driver.

The Spark application runs in a process of its own (tests/kerberos_spark_job.py) whose
KRB5_CONFIG names the test KDC's krb5.conf."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.brokers import consume_all, subprocess_env, unique_topic
from tests.producer.test_tls import _jks_stores, needs_keytool
from tests.secure_kafka import KERBEROS_SERVICE

_ROOT = Path(__file__).resolve().parents[2]


@needs_keytool
def test_sasl_ssl_kerberos_with_a_jks_truststore_and_a_wrong_principal(secure_kafka, kerberos, tmp_path):
    truststore, _ = _jks_stores(secure_kafka.tls, tmp_path)
    topic = unique_topic("krb-spark")
    options = {"kafka.bootstrap.servers": secure_kafka.bootstrap("KRBSSL"), "topic": topic,
               "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "GSSAPI",
               "kafka.sasl.kerberos.service.name": KERBEROS_SERVICE, "kafka.sasl.jaas.config": kerberos.jaas(),
               "kafka.ssl.truststore.location": str(truststore), "kafka.ssl.truststore.password": "trust-secret"}
    writes = [{"rows": 500, "options": options},
              {"rows": 5, "options": {**options, "kafka.sasl.jaas.config": kerberos.jaas(principal="intruder")}}]
    env = {**subprocess_env(), **{k: v for k, v in kerberos.kdc.env().items() if k.startswith("KRB5")}}
    done = subprocess.run([sys.executable, "-m", "tests.kerberos_spark_job"], input=json.dumps(writes), env=env,
                          cwd=_ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    written, refused = json.loads(done.stdout.strip().splitlines()[-1])
    assert written.get("ok"), written
    values = sorted(m.value() for m in consume_all(secure_kafka.cluster.bootstrap, topic, 500))
    assert values == sorted(str(i).encode() for i in range(500))
    # The driver's check acquires the credentials before any task runs.
    assert refused.get("error", "").startswith(
        "spark_sink.client.errors.SaslAuthenticationError: sasl.jaas.config: no Kerberos credentials for "
        "principal 'intruder@KPROD.TEST'"), refused
    assert refused["seconds"] < 30
    assert "trust-secret" not in done.stdout + done.stderr
