"""A task's dead letters are built in pieces (break 57 (3): a slice's refused rows were
built into one table of dead letters through Python objects, 85 MiB for rows of 16,000
booleans in a writer bound to 24). ``pieces`` over seeded random groups of refused rows
(tiny and huge, a few and many): every row once, in order, each piece within its rows and
bytes or one row, and the dead letters the same as those built whole; building them piece
by piece holds a piece's Python objects, not the groups'. And the refused rows are copied
out of a call by runs: Arrow's take of 1,000 rows of 16,000 booleans made 64 MiB of
indices, one per boolean. And against a real broker gone silent, dead letters that
expired fail the task's next ``refused`` (break 58: settled only at the task's end, a
task of refused rows only crawled on, one buffer.memory per delivery.timeout.ms)."""

from __future__ import annotations

import json
import random
import tracemalloc
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pytest

from spark_sink.producer import KafkaProducer, KafkaTimeoutError, RefusedRows
from spark_sink.producer.row_errors import SLICED_RUNS, rows_of
from spark_sink.spark.dead_letters import PIECE_BYTES, PIECE_ROWS, TaskDeadLetters, pieces
from tests.arrow_memory import arrow_peak
from tests.brokers import consume_to_marks, create_topic, unique_topic
from tests.clock import MovedClock
from tests.conftest import ProxiedKafka

if TYPE_CHECKING:
    from kprod_broker import KafkaCluster

VALUE = pa.struct([("id", pa.int64()), ("flags", pa.list_(pa.bool_())), ("text", pa.string())])


def _group(rng: random.Random, first: int, rows: int, huge: float, huge_flags: int = 2_000) -> RefusedRows:
    """``rows`` refused rows (ids from ``first``), a ``huge`` share of them with
    ``huge_flags`` booleans, the others with none or a few."""
    sizes = [huge_flags if rng.random() < huge else rng.choice([0, 3]) for _ in range(rows)]
    offsets = pa.array(np.concatenate([[0], np.cumsum(sizes)]), pa.int32())
    flags = pa.ListArray.from_arrays(offsets, pa.array(np.arange(offsets[-1].as_py()) % 3 == 0))
    texts = pa.array(["t" * rng.choice([0, 10, 2_000]) for _ in range(rows)])
    value = pa.StructArray.from_arrays([pa.array(range(first, first + rows), pa.int64()), flags, texts],
                                       fields=list(VALUE))
    data = pa.table({"key": pa.array([str(first + i).encode() for i in range(rows)]), "value": value})
    return RefusedRows(np.arange(first, first + rows), data, "FormatValueError", "column value.score: NaN")


class _StillWall(MovedClock):
    """The dead letters' timestamp header the same whichever piece is built when."""

    def wall_ms(self) -> float:
        return 1_700_000_000_000.0


def _letters() -> TaskDeadLetters:
    return TaskDeadLetters("dead", "topic", {"task.id": "0"}, clock=_StillWall())


def test_random_groups_in_pieces_keep_every_row_once_in_order() -> None:
    for seed in range(10):
        rng = random.Random(seed)
        groups, first = [], 0
        for _ in range(rng.randint(1, 5)):
            rows = rng.choice([1, 5, 60, 300])
            groups.append(_group(rng, first, rows, rng.choice([0.0, 0.02, 0.5])))
            first += rows
        max_rows, max_bytes = rng.choice([(PIECE_ROWS, PIECE_BYTES), (7, 4 << 10), (1_000, 1 << 20)])
        got = list(pieces(groups, max_rows, max_bytes))
        ids = [i for piece in got for r in piece for i in r.data.column("value").combine_chunks().field("id").to_pylist()]
        assert ids == list(range(first)), seed
        assert [i for piece in got for r in piece for i in r.rows.tolist()] == ids, seed
        for piece in got:
            rows = sum(len(r) for r in piece)
            assert rows <= max_rows, (seed, rows)
            assert rows == 1 or sum(r.data.nbytes for r in piece) <= max_bytes, (seed, rows)
        letters = _letters()
        whole = letters.table(groups)
        assert pa.concat_tables([letters.table(piece) for piece in got]).equals(whole), seed


def test_huge_refused_rows_are_built_a_piece_at_a_time() -> None:
    """48 rows of 16,000 booleans (2 KB each in Arrow; as Python objects and JSON ~100
    times that): built whole, ~11 MiB at the peak; in pieces of 16 KiB of Arrow, ~2."""
    groups = [_group(random.Random(1), 0, 48, 1.0, huge_flags=16_000)]
    letters = _letters()

    def peak(build: object) -> int:
        tracemalloc.start()
        try:
            build()  # type: ignore[operator]
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    in_pieces = peak(lambda: [letters.table(piece).nbytes for piece in pieces(groups, max_bytes=16 << 10)])
    whole = peak(lambda: letters.table(groups))
    print(f"dead letters of 48 huge rows: {whole / 2**20:.1f} MiB whole, {in_pieces / 2**20:.1f} MiB in pieces")
    assert 4 * in_pieces < whole, (in_pieces, whole)


def test_refused_rows_are_copied_out_by_runs_or_a_few_at_a_time() -> None:
    """``rows_of``: seeded random row sets (runs and scattered rows, in order) give the
    rows ``take`` gives; runs of huge rows cost no copy, scattered ones a few rows' worth."""
    rng = random.Random(3)
    table = _group(rng, 0, 3_000, 0.3).data
    for _ in range(20):
        picked = sorted(rng.sample(range(3_000), rng.choice([0, 1, 40, 500, 2_000])))
        if rng.random() < 0.5:  # runs
            start = rng.randrange(3_000)
            picked = list(range(start, min(3_000, start + rng.choice([1, 100, 1_000]))))
        rows = np.array(picked, np.int64)
        assert rows_of(table, rows).equals(table.take(pa.array(rows, pa.int64())))
    huge = _group(rng, 0, 1_000, 1.0, huge_flags=16_000).data

    runs, scattered = np.arange(1_000), np.arange(0, 1_000, 2)
    assert len(scattered) > SLICED_RUNS
    at_once = arrow_peak(lambda: huge.take(pa.array(runs)))
    assert at_once > 48 << 20  # an index per boolean: what rows_of avoids
    assert arrow_peak(lambda: rows_of(huge, runs)) < 1 << 20
    assert arrow_peak(lambda: rows_of(huge, scattered)) < at_once / 4


def test_expired_dead_letters_fail_the_next_refused_rows(kafka_proxy: ProxiedKafka) -> None:
    """40 groups of refused rows (~20 KiB each, three times a 256 KiB buffer.memory) through a
    broker that stopped answering: ``refused`` raises the delivery timeout once the first
    dead letters expired (after a few groups), instead of queueing every group."""
    dead = create_topic(kafka_proxy.bootstrap, unique_topic("expired-dead-letters"), 1)
    config = {"bootstrap.servers": kafka_proxy.bootstrap, "buffer.memory": str(256 << 10),
              "delivery.timeout.ms": "1500", "request.timeout.ms": "1000", "linger.ms": "5"}
    rng = random.Random(8)
    groups = [_group(rng, 30 * i, 30, 0.0) for i in range(40)]
    letters = TaskDeadLetters(dead, "topic", {}, timeout_s=30)
    handed = 0
    with KafkaProducer(config) as producer:
        letters.prepare(producer)
        kafka_proxy.proxy.stall()
        try:
            with pytest.raises(KafkaTimeoutError, match="delivery.timeout.ms=1500"):
                for group in groups:
                    letters.refused(producer, [group])
                    handed += 1
        finally:
            kafka_proxy.proxy.stall(False)
    assert handed < len(groups) // 2, handed


def test_a_dead_letter_too_large_for_its_topic_goes_without_its_value(kafka: KafkaCluster) -> None:
    """Break 59: a row its format refused (a NaN) with a 1.2 MB text made a dead letter
    larger than max.request.size, sent again as it was, and its RecordTooLargeError
    failed the write. Now it goes without its value, its key and headers kept and its
    message saying why; the others as they were."""
    dead = create_topic(kafka.bootstrap, unique_topic("too-large-dead-letters"), 1)
    value = pa.struct([("score", pa.float64()), ("text", pa.string())])
    data = pa.table({"key": [b"small", b"large"],
                     "value": pa.array([{"score": None, "text": "s"}, {"score": None, "text": "t" * 1_200_000}], value)})
    group = RefusedRows(np.array([3, 8]), data, "FormatValueError", "column value.score, row 8: NaN")
    letters = TaskDeadLetters(dead, "topic", {"task.id": "0"}, timeout_s=30)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as producer:
        letters.refused(producer, [group])
        letters.settle(producer)
    assert letters.sent == 2
    got = {m.key(): m for m in consume_to_marks(kafka.bootstrap, dead)}
    assert json.loads(got[b"small"].value()) == {"score": None, "text": "s"}
    assert got[b"large"].value() is None
    message = dict(got[b"large"].headers())["kprod.errors.message"].decode()
    assert message.endswith("(the dead letter leaves the value out: too large for the dead-letter topic)"), message
