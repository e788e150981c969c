"""Errors raised by kprod itself, as opposed to errors a Kafka broker returns.

Broker errors live in :mod:`spark_sink.protocol.error_codes`; every class here and there
derives from :class:`~spark_sink.protocol.error_codes.KProdError`, so one ``except`` catches both.
"""

from __future__ import annotations

from spark_sink.protocol.error_codes import KProdError


class ConfigError(KProdError, ValueError):
    """A configuration key is unknown, missing or has a bad value; the message names the key."""


class KafkaTimeoutError(KProdError, TimeoutError):
    """An operation did not finish within its bound (max.block.ms, delivery.timeout.ms, ...).

    Retriable, as Java's TimeoutException: a request that timed out may succeed when sent
    again (the producer does, within delivery.timeout.ms); one that ran out of its
    delivery.timeout.ms is reported with this error and not retried.
    """

    retriable = True


class BrokersUnreachableError(KafkaTimeoutError):
    """No bootstrap server could be reached (or none answered for metadata) in time; the
    message names each address and what happened to it (connection refused, name not
    resolved, TLS handshake failed, timed out)."""


class UnknownTopicError(KafkaTimeoutError):
    """The cluster answered, but the topic does not exist on it (and the brokers do not
    create topics on first use); the message names the topic and the bootstrap servers."""


class BufferExhaustedError(KafkaTimeoutError):
    """buffer.memory stayed full for longer than max.block.ms."""


class SerializationError(KProdError, ValueError):
    """A key, value or header could not be turned into bytes; the message names which."""


class RecordTooLargeError(KProdError, ValueError):
    """A record is larger than max.request.size or buffer.memory."""


class ColumnError(KProdError, TypeError):
    """An input column is missing, unknown or of a type kprod does not accept.

    The message names the column and the types it accepts.
    """


class InvalidPartitionError(KProdError, ValueError):
    """A record names a partition that its topic does not have."""


class AuthenticationError(KProdError, ConnectionError):
    """A broker and this client could not authenticate each other. Not retriable: threads
    waiting for metadata fail with it at once, as in Java; the message says which setting
    to check."""


class SslAuthenticationError(AuthenticationError):
    """The TLS handshake with a broker failed: its certificate was not trusted, or names
    another host."""


class SaslAuthenticationError(AuthenticationError):
    """SASL authentication failed: wrong credentials, a mechanism the broker does not
    enable, or a broker that could not prove it knows the password (SCRAM)."""


class ProducerClosedError(KProdError, RuntimeError):
    """send() was called on a producer that is closing or closed."""


class IllegalStateError(KProdError, RuntimeError):
    """An operation the producer's current state does not allow (a bug, or a call out of
    order); the message names the state and the operation."""


class TransactionError(KProdError):
    """A transaction could not go on. ``error`` is the broker's error behind it, if any."""

    def __init__(self, message: str, error: Exception | None = None) -> None:
        super().__init__(message)
        self.error = error


class AbortableTransactionError(TransactionError):
    """The current transaction failed (a record was refused, a partition or group could not
    be added): call abort_transaction(), then begin a new one. Nothing of the aborted
    transaction is visible to read_committed consumers."""


class FatalTransactionError(TransactionError):
    """The producer can only be closed: it was fenced by a newer producer with the same
    transactional.id (``error`` is ProducerFencedError or InvalidProducerEpochError), is not
    authorised for its transactional.id, or the coordinator refused its state."""
