"""Replies by type: the AdminClient finds each answer's error where that answer's class
keeps it (at its top, per partition, in its one listed result), and a ClientResponse
hands its reply over only when no error prevented it. Pure: no broker."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from spark_sink.admin.admin_client import _reply_error
from spark_sink.client.connections import ClientResponse
from spark_sink.protocol import kmsg
from spark_sink.protocol.error_codes import (
    CoordinatorNotAvailableError,
    InvalidConfigError,
    KafkaConnectionError,
    ProducerFencedError,
    TransactionalIdNotFoundError,
    UnknownTopicOrPartitionError,
)

T = TypeVar("T")

FENCED, NOT_AVAILABLE = ProducerFencedError.code, CoordinatorNotAvailableError.code


def _offsets(reply_cls: Callable[..., T], topic_cls: Callable[..., object], partition_cls: Callable[..., object],
             code: int, **top: int) -> T:
    return reply_cls(topics=[topic_cls("t", [partition_cls(partition_index=0), partition_cls(
        partition_index=1, error_code=code)])], **top)


CASES = [
    (kmsg.EndTxnResponse(error_code=FENCED), ProducerFencedError),
    (kmsg.InitProducerIdResponse(error_code=NOT_AVAILABLE), CoordinatorNotAvailableError),
    (kmsg.AddOffsetsToTxnResponse(error_code=FENCED), ProducerFencedError),
    (kmsg.ListTransactionsResponse(error_code=NOT_AVAILABLE), CoordinatorNotAvailableError),
    (kmsg.OffsetFetchResponse(error_code=NOT_AVAILABLE), CoordinatorNotAvailableError),
    (_offsets(kmsg.OffsetFetchResponse, kmsg.OffsetFetchResponseTopic, kmsg.OffsetFetchResponsePartition,
              UnknownTopicOrPartitionError.code), UnknownTopicOrPartitionError),
    (_offsets(kmsg.OffsetCommitResponse, kmsg.OffsetCommitResponseTopic, kmsg.OffsetCommitResponsePartition,
              NOT_AVAILABLE), CoordinatorNotAvailableError),
    (_offsets(kmsg.TxnOffsetCommitResponse, kmsg.TxnOffsetCommitResponseTopic,
              kmsg.TxnOffsetCommitResponsePartition, FENCED), ProducerFencedError),
    (kmsg.DescribeTransactionsResponse(transaction_states=[kmsg.DescribeTransactionsResponseTransactionState(
        error_code=TransactionalIdNotFoundError.code)]), TransactionalIdNotFoundError),
    (kmsg.DescribeConfigsResponse(results=[kmsg.DescribeConfigsResult(error_code=InvalidConfigError.code)]),
     InvalidConfigError),
]


@pytest.mark.parametrize(("reply", "error"), CASES, ids=lambda v: type(v).__name__)
def test_each_answer_s_error_is_found_where_its_class_keeps_it(reply: object, error: type[Exception]) -> None:
    found = _reply_error(reply, "call")
    assert type(found) is error and "call" in str(found)


@pytest.mark.parametrize("reply", [type(r)() for r, _ in CASES] + [kmsg.MetadataResponse()],
                         ids=lambda v: type(v).__name__)
def test_an_answer_without_error_has_none(reply: object) -> None:
    assert _reply_error(reply, "call") is None


def test_a_reply_is_handed_over_only_without_an_error() -> None:
    body = kmsg.MetadataResponse()
    assert ClientResponse(1, 3, 12, 7, body, None, 1.0).reply() is body
    refused = KafkaConnectionError("node 1 closed the connection")
    with pytest.raises(KafkaConnectionError, match="closed"):
        ClientResponse(1, 3, 12, 7, None, refused, 1.0).reply()
    with pytest.raises(KafkaConnectionError, match="expected no reply"):
        ClientResponse(1, 0, 11, 7, None, None, 0.0).reply()  # a Produce with acks=0
