"""Exactly-once writes: the abort, in a failing task (its own transaction) and on the
driver (a failed write's reported transactions ended, every task's id fenced)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from spark_sink.admin import AdminClient
from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import KafkaProducer
from spark_sink.spark.exactly_once_names import (
    MARKER_PARTITION,
    driver_admin,
    query_of,
    registry_group,
    reported_transactions,
    transactional_id,
)
from spark_sink.spark.exactly_once_state import RegistryEntry
from spark_sink.spark.last_will import LastWill
from spark_sink.spark.options import ExactlyOnce
from spark_sink.spark.task_reports import KProdCommitMessage

log = logging.getLogger(__name__)

# How long the driver's abort waits before it fences the tasks' ids again.
REFENCE_AFTER_S = 3.0
# How long a failing task waits for its abort, at most: the task is failing anyway, and
# what is left open is aborted by the next attempt or by the driver's abort. No longer
# than delivery.timeout.ms either: a task whose records expired on a silent broker would
# otherwise fail that much later than its error.
_TASK_ABORT_TIMEOUT_S = 10.0


def abort_in_task(producer: KafkaProducer) -> None:
    """A failing task aborts the transaction it opened, so that records written to its
    partitions after it are not held back from read_committed consumers; if even that
    fails, the driver's abort or the next attempt fences it."""
    try:
        producer.abort_transaction(min(_TASK_ABORT_TIMEOUT_S, producer.config.delivery_timeout_ms / 1000))
    except Exception as exc:
        log.warning("kprod task could not abort its transaction (%s); it is aborted when its id is fenced", exc)


def abort(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object], clock: Time = SYSTEM_TIME) -> None:
    """Abort the transactions of the tasks that finished, and fence the ids of every task
    of the write: a task that died with its worker (or whose own abort failed) leaves its
    transaction open, holding back every later record of its partitions from
    read_committed consumers until transaction.timeout.ms; so does another attempt of a
    finished task (a speculative copy, an executor thought lost) that opened one under
    the same id, at an epoch the finished task's EndTxn cannot end. A worker killed in the
    middle of it leaves the abort to its last will."""
    with LastWill() as will:
        will.set(abort_write, config, eo, messages)
        abort_write(config, eo, messages, clock)


def abort_write(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object],
                clock: Time = SYSTEM_TIME) -> None:
    """The abort itself (also a commit's last will): end the reported transactions, fence
    every task's id."""
    admin = driver_admin(config)
    txns = reported_transactions(messages)
    try:
        if txns:
            admin.end_transactions(txns.values(), commit=False)
    finally:
        # Even when ending a reported one is refused (its coordinator already ended it at
        # its timeout, or another attempt fenced it): the others may still be open.
        _fence_all(admin, eo, messages, clock)


def _fence_all(admin: AdminClient, eo: ExactlyOnce, messages: Sequence[object], clock: Time) -> None:
    """Fence the ids of every task of the write, aborting what is left open under them."""
    prefix = _abort_prefix(admin, eo, messages)
    if prefix is None:
        return
    ids = [transactional_id(prefix, p) for p in range(len(messages))]
    admin.fence_transactions(ids)
    if all(isinstance(m, KProdCommitMessage) for m in messages):
        return
    # Spark aborts as soon as the job fails or is cancelled, without waiting for its
    # running tasks: one that opens its transaction after the fence above (a small task
    # sends at the end of its input) would leave it open. Those tasks are being killed
    # (spark.python.task.killTimeout, 2 s); fenced again once they are gone.
    clock.sleep(REFENCE_AFTER_S)
    admin.fence_transactions(ids)


def _abort_prefix(admin: AdminClient, eo: ExactlyOnce, messages: Sequence[object]) -> str | None:
    """The prefix of the failed write's transactional ids: given, from a finished task's
    query id, or as its tasks recorded it in the registry (None: no task of this run
    opened a transaction)."""
    query = query_of(messages)
    if eo.prefix is not None or query:
        return eo.prefix_for(query)
    tp, group = (eo.marker_topic, MARKER_PARTITION), registry_group(eo.options_key)
    offset, metadata = admin.committed_offsets({group: [tp]})[group].get(tp, (-1, None))
    entry = RegistryEntry.decode(metadata) if offset >= 0 else None
    return None if entry is None else entry.prefix

