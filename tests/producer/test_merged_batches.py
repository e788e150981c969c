"""Encoded batches (send_arrow's) queued one behind another for a partition are joined as
they are drained, within batch.size and the request's room: against the scripted network,
what a broker would see (one batch per partition per request, sequences without gaps,
every record once and in order) and what each call's batches hear (their own offsets,
their own errors), through retries of a many-partition request with errors per partition."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.client.errors import KafkaTimeoutError
from spark_sink.encoder.columnar import EncodedRecords, can_merge, encode_groups
from spark_sink.producer.batch import ProducerBatch
from spark_sink.protocol.error_codes import InvalidRecordError, NotEnoughReplicasError, NotLeaderOrFollowerError
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD
from tests.producer.test_sender_scripted import TOPIC, Harness, ack_one_by_one

pytestmark = pytest.mark.skipif(not can_merge(), reason="batches are joined by the C extension")


class Calls:
    """send_arrow-like calls queued straight into a Harness's accumulator: each call's rows
    encoded per partition (one batch per partition and call unless batch.size cuts it)."""

    def __init__(self, h: Harness, partitions: int) -> None:
        self.h, self.partitions = h, partitions
        self.sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        self.heard: list[tuple[int, bytes, int, int, Exception | None]] = []  # partition, first value, offset, count, error
        self.calls = 0

    def call(self, rows: int, rng: random.Random, timestamp: int = 1_000) -> None:
        parts = np.array([rng.randrange(self.partitions) for _ in range(rows)], np.int64)
        values = [b"c%d-r%d-" % (self.calls, i) + bytes(rng.randrange(0, 40)) for i in range(rows)]
        self.calls += 1
        for p, v in zip(parts.tolist(), values):
            self.sent[p].append(v)
        groups = encode_groups(None, pa.array(values, pa.binary()), np.full(rows, timestamp + self.calls, np.int64),
                               None, parts, self.partitions, batch_size=self.h.config.batch_size)
        firsts = {p: [v for q, v in zip(parts.tolist(), values) if q == p] for p in range(self.partitions)}

        def listener(batch: ProducerBatch, firsts: dict[int, list[bytes]] = firsts,
                     seen: dict[int, int] = {}) -> None:  # noqa: B006  (per call: where each partition's next batch starts)
            start = seen.get(batch.partition, 0)
            seen[batch.partition] = start + batch.record_count
            self.heard.append((batch.partition, firsts[batch.partition][start], batch.base_offset, batch.record_count,
                               batch.error))

        self.h.accumulator.append_encoded(TOPIC, [(p, b) for p, b in enumerate(groups) if b], self.h.clock(), 1000,
                                          listener, lambda *counts: None, lambda: None)

    def check_delivered(self) -> None:
        """Every partition's log holds its rows once, in order, and each queued batch heard
        the offset its first row has there."""
        for p in range(self.partitions):
            assert self.h.client.values((TOPIC, p)) == self.sent[p]
        for p, first, offset, _count, error in self.heard:
            assert error is None
            assert self.h.client.values((TOPIC, p))[offset] == first
        assert sum(count for _, _, _, count, _ in self.heard) == sum(map(len, self.sent.values()))
        assert self.h.accumulator.incomplete() == []
        assert self.h.accumulator._pool.available == self.h.accumulator._pool.total


def _started(partitions: int, **config: object) -> tuple[Harness, Calls]:
    """A Harness whose producer has its id, with nothing in flight."""
    h = Harness(leaders=[p % 2 for p in range(partitions)], nodes=2, settings=config)
    h.run()
    return h, Calls(h, partitions)


def _wire_batches(h: Harness) -> list[tuple[int, tuple[str, int], int, int]]:
    """(correlation id, partition, base sequence, records) of each batch on the wire."""
    return [(r.correlation_id, tp, b.base_sequence, len(b.records)) for r in h.client.requests
            if r.api_key == 0 for tp, b in r.batches().items()]


@pytest.mark.parametrize("seed", range(6))
def test_many_partitions_queued_calls_go_as_one_batch_each(seed: int) -> None:
    rng = random.Random(seed)
    h, calls = _started(64, **{"batch.size": 1_000_000, "max.in.flight.requests.per.connection": 5})
    for _ in range(rng.randrange(2, 6)):
        calls.call(rng.randrange(200, 2000), rng)
    queued = sum(len(dq) for dq in h.accumulator._batches.values())
    ack_one_by_one(h)
    calls.check_delivered()
    wire = _wire_batches(h)
    assert len(wire) == sum(1 for p in range(64) if calls.sent[p]) < queued  # one batch per partition
    for tp in {tp for _, tp, _, _ in wire}:  # sequences without gaps, in order
        mine = [(seq, n) for _, t, seq, n in wire if t == tp]
        assert [s for s, _ in mine] == list(np.cumsum([0] + [n for _, n in mine])[:-1])


@pytest.mark.parametrize("seed", range(4))
def test_a_merged_batch_stays_within_batch_size_and_the_requests_room(seed: int) -> None:
    rng = random.Random(100 + seed)
    batch_size = rng.randrange(300, 3000)
    max_request = rng.randrange(batch_size // 2, 3 * batch_size)
    h, calls = _started(8, **{"batch.size": batch_size, "max.request.size": max_request})
    for _ in range(6):
        calls.call(rng.randrange(20, 120), rng)
    ack_one_by_one(h)
    calls.check_delivered()
    for request in h.client.requests:
        if request.api_key == 0:
            parts = [p for t in request.body.topic_data for p in t.partition_data]
            for part in parts:
                assert len(part.records) <= batch_size or _records(part.records) == 1
            assert sum(len(p.records) for p in parts) <= max_request or len(parts) == 1


def _records(wire: bytes) -> int:
    from spark_sink.protocol.records import decode_record_batches

    (batch,) = decode_record_batches(wire)
    return len(batch.records)


def test_batches_that_fill_batch_size_exactly_are_joined_one_byte_less_is_not() -> None:
    """Two calls of one 50-byte value each to one partition: joined when batch.size is
    the joined batch's size with room for its growth bound (each moved record's deltas may
    take more bytes), left apart one byte below."""
    def encoded() -> list[EncodedRecords]:
        return encode_groups(None, pa.array([b"x" * 50]), np.full(1, 7, np.int64), None, None, 1,
                             batch_size=1_000_000)[0]

    one = encoded()[0].size_in_bytes
    joined = 2 * one - RECORD_BATCH_OVERHEAD + 2 * 1  # two records may each grow by (1 + 1 - 1) bytes

    def wire_counts(batch_size: int) -> list[int]:
        h, _ = _started(1, **{"batch.size": batch_size, "enable.idempotence": False, "acks": 1})
        for _ in range(2):
            h.accumulator.append_encoded(TOPIC, [(0, encoded())], h.clock(), 1000, lambda b: None,
                                         lambda *counts: None, lambda: None)
        ack_one_by_one(h)
        assert h.client.values((TOPIC, 0)) == [b"x" * 50] * 2
        return [n for _, _, _, n in _wire_batches(h)]

    assert wire_counts(joined) == [2]
    assert wire_counts(joined - 1) == [1, 1]


def test_a_many_partition_request_retried_with_errors_per_partition() -> None:
    """One request of merged batches for 32 partitions: some refused retriably (each
    retried as the same batch, same sequence, alone or with others), one refused for good
    (its calls' batches hear the error, the others do not); memory all given back."""
    rng = random.Random(7)
    h, calls = _started(32, **{"batch.size": 1_000_000, "retries": 3})
    for _ in range(3):
        calls.call(600, rng)
    h.run()
    requests = h.in_flight()
    assert requests and all(len(r.batches()) > 1 for r in requests)
    first = requests[0]
    tps = sorted(first.batches())
    retriable = {tp: rng.choice([NotLeaderOrFollowerError, NotEnoughReplicasError]) for tp in tps[1::2]}
    failed = tps[0]
    before = {tp: (b.base_sequence, [r.value for r in b.records]) for tp, b in first.batches().items()}
    h.client.respond_produce(first, {**retriable, failed: InvalidRecordError})
    ack_one_by_one(h)
    # each retried batch went again whole, with its sequence
    for tp in retriable:
        again = [b for r in h.client.requests[1:] if r.api_key == 0 and r is not first
                 for t, b in r.batches().items() if t == tp]
        assert (again[0].base_sequence, [r.value for r in again[0].records]) == before[tp]
        assert h.client.values(tp) == calls.sent[tp[1]]
    heard_failed = [h_ for h_ in calls.heard if h_[0] == failed[1]]
    assert heard_failed and all(isinstance(e, InvalidRecordError) and off == -1 for _, _, off, _, e in heard_failed)
    assert sum(n for _, _, _, n, _ in heard_failed) == len(before[failed][1])
    assert all(e is None for p, _, _, _, e in calls.heard if p != failed[1])
    assert h.accumulator.incomplete() == []
    assert h.accumulator._pool.available == h.accumulator._pool.total


def test_compressed_batches_are_not_joined() -> None:
    h, calls = _started(4, **{"batch.size": 1_000_000, "compression.type": "gzip"})
    rng = random.Random(3)
    for _ in range(3):
        calls.call(100, rng)
    queued = sum(len(dq) for dq in h.accumulator._batches.values())
    ack_one_by_one(h)
    assert len(_wire_batches(h)) == queued
    calls.check_delivered()


def test_a_batch_created_before_the_last_look_for_expired_ones_still_expires_on_time() -> None:
    """The accumulator looks through its partitions for expired batches only once one may
    have expired; a batch queued after a look but created before it (send_arrow reads the
    clock before it encodes) moves the next look forward to when it expires."""
    h = Harness(leaders=[-1])  # no leader: nothing is ever sent
    h.run()  # a look: nothing queued
    created = h.clock() - 3000
    groups = encode_groups(None, pa.array([b"v"]), np.zeros(1, np.int64), None, None, 1, batch_size=16384)
    heard: list = []
    h.accumulator.append_encoded(TOPIC, [(0, groups[0])], created, 1000, heard.append, lambda *counts: None, lambda: None)
    h.clock.advance(h.config.delivery_timeout_ms - 3000 - 20_000)  # 20 s early: the clock also runs
    h.run()
    assert heard == []
    h.clock.advance(20_000)
    h.run()
    (batch,) = heard
    assert "delivery.timeout.ms=120000" in str(batch.error)


def _parts(counts: list[int], heard: list[tuple[int, int, int, Exception | None]]) -> list[ProducerBatch]:
    """Encoded batches of one partition, each telling ``heard`` (its index, offset, records,
    error) when it completes."""
    def listener(batch: ProducerBatch) -> None:
        assert batch.wait(0), "a listener waiting on its own batch must not wait for itself"
        heard.append((int(batch.order), batch.base_offset, batch.record_count, batch.error))

    return [ProducerBatch(TOPIC, 0, 0.0, i, 0, 1 << 20, encoded=EncodedRecords(b"", 0, n, 0, 0, 0), listener=listener)
            for i, n in enumerate(counts)]


@given(counts=st.lists(st.integers(1, 50), min_size=2, max_size=8), done_before=st.sets(st.integers(0, 7)),
       base=st.sampled_from([-1, 0, 1234]), failed=st.booleans())
def test_a_merged_batch_completes_each_part_once_at_its_own_offset(counts: list[int], done_before: set[int],
                                                                    base: int, failed: bool) -> None:
    """A merged batch's completion tells each part's listener once, at the part's own
    offset (-1 where the batch has none), with the batch's error, and releases its waiters;
    a part completed before (failed by a closing producer while its merged batch was on the
    wire) is left as it was, and the offsets of the parts after it still count its records."""
    heard: list[tuple[int, int, int, Exception | None]] = []
    parts = _parts(counts, heard)
    early = KafkaTimeoutError("failed first")
    for i in sorted(done_before):
        if i < len(parts):
            parts[i].complete(-1, -1, early)
    merged = ProducerBatch.merged(parts, sum(counts), 0)
    error = NotEnoughReplicasError("refused") if failed else None
    with ThreadPoolExecutor(len(parts)) as pool:
        waiters = [pool.submit(p.wait, 5) for p in parts]  # record by record, from other threads
        merged.complete(base if not failed else -1, -1, error)
        assert all(w.result() for w in waiters)
    expected: list[tuple[int, int, int, Exception | None]] = []
    offset = base if not failed else -1
    for i, n in enumerate(counts):
        if i in done_before:
            expected.append((i, -1, n, early))
        else:
            expected.append((i, offset, n, error))
        if offset >= 0:
            offset += n
    assert sorted(heard, key=lambda h: h[0]) == expected
    assert [h[0] for h in heard if h[0] not in done_before] == [i for i in range(len(counts)) if i not in done_before]
    assert all(p.completed and p.wait(0) for p in parts) and merged.completed
