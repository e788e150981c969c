"""Exactly-once writes: each task's rows in one Kafka transaction, committed by the driver.

A task opens the transaction under ``<prefix>-<partition>`` (which fences an earlier
attempt of the same partition and aborts what it left open), writes, flushes and returns
the transaction's identity without committing it. The driver's commit ends them all.

A microbatch replayed after a driver crash may have been committed in part before the
crash. So the driver commits, with each partition's transaction, a marker: the offset
``batchId`` (metadata: the query id and the microbatch's task count) of the consumer group
``<prefix>-<partition>`` on ``(markerTopic, 0)``. Before committing a microbatch it reads
the markers: a partition whose marker already holds this batch id has its rows in Kafka,
and its new transaction is aborted instead. If a replay splits the microbatch into a
different number of tasks, partitions cannot be matched; a batch committed whole is then
still skipped whole, and one committed in part fails the query with an error that says so.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from collections.abc import Mapping, Sequence

from spark_sink.producer import AdminClient, KafkaProducer, PreparedTransaction
from spark_sink.spark.messages import KProdCommitMessage
from spark_sink.spark.options import ExactlyOnce

log = logging.getLogger(__name__)

MARKER_PARTITION = 0


class PartlyCommittedError(RuntimeError):
    """A replayed microbatch was committed in part by a run that split it differently."""


def transactional_config(config: Mapping[str, str], eo: ExactlyOnce, partition_id: int) -> dict[str, str]:
    """The producer settings of task ``partition_id``: its own transactional id."""
    return {**config, "transactional.id": eo.transactional_id(partition_id)}


def begin(producer: KafkaProducer) -> None:
    """Fence earlier attempts of this partition (their open transaction is aborted) and
    open the task's transaction."""
    producer.init_transactions()
    producer.begin_transaction()


def query_id() -> str | None:
    """The streaming query's id (stable across restarts from its checkpoint), if any."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None


# -- the driver -------------------------------------------------------------------

_admins: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_admins_lock = threading.Lock()


def _admin(config: Mapping[str, str]) -> AdminClient:
    """One AdminClient per configuration in the driver's Python worker, kept across
    microbatches: its connections and the coordinators it found are reused."""
    key = tuple(sorted(config.items()))
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            admin = _admins[key] = AdminClient(dict(config))
        return admin


@atexit.register
def _close_admins() -> None:
    with _admins_lock:
        for admin in _admins.values():
            admin.close()
        _admins.clear()


def _transactions(messages: Sequence[object]) -> dict[int, PreparedTransaction]:
    return {m.partition_id: m.transaction for m in messages
            if isinstance(m, KProdCommitMessage) and m.transaction is not None}


def commit(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object], batch_id: int | None) -> int:
    """Commit every task's transaction (a batch write: ``batch_id`` None). Returns how many
    partitions were skipped as already committed by an earlier run of this microbatch."""
    admin = _admin(config)
    txns = _transactions(messages)
    if batch_id is None:
        admin.end_transactions(txns.values(), commit=True)
        return 0
    query = next((m.query_id for m in messages if isinstance(m, KProdCommitMessage) and m.query_id), None)
    done = _committed_before(admin, eo, batch_id, query, len(messages))
    skipped = {p: t for p, t in txns.items() if p in done}
    if skipped:
        log.warning("kprod microbatch %d: partition(s) %s were committed by an earlier run of it; their rows are "
                    "already in Kafka, so this run's transactions for them are aborted",
                    batch_id, ", ".join(map(str, sorted(skipped))))
        admin.end_transactions(skipped.values(), commit=False)
    fresh = {p: t for p, t in txns.items() if p not in done}
    marker = json.dumps({"query": query, "tasks": len(messages)}, separators=(",", ":"))
    admin.send_offsets_to_transactions(
        (t, eo.transactional_id(p), {(eo.marker_topic, MARKER_PARTITION): (batch_id, marker)})
        for p, t in fresh.items())
    admin.end_transactions(fresh.values(), commit=True)
    return len(skipped)


def _committed_before(admin: AdminClient, eo: ExactlyOnce, batch_id: int, query: str | None,
                      tasks: int) -> set[int]:
    """The partitions of this microbatch whose rows an earlier run already committed: all of
    them if the earlier run split it differently and committed it whole."""
    markers = _markers(admin, eo, range(tasks), batch_id, query)
    if not markers:
        return set()
    before = {m.get("tasks") for m in markers.values()}
    if before == {tasks}:
        return set(markers)
    earlier = max(n for n in before if isinstance(n, int))
    if earlier > tasks:
        markers.update(_markers(admin, eo, range(tasks, earlier), batch_id, query))
    if set(markers) >= set(range(earlier)):
        log.warning("kprod microbatch %d was committed whole by an earlier run (%d tasks); this run (%d tasks) "
                    "writes nothing", batch_id, earlier, tasks)
        return set(range(tasks))
    raise PartlyCommittedError(
        f"microbatch {batch_id} was committed in part ({len(markers)} of {earlier} tasks) by an earlier run that "
        f"split it into {earlier} tasks; this run has {tasks}. Restart the query with the same partitioning "
        f"(spark.sql.shuffle.partitions, the source's partitions, the cores) so that each task finds its own "
        f"marker, or the rows of the committed tasks would be written twice")


def _markers(admin: AdminClient, eo: ExactlyOnce, partitions: range, batch_id: int,
             query: str | None) -> dict[int, dict]:
    """Per partition, the marker of an earlier commit of this microbatch (same query)."""
    tp = (eo.marker_topic, MARKER_PARTITION)
    offsets = admin.committed_offsets({eo.transactional_id(p): [tp] for p in partitions})
    found = {}
    for p in partitions:
        offset, metadata = offsets[eo.transactional_id(p)].get(tp, (-1, None))
        if offset < batch_id or not metadata:
            continue
        try:
            marker = json.loads(metadata)
        except ValueError:
            continue  # not ours
        if marker.get("query") == query:
            found[p] = marker
    return found


def abort(config: Mapping[str, str], messages: Sequence[object]) -> None:
    """Abort the transactions of the tasks that finished; the others' are aborted by the
    next attempt of their partition, or by the coordinator after transaction.timeout.ms."""
    txns = _transactions(messages)
    if txns:
        _admin(config).end_transactions(txns.values(), commit=False)
