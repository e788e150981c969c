"""Rows a ``send_arrow(..., on_error="skip")`` call refuses instead of failing: the
errors that belong to one row, and the screen that finds them before anything is queued.

A row's own error (too large, a topic it names that is missing, invalid or that the
principal may not describe, a null topic with no default, a partition its topic lacks) is
the row's; an error of the cluster or the connection (a broker down, authentication, a
timeout) is the call's and is raised as ever: it must never turn good rows into refused
ones. To refuse rows for one more reason: where it is found, call
``RowRefusals.refuse(rows, error)`` and leave those rows out of what is sent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from spark_sink.client.errors import UnknownTopicError
from spark_sink.encoder.columnar import as_arrow_indices
from spark_sink.protocol.error_codes import InvalidTopicException, KafkaError, TopicAuthorizationFailedError

ON_ERROR = ("fail", "skip")
# How refused rows are copied out of a call (rows_of).
SLICED_RUNS = 64
TAKE_ROWS = 64

# Kafka's rule for a topic name (its Topic.validate): what a broker refuses as INVALID_TOPIC_EXCEPTION.
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def topic_name_error(name: str) -> KafkaError | None:
    """Why Kafka refuses ``name`` as a topic name, or None if it takes it: known without
    asking, so that nothing (a schema's subject, say) is done for such a row first."""
    if _TOPIC_NAME.fullmatch(name) and name not in (".", ".."):
        return None
    return InvalidTopicException(f"topic {name!r}: Kafka's topic names are 1 to 249 of a-z A-Z 0-9 . _ - "
                                 "(and neither '.' nor '..')")


@dataclass(frozen=True, eq=False)
class RefusedRows:
    """Rows of one call refused for one reason: their indices in the call's input
    (ascending), the input's columns at those rows (``data``), the error's class name and
    message, and the topic and partition chosen for them, where one was."""

    rows: np.ndarray
    data: pa.Table
    error: str
    message: str
    topic: str | None = None
    partition: int | None = None

    def __len__(self) -> int:
        return len(self.rows)


class RowRefusals:
    """The rows one call refuses, gathered while its input is checked."""

    def __init__(self, data: pa.Table | pa.RecordBatch) -> None:
        self._data = data
        self.refused: list[RefusedRows] = []
        self.mask = np.zeros(data.num_rows, dtype=bool)  # rows refused so far

    def refuse(self, rows: np.ndarray, error: Exception, topic: str | None = None,
               partition: int | None = None) -> None:
        """Refuse ``rows`` (indices into the input) for ``error``."""
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[~self.mask[rows]]  # a row is refused for its first reason only
        if not len(rows):
            return
        self.mask[rows] = True
        data = self._data if isinstance(self._data, pa.Table) else pa.Table.from_batches([self._data])
        self.refused.append(RefusedRows(rows, rows_of(data, rows), type(error).__name__, str(error), topic, partition))

    def followed_by(self, later: Iterable[RefusedRows]) -> tuple[RefusedRows, ...]:
        """These refusals, then ``later``'s, made over the rows left once these were
        taken out (their indices mapped back to this input's)."""
        kept = np.flatnonzero(~self.mask)
        return (*self.refused, *(replace(r, rows=kept[r.rows]) for r in later))


def rows_of(data: pa.Table, rows: np.ndarray) -> pa.Table:
    """``data``'s ``rows``: a few runs of consecutive rows as slices of it (no copy), else
    taken TAKE_ROWS at a time. A take of a nested column makes an index per child value (4
    bytes per boolean of a list: 32 times the booleans' bytes), so it is kept to a few rows."""
    if not len(rows):
        return data.slice(0, 0)
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(rows) != 1) + 1, [len(rows)]])
    if len(bounds) <= SLICED_RUNS + 1:
        return pa.concat_tables([data.slice(int(rows[a]), int(b - a)) for a, b in zip(bounds[:-1], bounds[1:])])
    return pa.concat_tables([data.take(as_arrow_indices(rows[i:i + TAKE_ROWS])) for i in range(0, len(rows), TAKE_ROWS)])


def screen_topics(refusals: RowRefusals, codes: np.ndarray | None, names: list[str],
                  partition_count: Callable[[str], int]) -> dict[str, int]:
    """Each topic's partition count, refusing the rows of a topic that is missing, invalid
    or not to be described (``codes``: each row's index into ``names``, -1 for none; None:
    every row is ``names[0]``'s, and no index array is made unless its rows are refused)."""
    counts: dict[str, int] = {}
    for i, topic in enumerate(names):
        if codes is None:
            rows = None
            if refusals.mask.all():
                continue
        else:
            rows = np.flatnonzero(codes == i)
            if not len(rows) or refusals.mask[rows].all():
                continue
        try:
            counts[topic] = partition_count(topic)
        # UnknownTopicError comes only once the brokers answered that the topic does not
        # exist (no broker reached is BrokersUnreachableError): the rows', not the cluster's.
        except (UnknownTopicError, InvalidTopicException, TopicAuthorizationFailedError) as exc:
            refusals.refuse(np.arange(len(refusals.mask)) if rows is None else rows, exc, topic)
    return counts
