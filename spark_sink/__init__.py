"""kprod: a Kafka producer in Python with a columnar Arrow path, and the ``kprod`` Spark sink.

The producer does not need Spark (its dependencies are in pyproject.toml). Every name here
is imported on first use (PEP 562): Spark's planner workers import this package to find
the ``kprod`` data source and need none of the producer for that, and ``import
spark_sink`` does not import Spark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_sink._exports import lazy_exports

_PRODUCER = (
    "AbortableTransactionError", "FatalTransactionError", "IllegalStateError",
    "PreparedTransaction", "TransactionError", "ArrowSendFuture", "ArrowSendResult", "ArrowSerializer",
    "AuthenticationError", "BufferExhaustedError", "ColumnError", "ConfigError",
    "FutureRecordMetadata", "InvalidPartitionError", "KafkaProducer", "KafkaTimeoutError",
    "ProducerClosedError", "ProducerConfig", "ProducerRecord", "RecordMetadata",
    "RecordTooLargeError", "SaslAuthenticationError", "SerializationError",
    "SslAuthenticationError",
)
# Where each name lives.
_EXPORTS = {
    **dict.fromkeys(_PRODUCER, "spark_sink.producer"),
    "AdminClient": "spark_sink.admin",
    "KafkaError": "spark_sink.protocol.error_codes",
    "KProdError": "spark_sink.protocol.error_codes",
    "KProdDataSource": "spark_sink.spark.source",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from spark_sink.admin import AdminClient
    from spark_sink.producer import (
        AbortableTransactionError,
        ArrowSendFuture,
        ArrowSendResult,
        ArrowSerializer,
        AuthenticationError,
        BufferExhaustedError,
        ColumnError,
        ConfigError,
        FatalTransactionError,
        FutureRecordMetadata,
        IllegalStateError,
        InvalidPartitionError,
        KafkaProducer,
        KafkaTimeoutError,
        PreparedTransaction,
        ProducerClosedError,
        ProducerConfig,
        ProducerRecord,
        RecordMetadata,
        RecordTooLargeError,
        SaslAuthenticationError,
        SerializationError,
        SslAuthenticationError,
        TransactionError,
    )
    from spark_sink.protocol.error_codes import KafkaError, KProdError
    from spark_sink.spark.source import KProdDataSource
