"""The value formats (spark_sink/encoder/formats.py): Avro bodies and JSON texts from Arrow
columns, read back by independent readers (fastavro's schemaless_reader; json.loads and
jsonschema) for random Arrow types and rows (nulls, nesting, slices, chunks), golden bytes
for the encodings Java's writer picks, and the schema checks' errors. The bodies against
Spark's own to_avro: tests/spark/test_formats_spark.py."""

from __future__ import annotations

import base64
import datetime
import decimal
import io
import json
import os
import pickle
import subprocess
import sys
from typing import Any

import fastavro
import jsonschema
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_sink.encoder.formats import (
    AvroEncoder,
    FormatSchemaError,
    FormatValueError,
    JsonEncoder,
    WireBudget,
    WireBudgetExceeded,
    avro_schema_for,
    json_schema_for,
)

# Random columns per round trip: a few dozen in the suite (each new run tries others);
# KPROD_SOAK=N (make soak) tries 10 N.
EXAMPLES = int(os.environ.get("KPROD_SOAK", "0")) * 10 or 40
UTC = datetime.UTC
EPOCH = datetime.datetime(1970, 1, 1)
LEAVES = [pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64(), pa.string(),
          pa.large_string(), pa.binary(), pa.large_binary(), pa.date32(), pa.timestamp("us", "UTC"),
          pa.timestamp("us")]


# ---- random Arrow types and rows -------------------------------------------------------

def _fields(inner: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[list[pa.Field]]:
    return st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=4).map(
        lambda kids: [pa.field(f"f{i}", t, nullable) for i, (t, nullable) in enumerate(kids)])


def _decimals() -> st.SearchStrategy[pa.DataType]:
    return st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: pa.decimal128(p, s)))


def _types(leaves: list[pa.DataType] = LEAVES) -> st.SearchStrategy[pa.DataType]:
    leaf = st.one_of(st.sampled_from(leaves), _decimals())
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(inner, st.booleans()).map(lambda a: pa.list_(pa.field("element", *a))),
        st.tuples(inner, st.booleans()).map(lambda a: pa.large_list(pa.field("element", *a))),
        st.tuples(inner, st.booleans()).map(lambda a: pa.map_(pa.string(), pa.field("value", *a))),
        _fields(inner).map(pa.struct)), max_leaves=8)


def _values(t: pa.DataType, nullable: bool, finite: bool = False) -> st.SearchStrategy[Any]:
    """Python values of Arrow type ``t`` (None among them where ``nullable``; no infinities
    where ``finite``): what Python type they are depends on ``t``."""
    values: st.SearchStrategy[Any]
    if pa.types.is_boolean(t):
        values = st.booleans()
    elif pa.types.is_integer(t):
        bits = t.bit_width
        values = st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    elif t == pa.float32():
        values = st.floats(width=32, allow_nan=False, allow_infinity=not finite)
    elif t == pa.float64():
        values = st.floats(allow_nan=False, allow_infinity=not finite)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        values = st.text(max_size=20)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        values = st.binary(max_size=20)
    elif t == pa.date32():
        values = st.dates()
    elif pa.types.is_timestamp(t):
        values = st.integers(-62135596800 * 10 ** 6, 253402300799 * 10 ** 6).map(
            lambda us: EPOCH + datetime.timedelta(microseconds=us)).map(
            lambda d: d.replace(tzinfo=UTC) if t.tz else d)
    elif isinstance(t, pa.Decimal128Type):
        limit = 10 ** t.precision - 1
        values = st.integers(-limit, limit).map(lambda n: _decimal(n, t.scale))
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        values = st.lists(_values(t.value_type, t.value_field.nullable, finite), max_size=4)
    elif pa.types.is_map(t):
        values = st.dictionaries(st.text(max_size=8), _values(t.item_type, t.item_field.nullable, finite),
                                 max_size=4).map(lambda d: list(d.items()))
    else:
        values = st.tuples(*(_values(f.type, f.nullable, finite) for f in t)).map(
            lambda vs: {f.name: v for f, v in zip(t, vs)})
    return st.one_of(st.none(), values) if nullable else values


def _decimal(unscaled: int, scale: int) -> decimal.Decimal:
    return decimal.Decimal(f"{unscaled}E-{scale}")  # exact: scaleb would round to 28 digits


@st.composite
def columns(draw: st.DrawFn, finite: bool = False) -> tuple[pa.DataType, pa.Array | pa.ChunkedArray, list[Any]]:
    """A struct column (a random type, nullable rows), as a sliced array or a chunked one,
    and its rows."""
    t = pa.struct(draw(_fields(_types())))
    rows = draw(st.lists(_values(t, True, finite), max_size=12))
    pad_before, pad_after = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    padding = draw(st.lists(_values(t, True, finite), min_size=pad_before + pad_after,
                            max_size=pad_before + pad_after))
    whole = pa.array(padding[:pad_before] + rows + padding[pad_before:], t)
    array = whole.slice(pad_before, len(rows))
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=2)))
    if cuts:
        bounds = [0, *cuts, len(rows)]
        array = pa.chunked_array([array.slice(a, b - a) for a, b in zip(bounds, bounds[1:])], t)
    return t, array, rows


def _expected(t: pa.DataType, value: Any) -> Any:
    """A row as the readers give it back: maps as dicts."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _expected(t.item_type, v) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_expected(t.value_type, v) for v in value]
    if pa.types.is_struct(t):
        return {f.name: _expected(f.type, value[f.name]) for f in t}
    if t == pa.float32():
        return pa.scalar(value, pa.float32()).as_py()
    return value


def _avro_rows(schema: Any, bodies: list[bytes | None], prefix: bytes = b"") -> list[Any]:
    parsed = fastavro.parse_schema(schema)
    out: list[Any] = []
    for body in bodies:
        if body is None:
            out.append(None)
            continue
        assert body.startswith(prefix)
        stream = io.BytesIO(body[len(prefix):])
        out.append(fastavro.schemaless_reader(stream, parsed, None))
        assert stream.read() == b"", "bytes left after the record"
    return out


# ---- Avro: random round trips ----------------------------------------------------------

@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(columns(), st.sampled_from([b"", b"\x00\x00\x00\x00\x07"]))
def test_avro_bodies_read_back_as_the_rows(column: tuple[pa.DataType, pa.Array | pa.ChunkedArray, list[Any]],
                                           prefix: bytes) -> None:
    t, array, rows = column
    schema = avro_schema_for(t)
    out = AvroEncoder(json.dumps(schema), t).encode(array, prefix)
    assert len(out) == len(rows)
    assert _avro_rows(schema, out.to_pylist(), prefix) == [_expected(t, row) for row in rows]


# ---- a budget of wire bytes ------------------------------------------------------------

def _stop_at_budget(array: pa.Array | pa.ChunkedArray, sizes: list[int], budget: int) -> int | None:
    """Where an encoding with ``budget`` stops (the rows that fit), None if it does not:
    in each chunk its first row goes, and a later row past what is left stops it."""
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    left, base = budget, 0
    for chunk in chunks:
        used = 0
        for i in range(len(chunk)):
            used += sizes[base + i]
            if i > 0 and used > max(0, left):
                return base + i
        left -= used
        base += len(chunk)
    return None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(columns(finite=True), st.sampled_from(["avro", "json"]), st.integers(0, 400))
def test_an_encoding_stops_at_its_budget_after_the_rows_that_fit(
        column: tuple[pa.DataType, pa.Array | pa.ChunkedArray, list[Any]], fmt: str, budget: int) -> None:
    """WireSlices' bound: past its budget an encoding raises WireBudgetExceeded with the
    rows that fit (at least one), or else it is the encoding without a budget, the budget
    spent by its bytes."""
    t, array, _ = column
    encoder = AvroEncoder(None, t) if fmt == "avro" else JsonEncoder(None, t)
    whole = encoder.encode(array, b"\x00\x00\x00\x00\x01")
    sizes = [len(v) if v is not None else 0 for v in whole.to_pylist()]
    stop = _stop_at_budget(array, sizes, budget)
    given_budget = WireBudget(budget)
    if stop is None:
        out = encoder.encode(array, b"\x00\x00\x00\x00\x01", given_budget)
        assert out.to_pylist() == whole.to_pylist()
        assert given_budget.left == budget - sum(sizes)
        return
    with pytest.raises(WireBudgetExceeded) as raised:
        encoder.encode(array, b"\x00\x00\x00\x00\x01", given_budget)
    assert raised.value.rows == stop >= 1


# ---- Avro: what Java's writer writes, byte for byte ------------------------------------

def _body(schema: Any, t: pa.DataType, values: list[dict[str, Any]]) -> list[bytes]:
    """The Avro bodies of ``values``, none of them null."""
    bodies = AvroEncoder(schema, t).encode(pa.array(values, t)).to_pylist()
    assert None not in bodies
    return bodies


def test_zigzag_varints_blocks_and_unions() -> None:
    t = pa.struct([pa.field("n", pa.int64(), False), pa.field("xs", pa.list_(pa.field("e", pa.int32(), False)), False),
                   pa.field("o", pa.int32())])
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "n", "type": "long"}, {"name": "xs", "type": {"type": "array", "items": "int"}},
        {"name": "o", "type": ["null", "int"]}]}
    assert _body(schema, t, [{"n": -1, "xs": [1, 2], "o": None}, {"n": 64, "xs": [], "o": -65}]) == [
        b"\x01" + b"\x04\x02\x04\x00" + b"\x00",
        b"\x80\x01" + b"\x00" + b"\x02\x81\x01"]


@pytest.mark.parametrize("unscaled, encoded", [
    (0, b"\x00"), (-1, b"\xff"), (127, b"\x7f"), (128, b"\x00\x80"), (-128, b"\x80"), (-129, b"\xff\x7f"),
    (255, b"\x00\xff"), (10 ** 38 - 1, (10 ** 38 - 1).to_bytes(17, "big", signed=True).lstrip(b"\x00")),
    (-(10 ** 38) + 1, (-(10 ** 38) + 1).to_bytes(16, "big", signed=True))])
def test_decimals_as_biginteger_to_byte_array_and_as_sign_extended_fixed(unscaled: int, encoded: bytes) -> None:
    """bytes: BigInteger.toByteArray (minimal two's complement); fixed: sign-extended to its size."""
    t = pa.struct([pa.field("d", pa.decimal128(38, 2), False)])
    value = _decimal(unscaled, 2)
    as_bytes = {"type": "record", "name": "r", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 2}}]}
    body = _body(as_bytes, t, [{"d": value}])[0]
    assert _avro_rows(as_bytes, [body]) == [{"d": value}]  # fastavro writes -128 in two bytes: not Java's
    assert body[1:] == encoded and body[0] == 2 * len(encoded)
    fixed = avro_schema_for(t)
    assert fixed["fields"][0]["type"]["size"] == 16
    assert _body(fixed, t, [{"d": value}])[0] == unscaled.to_bytes(16, "big", signed=True)


def test_map_entries_in_javas_hashmap_order() -> None:
    """Spark puts a map's entries in a java.util.HashMap before writing: they come out by
    bucket (String.hashCode spread, table sized for the count), then in insertion order."""
    t = pa.struct([pa.field("m", pa.map_(pa.string(), pa.field("v", pa.int32(), False)), False)])
    keys = ["k", "z", "a", "é", "\U0001f600", "b", "aa", "ab", "ba"]
    body = _body({"type": "record", "name": "r", "fields": [{"name": "m", "type": {"type": "map", "values": "int"}}]},
                 t, [{"m": [(k, i) for i, k in enumerate(keys)]}])[0]
    assert _avro_rows(avro_schema_for(t), [body]) == [{"m": {k: i for i, k in enumerate(keys)}}]

    def java_hash(s: str) -> int:
        h = 0
        for unit in range(0, len(s.encode("utf-16-be")), 2):
            h = (31 * h + int.from_bytes(s.encode("utf-16-be")[unit:unit + 2], "big")) & 0xFFFFFFFF
        return h ^ (h >> 16)

    capacity = 16  # new HashMap(9): a table of 16, resized past 12 entries
    expected = sorted(keys, key=lambda k: (java_hash(k) & (capacity - 1), keys.index(k)))
    stream = io.BytesIO(body)

    def read_long() -> int:
        shift = value = 0
        while True:
            byte = stream.read(1)[0]
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return (value >> 1) ^ -(value & 1)

    assert read_long() == len(keys)
    written = []
    for _ in keys:
        written.append(stream.read(read_long()).decode())
        read_long()
    assert written == expected


# ---- Avro: schema checks ---------------------------------------------------------------

ADDRESS = pa.struct([pa.field("street", pa.string(), False), pa.field("zip", pa.int32(), False)])
PERSON = pa.struct([pa.field("name", pa.string(), False), pa.field("address", ADDRESS, False)])


def _person_schema(zip_type: str | list[str]) -> dict[str, Any]:
    return {"type": "record", "name": "person", "namespace": "com.example", "fields": [
        {"name": "name", "type": "string"},
        {"name": "address", "type": {"type": "record", "name": "address", "fields": [
            {"name": "street", "type": "string"}, {"name": "zip", "type": zip_type}]}}]}


@pytest.mark.parametrize("zip_type, column, words", [
    ("string", "value.address.zip", ["int32", '"string"']),
    (["null", "long"], "value.address.zip", ["int32", "long"]),
    (["null", "int", "string"], "value.address.zip", ["union"]),
])
def test_a_type_that_does_not_fit_is_refused_naming_the_column_path(zip_type: str | list[str], column: str,
                                                                     words: list[str]) -> None:
    with pytest.raises(FormatSchemaError) as info:
        AvroEncoder(_person_schema(zip_type), PERSON)
    assert f"column {column}" in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_the_schema_check_errors() -> None:
    schema = _person_schema("int")
    AvroEncoder(json.dumps(schema), PERSON)  # fits
    extra = pa.struct([*PERSON, pa.field("age", pa.int32(), False)])
    with pytest.raises(FormatSchemaError, match=r"column value\.age is not in the Avro schema"):
        AvroEncoder(schema, extra)
    nullable = pa.struct([pa.field("name", pa.string(), True), PERSON.field("address")])
    with pytest.raises(FormatSchemaError, match=r"column value\.name is nullable.*not a union with null"):
        AvroEncoder(schema, nullable)
    lacking = pa.struct([PERSON.field("address")])
    with pytest.raises(FormatSchemaError, match=r"column value\.name is missing.*neither nullable nor with a default"):
        AvroEncoder(schema, lacking)
    with pytest.raises(FormatSchemaError, match=r"column value\.u: Arrow type uint32 has no Avro mapping"):
        avro_schema_for(pa.struct([pa.field("u", pa.uint32())]))
    with pytest.raises(FormatSchemaError, match=r"column value\.m: a map with int32 keys"):
        avro_schema_for(pa.struct([pa.field("m", pa.map_(pa.int32(), pa.int32()))]))
    decimal_schema = {"type": "record", "name": "r", "fields": [
        {"name": "d", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 3}}]}
    with pytest.raises(FormatSchemaError, match=r"column value\.d: .*decimal\(10,2\)"):
        AvroEncoder(decimal_schema, pa.struct([pa.field("d", pa.decimal128(10, 2), False)]))
    with pytest.raises(FormatSchemaError, match=r"made for Arrow type"):
        AvroEncoder(schema, PERSON).encode(pa.array([{"name": "x"}]))


def test_fields_the_column_lacks_are_written_null_or_as_their_default() -> None:
    t = pa.struct([pa.field("a", pa.int64(), False)])
    schema = {"type": "record", "name": "r", "namespace": "n", "fields": [
        {"name": "before", "type": ["null", "string"]},
        {"name": "a", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": ["x", "y"]},
        {"name": "ref", "type": {"type": "fixed", "name": "f4", "size": 2}, "default": "\u00ff\u0001"},
        {"name": "again", "type": ["null", "f4"]},
        {"name": "score", "type": "double", "default": 1.5}]}
    bodies = AvroEncoder(schema, t).encode(pa.array([{"a": 3}], t)).to_pylist()
    assert _avro_rows(schema, bodies) == [{"before": None, "a": 3, "tags": ["x", "y"], "ref": b"\xff\x01",
                                           "again": None, "score": 1.5}]


def test_a_given_schema_with_null_first_unions_bytes_decimals_and_millis() -> None:
    t = pa.struct([pa.field("d", pa.decimal128(5, 1)), pa.field("ts", pa.timestamp("us", "UTC")),
                   pa.field("local", pa.timestamp("us")), pa.field("raw", pa.binary()),
                   pa.field("plain", pa.timestamp("us", "UTC"), False)])
    schema = {"type": "record", "name": "r", "fields": [
        {"name": "d", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 1}]},
        {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
        {"name": "local", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}]},
        {"name": "raw", "type": [{"type": "fixed", "name": "two", "size": 2}, "null"]},
        {"name": "plain", "type": "long"}]}
    when = datetime.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    rows: list[dict[str, Any]] = [
        {"d": decimal.Decimal("-12.5"), "ts": when, "local": when.replace(tzinfo=None), "raw": b"ab", "plain": when},
        {"d": None, "ts": None, "local": None, "raw": None, "plain": when}]
    bodies = AvroEncoder(schema, t).encode(pa.array(rows, t)).to_pylist()
    back = _avro_rows(schema, bodies)
    # millis floored, as Spark's microsToMillis; a long with no logical type: millis, as Spark
    assert back[0]["ts"] == when.replace(microsecond=999_000)
    assert back[0]["plain"] == -1 and back[0]["d"] == decimal.Decimal("-12.5") and back[0]["raw"] == b"ab"
    assert back[0]["local"] == when.replace(tzinfo=None)
    assert back[1] == {"d": None, "ts": None, "local": None, "raw": None, "plain": -1}
    with pytest.raises(FormatValueError, match=r"column value\.raw, row 1: 3 bytes.*takes 2"):
        AvroEncoder(schema, t).encode(pa.array([rows[1], {**rows[0], "raw": b"abc"}], t))


def test_a_null_where_the_schema_has_none_names_the_column_and_the_row() -> None:
    t = pa.struct([pa.field("id", pa.int64(), False),
                   pa.field("inner", pa.struct([pa.field("x", pa.int32(), False)]), False)])
    inner = pa.StructArray.from_arrays([pa.array([1, 2, None, 4, 5], pa.int32())], fields=[t.field("inner").type.field(0)])
    array = pa.StructArray.from_arrays([pa.array([1, 2, 3, 4, 5]), inner], fields=list(t))
    encoder = AvroEncoder(None, t)
    with pytest.raises(FormatValueError, match=r"column value\.inner\.x, row 2: null"):
        encoder.encode(array)
    with pytest.raises(FormatValueError, match=r"column value\.inner\.x, row 1: null"):
        encoder.encode(array.slice(1))
    with pytest.raises(FormatValueError, match=r"column value\.inner\.x, row 2: null"):
        encoder.encode(pa.chunked_array([array.slice(0, 1), array.slice(1, 1), array.slice(2)]))
    assert len(encoder.encode(array.slice(3))) == 2
    with pytest.raises(FormatValueError) as failure:
        encoder.encode(array.slice(1))
    # The row as data, renumbered from a slice's first row, and through pickle (Spark's
    # workers pickle a task's error) whole.
    assert failure.value.row == 1 and failure.value.path == "value.inner.x"
    moved = failure.value.counted_from(1000)
    assert str(moved).startswith("column value.inner.x, row 1001: null") and moved.what == failure.value.what
    back = pickle.loads(pickle.dumps(moved))
    assert type(back) is FormatValueError and str(back) == str(moved) and back.row == 1001


def test_a_decimal_beyond_its_precision_is_refused() -> None:
    t = pa.struct([pa.field("d", pa.decimal128(3, 0), False)])
    digits = pa.array([1, 1000], pa.decimal128(4, 0)).view(pa.decimal128(3, 0))  # Arrow checks no precision
    array = pa.StructArray.from_arrays([digits], fields=list(t))
    assert len(AvroEncoder(None, t).encode(array.slice(0, 1))) == 1
    with pytest.raises(FormatValueError, match=r"column value\.d, row 1: a decimal with more than the 3 digits"):
        AvroEncoder(None, t).encode(array)


def test_without_the_compiled_extension_the_encoder_says_what_to_install() -> None:
    script = ("import sys; sys.modules['spark_sink.encoder._formats'] = None\n"
              "import pyarrow as pa\n"
              "from spark_sink.encoder.formats import AvroEncoder\n"
              "AvroEncoder(None, pa.struct([('a', pa.int64())]))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "need kprod's compiled encoder" in done.stderr and "pip install ." in done.stderr


# ---- JSON -------------------------------------------------------------------------------

def _json_expected(t: pa.DataType, value: Any) -> Any:
    """A row as JsonEncoder writes it, in json.loads' terms (floats and decimals as
    Decimals of their text, compared by value below)."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _json_expected(t.item_type, v) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_json_expected(t.value_type, v) for v in value]
    if pa.types.is_struct(t):
        return {f.name: _json_expected(f.type, value[f.name]) for f in t}
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return base64.b64encode(value).decode()
    if t == pa.date32():
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    if pa.types.is_timestamp(t):
        return (f"{value.year:04d}-{value.month:02d}-{value.day:02d}T{value.hour:02d}:{value.minute:02d}:"
                f"{value.second:02d}.{value.microsecond:06d}{'Z' if t.tz else ''}")
    return value


def _json_actual(t: pa.DataType, value: Any) -> Any:
    """A value json.loads gave back (parse_float=Decimal), floats as Arrow's."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return {k: _json_actual(t.item_type, v) for k, v in value.items()}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_json_actual(t.value_type, v) for v in value]
    if pa.types.is_struct(t):
        assert list(value) == t.names, "fields in the column's order"
        return {f.name: _json_actual(f.type, value[f.name]) for f in t}
    if t == pa.float32():
        return float(np.float32(value))  # the shortest text that reads back as the same float32
    if t == pa.float64():
        return float(value)
    return value


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(columns(finite=True), st.sampled_from([b"", b"\x00\x00\x00\x00\x07"]))
def test_json_texts_read_back_as_the_rows_and_fit_the_schema(
        column: tuple[pa.DataType, pa.Array | pa.ChunkedArray, list[Any]], prefix: bytes) -> None:
    t, array, rows = column
    schema = json_schema_for(t, title="topLevelRecord")
    validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    validator.check_schema(schema)
    texts = JsonEncoder(json.dumps(schema), t).encode(array, prefix).to_pylist()
    assert len(texts) == len(rows)
    for text, row in zip(texts, rows):
        if row is None:
            assert text is None
            continue
        assert text.startswith(prefix)
        body = text[len(prefix):].decode()
        validator.validate(json.loads(body))
        assert _json_actual(t, json.loads(body, parse_float=decimal.Decimal)) == _json_expected(t, row)


def test_json_text_golden() -> None:
    t = pa.struct([pa.field("s", pa.string(), False), pa.field("f", pa.float64()), pa.field("g", pa.float32()),
                   pa.field("d", pa.decimal128(6, 3)), pa.field("b", pa.binary()), pa.field("day", pa.date32()),
                   pa.field("ts", pa.timestamp("us", "UTC")), pa.field("local", pa.timestamp("us")),
                   pa.field("m", pa.map_(pa.string(), pa.int8())), pa.field("xs", pa.list_(pa.bool_()))])
    when = datetime.datetime(1969, 12, 31, 23, 59, 59, 999_999)
    row = {"s": 'a"\\\n\x01é', "f": 0.1, "g": 0.1, "d": decimal.Decimal("-0.005"), "b": b"\xff\x00",
           "day": datetime.date(2024, 2, 29), "ts": when.replace(tzinfo=UTC), "local": when,
           "m": [("k", -1), ("j", None)], "xs": [True, None]}
    texts = JsonEncoder(None, t).encode(pa.array([row, {"s": ""}], t)).to_pylist()
    assert texts[0].decode() == (
        '{"s":"a\\"\\\\\\n\\u0001é","f":0.1,"g":0.1,"d":-0.005,"b":"/wA=","day":"2024-02-29",'
        '"ts":"1969-12-31T23:59:59.999999Z","local":"1969-12-31T23:59:59.999999","m":{"k":-1,"j":null},'
        '"xs":[true,null]}')
    assert texts[1] == b'{"s":"","f":null,"g":null,"d":null,"b":null,"day":null,"ts":null,"local":null,"m":null,' \
                       b'"xs":null}'


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_json_refuses_nan_and_infinities_naming_the_column_and_row(value: float) -> None:
    t = pa.struct([pa.field("inner", pa.struct([pa.field("x", pa.float64())]))])
    array = pa.array([{"inner": {"x": 1.0}}, {"inner": {"x": value}}], t)
    with pytest.raises(FormatValueError, match=r"column value\.inner\.x, row 1: NaN or an infinity"):
        JsonEncoder(None, t).encode(array)


def test_json_refuses_years_rfc_3339_cannot_write() -> None:
    t = pa.struct([pa.field("day", pa.date32())])
    array = pa.StructArray.from_arrays([pa.array([0, 2932897], pa.int32()).view(pa.date32())], fields=list(t))
    with pytest.raises(FormatValueError, match=r"column value\.day, row 1: a date in the year 10000"):
        JsonEncoder(None, t).encode(array)


def test_json_schema_checks() -> None:
    t = pa.struct([pa.field("id", pa.int64(), False), pa.field("tags", pa.list_(pa.string()))])
    derived = json_schema_for(t)
    JsonEncoder(derived, t)
    given = {"type": "object", "definitions": {"tag": {"type": ["string", "null"]}},
             "properties": {"id": {"type": "number"}, "tags": {"anyOf": [
                 {"type": "array", "items": {"$ref": "#/definitions/tag"}}, {"type": "null"}]}}}
    assert JsonEncoder(given, t).encode(pa.array([{"id": 1, "tags": ["a", None]}], t)).to_pylist() == [
        b'{"id":1,"tags":["a",null]}']
    with pytest.raises(FormatSchemaError, match=r"column value\.id: Arrow type int64 does not fit"):
        JsonEncoder({"type": "object", "properties": {"id": {"type": "string"}}}, t)
    with pytest.raises(FormatSchemaError, match=r"column value\.tags is nullable"):
        JsonEncoder({"type": "object", "properties": {"tags": {"type": "array"}}}, t)
    with pytest.raises(FormatSchemaError, match=r"column value\.name is missing"):
        JsonEncoder({**derived, "required": ["id", "name"]}, t)
    with pytest.raises(FormatSchemaError, match=r"column value\.tags is not among"):
        JsonEncoder({"type": "object", "properties": {"id": {}}, "additionalProperties": False}, t)
    with pytest.raises(FormatSchemaError, match=r"column value\.u: Arrow type uint8 has no JSON Schema mapping"):
        json_schema_for(pa.struct([pa.field("u", pa.uint8())]))
