"""The Kafka APIs kprod speaks, as field tables (written from the protocol specification).

Each API has a request and a response :class:`~spark_sink.protocol.schema.Schema`, the
version range this client implements, and the first flexible version.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from spark_sink.protocol import primitives as p
from spark_sink.protocol import produce
from spark_sink.protocol.error_codes import UnsupportedVersionError
from spark_sink.protocol.schema import Field as F
from spark_sink.protocol.schema import Schema, decode, encode


class ApiKey(IntEnum):
    """Kafka API keys used by kprod."""

    PRODUCE = 0
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    DESCRIBE_TRANSACTIONS = 65


@dataclass(frozen=True)
class Api:
    """Request and response schemas of one API and the versions this client implements."""

    key: ApiKey
    min_version: int
    max_version: int
    request: Schema
    response: Schema


_INT32_ARRAY = "[]int32"


def _topic_partitions(*fields: F) -> F:
    """The ``topics`` array of the group and transaction APIs: each topic's name and its
    ``partitions``, each a ``partition_index`` and ``fields``."""
    return F("topics", "[]struct", fields=(
        F("name", "string"),
        F("partitions", "[]struct", fields=(F("partition_index", "int32"), *fields)),
    ))

# The sender's path uses protocol/produce.py, which writes and reads these bytes by hand.
# v12 (Kafka 4.0) only tells the broker the client runs transactions its second way
# (KIP-890: partitions added implicitly, the epoch bumped by EndTxn v5); kprod adds
# partitions itself, so it stops at v11, as Java's producer does without that feature.
PRODUCE = Api(
    ApiKey.PRODUCE, 3, 11,
    Schema((
        F("transactional_id", "string", nullable=True),
        F("acks", "int16"),
        F("timeout_ms", "int32"),
        F("topic_data", "[]struct", fields=(
            F("name", "string"),
            F("partition_data", "[]struct", fields=(
                F("index", "int32"),
                F("records", "records", nullable=True),
            )),
        )),
    ), flexible_from=produce.FLEXIBLE_FROM),
    Schema((
        F("responses", "[]struct", fields=(
            F("name", "string"),
            F("partition_responses", "[]struct", fields=(
                F("index", "int32"),
                F("error_code", "int16"),
                F("base_offset", "int64"),
                F("log_append_time_ms", "int64", 2, default=-1),
                F("log_start_offset", "int64", 5, default=-1),
                F("record_errors", "[]struct", 8, fields=(
                    F("batch_index", "int32"),
                    F("batch_index_error_message", "string", nullable=True),
                )),
                F("error_message", "string", 8, nullable=True),
            )),
        )),
        F("throttle_time_ms", "int32", 1),
    ), flexible_from=produce.FLEXIBLE_FROM),
)

METADATA = Api(
    ApiKey.METADATA, 1, 12,
    Schema((
        F("topics", "[]struct", nullable=True, fields=(
            F("topic_id", "uuid", 10),
            F("name", "string", nullable=True),
        )),
        F("allow_auto_topic_creation", "bool", 4, default=True),
        F("include_cluster_authorized_operations", "bool", 8, 10),
        F("include_topic_authorized_operations", "bool", 8),
    ), flexible_from=9),
    Schema((
        F("throttle_time_ms", "int32", 3),
        F("brokers", "[]struct", fields=(
            F("node_id", "int32"),
            F("host", "string"),
            F("port", "int32"),
            F("rack", "string", 1, nullable=True),
        )),
        F("cluster_id", "string", 2, nullable=True),
        F("controller_id", "int32", 1, default=-1),
        F("topics", "[]struct", fields=(
            F("error_code", "int16"),
            F("name", "string", nullable=True),
            F("topic_id", "uuid", 10),
            F("is_internal", "bool", 1),
            F("partitions", "[]struct", fields=(
                F("error_code", "int16"),
                F("partition_index", "int32"),
                F("leader_id", "int32"),
                F("leader_epoch", "int32", 7, default=-1),
                F("replica_nodes", _INT32_ARRAY),
                F("isr_nodes", _INT32_ARRAY),
                F("offline_replicas", _INT32_ARRAY, 5),
            )),
            F("topic_authorized_operations", "int32", 8, default=-2147483648),
        )),
        F("cluster_authorized_operations", "int32", 8, 10, default=-2147483648),
    ), flexible_from=9),
)

API_VERSIONS = Api(
    ApiKey.API_VERSIONS, 0, 3,
    Schema((
        F("client_software_name", "string", 3, default="kprod"),
        F("client_software_version", "string", 3, default="0.1.0"),
    ), flexible_from=3),
    Schema((
        F("error_code", "int16"),
        F("api_keys", "[]struct", fields=(
            F("api_key", "int16"),
            F("min_version", "int16"),
            F("max_version", "int16"),
        )),
        F("throttle_time_ms", "int32", 1),
    ), flexible_from=3),
)

INIT_PRODUCER_ID = Api(
    ApiKey.INIT_PRODUCER_ID, 0, 5,
    Schema((
        F("transactional_id", "string", nullable=True),
        F("transaction_timeout_ms", "int32", default=60000),
        F("producer_id", "int64", 3, default=-1),
        F("producer_epoch", "int16", 3, default=-1),
    ), flexible_from=2),
    Schema((
        F("throttle_time_ms", "int32"),
        F("error_code", "int16"),
        F("producer_id", "int64", default=-1),
        F("producer_epoch", "int16", default=-1),
    ), flexible_from=2),
)

FIND_COORDINATOR = Api(
    ApiKey.FIND_COORDINATOR, 0, 3,
    Schema((
        F("key", "string"),
        F("key_type", "int8", 1),
    ), flexible_from=3),
    Schema((
        F("throttle_time_ms", "int32", 1),
        F("error_code", "int16"),
        F("error_message", "string", 1, nullable=True),
        F("node_id", "int32"),
        F("host", "string"),
        F("port", "int32"),
    ), flexible_from=3),
)

# A plain (non-transactional) commit, by a client that is no member of the group.
OFFSET_COMMIT = Api(
    ApiKey.OFFSET_COMMIT, 2, 9,
    Schema((
        F("group_id", "string"),
        F("generation_id_or_member_epoch", "int32", default=-1),
        F("member_id", "string", default=""),
        F("group_instance_id", "string", 7, nullable=True),
        F("retention_time_ms", "int64", 2, 4, default=-1),
        _topic_partitions(
            F("committed_offset", "int64"),
            F("committed_leader_epoch", "int32", 6, default=-1),
            F("committed_metadata", "string", nullable=True),
        ),
    ), flexible_from=8),
    Schema((
        F("throttle_time_ms", "int32", 3),
        _topic_partitions(F("error_code", "int16")),
    ), flexible_from=8),
)

OFFSET_FETCH = Api(
    ApiKey.OFFSET_FETCH, 1, 7,
    Schema((
        F("group_id", "string"),
        F("topics", "[]struct", nullable=True, fields=(
            F("name", "string"),
            F("partition_indexes", _INT32_ARRAY),
        )),
        F("require_stable", "bool", 7),
    ), flexible_from=6),
    Schema((
        F("throttle_time_ms", "int32", 3),
        _topic_partitions(
            F("committed_offset", "int64"),
            F("committed_leader_epoch", "int32", 5, default=-1),
            F("metadata", "string", nullable=True),
            F("error_code", "int16"),
        ),
        F("error_code", "int16", 2),
    ), flexible_from=6),
)

# The producer a transaction request speaks for, and the answer of the single-error ones.
_TXN_PRODUCER = (F("transactional_id", "string"), F("producer_id", "int64"), F("producer_epoch", "int16"))
_THROTTLE_AND_ERROR_V3 = Schema((F("throttle_time_ms", "int32"), F("error_code", "int16")), flexible_from=3)
# The answer of AddPartitionsToTxn (up to v3) and TxnOffsetCommit: an error per partition.
# The wire format names no fields, so one table with TxnOffsetCommit's names serves both.
_PARTITION_ERRORS_V3 = Schema(
    (F("throttle_time_ms", "int32"), _topic_partitions(F("error_code", "int16"))), flexible_from=3)

# Up to v3: v4 and later batch several transactions and are for brokers only.
ADD_PARTITIONS_TO_TXN = Api(
    ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3,
    Schema((
        *_TXN_PRODUCER,
        F("topics", "[]struct", fields=(
            F("name", "string"),
            F("partitions", _INT32_ARRAY),
        )),
    ), flexible_from=3),
    _PARTITION_ERRORS_V3,
)


def _single_error_txn_call(key: ApiKey, field: F) -> Api:
    """A transaction call up to v4: the producer's identity and one field, answered by one error."""
    return Api(key, 0, 4, Schema((*_TXN_PRODUCER, field), flexible_from=3), _THROTTLE_AND_ERROR_V3)


ADD_OFFSETS_TO_TXN = _single_error_txn_call(ApiKey.ADD_OFFSETS_TO_TXN, F("group_id", "string"))
# Up to v4: v5 belongs to the KIP-890 protocol (see PRODUCE).
END_TXN = _single_error_txn_call(ApiKey.END_TXN, F("committed", "bool"))

TXN_OFFSET_COMMIT = Api(
    ApiKey.TXN_OFFSET_COMMIT, 0, 4,
    Schema((
        F("transactional_id", "string"),
        F("group_id", "string"),
        F("producer_id", "int64"),
        F("producer_epoch", "int16"),
        F("generation_id", "int32", 3, default=-1),
        F("member_id", "string", 3),
        F("group_instance_id", "string", 3, nullable=True),
        _topic_partitions(
            F("committed_offset", "int64"),
            F("committed_leader_epoch", "int32", 2, default=-1),
            F("committed_metadata", "string", nullable=True),
        ),
    ), flexible_from=3),
    _PARTITION_ERRORS_V3,
)

# The driver reads one broker setting with it (transaction.max.timeout.ms).
DESCRIBE_CONFIGS = Api(
    ApiKey.DESCRIBE_CONFIGS, 1, 4,
    Schema((
        F("resources", "[]struct", fields=(
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configuration_keys", "[]string", nullable=True),
        )),
        F("include_synonyms", "bool", 1),
        F("include_documentation", "bool", 3),
    ), flexible_from=4),
    Schema((
        F("throttle_time_ms", "int32"),
        F("results", "[]struct", fields=(
            F("error_code", "int16"),
            F("error_message", "string", nullable=True),
            F("resource_type", "int8"),
            F("resource_name", "string"),
            F("configs", "[]struct", fields=(
                F("name", "string"),
                F("value", "string", nullable=True),
                F("read_only", "bool"),
                F("config_source", "int8", 1, default=-1),
                F("is_sensitive", "bool"),
                F("synonyms", "[]struct", 1, fields=(
                    F("name", "string"),
                    F("value", "string", nullable=True),
                    F("source", "int8"),
                )),
                F("config_type", "int8", 3),
                F("documentation", "string", 3, nullable=True),
            )),
        )),
    ), flexible_from=4),
)

# A transaction's state as its coordinator holds it (Kafka 3.0+): the driver checks every
# prepared transaction is still open, under the epoch its task reported, before it commits.
DESCRIBE_TRANSACTIONS = Api(
    ApiKey.DESCRIBE_TRANSACTIONS, 0, 0,
    Schema((F("transactional_ids", "[]string"),), flexible_from=0),
    Schema((
        F("throttle_time_ms", "int32"),
        F("transaction_states", "[]struct", fields=(
            F("error_code", "int16"),
            F("transactional_id", "string"),
            F("transaction_state", "string"),
            F("transaction_timeout_ms", "int32"),
            F("transaction_start_time_ms", "int64"),
            F("producer_id", "int64"),
            F("producer_epoch", "int16"),
            F("topics", "[]struct", fields=(
                F("topic", "string"),
                F("partitions", _INT32_ARRAY),
            )),
        )),
    ), flexible_from=0),
)

# v1 only: v0 (Kafka 0.10) sends the SASL tokens unframed, outside the Kafka protocol.
SASL_HANDSHAKE = Api(
    ApiKey.SASL_HANDSHAKE, 1, 1,
    Schema((F("mechanism", "string"),)),
    Schema((
        F("error_code", "int16"),
        F("mechanisms", "[]string"),
    )),
)

SASL_AUTHENTICATE = Api(
    ApiKey.SASL_AUTHENTICATE, 0, 2,
    Schema((F("auth_bytes", "bytes"),), flexible_from=2),
    Schema((
        F("error_code", "int16"),
        F("error_message", "string", nullable=True),
        F("auth_bytes", "bytes"),
        F("session_lifetime_ms", "int64", 1),
    ), flexible_from=2),
)

APIS: dict[int, Api] = {api.key: api for api in (
    PRODUCE, METADATA, API_VERSIONS, INIT_PRODUCER_ID, FIND_COORDINATOR, SASL_HANDSHAKE, SASL_AUTHENTICATE,
    OFFSET_COMMIT, OFFSET_FETCH, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT,
    DESCRIBE_CONFIGS, DESCRIBE_TRANSACTIONS)}
CLIENT_VERSIONS: dict[ApiKey, tuple[int, int]] = {a.key: (a.min_version, a.max_version) for a in APIS.values()}


def choose_version(api_key: int, broker_min: int, broker_max: int) -> int:
    """The highest version both this client and the broker support."""
    ours = APIS[api_key]
    version = min(ours.max_version, broker_max)
    if version < max(ours.min_version, broker_min):
        raise UnsupportedVersionError(
            f"{ApiKey(api_key).name}: broker supports v{broker_min}-v{broker_max}, "
            f"kprod v{ours.min_version}-v{ours.max_version}"
        )
    return version


def is_flexible(api_key: int, version: int, response: bool = False) -> bool:
    """Whether this API version uses compact encodings and tagged fields."""
    api = APIS[api_key]
    return version >= (api.response if response else api.request).flexible_from


def encode_request_parts(api_key: int, version: int, body: dict[str, Any]) -> list[produce.Buffer]:
    """A request body as buffers to write in order (record bytes are not copied)."""
    if api_key == ApiKey.PRODUCE:
        return produce.encode_request(version, body)
    return [encode(APIS[api_key].request, version, body)]


def encode_request_body(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    return b"".join(encode_request_parts(api_key, version, body))


def decode_request_body(api_key: int, version: int, data: bytes | memoryview) -> dict[str, Any]:
    return decode(APIS[api_key].request, version, data)


def encode_response_body(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    return encode(APIS[api_key].response, version, body)


def decode_response_body(api_key: int, version: int, data: bytes | memoryview | p.Reader) -> dict[str, Any]:
    if api_key == ApiKey.PRODUCE:
        reader = data if isinstance(data, p.Reader) else p.Reader(data)
        body, reader.pos = produce.decode_response(version, reader.buf[:reader.end], reader.pos)
        return body
    return decode(APIS[api_key].response, version, data)
