"""SchemaRegistryClient: Confluent's Schema Registry REST API (which Apicurio serves too),
the calls a producer needs, cached.

What never changes is cached: the id a subject gives a schema (register, lookup) and the
schema of an id. The latest version of a subject is asked each time.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import urllib.parse
from collections.abc import Hashable, Mapping
from typing import Any

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.client.errors import ConfigError
from spark_sink.registry.config import RegistryConfig
from spark_sink.registry.errors import IncompatibleSchemaError, SchemaNotFoundError, SchemaRegistryError
from spark_sink.registry.transport import Transport

SCHEMA_TYPES = ("AVRO", "JSON", "PROTOBUF")
COMPATIBILITY_LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                        "FULL_TRANSITIVE")


@dataclasses.dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it. ``subject`` and ``version`` are None for a schema
    read by its id alone (one id may be under several subjects)."""

    id: int
    subject: str | None
    version: int | None
    schema_str: str
    schema_type: str = "AVRO"


class _Cache:
    """At most ``capacity`` entries, the least recently used dropped first; thread-safe."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        return None

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)


class SchemaRegistryClient:
    """A Schema Registry client: ``SchemaRegistryClient({"url": "http://registry:8081"})``
    (Confluent's setting names, RegistryConfig) or a RegistryConfig. ``clock``: the time of
    each call's deadline and of the waits between its retries (a test's, to move them)."""

    def __init__(self, config: RegistryConfig | Mapping[str, Any], clock: Time = SYSTEM_TIME) -> None:
        self.config = config if isinstance(config, RegistryConfig) else RegistryConfig.from_mapping(config)
        self._transport = Transport(self.config, clock)
        self._ids = _Cache(self.config.cache_capacity)  # (subject, type, schema) -> id
        self._versions = _Cache(self.config.cache_capacity)  # (subject, type, schema) -> RegisteredSchema
        self._schemas = _Cache(self.config.cache_capacity)  # id -> RegisteredSchema (no subject)

    def __repr__(self) -> str:
        return f"SchemaRegistryClient({', '.join(e.url for e in self.config.endpoints)})"

    def register(self, subject: str, schema_str: str, schema_type: str = "AVRO") -> int:
        """The id of ``schema_str`` under ``subject``, registered as its next version if the
        subject has no such schema yet. Raises IncompatibleSchemaError when the subject's
        compatibility level refuses it, InvalidSchemaError when the registry cannot parse it."""
        key = (_subject(subject), _schema_type(schema_type), schema_str)
        found = self._ids.get(key)
        if found is not None:
            return found
        try:
            answer = self._transport.request(
                "POST", f"/subjects/{_quote(subject)}/versions", _body(schema_str, key[1]),
                what=f"registering a schema under subject {subject!r}", subject=subject)
        except IncompatibleSchemaError:
            # Clients registering a new subject's schema at once: a registry may refuse all
            # but the first creator (Apicurio answers 409). The schema is then there, under
            # the first one's id; only if it is not was the refusal about compatibility.
            registered = self.lookup(subject, schema_str, key[1])
            if registered is None:
                raise
            return registered.id
        schema_id = _int(answer, "id")
        self._ids.put(key, schema_id)
        if self._schemas.get(schema_id) is None:
            self._schemas.put(schema_id, RegisteredSchema(schema_id, None, None, schema_str, key[1]))
        return schema_id

    def lookup(self, subject: str, schema_str: str, schema_type: str = "AVRO") -> RegisteredSchema | None:
        """The version of ``subject`` that is ``schema_str`` (compared as the registry
        compares schemas), or None if the subject has none (or does not exist)."""
        key = (_subject(subject), _schema_type(schema_type), schema_str)
        found = self._versions.get(key)
        if found is not None:
            return found
        try:
            answer = self._transport.request("POST", f"/subjects/{_quote(subject)}", _body(schema_str, key[1]),
                                             what=f"looking up a schema under subject {subject!r}")
        except SchemaNotFoundError:
            return None
        # Apicurio's answer leaves the type out: it is the one asked about.
        registered = _registered(answer, subject, schema_type=key[1])
        self._versions.put(key, registered)
        self._ids.put(key, registered.id)
        return registered

    def latest(self, subject: str) -> RegisteredSchema:
        """The subject's latest version, asked of the registry each time (not cached);
        SchemaNotFoundError if the subject does not exist."""
        answer = self._transport.request("GET", f"/subjects/{_quote(_subject(subject))}/versions/latest",
                                         what=f"reading the latest version of subject {subject!r}")
        registered = _registered(answer, subject)
        if self._schemas.get(registered.id) is None:
            self._schemas.put(registered.id, dataclasses.replace(registered, subject=None, version=None))
        return registered

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema with id ``schema_id`` (``subject`` and ``version`` None); cached."""
        if isinstance(schema_id, bool) or not isinstance(schema_id, int):
            raise ConfigError(f"schema id: expected an integer, got {schema_id!r}")
        found = self._schemas.get(schema_id)
        if found is not None:
            return found
        answer = self._transport.request("GET", f"/schemas/ids/{schema_id}", what=f"reading schema id {schema_id}")
        registered = _registered({**_mapping(answer), "id": schema_id}, None)
        self._schemas.put(schema_id, registered)
        return registered

    def compatible(self, subject: str, schema_str: str, schema_type: str = "AVRO") -> list[str]:
        """Why ``schema_str`` could not be registered under ``subject`` as its next version:
        the registry's messages, empty when it could (or when the subject does not exist)."""
        kind = _schema_type(schema_type)
        try:
            answer = self._transport.request(
                "POST", f"/compatibility/subjects/{_quote(_subject(subject))}/versions/latest?verbose=true",
                _body(schema_str, kind), what=f"checking a schema against subject {subject!r}", subject=subject)
        except SchemaNotFoundError:
            return []
        answer = _mapping(answer)
        if answer.get("is_compatible") is True:
            return []
        # Confluent's registry lists "messages"; Apicurio gives one "reason".
        messages = answer.get("messages") or ([answer["reason"]] if answer.get("reason") else [])
        return [str(m) for m in messages] or ["not compatible (the registry gave no reason)"]

    def set_compatibility(self, level: str, subject: str | None = None) -> None:
        """Set the compatibility level of ``subject``, or the registry's default if None."""
        level = level.strip().upper() if isinstance(level, str) else level
        if level not in COMPATIBILITY_LEVELS:
            raise ConfigError(f"compatibility level: expected one of {', '.join(COMPATIBILITY_LEVELS)}, "
                              f"got {level!r}")
        path = "/config" if subject is None else f"/config/{_quote(_subject(subject))}"
        self._transport.request("PUT", path, {"compatibility": level},
                                what=f"setting compatibility {level} of "
                                     + ("the registry" if subject is None else f"subject {subject!r}"))


def _subject(subject: str) -> str:
    if not isinstance(subject, str) or not subject:
        raise ConfigError(f"subject: expected a non-empty string, got {subject!r}")
    return subject


def _schema_type(schema_type: str) -> str:
    kind = schema_type.strip().upper() if isinstance(schema_type, str) else schema_type
    if kind not in SCHEMA_TYPES:
        raise ConfigError(f"schema type: expected one of {', '.join(SCHEMA_TYPES)}, got {schema_type!r}")
    return kind


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _body(schema_str: str, schema_type: str) -> dict[str, str]:
    if not isinstance(schema_str, str) or not schema_str.strip():
        raise ConfigError(f"schema: expected the schema's text, got {schema_str!r}")
    # Registries before schema types (Confluent 5.4) know AVRO only, and take no type.
    return {"schema": schema_str} if schema_type == "AVRO" else {"schema": schema_str, "schemaType": schema_type}


def _mapping(answer: Any) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise SchemaRegistryError(f"the Schema Registry answered {answer!r} where an object was expected")
    return answer


def _int(answer: Any, field: str) -> int:
    value = _mapping(answer).get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaRegistryError(f"the Schema Registry's answer has no integer {field!r}: {answer!r}")
    return value


def _registered(answer: Any, subject: str | None, schema_type: str = "AVRO") -> RegisteredSchema:
    body = _mapping(answer)
    schema = body.get("schema")
    if not isinstance(schema, str):
        raise SchemaRegistryError(f"the Schema Registry's answer has no schema: {answer!r}")
    version = body.get("version") if subject is not None else None
    return RegisteredSchema(_int(body, "id"), subject, version if isinstance(version, int) else None, schema,
                            str(body.get("schemaType") or schema_type).upper())
