"""Value formats: an Arrow column (a struct, as a DataFrame's ``value``) into one Avro
binary body, or one JSON text, per row, in compiled loops over Arrow's buffers (the C
extension ``_formats``).

The schema is derived from the Arrow type as Spark's ``to_avro`` derives it
(``avro_schema_for``: SchemaConverters.toAvroType), or given; either way the column's
type is checked against it once, when the encoder is made, and every error names the
column path (``value.address.zip``). ``encode`` then runs without a Python object per
row. The Avro bodies are byte for byte what Spark's ``to_avro`` writes for the same rows
and schema (tests/encoder/test_formats.py checks them against Spark's own)."""

from __future__ import annotations

import functools
import importlib
import json
import struct as _struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_sink.protocol.error_codes import KProdError

__all__ = ["AvroEncoder", "FormatSchemaError", "FormatValueError", "JsonEncoder", "avro_schema_for",
           "json_schema_for"]


class FormatSchemaError(KProdError, TypeError):
    """A column's Arrow type does not fit the value format's schema (or has no mapping to
    one); the message names the column path and what the schema expects there.

    A TypeError as kprod's ColumnError is (the encoder's room cannot import the client's
    errors): ``except TypeError`` catches both."""


class FormatValueError(KProdError, ValueError):
    """A row's value the schema cannot carry (a null where the schema has none, a decimal
    beyond its precision, NaN in JSON); the message names the column path and the row."""


@functools.cache
def _compiled() -> ModuleType:
    try:
        return importlib.import_module("spark_sink.encoder._formats")
    except ImportError as exc:
        raise ImportError("kprod's value formats (avro, json) need kprod's compiled encoder, which is not "
                          "built here (kprod runs from its source files, as from a --py-files zip): install "
                          "kprod's wheel, or `pip install .` from its source with a C compiler") from exc


# Node kinds and null modes: spark_sink/encoder/_formats.c's enums.
(K_CONST, K_BOOL, K_INT8, K_INT16, K_INT32, K_INT64, K_FLOAT32, K_FLOAT64, K_BYTES32, K_BYTES64, K_DEC_FIXED,
 K_DEC_BYTES, K_LIST32, K_LIST64, K_MAP, K_STRUCT, K_DATE32, K_TIMESTAMP) = range(18)
NULL_REFUSED, NULL_FIRST, NULL_SECOND = range(3)
_INT_KINDS = {pa.int8(): K_INT8, pa.int16(): K_INT16, pa.int32(): K_INT32, pa.date32(): K_INT32}


# ---- Avro schemas ---------------------------------------------------------------------

def _min_bytes_for_precision(precision: int) -> int:
    """The fixed size Spark gives a decimal of this precision (its minBytesForPrecision)."""
    size = 1
    while 2 ** (8 * size - 1) < 10 ** precision:
        size += 1
    return size


def _fixed_name(record_name: str, namespace: str) -> tuple[str, str]:
    """(name, namespace) of the fixed type Spark names "<namespace>.<record>.fixed"."""
    full = f"{namespace}.{record_name}.fixed" if namespace else f"{record_name}.fixed"
    space, _, name = full.rpartition(".")
    return name, space


def avro_schema_for(arrow_type: pa.DataType, nullable: bool = False, record_name: str = "topLevelRecord",
                    namespace: str = "", column: str = "value") -> Any:
    """The Avro schema (as JSON data) Spark's ``SchemaConverters.toAvroType`` gives the
    Spark type behind ``arrow_type``: nested records named after their field, in the
    namespace of the records around them; decimals as named fixed types; a nullable type
    as the union ``[type, "null"]``. ``column`` names the column in errors."""
    t = arrow_type
    schema: Any
    if pa.types.is_boolean(t):
        schema = "boolean"
    elif t in (pa.int8(), pa.int16(), pa.int32()):
        schema = "int"
    elif t == pa.int64():
        schema = "long"
    elif t == pa.float32():
        schema = "float"
    elif t == pa.float64():
        schema = "double"
    elif t in (pa.string(), pa.large_string()):
        schema = "string"
    elif t in (pa.binary(), pa.large_binary()):
        schema = "bytes"
    elif t == pa.date32():
        schema = {"type": "int", "logicalType": "date"}
    elif pa.types.is_timestamp(t) and t.unit == "us":
        schema = {"type": "long", "logicalType": "timestamp-micros" if t.tz else "local-timestamp-micros"}
    elif isinstance(t, pa.Decimal128Type):
        name, space = _fixed_name(record_name, namespace)
        schema = {"type": "fixed", "name": name, "namespace": space, "size": _min_bytes_for_precision(t.precision),
                  "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        schema = {"type": "array", "items": avro_schema_for(t.value_type, t.value_field.nullable, record_name,
                                                            namespace, f"{column}.element")}
    elif pa.types.is_map(t):
        if t.key_type not in (pa.string(), pa.large_string()):
            raise FormatSchemaError(f"column {column}: a map with {t.key_type} keys has no Avro mapping (Avro "
                                    "maps, as Spark's to_avro, take string keys only)")
        schema = {"type": "map", "values": avro_schema_for(t.item_type, t.item_field.nullable, record_name,
                                                           namespace, f"{column}.value")}
    elif pa.types.is_struct(t):
        child_namespace = f"{namespace}.{record_name}" if namespace else record_name
        schema = {"type": "record", "name": record_name}
        if namespace:
            schema["namespace"] = namespace
        schema["fields"] = [{"name": f.name, "type": avro_schema_for(f.type, f.nullable, f.name, child_namespace,
                                                                     f"{column}.{f.name}")} for f in t]
    else:
        raise FormatSchemaError(
            f"column {column}: Arrow type {t} has no Avro mapping (Spark's to_avro maps boolean, byte, short, "
            "int, long, float, double, string, binary, decimal, date, timestamp and timestamp_ntz (micros), "
            "arrays, maps with string keys and structs)")
    return [schema, "null"] if nullable else schema


_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class _Names:
    """An Avro schema's named types (records, fixed, enums) by full name, to resolve
    references ("topLevelRecord.price.fixed", or a name in the enclosing namespace)."""

    def __init__(self, schema: Any) -> None:
        self.types: dict[str, dict] = {}
        self._walk(schema, "")

    def _walk(self, s: Any, space: str) -> None:
        if isinstance(s, list):
            for branch in s:
                self._walk(branch, space)
        elif isinstance(s, dict):
            kind = s.get("type")
            if kind in ("record", "error", "fixed", "enum"):
                full = self.full_name(s, space)
                self.types[full] = s
                space = full.rpartition(".")[0]
                for f in s.get("fields", ()) if kind != "fixed" and kind != "enum" else ():
                    self._walk(f.get("type"), space)
            elif kind == "array":
                self._walk(s.get("items"), space)
            elif kind == "map":
                self._walk(s.get("values"), space)
            elif isinstance(kind, (dict, list)):
                self._walk(kind, space)

    @staticmethod
    def full_name(s: dict, space: str) -> str:
        name = str(s.get("name", ""))
        if "." in name:
            return name
        space = s.get("namespace", space) or ""
        return f"{space}.{name}" if space else name

    def resolve(self, s: Any, space: str) -> tuple[Any, str]:
        """``s`` with a reference replaced by its definition, and the namespace names in it
        are resolved in."""
        while True:
            if isinstance(s, str) and s not in _PRIMITIVES:
                found = self.types.get(f"{space}.{s}" if space and "." not in s else s) or self.types.get(s)
                if found is None:
                    raise FormatSchemaError(f"the Avro schema names a type {s!r} it does not define")
                s = found
            elif isinstance(s, dict) and isinstance(s.get("type"), (dict, list)) and "fields" not in s:
                s = s["type"]
            elif isinstance(s, dict) and s.get("type") in _PRIMITIVES | self.types.keys() and len(s) == 1:
                s = s["type"]
            else:
                break
        if isinstance(s, dict) and s.get("type") in ("record", "error", "fixed", "enum"):
            space = self.full_name(s, space).rpartition(".")[0]
        return s, space


def _avro_type(s: Any) -> str:
    if isinstance(s, list):
        return "union"
    return s if isinstance(s, str) else str(s.get("type"))


def _describe(s: Any) -> str:
    return json.dumps(s, separators=(",", ":"))[:200]


def _zigzag(value: int) -> bytes:
    u = (value << 1) ^ (value >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _encode_default(s: Any, value: Any, names: _Names, space: str, column: str) -> bytes:
    """A field's JSON default as Avro binary (Avro's rules: a union's default is of its
    first branch; bytes and fixed defaults are strings of code points 0-255)."""
    s, space = names.resolve(s, space)
    kind = _avro_type(s)
    try:
        if kind == "union":
            return _zigzag(0) + _encode_default(s[0], value, names, space, column)
        if kind == "null":
            return b""
        if kind == "boolean":
            return b"\x01" if value else b"\x00"
        if kind in ("int", "long"):
            return _zigzag(int(value))
        if kind == "float":
            return _struct.pack("<f", value)
        if kind == "double":
            return _struct.pack("<d", value)
        if kind in ("string", "bytes"):
            data = value.encode() if kind == "string" else value.encode("latin-1")
            return _zigzag(len(data)) + data
        if kind == "fixed":
            return value.encode("latin-1")
        if kind == "enum":
            return _zigzag(s["symbols"].index(value))
        if kind == "array":
            items = b"".join(_encode_default(s["items"], v, names, space, column) for v in value)
            return (_zigzag(len(value)) + items if value else b"") + b"\x00"
        if kind == "map":
            entries = b"".join(_zigzag(len(k.encode())) + k.encode()
                               + _encode_default(s["values"], v, names, space, column) for k, v in value.items())
            return (_zigzag(len(value)) + entries if value else b"") + b"\x00"
        if kind == "record":
            return b"".join(_encode_default(f["type"], value.get(f["name"], f.get("default")), names, space,
                                            f"{column}.{f['name']}") for f in s["fields"])
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise FormatSchemaError(f"column {column}: the Avro schema's default {value!r} does not fit its type "
                                f"{_describe(s)}: {exc}") from exc
    raise FormatSchemaError(f"column {column}: the Avro schema's type {_describe(s)} is not supported")


# ---- plans: the schema matched to the Arrow type, once per encoder ---------------------

@dataclass
class _Plan:
    """One node of the compiled loop's table, before it meets an array's buffers."""

    kind: int
    nulls: int
    path: str
    expected: str = ""
    param: int = 0
    param2: int = 0
    const: bytes = b""
    # (index of the Arrow child, or -1 for a constant, plan)
    children: list[tuple[int, _Plan]] = field(default_factory=list)


def _bytes_kind(t: pa.DataType) -> int:
    return K_BYTES64 if t in (pa.large_string(), pa.large_binary()) else K_BYTES32


def _avro_plan(s: Any, t: pa.DataType, nullable: bool, path: str, names: _Names, space: str) -> _Plan:
    s, space = names.resolve(s, space)
    nulls = NULL_REFUSED
    if isinstance(s, list):
        others = [b for b in s if names.resolve(b, space)[0] != "null"]
        if len(others) != 1 or len(s) > 2:
            raise FormatSchemaError(f"column {path}: the Avro schema has the union {_describe(s)} there; kprod "
                                    "writes a type, or a union of one type with null")
        if len(s) == 2:
            nulls = NULL_FIRST if names.resolve(s[0], space)[0] == "null" else NULL_SECOND
        s, space = names.resolve(others[0], space)
    if nullable and nulls == NULL_REFUSED:
        raise FormatSchemaError(f"column {path} is nullable, but the Avro schema's {_describe(s)} there is not a "
                                "union with null: make the column non-nullable (or fill its nulls), or give the "
                                "field the type [..., \"null\"]")
    kind, logical = _avro_type(s), s.get("logicalType") if isinstance(s, dict) else None
    plan = _Plan(-1, nulls, path, _describe(s))

    def refuse(extra: str = "") -> FormatSchemaError:
        return FormatSchemaError(f"column {path}: Arrow type {t} does not fit the Avro schema's {_describe(s)} "
                                 f"there{extra}")

    if pa.types.is_boolean(t) and kind == "boolean":
        plan.kind = K_BOOL
    elif t in _INT_KINDS and kind == "int":
        plan.kind = _INT_KINDS[t]
    elif t == pa.int64() and kind == "long":
        plan.kind, plan.param = K_INT64, 1
    elif pa.types.is_timestamp(t) and kind == "long":
        # As Spark: micros as they are, millis (and a long with no logical type) floored.
        local = "local-" if t.tz is None else ""
        divisors = {f"{local}timestamp-micros": 1, f"{local}timestamp-millis": 1000, None: 1000}
        if t.unit != "us" or logical not in divisors:
            raise refuse(f" (a timestamp{'' if t.tz else ' without time zone'} in microseconds goes to long, "
                         f"{local}timestamp-micros or {local}timestamp-millis)")
        plan.kind, plan.param = K_INT64, divisors[logical]
    elif t == pa.float32() and kind == "float":
        plan.kind = K_FLOAT32
    elif t == pa.float64() and kind == "double":
        plan.kind = K_FLOAT64
    elif t in (pa.string(), pa.large_string()) and kind == "string":
        plan.kind, plan.param = _bytes_kind(t), -1
    elif t in (pa.binary(), pa.large_binary()) and kind in ("bytes", "fixed"):
        plan.kind, plan.param = _bytes_kind(t), s["size"] if kind == "fixed" else -1
    elif isinstance(t, pa.Decimal128Type) and kind in ("fixed", "bytes"):
        if logical != "decimal" or s.get("precision") != t.precision or s.get("scale", 0) != t.scale:
            raise refuse(f" (a decimal({t.precision},{t.scale}) goes to a decimal logical type of that precision "
                         "and scale)")
        if kind == "fixed" and s["size"] < _min_bytes_for_precision(t.precision):
            raise refuse(" (the fixed type is too small for the precision)")
        plan.kind, plan.param = (K_DEC_FIXED, s["size"]) if kind == "fixed" else (K_DEC_BYTES, 0)
        plan.param2 = t.precision
    elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and kind == "array":
        plan.kind = K_LIST64 if pa.types.is_large_list(t) else K_LIST32
        plan.children = [(0, _avro_plan(s["items"], t.value_type, t.value_field.nullable, f"{path}.element",
                                        names, space))]
    elif pa.types.is_map(t) and kind == "map":
        if t.key_type not in (pa.string(), pa.large_string()):
            raise refuse(" (Avro maps take string keys only)")
        plan.kind = K_MAP
        plan.children = [(0, _Plan(_bytes_kind(t.key_type), NULL_REFUSED, f"{path}.key", "string", param=-1)),
                         (1, _avro_plan(s["values"], t.item_type, t.item_field.nullable, f"{path}.value",
                                        names, space))]
    elif pa.types.is_struct(t) and kind in ("record", "error"):
        plan.kind = K_STRUCT
        columns = {f.name: i for i, f in enumerate(t)}
        wanted = {f["name"] for f in s["fields"]}
        extra = [name for name in columns if name not in wanted]
        if extra:
            raise FormatSchemaError(f"column {path}.{extra[0]} is not in the Avro schema's record "
                                    f"{s.get('name')!r} (its fields: {', '.join(f['name'] for f in s['fields'])})")
        for f in s["fields"]:
            child = f"{path}.{f['name']}"
            if f["name"] in columns:
                i = columns[f["name"]]
                plan.children.append((i, _avro_plan(f["type"], t[i].type, t[i].nullable, child, names, space)))
                continue
            ftype, fspace = names.resolve(f["type"], space)
            if isinstance(ftype, list) and any(names.resolve(b, fspace)[0] == "null" for b in ftype):
                # As Spark: a nullable field the DataFrame lacks is written null.
                const = _zigzag([names.resolve(b, fspace)[0] for b in ftype].index("null"))
            elif "default" in f:
                const = _encode_default(f["type"], f["default"], names, space, child)
            else:
                raise FormatSchemaError(f"column {child} is missing: the Avro schema's record {s.get('name')!r} has "
                                        f"the field {f['name']!r} ({_describe(f['type'])}), neither nullable nor "
                                        "with a default")
            plan.children.append((-1, _Plan(K_CONST, NULL_REFUSED, child, const=const)))
    else:
        raise refuse()
    return plan


# ---- binding a plan to an array's buffers, and running it ------------------------------

def _bind(plan: _Plan, arr: pa.Array | None, nodes: list, children: list[int], paths: list[_Plan]) -> int:
    node = len(nodes)
    nodes.append(None)
    paths.append(plan)
    first = len(children)
    children.extend([0] * len(plan.children))
    if plan.kind == K_CONST or arr is None:
        nodes[node] = (K_CONST, 0, None, 0, plan.const, None, len(plan.const), 0, first, 0)
        return node
    buffers = arr.buffers()
    validity = buffers[0] if arr.null_count else None
    data = offsets = None
    if plan.kind in (K_BYTES32, K_BYTES64):
        offsets, data = buffers[1], buffers[2]
    elif plan.kind in (K_LIST32, K_LIST64, K_MAP):
        offsets = buffers[1]
    elif plan.kind != K_STRUCT:
        data = buffers[1]
    kids: list[pa.Array | None]
    if plan.kind == K_MAP:
        entries = arr.values
        kids = [entries.field(0), entries.field(1)]
    elif plan.kind in (K_LIST32, K_LIST64):
        kids = [arr.values]
    else:
        kids = [arr.field(i) if i >= 0 else None for i, _ in plan.children]
    for k, ((_, child), kid) in enumerate(zip(plan.children, kids)):
        children[first + k] = _bind(child, kid, nodes, children, paths)
    nodes[node] = (plan.kind, plan.nulls, validity, arr.offset, data, offsets, plan.param, plan.param2, first,
                   len(plan.children))
    return node


def _run(plan: _Plan, arrow_type: pa.DataType, column: str, array: pa.Array | pa.ChunkedArray, prefix: bytes,
         json_text: bool, describe_error: Any) -> pa.Array:
    if array.type != arrow_type:
        raise FormatSchemaError(f"column {column}: this encoder was made for Arrow type {arrow_type}, given "
                                f"{array.type}")
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    out, base = [], 0
    for chunk in chunks:
        nodes: list = []
        children: list[int] = []
        paths: list[_Plan] = []
        _bind(plan, chunk, nodes, children, paths)
        validity = pc.is_valid(chunk).buffers()[1] if chunk.null_count else None
        try:
            data, ends = _compiled().encode(nodes, np.asarray(children, np.int32), len(chunk), validity, 0,
                                            prefix, json_text)
        except ValueError as exc:
            if len(exc.args) != 4:
                raise
            error, node, row, detail = exc.args
            raise FormatValueError(describe_error(error, paths[node], base + row, detail)) from None
        offsets = np.frombuffer(ends, np.int64)
        if len(data) < 2 ** 31:
            out.append(pa.Array.from_buffers(pa.binary(), len(chunk), [validity, pa.py_buffer(
                offsets.astype(np.int32)), pa.py_buffer(data)]))
        else:
            out.append(pa.Array.from_buffers(pa.large_binary(), len(chunk), [validity, pa.py_buffer(offsets),
                                                                             pa.py_buffer(data)]))
        base += len(chunk)
    if len(out) == 1:
        return out[0]
    if not out:
        return pa.array([], pa.binary())
    if any(a.type == pa.large_binary() for a in out):
        out = [a.cast(pa.large_binary()) for a in out]
    return pa.concat_arrays(out)


def _value_error(error: str, plan: _Plan, row: int, detail: int) -> str:
    where = f"column {plan.path}, row {row}"
    if error == "null":
        return f"{where}: null, but the schema has no null there ({plan.expected})"
    if error == "fixed_size":
        return f"{where}: {detail} bytes, but the Avro schema's fixed type there takes {plan.param}"
    if error == "precision":
        return f"{where}: a decimal with more than the {plan.param2} digits of its precision"
    if error == "not_finite":
        return f"{where}: NaN or an infinity, which JSON cannot carry"
    if error == "year":
        return f"{where}: a date in the year {detail}, which RFC 3339 (JSON's date formats) cannot carry"
    return f"{where}: {error}"


def _load(schema: Mapping | str | list | None) -> Any:
    if isinstance(schema, str):
        try:
            return json.loads(schema)
        except json.JSONDecodeError:
            return schema  # a primitive's bare name, as "long"
    return schema


class AvroEncoder:
    """An Arrow column into Avro binary bodies, one per row, as Spark's ``to_avro``
    writes them. ``schema``: the writer's schema (JSON text or data), or None for
    ``avro_schema_for(arrow_type)``; checked against ``arrow_type`` here."""

    def __init__(self, schema: Mapping | str | None, arrow_type: pa.DataType, column: str = "value") -> None:
        _compiled()
        self.schema = _load(schema) if schema is not None else avro_schema_for(arrow_type, column=column)
        self.arrow_type = arrow_type
        self.column = column
        self._plan = _avro_plan(self.schema, arrow_type, False, column, _Names(self.schema), "")

    def encode(self, array: pa.Array | pa.ChunkedArray, prefix: bytes = b"") -> pa.Array:
        """``prefix`` + the Avro body of each row (binary, large_binary past 2 GiB); a null
        row is null (a tombstone)."""
        return _run(self._plan, self.arrow_type, self.column, array, prefix, False, _value_error)
