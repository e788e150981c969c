"""Record batch v2 and codecs: round trips, golden header bytes, CRC checks."""

import os
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.protocol.compression import (
    Codec,
    codec_from_name,
    compress,
    compressed_bound,
    decompress,
    largest_input,
)
from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.primitives import Reader, write_uvarint, write_varint
from spark_sink.protocol.records import Record, build_record_batch, decode_record_batches, encode_record, record_parts

records_st = st.lists(
    st.builds(
        Record,
        key=st.none() | st.binary(max_size=40),
        value=st.none() | st.binary(max_size=300),
        timestamp=st.integers(0, 2**41),
        headers=st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3).map(tuple),
    ),
    min_size=1,
    max_size=20,
)


@given(st.integers(-(2**63), 2**63 - 1))
def test_varint_round_trip(n: int) -> None:
    assert Reader(write_varint(n)).varint() == n


@given(st.integers(0, 2**64 - 1))
def test_uvarint_round_trip(n: int) -> None:
    assert Reader(write_uvarint(n)).uvarint() == n


def test_zigzag_matches_the_spec_examples() -> None:
    assert [write_varint(v) for v in (0, -1, 1, -2, 63, -64, 64)] == [
        b"\x00", b"\x01", b"\x02", b"\x03", b"\x7e", b"\x7f", b"\x80\x01"]


@settings(max_examples=60, deadline=None)
@given(records_st, st.sampled_from(list(Codec)))
def test_batch_round_trip_every_codec(records: list[Record], codec: Codec) -> None:
    data = build_record_batch(records, codec=codec, producer_id=7, producer_epoch=1, base_sequence=42)
    (batch,) = decode_record_batches(data)
    assert batch.codec == codec and (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 1, 42)
    assert [(r.key, r.value, r.timestamp, r.headers) for r in batch.records] == [
        (r.key, r.value, r.timestamp, r.headers) for r in records]
    assert [r.offset for r in batch.records] == list(range(len(records)))
    assert batch.last_offset_delta == len(records) - 1
    assert batch.max_timestamp == max(r.timestamp for r in records)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 70_000), st.integers(-(2**42), 2**42), st.none() | st.binary(max_size=40),
       st.none() | st.binary(max_size=300) | st.integers(16_380, 16_390).map(lambda n: b"v" * n),
       st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3))
def test_record_parts_join_to_the_record_and_count_its_bytes(offset_delta: int, timestamp_delta: int,
                                                             key: bytes | None, value: bytes | None,
                                                             headers: list[tuple[str, bytes | None]]) -> None:
    parts, size = record_parts(offset_delta, timestamp_delta, key, value, headers)
    assert b"".join(parts) == encode_record(offset_delta, timestamp_delta, key, value, headers)
    assert size == sum(map(len, parts))


def test_golden_batch_header_and_crc() -> None:
    data = build_record_batch([Record(b"k", b"v", 1000)], producer_id=5, producer_epoch=0, base_sequence=0)
    # One record: attributes 0, tsDelta 0, offsetDelta 0, key len 1 'k', value len 1 'v', 0 headers.
    record = bytes([0x00, 0x00, 0x00, 0x02]) + b"k" + bytes([0x02]) + b"v" + bytes([0x00])
    assert data[61:] == bytes([len(record) * 2]) + record
    base_offset, length, leader_epoch, magic, crc = struct.unpack_from(">qiibI", data)
    assert (base_offset, length, leader_epoch, magic) == (0, len(data) - 12, -1, 2)
    assert crc == crc32c.crc32c(data[21:])
    assert struct.unpack_from(">hiqqqhii", data, 21) == (0, 0, 1000, 1000, 5, 0, 0, 1)
    assert encode_record(0, 0, b"k", b"v") == data[61:]


def test_corrupted_batch_is_rejected() -> None:
    data = bytearray(build_record_batch([Record(b"k", b"value", 1)]))
    data[-2] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        decode_record_batches(bytes(data))


@pytest.mark.parametrize("codec", list(Codec))
def test_codecs_round_trip_large_payload(codec: Codec) -> None:
    payload = b"kafka " * 50000 + bytes(range(256)) * 10
    assert decompress(codec, compress(codec, payload)) == payload


@pytest.mark.parametrize("codec, levels", [(Codec.GZIP, [-1, 1, 9]), (Codec.LZ4, [1, 3, 9, 12, 17]),
                                           (Codec.ZSTD, [-5, 1, 3, 19])])
def test_every_level_round_trips(codec: Codec, levels: list[int]) -> None:
    payload = b"level " * 20000 + bytes(range(256)) * 40
    for level in levels:
        assert decompress(codec, compress(codec, payload, level)) == payload


def _read_lz4_as_java(frame: bytes) -> bytes:
    """Decode an lz4 frame with the checks of Java's Lz4BlockInputStream, which a Kafka
    broker runs on every compressed batch: version 1, independent blocks (it refuses
    linked ones), blocks of 64 KiB to 4 MiB; each block stored raw or lz4-compressed."""
    import lz4.block

    magic, flg, bd = struct.unpack_from("<IBB", frame)
    assert magic == 0x184D2204
    assert flg >> 6 == 1 and flg & 3 == 0, "version 1, reserved bits clear"
    assert flg >> 5 & 1, "Dependent block stream is unsupported"
    block_max = 1 << (2 * (bd >> 4 & 7) + 8)
    assert 4 <= bd >> 4 & 7 <= 7 and bd & 0x8F == 0
    pos = 7 + (8 if flg >> 3 & 1 else 0)  # magic, FLG, BD, [content size], header checksum
    out = []
    while True:
        (size,) = struct.unpack_from("<I", frame, pos)
        pos += 4
        if size == 0:
            break
        length = size & 0x7FFFFFFF
        block = frame[pos : pos + length]
        out.append(block if size & 0x80000000 else lz4.block.decompress(block, uncompressed_size=block_max))
        pos += length + (4 if flg >> 4 & 1 else 0)
    return b"".join(out)


@pytest.mark.parametrize("level", [None, 1, 12])
def test_lz4_frames_are_what_java_reads(level: int | None) -> None:
    # Compressible and incompressible stretches, several 64 KiB blocks.
    payload = (b"kafka " * 30000 + bytes(range(256)) * 300 + os.urandom(70000))
    frame = compress(Codec.LZ4, payload, level)
    assert _read_lz4_as_java(frame) == payload


def test_lz4_reads_linked_block_frames_of_other_clients() -> None:
    import cramjam
    payload = b"linked " * 40000
    assert decompress(Codec.LZ4, bytes(cramjam.lz4.compress(payload))) == payload


def test_snappy_reads_xerial_framing() -> None:
    import cramjam
    block = bytes(cramjam.snappy.compress_raw(b"hello xerial"))
    framed = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert decompress(Codec.SNAPPY, framed) == b"hello xerial"


def test_codec_names() -> None:
    assert codec_from_name("ZSTD") is Codec.ZSTD
    with pytest.raises(ValueError, match="gzip"):
        codec_from_name("brotli")


@pytest.mark.parametrize("codec, levels", [(Codec.NONE, [None]), (Codec.GZIP, [None, 1, 9]), (Codec.SNAPPY, [None]),
                                           (Codec.LZ4, [None, 1, 17]), (Codec.ZSTD, [None, -5, 1, 19])])
def test_nothing_compresses_past_its_bound(codec: Codec, levels: list[int | None]) -> None:
    # Random bytes are what a codec cannot shrink: each library's worst case.
    for size in (0, 1, 100, 16_383, 65_536, 65_537, 200_000, 1_048_576):
        data = os.urandom(size)
        for level in levels:
            assert len(compress(codec, data, level)) <= compressed_bound(codec, size)
    for limit in (0, 61, 1000, 1_048_515):
        largest = largest_input(codec, limit)
        assert compressed_bound(codec, largest) <= limit or largest == 0
        assert compressed_bound(codec, largest + 1) > limit
