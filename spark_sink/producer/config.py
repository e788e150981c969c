"""Producer configuration: Java producer key names and defaults, validated once.

``ProducerConfig.from_dict({"bootstrap.servers": "host:9092", "linger.ms": 10})`` returns a
frozen :class:`ProducerConfig`; an unknown key or a bad value raises :class:`ConfigError`
naming the key and what it accepts.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from spark_sink.producer.errors import ConfigError
from spark_sink.producer.partitioner import BUILTIN, JAVA_PARTITIONERS, UNIFORM_STICKY, import_partitioner
from spark_sink.protocol.compression import CODECS_BY_NAME, DEFAULT_LEVELS, LEVEL_RANGES, Codec
from spark_sink.protocol.sasl import MECHANISMS as SASL_MECHANISMS

log = logging.getLogger(__name__)

_MAX_IDEMPOTENT_IN_FLIGHT = 5
_INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class _Key:
    """One configuration key: its Java name, default and how to parse and check a value."""

    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    doc: str


def _int(minimum: int = 0, maximum: int = 2**63 - 1) -> Callable[[str, Any], int]:
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


def _float(minimum: float, maximum: float) -> Callable[[str, Any], float]:
    def parse(key: str, value: Any) -> float:
        try:
            number = float(str(value).strip()) if not isinstance(value, bool) else None
        except ValueError:
            number = None
        if number is None or not minimum <= number <= maximum:
            raise ConfigError(f"{key}: expected a number in [{minimum}, {maximum}], got {value!r}")
        return number

    return parse


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _optional_str(key: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    return _str(key, value)


def _acks(key: str, value: Any) -> int:
    text = str(value).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ConfigError(f"{key}: expected one of all, -1, 0, 1, got {value!r}")


def _compression(key: str, value: Any) -> str:
    text = str(value).strip().lower()
    if text not in CODECS_BY_NAME:
        raise ConfigError(f"{key}: expected one of {', '.join(CODECS_BY_NAME)}, got {value!r}")
    return text


def _level(codec: Codec) -> Callable[[str, Any], int]:
    """A compression level in Java's range for ``codec`` (or its default, e.g. gzip's -1)."""
    low, high = LEVEL_RANGES[codec]
    default = DEFAULT_LEVELS[codec]
    parse_int = _int(-(2**31), _INT32_MAX)
    accepted = f"[{low}, {high}]" + ("" if low <= default <= high else f" or {default}")

    def parse(key: str, value: Any) -> int:
        level = parse_int(key, value)
        if level != default and not low <= level <= high:
            raise ConfigError(f"{key}: expected an integer in {accepted}, got {level}")
        return level

    return parse


_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def _security_protocol(key: str, value: Any) -> str:
    text = str(value).strip().upper()
    if text not in _SECURITY_PROTOCOLS:
        raise ConfigError(f"{key}: expected one of {', '.join(_SECURITY_PROTOCOLS)}, got {value!r}")
    return text


def _upper(key: str, value: Any) -> str:
    return _str(key, value).strip().upper()


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


def _callable_or_none(key: str, value: Any) -> Callable | None:
    if value is None or callable(value):
        return value
    raise ConfigError(f"{key}: expected a callable or None, got {type(value).__name__}")


def _partitioner(key: str, value: Any) -> str | Callable | None:
    """None (the built-in partitioner), a Java built-in class name (as kprod's name for
    it), a callable, or the import path of a Python callable, imported here so that a bad
    one fails where the settings are checked (the Spark driver)."""
    if value is None or value == "" or callable(value):
        return value or None
    text = _str(key, value).strip()
    if text in JAVA_PARTITIONERS:
        return None if JAVA_PARTITIONERS[text] == BUILTIN else JAVA_PARTITIONERS[text]
    try:
        import_partitioner(text)
    except Exception as exc:
        raise ConfigError(
            f"{key}: {text!r} is not a Python callable kprod can import ({type(exc).__name__}: {exc}). kprod runs "
            f"no Java classes: give {', '.join(JAVA_PARTITIONERS)}, or a Python function as 'package.module:function' "
            "taking (topic, key, value, num_partitions) and returning the partition") from None
    return text


def _interceptors(key: str, value: Any) -> tuple:
    items = () if value is None else tuple(value) if isinstance(value, (list, tuple)) else (value,)
    for item in items:
        if not (callable(getattr(item, "on_send", None)) or callable(getattr(item, "on_acknowledgement", None))):
            raise ConfigError(f"{key}: each interceptor needs on_send(record) and/or on_acknowledgement(metadata, error), got {item!r}")
    return items


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
    text = _str(key, value).strip()
    module, sep, name = text.partition(":")
    if not sep or not module or not name.replace(".", "_").isidentifier() or \
            not all(part.isidentifier() for part in module.split(".")):
        raise ConfigError(f"{key}: expected a callable or 'package.module:function', got {value!r}")
    return text


def _login_handler(key: str, value: Any) -> str | None:
    text = _optional_str(key, value)
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
    if not jaas:
        raise ConfigError("sasl.jaas.config: required with sasl.oauthbearer.token.endpoint.url, e.g. "
                          "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
                          'clientId="..." clientSecret="..." scope="...";')
    missing = [name for name in ("clientId", "clientSecret") if name not in options]
    if missing:
        raise ConfigError(f"sasl.jaas.config: the {' and '.join(missing)} option(s) are missing "
                          "(OIDC client credentials for sasl.oauthbearer.token.endpoint.url)")
    return options


_KEYS: tuple[_Key, ...] = (
    _Key("bootstrap.servers", None, _bootstrap, "host:port list used to discover the cluster"),
    _Key("client.id", "kprod", _str, "client id sent with every request"),
    _Key("acks", "all", _acks, "all/-1, 1 or 0"),
    _Key("linger.ms", 5, _int(0, _INT32_MAX), "how long a batch waits for more records"),
    _Key("batch.size", 16384, _int(0, _INT32_MAX), "target record batch size in bytes"),
    _Key("buffer.memory", 33554432, _int(1), "bytes of records waiting to be sent before send() blocks"),
    _Key("max.block.ms", 60000, _int(0), "longest send()/flush wait for metadata or buffer space"),
    _Key("max.request.size", 1048576, _int(1, _INT32_MAX), "largest request (and record) in bytes"),
    _Key("request.timeout.ms", 30000, _int(0, _INT32_MAX), "how long to wait for a broker response"),
    _Key("delivery.timeout.ms", 120000, _int(0, _INT32_MAX), "upper bound on reporting success or failure of a send"),
    _Key("retries", _INT32_MAX, _int(0, _INT32_MAX), "how often a retriable failure is retried"),
    _Key("retry.backoff.ms", 100, _int(0), "first backoff before a retry"),
    _Key("retry.backoff.max.ms", 1000, _int(0), "largest backoff before a retry"),
    _Key("max.in.flight.requests.per.connection", 5, _int(1, _INT32_MAX), "unacknowledged requests per broker"),
    _Key("enable.idempotence", True, _bool, "exactly one copy of each record per partition, in order"),
    _Key("compression.type", "none", _compression, "none, gzip, snappy, lz4 or zstd"),
    _Key("compression.gzip.level", DEFAULT_LEVELS[Codec.GZIP], _level(Codec.GZIP), "1-9, -1 for zlib's default (6)"),
    _Key("compression.lz4.level", DEFAULT_LEVELS[Codec.LZ4], _level(Codec.LZ4), "1-17; 9 is lz4's fast mode, others LZ4HC"),
    _Key("compression.zstd.level", DEFAULT_LEVELS[Codec.ZSTD], _level(Codec.ZSTD), "-131072 to 22"),
    _Key("metadata.max.age.ms", 300000, _int(0), "refresh metadata at least this often"),
    _Key("metadata.max.idle.ms", 300000, _int(5000), "forget topics not produced to for this long"),
    _Key("partitioner.ignore.keys", False, _bool, "spread keyed records like keyless ones"),
    _Key("partitioner.adaptive.partitioning.enable", True, _bool, "records without keys go less often to partitions whose brokers fall behind (KIP-794)"),
    _Key("partitioner.availability.timeout.ms", 0, _int(0), "skip a partition whose leader took nothing for this long (0: never)"),
    _Key("partitioner.class", None, _partitioner, "Java's built-in partitioner classes, or a Python callable (topic, key, value, num_partitions) -> partition, or its 'module:function'"),
    _Key("interceptors", (), _interceptors, "objects with on_send/on_acknowledgement"),
    _Key("key.serializer", None, _callable_or_none, "callable turning a key into bytes"),
    _Key("value.serializer", None, _callable_or_none, "callable turning a value into bytes"),
    _Key("reconnect.backoff.ms", 50, _int(0), "first wait before reconnecting to a broker"),
    _Key("reconnect.backoff.max.ms", 1000, _int(0), "largest wait before reconnecting"),
    _Key("socket.connection.setup.timeout.ms", 10000, _int(0), "bound on a TCP connect"),
    _Key("send.buffer.bytes", 131072, _int(-1, _INT32_MAX), "SO_SNDBUF, -1 for the OS default"),
    _Key("receive.buffer.bytes", 32768, _int(-1, _INT32_MAX), "SO_RCVBUF, -1 for the OS default"),
    _Key("connections.max.idle.ms", 540000, _int(0), "close connections idle this long"),
    _Key("transactional.id", None, _optional_str, "enables transactions under this id (stable across restarts)"),
    _Key("transaction.timeout.ms", 60000, _int(1, _INT32_MAX), "the coordinator aborts a transaction open this long"),
    _Key("security.protocol", "PLAINTEXT", _security_protocol, "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL"),
    _Key("sasl.mechanism", "GSSAPI", _upper, "GSSAPI (Kerberos, Java's default), PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER"),
    _Key("sasl.jaas.config", None, _secret, 'a login module with username="..." password="..." (OAUTHBEARER: clientId="..." clientSecret="..."; GSSAPI: Krb5LoginModule with useKeyTab=true keyTab="..." principal="..." or useTicketCache=true) options'),
    _Key("sasl.kerberos.service.name", None, _optional_str, "the Kerberos service name the brokers run as (GSSAPI), usually kafka"),
    _Key("sasl.oauthbearer.token.endpoint.url", None, _optional_str, "OIDC token endpoint for the client credentials grant"),
    _Key("sasl.oauthbearer.token.provider", None, _token_provider, "kprod's own: a callable or 'module:function' returning (token, expiry in epoch ms)"),
    _Key("sasl.oauthbearer.scope.claim.name", "scope", _str, "the token's claim holding its scope"),
    _Key("sasl.oauthbearer.sub.claim.name", "sub", _str, "the token's claim holding its principal"),
    _Key("sasl.oauthbearer.header.urlencode", False, _bool, "URL-encode client id and secret in the token request's Basic header"),
    _Key("sasl.login.callback.handler.class", None, _login_handler, "accepted for Java's OIDC handler only"),
    _Key("sasl.login.refresh.window.factor", 0.8, _float(0.5, 1.0), "refresh a token at this share of its lifetime"),
    _Key("sasl.login.refresh.window.jitter", 0.05, _float(0.0, 0.25), "random share of the lifetime added to the refresh time"),
    _Key("sasl.login.refresh.min.period.seconds", 60, _int(0, 900), "least time between token refreshes"),
    _Key("sasl.login.refresh.buffer.seconds", 300, _int(0, 3600), "refresh at least this long before the token expires"),
    _Key("sasl.login.connect.timeout.ms", 10000, _int(1, _INT32_MAX), "token endpoint connect timeout (Java: none)"),
    _Key("sasl.login.read.timeout.ms", 10000, _int(1, _INT32_MAX), "token endpoint read timeout (Java: none)"),
    _Key("sasl.login.retry.backoff.ms", 100, _int(0), "first wait before asking the token endpoint again"),
    _Key("sasl.login.retry.backoff.max.ms", 10000, _int(0), "time spent retrying the token endpoint"),
    _Key("ssl.truststore.location", None, _optional_str, "file of the CA certificates to trust (default: the system's CAs)"),
    _Key("ssl.truststore.certificates", None, _optional_str, "the CA certificates to trust, as PEM text"),
    _Key("ssl.truststore.type", "JKS", _store_type, "JKS (Java's default) or PKCS12, either read by content as in Java, or PEM"),
    _Key("ssl.truststore.password", None, _secret, "password of a JKS or PKCS12 truststore (without it, as in Java, no integrity check)"),
    _Key("ssl.keystore.location", None, _optional_str, "file with this client's private key and certificate chain (mutual TLS)"),
    _Key("ssl.keystore.type", "JKS", _store_type, "JKS (Java's default) or PKCS12, either read by content as in Java, or PEM"),
    _Key("ssl.keystore.password", None, _secret, "password of a JKS or PKCS12 keystore"),
    _Key("ssl.key.password", None, _secret, "password of the private key in ssl.keystore.location (default: ssl.keystore.password)"),
    _Key("ssl.endpoint.identification.algorithm", "https", _hostname_check, "https checks the broker's host name; empty skips"),
)
KEYS: dict[str, _Key] = {k.name: k for k in _KEYS}


@dataclasses.dataclass(frozen=True, slots=True)
class ProducerConfig:
    """Validated producer settings; attribute names are the Java keys in snake_case."""

    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str
    acks: int
    linger_ms: int
    batch_size: int
    buffer_memory: int
    max_block_ms: int
    max_request_size: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    retries: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    max_in_flight_requests_per_connection: int
    enable_idempotence: bool
    compression_type: str
    compression_gzip_level: int
    compression_lz4_level: int
    compression_zstd_level: int
    metadata_max_age_ms: int
    metadata_max_idle_ms: int
    partitioner_ignore_keys: bool
    partitioner_adaptive_partitioning_enable: bool
    partitioner_availability_timeout_ms: int
    partitioner_class: str | Callable | None  # None: the built-in partitioner
    interceptors: tuple
    key_serializer: Callable[[Any], bytes] | None
    value_serializer: Callable[[Any], bytes] | None
    reconnect_backoff_ms: int
    reconnect_backoff_max_ms: int
    socket_connection_setup_timeout_ms: int
    send_buffer_bytes: int
    receive_buffer_bytes: int
    connections_max_idle_ms: int
    transactional_id: str | None
    transaction_timeout_ms: int
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

    @property
    def compression_codec(self) -> int:
        """The record batch attribute value of compression.type (0 none ... 4 zstd)."""
        return int(CODECS_BY_NAME[self.compression_type])

    @property
    def compression_level(self) -> int | None:
        """compression.<type>.level of the configured codec (None for none and snappy)."""
        return getattr(self, f"compression_{self.compression_type}_level", None)

    @classmethod
    def from_dict(cls, settings: Mapping[str, Any]) -> ProducerConfig:
        """Parse and validate Java-named settings; defaults fill what is not given."""
        if not isinstance(settings, Mapping):
            raise ConfigError(f"producer config: expected a mapping of Java key names, got {type(settings).__name__}")
        unknown = sorted(str(k) for k in settings if k not in KEYS)
        if unknown:
            raise ConfigError(
                f"unknown producer config key(s): {', '.join(unknown)}; "
                f"known keys: {', '.join(sorted(KEYS))}"
            )
        if settings.get("bootstrap.servers") in (None, "", [], ()):
            raise ConfigError("bootstrap.servers: required (host:port[,host:port...])")
        values = {
            key.name.replace(".", "_"): key.parse(key.name, settings[key.name]) if key.name in settings else key.default
            for key in _KEYS
        }
        # Defaults that are strings go through their parser too, so types are uniform.
        values["acks"] = _acks("acks", values["acks"])
        values["enable_idempotence"] = _resolve_idempotence(settings, values)
        if values["partitioner_class"] == UNIFORM_STICKY:
            # Java's UniformStickyPartitioner is the built-in one ignoring keys.
            values["partitioner_class"], values["partitioner_ignore_keys"] = None, True
        _check_sasl(values)
        if values["delivery_timeout_ms"] < values["linger_ms"] + values["request_timeout_ms"]:
            raise ConfigError(
                "delivery.timeout.ms: must be at least linger.ms + request.timeout.ms "
                f"({values['linger_ms']} + {values['request_timeout_ms']}), got {values['delivery_timeout_ms']}"
            )
        if values["retry_backoff_max_ms"] < values["retry_backoff_ms"]:
            values["retry_backoff_max_ms"] = values["retry_backoff_ms"]
        if values["reconnect_backoff_max_ms"] < values["reconnect_backoff_ms"]:
            values["reconnect_backoff_max_ms"] = values["reconnect_backoff_ms"]
        return cls(**values)


def idempotence_conflicts(acks: int, retries: int, max_in_flight: int) -> list[tuple[str, str]]:
    """Java's rule: idempotence needs acks=all, retries > 0 and at most 5 requests in
    flight. Each setting that breaks it, as (its key, what it must be)."""
    conflicts = []
    if acks != -1:
        conflicts.append(("acks", "must be all"))
    if retries == 0:
        conflicts.append(("retries", "must be greater than 0"))
    if max_in_flight > _MAX_IDEMPOTENT_IN_FLIGHT:
        conflicts.append(("max.in.flight.requests.per.connection", f"must be at most {_MAX_IDEMPOTENT_IN_FLIGHT}"))
    return conflicts


def _resolve_idempotence(settings: Mapping[str, Any], values: dict[str, Any]) -> bool:
    """Whether the producer is idempotent. Asked for explicitly (or by transactions), a
    conflict with :func:`idempotence_conflicts` is an error; left at its default,
    idempotence is quietly turned off instead.
    """
    conflicts = [f"{key} {rule}" for key, rule in idempotence_conflicts(
        values["acks"], values["retries"], values["max_in_flight_requests_per_connection"])]
    if values["transactional_id"] is not None:
        # As Java: a transactional producer is idempotent, whatever was asked.
        if not values["enable_idempotence"] and "enable.idempotence" in settings:
            raise ConfigError("enable.idempotence: must be true when transactional.id is set")
        if conflicts:
            raise ConfigError(f"transactional.id: transactions require that {'; '.join(conflicts)}")
        return True
    if not values["enable_idempotence"]:
        return False
    if conflicts:
        if "enable.idempotence" in settings:
            raise ConfigError(f"enable.idempotence: true requires that {'; '.join(conflicts)}")
        log.info("idempotence disabled because %s", "; ".join(conflicts))
        return False
    return True
