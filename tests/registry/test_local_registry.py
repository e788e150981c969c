"""The suite's Schema Registry (kprod_broker/registry.py): a real Apicurio Registry that
confluent-kafka's client talks to as it would to Confluent's."""

from __future__ import annotations

import json
import uuid

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError


def _record(*fields: dict) -> str:
    return json.dumps({"type": "record", "name": "R", "fields": list(fields)})


def test_the_registry_is_backward_compatible_as_confluent_s(schema_registry: str) -> None:
    client = SchemaRegistryClient({"url": schema_registry})
    assert client.get_compatibility() == "BACKWARD"
    subject = f"local-{uuid.uuid4().hex[:8]}-value"
    first = client.register_schema(subject, Schema(_record({"name": "a", "type": "int"}), "AVRO"))
    # A new field with a default is a BACKWARD change; a changed type is not (HTTP 409).
    second = client.register_schema(subject, Schema(_record({"name": "a", "type": "int"},
                                                            {"name": "b", "type": "string", "default": ""}), "AVRO"))
    assert second != first
    assert client.get_latest_version(subject).version == 2
    try:
        client.register_schema(subject, Schema(_record({"name": "a", "type": "string"}), "AVRO"))
    except SchemaRegistryError as exc:
        assert exc.http_status_code == 409
    else:
        raise AssertionError("an incompatible schema was registered")


def test_the_same_schema_written_otherwise_is_the_same_schema(schema_registry: str) -> None:
    """Lookups compare canonical forms, as Confluent's registry does."""
    client = SchemaRegistryClient({"url": schema_registry})
    subject = f"local-{uuid.uuid4().hex[:8]}-value"
    compact = _record({"name": "a", "type": "int"})
    schema_id = client.register_schema(subject, Schema(compact, "AVRO"))
    spaced = json.dumps(json.loads(compact), indent=2)
    assert client.register_schema(subject, Schema(spaced, "AVRO")) == schema_id
    assert client.lookup_schema(subject, Schema(spaced, "AVRO")).schema_id == schema_id
