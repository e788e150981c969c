"""merge_sections joins consecutive records sections of one partition into the bytes the
row-wise reference encoder writes for all their records as one batch."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.encoder.columnar import can_merge, merge_sections
from spark_sink.protocol.records import Record, encode_records

pytestmark = pytest.mark.skipif(not can_merge(), reason="merge_sections is the C extension's")

records_st = st.lists(
    st.builds(Record, st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=300),
              st.integers(0, 2**42), st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=5)),
                                              max_size=2).map(tuple)),
    min_size=1, max_size=40)


def _merged(records: list[Record], cuts: list[int]) -> bytes:
    pieces = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)]) if a < b]
    return merge_sections([encode_records(p, p[0].timestamp) for p in pieces], [len(p) for p in pieces],
                          [p[0].timestamp for p in pieces])


@settings(max_examples=150, deadline=None)
@given(records_st, st.lists(st.integers(1, 39), max_size=6))
def test_merged_sections_are_the_reference_encoding_of_all_records(records: list[Record], cuts: list[int]) -> None:
    # Timestamps in any order: a later section's base may lie before the first one's.
    cuts = sorted(c for c in set(cuts) if c < len(records))
    assert _merged(records, cuts) == encode_records(records, records[0].timestamp)


def test_many_sections_whose_deltas_grow_past_a_varint_byte() -> None:
    """Offsets past 63 and 8191 and timestamp deltas of days take more varint bytes."""
    rng = random.Random(55)
    records = [Record(b"k%d" % i, bytes(rng.randrange(0, 150)), 1_700_000_000_000 + rng.randrange(-10**9, 10**9))
               for i in range(9000)]
    cuts = sorted(rng.sample(range(1, len(records)), 40))
    assert _merged(records, cuts) == encode_records(records, records[0].timestamp)


def test_one_section_comes_back_as_it_was() -> None:
    section = encode_records([Record(b"k", b"v", 5)], 5)
    assert merge_sections([memoryview(section)], [1], [5]) == section


@pytest.mark.parametrize("payload", [b"\x7f", b"\x06\x00\x00", b"\x02\x00\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"])
def test_a_payload_that_is_not_whole_records_is_refused(payload: bytes) -> None:
    good = encode_records([Record(None, b"v", 1)], 1)
    with pytest.raises(ValueError, match="not a records section of whole records"):
        merge_sections([good, payload], [1, 1], [1, 1])


def test_arguments_that_do_not_match_are_refused() -> None:
    with pytest.raises(ValueError, match="one count and base timestamp per payload"):
        merge_sections([b""], [1, 2], [0])
    with pytest.raises(ValueError, match="at least one"):
        merge_sections([], [], [])
