"""The Kafka producer: per-record ``send`` and columnar ``send_arrow`` over one Sender."""

from spark_sink.client.errors import (
    AbortableTransactionError,
    AuthenticationError,
    BrokersUnreachableError,
    BufferExhaustedError,
    ColumnError,
    ConfigError,
    FatalTransactionError,
    IllegalStateError,
    InvalidPartitionError,
    KafkaTimeoutError,
    ProducerClosedError,
    RecordTooLargeError,
    SaslAuthenticationError,
    SerializationError,
    SslAuthenticationError,
    TransactionError,
    UnknownTopicError,
)
from spark_sink.encoder.formats import FormatSchemaError, FormatValueError, WireBudget, WireBudgetExceeded
from spark_sink.producer.arrow_input import ACCEPTED_TYPES as ARROW_COLUMNS
from spark_sink.producer.arrow_input import check_arrow_column, check_arrow_schema
from spark_sink.producer.batch import FutureRecordMetadata
from spark_sink.producer.config import KEYS as _KEYS
from spark_sink.producer.config import ProducerConfig, idempotence_conflicts
from spark_sink.producer.metrics import MetricTotals
from spark_sink.producer.partitioner import murmur2
from spark_sink.producer.producer import ArrowSendFuture, ArrowSendResult, KafkaProducer
from spark_sink.producer.producer_record import ProducerRecord, RecordMetadata
from spark_sink.producer.row_errors import RefusedRows, RowRefusals
from spark_sink.producer.rows_digest import RowsDigest
from spark_sink.producer.serializers import ArrowSerializer, serialize_columns
from spark_sink.protocol.txn_coordinator import PreparedTransaction

# Every configuration key the producer knows (Java's names).
CONFIG_KEYS: frozenset[str] = frozenset(_KEYS)

__all__ = [
    "ARROW_COLUMNS", "AbortableTransactionError", "FatalTransactionError", "IllegalStateError",
    "PreparedTransaction", "TransactionError", "CONFIG_KEYS",
    "ArrowSendFuture", "ArrowSendResult", "ArrowSerializer", "AuthenticationError",
    "BrokersUnreachableError", "BufferExhaustedError", "ColumnError", "ConfigError", "FormatSchemaError",
    "FormatValueError", "FutureRecordMetadata",
    "InvalidPartitionError", "UnknownTopicError",
    "KafkaProducer", "KafkaTimeoutError", "MetricTotals", "ProducerClosedError", "ProducerConfig", "ProducerRecord",
    "RecordMetadata",
    "RecordTooLargeError", "RefusedRows", "RowRefusals", "RowsDigest", "SaslAuthenticationError", "SerializationError",
    "SslAuthenticationError", "check_arrow_column", "check_arrow_schema", "idempotence_conflicts", "murmur2",
    "WireBudget", "WireBudgetExceeded", "serialize_columns",
]
