"""RegistryConfig: Confluent's setting names, and a ConfigError naming the key for each bad
value, before any request. No registry needed."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from kprod_broker import make_tls_files
from spark_sink.client.errors import ConfigError
from spark_sink.registry import IncompatibleSchemaError, RegistryConfig, SchemaRegistryClient


def test_urls_credentials_and_defaults() -> None:
    config = RegistryConfig.from_mapping({"url": " http://a:8081/x/ , https://bob:p%40ss@[::1]/apis "})
    assert [e.url for e in config.endpoints] == ["http://a:8081/x", "https://[::1]:443/apis"]
    assert config.endpoints[1].user_info == ("bob", "p@ss") and config.user_info is None
    assert (config.timeout_ms, config.max_retries, config.cache_capacity) == (10_000, 5, 1_000)
    assert "p@ss" not in repr(config) and "p%40ss" not in repr(config)
    by_setting = RegistryConfig.from_mapping({"url": "http://a", "basic.auth.user.info": "bob:x:y"})
    assert by_setting.user_info == ("bob", "x:y") and by_setting.endpoints[0].port == 80
    assert "x:y" not in repr(by_setting)


@pytest.mark.parametrize(("settings", "key"), [
    ({}, "url"),
    ({"url": ""}, "url"),
    ({"url": "registry:8081"}, "url"),
    ({"url": "ftp://registry"}, "url"),
    ({"url": "http://registry:port"}, "url"),
    ({"url": "http://registry?x=1"}, "url"),
    ({"url": "http://a", "schema.registry.url": "http://a"}, "unknown setting(s) schema.registry.url"),
    ({"url": "http://a", "basic.auth.credentials.source": "SASL_INHERIT"}, "basic.auth.credentials.source"),
    ({"url": "http://a", "basic.auth.credentials.source": "USER_INFO"}, "basic.auth.user.info"),
    ({"url": "http://a", "basic.auth.user.info": "no-colon"}, "basic.auth.user.info"),
    ({"url": "http://a", "basic.auth.user.info": "a:b", "basic.auth.credentials.source": "URL"},
     "basic.auth.user.info"),
    ({"url": "http://u:p@a", "basic.auth.user.info": "a:b"}, "url"),
    ({"url": "http://a", "timeout.ms": "0"}, "timeout.ms"),
    ({"url": "http://a", "timeout.ms": "soon"}, "timeout.ms"),
    ({"url": "http://a", "max.retries": "-1"}, "max.retries"),
    ({"url": "http://a", "cache.capacity": "0"}, "cache.capacity"),
    ({"url": "http://a", "ssl.key.location": "/k.pem"}, "ssl.key.location"),
    ({"url": "https://a", "ssl.ca.location": "/nonexistent/ca.pem"}, "ssl.ca.location"),
])
def test_a_bad_setting_names_its_key(settings: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("(", r"\(").replace(")", r"\)")):
        RegistryConfig.from_mapping(settings)


def test_a_password_never_appears_in_an_error() -> None:
    with pytest.raises(ConfigError) as bad:
        RegistryConfig.from_mapping({"url": "http://bob:s3cret@registry:port"})
    assert "s3cret" not in str(bad.value) and "bob:***@registry" in str(bad.value)
    with pytest.raises(ConfigError) as bad:
        RegistryConfig.from_mapping({"url": "http://a", "basic.auth.user.info": "s3cret"})
    assert "s3cret" not in str(bad.value)


def test_an_unreadable_client_certificate_is_named(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    good = {"url": "https://a", "ssl.ca.location": str(files.ca)}
    RegistryConfig.from_mapping({**good, "ssl.certificate.location": str(files.client_cert),
                                 "ssl.key.location": str(files.client_key)})
    with pytest.raises(ConfigError, match="ssl.certificate.location"):
        RegistryConfig.from_mapping({**good, "ssl.certificate.location": str(files.client_cert),
                                     "ssl.key.location": str(files.ca)})  # not its key
    RegistryConfig.from_mapping({**good, "ssl.ca.location": str(tmp_path)})  # a directory of CAs


def test_bad_arguments_are_refused_before_any_request() -> None:
    client = SchemaRegistryClient({"url": "http://127.0.0.1:1"})  # nothing listens there
    with pytest.raises(ConfigError, match="schema type"):
        client.register("s", "{}", "XML")
    with pytest.raises(ConfigError, match="subject"):
        client.register("", "{}")
    with pytest.raises(ConfigError, match="schema"):
        client.register("s", " ")
    with pytest.raises(ConfigError, match="compatibility level"):
        client.set_compatibility("LENIENT")
    with pytest.raises(ConfigError, match="schema id"):
        client.schema_by_id("1")  # type: ignore[arg-type]


def test_errors_pickle_whole() -> None:
    error = IncompatibleSchemaError("refused", subject="t-value", messages=("a field",), url="http://r", status=409,
                                    error_code=409)
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.subject, copy.messages, copy.url, copy.status) == (
        IncompatibleSchemaError, "refused", "t-value", ("a field",), "http://r", 409)
