"""sasl.mechanism=GSSAPI (Kerberos): kprod authenticates with a keytab or kinit's tickets to
Apache Kafka's own GSSAPI listeners (SASL_PLAINTEXT and SASL_SSL), against a MIT KDC on
loopback (tests/secure_kafka.py, tests/kdc.py), and confluent-kafka reads the records back.

The producers run in a process of their own (tests/kerberos_client.py) whose KRB5_CONFIG
names the test KDC's krb5.conf: neither kprod nor this process changes its environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spark_sink.client.errors import ConfigError
from spark_sink.producer import KafkaProducer
from tests.brokers import consume_all, unique_topic
from tests.secure_kafka import KERBEROS_CLIENT, KERBEROS_SERVICE, Kerberos, SecureKafka

_ROOT = Path(__file__).resolve().parents[2]
_KRB5 = "com.sun.security.auth.module.Krb5LoginModule"


def _produce(kerberos: Kerberos, *runs: dict) -> list[dict]:
    """Each run's result from tests/kerberos_client.py, run with the KDC's krb5.conf."""
    result = subprocess.run([sys.executable, "-m", "tests.kerberos_client"], input=json.dumps(list(runs)),
                            env=kerberos.kdc.env(), cwd=_ROOT, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _config(secure_kafka: SecureKafka, listener: str = "KERBEROS", **extra: object) -> dict[str, object]:
    protocol = "SASL_SSL" if listener == "KRBSSL" else "SASL_PLAINTEXT"
    assert secure_kafka.kerberos is not None, secure_kafka.kerberos_missing
    config: dict[str, object] = {
        "bootstrap.servers": secure_kafka.bootstrap(listener), "security.protocol": protocol,
        "sasl.mechanism": "GSSAPI", "sasl.kerberos.service.name": KERBEROS_SERVICE,
        "sasl.jaas.config": secure_kafka.kerberos.jaas(), "max.block.ms": 60000}
    if protocol == "SASL_SSL":
        config["ssl.truststore.location"] = str(secure_kafka.tls.ca)
    return {**config, **extra}


def test_keytab_login_over_sasl_plaintext_and_sasl_ssl(secure_kafka: SecureKafka, kerberos: Kerberos) -> None:
    topics = {listener: unique_topic("krb") for listener in ("KERBEROS", "KRBSSL")}
    results = _produce(kerberos, *({"config": _config(secure_kafka, listener), "topic": topic, "count": 200}
                                   for listener, topic in topics.items()))
    for (listener, topic), result in zip(topics.items(), results):
        assert "error" not in result, (listener, result)
        assert len(result["offsets"]) == 200 and result["env_unchanged"]
        values = sorted(m.value() for m in consume_all(secure_kafka.cluster.bootstrap, topic, 200))
        assert values == sorted(b"krb-%d" % i for i in range(200))
    # The tickets stayed in kprod's memory cache: nothing was written to the default one.
    assert not (kerberos.kdc.directory / "ccache-default").exists()


@pytest.mark.skipif(shutil.which("kinit") is None and not os.environ.get("CI"),
                    reason="needs kinit (krb5-user)")
def test_ticket_cache_filled_by_kinit(secure_kafka: SecureKafka, kerberos: Kerberos, tmp_path: Path) -> None:
    cache = f"FILE:{tmp_path / 'kinit-cache'}"
    subprocess.run(["kinit", "-k", "-t", str(kerberos.client_keytab), f"{KERBEROS_CLIENT}@{kerberos.kdc.realm}"],
                   env={**kerberos.kdc.env(), "KRB5CCNAME": cache}, check=True, capture_output=True, timeout=60)
    topic = unique_topic("krb-cache")
    jaas = f'{_KRB5} required useTicketCache=true ticketCache="{cache}";'
    [result] = _produce(kerberos, {"config": _config(secure_kafka, **{"sasl.jaas.config": jaas}),
                                   "topic": topic, "count": 10})
    assert len(result.get("offsets", ())) == 10, result


def test_missing_credentials_and_wrong_principals_are_clear_errors(secure_kafka: SecureKafka, kerberos: Kerberos,
                                                                   tmp_path: Path) -> None:
    """Each fails at once (the producer's creation, or its first connection), naming the
    setting to check, as Java's login and SaslAuthenticationException do."""
    ghost_keytab = kerberos.kdc.add_principal("ghost")
    kerberos.kdc.kadmin("delprinc -force ghost")  # its keytab names a principal the KDC no longer knows
    cases = [
        ({"sasl.jaas.config": kerberos.jaas(keytab=tmp_path / "missing.keytab")},
         "ConfigError", r"sasl.jaas.config: keyTab '.*missing.keytab' does not exist"),
        ({"sasl.jaas.config": kerberos.jaas(principal="intruder")},
         "SaslAuthenticationError", r"sasl.jaas.config: no Kerberos credentials for principal 'intruder@KPROD.TEST'"
                                    r".*check principal and keyTab"),
        ({"sasl.jaas.config": kerberos.jaas(principal="ghost", keytab=ghost_keytab)},
         "SaslAuthenticationError", r"sasl.jaas.config: no Kerberos credentials for principal 'ghost@.*"
                                    r"not found in Kerberos database"),
        ({"sasl.jaas.config": f"{_KRB5} required useTicketCache=true;"},
         "SaslAuthenticationError", r"sasl.jaas.config: no Kerberos credentials for the default ticket cache.*"
                                    r"run kinit"),
        ({"sasl.kerberos.service.name": "kafkax"},
         "SaslAuthenticationError", r"no service ticket for kafkax@localhost.*not found in Kerberos database.*"
                                    r"check sasl.kerberos.service.name"),
    ]
    results = _produce(kerberos, *({"config": _config(secure_kafka, **settings), "topic": unique_topic("krb-bad"),
                                    "count": 1} for settings, _, _ in cases))
    for (settings, error, message), result in zip(cases, results):
        assert result.get("error") == error, (settings, result)
        assert re.search(message, result["message"]), (message, result["message"])
        assert result["env_unchanged"]  # (an error of its own, not the max.block.ms timeout after a wait)


@pytest.mark.parametrize("settings, named", [
    ({}, r"sasl.jaas.config: required with sasl.mechanism=GSSAPI"),
    ({"sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" '
                          'password="hunter2";'}, "sasl.mechanism=GSSAPI takes Krb5LoginModule"),
    ({"sasl.jaas.config": f'{_KRB5} required useKeyTab=true keyTab="/k.keytab";'}, "needs keyTab.*and principal"),
    ({"sasl.jaas.config": f'{_KRB5} required principal="a@B";'}, "cannot prompt for a password"),
    ({"sasl.jaas.config": f'{_KRB5} required useTicketCache=true;', "sasl.kerberos.service.name": None},
     "sasl.kerberos.service.name: required"),
])
def test_bad_gssapi_settings_name_the_key(settings: dict[str, str | None], named: str) -> None:
    config = {"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_PLAINTEXT",
              "sasl.kerberos.service.name": "kafka", **settings}
    with pytest.raises(ConfigError, match=named) as info:
        KafkaProducer({k: v for k, v in config.items() if v is not None})
    assert "hunter2" not in str(info.value)
