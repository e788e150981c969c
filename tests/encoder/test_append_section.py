"""RecordBuffer.append_section joins consecutive records sections of one partition into the
bytes the row-wise reference encoder writes for all their records as one batch, and
refuses what would take the batch past its limit."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.encoder.columnar import can_join
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD, Record, encode_records

pytestmark = pytest.mark.skipif(not can_join(), reason="append_section is the C extension's")

records_st = st.lists(
    st.builds(Record, st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=300),
              st.integers(0, 2**42), st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=5)),
                                              max_size=2).map(tuple)),
    min_size=1, max_size=40)


def _buffer():  # type: ignore[no-untyped-def]
    from spark_sink.encoder._kernels import RecordBuffer

    return RecordBuffer(1 << 20)


def _joined(records: list[Record], cuts: list[int], limit: int = 1 << 40):  # type: ignore[no-untyped-def]
    """A RecordBuffer with the pieces between ``cuts`` appended as sections, and how many
    were taken before the first one refused."""
    pieces = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)]) if a < b]
    buffer, taken = _buffer(), 0
    for p in pieces:
        if not buffer.append_section(encode_records(p, p[0].timestamp), len(p), p[0].timestamp,
                                     max(r.timestamp for r in p), limit):
            break
        taken += len(p)
    return buffer, taken


@settings(max_examples=150, deadline=None)
@given(records_st, st.lists(st.integers(1, 39), max_size=6))
def test_joined_sections_are_the_reference_encoding_of_all_records(records: list[Record], cuts: list[int]) -> None:
    # Timestamps in any order: a later section's base may lie before the first one's.
    cuts = sorted(c for c in set(cuts) if c < len(records))
    buffer, _ = _joined(records, cuts)
    reference = encode_records(records, records[0].timestamp)
    assert (buffer.record_count, buffer.base_timestamp, buffer.max_timestamp, buffer.estimated_size) == (
        len(records), records[0].timestamp, max(r.timestamp for r in records), RECORD_BATCH_OVERHEAD + len(reference))
    assert bytes(buffer.take()) == reference


@settings(max_examples=100, deadline=None)
@given(records_st, st.lists(st.integers(1, 39), max_size=6), st.integers(0, 3000))
def test_a_section_that_would_pass_the_limit_is_refused_whole(records: list[Record], cuts: list[int],
                                                               limit: int) -> None:
    """The first section always goes in; a later one only if the batch, header included,
    stays within the limit; a refused one leaves the buffer as it was."""
    cuts = sorted(c for c in set(cuts) if c < len(records))
    buffer, held = _buffer(), 0
    for a, b in zip([0, *cuts], [*cuts, len(records)]):
        piece = records[a:b]
        fits = RECORD_BATCH_OVERHEAD + len(encode_records(records[:b], records[0].timestamp)) <= limit
        added = buffer.append_section(encode_records(piece, piece[0].timestamp), len(piece), piece[0].timestamp,
                                      max(r.timestamp for r in piece), limit)
        assert bool(added) == (fits or a == 0)
        if not added:
            break
        held = b
    assert buffer.record_count == held
    assert bytes(buffer.take()) == encode_records(records[:held], records[0].timestamp)


def test_many_sections_whose_deltas_grow_past_a_varint_byte() -> None:
    """Offsets past 63 and 8191 and timestamp deltas of days take more varint bytes."""
    rng = random.Random(55)
    records = [Record(b"k%d" % i, bytes(rng.randrange(0, 150)), 1_700_000_000_000 + rng.randrange(-10**9, 10**9))
               for i in range(9000)]
    cuts = sorted(rng.sample(range(1, len(records)), 40))
    buffer, _ = _joined(records, cuts)
    assert bytes(buffer.take()) == encode_records(records, records[0].timestamp)


@pytest.mark.parametrize("payload", [b"\x7f", b"\x06\x00\x00", b"\x02\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"])
def test_a_payload_that_is_not_whole_records_is_refused(payload: bytes) -> None:
    buffer = _buffer()
    buffer.append_section(encode_records([Record(None, b"v", 1)], 1), 1, 1, 1, 1 << 20)
    with pytest.raises(ValueError, match="not a records section of whole records"):
        buffer.append_section(payload, 1, 1, 1, 1 << 20)
    assert buffer.record_count == 1


def test_no_section_after_take() -> None:
    buffer = _buffer()
    section = encode_records([Record(None, b"v", 1)], 1)
    buffer.append_section(section, 1, 1, 1, 1 << 20)
    assert bytes(buffer.take()) == section
    with pytest.raises(BufferError):
        buffer.append_section(section, 1, 1, 1, 1 << 20)
