"""Record batch compression codecs (attribute bits 0-2), all through cramjam."""

from __future__ import annotations

import struct
from enum import IntEnum

import cramjam


class Codec(IntEnum):
    """Kafka's compression codec ids as stored in a record batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_BY_NAME = {c.name.lower(): c for c in Codec}
# Java clients wrap snappy in xerial's stream framing; readers must accept it.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def codec_from_name(name: str) -> Codec:
    """``"lz4"`` → Codec.LZ4; raises ValueError naming the accepted names."""
    try:
        return _BY_NAME[name.strip().lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown compression {name!r}; expected one of {', '.join(_BY_NAME)}") from None


def compress(codec: int, data: bytes | bytearray | memoryview) -> bytes:
    """Compress a records section. Snappy is written as a raw block, as librdkafka does."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.GZIP:
        return bytes(cramjam.gzip.compress(data, level=6))
    if codec == Codec.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Codec.LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == Codec.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=3))
    raise ValueError(f"unknown compression codec id {codec}")


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    """Inverse of :func:`compress`; snappy accepts raw blocks and xerial framing."""
    if codec == Codec.NONE:
        return bytes(data)
    if codec == Codec.GZIP:
        return bytes(cramjam.gzip.decompress(data))
    if codec == Codec.SNAPPY:
        if bytes(data[:8]) == _XERIAL_MAGIC:
            return _decompress_xerial(memoryview(data))
        return bytes(cramjam.snappy.decompress_raw(data))
    if codec == Codec.LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == Codec.ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise ValueError(f"unknown compression codec id {codec}")


def _decompress_xerial(data: memoryview) -> bytes:
    # Header: magic (8) + version (4) + compatible version (4), then [int32 length][block]...
    pos, out = 16, []
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + length])))
        pos += length
    return b"".join(out)
