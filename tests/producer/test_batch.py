"""send()'s batches: records are encoded as they are appended, on the short way
(RecordAccumulator.append_plain) or the general one (append), by the compiled
RecordBuffer and append_plain or by Python's (as where kprod's extension is not built);
every way, a sealed batch holds exactly the reference encoder's bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_sink.producer.accumulator import RecordAccumulator
from spark_sink.producer.batch import PlainAppender, PyRecordBuffer, RecordBuffer, headers_size
from spark_sink.producer.buffer_pool import BufferPool
from spark_sink.producer.config import ProducerConfig
from spark_sink.protocol.compression import Codec, decompress
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD, Record, decode_record_batches, encode_records

BASE = 1_700_000_000_000


@pytest.fixture(scope="module", params=[True, False], ids=["compiled", "python"])
def compiled(request: pytest.FixtureRequest) -> bool:
    if request.param and PlainAppender is None:
        pytest.fail("kprod's extension (spark_sink/encoder/_kernels.c) is not built: make venv builds it")
    return request.param


def _accumulator(batch_size: int, compiled: bool) -> RecordAccumulator:
    config = ProducerConfig.from_dict({"bootstrap.servers": "localhost:9092", "batch.size": batch_size})
    acc = RecordAccumulator(config, BufferPool(config.buffer_memory), compiled)
    # Which way the records go: the compiled append_plain is a C function, not a method.
    assert (type(acc.append_plain).__name__ == "builtin_function_or_method") == compiled
    assert acc._record_buffer is (RecordBuffer if compiled else PyRecordBuffer)
    return acc


def _append_all(acc: RecordAccumulator, records: list[Record]) -> int:
    """Append as send() does: the short way when it can, else append(); returns how many
    records took the short way."""
    short = 0
    for r in records:
        key_size = len(r.key) if r.key is not None else 0
        value_size = len(r.value) if r.value is not None else 0
        future = None
        if not r.headers and type(r.key) is bytes and type(r.value) is bytes:
            future = acc.append_plain("t", 0, r.timestamp, r.key, r.value, None, key_size, value_size)
            short += future is not None
        if future is None:
            acc.append("t", 0, r.timestamp, r.key, r.value, headers=list(r.headers) or None, callback=None,
                       key_size=key_size, value_size=value_size, headers_size=headers_size(r.headers),
                       max_block_ms=1000)
    return short


def _check_batches(acc: RecordAccumulator, records: list[Record], batch_size: int, codec: int = 0) -> None:
    batches = acc.abort_undrained()
    pos = 0
    for batch in batches:
        encoded = batch.seal(codec)
        chunk = records[pos:pos + encoded.record_count]
        section = decompress(codec, encoded.payload) if codec else encoded.payload
        assert section == encode_records(chunk, chunk[0].timestamp)
        assert encoded.uncompressed_size == len(section)
        assert (encoded.base_timestamp, encoded.max_timestamp) == (chunk[0].timestamp, max(r.timestamp for r in chunk))
        # A batch is as full as batch.size allows (one record may exceed it alone), and
        # its size was known exactly before it was sealed.
        assert encoded.record_count == 1 or RECORD_BATCH_OVERHEAD + len(section) <= batch_size
        following = encode_records(records[pos + encoded.record_count:][:1], 0)
        assert pos + encoded.record_count == len(records) or \
            RECORD_BATCH_OVERHEAD + len(section) + len(following) > batch_size
        pos += encoded.record_count
    assert pos == len(records)


# Keys present, absent or mixed; values near the 16 KiB edge of the lookup tables; timestamp
# deltas up to past 16 s, negative ones too; headers now and then.
_records_st = st.lists(
    st.builds(
        Record,
        key=st.none() | st.binary(max_size=20),
        value=st.none() | st.binary(max_size=120) | st.integers(16_370, 16_400).map(lambda n: b"v" * n),
        timestamp=st.integers(-3, 16_400).map(lambda d: BASE + d),
        headers=st.just(()) | st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)),
                                       max_size=2).map(tuple),
    ),
    min_size=1, max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_records_st, st.sampled_from([200, 1000, 16384, 100_000]))
def test_batches_hold_the_reference_bytes_whichever_way_records_came(compiled: bool, records: list[Record],
                                                                     batch_size: int) -> None:
    acc = _accumulator(batch_size, compiled)
    _append_all(acc, records)
    _check_batches(acc, records, batch_size)


@pytest.mark.parametrize("codec", [Codec.NONE, Codec.LZ4, Codec.ZSTD])
def test_a_batch_of_over_16384_records_keeps_the_short_way(compiled: bool, codec: Codec) -> None:
    # Offset deltas from 16,384 on are three varint bytes: past the lookup table.
    records = [Record(b"k%d" % (i % 7), b"v" * (i % 30), BASE + i // 1000) for i in range(40_000)]
    acc = _accumulator(1_000_000, compiled)
    short = _append_all(acc, records)
    counts = [b.record_count for b in acc.abort_undrained()]
    assert max(counts) > 16384 and short == len(records) - len(counts)  # all but each batch's first record
    acc = _accumulator(1_000_000, compiled)
    _append_all(acc, records)
    _check_batches(acc, records, 1_000_000, codec)


def test_a_sealed_batch_decodes_to_its_records(compiled: bool) -> None:
    records = [Record(b"key", b"value", BASE), Record(None, b"x" * 20_000, BASE + 5, (("h", b"1"),)),
               Record(b"", b"", BASE - 2), Record(b"k", None, BASE + 1)]
    acc = _accumulator(1_000_000, compiled)
    _append_all(acc, records)
    (batch,) = acc.abort_undrained()
    batch.seal(Codec.NONE)
    header, payload = batch.to_wire()
    (decoded,) = decode_record_batches(header + payload)
    assert [(r.key, r.value, r.timestamp, r.headers) for r in decoded.records] == [
        (r.key, r.value, r.timestamp, r.headers) for r in records]
