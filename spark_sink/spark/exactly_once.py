"""Exactly-once writes: each task's rows in one Kafka transaction, committed by the driver.

A task opens the transaction under ``<prefix>-<partition>`` with its first row (which
fences an earlier attempt of the same partition and aborts what it left open), writes,
flushes and returns the transaction's identity without committing it; a task without
rows opens no producer and no transaction (the driver fences its id at a query's first
commit, for what a crashed run may have left under it). A task that fails aborts its own. The
driver's commit ends them all; its abort ends those of the tasks that finished and fences
the ids of every task, so that nothing stays open until transaction.timeout.ms.

Before it commits, the driver asks each transaction's coordinator whether it is still open
under the epoch its task reported, with time left before its timeout; if any is not, it
aborts them all and fails the write (nothing of it is visible) with an error that says why:
the write outlasted transaction.timeout.ms, or another attempt of a task fenced it.

A microbatch replayed after a driver crash may have been committed in part before the
crash. So the driver commits, with each partition's transaction, a marker: the offset
``batchId`` (metadata: the query id, the microbatch's task count, how many of its tasks
had a transaction and the task's rows digest) of the consumer group
``<prefix>-<partition>`` on ``(markerTopic, 0)``.
And before it ends any transaction of a microbatch, it records in the group
``<prefix>-dir`` (a plain offset commit on the same partition; the *directory*) that this
microbatch's commit has started
and how many task ids any run of the query has used. A replay whose microbatch is named
there reads the markers of every one of those ids: a partition whose marker already holds
this batch id has its rows in Kafka if its task count and rows digest are this run's, and
its new transaction is aborted instead. If a replay splits the microbatch otherwise (a
different number of tasks, or rows dealt otherwise), partitions cannot be matched; a
batch committed whole is then still skipped whole, and one committed in part fails the
query with an error that says so.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from spark_sink.admin import AdminClient, PreparedTransaction, TransactionState
from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import KafkaProducer, KafkaTimeoutError, ProducerConfig
from spark_sink.protocol.error_codes import UnsupportedVersionError
from spark_sink.spark.commit_messages import KProdCommitMessage
from spark_sink.spark.exactly_once_state import DirectoryRecord, Marker, RegistryEntry
from spark_sink.spark.last_will import LastWill
from spark_sink.spark.options import ExactlyOnce, SinkOptions

log = logging.getLogger(__name__)

MARKER_PARTITION = 0
# How long the directory is kept after its last commit (the markers: the broker's
# offsets.retention.minutes): it tells a query's next microbatch from a replay.
DIRECTORY_RETENTION_MS = 365 * 24 * 3600 * 1000
_CLOCK_MARGIN_MS = 3600 * 1000
# How long the driver's abort waits before it fences the tasks' ids again.
REFENCE_AFTER_S = 3.0
# How long a failing task waits for its abort: the task is failing anyway, and what is
# left open is aborted by the next attempt or by the driver's abort.
_TASK_ABORT_TIMEOUT_S = 10.0


class PartlyCommittedError(RuntimeError):
    """A replayed microbatch was committed in part by a run that split it differently."""


class TransactionsEndedError(RuntimeError):
    """A write's transactions cannot all commit: one was ended before the driver's commit
    (timed out, or fenced by another attempt of its task). Every one of them was aborted."""


class MarkersMissingError(RuntimeError):
    """A restarted query's markers are gone: a replayed microbatch cannot be told from a new one."""


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


# When this process last recorded each (registry group, prefix) pair (its monotonic clock, s).
_registered: dict[tuple[str, str], float] = {}
# Kafka drops a group's offsets offsets.retention.minutes (7 days by default) after their
# last commit: a worker that lives longer records its prefix again well before that.
REGISTER_AGAIN_AFTER_S = 24 * 3600.0


def register_prefix(config: Mapping[str, str], eo: ExactlyOnce, prefix: str, clock: Time = SYSTEM_TIME) -> None:
    """Before a task's first transaction under a prefix derived from the query id, record
    the prefix where the driver's abort can find it (once per Python worker and day)."""
    key = (eo.options_key, prefix)
    last = _registered.get(key)
    if eo.prefix is not None or (last is not None and clock() / 1000 - last < REGISTER_AGAIN_AFTER_S):
        return
    with AdminClient(dict(config)) as admin:
        admin.commit_offsets(registry_group(eo.options_key),
                             {(eo.marker_topic, MARKER_PARTITION): (RegistryEntry.OFFSET, RegistryEntry(prefix).encode())})
    _registered[key] = clock() / 1000


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
    except Exception as exc:
        log.warning("kprod task could not abort its transaction (%s); it is aborted when its id is fenced", exc)


def query_run() -> tuple[str | None, str | None]:
    """The streaming query's id (stable across restarts from its checkpoint) and its run's
    (new at every start: Spark makes it the job group of the query's jobs), if any."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
    if ctx is None or not query:
        return None, None
    return query, ctx.getLocalProperty("spark.jobGroup.id")


# -- the driver -------------------------------------------------------------------

# The driver's AdminClients by configuration, most recently used last; a few at most.
_admins: OrderedDict[tuple[tuple[str, str], ...], AdminClient] = OrderedDict()
_admins_lock = threading.Lock()
_MAX_ADMINS = 4
# The runs (prefix, runId) whose leftovers this process has fenced: needed at a query's
# first commit after a (re)start only, not at every microbatch.
_fenced: set[tuple[str, str | None]] = set()


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


def _run(messages: Sequence[object]) -> str | None:
    return next((m.run_id for m in messages if isinstance(m, KProdCommitMessage) and m.run_id), None)


class Committed(NamedTuple):
    """What the driver's commit did: how many transactions it committed, and the tasks it
    skipped because an earlier run of the microbatch committed their rows."""

    transactions: int
    skipped: frozenset[int] = frozenset()


def commit(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object],
           batch_id: int | None, clock: Time = SYSTEM_TIME) -> Committed:
    """Commit every task's transaction (a batch write: ``batch_id`` None). If this worker
    is killed before the commit is done (Spark's abort then fails too), its last will
    aborts the write, or ends the commits it had begun."""
    with LastWill() as will:
        will.set(_abort, config, eo, messages)
        return _commit(will, config, eo, messages, batch_id, clock)


def _commit(will: LastWill, config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object],
            batch_id: int | None, clock: Time) -> Committed:
    admin = _admin(config)
    txns = _transactions(messages)
    began = _began(messages)
    if batch_id is None and eo.one_write:
        _check_open(admin, config, txns, began, "batch write", clock)
        # From the first EndTxn on, a worker killed leaves some committed: the others follow.
        will.set(_end_commits, config, list(txns.values()))
        _end_checked(admin, config, txns, began, "batch write", clock)
        return Committed(len(txns))
    # A batch write under a prefix the user named is that name's one microbatch: a rerun
    # (after a driver death in the middle of its commit) completes it instead of writing
    # what was committed again.
    what = "batch write" if batch_id is None else f"microbatch {batch_id}"
    batch_id = 0 if batch_id is None else batch_id
    query = _query(messages)
    prefix = eo.prefix_for(query)
    tasks = len(messages)
    directory = (eo.marker_topic, MARKER_PARTITION)
    started_batch, ids, record = _read_directory(admin, prefix, directory, query)
    if started_batch < 0 and batch_id > 0 and eo.missing_markers == "fail":
        raise MarkersMissingError(_missing_text(what, f"group {directory_group(prefix)!r}", eo))
    ids = max(ids, tasks)
    # Once per run of a query (a restart in the same application reuses the driver's
    # worker), and at every batch write.
    run = (prefix, _run(messages))
    if run[1] is None or run not in _fenced:
        # Ids an earlier run used that hold no transaction of this one (this run has
        # fewer tasks, or their task was empty and opened none) may hold transactions a
        # crash left open: aborted now, not at transaction.timeout.ms, and their pending
        # markers settled before they are read.
        idle = [p for p in range(ids) if p >= tasks or p not in txns]
        idle += _open_beyond(admin, prefix, ids)
        admin.fence_transactions([transactional_id(prefix, p) for p in idle])
        _fenced.add(run)
    already: set[int] = set()
    rows = _rows_digests(messages)
    replay = started_batch >= batch_id
    if replay and started_batch == batch_id and record is not None and record.done:
        # An earlier run's commit of it ended whole: every row is in Kafka, whether or not
        # Kafka still keeps the markers (a named batch write run again weeks later).
        _abort_skipped(admin, what, txns)
        return Committed(0, frozenset(txns))
    if replay and eo.missing_markers == "fail" and record is not None \
            and _markers_may_have_expired(admin, prefix, record, clock):
        raise MarkersMissingError(_missing_text(what, f"markers of microbatch {started_batch}", eo))
    # A replay (the directory names this microbatch), or a first microbatch whose directory
    # is gone (a replay of microbatch 0 cannot otherwise be told from a new query's start).
    if replay or started_batch < 0:
        markers = _markers(admin, prefix, eo, range(ids), batch_id, query)
        already = _committed_before(markers, batch_id, tasks=tasks, rows=rows)
    fresh = {p: t for p, t in txns.items() if p not in already}
    _check_open(admin, config, fresh, began, what, clock)
    # Before any transaction of this microbatch commits: a replay must look for markers.
    # Kept a year (not offsets.retention.minutes): a query idle for weeks still knows its
    # next microbatch from a replay. "at": when its markers began to be written (a replay
    # after they may have expired is refused).
    at = record.at if replay and record is not None else None
    entry = DirectoryRecord(query=query, ids=ids, at=int(clock.wall_ms()) if at is None else at)
    admin.commit_offsets(directory_group(prefix), {directory: (batch_id, entry.encode())},
                         retention_ms=DIRECTORY_RETENTION_MS)
    skipped = {p: t for p, t in txns.items() if p in already}
    _abort_skipped(admin, what, skipped)
    admin.send_offsets_to_transactions(
        (t, transactional_id(prefix, p),
         {directory: (batch_id, Marker(query=query, tasks=tasks, txns=len(txns), rows=rows.get(p)).encode())})
        for p, t in fresh.items())
    will.set(_end_commits, config, list(fresh.values()))
    _end_checked(admin, config, fresh, began, what, clock)
    # "done": a replay skips it whole without its markers, which Kafka keeps only
    # offsets.retention.minutes. Without it (this commit failing), a replay reads them.
    try:
        done = dataclasses.replace(entry, done=True)
        admin.commit_offsets(directory_group(prefix), {directory: (batch_id, done.encode())},
                             retention_ms=DIRECTORY_RETENTION_MS)
    except Exception as exc:
        log.warning("kprod %s: committed, but recording that in group %r failed (%s); a replay of it reads its "
                    "markers instead", what, directory_group(prefix), exc)
    return Committed(len(fresh), frozenset(skipped))


def _abort_skipped(admin: AdminClient, what: str, skipped: Mapping[int, PreparedTransaction]) -> None:
    """Abort this run's transactions of the partitions an earlier run already committed."""
    if skipped:
        log.warning("kprod %s: partition(s) %s were committed by an earlier run of it; their rows are already in "
                    "Kafka, so this run's transactions for them are aborted", what, ", ".join(map(str, sorted(skipped))))
        admin.end_transactions(skipped.values(), commit=False)


def _open_beyond(admin: AdminClient, prefix: str, start: int) -> list[int]:
    """The ids from ``start`` on that hold an open transaction, as every broker's
    coordinator lists them (ListTransactions): a run whose driver died before its commit
    (so that no directory recorded its task count) may have had more tasks than this one,
    as far apart as an aggregation's shuffle partitions. Where they cannot be listed (a
    cluster older than Kafka 3.0, a broker down), those stay open until their timeout:
    the commit goes on."""
    try:
        listed = admin.list_transactions(("Ongoing",))
    except (UnsupportedVersionError, KafkaTimeoutError) as exc:
        log.warning("kprod: the open transactions could not be listed (%s); any a crashed run of %s left under "
                    "ids beyond %d stay open until transaction.timeout.ms", exc, prefix, start)
        return []
    ids = (tid[len(prefix) + 1:] for tid in listed if tid.startswith(prefix + "-"))
    return sorted(p for p in (int(i) for i in ids if i.isdigit() and i.isascii()) if p >= start)


def commit_margin_ms(timeout_ms: int) -> float:
    """The time a transaction must have left before its timeout for the driver to commit
    it: the commit's few round trips, clocks a little apart, and a driver that stalls
    (a garbage collection, a paused VM) between the check and its EndTxns."""
    return max(1_000.0, min(60_000.0, timeout_ms / 5))


def _rows_digests(messages: Sequence[object]) -> dict[int, str]:
    """Each reporting task's rows digest (a task without rows reports the empty one)."""
    return {m.partition_id: m.rows_digest for m in messages
            if isinstance(m, KProdCommitMessage) and m.rows_digest is not None}


def _began(messages: Sequence[object]) -> dict[int, float]:
    return {m.partition_id: m.transaction_began_ms for m in messages
            if isinstance(m, KProdCommitMessage) and m.transaction_began_ms is not None}


def _check_open(admin: AdminClient, config: Mapping[str, str], txns: Mapping[int, PreparedTransaction],
                began: Mapping[int, float], what: str, clock: Time) -> None:
    """Commit nothing unless every transaction will still be open when its EndTxn arrives:
    open, under the epoch its task reported, with :func:`commit_margin_ms` left before the
    coordinator may abort it. Otherwise abort those still open and raise
    TransactionsEndedError naming the first one that is not, and why."""
    if not txns:
        return
    states = admin.describe_transactions(t.transactional_id for t in txns.values())
    now = clock.wall_ms()
    ended = {}
    for p, t in sorted(txns.items()):
        state = states[t.transactional_id]
        deadline = state.deadline_ms
        same = (state.producer_id, state.producer_epoch) == (t.producer_id, t.producer_epoch)
        if not same or deadline is None or deadline - now < commit_margin_ms(state.timeout_ms):
            ended[p] = state
    if not ended:
        return
    alive = [t for p, t in txns.items() if p not in ended]
    try:
        admin.end_transactions(alive, commit=False)
    except Exception as exc:
        log.warning("kprod %s: aborting its other transactions failed (%s)", what, exc)
    p, state = next(iter(ended.items()))
    raise TransactionsEndedError(_ended_text(admin, config, what, p, txns[p], state, began_ms=began.get(p), now=now,
                                             ended=len(ended), total=len(txns), committed=0))


def _end_checked(admin: AdminClient, config: Mapping[str, str], txns: Mapping[int, PreparedTransaction],
                 began: Mapping[int, float], what: str, clock: Time) -> None:
    """Commit the transactions; if an EndTxn is refused because its transaction ended
    meanwhile (a timeout close to the check), raise TransactionsEndedError saying so, and
    how many were committed all the same."""
    try:
        admin.end_transactions(txns.values(), commit=True)
    except Exception as exc:
        states = admin.describe_transactions(t.transactional_id for t in txns.values())
        ok = {p for p, t in txns.items() if states[t.transactional_id].state in ("PrepareCommit", "CompleteCommit")
              and admin.ended_by_us(t, states[t.transactional_id])}
        lost = [(p, t) for p, t in sorted(txns.items()) if p not in ok]
        if not lost:
            return  # every one committed: the error was about an answer, not the outcome
        p, t = lost[0]
        raise TransactionsEndedError(_ended_text(
            admin, config, what, p, t, states[t.transactional_id], began_ms=began.get(p), now=clock.wall_ms(),
            ended=len(lost), total=len(txns), committed=len(ok))) from exc


def _ended_text(admin: AdminClient, config: Mapping[str, str], what: str, partition: int, txn: PreparedTransaction,
                state: TransactionState, *, began_ms: float | None, now: float, ended: int, total: int,
                committed: int) -> str:
    """Why task ``partition``'s transaction cannot be committed, and what to do."""
    timeout_ms = ProducerConfig.from_dict(config).transaction_timeout_ms
    began_ms = state.start_time_ms if state.start_time_ms >= 0 else began_ms
    age = f"{(now - began_ms) / 1000:.1f} s" if began_ms is not None else "an unknown time"
    if committed:
        outcome = (f"{committed} of its {total} transaction(s) were committed before this one was found ended: "
                   f"their rows are visible, the others' are not.")
    else:
        outcome = (f"Nothing of the {what} is visible to read_committed consumers: its {total} transaction(s) were "
                   f"aborted, so running it again writes it once.")
    fenced = (state.producer_id == txn.producer_id and state.producer_epoch > txn.producer_epoch
              and (began_ms is None or now - began_ms < (state.timeout_ms or timeout_ms)))
    if fenced:
        return (f"kprod {what} (exactly-once): the transaction of task {partition} ({txn.transactional_id}) was "
                f"ended by another producer with the same transactional id (epoch {state.producer_epoch}, the task "
                f"reported {txn.producer_epoch}): another attempt of task {partition} ran after this one finished, as "
                "a speculative copy (spark.speculation=true), a retried stage or an executor thought lost does. "
                f"Exactly-once writes need spark.speculation=false. {outcome}")
    left = "" if state.deadline_ms is None else (
        f" and had {max(0.0, state.deadline_ms - now) / 1000:.1f} s left, less than the "
        f"{commit_margin_ms(state.timeout_ms) / 1000:.1f} s a commit needs")
    try:
        maximum = admin.coordinator_config(txn.transactional_id, ["transaction.max.timeout.ms"]).get(
            "transaction.max.timeout.ms")
    except Exception:
        maximum = None
    limit = f" (this cluster allows up to transaction.max.timeout.ms={maximum})" if maximum else ""
    return (f"kprod {what} (exactly-once) outlasted its transactions' timeout: the transaction of task {partition} "
            f"({txn.transactional_id}) began {age} before the commit{left}; kafka.transaction.timeout.ms is "
            f"{timeout_ms} ms, and the coordinator aborts a transaction that stays open longer ({ended} of {total} "
            f"timed out or about to). A task's transaction stays open from its first row until the driver commits "
            f"after the last task, so the first tasks wait for the last. Raise kafka.transaction.timeout.ms{limit}, "
            f"or make the write shorter. {outcome}")


def _missing_text(what: str, missing: str, eo: ExactlyOnce) -> str:
    """Why a microbatch (or a named batch write) is refused when the markers it would be
    checked against are gone."""
    streaming = what.startswith("microbatch")
    run, whose = ("last run", "this query") if streaming else ("last run of this name", "this write")
    return (f"{what}: the exactly-once markers of {whose} ({missing} on {eo.marker_topic}-{MARKER_PARTITION}) "
            f"are gone, and nothing records that its commit ended, so what the {run} committed in part cannot be "
            "told apart and could be written twice. Kafka keeps the markers offsets.retention.minutes (7 days by "
            "default) after their last commit, and the directory a year; they are also missing when the "
            "checkpoint was written by another sink or an older kprod, or when kprod.transactionalIdPrefix or "
            f"kprod.markerTopic changed. If the {run} did not fail in the middle of its commit, run once with "
            "option kprod.missingMarkers=ignore")


def _read_directory(admin: AdminClient, prefix: str, directory: tuple[str, int], query: str | None
                    ) -> tuple[int, int, DirectoryRecord | None]:
    """(the last microbatch whose commit started, the task ids any run has used, the whole
    record) as the directory holds them; (-1, 0, None) if it records nothing of this query."""
    group = directory_group(prefix)
    offset, metadata = admin.committed_offsets({group: [directory]})[group].get(directory, (-1, None))
    record = DirectoryRecord.decode(metadata)
    if offset < 0 or record is None or record.query != query:
        return -1, 0, None
    return offset, record.ids, record


def _committed_before(markers: Mapping[int, tuple[int, Marker]], batch_id: int, *, tasks: int,
                      rows: Mapping[int, str]) -> set[int]:
    """The partitions of this microbatch whose rows an earlier run already committed: all of
    them if an earlier run split it otherwise and committed it whole.

    A marker stands for this run's task of the same number when the earlier run had as
    many tasks and that task's rows digest equals this one's (under kprod.replayMatch=tasks,
    where tasks report no digest, the count alone; a marker without a digest, from a run
    under tasks or an older kprod, matches no task with one). A marker of a later
    microbatch means this one was committed before it."""
    if not markers:
        return set()

    def same_task(p: int, offset: int, marker: Marker) -> bool:
        if marker.tasks != tasks:
            return False
        mine = rows.get(p)
        return offset > batch_id or mine is None or marker.rows == mine

    if all(same_task(p, offset, m) for p, (offset, m) in markers.items()):
        return set(markers)
    # Split otherwise: whole if every transaction of some earlier split has its marker.
    by_split: dict[int, list[Marker]] = {}
    for _, m in markers.values():
        by_split.setdefault(m.tasks, []).append(m)

    def transactions(split: int, of_split: list[Marker]) -> int:
        return max((m.txns for m in of_split if m.txns is not None), default=split)

    for earlier, of_earlier in by_split.items():
        if len(of_earlier) >= transactions(earlier, of_earlier):
            log.warning("kprod microbatch %d was committed whole by an earlier run (%s tasks) that split it "
                        "otherwise; this run (%d tasks) writes nothing", batch_id, earlier, tasks)
            return set(range(tasks))
    earlier, of_earlier = max(by_split.items(), key=lambda item: len(item[1]))
    expected = transactions(earlier, of_earlier)
    same_count = earlier == tasks
    how = (f"into {earlier} tasks, as this run does, but with other rows in them" if same_count
           else f"into {earlier} tasks; this run has {tasks}")
    unstable = ("; if the query's rows are not the same in every run (values computed with uuid(), rand() or "
                "current_timestamp()), or the earlier run wrote markers without rows digests (under "
                "kprod.replayMatch=tasks, or an older kprod) and the partitioning is unchanged, restart it with "
                "option kprod.replayMatch=tasks" if same_count else "")
    raise PartlyCommittedError(
        f"microbatch {batch_id} was committed in part ({len(of_earlier)} of {expected} transactions) by an earlier "
        f"run that split it {how}. Restart the query with the same partitioning (spark.sql.shuffle.partitions, "
        f"the source's partitions, the cores, repartition()) so that each task holds the rows it held, or the "
        f"rows of the committed tasks would be written twice{unstable}")


def _markers_may_have_expired(admin: AdminClient, prefix: str, record: DirectoryRecord, clock: Time) -> bool:
    """Whether Kafka may have dropped the markers of the microbatch whose commit the
    directory ``record`` says started: its markers were committed after it, and each is
    kept offsets.retention.minutes (the cluster's, read from a broker) after its commit. An
    hour of margin covers the driver's clock against the brokers'."""
    at = record.at
    if at is None:
        return False  # written by an older kprod: not known
    minutes = admin.coordinator_config(transactional_id(prefix, 0), ["offsets.retention.minutes"]).get(
        "offsets.retention.minutes")
    retention_ms = int(minutes) * 60_000 if minutes else 7 * 24 * 3600 * 1000
    return clock.wall_ms() - at > retention_ms - _CLOCK_MARGIN_MS


def _markers(admin: AdminClient, prefix: str, eo: ExactlyOnce, partitions: range, batch_id: int,
             query: str | None) -> dict[int, tuple[int, Marker]]:
    """Per partition, the offset and marker of an earlier commit of this microbatch or a
    later one (same query)."""
    tp = (eo.marker_topic, MARKER_PARTITION)
    offsets = admin.committed_offsets({transactional_id(prefix, p): [tp] for p in partitions})
    found = {}
    for p in partitions:
        offset, metadata = offsets[transactional_id(prefix, p)].get(tp, (-1, None))
        marker = Marker.decode(metadata) if offset >= batch_id else None
        if marker is not None and marker.query == query:
            found[p] = (offset, marker)
    return found


def abort(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object], clock: Time = SYSTEM_TIME) -> None:
    """Abort the transactions of the tasks that finished, and fence the ids of every task
    of the write: a task that died with its worker (or whose own abort failed) leaves its
    transaction open, holding back every later record of its partitions from
    read_committed consumers until transaction.timeout.ms; so does another attempt of a
    finished task (a speculative copy, an executor thought lost) that opened one under
    the same id, at an epoch the finished task's EndTxn cannot end. A worker killed in the
    middle of it leaves the abort to its last will."""
    with LastWill() as will:
        will.set(_abort, config, eo, messages)
        _abort(config, eo, messages, clock)


def _abort(config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object],
           clock: Time = SYSTEM_TIME) -> None:
    admin = _admin(config)
    txns = _transactions(messages)
    try:
        if txns:
            admin.end_transactions(txns.values(), commit=False)
    finally:
        # Even when ending a reported one is refused (its coordinator already ended it at
        # its timeout, or another attempt fenced it): the others may still be open.
        _fence_all(admin, eo, messages, clock)


def _end_commits(config: Mapping[str, str], txns: Sequence[PreparedTransaction]) -> None:
    """End the commits of a microbatch whose driver worker died after it began them (an
    EndTxn of a transaction already committed is answered as done)."""
    _admin(config).end_transactions(txns, commit=True)


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
    query = _query(messages)
    if eo.prefix is not None or query:
        return eo.prefix_for(query)
    tp, group = (eo.marker_topic, MARKER_PARTITION), registry_group(eo.options_key)
    offset, metadata = admin.committed_offsets({group: [tp]})[group].get(tp, (-1, None))
    entry = RegistryEntry.decode(metadata) if offset >= 0 else None
    return None if entry is None else entry.prefix


def with_transaction_timeout(options: SinkOptions) -> SinkOptions:
    """An exactly-once batch write's options with the longest transaction.timeout.ms the
    cluster allows (its transaction.max.timeout.ms), unless the user set one: a batch
    write's first tasks hold their transactions open until the last task is done."""
    eo = options.exactly_once
    if eo is None or not eo.batch or eo.timeout_given or eo.prefix is None:
        return options  # (a batch write always has its prefix, given or its own)
    config = options.producer_config
    value = _admin(config).coordinator_config(transactional_id(eo.prefix, 0), ["transaction.max.timeout.ms"]).get(
        "transaction.max.timeout.ms")
    if not value:
        return options
    return dataclasses.replace(options, producer_config={**config, "transaction.timeout.ms": value})
