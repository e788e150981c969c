"""send_arrow's calls join their records to the batch queued last for each partition while
it is not drained, within batch.size, the records encoded as its next ones where the
accumulator said what they continue (RecordAccumulator.continued) and moved otherwise:
against the scripted network, what a broker would see (one batch per partition per
request, offsets and timestamps as sent, sequences without gaps, every record once and in
order) and what each call's records hear (their own offsets, their own errors), through
Sender rounds between a call's encoding and its queueing and retries of a many-partition
request with errors per partition."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.encoder.columnar import EncodedRecords, can_join, encode_groups
from spark_sink.producer.batch import ProducerBatch, SharedReservation
from spark_sink.protocol.error_codes import InvalidRecordError, NotEnoughReplicasError, NotLeaderOrFollowerError
from spark_sink.protocol.records import RECORD_BATCH_OVERHEAD
from tests.producer.test_sender_scripted import TOPIC, Harness, ack_one_by_one

pytestmark = pytest.mark.skipif(not can_join(), reason="batches are joined by the C extension")


class Calls:
    """send_arrow-like calls queued straight into a Harness's accumulator: each call's rows
    encoded per partition (one batch per partition and call unless batch.size cuts it)."""

    def __init__(self, h: Harness, partitions: int) -> None:
        self.h, self.partitions = h, partitions
        self.sent: dict[int, list[tuple[bytes, int]]] = {p: [] for p in range(partitions)}  # value, timestamp
        self.heard: list[tuple[int, bytes, int, int, Exception | None]] = []  # partition, first value, offset, count, error
        self.calls = 0
        self.plain = 0  # records of send(), one by one (in sent, never heard)

    def call(self, rows: int, rng: random.Random, timestamp: int = 1_000, continued: bool = True,
             rounds_between: int = 0, rounds_before_encoding: int = 0) -> None:
        """One call's rows, at random partitions and timestamps around ``timestamp``;
        ``continued``: encoded as the accumulator says they continue its batches (as
        send_arrow does; else as batches of their own, which no later call joins), with
        ``rounds_before_encoding`` Sender rounds (each answering what is in flight) between
        that and their encoding, ``rounds_between`` between that and their queueing."""
        call = self.start(rows, rng, timestamp, continued)
        self.rounds(rounds_before_encoding)
        call.encode()
        self.rounds(rounds_between)
        call.queue()

    def rounds(self, n: int) -> None:
        """Sender rounds, each answering what is in flight."""
        for _ in range(n):
            self.h.run()
            for request in self.h.in_flight():
                self.h.client.respond_produce(request)

    def start(self, rows: int, rng: random.Random, timestamp: int = 1_000, continued: bool = True) -> Call:
        """A call's rows, told by the accumulator what they continue (its claims made)."""
        return Call(self, rows, rng, timestamp, continued)

    def check_delivered(self, in_call_order: bool = True) -> None:
        """Every partition's log holds its rows once, in order (each call's in its own order
        only, without ``in_call_order``: calls whose steps interleave have none between
        them), and each queued batch heard the offset its first row has there."""
        for p in range(self.partitions):
            log = self.h.client.log.get((TOPIC, p), [])
            got = [(r.value, r.timestamp) for b in log for r in b.records]
            if in_call_order:
                assert got == self.sent[p]
            else:
                assert sorted(got) == sorted(self.sent[p])
                for c in range(self.calls):
                    tag = b"c%d-" % c
                    assert [g for g in got if (g[0] or b"").startswith(tag)] == [
                        x for x in self.sent[p] if x[0].startswith(tag)]
            for batch in log:  # a batch as Kafka's own producers write it
                assert [r.offset - batch.base_offset for r in batch.records] == list(range(len(batch.records)))
                assert batch.base_timestamp == batch.records[0].timestamp
                assert batch.max_timestamp == max(r.timestamp for r in batch.records)
        for p, first, offset, _count, error in self.heard:
            assert error is None
            assert self.h.client.values((TOPIC, p))[offset] == first
        assert sum(count for _, _, _, count, _ in self.heard) == sum(map(len, self.sent.values())) - self.plain
        assert self.h.accumulator.incomplete() == []
        assert self.h.accumulator._pool.available == self.h.accumulator._pool.total


class Call:
    """One send_arrow-like call in its three steps: told what its rows continue (made with
    it: the accumulator's claims), encoded, queued."""

    def __init__(self, calls: Calls, rows: int, rng: random.Random, timestamp: int, continued: bool) -> None:
        self.calls, h, n = calls, calls.h, calls.partitions
        self.parts = np.array([rng.randrange(n) for _ in range(rows)], np.int64)
        self.values = [b"c%d-r%d-" % (calls.calls, i) + bytes(rng.randrange(0, 40)) for i in range(rows)]
        self.stamps = [timestamp + calls.calls + rng.randrange(-3, 200) for _ in range(rows)]
        calls.calls += 1
        for p, v, t in zip(self.parts.tolist(), self.values, self.stamps):
            calls.sent[p].append((v, t))
        self.continued = h.accumulator.continued(TOPIC, range(n)) if continued else None
        self.groups: list | None = None

    def encode(self) -> None:
        h = self.calls.h
        self.groups = encode_groups(None, pa.array(self.values, pa.binary()), np.array(self.stamps, np.int64), None,
                                    self.parts, self.calls.partitions, batch_size=h.config.batch_size,
                                    continued=self.continued)

    def queue(self) -> None:
        calls, groups = self.calls, self.groups
        assert groups is not None
        firsts = {p: [v for q, v in zip(self.parts.tolist(), self.values) if q == p] for p in range(calls.partitions)}
        seen: dict[int, int] = {}  # where each partition's next part starts

        def listener(batch: ProducerBatch, offset: int, count: int, order: float) -> None:
            start = seen.get(batch.partition, 0)
            seen[batch.partition] = start + count
            calls.heard.append((batch.partition, firsts[batch.partition][start], offset, count, batch.error))

        calls.h.accumulator.append_encoded(TOPIC, [(p, b) for p, b in enumerate(groups) if b], calls.h.clock(), 1000,
                                           listener, lambda *counts: None, lambda: None)


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
    assert len(wire) == sum(1 for p in range(64) if calls.sent[p]) == queued  # joined as queued: one per partition
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
            for part in parts:  # as the encoder plans a batch: within both
                assert len(part.records) <= min(batch_size, max_request) or _records(part.records) == 1
            assert sum(len(p.records) for p in parts) <= max_request or len(parts) == 1


def test_joins_stay_within_a_max_request_size_below_batch_size() -> None:
    """max.request.size under batch.size: calls' records join up to it, as the encoder
    plans a batch, not up to batch.size (the Sender would send such a batch alone, over
    the request size the producer was given)."""
    rng = random.Random(7)
    h, calls = _started(1, **{"batch.size": 8000, "max.request.size": 1500})
    for _ in range(12):
        calls.call(10, rng)
    ack_one_by_one(h)
    calls.check_delivered()
    sizes = [len(p.records) for r in h.client.requests if r.api_key == 0
             for t in r.body.topic_data for p in t.partition_data]
    assert len(sizes) > 1 and max(sizes) <= 1500, sizes


def _records(wire: bytes) -> int:
    from spark_sink.protocol.records import decode_record_batches

    (batch,) = decode_record_batches(wire)
    return len(batch.records)


def test_batches_that_fill_batch_size_exactly_are_joined_one_byte_less_is_not() -> None:
    """Two calls of one 50-byte value each to one partition: joined when batch.size is
    the joined batch's size, left apart one byte below."""
    def encoded(h: Harness | None = None, batch_size: int = 1_000_000) -> list[EncodedRecords]:
        return encode_groups(None, pa.array([b"x" * 50]), np.full(1, 7, np.int64), None, None, 1,
                             batch_size=batch_size,
                             continued=h.accumulator.continued(TOPIC, [0]) if h is not None else None)[0]

    joined = 2 * encoded()[0].size_in_bytes - RECORD_BATCH_OVERHEAD  # no delta takes another byte

    def wire_counts(batch_size: int) -> list[int]:
        h, _ = _started(1, **{"batch.size": batch_size, "enable.idempotence": False, "acks": 1})
        for _ in range(2):
            h.accumulator.append_encoded(TOPIC, [(0, encoded(h, batch_size))], h.clock(), 1000, lambda *heard: None,
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
        assert h.client.values(tp) == [v for v, _ in calls.sent[tp[1]]]
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
    h.accumulator.append_encoded(TOPIC, [(0, groups[0])], created, 1000, lambda batch, *_: heard.append(batch),
                                 lambda *counts: None, lambda: None)
    h.clock.advance(h.config.delivery_timeout_ms - 3000 - 20_000)  # 20 s early: the clock also runs
    h.run()
    assert heard == []
    h.clock.advance(20_000)
    h.run()
    (batch,) = heard
    assert "delivery.timeout.ms=120000" in str(batch.error)


@given(counts=st.lists(st.integers(1, 50), min_size=1, max_size=8), base=st.sampled_from([-1, 0, 1234]),
       failed=st.booleans(), order=st.integers(0, 10**6), span=st.sampled_from([1.0, 0.5, 0.125]))
def test_a_joined_batch_tells_each_call_its_records_at_their_own_offsets(counts: list[int], base: int, failed: bool,
                                                                         order: int, span: float) -> None:
    """A batch holding several calls' records tells each call once, in order, at its own
    records' first offset (-1 where the batch has none), with the batch's error, at places
    in the send order between the batch's and the next one's, and only then releases its
    waiters (a listener waiting on its own batch returns at once)."""
    heard: list[tuple[int, int, int, float, Exception | None]] = []

    def listener(i: int):  # type: ignore[no-untyped-def]
        def heard_by(batch: ProducerBatch, offset: int, count: int, at: float) -> None:
            assert batch.wait(0), "a listener waiting on its own batch must not wait for itself"
            heard.append((i, offset, count, at, batch.error))
        return heard_by

    batch = ProducerBatch(TOPIC, 0, 0.0, order, 0, 1 << 20, encoded=EncodedRecords(b"", 0, sum(counts), 0, 0, 0),
                          segments=[x for i, n in enumerate(counts) for x in (listener(i), n)])
    batch.order_span = span
    error = NotEnoughReplicasError("refused") if failed else None
    with ThreadPoolExecutor(2) as pool:
        waiter = pool.submit(batch.wait, 5)
        batch.complete(base if not failed else -1, -1, error)
        assert waiter.result()
    offset = base if not failed else -1
    expected = []
    for i, n in enumerate(counts):
        expected.append((i, offset, n, error))
        if offset >= 0:
            offset += n
    assert [(i, o, n, e) for i, o, n, _, e in heard] == expected
    places = [at for *_, at, _ in heard]
    assert places == sorted(set(places)) and order <= places[0] and places[-1] < order + span
    batch.complete(0, -1, None)  # once only
    assert len(heard) == len(counts)


@pytest.mark.parametrize("seed", range(8))
def test_calls_encoded_as_continuations_with_sender_rounds_between(seed: int) -> None:
    """Calls encoded as the continuation of the batches queued for their partitions, with
    Sender rounds before they are encoded or queued (which drain some of those batches:
    their records then go as a batch of their own), and
    calls not encoded so: every record once, in order, at its timestamp, in batches as
    Kafka's producers write them, within batch.size, each call hearing its own offsets."""
    rng = random.Random(1000 + seed)
    batch_size = rng.choice([600, 2500, 1_000_000])
    h, calls = _started(rng.choice([1, 5, 40]), **{"batch.size": batch_size,
                                                    "max.in.flight.requests.per.connection": rng.choice([1, 5])})
    for _ in range(rng.randrange(3, 9)):
        calls.call(rng.randrange(1, 300), rng, continued=rng.random() < 0.8, rounds_between=rng.choice([0, 0, 1, 2]),
                   rounds_before_encoding=rng.choice([0, 0, 1]))
        if rng.random() < 0.3:
            h.run()
    ack_one_by_one(h)
    calls.check_delivered()
    for request in h.client.requests:
        if request.api_key == 0:
            for part in (p for t in request.body.topic_data for p in t.partition_data):
                assert len(part.records) <= batch_size or _records(part.records) == 1


def test_continued_records_whose_batch_was_drained_go_as_a_batch_of_their_own() -> None:
    """The accumulator says a call's records continue a batch; the Sender drains that batch
    before they are queued: they are moved into a batch of their own (offsets from 0, their
    first timestamp the batch's), never sent as a continuation."""
    h, calls = _started(1, **{"batch.size": 1_000_000})
    rng = random.Random(5)
    calls.call(10, rng)
    calls.call(10, rng, continued=True, rounds_between=1)
    ack_one_by_one(h)
    calls.check_delivered()
    assert [len(b.records) for b in h.client.log[(TOPIC, 0)]] == [10, 10]


def test_a_calls_records_are_written_into_the_batch_they_continue() -> None:
    """No copy: the second call's records land in the RecordBuffer the first call's batch
    was written into (the same object), one batch per partition, as sent."""
    rng = random.Random(11)
    h, calls = _started(6, **{"batch.size": 1_000_000})
    calls.call(60, rng)
    buffers: dict[int, Any] = {p: dq[-1].records for p, dq in h.accumulator._by_topic[TOPIC].items()}
    assert buffers and all(type(b).__name__ == "RecordBuffer" for b in buffers.values())
    calls.call(60, rng)
    for p, dq in h.accumulator._by_topic[TOPIC].items():
        if p in buffers:
            assert len(dq) == 1 and dq[0].records is buffers[p] and not buffers[p].claimed
            assert buffers[p].record_count == len(calls.sent[p])
    ack_one_by_one(h)
    calls.check_delivered()
    assert len(_wire_batches(h)) == sum(1 for p in range(6) if calls.sent[p])


@pytest.mark.parametrize("seed", range(16))
def test_calls_whose_steps_interleave_with_each_other_and_sender_rounds(seed: int) -> None:
    """Several calls at once, each claimed, encoded and queued at random moments between the
    others' steps and Sender rounds (a claimed batch drained before its rows are written,
    or after; another call finding it claimed and queueing a batch after it): against the
    model, every record once, each call's in its order, at the offsets it heard, batches as
    Kafka's producers write them within batch.size, buffer.memory all given back, and no
    buffer left claimed."""
    rng = random.Random(3000 + seed)
    batch_size = rng.choice([700, 4000, 1_000_000])
    h, calls = _started(rng.choice([1, 3, 24]), **{"batch.size": batch_size,
                                                    "max.in.flight.requests.per.connection": rng.choice([1, 5])})
    claimed: list[Call] = []
    encoded: list[Call] = []
    for _ in range(rng.randrange(8, 24)):
        step = rng.random()
        if step < 0.3:
            claimed.append(calls.start(rng.randrange(1, 200), rng, continued=rng.random() < 0.9))
        elif step < 0.5 and claimed:
            call = claimed.pop(rng.randrange(len(claimed)))
            call.encode()
            encoded.append(call)
        elif step < 0.7 and encoded:
            encoded.pop(rng.randrange(len(encoded))).queue()
        else:
            calls.rounds(rng.randrange(1, 3))
    for call in claimed:
        call.encode()
    encoded += claimed
    rng.shuffle(encoded)
    for call in encoded:
        call.queue()
    queued = [b for dq in h.accumulator._batches.values() for b in dq]
    assert not any(getattr(b.records, "claimed", 0) for b in queued)
    ack_one_by_one(h)
    calls.check_delivered(in_call_order=False)
    for request in h.client.requests:
        if request.api_key == 0:
            for part in (p for t in request.body.topic_data for p in t.partition_data):
                assert len(part.records) <= batch_size or _records(part.records) == 1


class PythonPath:
    """The accumulator's Joiner with its queueing left to the Python path whole (its claims
    and sizes kept): what the compiled step is checked against."""

    def __init__(self, joiner: Any) -> None:
        self.claim, self.sizes = joiner.claim, joiner.sizes

    @staticmethod
    def enqueue(queues: Any, groups: list, start: int, *rest: Any) -> int:
        return start


def _reservation(memory: int | SharedReservation) -> tuple[int, int]:
    """A batch's reservation as (bytes, holders)."""
    return (memory, 1) if isinstance(memory, int) else (memory.size, memory.holders)


def _interleaved_run(seed: int, compiled: bool) -> tuple[list, list, list]:
    """test_calls_whose_steps_interleave_with_each_other_and_sender_rounds' random calls and
    rounds for ``seed``, queued by the compiled step or the Python path: what went on the
    wire (per request: partition, base sequence, each record's value and timestamp), what
    each call heard, and each partition's queue at the end of the calls."""
    rng = random.Random(7000 + seed)
    batch_size = rng.choice([700, 4000, 1_000_000])
    h, calls = _started(rng.choice([1, 3, 24, 70]), **{"batch.size": batch_size,
                                                        "max.in.flight.requests.per.connection": rng.choice([1, 5])})
    if not compiled:
        h.accumulator._joiner = PythonPath(h.accumulator._joiner)
    claimed: list[Call] = []
    encoded: list[Call] = []
    for _ in range(rng.randrange(8, 30)):
        step = rng.random()
        if step < 0.3:
            claimed.append(calls.start(rng.randrange(1, 400), rng, continued=rng.random() < 0.9))
        elif step < 0.5 and claimed:
            call = claimed.pop(rng.randrange(len(claimed)))
            call.encode()
            encoded.append(call)
        elif step < 0.75 and encoded:
            encoded.pop(rng.randrange(len(encoded))).queue()
        elif step < 0.85:  # send()'s records, which must not overtake a call's queued before them
            for _ in range(rng.randrange(1, 4)):
                p, value = rng.randrange(calls.partitions), b"s%d" % calls.plain
                h.send(value, partition=p)
                calls.sent[p].append((value, 0))
                calls.plain += 1
        else:
            calls.rounds(rng.randrange(1, 3))
    for call in claimed:
        call.encode()
    for call in encoded + claimed:
        call.queue()
    queues = [(p, [(b.record_count, b.closed, len(b.segments or ()), _reservation(b.memory)) for b in dq])
              for p, dq in sorted(h.accumulator._by_topic.get(TOPIC, {}).items())]
    for _ in range(500):  # many small batches, one request in flight at a time: more rounds than ack_one_by_one's
        h.run()
        if not h.in_flight():
            break
        for request in h.in_flight():
            h.client.respond_produce(request)
    calls.check_delivered(in_call_order=False)
    wire = [[(tp, b.base_sequence, [(r.value, r.timestamp) for r in b.records]) for tp, b in r.batches().items()]
            for r in h.client.requests if r.api_key == 0]
    return wire, calls.heard, queues


@pytest.mark.parametrize("seed", range(12))
def test_the_compiled_hand_over_queues_as_the_python_path_does(seed: int) -> None:
    """The same random calls (claims, encodings and queueings interleaved with each other and
    with Sender rounds, so that some records continue a batch taken meanwhile) queued by the
    Joiner's compiled step and by the Python path alone: the same queues (records, closed,
    calls and reservation per batch), the same requests, byte for byte in their records, the
    same offsets heard, and each against the model."""
    assert _interleaved_run(seed, compiled=True) == _interleaved_run(seed, compiled=False)
