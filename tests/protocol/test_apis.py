"""Schemas and framing: round trips at every version, golden header bytes, correlation."""

from __future__ import annotations

from typing import TypeVar

import pytest

from spark_sink.protocol import kmsg
from spark_sink.protocol import primitives as p
from spark_sink.protocol.apis import (
    APIS,
    ApiKey,
    choose_version,
    decode_request_body,
    decode_response_body,
    encode_request_body,
    encode_response_body,
)
from spark_sink.protocol.error_codes import CorruptRecordError, UnsupportedVersionError
from spark_sink.protocol.framing import KafkaProtocol, encode_request_header

PRODUCE_RESPONSE = kmsg.ProduceResponse(responses=[kmsg.TopicProduceResponse("t", [kmsg.PartitionProduceResponse(
    index=2, error_code=0, base_offset=41, log_append_time_ms=-1, log_start_offset=0)])])


@pytest.mark.parametrize("version", range(3, 12))
def test_produce_round_trip_every_version(version: int) -> None:
    body = kmsg.ProduceRequest(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[
        kmsg.TopicProduceData("t", [kmsg.PartitionProduceData(index=2, records=b"\x00" * 70)])])
    assert decode_request_body(ApiKey.PRODUCE, version, encode_request_body(ApiKey.PRODUCE, version, body)) == body
    wire = encode_response_body(ApiKey.PRODUCE, version, PRODUCE_RESPONSE)
    decoded = _as(kmsg.ProduceResponse, decode_response_body(ApiKey.PRODUCE, version, wire))
    part = decoded.responses[0].partition_responses[0]
    assert (part.index, part.base_offset) == (2, 41)


@pytest.mark.parametrize("version", range(1, 13))
def test_metadata_round_trip_every_version(version: int) -> None:
    body = kmsg.MetadataResponse(
        brokers=[kmsg.MetadataResponseBroker(node_id=1, host="h", port=9092, rack=None)], cluster_id="c",
        controller_id=1, topics=[kmsg.MetadataResponseTopic(error_code=0, name="t", is_internal=False, partitions=[
            kmsg.MetadataResponsePartition(error_code=0, partition_index=0, leader_id=1, leader_epoch=3,
                                           replica_nodes=[1], isr_nodes=[1], offline_replicas=[])])])
    decoded = _as(kmsg.MetadataResponse, decode_response_body(ApiKey.METADATA, version,
                                                               encode_response_body(ApiKey.METADATA, version, body)))
    assert decoded.brokers[0].port == 9092
    assert decoded.topics[0].partitions[0].leader_id == 1


def test_golden_api_versions_v3_request() -> None:
    _, frame = KafkaProtocol("kp").send_request(ApiKey.API_VERSIONS, 3, kmsg.ApiVersionsRequest(
        client_software_name="kprod", client_software_version="1"))
    expected_payload = (
        b"\x00\x12" b"\x00\x03" b"\x00\x00\x00\x00" b"\x00\x02kp" b"\x00"  # header v2
        b"\x06kprod" b"\x021" b"\x00"  # compact strings + empty tagged fields
    )
    assert frame == p.INT32.pack(len(expected_payload)) + expected_payload


def test_request_header_v1_for_non_flexible() -> None:
    assert encode_request_header(0, 8, 7, None) == b"\x00\x00\x00\x08\x00\x00\x00\x07\xff\xff"


def test_protocol_matches_responses_to_requests() -> None:
    proto = KafkaProtocol()
    cid, _ = proto.send_request(ApiKey.PRODUCE, 9, kmsg.ProduceRequest(acks=-1, timeout_ms=1))
    body = encode_response_body(ApiKey.PRODUCE, 9, PRODUCE_RESPONSE)
    frame = p.INT32.pack(cid) + b"\x00" + body  # response header v1 for flexible versions
    data = p.INT32.pack(len(frame)) + frame
    assert proto.receive_data(data[:5]) == []  # partial frames wait for the rest
    ((got_cid, key, version, decoded),) = proto.receive_data(data[5:])
    assert (got_cid, key, version) == (cid, ApiKey.PRODUCE, 9)
    assert _as(kmsg.ProduceResponse, decoded).responses[0].partition_responses[0].base_offset == 41
    assert proto.in_flight == 0
    with pytest.raises(CorruptRecordError):
        proto.receive_data(data)


def test_choose_version() -> None:
    assert choose_version(ApiKey.PRODUCE, 0, 11) == 11
    assert choose_version(ApiKey.PRODUCE, 0, 99) == APIS[ApiKey.PRODUCE].max_version
    with pytest.raises(UnsupportedVersionError, match="PRODUCE"):
        choose_version(ApiKey.PRODUCE, 0, 2)


T = TypeVar("T")


def _as(cls: type[T], value: object) -> T:
    """A decoded body, of the class its API decodes into."""
    assert isinstance(value, cls), value
    return value


def _response_frame(correlation_id: int, api_key: int, version: int, body: object) -> bytes:
    """A response as a broker writes it (non-flexible versions: header v0)."""
    payload = p.INT32.pack(correlation_id) + encode_response_body(api_key, version, body)
    return p.INT32.pack(len(payload)) + payload


def test_answers_to_requests_sent_expecting_none_are_dropped_at_any_read_boundary() -> None:
    """Kafka never answers a Produce with acks=0; Tansu does, in order. Either way, the
    answered requests behind them get their own responses, whether the stream comes whole
    or one byte at a time (headers split across reads)."""
    produce = kmsg.ProduceResponse([kmsg.TopicProduceResponse("t", [kmsg.PartitionProduceResponse(0, 0, 5)])])
    metadata = kmsg.MetadataResponse(brokers=[kmsg.MetadataResponseBroker(1, "h", 9092, None)], controller_id=1)
    for answers_acks0 in (True, False):
        for chunk in (None, 1, 3):
            proto = KafkaProtocol("t")
            stream = b""
            for _ in range(4):
                cid, _ = proto.send_request(ApiKey.PRODUCE, 3, kmsg.ProduceRequest(acks=0), expect_response=False)
                if answers_acks0:
                    stream += _response_frame(cid, ApiKey.PRODUCE, 3, produce)
                cid, _ = proto.send_request(ApiKey.METADATA, 1, kmsg.MetadataRequest(topics=None))
                stream += _response_frame(cid, ApiKey.METADATA, 1, metadata)
            pieces = [stream] if chunk is None else [stream[i:i + chunk] for i in range(0, len(stream), chunk)]
            got = [r for piece in pieces for r in proto.receive_data(piece)]
            assert [(cid, key) for cid, key, _, _ in got] == [(1, ApiKey.METADATA), (3, ApiKey.METADATA),
                                                              (5, ApiKey.METADATA), (7, ApiKey.METADATA)]
            assert _as(kmsg.MetadataResponse, got[0][3]).brokers[0].port == 9092
            assert proto.in_flight == 0 and not proto._unanswered and not proto._buffer


def test_a_response_out_of_turn_is_still_corrupt() -> None:
    """Only answers to requests sent expecting none are dropped: any other mismatch breaks
    the stream."""
    proto = KafkaProtocol("t")
    proto.send_request(ApiKey.PRODUCE, 3, kmsg.ProduceRequest(acks=0), expect_response=False)  # cid 0
    proto.send_request(ApiKey.METADATA, 1, kmsg.MetadataRequest(topics=None))  # cid 1
    with pytest.raises(CorruptRecordError, match="correlation id 7 does not match the expected 1"):
        proto.receive_data(_response_frame(7, ApiKey.METADATA, 1, kmsg.MetadataResponse()))


def test_api_versions_error_in_v0_layout_after_another_frame() -> None:
    """KIP-511: an ApiVersions error comes in v0's layout. Recognised wherever its frame
    starts in the read, not only at the start of the buffer."""
    proto = KafkaProtocol("t")
    proto.send_request(ApiKey.METADATA, 1, kmsg.MetadataRequest(topics=None))
    proto.send_request(ApiKey.API_VERSIONS, 3, kmsg.ApiVersionsRequest("kprod", "1"))
    metadata = _response_frame(0, ApiKey.METADATA, 1, kmsg.MetadataResponse(controller_id=1))
    v0_error = p.INT32.pack(16) + p.INT32.pack(1) + b"\x00\x23" + p.INT32.pack(1) + b"\x00\x12\x00\x00\x00\x02"
    (_, (cid, key, version, body)) = proto.receive_data(metadata + v0_error)
    assert (cid, key, version) == (1, ApiKey.API_VERSIONS, 0)
    body = _as(kmsg.ApiVersionsResponse, body)
    assert body.error_code == 35 and body.api_keys == [kmsg.ApiVersion(api_key=18, min_version=0, max_version=2)]
