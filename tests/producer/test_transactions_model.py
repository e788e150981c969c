"""Transactions against a model, on Apache Kafka: hypothesis picks random sequences of
init, begin, send, send_arrow, send_offsets, commit, abort (empty transactions included),
prepare-then-end-by-AdminClient, fencing by a second producer with the same id, and
connection cuts through the fault proxy. The model says what must be visible; after each
sequence a read_committed consumer must see exactly the committed records, in send order
per partition, and the group exactly the committed offsets.

On three nodes the same machine also SIGKILLs the node coordinating its transactional id
at random steps and restarts it some steps later: the producer and the AdminClient must
find the new coordinator within their timeouts. A call that outlasts max.block.ms while
the coordinator is away raises KafkaTimeoutError and is retried, as Kafka's producer
documents; the transaction's outcome is then what the retried call gives.

The suite runs a few sequences; ``KPROD_SOAK=N`` (``make soak``) runs N. A failure found is
shrunk by hypothesis and kept below as a test of its own.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.producer import KafkaProducer, KafkaTimeoutError, ProducerRecord
from tests.brokers import consume_all, create_topic, unique_topic
from tests.failover import FAILOVER_CONFIG, transaction_coordinator, wait_in_sync
from tests.faultproxy import FaultProxy

if TYPE_CHECKING:
    from tests.conftest import ProxiedKafka, ProxiedKafka3

PARTITIONS = 2
_END = b"end"  # the plain record a sequence's check reads up to
SOAK = int(os.environ.get("KPROD_SOAK", "0"))
_counter = itertools.count()
T = TypeVar("T")

# On three nodes: retries outlast a coordinator's move, while max.block.ms does not, so
# that calls time out and are retried too. A killed node is fenced 2.5 to 3 s after the
# kill (its last heartbeat, every 0.5 s, plus 3 s): a call made at the kill times out.
FAILOVER_PRODUCER: dict[str, object] = {**FAILOVER_CONFIG, "linger.ms": 0, "max.block.ms": 1500}
TIMEOUT_RETRIES = 40  # a move takes seconds: 60 s of calls are far more than it needs


class ModelMachine(RuleBasedStateMachine):
    """What a replay drives of the machines :func:`_machine` makes."""

    timeouts = 0  # calls retried after KafkaTimeoutError

    def setup(self) -> None:
        raise NotImplementedError


def _machine(bootstrap: str, proxied: str, proxies: Sequence[FaultProxy],
             cluster: KafkaCluster | None = None) -> type[ModelMachine]:
    """The machine on the node(s) at ``bootstrap``; with ``cluster`` (three nodes) it also
    kills the transaction coordinator's node."""
    class Transactions(ModelMachine):
        """One transactional id; the model: committed values per partition, committed
        offsets, and what the open transaction holds."""

        producer_config: dict[str, object] = {"linger.ms": 0, "retry.backoff.ms": 20}
        retry_timeouts = False  # one node, no kills: a call that times out is a failure

        @initialize()
        def setup(self) -> None:
            name = unique_topic("model")
            self.topic = (cluster.create_topic(name, PARTITIONS) if cluster is not None
                          else create_topic(bootstrap, name, partitions=PARTITIONS))
            self.group = unique_topic("group")
            self.tid = unique_topic("tid")
            self.admin = AdminClient({"bootstrap.servers": bootstrap})
            self.committed: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            self.offsets: dict[int, int] = {}
            self.pending: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
            self.pending_offsets: dict[int, int] = {}
            self.producers: list[KafkaProducer] = []
            self.timeouts = 0  # calls retried after KafkaTimeoutError
            self.producer = self._new_producer(proxied)
            self.open = False

        def _new_producer(self, where: str) -> KafkaProducer:
            p = KafkaProducer({**self.producer_config, "bootstrap.servers": where, "transactional.id": self.tid})
            self.producers.append(p)
            self._retried(p.init_transactions)
            return p

        def _retried(self, call: Callable[[], T]) -> T:
            """``call()``; where coordinators move, called again after each KafkaTimeoutError
            (max.block.ms passed): the producer keeps the call's outcome for its retry."""
            for _ in range(TIMEOUT_RETRIES if self.retry_timeouts else 0):
                try:
                    return call()
                except KafkaTimeoutError:
                    self.timeouts += 1
            return call()

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
            offsets = {(self.topic, partition): offset}
            self._retried(lambda: self.producer.send_offsets_to_transaction(offsets, self.group))
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
            self._retried(self.producer.commit_transaction)
            self._ended(True)
            self._check_offsets()

        @precondition(lambda self: self.open)
        @rule(flush=st.booleans())
        def abort(self, flush: bool) -> None:
            if flush:  # written, then aborted: read_committed must skip them
                self.producer.flush()
            self._retried(self.producer.abort_transaction)  # else never sent: not in the next one either
            self._ended(False)
            self._check_offsets()

        @precondition(lambda self: self.open)
        @rule(commit=st.booleans())
        def prepare_and_end_elsewhere(self, commit: bool) -> None:
            prepared = self.producer.prepare_transaction()
            if prepared is not None:
                self.admin.end_transactions([prepared], commit=commit)
            self._ended(commit)
            self._retried(self.producer.init_transactions)  # to go on after another process ended it

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
            for proxy in proxies:
                proxy.cut_all()

        def _check_offsets(self) -> None:
            tps = [(self.topic, p) for p in range(PARTITIONS)]
            got = self.admin.committed_offsets({self.group: tps})[self.group]
            assert {tp[1]: o for tp, (o, _) in got.items() if o >= 0} == self.offsets

        def teardown(self) -> None:
            try:
                if getattr(self, "open", False):
                    self._retried(self.producer.abort_transaction)
                    self._ended(False)
                if hasattr(self, "topic"):
                    self._check_offsets()
                    # A plain record after everything: read_committed reaches it only past
                    # every transaction, and reading up to it sees all, duplicates too.
                    with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0}) as plain:
                        for p in range(PARTITIONS):
                            plain.send(ProducerRecord(self.topic, _END, partition=p))
                        plain.flush(30)
                    expected = sum(len(v) for v in self.committed.values()) + PARTITIONS
                    messages = consume_all(bootstrap, self.topic, expected, until=_END,
                                           overrides={"isolation.level": "read_committed"})
                    seen = {p: [m.value() for m in messages if m.partition() == p and m.value() != _END]
                            for p in range(PARTITIONS)}
                    assert seen == self.committed
            finally:
                for p in getattr(self, "producers", []):
                    p.close(0)
                if hasattr(self, "admin"):
                    self.admin.close()

    if cluster is None:
        return Transactions
    nodes: KafkaCluster = cluster  # three, one of them killed now and then

    class TransactionsFailover(Transactions):
        """The same on three nodes, with the coordinator's node killed and restarted."""

        producer_config = FAILOVER_PRODUCER
        retry_timeouts = True
        dead: int | None = None  # the node killed and not yet restarted
        kills = 0

        killer: threading.Timer | None = None

        @precondition(lambda self: self.dead is None)
        @rule(after=st.sampled_from([0.0, 0.0, 0.05, 0.3, 1.0]))
        def kill_coordinator(self, after: float = 0.0) -> None:
            """SIGKILL the node coordinating the transactional id ``after`` seconds from now:
            with a delay, in the middle of the next step (a commit's EndTxn in flight, say).
            Every replica is in sync first: a kill before the last restarted node caught up
            would leave partitions below min.insync.replicas, which is no coordinator move."""
            nodes.wait_ready()
            for topic in ("__transaction_state", "__consumer_offsets", self.topic):
                wait_in_sync(nodes, topic)
            victim = transaction_coordinator(nodes, self.tid)
            assert victim > 0, f"no coordinator for {self.tid}"
            self.killer = threading.Timer(after, nodes.node(victim).kill)
            self.killer.start()
            if not after:
                self.killer.join()
            self.dead = victim
            self.kills += 1

        @precondition(lambda self: self.dead is not None)
        @rule()
        def restart(self) -> None:
            """Start the killed node again (killed by now); it catches up while the next
            steps run."""
            assert self.killer is not None and self.dead is not None
            self.killer.join()
            nodes.node(self.dead).start()
            self.dead = None

        def teardown(self) -> None:
            try:
                if self.dead is not None:  # back before the checks: they run while it catches up
                    self.restart()
                super().teardown()
            finally:
                # The cluster is shared: whole again, every replica in sync, for what runs next.
                for node in nodes.nodes:
                    node.start()
                nodes.wait_ready()
                for topic in ("__transaction_state", "__consumer_offsets"):
                    wait_in_sync(nodes, topic)
                STATS["kills"] += getattr(self, "kills", 0)
                STATS["timeouts"] += getattr(self, "timeouts", 0)
                STATS["examples"] += 1

    return TransactionsFailover


STATS: dict[str, int] = {"examples": 0, "kills": 0, "timeouts": 0}  # of the failover runs, reported


def test_transactions_match_the_model(kafka: KafkaCluster, kafka_proxy: ProxiedKafka) -> None:
    machine = _machine(kafka.bootstrap, kafka_proxy.bootstrap, [kafka_proxy.proxy])
    run_state_machine_as_test(machine, settings=settings(
        max_examples=SOAK or 6, stateful_step_count=12, deadline=None, database=None, derandomize=not SOAK,
        suppress_health_check=list(HealthCheck)))


@pytest.mark.soak  # the suite runs protocol v1 through the exactly-once shapes and crash points
def test_transactions_match_the_model_on_protocol_v1(kafka_tv1: KafkaCluster, kafka_tv1_proxy: ProxiedKafka) -> None:
    """The same on a cluster without transaction protocol v2 (transaction.version 1)."""
    test_transactions_match_the_model(kafka_tv1, kafka_tv1_proxy)


def test_the_suites_brokers_speak_transaction_protocol_v2_and_v1(kafka: KafkaCluster, kafka_tv1: KafkaCluster) -> None:
    """Kafka 4.x finalizes transaction.version 2 on a fresh node: there each commit bumps
    the epoch (EndTxn v5); formatted with transaction.version 1, it stays."""
    topic = unique_topic("tv")
    for cluster, version in ((kafka, 2), (kafka_tv1, 1)):
        create_topic(cluster.bootstrap, topic, partitions=1)
        tid = unique_topic("tv-txn")
        with KafkaProducer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid}) as producer:
            producer.init_transactions()
            for _ in range(2):
                producer.begin_transaction()
                producer.send(ProducerRecord(topic, b"v"))
                producer.commit_transaction()
        with AdminClient({"bootstrap.servers": cluster.bootstrap}) as admin:
            state = admin.describe_transactions([tid])[tid]
            assert admin.transaction_version == version
        # (PrepareCommit until the coordinator has written the markers.)
        assert state.state in ("PrepareCommit", "CompleteCommit")
        assert state.producer_epoch == (2 if version == 2 else 0)
        assert len(consume_all(cluster.bootstrap, topic, 2, overrides={"isolation.level": "read_committed"})) == 2


# An example costs 5 to 15 s here (kills, restarts, waits for replicas in sync): a soak
# outlasts the suite's 300 s per test.
@pytest.mark.timeout(300 + 30 * SOAK)
def test_transactions_match_the_model_as_coordinators_die(kafka3: KafkaCluster, kafka3_proxies: ProxiedKafka3) -> None:
    """Three nodes; the transaction coordinator's node is SIGKILLed at random steps."""
    machine = _machine(kafka3.bootstrap, kafka3_proxies.bootstrap, list(kafka3_proxies.proxies.values()), kafka3)
    before = dict(STATS)
    run_state_machine_as_test(machine, settings=settings(
        max_examples=SOAK or 3, stateful_step_count=12, deadline=None, database=None, derandomize=not SOAK,
        suppress_health_check=list(HealthCheck)))
    print("coordinator failover model: " + ", ".join(f"{k} {STATS[k] - before[k]}" for k in STATS))


# -- sequences the model found, kept as they were shrunk --------------------------


def _replay(kafka: KafkaCluster, kafka_proxy: ProxiedKafka, *steps: tuple) -> None:
    """Run one sequence of the model's steps, ``(rule, {argument: value})`` each."""
    _run(_machine(kafka.bootstrap, kafka_proxy.bootstrap, [kafka_proxy.proxy])(), steps)


def _replay_failover(kafka3: KafkaCluster, kafka3_proxies: ProxiedKafka3, *steps: tuple) -> ModelMachine:
    """:func:`_replay` on three nodes, with the coordinator kills among the steps; returns
    the machine (its ``timeouts`` count the calls retried)."""
    machine = _machine(kafka3.bootstrap, kafka3_proxies.bootstrap, list(kafka3_proxies.proxies.values()), kafka3)()
    _run(machine, steps)
    return machine


def _run(machine: ModelMachine, steps: Sequence[tuple]) -> None:
    """``steps`` on ``machine`` (set up here), then its teardown and final checks."""
    machine.setup()
    try:
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
    finally:
        machine.teardown()


def test_unflushed_records_of_an_aborted_transaction_stay_out_of_the_next(kafka: KafkaCluster,
                                                                          kafka_proxy: ProxiedKafka) -> None:
    """The first records must be failed by the abort, not sent in the next transaction."""
    _replay(kafka, kafka_proxy, ("begin", {}), ("send", {"partition": 0, "n": 3}), ("abort", {"flush": False}),
            ("begin", {}), ("send", {"partition": 0, "n": 1}), ("commit", {}))


def test_aborted_offsets_then_a_committed_transaction(kafka: KafkaCluster, kafka_proxy: ProxiedKafka) -> None:
    """The offsets of the aborted transaction were committed by the next one (fixed with
    empty transactions)."""
    _replay(kafka, kafka_proxy, ("begin", {}), ("send_offsets", {"partition": 0, "offset": 5}),
            ("abort", {"flush": True}), ("begin", {}), ("send", {"partition": 1, "n": 1}), ("commit", {}))


def test_a_commit_that_timed_out_while_its_coordinator_was_down_is_retried(kafka3: KafkaCluster,
                                                                           kafka3_proxies: ProxiedKafka3) -> None:
    """commit_transaction() outlasted max.block.ms with the coordinator's node killed, and
    its retry raised IllegalStateError (COMMITTING_TRANSACTION allowed no call): the retry
    must wait for the same commit, which the new coordinator completes (fixed: the producer
    keeps the result of a timed-out init, commit or abort for its retry, as Java's does)."""
    # Offsets alone before the kill: records in flight to a killed leader would hold the
    # commit's flush until the move, and its EndTxn would not time out.
    machine = _replay_failover(
        kafka3, kafka3_proxies, ("begin", {}), ("send_offsets", {"partition": 1, "offset": 7}),
        ("kill_coordinator", {}), ("commit", {}), ("restart", {}), ("begin", {}), ("send", {"partition": 1, "n": 2}),
        ("commit", {}))
    assert machine.timeouts >= 1  # the path under test: the commit did time out, and was retried


def test_a_coordinator_moved_back_to_a_node_restarted_is_reconnected(kafka3: KafkaCluster,
                                                                     kafka3_proxies: ProxiedKafka3) -> None:
    """The coordinator moved to the node killed (and restarted) before: the producer had
    forgotten its connection as failed and so dropped the coordinator at once each time
    FindCoordinator named it, without ever connecting again; the abort hung until the
    producer was closed (fixed: a known coordinator's connection is tried again first)."""
    _replay_failover(kafka3, kafka3_proxies, ("begin", {}), ("kill_coordinator", {"after": 0.0}),
                     ("prepare_and_end_elsewhere", {"commit": True}), ("restart", {}),
                     ("kill_coordinator", {"after": 0.05}), ("begin", {}), ("send", {"partition": 0, "n": 4}),
                     ("abort", {"flush": True}))
