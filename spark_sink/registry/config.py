"""The Schema Registry client's settings, under the key names of Confluent's clients
(without the ``kprod.schema.registry.`` prefix the Spark options carry).

An unknown key or a bad value raises ConfigError naming the key, before any request.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Any

from spark_sink.client.config import parse_int, parse_optional_str
from spark_sink.client.errors import ConfigError

# key: (default, what it is).
KEYS: dict[str, tuple[Any, str]] = {
    "url": (None, "the registry's base URL, or several separated by commas (tried in turn)"),
    "basic.auth.credentials.source": (None, "USER_INFO (basic.auth.user.info) or URL (the URL's user info); "
                                            "by default USER_INFO when basic.auth.user.info is set, else URL"),
    "basic.auth.user.info": (None, "user:password for HTTP basic authentication"),
    "ssl.ca.location": (None, "the CA certificates (PEM file or directory) to trust instead of the system's"),
    "ssl.certificate.location": (None, "this client's certificate (PEM), for registries that ask for one"),
    "ssl.key.location": (None, "the private key (PEM) of ssl.certificate.location, if not in that file"),
    "ssl.key.password": (None, "the password of ssl.key.location"),
    "timeout.ms": (10_000, "how long one call may take, its retries included"),
    "max.retries": (5, "retries of a call after a connection error or a 5xx/408/429 answer"),
    "retries.wait.ms": (200, "the first backoff before a retry, doubled at each"),
    "retries.max.wait.ms": (2_000, "the longest backoff"),
    "cache.capacity": (1_000, "schemas and ids kept per cache"),
}

_CREDENTIAL_SOURCES = ("USER_INFO", "URL")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """One registry URL: where to connect, its path prefix, and its own credentials
    (from its user info) if any."""

    scheme: str
    host: str
    port: int
    path: str  # without a trailing slash: "" or "/apis/ccompat/v7"
    user_info: tuple[str, str] | None = dataclasses.field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The URL without credentials: what messages name."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.path}"


@dataclasses.dataclass(frozen=True)
class RegistryConfig:
    """Validated settings of a SchemaRegistryClient; ``from_mapping`` reads them."""

    endpoints: tuple[Endpoint, ...]
    user_info: tuple[str, str] | None = dataclasses.field(default=None, repr=False)  # every endpoint's
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = dataclasses.field(default=None, repr=False)
    timeout_ms: int = KEYS["timeout.ms"][0]
    max_retries: int = KEYS["max.retries"][0]
    retries_wait_ms: int = KEYS["retries.wait.ms"][0]
    retries_max_wait_ms: int = KEYS["retries.max.wait.ms"][0]
    cache_capacity: int = KEYS["cache.capacity"][0]

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> RegistryConfig:
        """The settings in ``conf`` (Confluent's key names); ConfigError names a bad key."""
        unknown = sorted(set(conf) - KEYS.keys())
        if unknown:
            raise ConfigError(f"schema registry: unknown setting(s) {', '.join(unknown)}; "
                              f"expected some of {', '.join(KEYS)}")
        strings = {key: parse_optional_str(key, conf.get(key)) for key in KEYS if KEYS[key][0] is None}
        if strings["url"] is None:
            raise ConfigError("url: required: the Schema Registry's URL, e.g. http://registry:8081")
        endpoints = tuple(_endpoint(entry) for entry in strings["url"].split(","))
        source = (strings["basic.auth.credentials.source"] or "").strip().upper() or (
            "USER_INFO" if strings["basic.auth.user.info"] else "URL")
        if source not in _CREDENTIAL_SOURCES:
            raise ConfigError(f"basic.auth.credentials.source: expected USER_INFO or URL, got "
                              f"{conf['basic.auth.credentials.source']!r}")
        user_info = None
        if source == "USER_INFO":
            if not strings["basic.auth.user.info"]:
                raise ConfigError("basic.auth.user.info: required with basic.auth.credentials.source=USER_INFO "
                                  "(user:password)")
            user, colon, password = strings["basic.auth.user.info"].partition(":")
            if not colon or not user:
                raise ConfigError("basic.auth.user.info: expected user:password")  # the value stays out
            user_info = (user, password)
            if any(e.user_info for e in endpoints):
                raise ConfigError("url: has user info, but basic.auth.credentials.source=USER_INFO takes the "
                                  "credentials from basic.auth.user.info: remove one of them")
        elif strings["basic.auth.user.info"]:
            raise ConfigError("basic.auth.user.info: set, but basic.auth.credentials.source=URL takes the "
                              "credentials from the URL: set the source to USER_INFO, or remove it")
        if strings["ssl.key.location"] and not strings["ssl.certificate.location"]:
            raise ConfigError("ssl.key.location: set without ssl.certificate.location (the client certificate)")
        ints = {key: parse_int(minimum)(key, conf.get(key, KEYS[key][0])) for key, minimum in
                (("timeout.ms", 1), ("max.retries", 0), ("retries.wait.ms", 0), ("retries.max.wait.ms", 0),
                 ("cache.capacity", 1))}
        config = cls(endpoints, user_info, strings["ssl.ca.location"], strings["ssl.certificate.location"],
                     strings["ssl.key.location"], strings["ssl.key.password"], ints["timeout.ms"],
                     ints["max.retries"], ints["retries.wait.ms"], ints["retries.max.wait.ms"],
                     ints["cache.capacity"])
        if any(e.scheme == "https" for e in endpoints):
            config.ssl_context()  # unreadable files fail now, naming their key
        return config

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of https URLs: the CA of ssl.ca.location (else the system's),
        certificates and host names always checked, and the client certificate if set."""
        key = "ssl.ca.location"
        try:
            if self.ssl_ca_location is None:
                context = ssl.create_default_context()
            elif os.path.isdir(self.ssl_ca_location):
                context = ssl.create_default_context(capath=self.ssl_ca_location)
            else:
                context = ssl.create_default_context(cafile=self.ssl_ca_location)
            if self.ssl_certificate_location:
                key = "ssl.certificate.location"
                context.load_cert_chain(self.ssl_certificate_location, self.ssl_key_location,
                                        self.ssl_key_password)
        except (OSError, ssl.SSLError) as exc:
            target = self.ssl_ca_location if key == "ssl.ca.location" else self.ssl_certificate_location
            also = " / ssl.key.location / ssl.key.password" if key == "ssl.certificate.location" else ""
            raise ConfigError(f"{key}{also}: cannot read {target!r}: {getattr(exc, 'strerror', None) or exc}") \
                from None
        return context


def _endpoint(entry: str) -> Endpoint:
    text = entry.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"url: {_without_password(text)!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"url: expected http://host:port or https://host:port entries separated by commas, got "
                          f"{_without_password(text)!r}")
    if parts.query or parts.fragment:
        raise ConfigError(f"url: expected no query or fragment in {_without_password(text)!r}")
    user_info = None
    if parts.username is not None:
        user_info = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password or ""))
    return Endpoint(parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80),
                    parts.path.rstrip("/"), user_info)


def _without_password(url: str) -> str:
    """``url`` with the password of its user info masked: for messages."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return url
    user_info, _, host = authority.rpartition("@")
    return f"{scheme}{sep}{user_info.partition(':')[0]}:***@{host}{slash}{path}"
