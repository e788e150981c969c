"""The hand-written Produce codec against the generic schema codec, at every version."""

import copy
from collections.abc import Sequence
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.protocol import kmsg, produce
from spark_sink.protocol import primitives as p
from spark_sink.protocol.apis import APIS, ApiKey
from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.framing import KafkaProtocol
from spark_sink.protocol.schema import Buffer, Records, Schema, decode, encode

T = TypeVar("T")

VERSIONS = range(APIS[ApiKey.PRODUCE].min_version, APIS[ApiKey.PRODUCE].max_version + 1)
REQUEST, RESPONSE = APIS[ApiKey.PRODUCE].request, APIS[ApiKey.PRODUCE].response


def _buffers(records: Records) -> Sequence[Buffer]:
    """A partition's records as the buffers that together form them."""
    return [records] if isinstance(records, (bytes, bytearray, memoryview)) else records


def _joined(body: kmsg.ProduceRequest) -> kmsg.ProduceRequest:
    """The same body with every partition's records as one bytes object."""
    return kmsg.ProduceRequest(body.transactional_id, body.acks, body.timeout_ms, [
        kmsg.TopicProduceData(t.name, [
            kmsg.PartitionProduceData(d.index, d.records if d.records is None or isinstance(d.records, bytes)
                                      else b"".join(_buffers(d.records))) for d in t.partition_data])
        for t in body.topic_data])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("transactional_id", [None, "tx-é"])
def test_request_bytes_equal_the_schema_encoder(version: int, transactional_id: str | None) -> None:
    big = bytes(range(256)) * 20  # past the copy threshold: travels as its own buffer
    body = kmsg.ProduceRequest(transactional_id, -1, 30000, [
        kmsg.TopicProduceData("a", [
            kmsg.PartitionProduceData(0, (b"h" * 61, big)),   # header + payload, as the sender passes them
            kmsg.PartitionProduceData(3, b"\x01\x02"),
            kmsg.PartitionProduceData(4, None)]),
        kmsg.TopicProduceData("topic-b", [kmsg.PartitionProduceData(1, (memoryview(b"x" * 61), memoryview(big)))]),
        kmsg.TopicProduceData("empty", [])])
    parts = produce.encode_request(version, body)
    assert b"".join(parts) == encode(REQUEST, version, _joined(body))
    assert any(part is big or (isinstance(part, memoryview) and part.obj is big) for part in parts), \
        "large payloads are passed through, not copied"


def _at_version(schema: Schema, version: int, value: T) -> T:
    """``value`` with the fields ``version`` lacks at their defaults: what a broker of that
    version can send (the encoder refuses to drop a value, as Kafka's)."""
    for f in schema.fields:
        v = getattr(value, f.name)
        if not f.in_version(version):
            setattr(value, f.name, copy.deepcopy(f.default))
        elif f.schema is not None and v is not None:
            for item in v if isinstance(v, list) else [v]:
                _at_version(f.schema, version, item)
    return value


def _response(version: int, topics: list) -> kmsg.ProduceResponse:
    body = _at_version(RESPONSE, version, kmsg.ProduceResponse(topics, 7))
    return decode(RESPONSE, version, encode(RESPONSE, version, body))  # normalised to the version's fields


_messages = st.none() | st.text(max_size=12)
_partition = st.builds(
    kmsg.PartitionProduceResponse,
    index=st.integers(0, 2**31 - 1), error_code=st.integers(-1, 120), base_offset=st.integers(-1, 2**62),
    log_append_time_ms=st.integers(-1, 2**45), log_start_offset=st.integers(-1, 2**40),
    record_errors=st.lists(st.builds(kmsg.BatchIndexAndErrorMessage, batch_index=st.integers(0, 1000),
                                     batch_index_error_message=_messages), max_size=2),
    error_message=_messages,
    current_leader=st.none() | st.builds(kmsg.LeaderIdAndEpoch, st.integers(-1, 5), st.integers(-1, 2**31 - 1)))
_topics = st.lists(st.builds(kmsg.TopicProduceResponse, name=st.text(min_size=1, max_size=20),
                             partition_responses=st.lists(_partition, max_size=4)), max_size=3)


@settings(max_examples=60, deadline=None)
@given(version=st.sampled_from(VERSIONS), topics=_topics)
def test_response_decodes_as_the_schema_decoder(version: int, topics: list[kmsg.TopicProduceResponse]) -> None:
    expected = _response(version, topics)
    data = encode(RESPONSE, version, expected)
    decoded, end = produce.decode_response(version, memoryview(b"pad" + data), 3)
    assert decoded == expected
    assert end == 3 + len(data)


def test_tagged_fields_are_read_and_unknown_ones_skipped() -> None:
    # v10 with tagged fields in a partition response (current_leader, tag 0, and an unknown
    # tag 9) and at the end of the body (node_endpoints, tag 0, and an unknown tag 7), as
    # Kafka 3.7+ sends on NOT_LEADER_OR_FOLLOWER.
    leader = p.INT32.pack(2) + p.INT32.pack(7) + b"\x00"
    endpoint = b"\x02" + p.INT32.pack(2) + b"\x02h" + p.INT32.pack(9092) + b"\x00" + b"\x00"
    body = (b"\x02" + b"\x02t"                       # one topic "t"
            + b"\x02" + p.INT32.pack(1) + p.INT16.pack(6) + p.INT64.pack(-1) + p.INT64.pack(-1) + p.INT64.pack(-1)
            + b"\x01" + b"\x00"                      # no record errors, null error message
            + b"\x02" + b"\x00" + bytes([len(leader)]) + leader + b"\x09" + b"\x03abc"  # partition tags
            + b"\x00"                                # topic tags
            + p.INT32.pack(0)
            + b"\x02" + b"\x00" + bytes([len(endpoint)]) + endpoint + b"\x07" + b"\x02zz")  # body tags
    decoded, end = produce.decode_response(10, memoryview(body))
    assert end == len(body)
    (part,) = decoded.responses[0].partition_responses
    assert (part.index, part.error_code, part.error_message) == (1, 6, None)
    assert part.current_leader == kmsg.LeaderIdAndEpoch(leader_id=2, leader_epoch=7)
    assert decoded.node_endpoints == [kmsg.NodeEndpoint(node_id=2, host="h", port=9092, rack=None)]
    assert decode(RESPONSE, 10, body) == decoded


@pytest.mark.parametrize("version", [3, 9, 11])
def test_truncated_response_is_a_corrupt_record_error(version: int) -> None:
    data = encode(RESPONSE, version, _response(version, [kmsg.TopicProduceResponse("t", [
        kmsg.PartitionProduceResponse(index=0, error_code=0, base_offset=5, error_message="m")])]))
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            produce.decode_response(version, memoryview(data[:cut]))


def test_framed_parts_are_the_framed_bytes() -> None:
    body = kmsg.ProduceRequest(acks=1, timeout_ms=5, topic_data=[kmsg.TopicProduceData("t", [
        kmsg.PartitionProduceData(0, (b"h" * 61, b"p" * 5000))])])
    _, parts = KafkaProtocol("kp").send_request_parts(ApiKey.PRODUCE, 9, body)
    _, frame = KafkaProtocol("kp").send_request(ApiKey.PRODUCE, 9, body)
    assert b"".join(parts) == frame
    assert p.INT32.unpack_from(frame)[0] == len(frame) - 4


@pytest.mark.parametrize("value", [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**31 - 1, 2**35])
def test_unsigned_varints_at_every_width_boundary(value: int) -> None:
    encoded = p.write_uvarint(value)
    # LEB128 by its definition: seven bits a byte, low first, the top bit on all but the last.
    groups = [(value >> shift) & 0x7F for shift in range(0, max(value.bit_length(), 1), 7)]
    assert encoded == bytes([g | 0x80 for g in groups[:-1]] + groups[-1:])
    assert produce._uvarint_at(memoryview(b"x" + encoded), 1) == (value, 1 + len(encoded))
