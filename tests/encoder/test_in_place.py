"""encode_groups with ``continued``: a group's rows that continue a batch are written past
the end of that batch's claimed RecordBuffer and committed there, a group's one new batch
into a RecordBuffer of its own, and the bytes are the row-wise reference encoder's for all
the batch's records; a buffer sealed between its claim and the write gets the rows in a
buffer of their own (``pending``), never below its end; a claim holds off every other
writer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.encoder.columnar import Continued, can_join, encode_groups
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD, Record, encode_records

pytestmark = pytest.mark.skipif(not can_join(), reason="RecordBuffer is the C extension's")

rows_st = st.lists(st.tuples(st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=300),
                             st.integers(0, 2**42), st.integers(0, 3)), min_size=1, max_size=60)


def _encode(rows: list[tuple], groups: int, continued: Continued, batch_size: int = 1 << 20) -> list:
    keys = pa.array([k for k, _, _, _ in rows], pa.binary())
    values = pa.array([v for _, v, _, _ in rows], pa.binary())
    return encode_groups(keys, values, np.array([t for _, _, t, _ in rows], np.int64), None,
                         np.array([g % groups for *_, g in rows], np.int64), groups, batch_size=batch_size,
                         continued=continued)


def _held(buffers: list) -> Continued:
    """What RecordAccumulator.continued says of these buffers (None: nothing to continue),
    each claimed."""
    held = np.zeros((3, len(buffers)), np.int64)
    for g, b in enumerate(buffers):
        if b is not None:
            held[:, g] = b.claim()
            assert tuple(held[:, g]) == (b.record_count, b.estimated_size - RECORD_BATCH_OVERHEAD, b.base_timestamp)
    return Continued(held, list(buffers))


def _records(rows: list[tuple], group: int, groups: int) -> list[Record]:
    return [Record(k, v, t) for k, v, t, g in rows if g % groups == group]


@settings(max_examples=120, deadline=None)
@given(rows_st, rows_st, st.integers(1, 4), st.booleans())
def test_continued_rows_are_committed_in_place_as_the_reference_batch(first: list[tuple], second: list[tuple],
                                                                       groups: int, seal: bool) -> None:
    """Two calls: the first's batches are RecordBuffers of their own, the second's rows are
    written into them (the same objects) and committed, and each batch is the reference
    encoding of both calls' records; with ``seal``, the first's buffers are sealed after
    the claim (the Sender took them), and the second's rows go into buffers of their own
    that ``pending`` hands out, the sealed bytes unchanged."""
    out = _encode(first, groups, Continued(np.zeros((3, groups), np.int64), [None] * groups))
    buffers: list[Any] = [batches[0].payload if batches else None for batches in out]
    for g, batches in enumerate(out):
        assert len(batches) <= 1 and all(type(e.payload) is type(buffers[g]) for e in batches)
    continued = _held(buffers)
    sealed: list[Any] = [bytes(b.take()) if seal and b is not None else None for b in buffers]
    out2 = _encode(second, groups, continued)
    for g in range(groups):
        one, two = _records(first, g, groups), _records(second, g, groups)
        if not two:
            assert buffers[g] is None or not buffers[g].claimed  # released: no row continued it
            continue
        e = out2[g][0]
        if buffers[g] is None:  # nothing to continue: a batch of its own
            assert e.first_offset == 0 and bytes(e.payload.take()) == encode_records(two, two[0].timestamp)
            continue
        assert e.first_offset == len(one) and e.record_count == len(two)
        if seal:
            assert e.payload is not buffers[g] and bytes(buffers[g].take()) == sealed[g]
            moved = e.payload.pending(e.uncompressed_size)
            assert not e.payload.claimed
            # as the continuation of `one`: the reference encoding of both, less one's bytes
            assert moved == encode_records(one + two, one[0].timestamp)[len(sealed[g]):]
            continue
        assert e.payload is buffers[g]
        e.payload.commit(e.uncompressed_size, e.record_count, e.base_timestamp, e.max_timestamp)
        both = one + two
        reference = encode_records(both, both[0].timestamp)
        b = buffers[g]
        assert not b.claimed
        assert (b.record_count, b.base_timestamp, b.max_timestamp, b.estimated_size) == (
            len(both), both[0].timestamp, max(r.timestamp for r in both), RECORD_BATCH_OVERHEAD + len(reference))
        assert bytes(b.take()) == reference


def test_a_claim_holds_off_every_other_writer() -> None:
    from spark_sink.encoder._kernels import RecordBuffer

    b = RecordBuffer(1 << 20)
    b.append(5, b"k", b"v", None)
    assert b.claim() == (1, b.estimated_size - RECORD_BATCH_OVERHEAD, 5) and b.claimed
    assert b.claim() is None  # a second writer is refused the room
    with pytest.raises(BufferError, match="claim"):
        b.append(6, b"k", b"v", None)
    with pytest.raises(BufferError, match="claim"):
        b.append_section(encode_records([Record(None, b"x", 6)], 6), 1, 6, 6, 1 << 20)
    b.commit(0, 0, 5, 5)  # nothing written: the claim ends, the buffer as it was
    assert not b.claimed and b.record_count == 1
    b.append(6, b"k", b"v", None)
    assert bytes(b.take()) == encode_records([Record(b"k", b"v", 5), Record(b"k", b"v", 6)], 5)
    assert b.claim() is None  # sealed: no room past its end for anyone
    with pytest.raises(BufferError, match="sealed"):
        b.commit(0, 0, 5, 5)


def test_a_full_batch_is_continued_by_a_batch_of_its_own() -> None:
    """Rows that do not fit the claimed batch's room open a new batch; the claim ends."""
    rows = [(None, b"v" * 100, 1, 0)] * 3
    (first,) = _encode(rows, 1, Continued(np.zeros((3, 1), np.int64), [None]), batch_size=400)
    assert len(first) == 1
    buffer = first[0].payload
    (second,) = _encode(rows, 1, _held([buffer]), batch_size=400)
    assert [e.first_offset for e in second] == [0] and not buffer.claimed
