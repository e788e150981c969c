"""SASL/OAUTHBEARER tokens (KIP-255, KIP-768): where they come from, how long they are kept.

A token comes from an OIDC token endpoint with the client credentials grant (RFC 6749
section 4.4; clientId, clientSecret and scope from sasl.jaas.config, as Java's
OAuthBearerLoginModule takes them) or from a token provider, a Python callable given by
name so that a Spark worker imports it itself. :class:`TokenSource` keeps the token and
fetches a new one when a connection is set up past the token's refresh time, which is
Java's (ExpiringCredentialRefreshingLogin): ``sasl.login.refresh.window.factor`` of its
lifetime plus jitter, kept ``sasl.login.refresh.min.period.seconds`` after now and
``sasl.login.refresh.buffer.seconds`` before expiry. A refresh that fails while the
token is still valid keeps the token and tries again after ``sasl.login.retry.backoff.ms``.

The token endpoint is the one server kprod connects to outside network.py: a blocking
HTTP(S) request here, made when the producer is created (so that its errors come before
any record is sent) and then about once per token lifetime from the I/O thread.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import importlib
import json
import logging
import random
import ssl
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from spark_sink.client import tls
from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.client.config import ClientConfig, oauth_options, sasl_credentials
from spark_sink.client.errors import ConfigError, SaslAuthenticationError
from spark_sink.protocol import sasl

log = logging.getLogger(__name__)

TokenProvider = Callable[[dict[str, str]], tuple[str, float]]


@dataclasses.dataclass(frozen=True, slots=True)
class BearerToken:
    """A token and what kprod read from its claims; times are epoch seconds."""

    value: str = dataclasses.field(repr=False)
    expires_at: float
    issued_at: float
    principal: str | None
    origin: str  # the endpoint or provider it came from, for error messages

    def describe(self, now: float) -> str:
        """Which token this is and how long it is valid (never the token itself)."""
        when = datetime.fromtimestamp(self.expires_at, UTC).strftime("%H:%M:%S UTC")
        left = self.expires_at - now
        state = f"expired {-left:.0f} s ago, at {when}" if left <= 0 else f"valid until {when}"
        who = f"for {self.principal!r} " if self.principal else ""
        return f"the token {who}from {self.origin} ({state})"


def jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT (not verified: the broker does that), or None if the token
    is not a JWT (MSK IAM and Event Hubs tokens, for example)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    return claims if isinstance(claims, dict) else None


class TokenSource:
    """The producer's OAUTHBEARER token: fetched, cached and refreshed before it expires."""

    def __init__(self, config: ClientConfig, clock: Time = SYSTEM_TIME) -> None:
        self._config = config
        self._clock = clock
        self._options = oauth_options(config.sasl_jaas_config, config.sasl_oauthbearer_token_endpoint_url,
                                      config.sasl_oauthbearer_token_provider)
        self.extensions = {key[len("extension_"):]: value for key, value in self._options.items()
                           if key.startswith("extension_")}
        provider = config.sasl_oauthbearer_token_provider
        self._provider_name = provider if isinstance(provider, str) else getattr(provider, "__qualname__", "provider")
        self._provider: TokenProvider | None = _import(provider) if isinstance(provider, str) else provider
        self._url = config.sasl_oauthbearer_token_endpoint_url
        self._ssl = self._endpoint_tls() if self._url and self._url.lower().startswith("https://") else None
        self._token: BearerToken | None = None
        self._refresh_at = 0.0
        self.fetches = 0  # how often a token was fetched (for tests and logs)

    def token(self) -> BearerToken:
        """The current token; a new one once the refresh time has passed. Raises
        SaslAuthenticationError when no valid token can be had."""
        now = self._now()
        if self._token is not None and now < self._refresh_at:
            return self._token
        try:
            token = self._fetch()
        except SaslAuthenticationError as exc:
            if self._token is None or now >= self._token.expires_at:
                raise
            # Java keeps a token that is still valid when its refresh fails, and retries.
            self._refresh_at = now + self._config.sasl_login_retry_backoff_ms / 1000.0
            log.warning("OAUTHBEARER token refresh failed, keeping the current token: %s", exc)
            return self._token
        self._token, self._refresh_at = token, self._refresh_time(token, self._now())
        log.info("OAUTHBEARER token %s fetched; refresh at %.0f", token.describe(now), self._refresh_at)
        return token

    def _now(self) -> float:
        """The wall clock in seconds, as tokens state their expiry."""
        return self._clock.wall_ms() / 1000.0

    def _refresh_time(self, token: BearerToken, now: float) -> float:
        """When to fetch the next token, as Java's ExpiringCredentialRefreshingLogin."""
        c = self._config
        min_period, buffer = c.sasl_login_refresh_min_period_seconds, c.sasl_login_refresh_buffer_seconds
        left = token.expires_at - now
        if left <= 0:
            return now  # already expired: fetch again for the next connection
        if min_period + buffer > left:
            # The bounds cannot both hold (a short-lived token): refresh halfway, as Java.
            return now + left / 2
        lifetime = token.expires_at - token.issued_at
        factor = c.sasl_login_refresh_window_factor + random.uniform(0, c.sasl_login_refresh_window_jitter)
        return min(max(token.issued_at + lifetime * factor, now + min_period), token.expires_at - buffer)

    # -- fetching -------------------------------------------------------------

    def _fetch(self) -> BearerToken:
        self.fetches += 1
        if self._provider is not None:
            return self._from_provider(self._provider)
        return self._from_endpoint()

    def _from_provider(self, provider: TokenProvider) -> BearerToken:
        origin = f"sasl.oauthbearer.token.provider {self._provider_name}"
        try:
            value, expiry_ms = provider(dict(self._options))
            value, expires_at = str(value), float(expiry_ms) / 1000.0
        except Exception as exc:  # the provider is the user's code: say whose call failed
            raise SaslAuthenticationError(f"OAUTHBEARER: {origin} failed: {type(exc).__name__}: {exc}") from exc
        if not value:
            raise SaslAuthenticationError(f"OAUTHBEARER: {origin} returned an empty token")
        return self._token_from(value, origin, expires_at)

    def _from_endpoint(self) -> BearerToken:
        c, url = self._config, self._url
        assert url is not None
        client_id, secret = self._options["clientId"], self._options["clientSecret"]
        if c.sasl_oauthbearer_header_urlencode:
            client_id, secret = urllib.parse.quote(client_id, safe=""), urllib.parse.quote(secret, safe="")
        form = {"grant_type": "client_credentials"}
        if self._options.get("scope"):
            form["scope"] = self._options["scope"]
        body = urllib.parse.urlencode(form).encode()
        headers = {"Authorization": "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode(),
                   "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        # As Java's HttpAccessTokenRetriever: retry a failed connection or a server error
        # with a growing backoff, for at most sasl.login.retry.backoff.max.ms in all.
        started, backoff, attempts = self._clock(), c.sasl_login_retry_backoff_ms / 1000.0, 0
        while True:
            attempts += 1
            try:
                status, payload = self._post(url, body, headers)
            except (OSError, http.client.HTTPException) as exc:
                status, payload, failure = None, b"", f"{type(exc).__name__}: {exc}"
            else:
                failure = f"HTTP {status}"
            if status is not None and status < 500:
                break
            elapsed = (self._clock() - started) / 1000.0
            if elapsed + backoff > c.sasl_login_retry_backoff_max_ms / 1000.0:
                what = "cannot reach" if status is None else "gets server errors from"
                raise SaslAuthenticationError(
                    f"OAUTHBEARER: kprod {what} the token endpoint {url} (sasl.oauthbearer.token.endpoint.url): "
                    f"{failure}, {attempts} attempt(s) over {elapsed:.1f} s (sasl.login.retry.backoff.max.ms)")
            self._clock.sleep(backoff)
            backoff = min(backoff * 2, c.sasl_login_retry_backoff_max_ms / 1000.0)
        answer = _json(payload)
        if status != 200:
            # RFC 6749 section 5.2: error and error_description say why (no secret in them).
            reason = " ".join(str(answer[k]) for k in ("error", "error_description") if answer.get(k))
            raise SaslAuthenticationError(
                f"OAUTHBEARER: the token endpoint {url} refused client {self._options['clientId']!r}: "
                f"HTTP {status}{': ' + reason if reason else ''} (check clientId, clientSecret and scope in "
                "sasl.jaas.config)")
        value = answer.get("access_token")
        if not isinstance(value, str) or not value:
            raise SaslAuthenticationError(f"OAUTHBEARER: the token endpoint {url} answered without an access_token")
        expires_in = answer.get("expires_in")
        fallback = self._now() + float(expires_in) if isinstance(expires_in, (int, float)) else None
        return self._token_from(value, url, fallback)

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        c = self._config
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
        if host is None:  # oauth_options refuses such a URL
            raise ConfigError(f"sasl.oauthbearer.token.endpoint.url: expected a host name in {url!r}")
        connect_s = c.sasl_login_connect_timeout_ms / 1000.0
        if parts.scheme.lower() == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, parts.port, timeout=connect_s, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(host, parts.port, timeout=connect_s)
        try:
            conn.connect()
            conn.sock.settimeout(c.sasl_login_read_timeout_ms / 1000.0)
            path = parts.path or "/"
            conn.request("POST", path + (f"?{parts.query}" if parts.query else ""), body, headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _token_from(self, value: str, origin: str, expires_at: float | None) -> BearerToken:
        """The token with its expiry and principal. A provider's expiry is taken as given;
        a token endpoint's JWT is read for exp and the subject claim as Java's client
        does, and an opaque token from it lasts expires_in."""
        c, now = self._config, self._now()
        claims = jwt_claims(value) or {}
        sub, iat = claims.get(c.sasl_oauthbearer_sub_claim_name), claims.get("iat")
        if self._provider is None and claims:
            if not isinstance(claims.get("exp"), (int, float)):
                raise SaslAuthenticationError(f"OAUTHBEARER: the token from {origin} has no numeric exp claim")
            if not isinstance(sub, str) or not sub:
                raise SaslAuthenticationError(
                    f"OAUTHBEARER: the token from {origin} has no {c.sasl_oauthbearer_sub_claim_name!r} claim "
                    "(sasl.oauthbearer.sub.claim.name)")
            expires_at = float(claims["exp"])
            log.debug("OAUTHBEARER token for %s, scope %s", sub, claims.get(c.sasl_oauthbearer_scope_claim_name))
        if expires_at is None:
            raise SaslAuthenticationError(f"OAUTHBEARER: the token from {origin} is not a JWT and came without "
                                          "an expiry (expires_in)")
        issued = float(iat) if isinstance(iat, (int, float)) and iat <= now else now
        return BearerToken(value, expires_at, issued, sub if isinstance(sub, str) else None, origin)

    def _endpoint_tls(self) -> ssl.SSLContext:
        """TLS for the token endpoint from the ssl.* options in sasl.jaas.config, as Java
        reads them; without any, the system's CAs."""
        settings = {key: value for key, value in self._options.items() if key.startswith("ssl.")}
        try:
            endpoint = ClientConfig.from_dict({"bootstrap.servers": "token-endpoint:443",
                                                 "security.protocol": "SSL", **settings})
            context = tls.ssl_context(endpoint)
        except ConfigError as exc:
            raise ConfigError(f"sasl.jaas.config (the token endpoint's TLS): {exc}") from None
        assert context is not None
        return context


def _import(name: str) -> TokenProvider:
    module, _, attribute = name.partition(":")
    try:
        target: Any = importlib.import_module(module)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"sasl.oauthbearer.token.provider: cannot import {name!r}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"sasl.oauthbearer.token.provider: {name!r} is not callable")
    return target


def _json(payload: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(payload or b"{}")
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def sasl_exchanges(config: ClientConfig, clock: Time = SYSTEM_TIME
                   ) -> Callable[[str], sasl.SaslMechanism] | None:
    """A factory of fresh SASL exchanges, one per connection, given the broker's host, or
    None without SASL. With OAUTHBEARER the first token is fetched here, and with GSSAPI
    the Kerberos credentials acquired, so that a refused client fails the producer's
    creation."""
    if not config.security_protocol.startswith("SASL_"):
        return None
    if config.sasl_mechanism == "GSSAPI":
        from spark_sink.client.kerberos import gssapi_exchanges  # gssapi is an optional package

        return gssapi_exchanges(config)
    if config.sasl_mechanism != "OAUTHBEARER":
        username, password = sasl_credentials(config.sasl_jaas_config)
        return lambda host: sasl.mechanism(config.sasl_mechanism, username, password)
    source = TokenSource(config, clock)
    source.token()

    def exchange(host: str) -> sasl.SaslMechanism:
        token = source.token()
        hint = f"{token.describe(clock.wall_ms() / 1000.0)}; check the token's audience, issuer and scope"
        return sasl.OAuthBearer(token.value, source.extensions, hint)

    return exchange
