"""Kafka wire primitives: fixed-width ints, zigzag and unsigned varints, strings, bytes.

Writers return ``bytes``; :class:`Reader` walks a buffer with a cursor. Both are plain
functions over memory: no I/O.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from spark_sink.protocol.error_codes import CorruptRecordError

INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
UINT16 = struct.Struct(">H")
INT32 = struct.Struct(">i")
UINT32 = struct.Struct(">I")
INT64 = struct.Struct(">q")
FLOAT64 = struct.Struct(">d")

# Unsigned varints of small values are by far the most common: precompute them.
_SMALL_UVARINTS = [bytes([i]) for i in range(128)]


def write_uvarint(value: int) -> bytes:
    """Unsigned LEB128 (protobuf-style) varint."""
    if 0 <= value < 128:
        return _SMALL_UVARINTS[value]
    # Lengths and counts mostly take two or three bytes: written without a loop.
    if 128 <= value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if 0x4000 <= value < 0x200000:
        return bytes((value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, value >> 14))
    out = bytearray()
    value &= 0xFFFFFFFFFFFFFFFF
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def zigzag(value: int) -> int:
    """Map signed to unsigned so small magnitudes stay short: 0,-1,1,-2 → 0,1,2,3."""
    return (value << 1) ^ (value >> 63)


def write_varint(value: int) -> bytes:
    """Signed zigzag varint (Kafka's varint and varlong share this encoding)."""
    return write_uvarint(zigzag(value) & 0xFFFFFFFFFFFFFFFF)


def write_string(value: str | None) -> bytes:
    """INT16-length string; None is length -1 (NULLABLE_STRING)."""
    if value is None:
        return INT16.pack(-1)
    data = value.encode()
    return INT16.pack(len(data)) + data


def write_compact_string(value: str | None) -> bytes:
    """Unsigned-varint length+1 string; None is 0."""
    if value is None:
        return b"\x00"
    data = value.encode()
    return write_uvarint(len(data) + 1) + data


def write_bytes(value: bytes | None) -> bytes:
    """INT32-length bytes; None is -1."""
    if value is None:
        return INT32.pack(-1)
    return INT32.pack(len(value)) + bytes(value)


def write_compact_bytes(value: bytes | None) -> bytes:
    """Unsigned-varint length+1 bytes; None is 0."""
    if value is None:
        return b"\x00"
    return write_uvarint(len(value) + 1) + bytes(value)


class Reader:
    """A cursor over a buffer that decodes Kafka primitives; raises CorruptRecordError when short."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf if isinstance(buf, memoryview) else memoryview(buf)
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def fixed(self, s: struct.Struct) -> Any:
        """One fixed-width number packed as ``s`` (INT8 ... FLOAT64 above)."""
        pos = self.pos
        if pos + s.size > self.end:
            raise CorruptRecordError(f"truncated: need {s.size} bytes at offset {pos}, have {self.end - pos}")
        self.pos = pos + s.size
        return s.unpack_from(self.buf, pos)[0]

    # The two lengths the variable-size types start with; other numbers go through fixed().
    def int16(self) -> int:
        return self.fixed(INT16)

    def int32(self) -> int:
        return self.fixed(INT32)

    def boolean(self) -> bool:
        return self.fixed(INT8) != 0

    def uvarint(self) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        result = shift = 0
        while True:
            if pos >= end:
                raise CorruptRecordError("truncated varint")
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                self.pos = pos
                return result
            shift += 7
            if shift > 63:
                raise CorruptRecordError("varint longer than 10 bytes")

    def varint(self) -> int:
        raw = self.uvarint()
        return (raw >> 1) ^ -(raw & 1)

    def raw(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise CorruptRecordError(f"truncated: need {n} bytes at offset {self.pos}, have {self.end - self.pos}")
        data = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return data

    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self.raw(n).decode()

    def compact_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self.raw(n).decode()

    def bytes_(self) -> bytes | None:
        n = self.int32()
        return None if n < 0 else self.raw(n)

    def compact_bytes(self) -> bytes | None:
        n = self.uvarint() - 1
        return None if n < 0 else self.raw(n)

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.raw(16))
