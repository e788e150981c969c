"""``split_records``: a batch's records section cut in two reads back, in two batches with
the batch's base timestamp, as the records it held, in order; the second's offset
deltas start at 0 (a broker refuses any other) and each piece's largest timestamp is its
own. Random records, codecs and cut points (hypothesis), and hand-picked cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.protocol.compression import Codec, compress
from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.records import (
    Record,
    RecordBatch,
    RecordsPiece,
    encode_record_batch,
    encode_records,
    split_records,
)
from spark_sink.protocol.records import decode_record_batches as decode

_BYTES = st.one_of(st.none(), st.binary(max_size=300))
_RECORDS = st.lists(st.builds(
    Record, _BYTES, _BYTES, st.integers(-(10 ** 6), 10 ** 6),
    st.lists(st.tuples(st.text(max_size=8), _BYTES), max_size=3).map(tuple)), min_size=2, max_size=60)


def _batches(records: list[Record], codec: Codec, at: int) -> list[tuple[RecordsPiece, RecordBatch]]:
    base = records[0].timestamp
    section = encode_records(records, base)
    payload = compress(codec, section) if codec else section
    first, second = split_records(payload, len(records), codec, at)
    out = []
    for piece in (first, second):
        batch = encode_record_batch(piece.payload, record_count=piece.record_count,
                                    last_offset_delta=piece.record_count - 1, base_timestamp=base,
                                    max_timestamp=base + piece.max_timestamp_delta, codec=codec)
        (decoded,) = decode(batch)
        out.append((piece, decoded))
    return out


@settings(max_examples=150, deadline=None)
@given(_RECORDS, st.sampled_from(list(Codec)), st.data())
def test_both_pieces_read_back_as_the_records(records: list[Record], codec: Codec, data: st.DataObject) -> None:
    at = data.draw(st.integers(1, len(records) - 1))
    (first, a), (second, b) = _batches(records, codec, at)
    for piece, decoded, expected in ((first, a, records[:at]), (second, b, records[at:])):
        expected = [Record(r.key, r.value, r.timestamp, r.headers) for r in expected]
        assert piece.record_count == len(expected) == len(decoded.records)
        assert [(r.key, r.value, r.timestamp, r.headers) for r in decoded.records] == \
            [(r.key, r.value, r.timestamp, r.headers) for r in expected]
        assert [r.offset for r in decoded.records] == list(range(len(expected)))  # deltas from 0
        assert decoded.max_timestamp == max(r.timestamp for r in expected)
        assert decoded.codec == codec
        assert piece.uncompressed_size == len(encode_records(expected, records[0].timestamp))


def test_a_cut_outside_the_records_and_a_corrupt_section_are_refused() -> None:
    records = [Record(b"k", b"v%d" % i, 1000 + i) for i in range(3)]
    section = encode_records(records, 1000)
    for at in (0, 3):
        with pytest.raises(ValueError, match="cannot cut"):
            split_records(section, 3, 0, at)
    with pytest.raises(CorruptRecordError):
        split_records(section + b"\x00", 3, 0, 1)
    with pytest.raises(CorruptRecordError):
        split_records(section, 4, 0, 1)
