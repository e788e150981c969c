"""Apache Kafka with TLS and SASL listeners, for the security tests (fixture ``secure_kafka``).

One node with, besides its plain listener:
- SSL: TLS, server certificate only; MTLS: TLS that requires a client certificate;
- SASLPLAIN (SASL_PLAINTEXT) and SASLSSL (SASL_SSL), each enabling PLAIN, SCRAM-SHA-256
  and SCRAM-SHA-512; REAUTH (SASL_PLAINTEXT, SCRAM-SHA-256) whose sessions last 3 s and
  must be renewed (KIP-368), behind a fault proxy that counts connections;
- KERBEROS (SASL_PLAINTEXT) and KRBSSL (SASL_SSL) with GSSAPI, against a MIT KDC started
  on loopback for the node (tests/kdc.py): the broker is kafka/localhost@KPROD.TEST with a
  keytab of its own, and the client principal :data:`KERBEROS_CLIENT` has one too.
The CA and the certificates are made for the session; SCRAM credentials are created when
the storage is formatted. Where no KDC can be started, the node has no Kerberos
listeners and the Kerberos tests skip, except in CI, where they fail (``kerberos``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from kprod_broker import KafkaCluster, Listener, TlsFiles, make_tls_files, ssl_listener_config
from tests.brokers import discard, free_port, start_kafka
from tests.faultproxy import FaultProxy
from tests.kdc import Kdc, KdcUnavailableError, start_kdc
from tests.services import SERVICES

USERS = {"alice": "alice-secret", "spark": "s3cret"}
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
JAAS = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
        "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
        "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
# kprod renews a session at a random 85-95% of it, as Java: the 5-15% left must cover the
# broker's answer reaching kprod and kprod's last request reaching the broker, which on
# a heavily loaded 2-core machine can take longer than the 75 ms a 1.5 s session leaves.
REAUTH_MS = 3000
KERBEROS_SERVICE = "kafka"
KERBEROS_CLIENT = "spark"


def _sasl_listener(mechanisms: tuple[str, ...]) -> dict[str, str]:
    plain_users = " ".join(f'user_{user}="{password}"' for user, password in USERS.items())
    config = {"sasl.enabled.mechanisms": ",".join(mechanisms)}
    for mechanism in mechanisms:
        options = f" {plain_users}" if mechanism == "PLAIN" else ""
        config[f"{mechanism.lower()}.sasl.jaas.config"] = f"{JAAS[mechanism]} required{options};"
    return config


def _gssapi_listener(kdc: Kdc, keytab: Path) -> dict[str, str]:
    principal = f"{KERBEROS_SERVICE}/localhost@{kdc.realm}"
    return {"sasl.enabled.mechanisms": "GSSAPI",
            "gssapi.sasl.jaas.config": "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
                                       f'storeKey=true keyTab="{keytab}" principal="{principal}";'}


@dataclass
class Kerberos:
    """The node's KDC and the client principal's keytab."""

    kdc: Kdc
    client_keytab: Path

    def jaas(self, principal: str = KERBEROS_CLIENT, keytab: Path | str | None = None) -> str:
        """sasl.jaas.config for ``principal`` with a keytab (the client's by default)."""
        return ("com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true "
                f'keyTab="{keytab or self.client_keytab}" principal="{principal}@{self.kdc.realm}";')


@dataclass
class SecureKafka:
    cluster: KafkaCluster
    tls: TlsFiles
    reauth_proxy: FaultProxy
    kerberos: Kerberos | None
    kerberos_missing: str | None  # why there is no KDC (and no Kerberos listener)

    def bootstrap(self, listener: str) -> str:
        """The listener's address (REAUTH: its proxy's)."""
        if listener == "REAUTH":
            return f"127.0.0.1:{self.reauth_proxy.port}"
        return self.cluster.listener_bootstrap(listener)


def _start(stack: contextlib.ExitStack, tmp_path_factory: pytest.TempPathFactory) -> SecureKafka:
    tls = make_tls_files(tmp_path_factory.mktemp("tls"))
    reauth_port = free_port()
    scram = [f"{m}=[name={user},password={password}]" for m in MECHANISMS[1:] for user, password in USERS.items()]
    proxy = stack.enter_context(FaultProxy("127.0.0.1", reauth_port))
    kerberos, missing, kerberos_listeners, jvm_args = None, None, [], []
    try:
        kdc = start_kdc(tmp_path_factory.mktemp("kdc"))
    except KdcUnavailableError as exc:
        missing = str(exc)
    else:
        stack.callback(kdc.stop)
        broker_keytab = kdc.add_principal(f"{KERBEROS_SERVICE}/localhost")
        kerberos = Kerberos(kdc, kdc.add_principal(KERBEROS_CLIENT))
        gssapi = _gssapi_listener(kdc, broker_keytab)
        kerberos_listeners = [Listener("KERBEROS", "SASL_PLAINTEXT", gssapi),
                              Listener("KRBSSL", "SASL_SSL", {**ssl_listener_config(tls), **gssapi})]
        jvm_args = [f"-Djava.security.krb5.conf={kdc.krb5_conf}"]
    cluster = start_kafka(
        jvm_args=jvm_args,
        listeners=[*kerberos_listeners,
            Listener("SSL", "SSL", ssl_listener_config(tls)),
            Listener("MTLS", "SSL", ssl_listener_config(tls, client_auth=True)),
            Listener("SASLPLAIN", "SASL_PLAINTEXT", _sasl_listener(MECHANISMS)),
            Listener("SASLSSL", "SASL_SSL", {**ssl_listener_config(tls), **_sasl_listener(MECHANISMS)}),
            Listener("REAUTH", "SASL_PLAINTEXT",
                     {**_sasl_listener(("SCRAM-SHA-256",)), "connections.max.reauth.ms": str(REAUTH_MS)},
                     port=reauth_port, advertised_port=proxy.port),
        ],
        config={"sasl.enabled.mechanisms": ",".join(MECHANISMS), "sasl.kerberos.service.name": KERBEROS_SERVICE},
        scram_users=scram)
    stack.callback(discard, cluster)
    return SecureKafka(cluster, tls, proxy, kerberos, missing)


@pytest.fixture
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> SecureKafka:
    """Started by the worker's first test that uses it (tests/services.py)."""
    return SERVICES.get("secure_kafka", lambda stack: _start(stack, tmp_path_factory))


@pytest.fixture
def kerberos(secure_kafka: SecureKafka) -> Kerberos:
    """The secured node's KDC; the test skips without one, except in CI (``CI`` set),
    where it fails: .ci/run installs the KDC."""
    if secure_kafka.kerberos is None:
        if os.environ.get("CI"):
            pytest.fail(f"no Kerberos KDC for the GSSAPI tests: {secure_kafka.kerberos_missing}", pytrace=False)
        pytest.skip(f"no Kerberos KDC: {secure_kafka.kerberos_missing}")
    return secure_kafka.kerberos
