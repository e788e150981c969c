"""Produce request and response, written out by hand for the hot path.

The generic schema codec walks field tables and recurses per struct; for the one API
the producer sends thousands of times a second that walk cost more than the rest of the
sender. These functions write and read exactly the same bytes as the Produce schema generated
from Kafka's definition (``kmsg.PRODUCE_REQUEST`` and ``kmsg.PRODUCE_RESPONSE``; the tests
check every version against the generic codec), into and from the same typed classes,
with two differences that matter for speed:

- a partition's ``records`` may be a sequence of buffers (a batch header and its
  payload) and the request comes back as a list of buffers, so record bytes are never
  joined or copied before ``sendmsg``;
- responses are read with precompiled structs, without a per-field dispatch; only a
  partition's tagged fields (its current leader, after NOT_LEADER_OR_FOLLOWER) go
  through the generic codec.
"""

from __future__ import annotations

import struct

from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.kmsg import (
    PRODUCE_REQUEST,
    PRODUCE_RESPONSE,
    BatchIndexAndErrorMessage,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    TopicProduceResponse,
)
from spark_sink.protocol.primitives import Reader, write_uvarint
from spark_sink.protocol.schema import Buffer, read_tagged_into

FLEXIBLE_FROM = PRODUCE_REQUEST.flexible_from  # first version with compact lengths and tagged fields
assert PRODUCE_RESPONSE.flexible_from == FLEXIBLE_FROM
# The tagged fields of a partition and of the whole response, for the generic codec.
_PARTITION_SCHEMA = PRODUCE_RESPONSE.struct("responses").struct("partition_responses")

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_PARTITION_HEAD = struct.Struct(">ihq")  # index, error_code, base_offset
_I64 = struct.Struct(">q")
# Payloads shorter than this are copied into the surrounding small writes: one buffer
# per record batch header would cost more per sendmsg entry than copying 61 bytes.
_COPY_BELOW = 1024


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = value.encode()
    return (write_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def encode_request(version: int, body: ProduceRequest) -> list[Buffer]:
    """The Produce request body at ``version`` as buffers to write in order.

    A partition's ``records`` is None, one buffer, or a sequence of buffers that together
    form its record batch.
    """
    flexible = version >= FLEXIBLE_FROM
    out: list[Buffer] = []
    small = bytearray(_string(body.transactional_id, flexible))
    small += _ACKS_TIMEOUT.pack(body.acks, body.timeout_ms)
    topics = body.topic_data
    small += write_uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    for topic in topics:
        small += _string(topic.name, flexible)
        partitions = topic.partition_data
        small += write_uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for part in partitions:
            small += _I32.pack(part.index)
            records = part.records
            if records is None:
                small += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                pieces = (records,) if isinstance(records, (bytes, bytearray, memoryview)) else records
                size = sum(map(len, pieces))
                small += write_uvarint(size + 1) if flexible else _I32.pack(size)
                for piece in pieces:
                    if len(piece) < _COPY_BELOW:
                        small += piece
                    else:
                        out.append(small)
                        out.append(piece)
                        small = bytearray()
            if flexible:
                small += b"\x00"  # partition's tagged fields
        if flexible:
            small += b"\x00"  # topic's tagged fields
    if flexible:
        small += b"\x00"  # request's tagged fields
    out.append(small)
    return out


def decode_response(version: int, buf: memoryview, pos: int = 0) -> tuple[ProduceResponse, int]:
    """A Produce response body at ``version`` from ``buf[pos:]``; returns (body, end)."""
    try:
        return _decode_response(version, buf, pos)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"truncated or corrupt Produce v{version} response: {exc}") from exc


def _uvarint_at(buf: memoryview, pos: int) -> tuple[int, int]:
    """(unsigned varint at ``pos``, position after it)."""
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")


def _skip_tagged_at(buf: memoryview, pos: int) -> int:
    """Position after the tagged-field section at ``pos`` (its fields are not used)."""
    count, pos = _uvarint_at(buf, pos)
    for _ in range(count):
        _, pos = _uvarint_at(buf, pos)  # tag
        size, pos = _uvarint_at(buf, pos)
        pos += size
    if pos > len(buf):
        raise IndexError("tagged field past the end of the response")
    return pos


def _string_at(buf: memoryview, pos: int, flexible: bool) -> tuple[str | None, int]:
    if flexible:
        n, pos = _uvarint_at(buf, pos)
        n -= 1
    else:
        (n,) = _I16.unpack_from(buf, pos)
        pos += 2
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise IndexError("string past the end of the response")
    return str(buf[pos:end], "utf-8"), end


def _count_at(buf: memoryview, pos: int, flexible: bool) -> tuple[int, int]:
    """(array length, -1 for null; position after it)."""
    if flexible:
        n, pos = _uvarint_at(buf, pos)
        return n - 1, pos
    return _I32.unpack_from(buf, pos)[0], pos + 4


# A flexible partition response's usual tail: no record errors, a null error message, no
# tagged fields. Matched whole, it saves three varint reads per partition.
_PLAIN_TAIL = b"\x01\x00\x00"
_PARTITION_V5 = struct.Struct(">ihqqq")  # index, error_code, base_offset, log_append_time_ms, log_start_offset


def _decode_response(version: int, buf: memoryview, pos: int) -> tuple[ProduceResponse, int]:
    flexible = version >= FLEXIBLE_FROM
    Partition = PartitionProduceResponse
    responses: list[TopicProduceResponse] = []
    n_topics, pos = _count_at(buf, pos, flexible)
    for _ in range(n_topics):
        name, pos = _string_at(buf, pos, flexible)
        partitions: list[PartitionProduceResponse] = []
        n_parts, pos = _count_at(buf, pos, flexible)
        for _ in range(n_parts):
            if version >= 5:
                index, error_code, base_offset, append_time, start_offset = _PARTITION_V5.unpack_from(buf, pos)
                pos += 30
            else:
                index, error_code, base_offset = _PARTITION_HEAD.unpack_from(buf, pos)
                (append_time,) = _I64.unpack_from(buf, pos + 14)
                start_offset = -1
                pos += 22
            if flexible and buf[pos:pos + 3] == _PLAIN_TAIL:
                part = Partition(index, error_code, base_offset, append_time, start_offset, [], None)
                pos += 3
            else:
                part = Partition(index, error_code, base_offset, append_time, start_offset)
                if version >= 8:
                    pos = _record_errors(buf, pos, flexible, part)
                if flexible:
                    pos = _tagged_into(buf, pos, version, part)
            partitions.append(part)
        responses.append(TopicProduceResponse(name or "", partitions))
        if flexible:
            pos = pos + 1 if buf[pos] == 0 else _skip_tagged_at(buf, pos)
    (throttle_time_ms,) = _I32.unpack_from(buf, pos)
    body = ProduceResponse(responses, throttle_time_ms)
    pos += 4
    if flexible:
        pos = pos + 1 if buf[pos] == 0 else _tagged_into(buf, pos, version, body)
    return body, pos


def _tagged_into(buf: memoryview, pos: int, version: int, value: PartitionProduceResponse | ProduceResponse) -> int:
    """Read the tagged fields at ``pos`` (a partition's current leader, the response's node
    endpoints) into ``value`` with the generic codec; returns the position after them."""
    schema = PRODUCE_RESPONSE if isinstance(value, ProduceResponse) else _PARTITION_SCHEMA
    reader = Reader(buf, pos)
    read_tagged_into(reader, schema, version, value)
    return reader.pos


def _record_errors(buf: memoryview, pos: int, flexible: bool, part: PartitionProduceResponse) -> int:
    """Read a partition's record_errors and error_message (v8+) into ``part``."""
    n_errors, pos = _count_at(buf, pos, flexible)
    errors = part.record_errors
    for _ in range(n_errors):
        (batch_index,) = _I32.unpack_from(buf, pos)
        message, pos = _string_at(buf, pos + 4, flexible)
        errors.append(BatchIndexAndErrorMessage(batch_index, message))
        if flexible:
            pos = _skip_tagged_at(buf, pos)
    part.error_message, pos = _string_at(buf, pos, flexible)
    return pos
