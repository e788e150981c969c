"""SASL/OAUTHBEARER: kprod authenticates to Apache Kafka's OAUTHBEARER listeners, whose
own OIDC validator checks each token against the test identity provider's JWKS
(tests/oauth_kafka.py, tests/oidc.py); confluent-kafka reads the records back from the
plain listener."""

from __future__ import annotations

import re
import time

import pyarrow as pa
import pytest

from spark_sink.client.errors import ConfigError, SaslAuthenticationError
from spark_sink.producer import FutureRecordMetadata, KafkaProducer, ProducerRecord
from tests.brokers import consume_all, free_port, unique_topic
from tests.oauth_kafka import LOGIN_MODULE, REAUTH_MS, OAuthKafka
from tests.oidc import CLIENTS, IdentityProvider


def _token_url(idp: IdentityProvider | None) -> str:
    assert idp is not None, "a token endpoint URL or an identity provider"
    return idp.token_url


def _oidc(idp: IdentityProvider | None, client: str = "kprod-app", secret: str | None = None,
          protocol: str = "SASL_PLAINTEXT", url: str | None = None, **jaas: str) -> dict[str, str]:
    secret = CLIENTS[client] if secret is None else secret
    options = " ".join(f'{k}="{v}"' for k, v in {"clientId": client, "clientSecret": secret, "scope": "kafka",
                                                    **jaas}.items())
    return {"security.protocol": protocol, "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.token.endpoint.url": url or _token_url(idp),
            "sasl.jaas.config": f"{LOGIN_MODULE} required {options};"}


def test_send_and_send_arrow_with_oidc_client_credentials(oauth_kafka: OAuthKafka) -> None:
    idp, topic = oauth_kafka.idp, unique_topic("oauth")
    fetched = idp.fetches["kprod-app"]
    with KafkaProducer({"bootstrap.servers": oauth_kafka.bootstrap("OAUTHPLAIN"), **_oidc(idp)}) as p:
        futures = [p.send(ProducerRecord(topic, b"v%d" % i, key=b"k%d" % (i % 5))) for i in range(200)]
        summary = p.send_arrow(pa.table({"value": [b"a%d" % i for i in range(500)]}), topic=topic).result(60)
        p.flush(60)
        assert len({(f.result(10).partition, f.result(10).offset) for f in futures}) == 200
    assert summary.records == 500
    assert idp.fetches["kprod-app"] == fetched + 1  # one token, cached for every connection
    values = sorted(m.value() for m in consume_all(oauth_kafka.cluster.bootstrap, topic, 700))
    assert values == sorted([b"v%d" % i for i in range(200)] + [b"a%d" % i for i in range(500)])


def test_sasl_ssl_with_a_token_endpoint_over_tls(oauth_kafka: OAuthKafka) -> None:
    """Both the broker and the token endpoint are reached over TLS, each trusting the
    session's CA: the broker through ssl.* settings, the endpoint through ssl.* options in
    sasl.jaas.config, as Java's OAuthBearerLoginModule reads them."""
    idp, ca, topic = oauth_kafka.idp, str(oauth_kafka.tls.ca), unique_topic("oauth-ssl")
    config = {"bootstrap.servers": oauth_kafka.bootstrap("OAUTHSSL"), "ssl.truststore.location": ca,
              **_oidc(idp, protocol="SASL_SSL", url=idp.https_token_url, **{"ssl.truststore.location": ca})}
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"over tls")).result(30).offset >= 0
    assert consume_all(oauth_kafka.cluster.bootstrap, topic, 1)[0].value() == b"over tls"


def test_token_endpoint_whose_certificate_is_not_trusted(oauth_kafka: OAuthKafka) -> None:
    idp = oauth_kafka.idp
    config = {"bootstrap.servers": oauth_kafka.bootstrap("OAUTHPLAIN"), "sasl.login.retry.backoff.max.ms": 200,
              **_oidc(idp, url=idp.https_token_url)}
    with pytest.raises(SaslAuthenticationError, match=r"cannot reach the token endpoint https://localhost.*CERTIFICATE"):
        KafkaProducer(config)


def test_token_provider_by_name(oauth_kafka: OAuthKafka) -> None:
    idp, topic = oauth_kafka.idp, unique_topic("oauth-provider")
    fetched = idp.fetches["kprod-app"]
    config = {"bootstrap.servers": oauth_kafka.bootstrap("OAUTHPLAIN"), "security.protocol": "SASL_PLAINTEXT",
              "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.provider": "tests.oidc:client_credentials_provider",
              "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="kprod-app" clientSecret="app-secret" '
                                  f'tokenUrl="{idp.token_url}";'}
    with KafkaProducer(config) as p:
        assert p.send(ProducerRecord(topic, b"provided")).result(30).offset == 0
    assert idp.fetches["kprod-app"] == fetched + 1


def test_wrong_client_secret_fails_at_creation_without_showing_it(oauth_kafka: OAuthKafka) -> None:
    config = {"bootstrap.servers": oauth_kafka.bootstrap("OAUTHPLAIN"), **_oidc(oauth_kafka.idp, secret="guessed")}
    with pytest.raises(SaslAuthenticationError, match="refused client 'kprod-app': HTTP 401: invalid_client") as info:
        KafkaProducer(config)
    assert "guessed" not in str(info.value) and "sasl.jaas.config" in str(info.value)


def test_unreachable_token_endpoint_fails_at_creation() -> None:
    url = f"http://127.0.0.1:{free_port()}/token"
    config = {"bootstrap.servers": "127.0.0.1:9", "sasl.login.retry.backoff.ms": 20,
              "sasl.login.retry.backoff.max.ms": 300, **_oidc(None, url=url)}
    with pytest.raises(SaslAuthenticationError, match=f"cannot reach the token endpoint {url}.*Connection refused") \
            as info:
        KafkaProducer(config)
    # Backoffs of 20, 40, 80 and 160 ms fill the 300 ms: at most 5 attempts however slow
    # the machine; retrying past sasl.login.retry.backoff.max.ms makes more (37 in 10 s).
    attempts = re.search(r"(\d+) attempt\(s\)", str(info.value))
    assert attempts and 1 <= int(attempts[1]) <= 5, str(info.value)


def test_expired_token_is_refused_with_the_brokers_message(oauth_kafka: OAuthKafka) -> None:
    # max.block.ms an hour, past pytest's timeout: waiting it out would hang the test.
    config = {"bootstrap.servers": oauth_kafka.bootstrap("OAUTHPLAIN"), "max.block.ms": 3_600_000,
              **_oidc(oauth_kafka.idp, client="expired-app")}
    with KafkaProducer(config) as p:
        with pytest.raises(SaslAuthenticationError, match=r"invalid_token.*'expired-app'.*expired \d+ s ago") as info:
            p.send(ProducerRecord(unique_topic("oauth"), b"x"))
    assert "OAUTHBEARER" in str(info.value)


def test_sessions_are_reauthenticated_with_fresh_tokens(oauth_kafka: OAuthKafka) -> None:
    """The OAUTHREAUTH listener's sessions last 3 s and the provider's tokens 6 s: kprod
    moves to a newly authenticated connection before each session ends and fetches a new
    token before the old one expires, while the records keep going.

    The broker ends a session when its token expires if that comes first: a token used
    with 1 s left made a 1 s session, whose 5-15% renewal margin a loaded machine eats.
    Refreshed 3 s before expiry (sasl.login.refresh.buffer.seconds), a token has more
    than a session's 3 s left whenever a connection authenticates with it."""
    idp, proxy, topic = oauth_kafka.idp, oauth_kafka.reauth_proxy, unique_topic("oauth-reauth")
    bootstrap = oauth_kafka.bootstrap("OAUTHREAUTH")
    closed_by_broker, opened, fetched = proxy.closed_by_target, proxy.connections_accepted, idp.fetches["kprod-app"]
    idp.token_lifetime_s = 6
    try:
        config = {"bootstrap.servers": bootstrap, "linger.ms": 20, "sasl.login.refresh.min.period.seconds": 0,
                  "sasl.login.refresh.buffer.seconds": REAUTH_MS // 1000, **_oidc(idp)}
        with KafkaProducer(config) as p:
            futures: list[FutureRecordMetadata] = []
            # Until the proxy has seen four connections: the first two (bootstrap and leader)
            # and two that replaced one whose session was ending; or ten sessions long.
            deadline = time.monotonic() + 10 * REAUTH_MS / 1000
            while proxy.connections_accepted - opened < 4 and time.monotonic() < deadline:
                futures += [p.send(ProducerRecord(topic, b"%d" % len(futures))) for _ in range(50)]
                time.sleep(0.05)
            p.flush(60)
            offsets = [f.result(10).offset for f in futures]
    finally:
        idp.token_lifetime_s = 3600
    assert proxy.connections_accepted - opened >= 4  # sessions were renewed
    assert proxy.closed_by_target == closed_by_broker  # and none ran out
    assert idp.fetches["kprod-app"] - fetched >= 2  # and tokens were refreshed before expiring
    assert len(set(offsets)) == len(futures)
    assert len(consume_all(oauth_kafka.cluster.bootstrap, topic, len(futures), to_end=True)) == len(futures)


@pytest.mark.parametrize("settings, named", [
    ({}, "OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url"),
    ({"sasl.oauthbearer.token.endpoint.url": "https://idp/token"}, "sasl.jaas.config: required"),
    ({"sasl.oauthbearer.token.endpoint.url": "https://idp/token",
      "sasl.jaas.config": f'{LOGIN_MODULE} required clientId="a" secret="hunter2";'}, "clientSecret option"),
    ({"sasl.oauthbearer.token.endpoint.url": "ftp://idp/token"}, "expected an https:// .*URL"),
    # Once took the configuration check and failed at the first fetch, with an AttributeError
    # (no host) or a ValueError (the port) from http.client.
    ({"sasl.oauthbearer.token.endpoint.url": "https:///token"}, "expected a host name in 'https:///token'"),
    ({"sasl.oauthbearer.token.endpoint.url": "https://idp:port/token"}, "the port of 'https://idp:port/token'"),
    ({"sasl.oauthbearer.token.provider": "not a name"}, "sasl.oauthbearer.token.provider: expected"),
    ({"sasl.oauthbearer.token.provider": "tests.oidc:no_such_function"}, "cannot import 'tests.oidc:no_such"),
    ({"sasl.oauthbearer.token.provider": "tests.oidc:AUDIENCE"}, "is not callable"),
    ({"sasl.login.callback.handler.class": "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"},
     "sasl.login.callback.handler.class: .*sasl.oauthbearer.token.provider"),
    ({"sasl.login.refresh.window.factor": 0.2}, r"sasl.login.refresh.window.factor: expected a number in \[0.5"),
])
def test_bad_oauthbearer_settings_name_the_key(settings: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        KafkaProducer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL",
                       "sasl.mechanism": "OAUTHBEARER", **settings})
    assert "hunter2" not in str(info.value)


def test_provider_errors_name_the_provider() -> None:
    def failing(options: dict[str, str]) -> tuple[str, float]:
        raise RuntimeError("no credentials in this environment")

    with pytest.raises(SaslAuthenticationError, match="token.provider .*failing failed: RuntimeError: no credentials"):
        KafkaProducer({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "SASL_SSL",
                       "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.provider": failing})
