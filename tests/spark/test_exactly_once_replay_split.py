"""A replayed microbatch split into as many tasks as the run that died in its commit, but
with other rows in each task (found by the skeptical review of branch ``break``; kept as a
regression test).

README, Guarantees: a replay split otherwise skips a microbatch committed whole and
refuses one committed in part with PartlyCommittedError rather than write rows twice.
Telling splits apart by their task count alone took such a replay for the same split:
the partitions whose marker was there were skipped although their rows were not the ones
committed there, and some rows were visible twice, others never. Each marker now holds
its task's rows digest too.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from kprod_broker import KafkaCluster
from spark_sink.spark import exactly_once, exactly_once_abort
from spark_sink.spark.exactly_once_state import PartlyCommittedError
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, unique_topic
from tests.spark.test_exactly_once_shapes import _prepared_tasks, assert_visible_once, driver_dies_committing

ROWS = [b"r%02d" % i for i in range(20)]
# The run that dies: task 0 the first half, task 1 the second.
RUN1 = {0: ROWS[:10], 1: ROWS[10:]}
# Replays with as many tasks, the rows dealt otherwise (the same rows in all).
REPLAYS = {
    "interleaved": {0: ROWS[:5] + ROWS[10:15], 1: ROWS[5:10] + ROWS[15:]},
    "task_1_now_empty": {0: ROWS, 1: []},
}
# Random shapes in the suite; KPROD_SOAK=N tries N more (make soak).
SEEDS = int(os.environ.get("KPROD_SOAK", "0")) or 2


def _crash(kafka: KafkaCluster, run1: dict[int, list[bytes]], committed: set[int]) -> tuple[str, ExactlyOnce, str]:
    """Run 1 of microbatch 0 dies after committing the transactions of the tasks in
    ``committed``. Returns its topic, settings and query id; the next commit is a new
    driver process's."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-resplit"), partitions=2)
    query = unique_topic("query")
    eo = ExactlyOnce(None, topic)

    with driver_dies_committing(*committed):
        exactly_once.commit({"bootstrap.servers": kafka.bootstrap}, eo,
                            _prepared_tasks(kafka.bootstrap, eo.prefix_for(query), topic, run1, query), 0)
    return topic, eo, query


def _replay(kafka: KafkaCluster, topic: str, eo: ExactlyOnce, query: str, run2: dict[int, list[bytes]], *,
            tasks_only: bool = False) -> PartlyCommittedError | None:
    """Run 2 commits microbatch 0 again (its tasks without a rows digest if ``tasks_only``,
    as under kprod.replayMatch=tasks); a refusal aborts it. Returns the refusal, if any."""
    config = {"bootstrap.servers": kafka.bootstrap}
    messages = _prepared_tasks(kafka.bootstrap, eo.prefix_for(query), topic, run2, query)
    if tasks_only:
        messages = [dataclasses.replace(m, rows_digest=None) for m in messages]
    try:
        exactly_once.commit(config, eo, messages, 0)
    except PartlyCommittedError as exc:
        exactly_once_abort.abort(config, eo, messages)
        return exc
    return None


def _crash_then_replay(kafka: KafkaCluster, run1: dict[int, list[bytes]], committed: set[int],
                       run2: dict[int, list[bytes]]) -> bool:
    """Run 1 dies part-way through its commit, run 2 replays the same rows: no row visible
    twice or lost (every row once, or, if run 2 was refused with PartlyCommittedError, run
    1's committed rows once). Returns whether run 2 was refused."""
    topic, eo, query = _crash(kafka, run1, committed)
    refused = _replay(kafka, topic, eo, query, run2) is not None
    shown = [v for p in committed for v in run1[p]] if refused else [v for rows in run1.values() for v in rows]
    assert_visible_once(kafka, topic, shown)
    return refused


@pytest.mark.parametrize("replay", sorted(REPLAYS))
def test_a_replay_split_into_as_many_tasks_otherwise_writes_no_row_twice_and_loses_none(kafka: KafkaCluster,
                                                                                        replay: str) -> None:
    """Run 1 (two tasks) dies after committing task 1's transaction; run 2 replays microbatch 0
    in two tasks holding the same rows dealt otherwise: it is refused, as the committed
    task's rows are not the ones run 2's task 1 holds."""
    assert _crash_then_replay(kafka, RUN1, {1}, REPLAYS[replay])


@pytest.mark.parametrize("replay", sorted(REPLAYS))
def test_a_replay_split_into_as_many_tasks_otherwise_on_protocol_v1(kafka_tv1: KafkaCluster, replay: str) -> None:
    """The same on a cluster without transaction protocol v2."""
    assert _crash_then_replay(kafka_tv1, RUN1, {1}, REPLAYS[replay])


def test_a_replay_with_the_same_rows_in_another_order_completes_the_microbatch(kafka: KafkaCluster) -> None:
    """The digest does not depend on the rows' order within a task: a replay that reads
    each task's rows in another order still finds its marker, and commits only the rest."""
    reordered = {p: rows[::-1] for p, rows in RUN1.items()}
    assert not _crash_then_replay(kafka, RUN1, {1}, reordered)


def test_a_replay_whose_rows_differ_is_refused_saying_how_to_go_on(kafka: KafkaCluster) -> None:
    """A query whose rows differ between runs (values computed with uuid() or
    current_timestamp()): its replay is refused, with the option that lets it go on; under
    that option (tasks report no digest) the replay skips the committed task by its number
    and commits the other, once."""
    again = {p: [v + b"-again" for v in rows] for p, rows in RUN1.items()}
    topic, eo, query = _crash(kafka, RUN1, {1})
    refusal = _replay(kafka, topic, eo, query, again)
    assert refusal is not None and "kprod.replayMatch=tasks" in str(refusal)
    assert _replay(kafka, topic, eo, query, again, tasks_only=True) is None
    assert_visible_once(kafka, topic, RUN1[1] + again[0])


@pytest.mark.parametrize("seed", range(SEEDS))
def test_random_splits_and_crashes_write_no_row_twice_and_lose_none(kafka: KafkaCluster, seed: int) -> None:
    """Random rows dealt over 2 to 4 tasks (some empty), run 1 dying after committing a
    random part; the replay deals them as run 1 did (then it must complete the microbatch)
    or anew over as many tasks."""
    rng = random.Random(seed)
    print(f"seed {seed}")
    rows = [b"s%d-%03d" % (seed, i) for i in range(rng.randrange(1, 40))]
    tasks = rng.randrange(2, 5)

    def deal() -> dict[int, list[bytes]]:
        dealt: dict[int, list[bytes]] = {p: [] for p in range(tasks)}
        for row in rows:
            dealt[rng.randrange(tasks)].append(row)
        return dealt

    run1 = deal()
    with_rows = sorted(p for p, r in run1.items() if r)
    committed = set(rng.sample(with_rows, rng.randrange(len(with_rows) + 1)))
    same = rng.random() < 0.5
    run2 = {p: rng.sample(r, len(r)) for p, r in run1.items()} if same else deal()
    refused = _crash_then_replay(kafka, run1, committed, run2)
    assert not (same and refused), "a replay split as run 1 was must complete the microbatch"
