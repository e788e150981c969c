"""The driver's count of committed transactions when a producer id's epochs run out
(found by the skeptical review of branch ``break``; kept as a regression test).

Under transaction protocol v2 each EndTxn bumps the epoch; a transaction ended at epoch
32766 is completed under a *new producer id* (KIP-890), which a streaming query's
transactional ids reach after about 16,000 microbatches (InitProducerId and EndTxn each
bump once). When an EndTxn of a commit is refused, the driver asks DescribeTransactions
which transactions its EndTxns committed. It took only those under the task's producer id
at the task's epoch plus one, so a transaction committed across the overflow was counted
as not committed, and the error said nothing was visible when its rows were. It now
takes a new producer id at epoch 0 too (``protocol.txn_coordinator.ended_by``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import pytest

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient, TransactionState
from spark_sink.client.clock import SYSTEM_TIME
from spark_sink.producer import KafkaProducer
from spark_sink.spark import exactly_once, exactly_once_names
from spark_sink.spark.exactly_once import TransactionsEndedError
from tests.brokers import create_topic, unique_topic
from tests.spark.test_exactly_once_time import _committed_values, _prepare

# 32,766 InitProducerId requests first: make soak runs it, not the suite.
pytestmark = pytest.mark.soak

MAX_EPOCH = 32767


def _settled(describe: Callable[[AdminClient, list[str]], dict[str, TransactionState]], admin: AdminClient,
             tids: list[str], timeout_s: float = 10.0) -> None:
    """Until no transaction of ``tids`` is still writing its markers."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any((s.state or "").startswith("Prepare") for s in describe(admin, tids).values()):
            return
        time.sleep(0.05)


def test_a_commit_across_an_exhausted_epoch_is_counted_as_committed(kafka: KafkaCluster) -> None:
    """Expected: task 0's transaction, committed by the driver's EndTxn at epoch 32766 (its
    producer id's last), is counted as committed when task 1's EndTxn is refused: the error
    says 1 of 2 were committed, as task 0's rows are visible to read_committed."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-epochs"), partitions=1)
    prefix = unique_topic("epochs")
    config = {"bootstrap.servers": kafka.bootstrap}
    admin = AdminClient(config)
    tid0 = exactly_once_names.transactional_id(prefix, 0)
    try:
        # Task 0's id has lived ~16,000 microbatches: its next InitProducerId gives 32766.
        for _ in range(MAX_EPOCH - 1):  # the first gives epoch 0
            admin.fence_transactions([tid0])
        producers, messages = zip(*(_prepare(kafka.bootstrap, exactly_once_names.transactional_id(prefix, p), topic,
                                             [b"%d" % p]) for p in range(2)))
        for p in producers:
            p.close()
        assert messages[0].transaction.producer_epoch == MAX_EPOCH - 1
        with KafkaProducer({"bootstrap.servers": kafka.bootstrap,
                            "transactional.id": exactly_once_names.transactional_id(prefix, 1)}) as fencer:
            fencer.init_transactions()  # task 1's transaction ends before the driver's EndTxn
        txns = {m.partition_id: m.transaction for m in messages}
        real_describe = AdminClient.describe_transactions

        def describe_once_settled(self: AdminClient, tids: Iterable[str],
                                  timeout_ms: float | None = None) -> dict[str, TransactionState]:
            tids = list(tids)
            _settled(real_describe, self, tids)  # the coordinator wrote task 0's markers before the driver asks
            return real_describe(self, tids, timeout_ms)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(AdminClient, "describe_transactions", describe_once_settled)
            with pytest.raises(TransactionsEndedError) as failure:
                exactly_once._end_checked(admin, config, txns, {}, "microbatch 7", SYSTEM_TIME)
    finally:
        admin.close()
    assert _committed_values(kafka.bootstrap, topic, 1) == ["0"]  # task 0's rows are visible
    assert "1 of its 2 transaction(s) were committed" in str(failure.value), str(failure.value)
