"""Exactly-once writes: each task's rows in one Kafka transaction, committed by the driver.

A task opens the transaction under ``<prefix>-<partition>`` with its first row (which
fences an earlier attempt of the same partition and aborts what it left open), writes,
flushes and returns the transaction's identity without committing it; a task without
rows opens no producer and no transaction (the driver fences its id at a query's first
commit, for what a crashed run may have left under it). A task that fails aborts its own. The
driver's commit ends them all; its abort ends those of the tasks that finished and fences
the ids of those that did not, so that nothing stays open until transaction.timeout.ms.

A microbatch replayed after a driver crash may have been committed in part before the
crash. So the driver commits, with each partition's transaction, a marker: the offset
``batchId`` (metadata: the query id, the microbatch's task count and how many of its tasks
had a transaction) of the consumer group ``<prefix>-<partition>`` on ``(markerTopic, 0)``.
And before it ends any transaction of a microbatch, it records in the group ``<prefix>``
(a plain offset commit on the same partition) that this microbatch's commit has started
and how many task ids any run of the query has used. A replay whose microbatch is named
there reads the markers of every one of those ids: a partition whose marker already holds
this batch id has its rows in Kafka, and its new transaction is aborted instead. If a
replay splits the microbatch into a different number of tasks, partitions cannot be
matched; a batch committed whole is then still skipped whole, and one committed in part
fails the query with an error that says so.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from spark_sink.producer import AdminClient, KafkaProducer, PreparedTransaction
from spark_sink.spark.messages import KProdCommitMessage
from spark_sink.spark.options import ExactlyOnce

log = logging.getLogger(__name__)

MARKER_PARTITION = 0
# How long a failing task waits for its abort: the task is failing anyway, and what is
# left open is aborted by the next attempt or by the driver's abort.
_TASK_ABORT_TIMEOUT_S = 10.0


class PartlyCommittedError(RuntimeError):
    """A replayed microbatch was committed in part by a run that split it differently."""


def transactional_id(prefix: str, partition_id: int) -> str:
    return f"{prefix}-{partition_id}"


def transactional_config(config: Mapping[str, str], prefix: str, partition_id: int) -> dict[str, str]:
    """The producer settings of task ``partition_id``: its own transactional id."""
    return {**config, "transactional.id": transactional_id(prefix, partition_id)}


def fence_and_begin(producer: KafkaProducer) -> None:
    """Fence earlier attempts of this partition (their open transaction is aborted) and
    open the task's transaction."""
    producer.init_transactions()
    producer.begin_transaction()


def abort_in_task(producer: KafkaProducer) -> None:
    """A failing task aborts the transaction it opened, so that records written to its
    partitions after it are not held back from read_committed consumers; if even that
    fails, the driver's abort or the next attempt fences it."""
    try:
        producer.abort_transaction(_TASK_ABORT_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 (the task's own error is the one to raise)
        log.warning("kprod task could not abort its transaction (%s); it is aborted when its id is fenced", exc)


def query_id() -> str | None:
    """The streaming query's id (stable across restarts from its checkpoint), if any."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None


# -- the driver -------------------------------------------------------------------

# The driver's AdminClients by configuration, most recently used last; a few at most.
_admins: OrderedDict[tuple[tuple[str, str], ...], AdminClient] = OrderedDict()
_admins_lock = threading.Lock()
_MAX_ADMINS = 4
# The prefixes whose leftovers this process has fenced: needed at a query's first commit
# after a (re)start only, not at every microbatch.
_fenced: set[str] = set()


def _admin(config: Mapping[str, str]) -> AdminClient:
    """One AdminClient per configuration in the driver's Python worker, kept across
    microbatches: its connections and the coordinators it found are reused."""
    key = tuple(sorted(config.items()))
    with _admins_lock:
        admin = _admins.get(key)
        if admin is None:
            admin = _admins[key] = AdminClient(dict(config))
            while len(_admins) > _MAX_ADMINS:
                _admins.popitem(last=False)[1].close()
        _admins.move_to_end(key)
        return admin


def _transactions(messages: Sequence[object]) -> dict[int, PreparedTransaction]:
    return {m.partition_id: m.transaction for m in messages
            if isinstance(m, KProdCommitMessage) and m.transaction is not None}


def _query(messages: Sequence[object]) -> str | None:
    return next((m.query_id for m in messages if isinstance(m, KProdCommitMessage) and m.query_id), None)


def commit(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object], batch_id: int | None) -> int:
    """Commit every task's transaction (a batch write: ``batch_id`` None). Returns how many
    were committed (not skipped as already committed by an earlier run of this microbatch)."""
    admin = _admin(config)
    txns = _transactions(messages)
    if batch_id is None:
        admin.end_transactions(txns.values(), commit=True)
        return len(txns)
    query = _query(messages)
    prefix = eo.prefix_for(query)
    tasks = len(messages)
    directory = (eo.marker_topic, MARKER_PARTITION)
    started_batch, ids = _read_directory(admin, prefix, directory, query)
    ids = max(ids, tasks)
    if prefix not in _fenced:
        # Ids an earlier run used that hold no transaction of this one (this run has
        # fewer tasks, or their task was empty and opened none) may hold transactions a
        # crash left open: aborted now, not at transaction.timeout.ms, and their pending
        # markers settled before they are read.
        idle = [p for p in range(ids) if p >= tasks or p not in txns]
        admin.fence_transactions([transactional_id(prefix, p) for p in idle])
        _fenced.add(prefix)
    already = set()
    if started_batch >= batch_id:
        already = _committed_before(admin, prefix, eo, batch_id, query, tasks, ids, len(txns))
    # Before any transaction of this microbatch commits: a replay must look for markers.
    admin.commit_offsets(prefix, {directory: (batch_id, json.dumps({"query": query, "ids": ids}))})
    skipped = {p: t for p, t in txns.items() if p in already}
    if skipped:
        log.warning("kprod microbatch %d: partition(s) %s were committed by an earlier run of it; their rows are "
                    "already in Kafka, so this run's transactions for them are aborted",
                    batch_id, ", ".join(map(str, sorted(skipped))))
        admin.end_transactions(skipped.values(), commit=False)
    fresh = {p: t for p, t in txns.items() if p not in already}
    marker = json.dumps({"query": query, "tasks": tasks, "txns": len(txns)}, separators=(",", ":"))
    admin.send_offsets_to_transactions(
        (t, transactional_id(prefix, p), {directory: (batch_id, marker)}) for p, t in fresh.items())
    admin.end_transactions(fresh.values(), commit=True)
    return len(fresh)


def _read_directory(admin: AdminClient, prefix: str, directory: tuple[str, int], query: str | None
                    ) -> tuple[int, int]:
    """(the last microbatch whose commit started, the task ids any run has used) as the
    group ``prefix`` records them; (-1, 0) if it records nothing of this query."""
    offset, metadata = admin.committed_offsets({prefix: [directory]})[prefix].get(directory, (-1, None))
    try:
        record = json.loads(metadata) if metadata else {}
    except ValueError:
        record = {}
    if offset < 0 or record.get("query") != query or not isinstance(record.get("ids"), int):
        return -1, 0
    return offset, record["ids"]


def _committed_before(admin: AdminClient, prefix: str, eo: ExactlyOnce, batch_id: int, query: str | None,
                      tasks: int, ids: int, txns: int) -> set[int]:
    """The partitions of this microbatch whose rows an earlier run already committed: all of
    them if the earlier run split it differently and committed it whole."""
    markers = _markers(admin, prefix, eo, range(ids), batch_id, query)
    if not markers:
        return set()
    splits = {m.get("tasks") for m in markers.values()}
    if splits == {tasks}:
        return set(markers)
    earlier = max((n for n in splits if isinstance(n, int) and n != tasks), default=tasks)
    of_earlier = [m for m in markers.values() if m.get("tasks") == earlier]
    expected = max((m.get("txns") for m in of_earlier if isinstance(m.get("txns"), int)), default=earlier)
    if len(of_earlier) >= expected:
        log.warning("kprod microbatch %d was committed whole by an earlier run (%d tasks); this run (%d tasks) "
                    "writes nothing", batch_id, earlier, tasks)
        return set(range(tasks))
    raise PartlyCommittedError(
        f"microbatch {batch_id} was committed in part ({len(of_earlier)} of {expected} transactions) by an earlier "
        f"run that split it into {earlier} tasks; this run has {tasks}. Restart the query with the same "
        f"partitioning (spark.sql.shuffle.partitions, the source's partitions, the cores) so that each task finds "
        f"its own marker, or the rows of the committed tasks would be written twice")


def _markers(admin: AdminClient, prefix: str, eo: ExactlyOnce, partitions: range, batch_id: int,
             query: str | None) -> dict[int, dict]:
    """Per partition, the marker of an earlier commit of this microbatch (same query)."""
    tp = (eo.marker_topic, MARKER_PARTITION)
    offsets = admin.committed_offsets({transactional_id(prefix, p): [tp] for p in partitions})
    found = {}
    for p in partitions:
        offset, metadata = offsets[transactional_id(prefix, p)].get(tp, (-1, None))
        if offset < batch_id or not metadata:
            continue
        try:
            marker = json.loads(metadata)
        except ValueError:
            continue  # not ours
        if marker.get("query") == query:
            found[p] = marker
    return found


def abort(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object]) -> None:
    """Abort the transactions of the tasks that finished, and fence the ids of those that
    did not: a task that died with its worker (or whose own abort failed) leaves its
    transaction open, holding back every later record of its partitions from
    read_committed consumers until transaction.timeout.ms."""
    admin = _admin(config)
    txns = _transactions(messages)
    if txns:
        admin.end_transactions(txns.values(), commit=False)
    unfinished = [p for p, m in enumerate(messages) if not isinstance(m, KProdCommitMessage)]
    query = _query(messages)
    if unfinished and (eo.prefix is not None or query):
        admin.fence_transactions([transactional_id(eo.prefix_for(query), p) for p in unfinished])
    elif unfinished:
        log.warning("kprod: no task of this microbatch finished, so its transactional ids are unknown here; "
                    "what its tasks left open is aborted by the query's next run or after transaction.timeout.ms")
