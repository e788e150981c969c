"""The Schema Registry's errors: its error codes by name, and kprod's exceptions for them.

Confluent's REST API answers a failed call with an HTTP status and a body
``{"error_code": ..., "message": ...}`` whose code refines the status (40401 subject not
found, 42201 invalid schema, ...). Apicurio's Confluent-compatible API answers the same.
Code refers to a code by its name here, never by its number.
"""

from __future__ import annotations

import enum
from typing import Any

from spark_sink.protocol.error_codes import KProdError


class RegistryErrorCode(enum.IntEnum):
    """The registry's ``error_code`` values (Confluent's ``Errors`` of its REST API)."""

    UNAUTHORIZED = 40101
    FORBIDDEN = 40301
    SUBJECT_NOT_FOUND = 40401
    VERSION_NOT_FOUND = 40402
    SCHEMA_NOT_FOUND = 40403
    SUBJECT_SOFT_DELETED = 40404
    INCOMPATIBLE_SCHEMA = 409
    INVALID_SCHEMA = 42201
    INVALID_VERSION = 42202
    INVALID_COMPATIBILITY_LEVEL = 42203
    INVALID_MODE = 42204
    STORE_ERROR = 50001
    OPERATION_TIMEOUT = 50002
    REQUEST_FORWARDING_FAILED = 50003


class SchemaRegistryError(KProdError):
    """A Schema Registry call failed. ``url`` is the registry's address (never with its
    credentials), ``status`` the HTTP status and ``error_code`` the registry's code, where
    there was an answer. (Pickled whole: the arguments have defaults, and an exception's
    attributes travel with it.)"""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None,
                 error_code: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.error_code = error_code


class RegistryUnavailableError(SchemaRegistryError, ConnectionError):
    """No answer within the call's deadline (``timeout.ms``): every attempt was refused,
    reset, timed out or answered with a server error (5xx, 408, 429). The message names
    each URL tried and the last cause."""

    retriable = True


class RegistryAuthError(SchemaRegistryError, PermissionError):
    """The registry refused the credentials (HTTP 401, 403), or TLS failed: its certificate
    is not trusted (``ssl.ca.location``) or it refused this client's
    (``ssl.certificate.location``). Not retried."""


class SchemaNotFoundError(SchemaRegistryError, LookupError):
    """No such subject, version or schema id (HTTP 404 with 40401, 40402 or 40403)."""


class IncompatibleSchemaError(SchemaRegistryError, ValueError):
    """The registry refused a schema as incompatible with the subject's earlier versions
    under its compatibility level (HTTP 409). ``subject`` and ``messages`` (the registry's
    reasons, naming the field where it says) are in the message too."""

    def __init__(self, message: str, *, subject: str | None = None, messages: tuple[str, ...] = (),
                 **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.subject = subject
        self.messages = messages


class InvalidSchemaError(SchemaRegistryError, ValueError):
    """The registry could not parse the schema, or refused a value it was given (HTTP 422:
    an invalid schema, version or compatibility level)."""
