"""The driver's abort when ending a finished task's transaction is refused (found by the
skeptical review of branch ``break``).

``exactly_once.abort`` first aborts the reported transactions, then fences the ids of the
tasks that never reported. If the first step raises (a reported transaction that the
coordinator already aborted at transaction.timeout.ms has a newer epoch, so the driver's
EndTxn is refused as PRODUCER_FENCED), the second never runs: an unreported task's open
transaction (a writer SIGKILLed, an attempt killed as the job was cancelled) stays open
and holds back read_committed readers of its partitions until its own timeout. README,
Guarantees: "No transaction outlives a failed write or microbatch, whatever failed ...
with or without finished tasks".
"""

from __future__ import annotations

import dataclasses

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer
from spark_sink.spark import exactly_once_abort, exactly_once_names
from spark_sink.spark.options import parse_options
from tests.brokers import create_topic, unique_topic
from tests.clock import MovedClock
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_time import _prepare


def _run(cluster: KafkaCluster) -> None:
    topic = create_topic(cluster.bootstrap, unique_topic("eos-abort-order"), partitions=2)
    options = {"kafka.bootstrap.servers": cluster.bootstrap, "topic": topic,
               "kprod.deliveryGuarantee": "exactly-once", "kafka.transaction.timeout.ms": "600000",
               "checkpointLocation": "/x/" + topic}
    eo = parse_options(options, streaming=True).exactly_once
    assert eo is not None
    config = {"bootstrap.servers": cluster.bootstrap}
    query = unique_topic("query")
    prefix = eo.prefix_for(query)
    # Task 0 finished early and reported; its transaction was since ended by its
    # coordinator (as transaction.timeout.ms does: a newer epoch, the transaction aborted).
    p0, m0 = _prepare(cluster.bootstrap, exactly_once_names.transactional_id(prefix, 0), topic, [b"done"])
    p0.close()
    with KafkaProducer({"bootstrap.servers": cluster.bootstrap,
                        "transactional.id": exactly_once_names.transactional_id(prefix, 0)}) as ender:
        ender.init_transactions()
    # Task 1's last attempt holds an open transaction when its writer is killed: no report.
    p1, _ = _prepare(cluster.bootstrap, exactly_once_names.transactional_id(prefix, 1), topic, [b"held"])
    m0 = dataclasses.replace(m0, query_id=query)
    clock = MovedClock()  # the second fence's wait (for Spark to kill the tasks) at once: no Spark here
    try:
        try:
            exactly_once_abort.abort(config, eo, [m0, None], clock)
        except Exception as exc:
            print("abort raised:", exc)
        assert_nothing_left_open(cluster.bootstrap, topic, 2)
        assert clock.slept == [exactly_once_abort.REFENCE_AFTER_S]
    finally:
        p1.close()


def test_an_abort_whose_finished_transaction_was_ended_still_fences_the_unreported_tasks(kafka: KafkaCluster) -> None:
    """Expected: after the driver's abort, no transaction of the failed microbatch is open
    (a record produced afterwards to each partition is visible to read_committed at once),
    though ending task 0's reported transaction was refused."""
    _run(kafka)


def test_the_same_on_protocol_v1(kafka_tv1: KafkaCluster) -> None:
    """The same on a cluster without transaction protocol v2."""
    _run(kafka_tv1)
