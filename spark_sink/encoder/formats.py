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

__all__ = ["AvroEncoder", "FormatSchemaError", "FormatValueError", "JsonEncoder", "RefusedValues", "WireBudget",
           "WireBudgetExceeded", "avro_schema_for", "json_schema_for"]


class FormatSchemaError(KProdError, TypeError):
    """A column's Arrow type does not fit the value format's schema (or has no mapping to
    one); the message names the column path and what the schema expects there.

    A TypeError as kprod's ColumnError is (the encoder's room cannot import the client's
    errors): ``except TypeError`` catches both."""


class FormatValueError(KProdError, ValueError):
    """A row's value the schema cannot carry (a null where the schema has none, a decimal
    beyond its precision, NaN in JSON); the message names the column path and the row
    (``row``: its index in the column encoded; None in a refused rows' group's error)."""

    def __init__(self, path: str, what: str, row: int | None = None) -> None:
        self.path, self.what, self.row = path, what, row
        super().__init__(f"column {path}" + ("" if row is None else f", row {row}") + f": {what}")

    def __reduce__(self) -> tuple[type, tuple[str, str, int | None]]:
        return type(self), (self.path, self.what, self.row)

    def counted_from(self, first: int) -> FormatValueError:
        """This error with its row counted from ``first`` (the encoded column a slice
        starting at that row)."""
        return FormatValueError(self.path, self.what, None if self.row is None else first + self.row)


class WireBudget:
    """The wire bytes an encoding may still make (shared by the columns and chunks of one
    slice): an encoder stops at the first row past it, after at least one row."""

    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes


class WireBudgetExceeded(Exception):
    """An encoding stopped at its budget: the first ``rows`` rows of the column it was
    given fit (at least one, and fewer than it was given)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        super().__init__(f"the wire budget ends after {rows} row(s)")


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


# The loop's error kinds, by their number in _formats.c's enum.
_ERROR_NAMES = ("", "null", "fixed_size", "precision", "not_finite", "year", "memory", "budget")

# Rows a format refused: (their indices in the column, ascending; the error naming the
# column path and what the schema expects there), one entry per column path and reason.
RefusedValues = list[tuple[np.ndarray, FormatValueError]]


def _run(plan: _Plan, arrow_type: pa.DataType, column: str, array: pa.Array | pa.ChunkedArray, prefix: bytes,
         json_text: bool, refused: RefusedValues | None = None, budget: WireBudget | None = None,
         selected: np.ndarray | None = None) -> pa.Array:
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
        valid = None  # the rows to encode, where not every row
        if selected is not None:
            valid = selected[base:base + len(chunk)]
            if chunk.null_count:
                valid = valid & pc.is_valid(chunk).to_numpy(zero_copy_only=False)
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        else:
            validity = pc.is_valid(chunk).buffers()[1] if chunk.null_count else None
        try:
            data, ends, *skipped = _compiled().encode(nodes, np.asarray(children, np.int32), len(chunk), validity,
                                                      0, prefix, json_text, refused is not None,
                                                      -1 if budget is None else max(0, budget.left))
        except ValueError as exc:
            if len(exc.args) != 4:
                raise
            error, node, row, detail = exc.args
            if error == "budget":
                raise WireBudgetExceeded(base + row) from None
            raise FormatValueError(paths[node].path, _value_error(error, paths[node], detail), base + row) from None
        if skipped and skipped[0]:
            assert refused is not None
            validity = _refuse_rows(chunk, valid, np.frombuffer(skipped[0], np.int64).reshape(-1, 4), paths, base,
                                    refused)
        if budget is not None:
            budget.left -= len(data)
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


def _refuse_rows(chunk: pa.Array, valid: np.ndarray | None, found: np.ndarray, paths: list[_Plan], base: int,
                 refused: RefusedValues) -> pa.Buffer:
    """Group the loop's refused rows (row, error, node, detail) of ``chunk`` (its first
    row ``base`` of the column) by reason into ``refused``; the validity of the rows
    encoded (``valid``, or the chunk's) with them cleared (the loop left them empty)."""
    keys = found[:, 1:]
    reasons, which = np.unique(keys, axis=0, return_inverse=True)
    for k, (error, node, detail) in enumerate(reasons.tolist()):
        rows = found[which.reshape(-1) == k, 0] + base
        refused.append((rows, FormatValueError(paths[node].path, _value_error(_ERROR_NAMES[error], paths[node], detail))))
    valid = (pc.is_valid(chunk).to_numpy(zero_copy_only=False) if valid is None else valid).copy()
    valid[found[:, 0]] = False
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _value_error(error: str, plan: _Plan, detail: int) -> str:
    """What the schema expects where ``plan`` refused a value."""
    if error == "null":
        return f"null, but the schema has no null there ({plan.expected})"
    if error == "fixed_size":
        return f"{detail} bytes, but the Avro schema's fixed type there takes {plan.param}"
    if error == "precision":
        return f"a decimal with more than the {plan.param2} digits of its precision"
    if error == "not_finite":
        return "NaN or an infinity, which JSON cannot carry"
    if error == "year":
        return f"a date in the year {detail}, which RFC 3339 (JSON's date formats) cannot carry"
    return error


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

    def encode(self, array: pa.Array | pa.ChunkedArray, prefix: bytes = b"", budget: WireBudget | None = None,
               selected: np.ndarray | None = None) -> pa.Array:
        """``prefix`` + the Avro body of each row (binary, large_binary past 2 GiB); a null
        row is null (a tombstone). Past ``budget``, WireBudgetExceeded. With ``selected``
        (a boolean per row), only those rows: the others are null."""
        return _run(self._plan, self.arrow_type, self.column, array, prefix, False, None, budget, selected)

    def encode_valid(self, array: pa.Array | pa.ChunkedArray, prefix: bytes = b"", budget: WireBudget | None = None,
                     selected: np.ndarray | None = None) -> tuple[pa.Array, RefusedValues]:
        """As ``encode``, but a row the schema cannot carry is null in the result and
        listed, by reason, in the second item instead of failing the call."""
        refused: RefusedValues = []
        return _run(self._plan, self.arrow_type, self.column, array, prefix, False, refused, budget,
                    selected), refused


# ---- JSON Schema ----------------------------------------------------------------------

_DRAFT_07 = "http://json-schema.org/draft-07/schema#"
# Kafka Connect's JSON Schema converter reads these to give integers and bytes their width.
_CONNECT_TYPES = {pa.int8(): "int8", pa.int16(): "int16", pa.int32(): "int32", pa.int64(): "int64",
                  pa.float32(): "float32", pa.float64(): "float64"}
_LOCAL_DATE_TIME = ("a date and time of day with no time zone (a Spark timestamp_ntz), as "
                    "2024-05-01T12:00:00.000000")


def json_schema_for(arrow_type: pa.DataType, nullable: bool = False, title: str | None = None,
                    column: str = "value") -> dict:
    """A JSON Schema (draft-07) for the JSON ``JsonEncoder`` writes from ``arrow_type``:
    structs as objects of every field (all required, nulls written as null), arrays,
    maps as objects, integers and numbers (decimals as numbers of their exact text),
    binaries as base64 strings, dates as strings of format "date", timestamps as strings
    of format "date-time" in UTC (a timestamp with no time zone: the same text without
    "Z"), a nullable type as ``oneOf`` null and the type."""
    body = _json_type(arrow_type, column)
    return {"$schema": _DRAFT_07, **({"title": title} if title else {}),
            **({"oneOf": [{"type": "null"}, body]} if nullable else body)}


def _json_type(t: pa.DataType, column: str) -> dict:
    def nullable(child: dict, is_nullable: bool) -> dict:
        return {"oneOf": [{"type": "null"}, child]} if is_nullable else child

    if pa.types.is_boolean(t):
        return {"type": "boolean"}
    if t in _CONNECT_TYPES:
        return {"type": "integer" if pa.types.is_integer(t) else "number", "connect.type": _CONNECT_TYPES[t]}
    if isinstance(t, pa.Decimal128Type):
        return {"type": "number"}
    if t in (pa.string(), pa.large_string()):
        return {"type": "string"}
    if t in (pa.binary(), pa.large_binary()):
        return {"type": "string", "contentEncoding": "base64", "connect.type": "bytes"}
    if t == pa.date32():
        return {"type": "string", "format": "date"}
    if pa.types.is_timestamp(t) and t.unit == "us":
        return {"type": "string", "format": "date-time"} if t.tz else {"type": "string",
                                                                        "description": _LOCAL_DATE_TIME}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {"type": "array", "items": nullable(_json_type(t.value_type, f"{column}.element"),
                                                   t.value_field.nullable)}
    if pa.types.is_map(t) and t.key_type in (pa.string(), pa.large_string()):
        return {"type": "object", "additionalProperties": nullable(_json_type(t.item_type, f"{column}.value"),
                                                                   t.item_field.nullable)}
    if pa.types.is_struct(t):
        return {"type": "object",
                "properties": {f.name: nullable(_json_type(f.type, f"{column}.{f.name}"), f.nullable) for f in t},
                "required": [f.name for f in t]}
    raise FormatSchemaError(f"column {column}: Arrow type {t} has no JSON Schema mapping (kprod's json format "
                            "takes what its avro format takes: booleans, integers, floats, strings, binaries, "
                            "decimals, dates, timestamps in microseconds, arrays, maps with string keys, structs)")


def _json_resolve(s: Any, root: Any, path: str) -> Any:
    seen = 0
    while isinstance(s, dict) and "$ref" in s:
        ref = s["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#") or seen > 32:
            raise FormatSchemaError(f"column {path}: the JSON schema's $ref {ref!r} is not a reference inside it")
        s, seen = root, seen + 1
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(s, dict) or part not in s:
                raise FormatSchemaError(f"column {path}: the JSON schema's $ref {ref!r} points nowhere")
            s = s[part]
    return s


def _json_plan(s: Any, t: pa.DataType, nullable: bool, path: str, root: Any) -> _Plan:
    s = _json_resolve(s, root, path)
    if s is True or s == {} or (isinstance(s, dict) and not {"type", "oneOf", "anyOf"} & s.keys()):
        s = _json_type(t, path)  # any value: the derived schema's
        if nullable:
            s = {"oneOf": [{"type": "null"}, s]}
    if not isinstance(s, dict):
        raise FormatSchemaError(f"column {path}: the JSON schema there is {_describe(s)}, which refuses every value")
    allows_null = False
    branches = s.get("oneOf") or s.get("anyOf")
    if branches is not None:
        branches = [_json_resolve(b, root, path) for b in branches]
        others = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "null")]
        if len(others) != 1:
            raise FormatSchemaError(f"column {path}: the JSON schema has {_describe(s)} there; kprod writes a "
                                    "type, or one type or null")
        allows_null = len(others) < len(branches)
        s = _json_resolve(others[0], root, path)
        if s is True or s == {}:
            s = _json_type(t, path)
    types = s.get("type")
    types = set(types) if isinstance(types, list) else {types}
    allows_null = allows_null or "null" in types
    if nullable and not allows_null:
        raise FormatSchemaError(f"column {path} is nullable, but the JSON schema's {_describe(s)} there allows no "
                                "null: make the column non-nullable (or fill its nulls), or allow null there")
    plan = _Plan(-1, NULL_FIRST if allows_null else NULL_REFUSED, path, _describe(s))

    def fits(*names: str) -> bool:
        return bool(types & set(names))

    if pa.types.is_boolean(t) and fits("boolean"):
        plan.kind = K_BOOL
    elif t in (pa.int8(), pa.int16(), pa.int32(), pa.int64()) and fits("integer", "number"):
        plan.kind = {pa.int8(): K_INT8, pa.int16(): K_INT16, pa.int32(): K_INT32}.get(t, K_INT64)
    elif t in (pa.float32(), pa.float64()) and fits("number"):
        plan.kind = K_FLOAT32 if t == pa.float32() else K_FLOAT64
    elif isinstance(t, pa.Decimal128Type) and fits("number"):
        plan.kind, plan.param = K_DEC_BYTES, t.scale
    elif t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()) and fits("string"):
        plan.kind, plan.param = _bytes_kind(t), int(t in (pa.binary(), pa.large_binary()))
    elif t == pa.date32() and fits("string"):
        plan.kind = K_DATE32
    elif pa.types.is_timestamp(t) and t.unit == "us" and fits("string"):
        plan.kind, plan.param2 = K_TIMESTAMP, int(t.tz is not None)
    elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and fits("array"):
        plan.kind = K_LIST64 if pa.types.is_large_list(t) else K_LIST32
        plan.children = [(0, _json_plan(s.get("items", {}), t.value_type, t.value_field.nullable,
                                        f"{path}.element", root))]
    elif pa.types.is_map(t) and t.key_type in (pa.string(), pa.large_string()) and fits("object"):
        values = s.get("additionalProperties", {})
        if values is False:
            raise FormatSchemaError(f"column {path}: a map, but the JSON schema's object there takes no "
                                    "properties beyond those it names (additionalProperties: false)")
        plan.kind = K_MAP
        plan.children = [(0, _Plan(_bytes_kind(t.key_type), NULL_REFUSED, f"{path}.key", "string")),
                         (1, _json_plan(values, t.item_type, t.item_field.nullable, f"{path}.value", root))]
    elif pa.types.is_struct(t) and fits("object"):
        plan.kind = K_STRUCT
        properties = s.get("properties", {})
        for i, f in enumerate(t):
            child = properties.get(f.name)
            if child is None:
                child = s.get("additionalProperties", {})
                if child is False:
                    raise FormatSchemaError(f"column {path}.{f.name} is not among the JSON schema's properties "
                                            f"there ({', '.join(properties)}), which takes no others")
            name = json.dumps(f.name, ensure_ascii=False).encode() + b":"
            plan.children.append((-1, _Plan(K_CONST, NULL_REFUSED, f"{path}.{f.name}",
                                            const=(b"," if i else b"") + name)))
            plan.children.append((i, _json_plan(child, f.type, f.nullable, f"{path}.{f.name}", root)))
        missing = [name for name in s.get("required", ()) if name not in t.names]
        if missing:
            raise FormatSchemaError(f"column {path}.{missing[0]} is missing: the JSON schema requires it")
    else:
        raise FormatSchemaError(f"column {path}: Arrow type {t} does not fit the JSON schema's {_describe(s)} there")
    return plan


class JsonEncoder:
    """An Arrow column into JSON texts (UTF-8), one per row: objects with the fields in
    the column's order, every field written (null as null). ``schema``: a JSON Schema
    (text or data) the rows must fit, or None for ``json_schema_for(arrow_type)``;
    checked against ``arrow_type`` here."""

    def __init__(self, schema: Mapping | str | None, arrow_type: pa.DataType, column: str = "value") -> None:
        _compiled()
        self.schema = _load(schema) if schema is not None else json_schema_for(arrow_type, column=column)
        self.arrow_type = arrow_type
        self.column = column
        self._plan = _json_plan(self.schema, arrow_type, False, column, self.schema)

    def encode(self, array: pa.Array | pa.ChunkedArray, prefix: bytes = b"", budget: WireBudget | None = None,
               selected: np.ndarray | None = None) -> pa.Array:
        """``prefix`` + the JSON text of each row; a null row is null (a tombstone). NaN
        and infinities, which JSON has no numbers for, are refused naming the row. Past
        ``budget``, WireBudgetExceeded. With ``selected`` (a boolean per row), only those
        rows: the others are null."""
        return _run(self._plan, self.arrow_type, self.column, array, prefix, True, None, budget, selected)

    def encode_valid(self, array: pa.Array | pa.ChunkedArray, prefix: bytes = b"", budget: WireBudget | None = None,
                     selected: np.ndarray | None = None) -> tuple[pa.Array, RefusedValues]:
        """As ``encode``, but a row the schema cannot carry is null in the result and
        listed, by reason, in the second item instead of failing the call."""
        refused: RefusedValues = []
        return _run(self._plan, self.arrow_type, self.column, array, prefix, True, refused, budget,
                    selected), refused
