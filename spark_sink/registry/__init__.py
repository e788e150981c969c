"""The Schema Registry client, a client of its own beside the admin client: HTTP to
Confluent's REST API (Confluent's registry, Apicurio's ccompat API, Karapace), TLS and
basic authentication, retries within a deadline, and caches. Used by the Spark room and
``send_arrow`` alike. Public API."""

from spark_sink.registry.client import RegisteredSchema, SchemaRegistryClient
from spark_sink.registry.config import RegistryConfig
from spark_sink.registry.errors import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    RegistryAuthError,
    RegistryErrorCode,
    RegistryUnavailableError,
    SchemaNotFoundError,
    SchemaRegistryError,
)
from spark_sink.registry.subjects import subject_name

__all__ = [
    "IncompatibleSchemaError", "InvalidSchemaError", "RegisteredSchema", "RegistryAuthError", "RegistryConfig",
    "RegistryErrorCode", "RegistryUnavailableError", "SchemaNotFoundError", "SchemaRegistryClient",
    "SchemaRegistryError", "subject_name",
]
