"""A driver that dies before its commit, and a rerun with fewer tasks (written by the
skeptical review of branch ``break``).

README, Guarantees: before it ends any transaction the driver records "how many task ids
any run of the query used"; "A microbatch replayed after a driver crash reads the
markers of all those ids (after fencing the ids this run does not use, which aborts
what the crashed run left open there)"; a named batch write's rerun completes it.

The common moment for a driver to die is while its tasks run or just after they report,
before its commit: nothing is recorded then. The rerun is free to split the write
otherwise, since nothing of it was committed (a batch write's input splits follow the
cluster's cores: spark.sql.files.maxPartitionBytes against defaultParallelism), and it
is not refused. But the ids of the dead run's tasks beyond the rerun's task count are
never fenced: their transactions stay open until transaction.timeout.ms, which for a
batch write is the broker's maximum (15 minutes by default), holding back every
read_committed consumer of their partitions. Fixed: a restarted query's (or rerun's)
first commit lists the open transactions of every coordinator (ListTransactions) and
fences those of its prefix beyond the ids recorded.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable

import pytest

from kprod_broker import KafkaCluster
from spark_sink.spark import exactly_once
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, unique_topic
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _prepared_tasks


def test_a_rerun_with_fewer_tasks_after_a_death_before_the_commit_leaves_nothing_open(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-unrecorded"), partitions=4)
    eo = ExactlyOnce(unique_topic("orders"), topic, batch=True)
    rows = [b"r%02d" % i for i in range(16)]
    # Run 1: four tasks sent their rows in transactions; the driver dies before committing.
    _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, {p: rows[p::4] for p in range(4)}, "")
    exactly_once._fenced.clear()  # the rerun is a new driver process
    rerun = [dataclasses.replace(m, query_id=None) for m in
             _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, {p: rows[p::2] for p in range(2)}, "")]
    assert exactly_once.commit({"bootstrap.servers": kafka.bootstrap}, eo, rerun, None).transactions == 2
    # Left open, the dead run's transactions on ids 2 and 3 would hold back the partitions
    # they wrote to: even the rerun's committed rows there would not be visible.
    got = collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, 4))
    assert got == collections.Counter(r.decode() for r in rows)


def test_a_rerun_after_a_death_of_a_run_with_sparse_tasks_leaves_nothing_open(kafka: KafkaCluster) -> None:
    """The same with the dead run's tasks with rows far apart, as an aggregation over 200
    shuffle partitions with a few groups gives (only partitions 0 and 150 hold rows): the
    rerun (2 tasks, shuffle partitions lowered, or coalesced by adaptive execution) must
    fence id 150 too. (A probe of the ids beyond those recorded in windows of 128, stopping
    at a window of ids no coordinator had heard of, stopped at 2-129; the restart now lists
    the open transactions of every coordinator.)"""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-sparse"), partitions=4)
    eo = ExactlyOnce(unique_topic("orders"), topic, batch=True)
    rows = [b"s%02d" % i for i in range(16)]
    _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, {0: rows[:8], 150: rows[8:]}, "")
    exactly_once._fenced.clear()  # the rerun is a new driver process
    rerun = [dataclasses.replace(m, query_id=None) for m in
             _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, {p: rows[p::2] for p in range(2)}, "")]
    exactly_once.commit({"bootstrap.servers": kafka.bootstrap}, eo, rerun, None)
    got = collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, 4))
    assert got == collections.Counter(r.decode() for r in rows)


def test_a_restart_goes_on_when_the_open_transactions_cannot_be_listed(kafka: KafkaCluster,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A broker down (or a cluster before Kafka 3.0) when a restarted query first commits:
    the ids beyond those recorded are left to their timeout, with a WARNING, and the
    commit goes on."""
    from spark_sink.admin import AdminClient
    from spark_sink.producer import KafkaTimeoutError

    def unreachable(self: AdminClient, states: Iterable[str] = ("Ongoing",), timeout_ms: float | None = None) -> None:
        raise KafkaTimeoutError("list transactions: 1 of 2 request(s) unanswered after 60000 ms (for broker 2)")

    monkeypatch.setattr(AdminClient, "list_transactions", unreachable)
    topic = create_topic(kafka.bootstrap, unique_topic("eos-unlisted"), partitions=2)
    eo = ExactlyOnce(unique_topic("orders"), topic, batch=True)
    exactly_once._fenced.clear()  # a new driver process
    rerun = [dataclasses.replace(m, query_id=None) for m in
             _prepared_tasks(kafka.bootstrap, eo.prefix_for(None), topic, {0: [b"a"], 1: [b"b"]}, "")]
    assert exactly_once.commit({"bootstrap.servers": kafka.bootstrap}, eo, rerun, None).transactions == 2
    assert "could not be listed" in caplog.text and "broker 2" in caplog.text


def test_a_query_restarted_in_the_same_application_fences_what_its_last_run_left(kafka: KafkaCluster) -> None:
    """A notebook stops a query and starts it again: Spark reuses the driver's Python
    worker, which fenced the query's leftovers at the first run's start. The new run (a
    new runId) with fewer tasks must fence them again: the last run's driver step died
    before its commit with four tasks' transactions open (found by a review)."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-same-app"), partitions=4)
    config = {"bootstrap.servers": kafka.bootstrap}
    query = unique_topic("query")
    eo = ExactlyOnce(None, topic)
    prefix = eo.prefix_for(query)

    def run(run_id: str, rows: dict[int, list[bytes]]) -> list:
        return [dataclasses.replace(m, run_id=run_id) for m in _prepared_tasks(kafka.bootstrap, prefix, topic, rows,
                                                                               query)]

    first = [b"f%d" % i for i in range(4)]
    exactly_once.commit(config, eo, run("run-1", {p: first[p::4] for p in range(4)}), 0)
    left = [b"l%d" % i for i in range(8)]
    run("run-1", {p: left[p::4] for p in range(4)})  # microbatch 1: stopped before the commit
    again = run("run-2", {p: left[p::2] for p in range(2)})  # restarted: microbatch 1 over 2 tasks
    assert exactly_once.commit(config, eo, again, 1).transactions == 2
    got = collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, 4))
    assert got == collections.Counter(r.decode() for r in first + left)
