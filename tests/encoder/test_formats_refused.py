"""``encode_valid``: rows a value format cannot carry are left null and listed by reason
(column path, what the schema expects), and every other row is encoded exactly as
``encode`` encodes it on its own. Seeded random positions and proportions, and
hand-picked cases; no Kafka needed."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import pyarrow as pa
import pytest

from spark_sink.encoder.formats import AvroEncoder, FormatValueError, JsonEncoder

# id: int64 declared non-nullable (Arrow still lets a row be null there: a bad row),
# score: float64 (NaN is a bad row in JSON), tag: a binary for Avro's fixed(4) (another
# length is a bad row), day: a date (year 10000 is a bad row in JSON).
TYPE = pa.struct([pa.field("id", pa.int64(), False), pa.field("score", pa.float64(), False),
                  pa.field("tag", pa.binary(), False), pa.field("day", pa.date32(), False)])
AVRO_SCHEMA = {"type": "record", "name": "r", "fields": [
    {"name": "id", "type": "long"}, {"name": "score", "type": "double"},
    {"name": "tag", "type": {"type": "fixed", "name": "tag4", "size": 4}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}}]}
BAD = {"avro": {"null_id": "value.id: null", "short_tag": "value.tag: 2 bytes"},
       "json": {"null_id": "value.id: null", "nan": "value.score: NaN", "year": "value.day: a date in the year"}}


def _column(kinds: list[str], rng: random.Random) -> pa.StructArray:
    ids, scores, tags, days = [], [], [], []
    for i, kind in enumerate(kinds):
        ids.append(None if kind == "null_id" else i)
        scores.append(float("nan") if kind == "nan" else rng.uniform(-1e6, 1e6))
        tags.append(b"ab" if kind == "short_tag" else rng.randbytes(4))
        days.append(2_932_897 + rng.randrange(300) if kind == "year" else rng.randrange(-700_000, 2_900_000))
    validity = [kind != "null_row" for kind in kinds]
    arrays = [pa.array(ids, pa.int64()), pa.array(scores, pa.float64()), pa.array(tags, pa.binary()),
              pa.array(days, pa.date32())]
    return pa.StructArray.from_arrays(arrays, fields=list(TYPE), mask=pa.array([not v for v in validity]))


def _encoder(fmt: str) -> AvroEncoder | JsonEncoder:
    return AvroEncoder(AVRO_SCHEMA, TYPE) if fmt == "avro" else JsonEncoder(None, TYPE)


@pytest.mark.parametrize("fmt", ["avro", "json"])
@pytest.mark.parametrize("seed", range(12))
def test_bad_rows_are_listed_and_the_others_encoded_as_on_their_own(fmt: str, seed: int) -> None:
    rng = random.Random(seed)
    bad_kinds = list(BAD[fmt])
    n = rng.choice([1, 5, 64, 1000, 5000])
    weights = [rng.uniform(0.5, 3)] + [rng.uniform(0, 1) for _ in bad_kinds] + [rng.uniform(0, 0.3)]
    kinds = rng.choices(["good", *bad_kinds, "null_row"], weights, k=n)
    column = _column(kinds, rng)
    if seed % 3 == 0:  # a sliced, chunked column: offsets and chunks must not shift rows
        column = pa.chunked_array([column.slice(0, n // 3), column.slice(n // 3)])
    encoder = _encoder(fmt)
    encoded, refused = encoder.encode_valid(column, prefix=b"\x00\x00\x00\x00\x07")

    listed = {int(row): str(error) for rows, error in refused for row in rows}
    assert listed.keys() == {i for i, k in enumerate(kinds) if k in BAD[fmt]}
    for row, message in listed.items():
        assert BAD[fmt][kinds[row]] in message, message
    for rows, error in refused:
        assert isinstance(error, FormatValueError)
        assert list(rows) == sorted(set(rows))
    assert len(encoded) == n
    assert encoded.is_null().to_pylist() == [k in BAD[fmt] or k == "null_row" for k in kinds]
    whole = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    good = np.array([i for i, k in enumerate(kinds) if k == "good"], dtype=np.int64)
    alone = encoder.encode(whole.take(pa.array(good)), prefix=b"\x00\x00\x00\x00\x07")
    assert encoded.take(pa.array(good)).to_pylist() == alone.to_pylist()
    with pytest.raises(FormatValueError, match=r"row \d+") if listed else contextlib.nullcontext():
        encoder.encode(column)


def test_one_reason_per_column_path_and_kind() -> None:
    """Rows refused for the same thing at the same place are one group; its message names
    the column path without a row (the rows are the group's)."""
    kinds = ["good", "nan", "null_id", "nan", "good", "null_id", "nan"]
    _, refused = JsonEncoder(None, TYPE).encode_valid(_column(kinds, random.Random(1)))
    groups = {str(error): rows.tolist() for rows, error in refused}
    assert groups == {
        'column value.id: null, but the schema has no null there ({"type":"integer","connect.type":"int64"})': [2, 5],
        "column value.score: NaN or an infinity, which JSON cannot carry": [1, 3, 6]}


def test_every_row_bad_and_no_row_bad() -> None:
    encoder = _encoder("json")
    encoded, refused = encoder.encode_valid(_column(["nan"] * 50, random.Random(2)))
    assert encoded.null_count == 50 and [r.tolist() for r, _ in refused] == [list(range(50))]
    column = _column(["good"] * 50, random.Random(3))
    encoded, refused = encoder.encode_valid(column)
    assert refused == [] and encoded.to_pylist() == encoder.encode(column).to_pylist()
