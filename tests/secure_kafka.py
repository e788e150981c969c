"""Apache Kafka with TLS and SASL listeners, for the security tests (fixture ``secure_kafka``).

One node with, besides its plain listener:
- SSL: TLS, server certificate only; MTLS: TLS that requires a client certificate;
- SASLPLAIN (SASL_PLAINTEXT) and SASLSSL (SASL_SSL), each enabling PLAIN, SCRAM-SHA-256
  and SCRAM-SHA-512; REAUTH (SASL_PLAINTEXT, SCRAM-SHA-256) whose sessions last 1.5 s and
  must be renewed (KIP-368), behind a fault proxy that counts connections.
The CA and the certificates are made for the session; SCRAM credentials are created when
the storage is formatted.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest

from kprod_broker import KafkaCluster, Listener, TlsFiles, make_tls_files, ssl_listener_config
from tests.brokers import free_port, start_kafka
from tests.faultproxy import FaultProxy
from tests.services import SERVICES

USERS = {"alice": "alice-secret", "spark": "s3cret"}
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
JAAS = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
        "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
        "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
REAUTH_MS = 1500


def _sasl_listener(mechanisms: tuple[str, ...]) -> dict[str, str]:
    plain_users = " ".join(f'user_{user}="{password}"' for user, password in USERS.items())
    config = {"sasl.enabled.mechanisms": ",".join(mechanisms)}
    for mechanism in mechanisms:
        options = f" {plain_users}" if mechanism == "PLAIN" else ""
        config[f"{mechanism.lower()}.sasl.jaas.config"] = f"{JAAS[mechanism]} required{options};"
    return config


@dataclass
class SecureKafka:
    cluster: KafkaCluster
    tls: TlsFiles
    reauth_proxy: FaultProxy

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
    cluster = start_kafka(
        listeners=[
            Listener("SSL", "SSL", ssl_listener_config(tls)),
            Listener("MTLS", "SSL", ssl_listener_config(tls, client_auth=True)),
            Listener("SASLPLAIN", "SASL_PLAINTEXT", _sasl_listener(MECHANISMS)),
            Listener("SASLSSL", "SASL_SSL", {**ssl_listener_config(tls), **_sasl_listener(MECHANISMS)}),
            Listener("REAUTH", "SASL_PLAINTEXT",
                     {**_sasl_listener(("SCRAM-SHA-256",)), "connections.max.reauth.ms": str(REAUTH_MS)},
                     port=reauth_port, advertised_port=proxy.port),
        ],
        config={"sasl.enabled.mechanisms": ",".join(MECHANISMS)},
        scram_users=scram)
    stack.callback(cluster.stop)
    return SecureKafka(cluster, tls, proxy)


@pytest.fixture
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> SecureKafka:
    """Started by the worker's first test that uses it (tests/services.py)."""
    return SERVICES.get("secure_kafka", lambda stack: _start(stack, tmp_path_factory))
