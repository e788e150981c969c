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


# compression.type's values, each with its codec: the one table of codec names.
CODECS_BY_NAME: dict[str, Codec] = {c.name.lower(): c for c in Codec}
# Java clients wrap snappy in xerial's stream framing; readers must accept it.
_XERIAL_MAGIC = b"\x82SNAPPY\x00"


def codec_from_name(name: str) -> Codec:
    """``"lz4"`` → Codec.LZ4; raises ValueError naming the accepted names."""
    try:
        return CODECS_BY_NAME[name.strip().lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"unknown compression {name!r}; expected one of {', '.join(CODECS_BY_NAME)}") from None


# Java's defaults: gzip -1 (zlib's 6), lz4 9 (which Java maps to lz4's fast mode), zstd 3.
DEFAULT_LEVELS: dict[int, int] = {Codec.GZIP: -1, Codec.LZ4: 9, Codec.ZSTD: 3}
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


def compressed_bound(codec: int, size: int) -> int:
    """The most bytes :func:`compress` can make of ``size`` bytes, whatever they hold.

    Each library's documented worst case: miniz's compressBound (cramjam's gzip is
    miniz_oxide; its fast level does not fall back to stored blocks) with the gzip
    wrapper, snappy's MaxCompressedLength, an lz4 frame whose 64 KiB blocks are all
    stored as they are, and zstd's ZSTD_COMPRESSBOUND.
    """
    if codec == Codec.NONE:
        return size
    if codec == Codec.GZIP:
        return max(128 + size * 110 // 100, 128 + size + (size // (31 * 1024) + 1) * 5) + 18
    if codec == Codec.SNAPPY:
        return 32 + size + size // 6
    if codec == Codec.LZ4:
        return size + 7 + 4 * (-(-size // 65_536)) + 4  # frame header, block sizes, end mark
    if codec == Codec.ZSTD:
        return size + (size >> 8) + ((128 * 1024 - size) >> 11 if size < 128 * 1024 else 0)
    raise ValueError(f"unknown compression codec id {codec}")


def largest_input(codec: int, limit: int) -> int:
    """The most bytes that :func:`compress` always makes into at most ``limit`` bytes
    (0 if even an empty input may not fit)."""
    low, high = 0, max(limit, 0)
    while low < high:  # the bounds grow with the input: search for the last that fits
        middle = (low + high + 1) // 2
        if compressed_bound(codec, middle) <= limit:
            low = middle
        else:
            high = middle - 1
    return low


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
