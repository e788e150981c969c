"""RowsDigest: the same rows give the same digest in any order and any cut into tables;
other rows (a value moved to another row, a null for an empty value, a header, a
partition) give another."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from spark_sink.producer import RowsDigest

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
def test_the_same_rows_in_any_order_and_cut_give_one_digest(seed):
    rng = random.Random(seed)
    rows = _rows(rng, rng.randrange(1, 60))
    shuffled = rows[:]
    rng.shuffle(shuffled)
    cut = rng.randrange(len(shuffled) + 1)
    assert _digest(_table(rows)) == _digest(_table(shuffled[:cut]), _table(shuffled[cut:]))
    assert _digest(_table(rows)).startswith(f"{len(rows)}:")


@pytest.mark.parametrize("seed", range(20))
def test_rows_dealt_otherwise_give_other_digests(seed):
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
def test_each_part_of_a_row_counts(change):
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


def test_timestamps_and_columns_absent_are_left_out():
    values = pa.array([b"x", b"y"])
    now = pa.array([1, 2], pa.timestamp("ms"))
    later = pa.array([5, 9], pa.timestamp("ms"))
    assert _digest(pa.table({"value": values, "timestamp": now})) == _digest(pa.table({"value": values,
                                                                                       "timestamp": later}))
    assert _digest(pa.table({"value": values})) != _digest(pa.table({"value": values, "key": values}))
    assert str(RowsDigest()) == "0:0000000000000000"
