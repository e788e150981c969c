"""Produce request and response, written out by hand for the hot path.

The generic schema codec walks field tables and recurses per struct; for the one API
the producer sends thousands of times a second that walk cost more than the rest of the
sender. These functions write and read exactly the same bytes as the Produce schema in
:mod:`spark_sink.protocol.messages` (the tests check every version against it), with
two differences that matter for speed:

- a partition's ``records`` may be a sequence of buffers (a batch header and its
  payload) and the request comes back as a list of buffers, so record bytes are never
  joined or copied before ``sendmsg``;
- responses are read with precompiled structs, without a per-field dispatch.
"""

from __future__ import annotations

import struct
from typing import Any

from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.primitives import write_uvarint

FLEXIBLE_FROM = 9  # first version with compact lengths and tagged fields

Buffer = bytes | bytearray | memoryview

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


def encode_request(version: int, body: dict[str, Any]) -> list[Buffer]:
    """The Produce request body at ``version`` as buffers to write in order.

    ``body`` has the schema's shape; a partition's ``records`` is None, one buffer, or
    a sequence of buffers that together form its record batch.
    """
    flexible = version >= FLEXIBLE_FROM
    out: list[Buffer] = []
    small = bytearray(_string(body.get("transactional_id"), flexible))
    small += _ACKS_TIMEOUT.pack(body.get("acks", 0), body.get("timeout_ms", 0))
    topics = body.get("topic_data") or ()
    small += write_uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    for topic in topics:
        small += _string(topic.get("name", ""), flexible)
        partitions = topic.get("partition_data") or ()
        small += write_uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for part in partitions:
            small += _I32.pack(part.get("index", 0))
            records = part.get("records")
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


def decode_response(version: int, buf: memoryview, pos: int = 0) -> tuple[dict[str, Any], int]:
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


def _decode_response(version: int, buf: memoryview, pos: int) -> tuple[dict[str, Any], int]:
    flexible = version >= FLEXIBLE_FROM
    responses: list[dict[str, Any]] | None = None
    n_topics, pos = _count_at(buf, pos, flexible)
    if n_topics >= 0:
        responses = []
        for _ in range(n_topics):
            name, pos = _string_at(buf, pos, flexible)
            partitions: list[dict[str, Any]] | None = None
            n_parts, pos = _count_at(buf, pos, flexible)
            if n_parts >= 0:
                partitions = []
                for _ in range(n_parts):
                    if version >= 5:
                        index, error_code, base_offset, append_time, start_offset = _PARTITION_V5.unpack_from(buf, pos)
                        pos += 30
                        part: dict[str, Any] = {"index": index, "error_code": error_code, "base_offset": base_offset,
                                                "log_append_time_ms": append_time, "log_start_offset": start_offset}
                    else:
                        index, error_code, base_offset = _PARTITION_HEAD.unpack_from(buf, pos)
                        (append_time,) = _I64.unpack_from(buf, pos + 14)
                        pos += 22
                        part = {"index": index, "error_code": error_code, "base_offset": base_offset,
                                "log_append_time_ms": append_time}
                    if flexible and buf[pos:pos + 3] == _PLAIN_TAIL:
                        part["record_errors"] = []
                        part["error_message"] = None
                        pos += 3
                    elif version >= 8:
                        pos = _record_errors(buf, pos, flexible, part)
                        if flexible:
                            pos = _skip_tagged_at(buf, pos)
                    partitions.append(part)
            responses.append({"name": name, "partition_responses": partitions})
            if flexible:
                pos = pos + 1 if buf[pos] == 0 else _skip_tagged_at(buf, pos)
    body: dict[str, Any] = {"responses": responses}
    (body["throttle_time_ms"],) = _I32.unpack_from(buf, pos)
    pos += 4
    if flexible:
        pos = _skip_tagged_at(buf, pos)
    return body, pos


def _record_errors(buf: memoryview, pos: int, flexible: bool, part: dict[str, Any]) -> int:
    """Read a partition's record_errors and error_message (v8+) into ``part``."""
    errors: list[dict[str, Any]] | None = None
    n_errors, pos = _count_at(buf, pos, flexible)
    if n_errors >= 0:
        errors = []
        for _ in range(n_errors):
            (batch_index,) = _I32.unpack_from(buf, pos)
            message, pos = _string_at(buf, pos + 4, flexible)
            errors.append({"batch_index": batch_index, "batch_index_error_message": message})
            if flexible:
                pos = _skip_tagged_at(buf, pos)
    part["record_errors"] = errors
    part["error_message"], pos = _string_at(buf, pos, flexible)
    return pos
