"""When kprod fetches a new OAUTHBEARER token: Java's refresh rules, and the token
endpoint's retry backoff, on a clock the test moves (no broker; the provider is a
function, the endpoint a closed port): hours of token lifetime in milliseconds."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from spark_sink.client.errors import SaslAuthenticationError
from spark_sink.client.oauth import TokenSource
from spark_sink.producer.config import ProducerConfig
from tests.brokers import free_port
from tests.clock import MovedClock


class Clock(MovedClock):
    """The test's clock, read in seconds as tokens state their expiry."""

    @property
    def now(self) -> float:
        return self.wall_ms() / 1000

    @now.setter
    def now(self, value: float) -> None:
        self.advance((value - self.now) * 1000)


def _source(clock: Clock, provider: Callable[[dict[str, str]], tuple[str, float]], **settings: object) -> TokenSource:
    config = ProducerConfig.from_dict({"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                                       "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.token.provider": provider,
                                       "sasl.login.refresh.window.jitter": 0, **settings})
    return TokenSource(config, clock)


def test_token_is_cached_until_the_refresh_window_then_fetched_again() -> None:
    clock, issued = Clock(), []

    def provider(options: dict[str, str]) -> tuple[str, float]:
        issued.append(clock.now)
        return f"opaque-{len(issued)}", (clock.now + 3600) * 1000  # not a JWT: expiry from the provider

    source = _source(clock, provider)
    assert source.token().value == "opaque-1"
    clock.now += 0.8 * 3600 - 1  # window factor 0.8 of an hour
    assert source.token().value == "opaque-1"
    clock.now += 2
    assert source.token().value == "opaque-2" and len(issued) == 2


def test_short_lived_tokens_are_refreshed_halfway_and_the_buffer_is_kept() -> None:
    clock = Clock()
    source = _source(clock, lambda options: ("t", (clock.now + 100) * 1000))  # min period + buffer > lifetime
    source.token()
    clock.now += 49
    assert source.fetches == 1 and source.token() and source.fetches == 1
    clock.now += 2
    source.token()
    assert source.fetches == 2
    source = _source(clock, lambda options: ("t", (clock.now + 3600) * 1000), **{
        "sasl.login.refresh.window.factor": 1.0, "sasl.login.refresh.buffer.seconds": 600})
    source.token()
    clock.now += 3600 - 601
    source.token()
    assert source.fetches == 1
    clock.now += 2
    source.token()
    assert source.fetches == 2  # 600 s before expiry, not at the window factor's 100%


def test_a_failed_refresh_keeps_a_valid_token_and_fails_once_it_expired() -> None:
    clock = Clock()
    fail: list[bool] = []

    def provider(options: dict[str, str]) -> tuple[str, float]:
        if fail:
            raise OSError("identity service down")
        return "t", (clock.now + 1000) * 1000

    source = _source(clock, provider, **{"sasl.login.refresh.min.period.seconds": 0,
                                         "sasl.login.refresh.buffer.seconds": 0})
    source.token()
    fail.append(True)
    clock.now += 900
    assert source.token().value == "t"  # still valid for 100 s
    clock.now += 101
    with pytest.raises(SaslAuthenticationError, match="identity service down"):
        source.token()


def test_the_token_endpoint_is_retried_with_a_doubling_backoff_up_to_its_maximum() -> None:
    """An endpoint that cannot be reached: attempts 0.1, 0.2, 0.4, ... s apart (slept on the
    clock, not waited for), given up once the next wait would pass 3.2 s in all."""
    clock, url = Clock(), f"http://127.0.0.1:{free_port()}/token"
    config = ProducerConfig.from_dict({
        "bootstrap.servers": "h:1", "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": url, "sasl.login.retry.backoff.ms": 100,
        "sasl.login.retry.backoff.max.ms": 3200,
        "sasl.jaas.config": 'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
                            'clientId="a" clientSecret="b";'})
    with pytest.raises(SaslAuthenticationError, match=f"cannot reach the token endpoint {url}.*6 attempt.*over 3.1 s"):
        TokenSource(config, clock).token()
    assert clock.slept == [0.1, 0.2, 0.4, 0.8, 1.6]
