"""Message schemas as data, and one generic encoder/decoder for all of them.

A schema is a tuple of :class:`Field`. A field exists for a range of versions; from the
message's first flexible version on, strings, bytes and arrays use compact (varint)
lengths and every struct ends with a tagged-field section (unknown tags are skipped).
Values are dicts keyed by snake_case field names; missing fields take their default.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from spark_sink.protocol import primitives as p

_MAX = 32767


@dataclass(frozen=True)
class Field:
    """One field: ``type`` is a primitive name, or ``"[]"`` + a primitive, or ``"[]struct"``
    with ``fields`` for arrays of structs."""

    name: str
    type: str
    min_version: int = 0
    max_version: int = _MAX
    default: Any = None
    fields: tuple[Field, ...] = ()
    nullable: bool = False

    def in_version(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


@dataclass(frozen=True)
class Schema:
    """A request or response body: its fields and first flexible version."""

    fields: tuple[Field, ...]
    flexible_from: int = _MAX


# The fixed-width numbers: one table for both directions.
_NUMBERS: dict[str, struct.Struct] = {
    "int8": p.INT8, "int16": p.INT16, "uint16": p.UINT16, "int32": p.INT32, "uint32": p.UINT32,
    "int64": p.INT64, "float64": p.FLOAT64,
}
_FIXED_WRITERS: dict[str, Callable[[Any], bytes]] = {
    **{type_: s.pack for type_, s in _NUMBERS.items()},
    "bool": lambda v: b"\x01" if v else b"\x00",
    "uuid": lambda v: (v.bytes if hasattr(v, "bytes") else bytes(v or bytes(16))),
}
_FIXED_READERS: dict[str, Callable[[p.Reader], Any]] = {
    **{type_: partial(p.Reader.fixed, s=s) for type_, s in _NUMBERS.items()},
    "bool": p.Reader.boolean,
    "uuid": p.Reader.uuid,
}
_DEFAULTS = {"string": "", "bytes": b"", "records": None, "bool": False, "uuid": None}


def _default(field: Field) -> Any:
    if field.default is not None:
        return field.default
    if field.type.startswith("[]"):
        return None if field.nullable else []
    return _DEFAULTS.get(field.type, 0)


_FIELDS_CACHE: dict[tuple[int, int], tuple[Field, ...]] = {}


def _fields_for(fields: tuple[Field, ...], version: int) -> tuple[Field, ...]:
    # Keyed by identity: schemas are module constants, and hashing a tuple of
    # dataclasses on every struct of every request would cost more than the encoding.
    key = (id(fields), version)
    found = _FIELDS_CACHE.get(key)
    if found is None:
        found = _FIELDS_CACHE[key] = tuple(f for f in fields if f.in_version(version))
    return found


def encode(schema: Schema, version: int, value: dict[str, Any]) -> bytes:
    """Encode ``value`` as the body of ``schema`` at ``version``."""
    out: list[bytes] = []
    _encode_struct(out, schema.fields, version, version >= schema.flexible_from, value)
    return b"".join(out)


def _encode_struct(out: list[bytes], fields: tuple[Field, ...], version: int, flexible: bool, value: dict) -> None:
    for field in _fields_for(fields, version):
        v = value.get(field.name, _default(field)) if value is not None else _default(field)
        _encode_value(out, field, field.type, version, flexible, v)
    if flexible:
        out.append(b"\x00")  # no tagged fields written


def _encode_value(out: list[bytes], field: Field, type_: str, version: int, flexible: bool, v: Any) -> None:
    writer = _FIXED_WRITERS.get(type_)
    if writer is not None:
        out.append(writer(v))
    elif type_ == "string":
        out.append(p.write_compact_string(v) if flexible else p.write_string(v))
    elif type_ in ("bytes", "records"):
        if flexible:
            out.append(p.write_compact_bytes(v))
        else:
            out.append(p.INT32.pack(-1 if v is None else len(v)))
            if v is not None:
                out.append(v if isinstance(v, bytes) else bytes(v))
    elif type_.startswith("[]"):
        if v is None:
            out.append(b"\x00" if flexible else p.INT32.pack(-1))
            return
        out.append(p.write_uvarint(len(v) + 1) if flexible else p.INT32.pack(len(v)))
        item_type = type_[2:]
        if item_type == "struct":
            for item in v:
                _encode_struct(out, field.fields, version, flexible, item)
        else:
            for item in v:
                _encode_value(out, field, item_type, version, flexible, item)
    else:
        raise TypeError(f"unknown schema type {type_!r} for field {field.name}")


def decode(schema: Schema, version: int, data: bytes | memoryview | p.Reader) -> dict[str, Any]:
    """Decode a body of ``schema`` at ``version``."""
    reader = data if isinstance(data, p.Reader) else p.Reader(data)
    return _decode_struct(reader, schema.fields, version, version >= schema.flexible_from)


def _decode_struct(reader: p.Reader, fields: tuple[Field, ...], version: int, flexible: bool) -> dict[str, Any]:
    value = {}
    for field in _fields_for(fields, version):
        value[field.name] = _decode_value(reader, field, field.type, version, flexible)
    if flexible:
        reader.skip_tagged_fields()
    return value


def _decode_value(reader: p.Reader, field: Field, type_: str, version: int, flexible: bool) -> Any:
    fixed = _FIXED_READERS.get(type_)
    if fixed is not None:
        return fixed(reader)
    if type_ == "string":
        return reader.compact_string() if flexible else reader.string()
    if type_ in ("bytes", "records"):
        return reader.compact_bytes() if flexible else reader.bytes_()
    if type_.startswith("[]"):
        n = reader.uvarint() - 1 if flexible else reader.int32()
        if n < 0:
            return None
        item_type = type_[2:]
        if item_type == "struct":
            return [_decode_struct(reader, field.fields, version, flexible) for _ in range(n)]
        return [_decode_value(reader, field, item_type, version, flexible) for _ in range(n)]
    raise TypeError(f"unknown schema type {type_!r} for field {field.name}")
