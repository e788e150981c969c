"""Kafka's request and response definitions for the APIs kprod speaks, as typed classes and
the tables of :mod:`spark_sink.protocol.schema`'s codec.

Generated from common/message/*.json in kafka-clients-4.3.1.jar by ``python -m spark_sink.protocol.generate``
(versions clipped to ``apis.VERSIONS``): do not edit.
"""

# generated, do not edit
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from spark_sink.protocol.schema import Field as F
from spark_sink.protocol.schema import Records, Request, Schema

ZERO_UUID = uuid.UUID(int=0)


@dataclass(slots=True)
class PartitionProduceData:
    """PartitionProduceData in ProduceRequest."""

    index: int = 0
    records: Records | None = None


@dataclass(slots=True)
class TopicProduceData:
    """TopicProduceData in ProduceRequest."""

    name: str = ""
    partition_data: list[PartitionProduceData] = field(default_factory=list)


@dataclass(slots=True)
class ProduceRequest(Request["ProduceResponse"]):
    """ProduceRequest (API key 0): kprod speaks v3-v12 of Kafka's v3-v13."""

    transactional_id: str | None = None
    acks: int = 0
    timeout_ms: int = 0
    topic_data: list[TopicProduceData] = field(default_factory=list)


@dataclass(slots=True)
class BatchIndexAndErrorMessage:
    """BatchIndexAndErrorMessage in ProduceResponse."""

    batch_index: int = 0
    batch_index_error_message: str | None = None


@dataclass(slots=True)
class LeaderIdAndEpoch:
    """LeaderIdAndEpoch in ProduceResponse."""

    leader_id: int = -1
    leader_epoch: int = -1


@dataclass(slots=True)
class PartitionProduceResponse:
    """PartitionProduceResponse in ProduceResponse."""

    index: int = 0
    error_code: int = 0
    base_offset: int = 0
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    record_errors: list[BatchIndexAndErrorMessage] = field(default_factory=list)
    error_message: str | None = None
    current_leader: LeaderIdAndEpoch | None = None


@dataclass(slots=True)
class TopicProduceResponse:
    """TopicProduceResponse in ProduceResponse."""

    name: str = ""
    partition_responses: list[PartitionProduceResponse] = field(default_factory=list)


@dataclass(slots=True)
class NodeEndpoint:
    """NodeEndpoint in ProduceResponse."""

    node_id: int = 0
    host: str = ""
    port: int = 0
    rack: str | None = None


@dataclass(slots=True)
class ProduceResponse:
    """ProduceResponse (API key 0): kprod speaks v3-v12 of Kafka's v3-v13."""

    responses: list[TopicProduceResponse] = field(default_factory=list)
    throttle_time_ms: int = 0
    node_endpoints: list[NodeEndpoint] = field(default_factory=list)


@dataclass(slots=True)
class MetadataRequestTopic:
    """MetadataRequestTopic in MetadataRequest."""

    topic_id: uuid.UUID = ZERO_UUID
    name: str | None = ""


@dataclass(slots=True)
class MetadataRequest(Request["MetadataResponse"]):
    """MetadataRequest (API key 3): kprod speaks v1-v12 of Kafka's v0-v13."""

    topics: list[MetadataRequestTopic] | None = field(default_factory=list)
    allow_auto_topic_creation: bool = True
    include_cluster_authorized_operations: bool = False
    include_topic_authorized_operations: bool = False


@dataclass(slots=True)
class MetadataResponseBroker:
    """MetadataResponseBroker in MetadataResponse."""

    node_id: int = 0
    host: str = ""
    port: int = 0
    rack: str | None = None


@dataclass(slots=True)
class MetadataResponsePartition:
    """MetadataResponsePartition in MetadataResponse."""

    error_code: int = 0
    partition_index: int = 0
    leader_id: int = 0
    leader_epoch: int = -1
    replica_nodes: list[int] = field(default_factory=list)
    isr_nodes: list[int] = field(default_factory=list)
    offline_replicas: list[int] = field(default_factory=list)


@dataclass(slots=True)
class MetadataResponseTopic:
    """MetadataResponseTopic in MetadataResponse."""

    error_code: int = 0
    name: str | None = ""
    topic_id: uuid.UUID = ZERO_UUID
    is_internal: bool = False
    partitions: list[MetadataResponsePartition] = field(default_factory=list)
    topic_authorized_operations: int = -2147483648


@dataclass(slots=True)
class MetadataResponse:
    """MetadataResponse (API key 3): kprod speaks v1-v12 of Kafka's v0-v13."""

    throttle_time_ms: int = 0
    brokers: list[MetadataResponseBroker] = field(default_factory=list)
    cluster_id: str | None = None
    controller_id: int = -1
    topics: list[MetadataResponseTopic] = field(default_factory=list)
    cluster_authorized_operations: int = -2147483648


@dataclass(slots=True)
class OffsetCommitRequestPartition:
    """OffsetCommitRequestPartition in OffsetCommitRequest."""

    partition_index: int = 0
    committed_offset: int = 0
    committed_leader_epoch: int = -1
    committed_metadata: str | None = ""


@dataclass(slots=True)
class OffsetCommitRequestTopic:
    """OffsetCommitRequestTopic in OffsetCommitRequest."""

    name: str = ""
    partitions: list[OffsetCommitRequestPartition] = field(default_factory=list)


@dataclass(slots=True)
class OffsetCommitRequest(Request["OffsetCommitResponse"]):
    """OffsetCommitRequest (API key 8): kprod speaks v2-v9 of Kafka's v2-v10."""

    group_id: str = ""
    generation_id_or_member_epoch: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    retention_time_ms: int = -1
    topics: list[OffsetCommitRequestTopic] = field(default_factory=list)


@dataclass(slots=True)
class OffsetCommitResponsePartition:
    """OffsetCommitResponsePartition in OffsetCommitResponse."""

    partition_index: int = 0
    error_code: int = 0


@dataclass(slots=True)
class OffsetCommitResponseTopic:
    """OffsetCommitResponseTopic in OffsetCommitResponse."""

    name: str = ""
    partitions: list[OffsetCommitResponsePartition] = field(default_factory=list)


@dataclass(slots=True)
class OffsetCommitResponse:
    """OffsetCommitResponse (API key 8): kprod speaks v2-v9 of Kafka's v2-v10."""

    throttle_time_ms: int = 0
    topics: list[OffsetCommitResponseTopic] = field(default_factory=list)


@dataclass(slots=True)
class OffsetFetchRequestTopic:
    """OffsetFetchRequestTopic in OffsetFetchRequest."""

    name: str = ""
    partition_indexes: list[int] = field(default_factory=list)


@dataclass(slots=True)
class OffsetFetchRequest(Request["OffsetFetchResponse"]):
    """OffsetFetchRequest (API key 9): kprod speaks v1-v7 of Kafka's v1-v10."""

    group_id: str = ""
    topics: list[OffsetFetchRequestTopic] | None = field(default_factory=list)
    require_stable: bool = False


@dataclass(slots=True)
class OffsetFetchResponsePartition:
    """OffsetFetchResponsePartition in OffsetFetchResponse."""

    partition_index: int = 0
    committed_offset: int = 0
    committed_leader_epoch: int = -1
    metadata: str | None = ""
    error_code: int = 0


@dataclass(slots=True)
class OffsetFetchResponseTopic:
    """OffsetFetchResponseTopic in OffsetFetchResponse."""

    name: str = ""
    partitions: list[OffsetFetchResponsePartition] = field(default_factory=list)


@dataclass(slots=True)
class OffsetFetchResponse:
    """OffsetFetchResponse (API key 9): kprod speaks v1-v7 of Kafka's v1-v10."""

    throttle_time_ms: int = 0
    topics: list[OffsetFetchResponseTopic] = field(default_factory=list)
    error_code: int = 0


@dataclass(slots=True)
class FindCoordinatorRequest(Request["FindCoordinatorResponse"]):
    """FindCoordinatorRequest (API key 10): kprod speaks v0-v3 of Kafka's v0-v6."""

    key: str = ""
    key_type: int = 0


@dataclass(slots=True)
class FindCoordinatorResponse:
    """FindCoordinatorResponse (API key 10): kprod speaks v0-v3 of Kafka's v0-v6."""

    throttle_time_ms: int = 0
    error_code: int = 0
    error_message: str | None = ""
    node_id: int = 0
    host: str = ""
    port: int = 0


@dataclass(slots=True)
class SaslHandshakeRequest(Request["SaslHandshakeResponse"]):
    """SaslHandshakeRequest (API key 17): kprod speaks v1 of Kafka's v0-v1."""

    mechanism: str = ""


@dataclass(slots=True)
class SaslHandshakeResponse:
    """SaslHandshakeResponse (API key 17): kprod speaks v1 of Kafka's v0-v1."""

    error_code: int = 0
    mechanisms: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ApiVersionsRequest(Request["ApiVersionsResponse"]):
    """ApiVersionsRequest (API key 18): kprod speaks v0-v3 of Kafka's v0-v4."""

    client_software_name: str = ""
    client_software_version: str = ""


@dataclass(slots=True)
class ApiVersion:
    """ApiVersion in ApiVersionsResponse."""

    api_key: int = 0
    min_version: int = 0
    max_version: int = 0


@dataclass(slots=True)
class SupportedFeatureKey:
    """SupportedFeatureKey in ApiVersionsResponse."""

    name: str = ""
    min_version: int = 0
    max_version: int = 0


@dataclass(slots=True)
class FinalizedFeatureKey:
    """FinalizedFeatureKey in ApiVersionsResponse."""

    name: str = ""
    max_version_level: int = 0
    min_version_level: int = 0


@dataclass(slots=True)
class ApiVersionsResponse:
    """ApiVersionsResponse (API key 18): kprod speaks v0-v3 of Kafka's v0-v4."""

    error_code: int = 0
    api_keys: list[ApiVersion] = field(default_factory=list)
    throttle_time_ms: int = 0
    supported_features: list[SupportedFeatureKey] = field(default_factory=list)
    finalized_features_epoch: int = -1
    finalized_features: list[FinalizedFeatureKey] = field(default_factory=list)
    zk_migration_ready: bool = False


@dataclass(slots=True)
class InitProducerIdRequest(Request["InitProducerIdResponse"]):
    """InitProducerIdRequest (API key 22): kprod speaks v0-v5 of Kafka's v0-v6."""

    transactional_id: str | None = ""
    transaction_timeout_ms: int = 0
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(slots=True)
class InitProducerIdResponse:
    """InitProducerIdResponse (API key 22): kprod speaks v0-v5 of Kafka's v0-v6."""

    throttle_time_ms: int = 0
    error_code: int = 0
    producer_id: int = -1
    producer_epoch: int = 0


@dataclass(slots=True)
class AddPartitionsToTxnTopic:
    """AddPartitionsToTxnTopic in AddPartitionsToTxnRequest."""

    name: str = ""
    partitions: list[int] = field(default_factory=list)


@dataclass(slots=True)
class AddPartitionsToTxnRequest(Request["AddPartitionsToTxnResponse"]):
    """AddPartitionsToTxnRequest (API key 24): kprod speaks v0-v3 of Kafka's v0-v5."""

    v3_and_below_transactional_id: str = ""
    v3_and_below_producer_id: int = 0
    v3_and_below_producer_epoch: int = 0
    v3_and_below_topics: list[AddPartitionsToTxnTopic] = field(default_factory=list)


@dataclass(slots=True)
class AddPartitionsToTxnPartitionResult:
    """AddPartitionsToTxnPartitionResult in AddPartitionsToTxnResponse."""

    partition_index: int = 0
    partition_error_code: int = 0


@dataclass(slots=True)
class AddPartitionsToTxnTopicResult:
    """AddPartitionsToTxnTopicResult in AddPartitionsToTxnResponse."""

    name: str = ""
    results_by_partition: list[AddPartitionsToTxnPartitionResult] = field(default_factory=list)


@dataclass(slots=True)
class AddPartitionsToTxnResponse:
    """AddPartitionsToTxnResponse (API key 24): kprod speaks v0-v3 of Kafka's v0-v5."""

    throttle_time_ms: int = 0
    results_by_topic_v3_and_below: list[AddPartitionsToTxnTopicResult] = field(default_factory=list)


@dataclass(slots=True)
class AddOffsetsToTxnRequest(Request["AddOffsetsToTxnResponse"]):
    """AddOffsetsToTxnRequest (API key 25): kprod speaks v0-v4 of Kafka's v0-v4."""

    transactional_id: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    group_id: str = ""


@dataclass(slots=True)
class AddOffsetsToTxnResponse:
    """AddOffsetsToTxnResponse (API key 25): kprod speaks v0-v4 of Kafka's v0-v4."""

    throttle_time_ms: int = 0
    error_code: int = 0


@dataclass(slots=True)
class EndTxnRequest(Request["EndTxnResponse"]):
    """EndTxnRequest (API key 26): kprod speaks v0-v5 of Kafka's v0-v5."""

    transactional_id: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    committed: bool = False


@dataclass(slots=True)
class EndTxnResponse:
    """EndTxnResponse (API key 26): kprod speaks v0-v5 of Kafka's v0-v5."""

    throttle_time_ms: int = 0
    error_code: int = 0
    producer_id: int = -1
    producer_epoch: int = -1


@dataclass(slots=True)
class TxnOffsetCommitRequestPartition:
    """TxnOffsetCommitRequestPartition in TxnOffsetCommitRequest."""

    partition_index: int = 0
    committed_offset: int = 0
    committed_leader_epoch: int = -1
    committed_metadata: str | None = ""


@dataclass(slots=True)
class TxnOffsetCommitRequestTopic:
    """TxnOffsetCommitRequestTopic in TxnOffsetCommitRequest."""

    name: str = ""
    partitions: list[TxnOffsetCommitRequestPartition] = field(default_factory=list)


@dataclass(slots=True)
class TxnOffsetCommitRequest(Request["TxnOffsetCommitResponse"]):
    """TxnOffsetCommitRequest (API key 28): kprod speaks v0-v5 of Kafka's v0-v5."""

    transactional_id: str = ""
    group_id: str = ""
    producer_id: int = 0
    producer_epoch: int = 0
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None
    topics: list[TxnOffsetCommitRequestTopic] = field(default_factory=list)


@dataclass(slots=True)
class TxnOffsetCommitResponsePartition:
    """TxnOffsetCommitResponsePartition in TxnOffsetCommitResponse."""

    partition_index: int = 0
    error_code: int = 0


@dataclass(slots=True)
class TxnOffsetCommitResponseTopic:
    """TxnOffsetCommitResponseTopic in TxnOffsetCommitResponse."""

    name: str = ""
    partitions: list[TxnOffsetCommitResponsePartition] = field(default_factory=list)


@dataclass(slots=True)
class TxnOffsetCommitResponse:
    """TxnOffsetCommitResponse (API key 28): kprod speaks v0-v5 of Kafka's v0-v5."""

    throttle_time_ms: int = 0
    topics: list[TxnOffsetCommitResponseTopic] = field(default_factory=list)


@dataclass(slots=True)
class DescribeConfigsResource:
    """DescribeConfigsResource in DescribeConfigsRequest."""

    resource_type: int = 0
    resource_name: str = ""
    configuration_keys: list[str] | None = field(default_factory=list)


@dataclass(slots=True)
class DescribeConfigsRequest(Request["DescribeConfigsResponse"]):
    """DescribeConfigsRequest (API key 32): kprod speaks v1-v4 of Kafka's v1-v4."""

    resources: list[DescribeConfigsResource] = field(default_factory=list)
    include_synonyms: bool = False
    include_documentation: bool = False


@dataclass(slots=True)
class DescribeConfigsSynonym:
    """DescribeConfigsSynonym in DescribeConfigsResponse."""

    name: str = ""
    value: str | None = ""
    source: int = 0


@dataclass(slots=True)
class DescribeConfigsResourceResult:
    """DescribeConfigsResourceResult in DescribeConfigsResponse."""

    name: str = ""
    value: str | None = ""
    read_only: bool = False
    config_source: int = -1
    is_sensitive: bool = False
    synonyms: list[DescribeConfigsSynonym] = field(default_factory=list)
    config_type: int = 0
    documentation: str | None = ""


@dataclass(slots=True)
class DescribeConfigsResult:
    """DescribeConfigsResult in DescribeConfigsResponse."""

    error_code: int = 0
    error_message: str | None = ""
    resource_type: int = 0
    resource_name: str = ""
    configs: list[DescribeConfigsResourceResult] = field(default_factory=list)


@dataclass(slots=True)
class DescribeConfigsResponse:
    """DescribeConfigsResponse (API key 32): kprod speaks v1-v4 of Kafka's v1-v4."""

    throttle_time_ms: int = 0
    results: list[DescribeConfigsResult] = field(default_factory=list)


@dataclass(slots=True)
class SaslAuthenticateRequest(Request["SaslAuthenticateResponse"]):
    """SaslAuthenticateRequest (API key 36): kprod speaks v0-v2 of Kafka's v0-v2."""

    auth_bytes: bytes = b""


@dataclass(slots=True)
class SaslAuthenticateResponse:
    """SaslAuthenticateResponse (API key 36): kprod speaks v0-v2 of Kafka's v0-v2."""

    error_code: int = 0
    error_message: str | None = ""
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0


@dataclass(slots=True)
class DescribeTransactionsRequest(Request["DescribeTransactionsResponse"]):
    """DescribeTransactionsRequest (API key 65): kprod speaks v0 of Kafka's v0."""

    transactional_ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class TopicData:
    """TopicData in DescribeTransactionsResponse."""

    topic: str = ""
    partitions: list[int] = field(default_factory=list)


@dataclass(slots=True)
class DescribeTransactionsResponseTransactionState:
    """TransactionState in DescribeTransactionsResponse."""

    error_code: int = 0
    transactional_id: str = ""
    transaction_state: str = ""
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = 0
    producer_id: int = 0
    producer_epoch: int = 0
    topics: list[TopicData] = field(default_factory=list)


@dataclass(slots=True)
class DescribeTransactionsResponse:
    """DescribeTransactionsResponse (API key 65): kprod speaks v0 of Kafka's v0."""

    throttle_time_ms: int = 0
    transaction_states: list[DescribeTransactionsResponseTransactionState] = field(default_factory=list)


@dataclass(slots=True)
class ListTransactionsRequest(Request["ListTransactionsResponse"]):
    """ListTransactionsRequest (API key 66): kprod speaks v0-v1 of Kafka's v0-v2."""

    state_filters: list[str] = field(default_factory=list)
    producer_id_filters: list[int] = field(default_factory=list)
    duration_filter: int = -1


@dataclass(slots=True)
class ListTransactionsResponseTransactionState:
    """TransactionState in ListTransactionsResponse."""

    transactional_id: str = ""
    producer_id: int = 0
    transaction_state: str = ""


@dataclass(slots=True)
class ListTransactionsResponse:
    """ListTransactionsResponse (API key 66): kprod speaks v0-v1 of Kafka's v0-v2."""

    throttle_time_ms: int = 0
    error_code: int = 0
    unknown_state_filters: list[str] = field(default_factory=list)
    transaction_states: list[ListTransactionsResponseTransactionState] = field(default_factory=list)


@dataclass(slots=True)
class RequestHeader:
    """RequestHeader: kprod uses v1-v2 of Kafka's v1-v2."""

    request_api_key: int = 0
    request_api_version: int = 0
    correlation_id: int = 0
    client_id: str | None = ""


@dataclass(slots=True)
class ResponseHeader:
    """ResponseHeader: kprod uses v0-v1 of Kafka's v0-v1."""

    correlation_id: int = 0


PRODUCE_REQUEST = Schema(ProduceRequest, (
    F("transactional_id", "string", 3, 12, default=None, nullable=(3, 12)),
    F("acks", "int16", 3, 12),
    F("timeout_ms", "int32", 3, 12),
    F("topic_data", "[]struct", 3, 12, default=[], schema=Schema(TopicProduceData, (
        F("name", "string", 3, 12, default="", ignorable=True),
        F("partition_data", "[]struct", 3, 12, default=[], schema=Schema(PartitionProduceData, (
            F("index", "int32", 3, 12),
            F("records", "records", 3, 12, default=None, nullable=(3, 12)),
        ))),
    ))),
), flexible_from=9, versions=(3, 12))


PRODUCE_RESPONSE = Schema(ProduceResponse, (
    F("responses", "[]struct", 3, 12, default=[], schema=Schema(TopicProduceResponse, (
        F("name", "string", 3, 12, default="", ignorable=True),
        F("partition_responses", "[]struct", 3, 12, default=[], schema=Schema(PartitionProduceResponse, (
            F("index", "int32", 3, 12),
            F("error_code", "int16", 3, 12),
            F("base_offset", "int64", 3, 12),
            F("log_append_time_ms", "int64", 3, 12, default=-1, ignorable=True),
            F("log_start_offset", "int64", 5, 12, default=-1, ignorable=True),
            F("record_errors", "[]struct", 8, 12, default=[], ignorable=True, schema=Schema(BatchIndexAndErrorMessage, (
                F("batch_index", "int32", 8, 12),
                F("batch_index_error_message", "string", 8, 12, default=None, nullable=(8, 12)),
            ))),
            F("error_message", "string", 8, 12, default=None, nullable=(8, 12), ignorable=True),
            F("current_leader", "struct", 10, 12, default=None, tag=0, tagged=(10, 12), schema=Schema(LeaderIdAndEpoch, (
                F("leader_id", "int32", 10, 12, default=-1),
                F("leader_epoch", "int32", 10, 12, default=-1),
            ))),
        ))),
    ))),
    F("throttle_time_ms", "int32", 3, 12, ignorable=True),
    F("node_endpoints", "[]struct", 10, 12, default=[], tag=0, tagged=(10, 12), schema=Schema(NodeEndpoint, (
        F("node_id", "int32", 10, 12),
        F("host", "string", 10, 12, default=""),
        F("port", "int32", 10, 12),
        F("rack", "string", 10, 12, default=None, nullable=(10, 12)),
    ))),
), flexible_from=9, versions=(3, 12))


METADATA_REQUEST = Schema(MetadataRequest, (
    F("topics", "[]struct", 1, 12, default=[], nullable=(1, 12), schema=Schema(MetadataRequestTopic, (
        F("topic_id", "uuid", 10, 12, default=ZERO_UUID, ignorable=True),
        F("name", "string", 1, 12, default="", nullable=(10, 12)),
    ))),
    F("allow_auto_topic_creation", "bool", 4, 12, default=True),
    F("include_cluster_authorized_operations", "bool", 8, 10, default=False),
    F("include_topic_authorized_operations", "bool", 8, 12, default=False),
), flexible_from=9, versions=(1, 12))


METADATA_RESPONSE = Schema(MetadataResponse, (
    F("throttle_time_ms", "int32", 3, 12, ignorable=True),
    F("brokers", "[]struct", 1, 12, default=[], schema=Schema(MetadataResponseBroker, (
        F("node_id", "int32", 1, 12),
        F("host", "string", 1, 12, default=""),
        F("port", "int32", 1, 12),
        F("rack", "string", 1, 12, default=None, nullable=(1, 12), ignorable=True),
    ))),
    F("cluster_id", "string", 2, 12, default=None, nullable=(2, 12), ignorable=True),
    F("controller_id", "int32", 1, 12, default=-1, ignorable=True),
    F("topics", "[]struct", 1, 12, default=[], schema=Schema(MetadataResponseTopic, (
        F("error_code", "int16", 1, 12),
        F("name", "string", 1, 12, default="", nullable=(12, 12)),
        F("topic_id", "uuid", 10, 12, default=ZERO_UUID, ignorable=True),
        F("is_internal", "bool", 1, 12, default=False, ignorable=True),
        F("partitions", "[]struct", 1, 12, default=[], schema=Schema(MetadataResponsePartition, (
            F("error_code", "int16", 1, 12),
            F("partition_index", "int32", 1, 12),
            F("leader_id", "int32", 1, 12),
            F("leader_epoch", "int32", 7, 12, default=-1, ignorable=True),
            F("replica_nodes", "[]int32", 1, 12, default=[]),
            F("isr_nodes", "[]int32", 1, 12, default=[]),
            F("offline_replicas", "[]int32", 5, 12, default=[], ignorable=True),
        ))),
        F("topic_authorized_operations", "int32", 8, 12, default=-2147483648),
    ))),
    F("cluster_authorized_operations", "int32", 8, 10, default=-2147483648),
), flexible_from=9, versions=(1, 12))


OFFSET_COMMIT_REQUEST = Schema(OffsetCommitRequest, (
    F("group_id", "string", 2, 9, default=""),
    F("generation_id_or_member_epoch", "int32", 2, 9, default=-1, ignorable=True),
    F("member_id", "string", 2, 9, default="", ignorable=True),
    F("group_instance_id", "string", 7, 9, default=None, nullable=(7, 9)),
    F("retention_time_ms", "int64", 2, 4, default=-1, ignorable=True),
    F("topics", "[]struct", 2, 9, default=[], schema=Schema(OffsetCommitRequestTopic, (
        F("name", "string", 2, 9, default="", ignorable=True),
        F("partitions", "[]struct", 2, 9, default=[], schema=Schema(OffsetCommitRequestPartition, (
            F("partition_index", "int32", 2, 9),
            F("committed_offset", "int64", 2, 9),
            F("committed_leader_epoch", "int32", 6, 9, default=-1, ignorable=True),
            F("committed_metadata", "string", 2, 9, default="", nullable=(2, 9)),
        ))),
    ))),
), flexible_from=8, versions=(2, 9))


OFFSET_COMMIT_RESPONSE = Schema(OffsetCommitResponse, (
    F("throttle_time_ms", "int32", 3, 9, ignorable=True),
    F("topics", "[]struct", 2, 9, default=[], schema=Schema(OffsetCommitResponseTopic, (
        F("name", "string", 2, 9, default="", ignorable=True),
        F("partitions", "[]struct", 2, 9, default=[], schema=Schema(OffsetCommitResponsePartition, (
            F("partition_index", "int32", 2, 9),
            F("error_code", "int16", 2, 9),
        ))),
    ))),
), flexible_from=8, versions=(2, 9))


OFFSET_FETCH_REQUEST = Schema(OffsetFetchRequest, (
    F("group_id", "string", 1, 7, default=""),
    F("topics", "[]struct", 1, 7, default=[], nullable=(2, 7), schema=Schema(OffsetFetchRequestTopic, (
        F("name", "string", 1, 7, default=""),
        F("partition_indexes", "[]int32", 1, 7, default=[]),
    ))),
    F("require_stable", "bool", 7, 7, default=False),
), flexible_from=6, versions=(1, 7))


OFFSET_FETCH_RESPONSE = Schema(OffsetFetchResponse, (
    F("throttle_time_ms", "int32", 3, 7, ignorable=True),
    F("topics", "[]struct", 1, 7, default=[], schema=Schema(OffsetFetchResponseTopic, (
        F("name", "string", 1, 7, default=""),
        F("partitions", "[]struct", 1, 7, default=[], schema=Schema(OffsetFetchResponsePartition, (
            F("partition_index", "int32", 1, 7),
            F("committed_offset", "int64", 1, 7),
            F("committed_leader_epoch", "int32", 5, 7, default=-1, ignorable=True),
            F("metadata", "string", 1, 7, default="", nullable=(1, 7)),
            F("error_code", "int16", 1, 7),
        ))),
    ))),
    F("error_code", "int16", 2, 7, ignorable=True),
), flexible_from=6, versions=(1, 7))


FIND_COORDINATOR_REQUEST = Schema(FindCoordinatorRequest, (
    F("key", "string", 0, 3, default=""),
    F("key_type", "int8", 1, 3),
), flexible_from=3, versions=(0, 3))


FIND_COORDINATOR_RESPONSE = Schema(FindCoordinatorResponse, (
    F("throttle_time_ms", "int32", 1, 3, ignorable=True),
    F("error_code", "int16", 0, 3),
    F("error_message", "string", 1, 3, default="", nullable=(1, 3), ignorable=True),
    F("node_id", "int32", 0, 3),
    F("host", "string", 0, 3, default=""),
    F("port", "int32", 0, 3),
), flexible_from=3, versions=(0, 3))


SASL_HANDSHAKE_REQUEST = Schema(SaslHandshakeRequest, (
    F("mechanism", "string", 1, 1, default=""),
), versions=(1, 1))


SASL_HANDSHAKE_RESPONSE = Schema(SaslHandshakeResponse, (
    F("error_code", "int16", 1, 1),
    F("mechanisms", "[]string", 1, 1, default=[]),
), versions=(1, 1))


API_VERSIONS_REQUEST = Schema(ApiVersionsRequest, (
    F("client_software_name", "string", 3, 3, default="", ignorable=True),
    F("client_software_version", "string", 3, 3, default="", ignorable=True),
), flexible_from=3, versions=(0, 3))


API_VERSIONS_RESPONSE = Schema(ApiVersionsResponse, (
    F("error_code", "int16", 0, 3),
    F("api_keys", "[]struct", 0, 3, default=[], schema=Schema(ApiVersion, (
        F("api_key", "int16", 0, 3),
        F("min_version", "int16", 0, 3),
        F("max_version", "int16", 0, 3),
    ))),
    F("throttle_time_ms", "int32", 1, 3, ignorable=True),
    F("supported_features", "[]struct", 3, 3, default=[], tag=0, tagged=(3, 3), ignorable=True, schema=Schema(SupportedFeatureKey, (
        F("name", "string", 3, 3, default=""),
        F("min_version", "int16", 3, 3),
        F("max_version", "int16", 3, 3),
    ))),
    F("finalized_features_epoch", "int64", 3, 3, default=-1, tag=1, tagged=(3, 3), ignorable=True),
    F("finalized_features", "[]struct", 3, 3, default=[], tag=2, tagged=(3, 3), ignorable=True, schema=Schema(FinalizedFeatureKey, (
        F("name", "string", 3, 3, default=""),
        F("max_version_level", "int16", 3, 3),
        F("min_version_level", "int16", 3, 3),
    ))),
    F("zk_migration_ready", "bool", 3, 3, default=False, tag=3, tagged=(3, 3), ignorable=True),
), flexible_from=3, versions=(0, 3))


INIT_PRODUCER_ID_REQUEST = Schema(InitProducerIdRequest, (
    F("transactional_id", "string", 0, 5, default="", nullable=(0, 5)),
    F("transaction_timeout_ms", "int32", 0, 5),
    F("producer_id", "int64", 3, 5, default=-1),
    F("producer_epoch", "int16", 3, 5, default=-1),
), flexible_from=2, versions=(0, 5))


INIT_PRODUCER_ID_RESPONSE = Schema(InitProducerIdResponse, (
    F("throttle_time_ms", "int32", 0, 5, ignorable=True),
    F("error_code", "int16", 0, 5),
    F("producer_id", "int64", 0, 5, default=-1),
    F("producer_epoch", "int16", 0, 5),
), flexible_from=2, versions=(0, 5))


ADD_PARTITIONS_TO_TXN_REQUEST = Schema(AddPartitionsToTxnRequest, (
    F("v3_and_below_transactional_id", "string", 0, 3, default=""),
    F("v3_and_below_producer_id", "int64", 0, 3),
    F("v3_and_below_producer_epoch", "int16", 0, 3),
    F("v3_and_below_topics", "[]struct", 0, 3, default=[], schema=Schema(AddPartitionsToTxnTopic, (
        F("name", "string", 0, 3, default=""),
        F("partitions", "[]int32", 0, 3, default=[]),
    ))),
), flexible_from=3, versions=(0, 3))


ADD_PARTITIONS_TO_TXN_RESPONSE = Schema(AddPartitionsToTxnResponse, (
    F("throttle_time_ms", "int32", 0, 3),
    F("results_by_topic_v3_and_below", "[]struct", 0, 3, default=[], schema=Schema(AddPartitionsToTxnTopicResult, (
        F("name", "string", 0, 3, default=""),
        F("results_by_partition", "[]struct", 0, 3, default=[], schema=Schema(AddPartitionsToTxnPartitionResult, (
            F("partition_index", "int32", 0, 3),
            F("partition_error_code", "int16", 0, 3),
        ))),
    ))),
), flexible_from=3, versions=(0, 3))


ADD_OFFSETS_TO_TXN_REQUEST = Schema(AddOffsetsToTxnRequest, (
    F("transactional_id", "string", 0, 4, default=""),
    F("producer_id", "int64", 0, 4),
    F("producer_epoch", "int16", 0, 4),
    F("group_id", "string", 0, 4, default=""),
), flexible_from=3, versions=(0, 4))


ADD_OFFSETS_TO_TXN_RESPONSE = Schema(AddOffsetsToTxnResponse, (
    F("throttle_time_ms", "int32", 0, 4),
    F("error_code", "int16", 0, 4),
), flexible_from=3, versions=(0, 4))


END_TXN_REQUEST = Schema(EndTxnRequest, (
    F("transactional_id", "string", 0, 5, default=""),
    F("producer_id", "int64", 0, 5),
    F("producer_epoch", "int16", 0, 5),
    F("committed", "bool", 0, 5, default=False),
), flexible_from=3, versions=(0, 5))


END_TXN_RESPONSE = Schema(EndTxnResponse, (
    F("throttle_time_ms", "int32", 0, 5),
    F("error_code", "int16", 0, 5),
    F("producer_id", "int64", 5, 5, default=-1, ignorable=True),
    F("producer_epoch", "int16", 5, 5, default=-1, ignorable=True),
), flexible_from=3, versions=(0, 5))


TXN_OFFSET_COMMIT_REQUEST = Schema(TxnOffsetCommitRequest, (
    F("transactional_id", "string", 0, 5, default=""),
    F("group_id", "string", 0, 5, default=""),
    F("producer_id", "int64", 0, 5),
    F("producer_epoch", "int16", 0, 5),
    F("generation_id", "int32", 3, 5, default=-1),
    F("member_id", "string", 3, 5, default=""),
    F("group_instance_id", "string", 3, 5, default=None, nullable=(3, 5)),
    F("topics", "[]struct", 0, 5, default=[], schema=Schema(TxnOffsetCommitRequestTopic, (
        F("name", "string", 0, 5, default=""),
        F("partitions", "[]struct", 0, 5, default=[], schema=Schema(TxnOffsetCommitRequestPartition, (
            F("partition_index", "int32", 0, 5),
            F("committed_offset", "int64", 0, 5),
            F("committed_leader_epoch", "int32", 2, 5, default=-1, ignorable=True),
            F("committed_metadata", "string", 0, 5, default="", nullable=(0, 5)),
        ))),
    ))),
), flexible_from=3, versions=(0, 5))


TXN_OFFSET_COMMIT_RESPONSE = Schema(TxnOffsetCommitResponse, (
    F("throttle_time_ms", "int32", 0, 5),
    F("topics", "[]struct", 0, 5, default=[], schema=Schema(TxnOffsetCommitResponseTopic, (
        F("name", "string", 0, 5, default=""),
        F("partitions", "[]struct", 0, 5, default=[], schema=Schema(TxnOffsetCommitResponsePartition, (
            F("partition_index", "int32", 0, 5),
            F("error_code", "int16", 0, 5),
        ))),
    ))),
), flexible_from=3, versions=(0, 5))


DESCRIBE_CONFIGS_REQUEST = Schema(DescribeConfigsRequest, (
    F("resources", "[]struct", 1, 4, default=[], schema=Schema(DescribeConfigsResource, (
        F("resource_type", "int8", 1, 4),
        F("resource_name", "string", 1, 4, default=""),
        F("configuration_keys", "[]string", 1, 4, default=[], nullable=(1, 4)),
    ))),
    F("include_synonyms", "bool", 1, 4, default=False),
    F("include_documentation", "bool", 3, 4, default=False),
), flexible_from=4, versions=(1, 4))


DESCRIBE_CONFIGS_RESPONSE = Schema(DescribeConfigsResponse, (
    F("throttle_time_ms", "int32", 1, 4),
    F("results", "[]struct", 1, 4, default=[], schema=Schema(DescribeConfigsResult, (
        F("error_code", "int16", 1, 4),
        F("error_message", "string", 1, 4, default="", nullable=(1, 4)),
        F("resource_type", "int8", 1, 4),
        F("resource_name", "string", 1, 4, default=""),
        F("configs", "[]struct", 1, 4, default=[], schema=Schema(DescribeConfigsResourceResult, (
            F("name", "string", 1, 4, default=""),
            F("value", "string", 1, 4, default="", nullable=(1, 4)),
            F("read_only", "bool", 1, 4, default=False),
            F("config_source", "int8", 1, 4, default=-1, ignorable=True),
            F("is_sensitive", "bool", 1, 4, default=False),
            F("synonyms", "[]struct", 1, 4, default=[], ignorable=True, schema=Schema(DescribeConfigsSynonym, (
                F("name", "string", 1, 4, default=""),
                F("value", "string", 1, 4, default="", nullable=(1, 4)),
                F("source", "int8", 1, 4),
            ))),
            F("config_type", "int8", 3, 4, ignorable=True),
            F("documentation", "string", 3, 4, default="", nullable=(3, 4), ignorable=True),
        ))),
    ))),
), flexible_from=4, versions=(1, 4))


SASL_AUTHENTICATE_REQUEST = Schema(SaslAuthenticateRequest, (
    F("auth_bytes", "bytes", 0, 2, default=b""),
), flexible_from=2, versions=(0, 2))


SASL_AUTHENTICATE_RESPONSE = Schema(SaslAuthenticateResponse, (
    F("error_code", "int16", 0, 2),
    F("error_message", "string", 0, 2, default="", nullable=(0, 2)),
    F("auth_bytes", "bytes", 0, 2, default=b""),
    F("session_lifetime_ms", "int64", 1, 2, ignorable=True),
), flexible_from=2, versions=(0, 2))


DESCRIBE_TRANSACTIONS_REQUEST = Schema(DescribeTransactionsRequest, (
    F("transactional_ids", "[]string", 0, 0, default=[]),
), flexible_from=0, versions=(0, 0))


DESCRIBE_TRANSACTIONS_RESPONSE = Schema(DescribeTransactionsResponse, (
    F("throttle_time_ms", "int32", 0, 0),
    F("transaction_states", "[]struct", 0, 0, default=[], schema=Schema(DescribeTransactionsResponseTransactionState, (
        F("error_code", "int16", 0, 0),
        F("transactional_id", "string", 0, 0, default=""),
        F("transaction_state", "string", 0, 0, default=""),
        F("transaction_timeout_ms", "int32", 0, 0),
        F("transaction_start_time_ms", "int64", 0, 0),
        F("producer_id", "int64", 0, 0),
        F("producer_epoch", "int16", 0, 0),
        F("topics", "[]struct", 0, 0, default=[], schema=Schema(TopicData, (
            F("topic", "string", 0, 0, default=""),
            F("partitions", "[]int32", 0, 0, default=[]),
        ))),
    ))),
), flexible_from=0, versions=(0, 0))


LIST_TRANSACTIONS_REQUEST = Schema(ListTransactionsRequest, (
    F("state_filters", "[]string", 0, 1, default=[]),
    F("producer_id_filters", "[]int64", 0, 1, default=[]),
    F("duration_filter", "int64", 1, 1, default=-1),
), flexible_from=0, versions=(0, 1))


LIST_TRANSACTIONS_RESPONSE = Schema(ListTransactionsResponse, (
    F("throttle_time_ms", "int32", 0, 1),
    F("error_code", "int16", 0, 1),
    F("unknown_state_filters", "[]string", 0, 1, default=[]),
    F("transaction_states", "[]struct", 0, 1, default=[], schema=Schema(ListTransactionsResponseTransactionState, (
        F("transactional_id", "string", 0, 1, default=""),
        F("producer_id", "int64", 0, 1),
        F("transaction_state", "string", 0, 1, default=""),
    ))),
), flexible_from=0, versions=(0, 1))


REQUEST_HEADER = Schema(RequestHeader, (
    F("request_api_key", "int16", 1, 2),
    F("request_api_version", "int16", 1, 2),
    F("correlation_id", "int32", 1, 2),
    F("client_id", "string", 1, 2, default="", nullable=(1, 2), flexible=None),
), flexible_from=2, versions=(1, 2))


RESPONSE_HEADER = Schema(ResponseHeader, (
    F("correlation_id", "int32", 0, 1),
), flexible_from=1, versions=(0, 1))


# The request and response schemas of each API, by API key.
SCHEMAS: dict[int, tuple[Schema, Schema]] = {
    0: (PRODUCE_REQUEST, PRODUCE_RESPONSE),  # PRODUCE
    3: (METADATA_REQUEST, METADATA_RESPONSE),  # METADATA
    8: (OFFSET_COMMIT_REQUEST, OFFSET_COMMIT_RESPONSE),  # OFFSET_COMMIT
    9: (OFFSET_FETCH_REQUEST, OFFSET_FETCH_RESPONSE),  # OFFSET_FETCH
    10: (FIND_COORDINATOR_REQUEST, FIND_COORDINATOR_RESPONSE),  # FIND_COORDINATOR
    17: (SASL_HANDSHAKE_REQUEST, SASL_HANDSHAKE_RESPONSE),  # SASL_HANDSHAKE
    18: (API_VERSIONS_REQUEST, API_VERSIONS_RESPONSE),  # API_VERSIONS
    22: (INIT_PRODUCER_ID_REQUEST, INIT_PRODUCER_ID_RESPONSE),  # INIT_PRODUCER_ID
    24: (ADD_PARTITIONS_TO_TXN_REQUEST, ADD_PARTITIONS_TO_TXN_RESPONSE),  # ADD_PARTITIONS_TO_TXN
    25: (ADD_OFFSETS_TO_TXN_REQUEST, ADD_OFFSETS_TO_TXN_RESPONSE),  # ADD_OFFSETS_TO_TXN
    26: (END_TXN_REQUEST, END_TXN_RESPONSE),  # END_TXN
    28: (TXN_OFFSET_COMMIT_REQUEST, TXN_OFFSET_COMMIT_RESPONSE),  # TXN_OFFSET_COMMIT
    32: (DESCRIBE_CONFIGS_REQUEST, DESCRIBE_CONFIGS_RESPONSE),  # DESCRIBE_CONFIGS
    36: (SASL_AUTHENTICATE_REQUEST, SASL_AUTHENTICATE_RESPONSE),  # SASL_AUTHENTICATE
    65: (DESCRIBE_TRANSACTIONS_REQUEST, DESCRIBE_TRANSACTIONS_RESPONSE),  # DESCRIBE_TRANSACTIONS
    66: (LIST_TRANSACTIONS_REQUEST, LIST_TRANSACTIONS_RESPONSE),  # LIST_TRANSACTIONS
}
