"""The settings every kprod client shares: where the cluster is, how to connect, secure
and authenticate, and how long to wait, under the Java clients' key names and defaults
(Java's CommonClientConfigs). :class:`ClientConfig` holds them, validated once; the
producer's configuration extends it (:mod:`spark_sink.producer.config`), and the network
layer and the admin client take it as it is.

An unknown key or a bad value raises :class:`ConfigError` naming the key and what it
accepts.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from spark_sink.client.errors import ConfigError
from spark_sink.protocol.sasl import MECHANISMS as SASL_MECHANISMS

INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class Key:
    """One configuration key: its Java name, default and how to parse and check a value."""

    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    doc: str


def parse_int(minimum: int = 0, maximum: int = 2**63 - 1) -> Callable[[str, Any], int]:
    def parse(key: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            number = int(str(value).strip()) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if isinstance(value, float) and value != number:
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if not minimum <= number <= maximum:
            raise ConfigError(f"{key}: expected an integer in [{minimum}, {maximum}], got {number}")
        return number

    return parse


def parse_float(minimum: float, maximum: float) -> Callable[[str, Any], float]:
    def parse(key: str, value: Any) -> float:
        try:
            number = float(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or not minimum <= number <= maximum:
            raise ConfigError(f"{key}: expected a number in [{minimum}, {maximum}], got {value!r}")
        return number

    return parse


def parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def parse_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def parse_optional_str(key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    return parse_str(key, value)


_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def _security_protocol(key: str, value: Any) -> str:
    text = str(value).strip().upper()
    if text not in _SECURITY_PROTOCOLS:
        raise ConfigError(f"{key}: expected one of {', '.join(_SECURITY_PROTOCOLS)}, got {value!r}")
    return text


def _upper(key: str, value: Any) -> str:
    return parse_str(key, value).strip().upper()


def _store_type(key: str, value: Any) -> str:
    text = str(value).strip().upper()
    if text not in ("JKS", "PKCS12", "PEM"):
        raise ConfigError(f"{key}: expected JKS, PKCS12 or PEM, got {value!r}")
    return text


def _secret(key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string")  # the value itself stays out of messages
    return value


def _hostname_check(key: str, value: Any) -> str:
    text = "" if value is None else str(value).strip().lower()
    if text not in ("", "https"):
        raise ConfigError(f"{key}: expected https (check the broker's host name) or an empty string, got {value!r}")
    return text


def _bootstrap(key: str, value: Any) -> tuple[tuple[str, int], ...]:
    entries = value.split(",") if isinstance(value, str) else list(value or ())
    servers = []
    for entry in (str(e).strip() for e in entries):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        host = host.strip("[]")  # IPv6 literals come as [::1]:9092
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{key}: expected host:port entries separated by commas, got {entry!r}")
        servers.append((host, int(port)))
    if not servers:
        raise ConfigError(f"{key}: at least one host:port is required")
    return tuple(servers)


# A JAAS entry as Kafka reads sasl.jaas.config: `LoginModuleClass flag key="value" ...;`.
_JAAS_ENTRY = re.compile(r"\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*", re.S)
_JAAS_OPTION = re.compile(r'\s*([\w.]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s";]+))', re.S)


def jaas_options(text: str) -> dict[str, str]:
    """The options of a one-entry sasl.jaas.config. Errors never quote the text: it holds
    a password."""
    entry = _JAAS_ENTRY.fullmatch(text)
    if entry is None:
        raise ConfigError('sasl.jaas.config: expected `<LoginModule class> required username="..." password="...";`')
    options, rest = {}, entry.group(3)
    while rest.strip():
        option = _JAAS_OPTION.match(rest)
        if option is None:
            raise ConfigError('sasl.jaas.config: expected options as key="value" after the login module and flag')
        quoted, bare = option.group(2), option.group(3)
        options[option.group(1)] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        rest = rest[option.end():]
    return options


# Java's login callback handlers for OIDC client credentials (Kafka 3.1-3.x and 4.x):
# kprod does what they do when sasl.oauthbearer.token.endpoint.url is set.
_OIDC_LOGIN_HANDLERS = ("org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
                        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler")


def _token_provider(key: str, value: Any) -> Callable | str | None:
    """A callable, or ``module:function`` (imported where the token is needed, so that a
    Spark worker imports it itself)."""
    if value is None or value == "" or callable(value):
        return value or None
    text = parse_str(key, value).strip()
    module, sep, name = text.partition(":")
    if not sep or not module or not name.replace(".", "_").isidentifier() or \
            not all(part.isidentifier() for part in module.split(".")):
        raise ConfigError(f"{key}: expected a callable or 'package.module:function', got {value!r}")
    return text


def _login_handler(key: str, value: Any) -> str | None:
    text = parse_optional_str(key, value)
    if text is not None and text.strip() not in _OIDC_LOGIN_HANDLERS:
        raise ConfigError(f"{key}: kprod runs no Java callback handler; leave it out, or set it to "
                          f"{_OIDC_LOGIN_HANDLERS[1]} with sasl.oauthbearer.token.endpoint.url, and give other "
                          f"token sources as sasl.oauthbearer.token.provider (a Python callable), got {value!r}")
    return text


def sasl_credentials(jaas_config: str | None) -> tuple[str, str]:
    """User name and password from sasl.jaas.config (PlainLoginModule and ScramLoginModule
    both take them as the username and password options)."""
    if not jaas_config:
        raise ConfigError("sasl.jaas.config: required with security.protocol=SASL_PLAINTEXT or SASL_SSL, e.g. "
                          'org.apache.kafka.common.security.plain.PlainLoginModule required username="..." password="...";')
    options = jaas_options(jaas_config)
    missing = [name for name in ("username", "password") if name not in options]
    if missing:
        raise ConfigError(f"sasl.jaas.config: the {' and '.join(missing)} option(s) are missing")
    return options["username"], options["password"]


def _check_sasl(values: dict[str, Any]) -> None:
    if not values["security_protocol"].startswith("SASL_"):
        return  # sasl.* settings are ignored then, as in Java
    mechanism = values["sasl_mechanism"]
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"sasl.mechanism: expected one of {', '.join(SASL_MECHANISMS)} with "
                          f"security.protocol={values['security_protocol']}, got {mechanism!r}")
    if mechanism == "GSSAPI":
        kerberos_options(values["sasl_jaas_config"], values["sasl_kerberos_service_name"])
    elif mechanism == "OAUTHBEARER":
        oauth_options(values["sasl_jaas_config"], values["sasl_oauthbearer_token_endpoint_url"],
                      values["sasl_oauthbearer_token_provider"])
    else:
        sasl_credentials(values["sasl_jaas_config"])


# Java's Kerberos login modules (Oracle/OpenJDK's and IBM's): kprod does what they do
# with a keytab or a ticket cache, through the system's GSSAPI.
_KRB5_LOGIN_MODULES = ("com.sun.security.auth.module.Krb5LoginModule", "com.ibm.security.auth.module.Krb5LoginModule")


@dataclasses.dataclass(frozen=True, slots=True)
class KerberosOptions:
    """What SASL/GSSAPI takes from sasl.jaas.config and sasl.kerberos.service.name."""

    service_name: str
    principal: str | None  # None: the ticket cache's own principal
    keytab: str | None  # None: the tickets in the ticket cache (after kinit)
    ticket_cache: str | None  # None: the system's default ticket cache


def kerberos_options(jaas: str | None, service_name: str | None) -> KerberosOptions:
    """The Krb5LoginModule options of sasl.jaas.config, as Java's client takes them:
    ``useKeyTab=true keyTab="..." principal="..."`` (a keytab), or ``useTicketCache=true``
    (tickets from kinit, optionally ``ticketCache="..."`` and ``principal``)."""
    example = ('com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true '
               'keyTab="/path/to/client.keytab" principal="client@EXAMPLE.COM";')
    if not jaas:
        raise ConfigError(f"sasl.jaas.config: required with sasl.mechanism=GSSAPI (kprod reads no JAAS file), "
                          f"e.g. {example}")
    entry = _JAAS_ENTRY.fullmatch(jaas)
    module = entry.group(1) if entry else None
    if module not in _KRB5_LOGIN_MODULES:
        raise ConfigError(f"sasl.jaas.config: sasl.mechanism=GSSAPI takes Krb5LoginModule, e.g. {example}")
    options = jaas_options(jaas)
    use_keytab = options.get("useKeyTab", "false").lower() == "true"
    use_cache = options.get("useTicketCache", "false").lower() == "true"
    if use_keytab and not (options.get("keyTab") and options.get("principal")):
        raise ConfigError("sasl.jaas.config: useKeyTab=true needs keyTab=\"...\" and principal=\"...\"")
    if not use_keytab and not use_cache:
        raise ConfigError("sasl.jaas.config: Krb5LoginModule needs useKeyTab=true with keyTab and principal, or "
                          "useTicketCache=true (tickets from kinit); kprod cannot prompt for a password")
    service = service_name or options.get("serviceName")
    if not service:
        raise ConfigError("sasl.kerberos.service.name: required with sasl.mechanism=GSSAPI: the Kerberos "
                          "service name the brokers run as (usually kafka)")
    return KerberosOptions(service, options.get("principal"), options.get("keyTab") if use_keytab else None,
                           options.get("ticketCache"))


def oauth_options(jaas: str | None, url: str | None, provider: Callable | str | None) -> dict[str, str]:
    """The sasl.jaas.config options of OAUTHBEARER, checked against where the token comes
    from: a token provider, or the token endpoint ``url`` (which needs clientId and
    clientSecret, as Java's OAuthBearerLoginModule takes them)."""
    options = jaas_options(jaas) if jaas else {}
    if url and provider:
        raise ConfigError("sasl.oauthbearer.token.provider: give either it or sasl.oauthbearer.token.endpoint.url, "
                          "not both")
    if provider:
        return options
    if not url:
        raise ConfigError("sasl.mechanism: OAUTHBEARER needs sasl.oauthbearer.token.endpoint.url (OIDC client "
                          "credentials in sasl.jaas.config) or sasl.oauthbearer.token.provider (a Python callable); "
                          "Kafka's unsecured tokens are not supported")
    if not url.lower().startswith(("https://", "http://")):
        raise ConfigError(f"sasl.oauthbearer.token.endpoint.url: expected an https:// (or http://) URL, got {url!r}")
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number
    except ValueError:
        raise ConfigError(f"sasl.oauthbearer.token.endpoint.url: the port of {url!r} is not a number") from None
    if not parts.hostname:
        raise ConfigError(f"sasl.oauthbearer.token.endpoint.url: expected a host name in {url!r}")
    if not jaas:
        raise ConfigError("sasl.jaas.config: required with sasl.oauthbearer.token.endpoint.url, e.g. "
                          "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                          'clientId="..." clientSecret="..." scope="...";')
    missing = [name for name in ("clientId", "clientSecret") if name not in options]
    if missing:
        raise ConfigError(f"sasl.jaas.config: the {' and '.join(missing)} option(s) are missing "
                          "(OIDC client credentials for sasl.oauthbearer.token.endpoint.url)")
    return options


CLIENT_KEYS: tuple[Key, ...] = (
    Key("bootstrap.servers", None, _bootstrap, "host:port list used to discover the cluster"),
    Key("client.id", "kprod", parse_str, "client id sent with every request"),
    Key("request.timeout.ms", 30000, parse_int(0, INT32_MAX), "how long to wait for a broker response"),
    Key("retry.backoff.ms", 100, parse_int(0), "first backoff before a retry"),
    Key("retry.backoff.max.ms", 1000, parse_int(0), "largest backoff before a retry"),
    Key("metadata.max.age.ms", 300000, parse_int(0), "refresh metadata at least this often"),
    Key("reconnect.backoff.ms", 50, parse_int(0), "first wait before reconnecting to a broker"),
    Key("reconnect.backoff.max.ms", 1000, parse_int(0), "largest wait before reconnecting"),
    Key("socket.connection.setup.timeout.ms", 10000, parse_int(0), "bound on a TCP connect"),
    Key("send.buffer.bytes", 131072, parse_int(-1, INT32_MAX), "SO_SNDBUF, -1 for the OS default"),
    Key("receive.buffer.bytes", 32768, parse_int(-1, INT32_MAX), "SO_RCVBUF, -1 for the OS default"),
    Key("connections.max.idle.ms", 540000, parse_int(0), "close connections idle this long"),
    Key("security.protocol", "PLAINTEXT", _security_protocol, "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL"),
    Key("sasl.mechanism", "GSSAPI", _upper, "GSSAPI (Kerberos, Java's default), PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"),
    Key("sasl.jaas.config", None, _secret, 'a login module with username="..." password="..." (OAUTHBEARER: clientId="..." clientSecret="..."; GSSAPI: Krb5LoginModule with useKeyTab=true keyTab="..." principal="..." or useTicketCache=true) options'),
    Key("sasl.kerberos.service.name", None, parse_optional_str, "the Kerberos service name the brokers run as (GSSAPI), usually kafka"),
    Key("sasl.oauthbearer.token.endpoint.url", None, parse_optional_str, "OIDC token endpoint for the client credentials grant"),
    Key("sasl.oauthbearer.token.provider", None, _token_provider, "kprod's own: a callable or 'module:function' returning (token, expiry in epoch ms)"),
    Key("sasl.oauthbearer.scope.claim.name", "scope", parse_str, "the token's claim holding its scope"),
    Key("sasl.oauthbearer.sub.claim.name", "sub", parse_str, "the token's claim holding its principal"),
    Key("sasl.oauthbearer.header.urlencode", False, parse_bool, "URL-encode client id and secret in the token request's Basic header"),
    Key("sasl.login.callback.handler.class", None, _login_handler, "accepted for Java's OIDC handler only"),
    Key("sasl.login.refresh.window.factor", 0.8, parse_float(0.5, 1.0), "refresh a token at this share of its lifetime"),
    Key("sasl.login.refresh.window.jitter", 0.05, parse_float(0.0, 0.25), "random share of the lifetime added to the refresh time"),
    Key("sasl.login.refresh.min.period.seconds", 60, parse_int(0, 900), "least time between token refreshes"),
    Key("sasl.login.refresh.buffer.seconds", 300, parse_int(0, 3600), "refresh at least this long before the token expires"),
    Key("sasl.login.connect.timeout.ms", 10000, parse_int(1, INT32_MAX), "token endpoint connect timeout (Java: none)"),
    Key("sasl.login.read.timeout.ms", 10000, parse_int(1, INT32_MAX), "token endpoint read timeout (Java: none)"),
    Key("sasl.login.retry.backoff.ms", 100, parse_int(0), "first wait before asking the token endpoint again"),
    Key("sasl.login.retry.backoff.max.ms", 10000, parse_int(0), "time spent retrying the token endpoint"),
    Key("ssl.truststore.location", None, parse_optional_str, "file of the CA certificates to trust (default: the system's CAs)"),
    Key("ssl.truststore.certificates", None, parse_optional_str, "the CA certificates to trust, as PEM text"),
    Key("ssl.truststore.type", "JKS", _store_type, "JKS (Java's default) or PKCS12, either read by content as in Java, or PEM"),
    Key("ssl.truststore.password", None, _secret, "password of a JKS or PKCS12 truststore (without it, as in Java, no integrity check)"),
    Key("ssl.keystore.location", None, parse_optional_str, "file with this client's private key and certificate chain (mutual TLS)"),
    Key("ssl.keystore.type", "JKS", _store_type, "JKS (Java's default) or PKCS12, either read by content as in Java, or PEM"),
    Key("ssl.keystore.password", None, _secret, "password of a JKS or PKCS12 keystore"),
    Key("ssl.key.password", None, _secret, "password of the private key in ssl.keystore.location (default: ssl.keystore.password)"),
    Key("ssl.endpoint.identification.algorithm", "https", _hostname_check, "https checks the broker's host name; empty skips"),
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClientConfig:
    """Validated client settings; attribute names are the Java keys in snake_case."""

    KEYS: ClassVar[tuple[Key, ...]] = CLIENT_KEYS
    KIND: ClassVar[str] = "client"

    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str
    request_timeout_ms: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    metadata_max_age_ms: int
    reconnect_backoff_ms: int
    reconnect_backoff_max_ms: int
    socket_connection_setup_timeout_ms: int
    send_buffer_bytes: int
    receive_buffer_bytes: int
    connections_max_idle_ms: int
    security_protocol: str
    sasl_mechanism: str
    sasl_jaas_config: str | None = dataclasses.field(repr=False)
    sasl_kerberos_service_name: str | None
    sasl_oauthbearer_token_endpoint_url: str | None
    sasl_oauthbearer_token_provider: Callable[[dict[str, str]], tuple[str, float]] | str | None
    sasl_oauthbearer_scope_claim_name: str
    sasl_oauthbearer_sub_claim_name: str
    sasl_oauthbearer_header_urlencode: bool
    sasl_login_callback_handler_class: str | None
    sasl_login_refresh_window_factor: float
    sasl_login_refresh_window_jitter: float
    sasl_login_refresh_min_period_seconds: int
    sasl_login_refresh_buffer_seconds: int
    sasl_login_connect_timeout_ms: int
    sasl_login_read_timeout_ms: int
    sasl_login_retry_backoff_ms: int
    sasl_login_retry_backoff_max_ms: int
    ssl_truststore_location: str | None
    ssl_truststore_certificates: str | None
    ssl_truststore_type: str
    ssl_truststore_password: str | None = dataclasses.field(repr=False)
    ssl_keystore_location: str | None
    ssl_keystore_type: str
    ssl_keystore_password: str | None = dataclasses.field(repr=False)
    ssl_key_password: str | None = dataclasses.field(repr=False)
    ssl_endpoint_identification_algorithm: str

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> Self:
        """Parse and validate Java-named settings; defaults fill what is not given."""
        if not isinstance(settings, Mapping):
            raise ConfigError(f"{cls.KIND} config: expected a mapping of Java key names, got {type(settings).__name__}")
        known = {key.name for key in cls.KEYS}
        unknown = sorted(str(k) for k in settings if k not in known)
        if unknown:
            raise ConfigError(
                f"unknown {cls.KIND} config key(s): {', '.join(unknown)}; "
                f"known keys: {', '.join(sorted(known))}"
            )
        if settings.get("bootstrap.servers") in (None, "", [], ()):
            raise ConfigError("bootstrap.servers: required (host:port[,host:port...])")
        values = {
            key.name.replace(".", "_"): key.parse(key.name, settings[key.name]) if key.name in settings else key.default
            for key in cls.KEYS
        }
        cls._resolve(settings, values)
        return cls(**values)

    @classmethod
    def _resolve(cls, settings: Mapping[str, Any], values: dict[str, Any]) -> None:
        """Checks across keys, and values that follow from others (``values`` in place)."""
        _check_sasl(values)
        if values["retry_backoff_max_ms"] < values["retry_backoff_ms"]:
            values["retry_backoff_max_ms"] = values["retry_backoff_ms"]
        if values["reconnect_backoff_max_ms"] < values["reconnect_backoff_ms"]:
            values["reconnect_backoff_max_ms"] = values["reconnect_backoff_ms"]

    @staticmethod
    def of(config: Mapping[str, Any] | ClientConfig) -> ClientConfig:
        """``config`` if already validated (a producer's configuration included), else the
        client settings of a Java-named mapping, whose other keys (a producer's) are left
        to their own client: the admin client is handed producer settings in kprod."""
        if isinstance(config, ClientConfig):
            return config
        known = {key.name for key in CLIENT_KEYS}
        return ClientConfig.from_dict({k: v for k, v in config.items() if k in known})
