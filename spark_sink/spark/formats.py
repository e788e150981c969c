"""The sink's key and value formats (``kprod.value.format=avro``): options into the
producer's ArrowSerializers, and the driver's part, before any task: the column checked
against its schema and the schema's registry id resolved (registered, looked up or the
latest), so that tasks only encode."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spark_sink.producer import ArrowSerializer, ColumnError, ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

REGISTRY_PREFIX = "kprod.schema.registry."

# Spark lower-cases option names; each is given here as a user writes it.
FORMAT_OPTIONS: dict[str, str] = {
    "kprod.value.format": (
        "kprod.value.format: binary (default: a string or binary value column, sent as it is), avro or json "
        "(JSON Schema): the value column is a struct, sent in the Schema Registry's wire format"),
    "kprod.key.format": "kprod.key.format: binary (default), avro or json, as kprod.value.format for the key column",
    "kprod.value.avro.schema": "kprod.value.avro.schema: the value's Avro schema (JSON); default: derived from the "
                               "column as Spark's to_avro derives it",
    "kprod.value.json.schema": "kprod.value.json.schema: the value's JSON Schema; default: derived from the column",
    "kprod.key.avro.schema": "kprod.key.avro.schema: the key's Avro schema (JSON); default: derived",
    "kprod.key.json.schema": "kprod.key.json.schema: the key's JSON Schema; default: derived",
    "kprod.value.subject.name.strategy": (
        "kprod.value.subject.name.strategy: TopicNameStrategy (default, <topic>-value), RecordNameStrategy or "
        "TopicRecordNameStrategy"),
    "kprod.key.subject.name.strategy": "kprod.key.subject.name.strategy: as the value's, <topic>-key by default",
    "kprod.auto.register.schemas": (
        "kprod.auto.register.schemas: true (default): the schema is registered under its subject (a new version "
        "if the subject's compatibility allows it); false: it must be registered already"),
    "kprod.use.latest.version": (
        "kprod.use.latest.version: false (default); true: rows are written with the subject's latest schema"),
    "kprod.schema.registry.<setting>": (
        "kprod.schema.registry.url (required with a format), .basic.auth.user.info, .basic.auth.credentials.source, "
        ".ssl.ca.location, .ssl.certificate.location, .ssl.key.location, .timeout.ms: the registry client's "
        "settings under Confluent's names"),
}
_BOOLEANS = ("true", "false")


def is_format_option(key: str) -> bool:
    return key in FORMAT_OPTIONS or key.startswith(REGISTRY_PREFIX)


@dataclass(frozen=True)
class ColumnFormats:
    """The key's and the value's serializer (None: sent as the column's bytes)."""

    key: ArrowSerializer | None
    value: ArrowSerializer | None

    def formatted(self) -> frozenset[str]:
        return frozenset(s.column for s in (self.key, self.value) if s is not None)


def _flag(opts: Mapping[str, str], key: str, default: str) -> bool:
    value = opts.get(key, default).strip().lower()
    if value not in _BOOLEANS:
        raise ConfigError(f"option {key!r}: expected true or false, got {opts[key]!r}")
    return value == "true"


def parse_formats(opts: Mapping[str, str]) -> ColumnFormats | None:
    """The formats the (lower-cased) options ask for; ConfigError names the option."""
    registry = {k[len(REGISTRY_PREFIX):]: v for k, v in opts.items() if k.startswith(REGISTRY_PREFIX)}
    serializers: dict[str, ArrowSerializer | None] = {}
    for column in ("key", "value"):
        fmt = opts.get(f"kprod.{column}.format", "binary").strip().lower()
        if fmt == "binary":
            for other in ("avro", "json"):
                if f"kprod.{column}.{other}.schema" in opts:
                    raise ConfigError(f"option 'kprod.{column}.{other}.schema' is set, but kprod.{column}.format is "
                                      f"binary: set kprod.{column}.format={other}")
            serializers[column] = None
            continue
        if fmt not in ("avro", "json"):
            raise ConfigError(f"option 'kprod.{column}.format': expected binary, avro or json, got {fmt!r}")
        other = "json" if fmt == "avro" else "avro"
        if f"kprod.{column}.{other}.schema" in opts:
            raise ConfigError(f"option 'kprod.{column}.{other}.schema' does not go with kprod.{column}.format={fmt}")
        if "url" not in registry:
            raise ConfigError(f"kprod.{column}.format={fmt} needs option 'kprod.schema.registry.url' (the Schema "
                              "Registry's URL, e.g. http://registry:8081)")
        try:
            serializers[column] = ArrowSerializer(
                fmt, registry, is_key=column == "key", schema=opts.get(f"kprod.{column}.{fmt}.schema"),
                subject_name_strategy=opts.get(f"kprod.{column}.subject.name.strategy", "TopicNameStrategy"),
                auto_register=_flag(opts, "kprod.auto.register.schemas", "true"),
                use_latest_version=_flag(opts, "kprod.use.latest.version", "false"))
        except ConfigError as exc:  # named as the registry client or the serializer names it
            name, _, rest = str(exc).partition(": ")
            if name == "schema registry":
                raise ConfigError(f"options {REGISTRY_PREFIX}*: {rest}") from None
            prefix = REGISTRY_PREFIX if name in registry or name == "url" else "kprod."
            raise ConfigError(f"option '{prefix}{name}': {rest}") from None
    if serializers["key"] is None and serializers["value"] is None:
        if registry:
            raise ConfigError(f"option(s) {', '.join(REGISTRY_PREFIX + k for k in sorted(registry))} set, but "
                              "neither kprod.key.format nor kprod.value.format is avro or json")
        return None
    return ColumnFormats(serializers["key"], serializers["value"])


def prepare_formats(formats: ColumnFormats, schema: StructType, topic: str | None) -> None:
    """On the driver, before any task: each formatted column checked against its schema
    and, where its subject is known here (a topic option, or a subject named after the
    record alone), the schema's id resolved for the tasks."""
    from spark_sink.spark.columns import arrow_type_of

    for serializer in (formats.key, formats.value):
        if serializer is None:
            continue
        field = next((f for f in schema.fields if f.name.lower() == serializer.column), None)
        if field is None:
            raise ColumnError(f"kprod.{serializer.column}.format={serializer.format}: the DataFrame has no "
                              f"{serializer.column!r} column; it has {', '.join(map(repr, schema.fieldNames()))}")
        arrow_type = arrow_type_of(field.dataType)
        if topic is not None or serializer.strategy.endswith("RecordNameStrategy") \
                and not serializer.strategy.endswith("TopicRecordNameStrategy"):
            serializer.prepare(arrow_type, topic or "")
        else:
            serializer.check(arrow_type)  # each row's topic names its subject: the tasks resolve them
