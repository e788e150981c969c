"""Transactions against a model, on Apache Kafka: hypothesis picks random sequences of
init, begin, send, send_arrow, send_offsets, commit, abort (empty transactions included),
prepare-then-end-by-AdminClient, fencing by a second producer with the same id, and
connection cuts through the fault proxy. The model says what must be visible; after each
sequence a read_committed consumer must see exactly the committed records, in send order
per partition, and the group exactly the committed offsets.

The suite runs a few sequences; ``KPROD_SOAK=N`` (``make soak``) runs N. A failure found is
shrunk by hypothesis and kept below as a test of its own.
"""

from __future__ import annotations

import itertools
import os

import pyarrow as pa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from spark_sink.producer import AdminClient, KafkaProducer, ProducerRecord
from tests.brokers import consume_all, create_topic, unique_topic

PARTITIONS = 2
SOAK = int(os.environ.get("KPROD_SOAK", "0"))
_counter = itertools.count()


def _machine(bootstrap: str, proxied: str, proxy) -> type[RuleBasedStateMachine]:
    class Transactions(RuleBasedStateMachine):
        """One transactional id; the model: committed values per partition, committed
        offsets, and what the open transaction holds."""

        @initialize()
        def setup(self) -> None:
            self.topic = create_topic(bootstrap, unique_topic("model"), partitions=PARTITIONS)
            self.group = unique_topic("group")
            self.tid = unique_topic("tid")
            self.admin = AdminClient({"bootstrap.servers": bootstrap})
            self.committed: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            self.offsets: dict[int, int] = {}
            self.pending: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            self.pending_offsets: dict[int, int] = {}
            self.producers: list[KafkaProducer] = []
            self.producer = self._new_producer(proxied)
            self.open = False

        def _new_producer(self, where: str) -> KafkaProducer:
            p = KafkaProducer({"bootstrap.servers": where, "transactional.id": self.tid, "linger.ms": 0,
                               "retry.backoff.ms": 20})
            self.producers.append(p)
            p.init_transactions()
            return p

        def _value(self) -> bytes:
            return b"v%d" % next(_counter)

        @precondition(lambda self: not self.open)
        @rule()
        def begin(self) -> None:
            self.producer.begin_transaction()
            self.open = True
            self.pending = {p: [] for p in range(PARTITIONS)}
            self.pending_offsets = {}

        @precondition(lambda self: self.open)
        @rule(partition=st.integers(0, PARTITIONS - 1), n=st.integers(1, 20))
        def send(self, partition: int, n: int) -> None:
            for _ in range(n):
                value = self._value()
                self.producer.send(ProducerRecord(self.topic, value, partition=partition))
                self.pending[partition].append(value)

        @precondition(lambda self: self.open)
        @rule(partition=st.integers(0, PARTITIONS - 1), n=st.integers(1, 200))
        def send_arrow(self, partition: int, n: int) -> None:
            values = [self._value() for _ in range(n)]
            self.producer.send_arrow(pa.table({"value": values, "partition": pa.array([partition] * n, pa.int32())}),
                                     self.topic)
            self.pending[partition].extend(values)

        @precondition(lambda self: self.open)
        @rule(partition=st.integers(0, PARTITIONS - 1), offset=st.integers(0, 1000))
        def send_offsets(self, partition: int, offset: int) -> None:
            self.producer.send_offsets_to_transaction({(self.topic, partition): offset}, self.group)
            self.pending_offsets[partition] = offset

        def _ended(self, commit: bool) -> None:
            if commit:
                for p, values in self.pending.items():
                    self.committed[p].extend(values)
                self.offsets.update(self.pending_offsets)
            self.open = False

        @precondition(lambda self: self.open)
        @rule()
        def commit(self) -> None:
            self.producer.commit_transaction()
            self._ended(True)
            self._check_offsets()

        @precondition(lambda self: self.open)
        @rule(flush=st.booleans())
        def abort(self, flush: bool) -> None:
            if flush:  # written, then aborted: read_committed must skip them
                self.producer.flush()
            self.producer.abort_transaction()  # else never sent: not in the next one either
            self._ended(False)
            self._check_offsets()

        @precondition(lambda self: self.open)
        @rule(commit=st.booleans())
        def prepare_and_end_elsewhere(self, commit: bool) -> None:
            prepared = self.producer.prepare_transaction()
            if prepared is not None:
                self.admin.end_transactions([prepared], commit=commit)
            self._ended(commit)
            self.producer.init_transactions()  # to go on after another process ended it

        @rule()
        def fence(self) -> None:
            """A second producer with the same id: the first's open transaction is aborted
            and the first can only be closed."""
            newer = self._new_producer(bootstrap)
            self.producer.close(0)
            self.producer = newer
            self._ended(False)

        @precondition(lambda self: self.open)
        @rule()
        def cut_connections(self) -> None:
            proxy.cut_all()

        def _check_offsets(self) -> None:
            tps = [(self.topic, p) for p in range(PARTITIONS)]
            got = self.admin.committed_offsets({self.group: tps})[self.group]
            assert {tp[1]: o for tp, (o, _) in got.items() if o >= 0} == self.offsets

        def teardown(self) -> None:
            try:
                if getattr(self, "open", False):
                    self.producer.abort_transaction()
                    self._ended(False)
                if hasattr(self, "topic"):
                    self._check_offsets()
                    expected = sum(len(v) for v in self.committed.values())
                    messages = consume_all(bootstrap, self.topic, expected, settle=0.5,
                                           overrides={"isolation.level": "read_committed"})
                    seen = {p: [m.value() for m in messages if m.partition() == p] for p in range(PARTITIONS)}
                    assert seen == self.committed
            finally:
                for p in getattr(self, "producers", []):
                    p.close(0)
                if hasattr(self, "admin"):
                    self.admin.close()

    return Transactions


def test_transactions_match_the_model(kafka, kafka_proxy):
    machine = _machine(kafka.bootstrap, kafka_proxy.bootstrap, kafka_proxy.proxy)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=SOAK or 6, stateful_step_count=12, deadline=None, database=None, derandomize=not SOAK,
        suppress_health_check=list(HealthCheck)))


# -- sequences the model found, kept as they were shrunk --------------------------


def _replay(kafka, kafka_proxy, *steps: tuple) -> None:
    """Run one sequence of the model's steps, ``(rule, {argument: value})`` each."""
    machine = _machine(kafka.bootstrap, kafka_proxy.bootstrap, kafka_proxy.proxy)()
    machine.setup()
    try:
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
    finally:
        machine.teardown()


def test_unflushed_records_of_an_aborted_transaction_stay_out_of_the_next(kafka, kafka_proxy):
    """The first records must be failed by the abort, not sent in the next transaction."""
    _replay(kafka, kafka_proxy, ("begin", {}), ("send", {"partition": 0, "n": 3}), ("abort", {"flush": False}),
            ("begin", {}), ("send", {"partition": 0, "n": 1}), ("commit", {}))


def test_aborted_offsets_then_a_committed_transaction(kafka, kafka_proxy):
    """The offsets of the aborted transaction were committed by the next one (fixed with
    empty transactions)."""
    _replay(kafka, kafka_proxy, ("begin", {}), ("send_offsets", {"partition": 0, "offset": 5}),
            ("abort", {"flush": True}), ("begin", {}), ("send", {"partition": 1, "n": 1}), ("commit", {}))
