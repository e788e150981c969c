"""Apache Kafka with OAUTHBEARER listeners validated by the broker's own OIDC validator
(OAuthBearerValidatorCallbackHandler) against the test identity provider (tests/oidc.py),
for the OAUTHBEARER tests (fixture ``oauth_kafka``).

One node with, besides its plain listener:
- OAUTHPLAIN (SASL_PLAINTEXT) and OAUTHSSL (SASL_SSL, the session's own CA);
- OAUTHREAUTH (SASL_PLAINTEXT) whose sessions last 3 s (connections.max.reauth.ms),
  behind a fault proxy that counts connections.
The broker checks each token's RS256 signature against the provider's JWKS, its audience
and its issuer. Kafka 4 fetches only the URLs listed in the JVM system property
org.apache.kafka.sasl.oauthbearer.allowed.urls.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest

from kprod_broker import KafkaCluster, Listener, TlsFiles, make_tls_files, ssl_listener_config
from tests.brokers import discard, free_port, start_kafka
from tests.faultproxy import FaultProxy
from tests.oidc import AUDIENCE, IdentityProvider
from tests.services import SERVICES

LOGIN_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
REAUTH_MS = 3000
_LISTENER = {
    "sasl.enabled.mechanisms": "OAUTHBEARER",
    "oauthbearer.sasl.jaas.config": f"{LOGIN_MODULE} required;",
    "oauthbearer.sasl.server.callback.handler.class":
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
}


@dataclass
class OAuthKafka:
    cluster: KafkaCluster
    tls: TlsFiles
    idp: IdentityProvider
    reauth_proxy: FaultProxy

    def bootstrap(self, listener: str) -> str:
        """The listener's address (OAUTHREAUTH: its proxy's)."""
        if listener == "OAUTHREAUTH":
            return f"127.0.0.1:{self.reauth_proxy.port}"
        return self.cluster.listener_bootstrap(listener)


def _start(stack: contextlib.ExitStack, tmp_path_factory: pytest.TempPathFactory) -> OAuthKafka:
    tls = make_tls_files(tmp_path_factory.mktemp("oauth-tls"))
    idp = IdentityProvider(tls_cert=tls.broker)
    stack.callback(idp.close)
    reauth_port = free_port()
    proxy = stack.enter_context(FaultProxy("127.0.0.1", reauth_port))
    cluster = start_kafka(
        listeners=[
            Listener("OAUTHPLAIN", "SASL_PLAINTEXT", _LISTENER),
            Listener("OAUTHSSL", "SASL_SSL", {**ssl_listener_config(tls), **_LISTENER}),
            Listener("OAUTHREAUTH", "SASL_PLAINTEXT", {**_LISTENER, "connections.max.reauth.ms": str(REAUTH_MS)},
                     port=reauth_port, advertised_port=proxy.port),
        ],
        config={"sasl.oauthbearer.jwks.endpoint.url": idp.jwks_url,
                "sasl.oauthbearer.expected.audience": AUDIENCE,
                "sasl.oauthbearer.expected.issuer": idp.issuer},
        jvm_args=[f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={idp.jwks_url}"])
    stack.callback(discard, cluster)
    return OAuthKafka(cluster, tls, idp, proxy)


@pytest.fixture
def oauth_kafka(tmp_path_factory: pytest.TempPathFactory) -> OAuthKafka:
    """Started by the worker's first test that uses it (tests/services.py)."""
    return SERVICES.get("oauth_kafka", lambda stack: _start(stack, tmp_path_factory))
