"""ended_by: how the driver tells its own EndTxn's outcome from another producer's, under
both transaction protocols and across a producer id whose epochs ran out."""

from __future__ import annotations

import pytest

from spark_sink.protocol.txn_coordinator import MAX_EPOCH, PreparedTransaction, TransactionState, ended_by

PID = 4000


def _state(pid: int, epoch: int) -> TransactionState:
    return TransactionState("t-0", "CompleteCommit", pid, epoch)


@pytest.mark.parametrize(("version", "task_epoch", "after", "ours"), [
    (1, 7, (PID, 7), True),                # v1: EndTxn keeps the epoch
    (1, 7, (PID, 8), False),               # another producer's InitProducerId bumped it
    (2, 7, (PID, 8), True),                # v2: EndTxn v5 bumps once
    (2, 7, (PID, 7), False),               # not ended by an EndTxn v5
    (2, 7, (PID, 9), False),               # another producer's init and commit: two bumps
    (2, MAX_EPOCH - 1, (PID + 1, 0), True),   # the bump exhausted the epochs: a new producer id
    (2, MAX_EPOCH - 1, (PID + 1, 1), False),  # a new producer id that another producer committed under
    (2, MAX_EPOCH - 1, (PID, MAX_EPOCH), False),
    (2, MAX_EPOCH - 2, (PID, MAX_EPOCH - 1), True),
])
def test_an_endtxn_is_known_by_the_epoch_it_leaves(version: int, task_epoch: int, after: tuple[int, int],
                                                    ours: bool) -> None:
    transaction = PreparedTransaction("t-0", PID, task_epoch)
    assert ended_by(transaction, _state(*after), version) is ours
