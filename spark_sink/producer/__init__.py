"""The Kafka producer: per-record ``send`` and columnar ``send_arrow`` over one Sender."""

from spark_sink.producer.batch import FutureRecordMetadata
from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.errors import (
    AuthenticationError, BufferExhaustedError, ColumnError, ConfigError, InvalidPartitionError, KafkaTimeoutError,
    ProducerClosedError, RecordTooLargeError, SaslAuthenticationError, SerializationError, SslAuthenticationError,
)
from spark_sink.producer.partitioner import murmur2
from spark_sink.producer.producer import ArrowSendFuture, ArrowSendResult, KafkaProducer
from spark_sink.producer.records import ProducerRecord, RecordMetadata

__all__ = [
    "ArrowSendFuture", "ArrowSendResult", "AuthenticationError", "BufferExhaustedError", "ColumnError", "ConfigError",
    "FutureRecordMetadata", "InvalidPartitionError", "KafkaProducer", "KafkaTimeoutError", "ProducerClosedError",
    "ProducerConfig", "ProducerRecord", "RecordMetadata", "RecordTooLargeError", "SaslAuthenticationError",
    "SerializationError", "SslAuthenticationError", "murmur2",
]
