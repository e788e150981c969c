"""Producer configuration: the client's settings (:mod:`spark_sink.client.config`) and the
producer's own, under the Java producer's key names and defaults, validated once.

``ProducerConfig.from_dict({"bootstrap.servers": "host:9092", "linger.ms": 10})`` returns a
frozen :class:`ProducerConfig`; an unknown key or a bad value raises :class:`ConfigError`
naming the key and what it accepts.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from spark_sink.client.config import (
    CLIENT_KEYS,
    INT32_MAX,
    ClientConfig,
    Key,
    parse_bool,
    parse_int,
    parse_optional_str,
    parse_str,
)
from spark_sink.client.errors import ConfigError
from spark_sink.producer.partitioner import BUILTIN, JAVA_PARTITIONERS, UNIFORM_STICKY, import_partitioner
from spark_sink.protocol.compression import CODECS_BY_NAME, DEFAULT_LEVELS, LEVEL_RANGES, Codec

log = logging.getLogger(__name__)

_MAX_IDEMPOTENT_IN_FLIGHT = 5


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
    any_int = parse_int(-(2**31), INT32_MAX)
    accepted = f"[{low}, {high}]" + ("" if low <= default <= high else f" or {default}")

    def parse(key: str, value: Any) -> int:
        level = any_int(key, value)
        if level != default and not low <= level <= high:
            raise ConfigError(f"{key}: expected an integer in {accepted}, got {level}")
        return level

    return parse


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
    text = parse_str(key, value).strip()
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


PRODUCER_KEYS: tuple[Key, ...] = (
    Key("acks", "all", _acks, "all/-1, 1 or 0"),
    Key("linger.ms", 5, parse_int(0, INT32_MAX), "how long a batch waits for more records"),
    Key("batch.size", 16384, parse_int(0, INT32_MAX), "target record batch size in bytes"),
    Key("buffer.memory", 33554432, parse_int(1), "bytes of records waiting to be sent before send() blocks"),
    Key("max.block.ms", 60000, parse_int(0), "longest send()/flush wait for metadata or buffer space"),
    Key("max.request.size", 1048576, parse_int(1, INT32_MAX), "largest request (and record) in bytes"),
    Key("delivery.timeout.ms", 120000, parse_int(0, INT32_MAX), "upper bound on reporting success or failure of a send"),
    Key("retries", INT32_MAX, parse_int(0, INT32_MAX), "how often a retriable failure is retried"),
    Key("max.in.flight.requests.per.connection", 5, parse_int(1, INT32_MAX), "unacknowledged requests per broker"),
    Key("enable.idempotence", True, parse_bool, "exactly one copy of each record per partition, in order"),
    Key("compression.type", "none", _compression, "none, gzip, snappy, lz4 or zstd"),
    Key("compression.gzip.level", DEFAULT_LEVELS[Codec.GZIP], _level(Codec.GZIP), "1-9, -1 for zlib's default (6)"),
    Key("compression.lz4.level", DEFAULT_LEVELS[Codec.LZ4], _level(Codec.LZ4), "1-17; 9 is lz4's fast mode, others LZ4HC"),
    Key("compression.zstd.level", DEFAULT_LEVELS[Codec.ZSTD], _level(Codec.ZSTD), "-131072 to 22"),
    Key("metadata.max.idle.ms", 300000, parse_int(5000), "forget topics not produced to for this long"),
    Key("partitioner.ignore.keys", False, parse_bool, "spread keyed records like keyless ones"),
    Key("partitioner.adaptive.partitioning.enable", True, parse_bool, "records without keys go less often to partitions whose brokers fall behind (KIP-794)"),
    Key("partitioner.availability.timeout.ms", 0, parse_int(0), "skip a partition whose leader took nothing for this long (0: never)"),
    Key("partitioner.class", None, _partitioner, "Java's built-in partitioner classes, or a Python callable (topic, key, value, num_partitions) -> partition, or its 'module:function'"),
    Key("interceptors", (), _interceptors, "objects with on_send/on_acknowledgement"),
    Key("key.serializer", None, _callable_or_none, "callable turning a key into bytes"),
    Key("value.serializer", None, _callable_or_none, "callable turning a value into bytes"),
    Key("transactional.id", None, parse_optional_str, "enables transactions under this id (stable across restarts)"),
    Key("transaction.timeout.ms", 60000, parse_int(1, INT32_MAX), "the coordinator aborts a transaction open this long"),
)
# Every key a producer takes: the client's, then its own.
KEYS: dict[str, Key] = {k.name: k for k in (*CLIENT_KEYS, *PRODUCER_KEYS)}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProducerConfig(ClientConfig):
    """Validated producer settings; attribute names are the Java keys in snake_case."""

    KEYS: ClassVar[tuple[Key, ...]] = tuple(KEYS.values())
    KIND: ClassVar[str] = "producer"

    acks: int
    linger_ms: int
    batch_size: int
    buffer_memory: int
    max_block_ms: int
    max_request_size: int
    delivery_timeout_ms: int
    retries: int
    max_in_flight_requests_per_connection: int
    enable_idempotence: bool
    compression_type: str
    compression_gzip_level: int
    compression_lz4_level: int
    compression_zstd_level: int
    metadata_max_idle_ms: int
    partitioner_ignore_keys: bool
    partitioner_adaptive_partitioning_enable: bool
    partitioner_availability_timeout_ms: int
    partitioner_class: str | Callable | None  # None: the built-in partitioner
    interceptors: tuple
    key_serializer: Callable[[Any], bytes] | None
    value_serializer: Callable[[Any], bytes] | None
    transactional_id: str | None
    transaction_timeout_ms: int

    @property
    def compression_codec(self) -> int:
        """The record batch attribute value of compression.type (0 none ... 4 zstd)."""
        return int(CODECS_BY_NAME[self.compression_type])

    @property
    def compression_level(self) -> int | None:
        """compression.<type>.level of the configured codec (None for none and snappy)."""
        return getattr(self, f"compression_{self.compression_type}_level", None)

    @classmethod
    def _resolve(cls, settings: Mapping[str, Any], values: dict[str, Any]) -> None:
        # super() without arguments fails in a slots dataclass: it is a new class.
        super(ProducerConfig, cls)._resolve(settings, values)
        # Defaults that are strings go through their parser too, so types are uniform.
        values["acks"] = _acks("acks", values["acks"])
        values["enable_idempotence"] = _resolve_idempotence(settings, values)
        if values["partitioner_class"] == UNIFORM_STICKY:
            # Java's UniformStickyPartitioner is the built-in one ignoring keys.
            values["partitioner_class"], values["partitioner_ignore_keys"] = None, True
        if values["delivery_timeout_ms"] < values["linger_ms"] + values["request_timeout_ms"]:
            raise ConfigError(
                "delivery.timeout.ms: must be at least linger.ms + request.timeout.ms "
                f"({values['linger_ms']} + {values['request_timeout_ms']}), got {values['delivery_timeout_ms']}"
            )


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
