"""The driver dies at a random point of its exactly-once commit, again and again (written
by the skeptical review of branch ``break``; no break found, kept as a regression test).

README, Guarantees: "every row once, as a read_committed consumer sees it, through task
retries, executor loss and driver crashes"; "a microbatch committed in part is
completed, not written twice"; a named batch write's "rerun completes it".

Each request the driver's commit makes through its AdminClient (reading the directory
and markers, fencing, DescribeTransactions, the directory write, the markers, the
EndTxns) is a point where it may die; where a request carries several transactions or
ids, it may die after sending any part of them. A run that dies leaves its tasks'
transactions as they were, and the next run is a new driver process whose tasks send
the same rows again (dealt as the dead run did, or otherwise: then it may be refused
with PartlyCommittedError, and the run after it deals them as before). Several
microbatches of one query, or one named batch write, each through a chain of such
deaths; at the end every row is visible once and nothing is left open.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import pytest

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.spark import exactly_once, exactly_once_abort
from spark_sink.spark.exactly_once_state import PartlyCommittedError
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, unique_topic
from tests.spark.test_exactly_once_shapes import _Crash, _prepared_tasks, assert_visible_once

# One seed in the suite (each case drives three microbatches through up to four deaths
# each); KPROD_SOAK=N (make soak) tries N / 10, six cases a seed.
SEEDS = int(os.environ.get("KPROD_SOAK", "0")) // 10 or 1
# AdminClient calls of the driver's commit; those taking several transactions or ids may
# be cut part-way.
_CALLS = ("committed_offsets", "fence_transactions", "describe_transactions", "commit_offsets",
          "send_offsets_to_transactions", "end_transactions")
_SPLIT = {"fence_transactions", "send_offsets_to_transactions", "end_transactions"}


class _Dying:
    """Makes the driver die at its ``at``-th AdminClient call (counting from 0); a call of
    several items sends a random part of them first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, rng: random.Random) -> None:
        self.monkeypatch, self.rng = monkeypatch, rng
        self.calls = 0
        self.at: int | None = None
        self.where = ""
        self.committed_some = False  # the run died after committing some transactions
        for name in _CALLS:
            real = getattr(AdminClient, name)
            monkeypatch.setattr(AdminClient, name, self._wrap(name, real))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        # Any: one wrapper for AdminClient methods of different signatures.
        def call(admin: AdminClient, first: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
            n = self.calls
            self.calls += 1
            if self.at is None or n != self.at:
                return real(admin, first, *args, **kwargs)
            if name in _SPLIT:
                items = list(first)
                part = self.rng.sample(items, self.rng.randrange(len(items) + 1))
                self.where = f"{name} after {len(part)} of {len(items)}"
                if part:
                    real(admin, part, *args, **kwargs)
                    self.committed_some = name == "end_transactions" and bool(args[0] if args else kwargs["commit"])
            else:
                self.where = f"before {name}"
            raise _Crash()
        return call

    def run(self, commit: Callable[[], object], die: bool) -> tuple[str, object]:
        """Commit, dying at a random call if ``die``. Returns what happened."""
        self.calls = 0
        self.committed_some = False
        # A commit makes 5 to 9 calls: a point past its last is a run that does not die.
        self.at = self.rng.randrange(10) if die else None
        try:
            return "done", commit()
        except _Crash:
            return f"died {self.where}", None
        except PartlyCommittedError as exc:
            return "refused", exc
        finally:
            self.at = None


def _chain(kafka: KafkaCluster, dying: _Dying, rng: random.Random, eo: ExactlyOnce, topic: str, query: str | None,
           batch_id: int | None, rows: dict[int, list[bytes]], log: list[str]) -> None:
    """Commit one microbatch (or named batch write) through up to four deaths of its driver;
    the fifth run neither dies nor deals the rows otherwise than the run that committed
    part of the microbatch (README: "restart it with the earlier partitioning")."""
    config = {"bootstrap.servers": kafka.bootstrap}
    prefix = eo.prefix_for(query)
    tasks = len(rows)
    committed_split = None  # how the run that committed part of the microbatch dealt it
    for attempt in range(5):
        die = attempt < 4 and rng.random() < 0.7
        dealt = committed_split or rows
        if 0 < attempt < 4 and rng.random() < 0.3:  # a replay split otherwise
            dealt = {p: [] for p in range(tasks)}
            for r in (r for rs in rows.values() for r in rs):
                dealt[rng.randrange(tasks)].append(r)
        messages = _prepared_tasks(kafka.bootstrap, prefix, topic, dealt, query or "")
        if query is None:  # a batch write's tasks know no query
            messages = [dataclasses.replace(m, query_id=None) for m in messages]
        outcome, result = dying.run(partial(exactly_once.commit, config, eo, messages, batch_id), die)
        log.append(f"batch {batch_id} run {attempt}: {'resplit ' if dealt is not rows else ''}{outcome}")
        if dying.committed_some:
            committed_split = dealt
        if outcome == "refused":
            assert committed_split is not None and dealt is not committed_split, (
                f"a replay dealt as the run that committed part of it was refused: {result}")
            dying.run(partial(exactly_once_abort.abort, config, eo, messages), False)  # as Spark does
        exactly_once._fenced.clear()  # the next run is a new driver process
        if outcome == "done":
            return
    raise AssertionError(f"the last run, neither dying nor split otherwise, did not finish: {log}")


@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wide"])
@pytest.mark.parametrize("named", [False, True], ids=["streaming", "named-batch-write"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_driver_dying_anywhere_in_its_commit_writes_every_row_once(kafka: KafkaCluster,
                                                                     monkeypatch: pytest.MonkeyPatch, seed: int, named: bool,
                                                                     wide: bool) -> None:
    """1 to 4 tasks, or (wide) 30 to 80 tasks, most without rows, as after a shuffle."""
    rng = random.Random(seed * 4 + named * 2 + wide)
    topic = create_topic(kafka.bootstrap, unique_topic("eos-crashpoints"), partitions=2)
    dying = _Dying(monkeypatch, rng)
    log: list[str] = []
    if named:
        batches: list[int | None]
        eo, query, batches = ExactlyOnce(unique_topic("orders"), topic, batch=True), None, [None]
    else:
        eo, query, batches = ExactlyOnce(None, topic), unique_topic("query"), [0, 1, 2]
    written: list[bytes] = []
    for batch in batches:
        tasks = rng.randrange(30, 81) if wide else rng.randrange(1, 5)
        rows: dict[int, list[bytes]] = {p: [] for p in range(tasks)}
        for i in range(rng.randrange(1, 25)):
            rows[rng.randrange(tasks)].append(b"s%d-b%s-%02d" % (seed, str(batch).encode(), i))
        _chain(kafka, dying, rng, eo, topic, query, batch, rows, log)
        written += [r for rs in rows.values() for r in rs]
    print("\n".join(log))
    assert_visible_once(kafka, topic, written, f"; runs: {log}")


@pytest.mark.parametrize("named", [False, True], ids=["streaming", "named-batch-write"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_same_on_protocol_v1(kafka_tv1: KafkaCluster, monkeypatch: pytest.MonkeyPatch, seed: int, named: bool) -> None:
    """On a cluster without transaction protocol v2 (AddOffsetsToTxn before the markers,
    EndTxn without an epoch bump). Seeds of their own: other deaths than on v2."""
    test_a_driver_dying_anywhere_in_its_commit_writes_every_row_once(kafka_tv1, monkeypatch, SEEDS + seed, named, False)
