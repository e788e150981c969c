"""Commit messages from tasks, their summary on the driver, and the delivery report file."""

from __future__ import annotations

import datetime
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import MetricTotals, PreparedTransaction

log = logging.getLogger(__name__)

# (topic, partition) -> (count, first_offset, last_offset)
PartitionRanges = dict[tuple[str, int], tuple[int, int, int]]


@dataclass(frozen=True, kw_only=True)
class KProdCommitMessage(WriterCommitMessage):
    """What one task wrote, returned only after every record was acknowledged. Built by
    keyword only: a field added in the middle never shifts the others."""

    partition_id: int
    attempt: int
    records: int
    bytes: int
    partitions: PartitionRanges = field(default_factory=dict)
    seconds: float = 0.0
    # The producer's counts over this task: records sent again after a retriable error,
    # records that failed, and its Produce requests' round trips.
    producer: MetricTotals = field(default_factory=MetricTotals)
    # Exactly-once: the task's open transaction, which the driver commits, and the
    # streaming query it belongs to.
    transaction: PreparedTransaction | None = None
    query_id: str | None = None
    # When the task opened its transaction (its wall clock, ms): how long it stayed open.
    transaction_began_ms: float | None = None
    # Exactly-once: the task's rows as ``RowsDigest`` prints them (count:hash, any order),
    # which a replay compares with the marker of the run that committed this task.
    rows_digest: str | None = None
    # Exactly-once streaming: the run of the query (its runId, new at every start), which
    # tells the driver's reused worker that a query was restarted.
    run_id: str | None = None
    # kprod.errors.tolerance=all: rows refused per reason (error class): (count, first
    # message), and the dead letters written for them.
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    dead_letters: int = 0


def extend_ranges(into: PartitionRanges, later: PartitionRanges) -> None:
    """Add the ranges of a later send by the same producer: counts add up, and a range
    keeps its first offset and takes the later send's last (-1 stays -1: unknown)."""
    for tp, (count, first, last) in later.items():
        old = into.get(tp)
        into[tp] = (count, first, last) if old is None else (old[0] + count, old[1], last)


def merge_ranges(into: PartitionRanges, more: PartitionRanges) -> None:
    """Add the ranges of another task (another producer, interleaved): counts add up and
    ranges widen; an end that is unknown (-1) in either leaves that end unknown."""
    for tp, (count, first, last) in more.items():
        old = into.get(tp)
        if old is None:
            into[tp] = (count, first, last)
        else:
            into[tp] = (old[0] + count, -1 if -1 in (old[1], first) else min(old[1], first),
                        -1 if -1 in (old[2], last) else max(old[2], last))


@dataclass(frozen=True)
class WriteSummary:
    """Every task's commit message of one batch or microbatch, added up."""

    tasks: int
    records: int
    bytes: int
    partitions: PartitionRanges
    max_task_seconds: float = 0.0
    producer: MetricTotals = field(default_factory=MetricTotals)  # over the tasks
    # Tasks given no row: each still costs Spark a Python task (tens of ms on a small
    # machine), which is what a write of a few rows over many shuffle partitions pays.
    empty_tasks: int = 0
    # Exactly-once replays: tasks whose rows an earlier run of the microbatch committed (this
    # run's transactions for them were aborted), left out of the counts and ranges above.
    already_committed: tuple[int, ...] = ()
    # Rows refused per reason, (count, first message), and dead letters written for them.
    refused: dict[str, tuple[int, str]] = field(default_factory=dict)
    dead_letters: int = 0

    @classmethod
    def of(cls, messages: Iterable[WriterCommitMessage | None], already_committed: Iterable[int] = ()
           ) -> WriteSummary:
        skipped = tuple(sorted(already_committed))
        done = [m for m in messages if isinstance(m, KProdCommitMessage) and m.partition_id not in skipped]
        ranges: PartitionRanges = {}
        for m in done:
            merge_ranges(ranges, m.partitions)
        return cls(len(done), sum(m.records for m in done), sum(m.bytes for m in done), dict(sorted(ranges.items())),
                   max((m.seconds for m in done), default=0.0), MetricTotals.combine(m.producer for m in done),
                   sum(1 for m in done if m.records == 0 and not m.refused), skipped,
                   merge_refused(m.refused for m in done), sum(m.dead_letters for m in done))

    def describe_refused(self, dead_letter_topic: str | None) -> str:
        """The refused rows in words ('' if none)."""
        if not self.refused:
            return ""
        total = sum(count for count, _ in self.refused.values())
        where = (f"{self.dead_letters} dead letter(s) written to {dead_letter_topic!r}" if dead_letter_topic
                 else "dropped: no kprod.errors.deadLetterTopic")
        return (f"; {total} row(s) refused ({', '.join(f'{r}: {c}' for r, (c, _) in sorted(self.refused.items()))}), "
                f"{where}")

    def describe(self) -> str:
        topics = sorted({t for t, _ in self.partitions})
        return (
            f"{self.records} records, {self.bytes} bytes of keys and values, {len(self.partitions)} partition(s) "
            f"of {len(topics)} topic(s) [{', '.join(topics)}], from {self.tasks} task(s)"
            f"{f' ({self.empty_tasks} without rows)' if self.empty_tasks else ''}; {self.producer.describe()}"
            + (f"; task(s) {', '.join(map(str, self.already_committed))} left out: an earlier run of this "
               f"microbatch committed their rows" if self.already_committed else "")
        )

    def report_line(self, batch_id: int | None, tolerant: bool = False, dead_letter_topic: str | None = None,
                    clock: Time = SYSTEM_TIME) -> str:
        """One JSON line for the delivery report (with ``tolerant``, kprod.errors.tolerance=all,
        the refused rows and dead letters too), committed now on ``clock``'s wall clock."""
        committed_at = datetime.datetime.fromtimestamp(clock.wall_ms() / 1000, datetime.UTC)
        line: dict[str, object] = {
            "batchId": batch_id,
            "committedAt": committed_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tasks": self.tasks,
            "records": self.records,
            "bytes": self.bytes,
            # The slowest task, from its first batch to its last acknowledgement.
            "maxTaskSeconds": round(self.max_task_seconds, 3),
            # Records sent again after a retriable error: at-least-once, maybe twice in Kafka
            # when idempotence is off.
            "retries": self.producer.records_retried,
            "errors": self.producer.records_failed,
            "requests": self.producer.responses,
            "requestLatencyAvgMs": round(self.producer.request_latency_avg_ms, 3),
            "requestLatencyMaxMs": round(self.producer.request_latency_max_ms, 3),
            "partitions": [
                {"topic": t, "partition": p, "count": c, "firstOffset": first, "lastOffset": last}
                for (t, p), (c, first, last) in self.partitions.items()
            ],
        }
        if tolerant:
            line["refusedRows"] = {reason: count for reason, (count, _) in sorted(self.refused.items())}
            line["deadLetters"] = self.dead_letters
            line["deadLetterTopic"] = dead_letter_topic
        if self.already_committed:
            # Their rows are in Kafka from an earlier run, whose report line was never written.
            line["alreadyCommittedTasks"] = list(self.already_committed)
        return json.dumps(line, separators=(",", ":"))


def merge_refused(counts: Iterable[dict[str, tuple[int, str]]]) -> dict[str, tuple[int, str]]:
    """Refused rows per reason over several tasks: counts add up, the first message stays."""
    out: dict[str, tuple[int, str]] = {}
    for one in counts:
        for reason, (count, message) in one.items():
            old = out.get(reason)
            out[reason] = (count, message) if old is None else (old[0] + count, old[1])
    return out


def append_report(path: str, line: str) -> None:
    """Append one line and fsync it, so a report line means the batch was committed."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def succeeded_tasks(messages: Sequence[WriterCommitMessage | None]) -> list[KProdCommitMessage]:
    """The tasks of a failed write that had delivered everything they were given."""
    return [m for m in messages if isinstance(m, KProdCommitMessage)]
