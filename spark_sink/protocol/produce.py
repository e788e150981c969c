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

from spark_sink.protocol.errors import CorruptRecordError

FLEXIBLE_FROM = 9  # first version with compact lengths and tagged fields

Buffer = bytes | bytearray | memoryview

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_PARTITION_HEAD = struct.Struct(">ihq")  # index, error_code, base_offset
_I64 = struct.Struct(">q")
_I64_PAIR = struct.Struct(">qq")
# Payloads shorter than this are copied into the surrounding small writes: one buffer
# per record batch header would cost more per sendmsg entry than copying 61 bytes.
_COPY_BELOW = 1024


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    data = value.encode()
    return (_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


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
    small += _uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    for topic in topics:
        small += _string(topic.get("name", ""), flexible)
        partitions = topic.get("partition_data") or ()
        small += _uvarint(len(partitions) + 1) if flexible else _I32.pack(len(partitions))
        for part in partitions:
            small += _I32.pack(part.get("index", 0))
            records = part.get("records")
            if records is None:
                small += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                pieces = (records,) if isinstance(records, (bytes, bytearray, memoryview)) else records
                size = sum(len(piece) for piece in pieces)
                small += _uvarint(size + 1) if flexible else _I32.pack(size)
                for piece in pieces:
                    if len(piece) < _COPY_BELOW:
                        small += piece
                    else:
                        out.append(bytes(small))
                        out.append(piece)
                        small = bytearray()
            if flexible:
                small += b"\x00"  # partition's tagged fields
        if flexible:
            small += b"\x00"  # topic's tagged fields
    if flexible:
        small += b"\x00"  # request's tagged fields
    out.append(bytes(small))
    return out


def decode_response(version: int, buf: memoryview, pos: int = 0) -> tuple[dict[str, Any], int]:
    """A Produce response body at ``version`` from ``buf[pos:]``; returns (body, end)."""
    try:
        return _decode_response(version, buf, pos)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"truncated or corrupt Produce v{version} response: {exc}") from exc


def _decode_response(version: int, buf: memoryview, pos: int) -> tuple[dict[str, Any], int]:
    flexible = version >= FLEXIBLE_FROM
    unpack_i32 = _I32.unpack_from

    def uvarint() -> int:
        nonlocal pos
        result = shift = 0
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7
            if shift > 63:
                raise CorruptRecordError("varint longer than 10 bytes")

    def count() -> int:
        nonlocal pos
        if flexible:
            return uvarint() - 1
        (n,) = unpack_i32(buf, pos)
        pos += 4
        return n

    def string() -> str | None:
        nonlocal pos
        if flexible:
            n = uvarint() - 1
        else:
            (n,) = _I16.unpack_from(buf, pos)
            pos += 2
        if n < 0:
            return None
        end = pos + n
        if end > len(buf):
            raise IndexError("string past the end of the response")
        value = str(buf[pos:end], "utf-8")
        pos = end
        return value

    def skip_tagged() -> None:
        nonlocal pos
        for _ in range(uvarint()):
            uvarint()  # tag
            size = uvarint()  # not ``pos += uvarint()``: that would add to pos as it was before the call
            pos += size
        if pos > len(buf):
            raise IndexError("tagged field past the end of the response")

    responses: list[dict[str, Any]] | None = None
    n_topics = count()
    if n_topics >= 0:
        responses = []
        for _ in range(n_topics):
            name = string()
            partitions: list[dict[str, Any]] | None = None
            n_parts = count()
            if n_parts >= 0:
                partitions = []
                for _ in range(n_parts):
                    index, error_code, base_offset = _PARTITION_HEAD.unpack_from(buf, pos)
                    pos += 14
                    part: dict[str, Any] = {"index": index, "error_code": error_code, "base_offset": base_offset}
                    if version >= 5:
                        part["log_append_time_ms"], part["log_start_offset"] = _I64_PAIR.unpack_from(buf, pos)
                        pos += 16
                    else:
                        (part["log_append_time_ms"],) = _I64.unpack_from(buf, pos)
                        pos += 8
                    if version >= 8:
                        errors: list[dict[str, Any]] | None = None
                        n_errors = count()
                        if n_errors >= 0:
                            errors = []
                            for _ in range(n_errors):
                                (batch_index,) = unpack_i32(buf, pos)
                                pos += 4
                                errors.append({"batch_index": batch_index, "batch_index_error_message": string()})
                                if flexible:
                                    skip_tagged()
                        part["record_errors"] = errors
                        part["error_message"] = string()
                    if flexible:
                        skip_tagged()
                    partitions.append(part)
            responses.append({"name": name, "partition_responses": partitions})
            if flexible:
                skip_tagged()
    body: dict[str, Any] = {"responses": responses}
    (body["throttle_time_ms"],) = unpack_i32(buf, pos)
    pos += 4
    if flexible:
        skip_tagged()
    return body, pos
