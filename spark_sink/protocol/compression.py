"""Record batch compression codecs (attribute bits 0-2): lz4 through python-lz4, the
others through cramjam. Levels follow Java's ``compression.<codec>.level`` (KIP-390)."""

from __future__ import annotations

import struct
from enum import IntEnum

import cramjam
import lz4.frame


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


# Java's defaults: gzip -1 (zlib's 6), lz4 9 (which Java maps to lz4's fast mode), zstd 3.
DEFAULT_LEVELS = {Codec.GZIP: -1, Codec.LZ4: 9, Codec.ZSTD: 3}
LEVEL_RANGES = {Codec.GZIP: (1, 9), Codec.LZ4: (1, 17), Codec.ZSTD: (-131072, 22)}
_ZLIB_DEFAULT = 6


def compress(codec: int, data: bytes | bytearray | memoryview, level: int | None = None) -> bytes:
    """Compress a records section at ``level`` (None: the codec's default).

    Snappy is written as a raw block, as librdkafka does. lz4 is a frame of independent
    64 KiB blocks without checksums, as Java writes it: Java's reader (and so a Kafka
    broker validating a batch) refuses linked blocks. Its default level is lz4's fast
    mode, as in Java; another level selects LZ4HC at that level, as in Java.
    """
    if codec == Codec.NONE:
        return bytes(data)
    if level is None:
        level = DEFAULT_LEVELS.get(codec)
    if codec == Codec.GZIP:
        return bytes(cramjam.gzip.compress(data, level=_ZLIB_DEFAULT if level == -1 else level))
    if codec == Codec.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == Codec.LZ4:
        return lz4.frame.compress(
            data, compression_level=0 if level == DEFAULT_LEVELS[Codec.LZ4] else level,
            block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, content_checksum=False, store_size=False)
    if codec == Codec.ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
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
        return lz4.frame.decompress(data)
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
