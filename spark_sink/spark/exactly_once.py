"""Exactly-once writes: each task's rows in one Kafka transaction, committed by the driver.

A task opens the transaction under ``<prefix>-<partition>`` with its first row (which
fences an earlier attempt of the same partition and aborts what it left open), writes,
flushes and returns the transaction's identity without committing it; a task without
rows opens no transaction (the driver fences its id at a query's first commit, for what a
crashed run may have left under it), but a retried one without rows fences its id, for
what its failed attempt left open. A task that fails aborts its own. The
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

This module is the driver's commit; the names and the tasks' reports are in
:mod:`exactly_once_names`, what is kept in Kafka in :mod:`exactly_once_state`, and the
abort in :mod:`exactly_once_abort`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from spark_sink.admin import AdminClient, PreparedTransaction, TransactionState
from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import KafkaTimeoutError, ProducerConfig
from spark_sink.protocol.error_codes import UnsupportedVersionError
from spark_sink.spark.exactly_once_abort import abort_write
from spark_sink.spark.exactly_once_names import (
    MARKER_PARTITION,
    began_ms,
    directory_group,
    driver_admin,
    query_of,
    reported_transactions,
    rows_digests,
    run_of,
    transactional_id,
)
from spark_sink.spark.exactly_once_state import (
    DirectoryRecord,
    Marker,
    committed_before,
    markers_may_have_expired,
    read_directory,
    read_markers,
)
from spark_sink.spark.last_will import LastWill
from spark_sink.spark.options import ExactlyOnce, SinkOptions

log = logging.getLogger(__name__)

# How long the directory is kept after its last commit (the markers: the broker's
# offsets.retention.minutes): it tells a query's next microbatch from a replay.
DIRECTORY_RETENTION_MS = 365 * 24 * 3600 * 1000


class TransactionsEndedError(RuntimeError):
    """A write's transactions cannot all commit: one was ended before the driver's commit
    (timed out, or fenced by another attempt of its task). Every one of them was aborted."""


class MarkersMissingError(RuntimeError):
    """A restarted query's markers are gone: a replayed microbatch cannot be told from a new one."""


# The runs (prefix, runId) whose leftovers this process has fenced: needed at a query's
# first commit after a (re)start only, not at every microbatch.
_fenced: set[tuple[str, str | None]] = set()


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
        will.set(abort_write, config, eo, messages)
        return _commit(will, config, eo, messages, batch_id, clock)


@dataclasses.dataclass(frozen=True)
class _Microbatch:
    """A microbatch to commit with markers (a named batch write: microbatch 0), and what
    its tasks reported."""

    what: str  # "microbatch 7", or "batch write"
    batch_id: int
    query: str | None
    prefix: str
    tasks: int
    marker_tp: tuple[str, int]  # the partition of the markers and the directory
    txns: dict[int, PreparedTransaction]
    began: dict[int, float]
    rows: dict[int, str]


def _commit(will: LastWill, config: Mapping[str, str], eo: ExactlyOnce, messages: Sequence[object],
            batch_id: int | None, clock: Time) -> Committed:
    admin = driver_admin(config)
    txns, began = reported_transactions(messages), began_ms(messages)
    if batch_id is None and eo.one_write:
        _check_open(admin, config, txns, began, "batch write", clock)
        # From the first EndTxn on, a worker killed leaves some committed: the others follow.
        will.set(end_commits, config, list(txns.values()))
        _end_checked(admin, config, txns, began, "batch write", clock)
        return Committed(len(txns))
    # A batch write under a prefix the user named is that name's one microbatch: a rerun
    # (after a driver death in the middle of its commit) completes it instead of writing
    # what was committed again.
    query = query_of(messages)
    mb = _Microbatch("batch write" if batch_id is None else f"microbatch {batch_id}",
                     0 if batch_id is None else batch_id, query, eo.prefix_for(query), len(messages),
                     (eo.marker_topic, MARKER_PARTITION), txns, began, rows_digests(messages))
    started_batch, ids, record = read_directory(admin, mb.prefix, mb.marker_tp, query)
    if started_batch < 0 and mb.batch_id > 0 and eo.missing_markers == "fail":
        raise MarkersMissingError(_missing_text(mb.what, f"group {directory_group(mb.prefix)!r}", eo))
    ids = max(ids, mb.tasks)
    _fence_leftovers(admin, mb, ids, run_of(messages))
    replay = started_batch >= mb.batch_id
    if replay and started_batch == mb.batch_id and record is not None and record.done:
        # An earlier run's commit of it ended whole: every row is in Kafka, whether or not
        # Kafka still keeps the markers (a named batch write run again weeks later).
        _abort_skipped(admin, mb.what, txns)
        return Committed(0, frozenset(txns))
    if replay and eo.missing_markers == "fail" and record is not None \
            and markers_may_have_expired(admin, mb.prefix, record, clock):
        raise MarkersMissingError(_missing_text(mb.what, f"markers of microbatch {started_batch}", eo))
    already: set[int] = set()
    # A replay (the directory names this microbatch), or a first microbatch whose directory
    # is gone (a replay of microbatch 0 cannot otherwise be told from a new query's start).
    if replay or started_batch < 0:
        markers = read_markers(admin, mb.prefix, eo, range(ids), mb.batch_id, query)
        already = committed_before(markers, mb.batch_id, tasks=mb.tasks, rows=mb.rows)
    # "at": when its markers began to be written (a replay after they may have expired is
    # refused); a replay keeps the first run's.
    at = record.at if replay and record is not None else None
    entry = DirectoryRecord(query=query, ids=ids, at=int(clock.wall_ms()) if at is None else at)
    return _commit_with_markers(will, admin, config, mb, entry, already, clock)


def _fence_leftovers(admin: AdminClient, mb: _Microbatch, ids: int, run_id: str | None) -> None:
    """Once per run of a query (a restart in the same application reuses the driver's
    worker), and at every batch write: ids an earlier run used that hold no transaction of
    this one (this run has fewer tasks, or their task was empty and opened none) may hold
    transactions a crash left open: aborted now, not at transaction.timeout.ms, and their
    pending markers settled before they are read."""
    run = (mb.prefix, run_id)
    if run[1] is not None and run in _fenced:
        return
    idle = [p for p in range(ids) if p >= mb.tasks or p not in mb.txns]
    idle += _open_beyond(admin, mb.prefix, ids)
    admin.fence_transactions([transactional_id(mb.prefix, p) for p in idle])
    _fenced.add(run)


def _commit_with_markers(will: LastWill, admin: AdminClient, config: Mapping[str, str], mb: _Microbatch,
                         entry: DirectoryRecord, already: set[int], clock: Time) -> Committed:
    """Commit the transactions of the tasks no earlier run committed, each with its marker,
    after recording in the directory that this microbatch's commit started; abort the
    others."""
    fresh = {p: t for p, t in mb.txns.items() if p not in already}
    _check_open(admin, config, fresh, mb.began, mb.what, clock)
    # Before any transaction of this microbatch commits: a replay must look for markers.
    # Kept a year (not offsets.retention.minutes): a query idle for weeks still knows its
    # next microbatch from a replay.
    group = directory_group(mb.prefix)
    admin.commit_offsets(group, {mb.marker_tp: (mb.batch_id, entry.encode())}, retention_ms=DIRECTORY_RETENTION_MS)
    skipped = {p: t for p, t in mb.txns.items() if p in already}
    _abort_skipped(admin, mb.what, skipped)
    admin.send_offsets_to_transactions(
        (t, transactional_id(mb.prefix, p), {mb.marker_tp: (mb.batch_id, Marker(
            query=mb.query, tasks=mb.tasks, txns=len(mb.txns), rows=mb.rows.get(p)).encode())})
        for p, t in fresh.items())
    will.set(end_commits, config, list(fresh.values()))
    _end_checked(admin, config, fresh, mb.began, mb.what, clock)
    # "done": a replay skips it whole without its markers, which Kafka keeps only
    # offsets.retention.minutes. Without it (this commit failing), a replay reads them.
    try:
        done = dataclasses.replace(entry, done=True)
        admin.commit_offsets(group, {mb.marker_tp: (mb.batch_id, done.encode())}, retention_ms=DIRECTORY_RETENTION_MS)
    except Exception as exc:
        log.warning("kprod %s: committed, but recording that in group %r failed (%s); a replay of it reads its "
                    "markers instead", mb.what, group, exc)
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
                f"reported {txn.producer_epoch}). Either another query or job writes under the same "
                f"kprod.transactionalIdPrefix (each must have its own), or another "
                f"attempt of task {partition} ran after this one finished, as a speculative copy "
                "(spark.speculation=true), a retried stage or an executor thought lost does (exactly-once writes "
                f"need spark.speculation=false). {outcome}")
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


def end_commits(config: Mapping[str, str], txns: Sequence[PreparedTransaction]) -> None:
    """End the commits of a microbatch whose driver worker died after it began them (an
    EndTxn of a transaction already committed is answered as done)."""
    driver_admin(config).end_transactions(txns, commit=True)


def with_transaction_timeout(options: SinkOptions) -> SinkOptions:
    """An exactly-once batch write's options with the longest transaction.timeout.ms the
    cluster allows (its transaction.max.timeout.ms), unless the user set one: a batch
    write's first tasks hold their transactions open until the last task is done."""
    eo = options.exactly_once
    if eo is None or not eo.batch or eo.timeout_given or eo.prefix is None:
        return options  # (a batch write always has its prefix, given or its own)
    config = options.producer_config
    value = driver_admin(config).coordinator_config(transactional_id(eo.prefix, 0), ["transaction.max.timeout.ms"]).get(
        "transaction.max.timeout.ms")
    if not value:
        return options
    return dataclasses.replace(options, producer_config={**config, "transaction.timeout.ms": value})
