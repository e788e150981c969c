"""Kafka error codes as exceptions, one class per code, exported by name.

Every exception kprod raises derives from :class:`KProdError`. Broker errors derive from
:class:`KafkaError` and carry the code, the protocol name and whether a client may retry
(``retriable``) or must refresh metadata first (``invalid_metadata``). Code refers to an
error by its class (``isinstance(error, NotLeaderOrFollowerError)``) or the class's
``code`` (``code == DuplicateSequenceNumberError.code``), never by its number.

The table below is the one place each error is defined: every
code of the Kafka protocol up to Kafka 4.3, with the retry and metadata flags of the Java
client's exception for it. Each class is named after its protocol name
(``NOT_LEADER_OR_FOLLOWER`` is ``NotLeaderOrFollowerError``). ``tests/protocol/test_errors.py``
checks the table against the kafka-clients jar the test broker runs.
"""

from __future__ import annotations

from typing import ClassVar


class KProdError(Exception):
    """Root of every error kprod raises.

    ``retriable``: trying the same operation again may succeed. ``invalid_metadata``: the
    client's view of the cluster is out of date, so it refreshes metadata before retrying.
    """

    retriable: ClassVar[bool] = False
    invalid_metadata: ClassVar[bool] = False


def is_retriable(error: BaseException) -> bool:
    """Whether ``error`` is one of kprod's that trying again may cure."""
    return isinstance(error, KProdError) and error.retriable


def is_invalid_metadata(error: BaseException) -> bool:
    """Whether ``error`` says the client's view of the cluster is out of date."""
    return isinstance(error, KProdError) and error.invalid_metadata


class CorruptRecordError(KProdError):
    """Bytes that do not decode: a bad CRC, a truncated frame, an unexpected correlation id."""


class KafkaConnectionError(KProdError):
    """A broker connection failed or was closed before a response arrived."""

    retriable = True
    invalid_metadata = True


class KafkaError(KProdError):
    """An error code returned by a broker: the base of the classes of the table below."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"

    def __init__(self, message: str | None = None) -> None:
        self.message = message
        super().__init__(message)  # args stay (message,): a pickled copy is made the same way

    def __str__(self) -> str:
        label = f"[{self.name} ({self.code})]"
        return f"{label} {self.message}" if self.message else label


class UnknownErrorCode(KafkaError):
    """A code the table does not know (from a newer broker): not retriable. Each such code
    gets its own subclass, made on first sight, so that ``code`` is a class attribute as
    for every other error."""

    def __reduce__(self) -> tuple:
        return error_for_code, (self.code, self.message)


NO_ERROR = 0  # the code of a response, or a part of one, that succeeded

ERRORS_BY_CODE: dict[int, type[KafkaError]] = {}


def _error(code: int, name: str, flags: tuple[bool, bool] = (False, False)) -> type[KafkaError]:
    """The exception class for ``code``, registered by code. ``flags`` is (retriable,
    invalid_metadata), as the Java client's exception for the code is a RetriableException
    and an InvalidMetadataException."""
    camel = "".join(part.capitalize() for part in name.split("_"))
    class_name = camel if camel.endswith(("Error", "Exception")) else camel + "Error"
    retriable, invalid_metadata = flags
    cls = type(class_name, (KafkaError,), {
        "code": code, "name": name, "retriable": retriable, "invalid_metadata": invalid_metadata,
        "__doc__": f"Kafka error {code}: {name}.", "__module__": __name__, "__qualname__": class_name,
    })
    if code in ERRORS_BY_CODE:
        raise ValueError(f"error code {code} defined twice")  # a slip in the table below
    ERRORS_BY_CODE[code] = cls
    return cls


_RETRIABLE = (True, False)
_METADATA = (False, True)
_RETRIABLE_METADATA = (True, True)

# Kafka's error codes up to Kafka 4.3, one a line as in Kafka's own ``Errors`` enum: the
# class (bound to the name it has; tests/protocol/test_errors.py checks both against the
# kafka-clients jar), the code, the protocol name and the Java exception's flags.
UnknownServerError = _error(-1, "UNKNOWN_SERVER_ERROR")
OffsetOutOfRangeError = _error(1, "OFFSET_OUT_OF_RANGE")
CorruptMessageError = _error(2, "CORRUPT_MESSAGE", _RETRIABLE)
UnknownTopicOrPartitionError = _error(3, "UNKNOWN_TOPIC_OR_PARTITION", _RETRIABLE_METADATA)
InvalidFetchSizeError = _error(4, "INVALID_FETCH_SIZE")
LeaderNotAvailableError = _error(5, "LEADER_NOT_AVAILABLE", _RETRIABLE_METADATA)
NotLeaderOrFollowerError = _error(6, "NOT_LEADER_OR_FOLLOWER", _RETRIABLE_METADATA)
RequestTimedOutError = _error(7, "REQUEST_TIMED_OUT", _RETRIABLE)
BrokerNotAvailableError = _error(8, "BROKER_NOT_AVAILABLE")
ReplicaNotAvailableError = _error(9, "REPLICA_NOT_AVAILABLE", _RETRIABLE_METADATA)
MessageTooLargeError = _error(10, "MESSAGE_TOO_LARGE")
StaleControllerEpochError = _error(11, "STALE_CONTROLLER_EPOCH")
OffsetMetadataTooLargeError = _error(12, "OFFSET_METADATA_TOO_LARGE")
NetworkException = _error(13, "NETWORK_EXCEPTION", _RETRIABLE_METADATA)
CoordinatorLoadInProgressError = _error(14, "COORDINATOR_LOAD_IN_PROGRESS", _RETRIABLE)
CoordinatorNotAvailableError = _error(15, "COORDINATOR_NOT_AVAILABLE", _RETRIABLE)
NotCoordinatorError = _error(16, "NOT_COORDINATOR", _RETRIABLE)
InvalidTopicException = _error(17, "INVALID_TOPIC_EXCEPTION")
RecordListTooLargeError = _error(18, "RECORD_LIST_TOO_LARGE")
NotEnoughReplicasError = _error(19, "NOT_ENOUGH_REPLICAS", _RETRIABLE)
NotEnoughReplicasAfterAppendError = _error(20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", _RETRIABLE)
InvalidRequiredAcksError = _error(21, "INVALID_REQUIRED_ACKS")
IllegalGenerationError = _error(22, "ILLEGAL_GENERATION")
InconsistentGroupProtocolError = _error(23, "INCONSISTENT_GROUP_PROTOCOL")
InvalidGroupIdError = _error(24, "INVALID_GROUP_ID")
UnknownMemberIdError = _error(25, "UNKNOWN_MEMBER_ID")
InvalidSessionTimeoutError = _error(26, "INVALID_SESSION_TIMEOUT")
RebalanceInProgressError = _error(27, "REBALANCE_IN_PROGRESS")
InvalidCommitOffsetSizeError = _error(28, "INVALID_COMMIT_OFFSET_SIZE")
TopicAuthorizationFailedError = _error(29, "TOPIC_AUTHORIZATION_FAILED")
GroupAuthorizationFailedError = _error(30, "GROUP_AUTHORIZATION_FAILED")
ClusterAuthorizationFailedError = _error(31, "CLUSTER_AUTHORIZATION_FAILED")
InvalidTimestampError = _error(32, "INVALID_TIMESTAMP")
UnsupportedSaslMechanismError = _error(33, "UNSUPPORTED_SASL_MECHANISM")
IllegalSaslStateError = _error(34, "ILLEGAL_SASL_STATE")
UnsupportedVersionError = _error(35, "UNSUPPORTED_VERSION")
TopicAlreadyExistsError = _error(36, "TOPIC_ALREADY_EXISTS")
InvalidPartitionsError = _error(37, "INVALID_PARTITIONS")
InvalidReplicationFactorError = _error(38, "INVALID_REPLICATION_FACTOR")
InvalidReplicaAssignmentError = _error(39, "INVALID_REPLICA_ASSIGNMENT")
InvalidConfigError = _error(40, "INVALID_CONFIG")
NotControllerError = _error(41, "NOT_CONTROLLER", _RETRIABLE)
InvalidRequestError = _error(42, "INVALID_REQUEST")
UnsupportedForMessageFormatError = _error(43, "UNSUPPORTED_FOR_MESSAGE_FORMAT")
PolicyViolationError = _error(44, "POLICY_VIOLATION")
OutOfOrderSequenceNumberError = _error(45, "OUT_OF_ORDER_SEQUENCE_NUMBER")
DuplicateSequenceNumberError = _error(46, "DUPLICATE_SEQUENCE_NUMBER")
InvalidProducerEpochError = _error(47, "INVALID_PRODUCER_EPOCH")
InvalidTxnStateError = _error(48, "INVALID_TXN_STATE")
InvalidProducerIdMappingError = _error(49, "INVALID_PRODUCER_ID_MAPPING")
InvalidTransactionTimeoutError = _error(50, "INVALID_TRANSACTION_TIMEOUT")
ConcurrentTransactionsError = _error(51, "CONCURRENT_TRANSACTIONS", _RETRIABLE)
TransactionCoordinatorFencedError = _error(52, "TRANSACTION_COORDINATOR_FENCED")
TransactionalIdAuthorizationFailedError = _error(53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
SecurityDisabledError = _error(54, "SECURITY_DISABLED")
OperationNotAttemptedError = _error(55, "OPERATION_NOT_ATTEMPTED")
KafkaStorageError = _error(56, "KAFKA_STORAGE_ERROR", _RETRIABLE_METADATA)
LogDirNotFoundError = _error(57, "LOG_DIR_NOT_FOUND")
SaslAuthenticationFailedError = _error(58, "SASL_AUTHENTICATION_FAILED")
UnknownProducerIdError = _error(59, "UNKNOWN_PRODUCER_ID")
ReassignmentInProgressError = _error(60, "REASSIGNMENT_IN_PROGRESS")
DelegationTokenAuthDisabledError = _error(61, "DELEGATION_TOKEN_AUTH_DISABLED")
DelegationTokenNotFoundError = _error(62, "DELEGATION_TOKEN_NOT_FOUND")
DelegationTokenOwnerMismatchError = _error(63, "DELEGATION_TOKEN_OWNER_MISMATCH")
DelegationTokenRequestNotAllowedError = _error(64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED")
DelegationTokenAuthorizationFailedError = _error(65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED")
DelegationTokenExpiredError = _error(66, "DELEGATION_TOKEN_EXPIRED")
InvalidPrincipalTypeError = _error(67, "INVALID_PRINCIPAL_TYPE")
NonEmptyGroupError = _error(68, "NON_EMPTY_GROUP")
GroupIdNotFoundError = _error(69, "GROUP_ID_NOT_FOUND")
FetchSessionIdNotFoundError = _error(70, "FETCH_SESSION_ID_NOT_FOUND", _RETRIABLE)
InvalidFetchSessionEpochError = _error(71, "INVALID_FETCH_SESSION_EPOCH", _RETRIABLE)
ListenerNotFoundError = _error(72, "LISTENER_NOT_FOUND", _RETRIABLE_METADATA)
TopicDeletionDisabledError = _error(73, "TOPIC_DELETION_DISABLED")
FencedLeaderEpochError = _error(74, "FENCED_LEADER_EPOCH", _RETRIABLE_METADATA)
UnknownLeaderEpochError = _error(75, "UNKNOWN_LEADER_EPOCH", _RETRIABLE)
UnsupportedCompressionTypeError = _error(76, "UNSUPPORTED_COMPRESSION_TYPE")
StaleBrokerEpochError = _error(77, "STALE_BROKER_EPOCH")
OffsetNotAvailableError = _error(78, "OFFSET_NOT_AVAILABLE", _RETRIABLE)
MemberIdRequiredError = _error(79, "MEMBER_ID_REQUIRED")
PreferredLeaderNotAvailableError = _error(80, "PREFERRED_LEADER_NOT_AVAILABLE", _RETRIABLE_METADATA)
GroupMaxSizeReachedError = _error(81, "GROUP_MAX_SIZE_REACHED")
FencedInstanceIdError = _error(82, "FENCED_INSTANCE_ID")
EligibleLeadersNotAvailableError = _error(83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", _RETRIABLE_METADATA)
ElectionNotNeededError = _error(84, "ELECTION_NOT_NEEDED", _RETRIABLE_METADATA)
NoReassignmentInProgressError = _error(85, "NO_REASSIGNMENT_IN_PROGRESS")
GroupSubscribedToTopicError = _error(86, "GROUP_SUBSCRIBED_TO_TOPIC")
InvalidRecordError = _error(87, "INVALID_RECORD")
UnstableOffsetCommitError = _error(88, "UNSTABLE_OFFSET_COMMIT", _RETRIABLE)
ThrottlingQuotaExceededError = _error(89, "THROTTLING_QUOTA_EXCEEDED", _RETRIABLE)
ProducerFencedError = _error(90, "PRODUCER_FENCED")
ResourceNotFoundError = _error(91, "RESOURCE_NOT_FOUND")
DuplicateResourceError = _error(92, "DUPLICATE_RESOURCE")
UnacceptableCredentialError = _error(93, "UNACCEPTABLE_CREDENTIAL")
InconsistentVoterSetError = _error(94, "INCONSISTENT_VOTER_SET")
InvalidUpdateVersionError = _error(95, "INVALID_UPDATE_VERSION")
FeatureUpdateFailedError = _error(96, "FEATURE_UPDATE_FAILED")
PrincipalDeserializationFailureError = _error(97, "PRINCIPAL_DESERIALIZATION_FAILURE")
SnapshotNotFoundError = _error(98, "SNAPSHOT_NOT_FOUND")
PositionOutOfRangeError = _error(99, "POSITION_OUT_OF_RANGE")
UnknownTopicIdError = _error(100, "UNKNOWN_TOPIC_ID", _RETRIABLE_METADATA)
DuplicateBrokerRegistrationError = _error(101, "DUPLICATE_BROKER_REGISTRATION")
BrokerIdNotRegisteredError = _error(102, "BROKER_ID_NOT_REGISTERED")
InconsistentTopicIdError = _error(103, "INCONSISTENT_TOPIC_ID", _RETRIABLE_METADATA)
InconsistentClusterIdError = _error(104, "INCONSISTENT_CLUSTER_ID")
TransactionalIdNotFoundError = _error(105, "TRANSACTIONAL_ID_NOT_FOUND")
FetchSessionTopicIdError = _error(106, "FETCH_SESSION_TOPIC_ID_ERROR", _RETRIABLE)
IneligibleReplicaError = _error(107, "INELIGIBLE_REPLICA")
NewLeaderElectedError = _error(108, "NEW_LEADER_ELECTED")
OffsetMovedToTieredStorageError = _error(109, "OFFSET_MOVED_TO_TIERED_STORAGE")
FencedMemberEpochError = _error(110, "FENCED_MEMBER_EPOCH")
UnreleasedInstanceIdError = _error(111, "UNRELEASED_INSTANCE_ID")
UnsupportedAssignorError = _error(112, "UNSUPPORTED_ASSIGNOR")
StaleMemberEpochError = _error(113, "STALE_MEMBER_EPOCH")
MismatchedEndpointTypeError = _error(114, "MISMATCHED_ENDPOINT_TYPE")
UnsupportedEndpointTypeError = _error(115, "UNSUPPORTED_ENDPOINT_TYPE")
UnknownControllerIdError = _error(116, "UNKNOWN_CONTROLLER_ID")
UnknownSubscriptionIdError = _error(117, "UNKNOWN_SUBSCRIPTION_ID")
TelemetryTooLargeError = _error(118, "TELEMETRY_TOO_LARGE")
InvalidRegistrationError = _error(119, "INVALID_REGISTRATION")
TransactionAbortableError = _error(120, "TRANSACTION_ABORTABLE")
InvalidRecordStateError = _error(121, "INVALID_RECORD_STATE")
ShareSessionNotFoundError = _error(122, "SHARE_SESSION_NOT_FOUND", _RETRIABLE)
InvalidShareSessionEpochError = _error(123, "INVALID_SHARE_SESSION_EPOCH", _RETRIABLE)
FencedStateEpochError = _error(124, "FENCED_STATE_EPOCH")
InvalidVoterKeyError = _error(125, "INVALID_VOTER_KEY")
DuplicateVoterError = _error(126, "DUPLICATE_VOTER")
VoterNotFoundError = _error(127, "VOTER_NOT_FOUND")
InvalidRegularExpressionError = _error(128, "INVALID_REGULAR_EXPRESSION")
RebootstrapRequiredError = _error(129, "REBOOTSTRAP_REQUIRED")
StreamsInvalidTopologyError = _error(130, "STREAMS_INVALID_TOPOLOGY")
StreamsInvalidTopologyEpochError = _error(131, "STREAMS_INVALID_TOPOLOGY_EPOCH")
StreamsTopologyFencedError = _error(132, "STREAMS_TOPOLOGY_FENCED")
ShareSessionLimitReachedError = _error(133, "SHARE_SESSION_LIMIT_REACHED", _RETRIABLE)

__all__ = [
    "ERRORS_BY_CODE", "NO_ERROR", "CorruptRecordError", "KProdError", "KafkaConnectionError", "KafkaError",
    "UnknownErrorCode", "error_for_code", "failure_for_code", *(cls.__name__ for cls in ERRORS_BY_CODE.values()),
]


def error_for_code(code: int, message: str | None = None) -> KafkaError | None:
    """The exception for a broker error code, or None for NO_ERROR.

    A code the table does not know gives an :class:`UnknownErrorCode` carrying it.
    """
    return None if code == NO_ERROR else failure_for_code(code, message)


def failure_for_code(code: int, message: str | None = None) -> KafkaError:
    """The exception for a broker error code the caller knows is not NO_ERROR."""
    if code == NO_ERROR:
        raise ValueError(f"error code {NO_ERROR} (NONE) is not a failure" + (f": {message}" if message else ""))
    cls = ERRORS_BY_CODE.get(code) or _UNKNOWN_CODES.get(code)
    if cls is None:
        cls = _UNKNOWN_CODES[code] = type(f"UnknownErrorCode{code}", (UnknownErrorCode,), {
            "code": code, "name": f"UNKNOWN_CODE_{code}", "__module__": __name__})
    return cls(message)


_UNKNOWN_CODES: dict[int, type[KafkaError]] = {}
