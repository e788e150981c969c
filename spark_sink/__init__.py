"""kprod: a Kafka producer in Python with a columnar Arrow path, and the ``kprod`` Spark sink.

The producer does not need Spark (its dependencies are in pyproject.toml);
``KProdDataSource`` (PySpark 4.1+) is loaded on first use so that ``import spark_sink``
does not import Spark.
"""

from typing import Any

from spark_sink.producer import (
    AbortableTransactionError, AdminClient, FatalTransactionError, IllegalStateError, PreparedTransaction,
    TransactionError, ArrowSendFuture, ArrowSendResult, AuthenticationError, BufferExhaustedError, ColumnError, ConfigError,
    FutureRecordMetadata, InvalidPartitionError, KafkaProducer, KafkaTimeoutError, ProducerClosedError,
    ProducerConfig, ProducerRecord, RecordMetadata, RecordTooLargeError, SaslAuthenticationError,
    SerializationError, SslAuthenticationError,
)
from spark_sink.protocol.errors import KafkaError, KProdError

__all__ = [
    "AbortableTransactionError", "AdminClient", "FatalTransactionError", "IllegalStateError", "PreparedTransaction",
    "TransactionError", "ArrowSendFuture", "ArrowSendResult", "AuthenticationError", "BufferExhaustedError", "ColumnError", "ConfigError",
    "FutureRecordMetadata", "InvalidPartitionError", "KafkaError", "KafkaProducer", "KafkaTimeoutError",
    "KProdDataSource", "KProdError", "ProducerClosedError", "ProducerConfig", "ProducerRecord", "RecordMetadata",
    "RecordTooLargeError", "SaslAuthenticationError", "SerializationError", "SslAuthenticationError",
]


def __getattr__(name: str) -> Any:
    if name == "KProdDataSource":
        from spark_sink.spark import KProdDataSource

        return KProdDataSource
    raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
