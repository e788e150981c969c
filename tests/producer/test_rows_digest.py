"""RowsDigest: the same rows give the same digest in any order and any cut into tables;
other rows (a value moved to another row, a null for an empty value, a header, a
partition) give another."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from spark_sink.producer import RowsDigest
from spark_sink.producer.partitioner import murmur2_array

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _digest(*tables: pa.Table) -> str:
    digest = RowsDigest()
    for table in tables:
        digest.add(table)
    return str(digest)


def _rows(rng: random.Random, n: int) -> list[dict]:
    def blob() -> bytes | None:
        return None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 12))

    return [{"key": blob(), "value": blob(), "topic": rng.choice(["a", "b"]), "partition": rng.choice([None, 0, 3]),
             "headers": [(f"h{i}", blob()) for i in range(rng.randrange(3))]} for _ in range(n)]


def _table(rows: list[dict]) -> pa.Table:
    return pa.table({"key": pa.array([r["key"] for r in rows], pa.binary()),
                     "value": pa.array([r["value"] for r in rows], pa.binary()),
                     "topic": pa.array([r["topic"] for r in rows], pa.string()),
                     "partition": pa.array([r["partition"] for r in rows], pa.int32()),
                     "headers": pa.array([r["headers"] for r in rows], HEADERS)})


@pytest.mark.parametrize("seed", range(20))
def test_the_same_rows_in_any_order_and_cut_give_one_digest(seed: int) -> None:
    rng = random.Random(seed)
    rows = _rows(rng, rng.randrange(1, 60))
    shuffled = rows[:]
    rng.shuffle(shuffled)
    cut = rng.randrange(len(shuffled) + 1)
    assert _digest(_table(rows)) == _digest(_table(shuffled[:cut]), _table(shuffled[cut:]))
    assert _digest(_table(rows)).startswith(f"{len(rows)}:")


@pytest.mark.parametrize("seed", range(20))
def test_rows_dealt_otherwise_give_other_digests(seed: int) -> None:
    """Two tasks' rows dealt otherwise (as a replay split differently does) change both
    tasks' digests, though the rows, the counts and the lengths are the same."""
    rng = random.Random(seed)
    rows = _rows(rng, 20)
    moved = rows[:]
    i, j = rng.randrange(10), rng.randrange(10, 20)
    moved[i], moved[j] = moved[j], moved[i]
    assert _digest(_table(rows[:10])) != _digest(_table(moved[:10]))
    assert _digest(_table(rows[10:])) != _digest(_table(moved[10:]))


@pytest.mark.parametrize("change", ["null for empty", "key and value swapped", "header dropped", "partition",
                                    "topic"])
def test_each_part_of_a_row_counts(change: str) -> None:
    row = {"key": b"k", "value": b"", "topic": "a", "partition": 1, "headers": [("h", b"1")]}
    other = dict(row)
    if change == "null for empty":
        other["value"] = None
    elif change == "key and value swapped":
        other["key"], other["value"] = row["value"], row["key"]
    elif change == "header dropped":
        other["headers"] = []
    elif change == "partition":
        other["partition"] = 2
    else:
        other["topic"] = "b"
    assert _digest(_table([row])) != _digest(_table([other]))


def test_timestamps_count_and_columns_absent_do_not() -> None:
    values = pa.array([b"x", b"y"])
    for t in (pa.int64(), pa.timestamp("ms")):
        assert _digest(pa.table({"value": values, "timestamp": pa.array([1, 2], t)})) != _digest(
            pa.table({"value": values, "timestamp": pa.array([2, 1], t)}))
    assert _digest(pa.table({"value": values, "timestamp": pa.array([None, 2], pa.int64())})) != _digest(
        pa.table({"value": values, "timestamp": pa.array([0, 2], pa.int64())}))
    assert _digest(pa.table({"value": values})) != _digest(pa.table({"value": values, "key": values}))
    assert str(RowsDigest()) == "0:0000000000000000"


def test_header_order_counts() -> None:
    one = [("a", b"1"), ("b", b"2")]
    assert _digest(pa.table({"value": [b"x"], "headers": pa.array([one], HEADERS)})) != _digest(
        pa.table({"value": [b"x"], "headers": pa.array([one[::-1]], HEADERS)}))


def test_values_sharing_kafkas_murmur2_are_told_apart() -> None:
    """The partitioner's 32-bit murmur2 collides once in about 2**32 pairs: among 200,000
    random values a pair shares it, and their digests still differ."""
    rng = np.random.default_rng(7)
    values = pa.array([bytes(b) for b in rng.integers(0, 256, (200_000, 8), dtype=np.uint8)], pa.binary())
    hashes = murmur2_array(values)
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    assert same.size, "no pair sharing a murmur2 among the values drawn"
    a, b = values[int(order[same[0]])].as_py(), values[int(order[same[0] + 1])].as_py()
    assert a != b
    assert _digest(pa.table({"value": pa.array([a])})) != _digest(pa.table({"value": pa.array([b])}))
