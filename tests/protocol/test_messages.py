"""Schemas and framing: round trips at every version, golden header bytes, correlation."""

import pytest

from spark_sink.protocol import primitives as p
from spark_sink.protocol.errors import CorruptRecordError, UnsupportedVersionError
from spark_sink.protocol.framing import KafkaProtocol, encode_request_header
from spark_sink.protocol.messages import (
    APIS, ApiKey, choose_version, decode_request_body, decode_response_body, encode_request_body,
    encode_response_body,
)

PRODUCE_RESPONSE = {
    "responses": [{"name": "t", "partition_responses": [{
        "index": 2, "error_code": 0, "base_offset": 41, "log_append_time_ms": -1, "log_start_offset": 0,
        "record_errors": [], "error_message": None}]}],
    "throttle_time_ms": 0,
}


@pytest.mark.parametrize("version", range(3, 13))
def test_produce_round_trip_every_version(version):
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 30000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 2, "records": b"\x00" * 70}]}]}
    assert decode_request_body(ApiKey.PRODUCE, version, encode_request_body(ApiKey.PRODUCE, version, body)) == body
    decoded = decode_response_body(ApiKey.PRODUCE, version, encode_response_body(ApiKey.PRODUCE, version, PRODUCE_RESPONSE))
    part = decoded["responses"][0]["partition_responses"][0]
    assert (part["index"], part["base_offset"]) == (2, 41)


@pytest.mark.parametrize("version", range(1, 13))
def test_metadata_round_trip_every_version(version):
    body = {"brokers": [{"node_id": 1, "host": "h", "port": 9092, "rack": None}], "cluster_id": "c",
            "controller_id": 1, "topics": [{"error_code": 0, "name": "t", "is_internal": False, "partitions": [
                {"error_code": 0, "partition_index": 0, "leader_id": 1, "leader_epoch": 3, "replica_nodes": [1],
                 "isr_nodes": [1], "offline_replicas": []}]}]}
    decoded = decode_response_body(ApiKey.METADATA, version, encode_response_body(ApiKey.METADATA, version, body))
    assert decoded["brokers"][0]["port"] == 9092
    assert decoded["topics"][0]["partitions"][0]["leader_id"] == 1


def test_golden_api_versions_v3_request():
    _, frame = KafkaProtocol("kp").send_request(ApiKey.API_VERSIONS, 3, {
        "client_software_name": "kprod", "client_software_version": "1"})
    expected_payload = (
        b"\x00\x12" b"\x00\x03" b"\x00\x00\x00\x00" b"\x00\x02kp" b"\x00"  # header v2
        b"\x06kprod" b"\x021" b"\x00"  # compact strings + empty tagged fields
    )
    assert frame == p.INT32.pack(len(expected_payload)) + expected_payload


def test_request_header_v1_for_non_flexible():
    assert encode_request_header(0, 8, 7, None) == b"\x00\x00\x00\x08\x00\x00\x00\x07\xff\xff"


def test_protocol_matches_responses_to_requests():
    proto = KafkaProtocol()
    cid, _ = proto.send_request(ApiKey.PRODUCE, 9, {"acks": -1, "timeout_ms": 1, "topic_data": []})
    body = encode_response_body(ApiKey.PRODUCE, 9, PRODUCE_RESPONSE)
    frame = p.INT32.pack(cid) + b"\x00" + body  # response header v1 for flexible versions
    data = p.INT32.pack(len(frame)) + frame
    assert proto.receive_data(data[:5]) == []  # partial frames wait for the rest
    ((got_cid, key, version, decoded),) = proto.receive_data(data[5:])
    assert (got_cid, key, version) == (cid, ApiKey.PRODUCE, 9)
    assert decoded["responses"][0]["partition_responses"][0]["base_offset"] == 41
    assert proto.in_flight == 0
    with pytest.raises(CorruptRecordError):
        proto.receive_data(data)


def test_choose_version():
    assert choose_version(ApiKey.PRODUCE, 0, 11) == 11
    assert choose_version(ApiKey.PRODUCE, 0, 99) == APIS[ApiKey.PRODUCE].max_version
    with pytest.raises(UnsupportedVersionError, match="PRODUCE"):
        choose_version(ApiKey.PRODUCE, 0, 2)
