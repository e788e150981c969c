"""Offset ranges in commit messages: within a task (one producer, sends in order) and
across tasks (producers interleaved); -1 is an end the broker did not tell."""

import datetime
import json

from hypothesis import given
from hypothesis import strategies as st

from spark_sink.spark.task_reports import KProdCommitMessage, WriteSummary, extend_ranges, merge_ranges
from tests.clock import days_later

TP, OTHER = ("t", 0), ("t", 1)


def test_a_tasks_later_send_keeps_the_first_offset_and_takes_its_last() -> None:
    ranges = {TP: (5, 10, 14)}
    extend_ranges(ranges, {TP: (3, 20, 22), OTHER: (2, 7, 8)})
    assert ranges == {TP: (8, 10, 22), OTHER: (2, 7, 8)}
    extend_ranges(ranges, {TP: (4, 30, -1)})  # its last batch came back without an offset
    assert ranges[TP] == (12, 10, -1)
    unknown_start = {TP: (5, -1, 14)}
    extend_ranges(unknown_start, {TP: (3, 20, 22)})  # a later send does not know where it began
    assert unknown_start[TP] == (8, -1, 22)


def test_tasks_widen_the_range_and_an_unknown_end_stays_unknown() -> None:
    ranges = {TP: (5, 10, 14)}
    merge_ranges(ranges, {TP: (3, 4, 12), OTHER: (1, 0, 0)})
    assert ranges == {TP: (8, 4, 14), OTHER: (1, 0, 0)}
    merge_ranges(ranges, {TP: (2, -1, 30)})
    assert ranges[TP] == (10, -1, 30)
    merge_ranges(ranges, {TP: (2, 1, -1)})
    assert ranges[TP] == (12, -1, -1)


def test_the_summary_counts_the_tasks_given_no_row() -> None:
    """A few rows over many shuffle partitions: the summary says how many tasks were empty,
    since each costs Spark a Python task whatever the sink does."""
    messages = [KProdCommitMessage(partition_id=0, attempt=0, records=3, bytes=30, partitions={TP: (3, 0, 2)}),
                KProdCommitMessage(partition_id=1, attempt=0, records=0, bytes=0),
                KProdCommitMessage(partition_id=2, attempt=0, records=0, bytes=0), None]
    summary = WriteSummary.of(messages)
    assert (summary.tasks, summary.empty_tasks, summary.records) == (3, 2, 3)
    assert "from 3 task(s) (2 without rows);" in summary.describe()
    assert "without rows" not in WriteSummary.of(messages[:1]).describe()


@given(st.floats(-10_000, 100_000))
def test_the_report_line_is_committed_at_the_clocks_time(days: float) -> None:
    """The delivery report's committedAt is the wall clock of the clock given (whole seconds, UTC)."""
    clock = days_later(days)
    summary = WriteSummary.of([KProdCommitMessage(partition_id=0, attempt=0, records=1, bytes=1)])
    before = int(clock.wall_ms() // 1000)
    line = json.loads(summary.report_line(7, clock=clock))
    after = clock.wall_ms() / 1000
    at = datetime.datetime.strptime(line["committedAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)
    assert before <= at.timestamp() <= after and line["batchId"] == 7
