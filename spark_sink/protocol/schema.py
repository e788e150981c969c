"""Message schemas as data, and one generic encoder/decoder for all of them.

A :class:`Schema` is a typed class (a dataclass) and a tuple of :class:`Field`, one per
attribute, in the class's order. A field exists for a range of versions; from the
message's first flexible version on, strings, bytes and arrays use compact (varint)
lengths and every struct ends with a tagged-field section, in which the fields with a
``tag`` travel (unknown tags are skipped). The tables and classes are generated from
Kafka's own message definitions (:mod:`spark_sink.protocol.kmsg`).

For each struct and version the codec builds a plan once: the attributes on the wire,
each with the function that reads or writes it, and the defaults of the others. Decoding
then constructs the class with every value at once.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

from spark_sink.protocol import primitives as p
from spark_sink.protocol.error_codes import CorruptRecordError, UnsupportedVersionError

_MAX = 32767

Reply = TypeVar("Reply", covariant=True)


class Request(Generic[Reply]):
    """A request message whose answer is a ``Reply``: kmsg's request classes say so, so
    that sending one is typed by its reply (``NetworkClient.send``). The pairs are those
    of kmsg's ``SCHEMAS`` (tests/protocol/test_kafka_json.py checks it)."""

    __slots__ = ()


Buffer = bytes | bytearray | memoryview
# A Produce partition's record batch: one buffer, or buffers that together form it.
Records = Buffer | Sequence[Buffer]


@dataclass(frozen=True, slots=True)
class Field:
    """One attribute: ``type`` is a primitive name, ``"[]"`` + a primitive, ``"[]struct"``
    or ``"struct"`` (then ``schema`` describes it). ``nullable`` and ``tagged`` are the
    version ranges in which it may be null and in which it travels as tag ``tag``.
    Outside its versions a field that is not ``ignorable`` must be at its default to be
    written (as in Kafka's generated code: the value would be lost). ``flexible``: where
    a string or bytes field of its own keeps the old fixed-width length in a flexible
    message, the versions in which it is compact (None: never)."""

    name: str
    type: str
    min_version: int = 0
    max_version: int = _MAX
    default: Any = 0
    schema: Schema | None = None
    nullable: tuple[int, int] | None = None
    tag: int | None = None
    tagged: tuple[int, int] | None = None
    ignorable: bool = False
    flexible: tuple[int, int] | None = (0, _MAX)

    def in_version(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def nullable_in(self, version: int) -> bool:
        return self.nullable is not None and self.nullable[0] <= version <= self.nullable[1]

    def tagged_in(self, version: int) -> bool:
        return self.tagged is not None and self.tagged[0] <= version <= self.tagged[1]

    def compact_in(self, version: int, flexible: bool) -> bool:
        """Whether its lengths are compact (varints) in ``version`` of a message that is
        ``flexible`` there."""
        return flexible and self.flexible is not None and self.flexible[0] <= version <= self.flexible[1]


@dataclass(frozen=True, slots=True, eq=False)
class Schema:
    """A request, a response or a struct inside one: its class, its fields (one per
    attribute of ``cls``, in order) and, for a message, its first flexible version and
    the versions kprod implements."""

    cls: type
    fields: tuple[Field, ...]
    flexible_from: int = _MAX
    versions: tuple[int, int] = (0, _MAX)  # for a message, the versions it may be read or written in

    def field(self, name: str) -> Field:
        """The field ``name`` (KeyError naming the class if there is none)."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.cls.__name__} has no field {name!r}")

    def struct(self, name: str) -> Schema:
        """The schema of the struct (or array of structs) field ``name``."""
        found = self.field(name).schema
        if found is None:
            raise KeyError(f"{self.cls.__name__}.{name} is no struct")
        return found


# The fixed-width numbers: one table for both directions.
_NUMBERS: dict[str, struct.Struct] = {
    "int8": p.INT8, "int16": p.INT16, "uint16": p.UINT16, "int32": p.INT32, "uint32": p.UINT32,
    "int64": p.INT64, "float64": p.FLOAT64,
}

Writer = Callable[[list[Buffer], Any], None]
ReadFn = Callable[[p.Reader], Any]


def _fresh(default: Any) -> Callable[[], Any] | None:
    """A factory for a default that must not be shared between objects (lists, structs)."""
    if isinstance(default, list):
        return list
    if hasattr(default, "__dataclass_fields__"):
        return type(default)
    return None


@dataclass(frozen=True, slots=True)
class _Plan:
    """One struct at one version: how to read and write it."""

    cls: type
    defaults: list[Any]  # every attribute's default, in the class's order
    fresh: tuple[tuple[int, Callable[[], Any]], ...]  # defaults made anew per object
    readers: tuple[tuple[int, ReadFn], ...]  # (attribute index, reader) in wire order
    writers: tuple[tuple[str, Writer], ...]  # (attribute name, writer) in wire order
    tagged_readers: dict[int, tuple[int, ReadFn]]  # tag -> (attribute index, reader)
    tagged_writers: tuple[tuple[int, str, Any, Writer], ...]  # (tag, name, default, writer) by tag
    flexible: bool
    # Fields this version lacks that may not be dropped unless at their default: (name,
    # default, first version, last version).
    unwritable: tuple[tuple[str, Any, int, int], ...]
    where: str  # the message and the path to this struct, for errors
    version: int


_PLANS: dict[tuple[int, int, bool], _Plan] = {}


def _plan(schema: Schema, version: int, flexible: bool, where: str = "") -> _Plan:
    # Keyed by identity: schemas are module constants, and hashing their fields on every
    # struct of every message would cost more than the decoding. (A struct's schema is
    # inside one message's: ``where`` is the same each time it is planned.)
    key = (id(schema), version, flexible)
    found = _PLANS.get(key)
    if found is None:
        if not schema.versions[0] <= version <= schema.versions[1]:
            raise ValueError(f"{schema.cls.__name__} v{version}: kprod speaks "
                             f"v{schema.versions[0]}-v{schema.versions[1]}")
        found = _PLANS[key] = _make_plan(schema, version, flexible, where or schema.cls.__name__)
    return found


def _make_plan(schema: Schema, version: int, flexible: bool, where: str) -> _Plan:
    defaults = [f.default for f in schema.fields]
    readers: list[tuple[int, ReadFn]] = []
    writers: list[tuple[str, Writer]] = []
    tagged_readers: dict[int, tuple[int, ReadFn]] = {}
    tagged_writers: list[tuple[int, str, Any, Writer]] = []
    for i, f in enumerate(schema.fields):
        if not f.in_version(version):
            continue
        read = _reader(f, f.type, version, flexible, where)
        write = _writer(f, f.type, version, flexible, where)
        if flexible and f.tagged_in(version):
            assert f.tag is not None  # tagged_in says the field has one
            tagged_readers[f.tag] = (i, read)
            tagged_writers.append((f.tag, f.name, f.default, write))
        else:
            readers.append((i, read))
            writers.append((f.name, write))
    tagged_writers.sort(key=lambda t: t[0])
    on_wire = {i for i, _ in readers}
    fresh = tuple((i, factory) for i, f in enumerate(schema.fields)
                  if i not in on_wire and (factory := _fresh(f.default)) is not None)
    unwritable = tuple((f.name, f.default, f.min_version, f.max_version) for f in schema.fields
                       if not f.in_version(version) and not f.ignorable)
    return _Plan(schema.cls, defaults, fresh, tuple(readers), tuple(writers), tagged_readers,
                 tuple(tagged_writers), flexible, unwritable, where, version)


def _not_null(field: Field, version: int) -> None:
    raise ValueError(f"{field.name} may not be null in version {version}")


def _writer(field: Field, type_: str, version: int, flexible: bool, where: str) -> Writer:
    """The function appending one value of ``field`` (of ``type_``, in the struct at
    ``where``) to the output."""
    nullable = field.nullable_in(version)
    compact = field.compact_in(version, flexible)
    number = _NUMBERS.get(type_)
    if number is not None:
        pack = number.pack
        return lambda out, v: out.append(pack(v))
    if type_ == "bool":
        return lambda out, v: out.append(b"\x01" if v else b"\x00")
    if type_ == "uuid":
        return lambda out, v: out.append(v.bytes if v is not None else bytes(16))
    if type_ == "string":
        write_string = p.write_compact_string if compact else p.write_string

        def string(out: list[Buffer], v: str | None) -> None:
            if v is None and not nullable:
                _not_null(field, version)
            out.append(write_string(v))
        return string
    if type_ in ("bytes", "records"):
        def bytes_(out: list[Buffer], v: Records | None) -> None:
            if v is None:
                if not nullable:
                    _not_null(field, version)
                out.append(b"\x00" if compact else b"\xff\xff\xff\xff")
                return
            pieces = (v,) if isinstance(v, (bytes, bytearray, memoryview)) else v
            size = sum(map(len, pieces))
            out.append(p.write_uvarint(size + 1) if compact else p.INT32.pack(size))
            out.extend(pieces)
        return bytes_
    if type_ == "struct":
        assert field.schema is not None
        plan = _plan(field.schema, version, flexible, f"{where}.{field.name}")
        return lambda out, v: _encode_struct(out, plan, v)
    if type_.startswith("[]"):
        item_type = type_[2:]
        if item_type == "struct":
            assert field.schema is not None
            plan = _plan(field.schema, version, flexible, f"{where}.{field.name}[]")

            def write_item(out: list[Buffer], item: Any) -> None:
                _encode_struct(out, plan, item)
        else:  # a primitive's writer, of the same signature
            write_item = _writer(field, item_type, version, flexible, where)  # type: ignore[assignment]

        def array(out: list[Buffer], v: list | None) -> None:
            if v is None:
                if not nullable:
                    _not_null(field, version)
                out.append(b"\x00" if flexible else b"\xff\xff\xff\xff")
                return
            out.append(p.write_uvarint(len(v) + 1) if flexible else p.INT32.pack(len(v)))
            for item in v:
                write_item(out, item)
        return array
    raise TypeError(f"unknown schema type {type_!r} for field {field.name}")


def _reader(field: Field, type_: str, version: int, flexible: bool, where: str) -> ReadFn:
    """The function reading one value of ``field`` (of ``type_``, in the struct at ``where``)."""
    number = _NUMBERS.get(type_)
    if number is not None:
        return partial(p.Reader.fixed, s=number)
    compact = field.compact_in(version, flexible)
    simple = {"bool": p.Reader.boolean, "uuid": p.Reader.uuid,
              "string": p.Reader.compact_string if compact else p.Reader.string,
              "bytes": p.Reader.compact_bytes if compact else p.Reader.bytes_}.get(type_)
    if simple is not None:
        return simple
    if type_ == "records":
        return p.Reader.compact_bytes if compact else p.Reader.bytes_
    if type_ == "struct":
        assert field.schema is not None
        plan = _plan(field.schema, version, flexible, f"{where}.{field.name}")
        return lambda r: _decode_struct(r, plan)
    if type_.startswith("[]"):
        item_type = type_[2:]
        if item_type == "struct":
            assert field.schema is not None
            plan = _plan(field.schema, version, flexible, f"{where}.{field.name}[]")

            def read_item(r: p.Reader) -> Any:
                return _decode_struct(r, plan)
        else:
            read_item = _reader(field, item_type, version, flexible, where)  # type: ignore[assignment]

        nullable = field.nullable_in(version)

        def array(r: p.Reader) -> list | None:
            n = r.uvarint() - 1 if flexible else r.int32()
            if n < 0:
                if not nullable:
                    raise CorruptRecordError(f"{field.name} is null, which version {version} does not allow")
                return None
            if n > r.end - r.pos:  # every item takes a byte at least
                raise CorruptRecordError(f"{field.name}: {n} items in {r.end - r.pos} bytes")
            return [read_item(r) for _ in range(n)]
        return array
    raise TypeError(f"unknown schema type {type_!r} for field {field.name}")


def encode(schema: Schema, version: int, value: Any) -> bytes:
    """Encode ``value`` (an instance of ``schema.cls``) as the body of ``schema`` at ``version``."""
    out: list[Buffer] = []
    _encode_struct(out, _plan(schema, version, version >= schema.flexible_from), value)
    return b"".join(out)


def _encode_struct(out: list[Buffer], plan: _Plan, value: Any) -> None:
    for name, default, low, high in plan.unwritable:
        if getattr(value, name) != default:
            raise UnsupportedVersionError(
                f"{plan.where}.{name} is set ({getattr(value, name)!r}, not its default {default!r}), but version "
                f"{plan.version} has no such field (it is in v{low}-v{high}): the value would be lost")
    for name, write in plan.writers:
        write(out, getattr(value, name))
    if plan.flexible:
        tagged = [(tag, v, write) for tag, name, default, write in plan.tagged_writers
                  if (v := getattr(value, name)) != default]
        out.append(p.write_uvarint(len(tagged)))
        for tag, v, write in tagged:
            field_out: list[Buffer] = []
            write(field_out, v)
            data = b"".join(field_out)
            out.append(p.write_uvarint(tag))
            out.append(p.write_uvarint(len(data)))
            out.append(data)


def decode(schema: Schema, version: int, data: bytes | memoryview | p.Reader) -> Any:
    """Decode a body of ``schema`` at ``version`` into an instance of ``schema.cls``."""
    reader = data if isinstance(data, p.Reader) else p.Reader(data)
    return _decode_struct(reader, _plan(schema, version, version >= schema.flexible_from))


def _decode_struct(reader: p.Reader, plan: _Plan) -> Any:
    values = plan.defaults.copy()
    for i, factory in plan.fresh:
        values[i] = factory()
    for i, read in plan.readers:
        values[i] = read(reader)
    if plan.flexible:
        _read_tagged(reader, plan, values)
    return plan.cls(*values)


def _read_tagged(reader: p.Reader, plan: _Plan, values: list[Any]) -> None:
    """A tagged-field section into ``values``; unknown tags are skipped."""
    for _ in range(reader.uvarint()):
        tag = reader.uvarint()
        size = reader.uvarint()
        end = reader.pos + size
        if end > reader.end:
            raise CorruptRecordError(f"tagged field {tag} of {size} bytes past the end of the message")
        known = plan.tagged_readers.get(tag)
        if known is not None:
            values[known[0]] = known[1](p.Reader(reader.buf, reader.pos, end))
        reader.pos = end


def read_tagged_into(reader: p.Reader, schema: Schema, version: int, value: Any) -> None:
    """Read a tagged-field section of ``schema`` at ``version`` into the attributes of
    ``value`` (for the hand-written Produce decoder, which reads the rest itself)."""
    plan = _plan(schema, version, True)
    values = [getattr(value, f.name) for f in schema.fields]
    _read_tagged(reader, plan, values)
    for f, v in zip(schema.fields, values, strict=True):
        setattr(value, f.name, v)
