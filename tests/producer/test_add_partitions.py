"""A send_arrow chunk's partitions added to the open transaction at once
(TransactionManager.maybe_add_partitions) as one by one: the same partitions in the
transaction and, under protocol v1, the same AddPartitionsToTxn requests; against the
scripted network of test_sender_scripted."""

from __future__ import annotations

import random

import pytest

from spark_sink.protocol.apis import ApiKey
from tests.producer.test_sender_scripted import TOPIC, Harness


def _adds(seed: int, version: int, at_once: bool) -> tuple[list, set, set]:
    """Random chunks' partitions added (at once or one by one), with Sender rounds between:
    the AddPartitionsToTxn requests' partitions, the transaction's, those still to add."""
    rng = random.Random(seed)
    h = Harness(leaders=[0] * 64, settings={"transactional.id": "tx"})
    h.client.transaction_version = version
    h.txn.init_transactions()
    h.run()
    h.txn.begin_transaction()
    for _ in range(rng.randrange(1, 8)):
        partitions = sorted(rng.sample(range(64), rng.randrange(1, 64)))
        if at_once:
            h.txn.maybe_add_partitions(TOPIC, partitions)
        else:
            for p in partitions:
                h.txn.maybe_add_partition((TOPIC, p))
        if rng.random() < 0.5:
            h.run()
    h.run()
    requests = [repr(r.body) for r in h.client.requests if r.api_key == ApiKey.ADD_PARTITIONS_TO_TXN]
    return requests, set(h.txn._in_transaction), set(h.txn._to_add)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(6))
def test_a_chunks_partitions_are_added_as_one_by_one(seed: int, version: int) -> None:
    at_once = _adds(seed, version, at_once=True)
    assert at_once == _adds(seed, version, at_once=False)
    requests, in_transaction, _ = at_once
    assert in_transaction and (requests if version == 1 else not requests)
