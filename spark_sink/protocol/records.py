"""Record batch v2 (magic 2): the per-record encoder (send()'s batches encode each record
with :func:`record_parts` as it is appended), the batch header, the row-wise reference
and the decoder. (Arrow input is encoded by ``spark_sink.encoder``.)

Layout of a batch (61-byte header, then the records section, compressed as a whole):

    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 |
    crc uint32 | attributes int16 | lastOffsetDelta int32 | baseTimestamp int64 |
    maxTimestamp int64 | producerId int64 | producerEpoch int16 | baseSequence int32 |
    recordCount int32 | records...

The CRC-32C covers attributes..end. The header is built when a batch is drained, because
the producer id, epoch and base sequence are only known then.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import crc32c

from spark_sink.protocol.compression import compress, decompress
from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.primitives import INT8, Reader, write_varint

RECORD_BATCH_OVERHEAD = 61
MAGIC = 2
_CODEC_MASK = 0x07
_TRANSACTIONAL_BIT = 0x10

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_PREFIX = struct.Struct(">qiibI")
# attributes .. recordCount: the part of the header the CRC covers.
_CRC_HEADER = struct.Struct(">hiqqqhii")

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Record:
    """One Kafka record; ``offset`` is absolute when decoded, ignored when encoding."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[Header, ...] = ()
    offset: int = 0


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded record batch with its header fields."""

    base_offset: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: list[Record]

    @property
    def codec(self) -> int:
        return self.attributes & _CODEC_MASK


# Upper bounds of a record's framing, for sizing before it is encoded: everything but the
# bytes of its key, value and headers (length, attributes, timestamp delta, offset delta,
# key length, value length, header count), and what each header adds to its key and value.
MAX_RECORD_OVERHEAD = 5 + 1 + 10 + 5 + 5 + 5 + 5
MAX_HEADER_OVERHEAD = 5 + 5

# Zigzag varints of 0 .. 2**14-1 (offset and small timestamp deltas, field lengths,
# record sizes): the per-record path looks them up rather than computing them.
_SMALL_VARINTS = [write_varint(i) for i in range(1 << 14)]
# For n < 2**14: bytes of n's varint, and of a length-prefixed field of n bytes.
_VARINT_SIZE = [len(v) for v in _SMALL_VARINTS]
_FIELD_SIZE = [len(v) + n for n, v in enumerate(_SMALL_VARINTS)]
_NULL_LENGTH = write_varint(-1)


def _varint(value: int) -> bytes:
    return _SMALL_VARINTS[value] if 0 <= value < 16384 else write_varint(value)


def record_parts(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                 headers: Sequence[Header] = ()) -> tuple[Sequence[bytes], int]:
    """One record as the pieces whose join is its bytes, and its size: a producer batch
    collects records this way and joins them once, when it is sealed. Key and value are
    referenced, never copied.

    send()'s common record (no headers, fields and timestamp delta under 16 KiB) has every
    varint and size looked up from tables; any other goes the general way."""
    if not headers and timestamp_delta >= 0:
        small = _SMALL_VARINTS
        field_size = _FIELD_SIZE
        try:
            if key is None:
                key_length, key_bytes, key_data = _NULL_LENGTH, 1, b""
            else:
                key_length, key_bytes, key_data = small[len(key)], field_size[len(key)], key
            if value is None:
                value_length, value_bytes, value_data = _NULL_LENGTH, 1, b""
            else:
                value_length, value_bytes, value_data = small[len(value)], field_size[len(value)], value
            offset = small[offset_delta] if offset_delta < 16384 else write_varint(offset_delta)
            # attributes and header count: a byte each
            body = 2 + _VARINT_SIZE[timestamp_delta] + len(offset) + key_bytes + value_bytes
            length = small[body]
            return (length, b"\x00", small[timestamp_delta], offset, key_length, key_data, value_length, value_data,
                    b"\x00"), len(length) + body
        except IndexError:
            pass
    return _general_record_parts(offset_delta, timestamp_delta, key, value, headers)


def _general_record_parts(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                          headers: Iterable[Header]) -> tuple[list[bytes], int]:
    """:func:`record_parts` for any record, field by field as the protocol lays it out."""
    parts = [b"", b"\x00", _varint(timestamp_delta), _varint(offset_delta)]  # the length, set below
    for field in (key, value):
        parts += (_NULL_LENGTH,) if field is None else (_varint(len(field)), field)
    headers = tuple(headers)
    parts.append(_varint(len(headers)))
    for hkey, hvalue in headers:
        data = hkey.encode()
        parts += (_varint(len(data)), data)
        parts += (_NULL_LENGTH,) if hvalue is None else (_varint(len(hvalue)), hvalue)
    body = sum(map(len, parts))
    parts[0] = length = _varint(body)
    return parts, len(length) + body


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: Iterable[Header] = ()) -> bytes:
    """One record, its length varint first: the reference the fast paths are checked against."""
    return b"".join(_general_record_parts(offset_delta, timestamp_delta, key, value, headers)[0])


def encode_records(records: Iterable[Record], base_timestamp: int) -> bytes:
    """Reference row-wise encoder of the (uncompressed) records section.

    Record i gets offsetDelta i and timestampDelta ``timestamp - base_timestamp``.
    """
    return b"".join(
        encode_record(i, r.timestamp - base_timestamp, r.key, r.value, r.headers) for i, r in enumerate(records)
    )


def record_batch_header(payload: bytes | memoryview, *, record_count: int, last_offset_delta: int,
                        base_timestamp: int, max_timestamp: int, codec: int = 0, producer_id: int = -1,
                        producer_epoch: int = -1, base_sequence: int = -1, transactional: bool = False,
                        base_offset: int = 0, partition_leader_epoch: int = -1) -> bytes:
    """The 61-byte header that goes before ``payload`` (already compressed with ``codec``),
    its CRC computed over both: header and payload can be written without joining them."""
    attributes = (codec & _CODEC_MASK) | (_TRANSACTIONAL_BIT if transactional else 0)
    covered = _CRC_HEADER.pack(attributes, last_offset_delta, base_timestamp, max_timestamp,
                               producer_id, producer_epoch, base_sequence, record_count)
    crc = crc32c.crc32c(payload, crc32c.crc32c(covered))
    batch_length = RECORD_BATCH_OVERHEAD - 12 + len(payload)
    return _PREFIX.pack(base_offset, batch_length, partition_leader_epoch, MAGIC, crc) + covered


def encode_record_batch(payload: bytes, **fields: Any) -> bytes:
    """The full batch: header + ``payload``; ``fields`` as for :func:`record_batch_header`."""
    return record_batch_header(payload, **fields) + payload


def build_record_batch(records: Sequence[Record], *, codec: int = 0, **ids: int | bool) -> bytes:
    """Row-wise reference: encode, compress and frame ``records`` as one batch."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    base = records[0].timestamp
    payload = compress(codec, encode_records(records, base))
    return encode_record_batch(payload, record_count=len(records), last_offset_delta=len(records) - 1,
                               base_timestamp=base, max_timestamp=max(r.timestamp for r in records),
                               codec=codec, **ids)


def decode_record_batches(data: bytes | memoryview, verify_crc: bool = True) -> list[RecordBatch]:
    """Decode every complete v2 batch in ``data`` (a trailing partial batch is ignored,
    as brokers may cut a fetch mid-batch)."""
    view = memoryview(data)
    batches, pos = [], 0
    while pos + RECORD_BATCH_OVERHEAD <= len(view):
        base_offset, batch_length, leader_epoch, magic, crc = _PREFIX.unpack_from(view, pos)
        end = pos + 12 + batch_length
        if end > len(view):
            break
        if magic != MAGIC:
            raise CorruptRecordError(f"record batch at offset {base_offset} has magic {magic}; only 2 is supported")
        covered = view[pos + 21 : end]
        if verify_crc and crc32c.crc32c(covered) != crc:
            raise CorruptRecordError(f"record batch at offset {base_offset} fails its CRC-32C check")
        (attributes, last_delta, base_ts, max_ts, pid, epoch, base_seq, count) = _CRC_HEADER.unpack_from(view, pos + 21)
        payload = view[pos + RECORD_BATCH_OVERHEAD : end]
        codec = attributes & _CODEC_MASK
        section = decompress(codec, payload) if codec else payload
        batches.append(RecordBatch(base_offset, leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
                                   pid, epoch, base_seq, _decode_records(section, count, base_offset, base_ts)))
        pos = end
    return batches


def _decode_records(section: bytes | memoryview, count: int, base_offset: int, base_timestamp: int) -> list[Record]:
    reader = Reader(section)
    records = []
    for _ in range(count):
        length = reader.varint()
        end = reader.pos + length
        reader.fixed(INT8)  # record attributes: unused in v2
        ts_delta = reader.varint()
        offset_delta = reader.varint()
        key = _read_sized(reader)
        value = _read_sized(reader)
        headers = []
        for _ in range(reader.varint()):
            hkey = _read_sized(reader)
            headers.append((hkey.decode() if hkey is not None else "", _read_sized(reader)))
        if reader.pos != end:
            raise CorruptRecordError("record length does not match its fields")
        records.append(Record(key, value, base_timestamp + ts_delta, tuple(headers), base_offset + offset_delta))
    return records


@dataclass(frozen=True)
class RecordsPiece:
    """Part of a records section cut by ``split_records``: its bytes (compressed with the
    batch's codec), record count, largest timestamp delta and uncompressed size."""

    payload: bytes
    record_count: int
    max_timestamp_delta: int
    uncompressed_size: int


def split_records(payload: bytes | memoryview, count: int, codec: int, at: int,
                  level: int | None = None) -> tuple[RecordsPiece, RecordsPiece]:
    """A records section of ``count`` records (compressed with ``codec``) cut before record
    ``at``, as two sections for two batches with the same base timestamp: the second's
    offset deltas start again at 0 (a broker refuses a batch whose deltas do not), its
    timestamp deltas are kept. What a producer does with a batch the broker refused as too
    large (Java's ProducerBatch.split)."""
    if not 0 < at < count:
        raise ValueError(f"split_records: cannot cut {count} records before record {at}")
    section = memoryview(decompress(codec, payload) if codec else payload)
    reader = Reader(section)
    out = (bytearray(), bytearray())
    largest = [-(1 << 63), -(1 << 63)]
    for i in range(count):
        start = reader.pos
        length = reader.varint()
        end = reader.pos + length
        reader.fixed(INT8)  # attributes
        ts_delta = reader.varint()
        offset_delta = reader.varint()
        if offset_delta != i:
            raise CorruptRecordError(f"record {i} of the section has offset delta {offset_delta}")
        side = int(i >= at)
        if side:
            body = b"\x00" + write_varint(ts_delta) + write_varint(i - at) + section[reader.pos:end]
            out[1].extend(write_varint(len(body)) + body)
        else:
            out[0].extend(section[start:end])
        largest[side] = max(largest[side], ts_delta)
        reader.pos = end
    if reader.pos != len(section):
        raise CorruptRecordError("the records section is longer than its records")
    first, second = (RecordsPiece(compress(codec, bytes(o), level) if codec else bytes(o), n, ts, len(o))
                     for o, n, ts in zip(out, (at, count - at), largest))
    return first, second


def _read_sized(reader: Reader) -> bytes | None:
    n = reader.varint()
    return None if n < 0 else reader.raw(n)
