"""Exactly-once writes: the names of a write's transactions and groups, the task's side of
them (its transactional id, its transaction opened under it, its query and run),
and what the driver reads of the tasks' reports (their transactions, query and run, rows
digests and begin times), with the driver's AdminClients.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from spark_sink.admin import AdminClient, PreparedTransaction
from spark_sink.producer import KafkaProducer
from spark_sink.spark.task_reports import KProdCommitMessage

MARKER_PARTITION = 0


# The names of one prefix can never be another prefix's: what follows the prefix's last
# '-' is a task number (digits), "dir" or, for the registry, a name of its own.
def transactional_id(prefix: str, partition_id: int) -> str:
    """Task ``partition_id``'s transactional id, also the group of its markers."""
    return f"{prefix}-{partition_id}"


def directory_group(prefix: str) -> str:
    """The group that records which microbatch's commit started and the task ids used."""
    return f"{prefix}-dir"


def registry_group(options_key: str) -> str:
    """The group where a query's tasks record the prefix they derived from its id, for the
    driver's abort when no task reported (the driver does not know the query id)."""
    return f"kprod-{options_key}-reg"


def transactional_config(config: Mapping[str, str], prefix: str, partition_id: int) -> dict[str, str]:
    """The producer settings of task ``partition_id``: its own transactional id."""
    return {**config, "transactional.id": transactional_id(prefix, partition_id)}


def fence(producer: KafkaProducer) -> None:
    """Fence earlier attempts of this partition: their open transaction is aborted (and
    done with: init_transactions returns once its coordinator has ended it)."""
    producer.init_transactions()


def fence_and_begin(producer: KafkaProducer) -> None:
    """Fence earlier attempts of this partition and open the task's transaction."""
    fence(producer)
    producer.begin_transaction()


def query_run() -> tuple[str | None, str | None]:
    """The streaming query's id (stable across restarts from its checkpoint) and its run's
    (new at every start: Spark makes it the job group of the query's jobs), if any."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    if ctx is None or not query:
        return None, None
    return query, ctx.getLocalProperty("spark.jobGroup.id")


# -- the driver: its AdminClients, the tasks' reports -----------------------------

# The driver's AdminClients by configuration, most recently used last; a few at most.
_admins: OrderedDict[tuple[tuple[str, str], ...], AdminClient] = OrderedDict()
_admins_lock = threading.Lock()
_MAX_ADMINS = 4


def driver_admin(config: Mapping[str, str]) -> AdminClient:
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


def reported_transactions(messages: Sequence[object]) -> dict[int, PreparedTransaction]:
    """Each reporting task's open transaction (a task without rows has none)."""
    return {m.partition_id: m.transaction for m in messages
            if isinstance(m, KProdCommitMessage) and m.transaction is not None}


def query_of(messages: Sequence[object]) -> str | None:
    """The streaming query the tasks wrote for (None: a batch write, or none reported)."""
    return next((m.query_id for m in messages if isinstance(m, KProdCommitMessage) and m.query_id), None)


def run_of(messages: Sequence[object]) -> str | None:
    """The run of the query the tasks wrote in (its runId)."""
    return next((m.run_id for m in messages if isinstance(m, KProdCommitMessage) and m.run_id), None)


def rows_digests(messages: Sequence[object]) -> dict[int, str]:
    """Each reporting task's rows digest (a task without rows reports the empty one)."""
    return {m.partition_id: m.rows_digest for m in messages
            if isinstance(m, KProdCommitMessage) and m.rows_digest is not None}


def began_ms(messages: Sequence[object]) -> dict[int, float]:
    """When each reporting task opened its transaction (its wall clock, ms)."""
    return {m.partition_id: m.transaction_began_ms for m in messages
            if isinstance(m, KProdCommitMessage) and m.transaction_began_ms is not None}

