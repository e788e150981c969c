"""Refused rows in a task (``kprod.errors.tolerance=all``): counted per reason and turned
into dead letters, records of the row's key and value with ``kprod.errors.*`` headers
naming why (Kafka Connect's ``__connect.errors.*`` headers, under kprod's prefix).

Any source of ``RefusedRows`` goes through ``TaskDeadLetters.refused``: ``send_arrow``'s
result, and ``serialize_columns``' refusals (rows a key or value format cannot encode,
their fields as they were, kept in the dead letter as JSON).
"""

from __future__ import annotations

import base64
import decimal
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from datetime import time as time_of_day
from typing import TYPE_CHECKING

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.protocol.error_codes import KProdError

if TYPE_CHECKING:
    import pyarrow as pa

    from spark_sink.producer import ArrowSendFuture, KafkaProducer, RefusedRows

HEADER_PREFIX = "kprod.errors."

# The reason whose dead letters leave the value out: it is what made the row too large.
_TOO_LARGE = "RecordTooLargeError"
# Dead letters are built through Python objects (a struct's fields as JSON), which can be
# a hundred times the rows' Arrow bytes (a list of booleans: 8 bytes a bit), so they are
# built and sent in pieces of at most this many refused rows and Arrow bytes, each handed
# to the producer before the next is built.
PIECE_ROWS = 256
PIECE_BYTES = 16 << 10
# Dead-letter calls in flight at most (as the writer's own sends).
MAX_PENDING = 64


class BadRowsRatioError(KProdError, RuntimeError):
    """More of a write's rows were refused than ``kprod.errors.maxRatio`` allows."""


@dataclass
class TaskDeadLetters:
    """One task's refused rows: per reason (error class) the count and the first message;
    dead letters sent to ``topic`` (none if None) through the task's own producer, so that
    under exactly-once they are in the task's transaction."""

    topic: str | None
    default_topic: str | None
    context: dict[str, str]  # headers every dead letter of the task carries (batch, stage, task)
    reasons: dict[str, tuple[int, str]] = field(default_factory=dict)
    futures: list[ArrowSendFuture] = field(default_factory=list)
    sent: int = 0
    clock: Time = SYSTEM_TIME  # the dead letters' timestamp header
    timeout_s: float = 60.0  # the longest wait for a dead letter's acknowledgement

    def prepare(self, producer: KafkaProducer) -> None:
        """Learn the dead-letter topic's partitions and settings as the task opens its
        producer, while the brokers answer (known already to a pooled one): the task's
        first dead letter would otherwise wait for them, up to max.block.ms if the brokers
        went silent meanwhile, where its rows' own records fail at delivery.timeout.ms."""
        if self.topic is not None:
            producer.partitions_for(self.topic)
            producer.max_message_bytes(self.topic)

    def refused(self, producer: KafkaProducer, refused: Iterable[RefusedRows]) -> None:
        """Count ``refused`` and send their dead letters; those sent before that are
        acknowledged are settled, and past MAX_PENDING the oldest is waited for, so that a
        dead letter that failed fails the task at once, not at its end (a task whose rows
        are all refused has no other send to fail it)."""
        groups = list(refused)
        for r in groups:
            count, message = self.reasons.get(r.error, (0, r.message))
            self.reasons[r.error] = (count + len(r), message)
        if self.topic is None:
            return
        futures = self.futures
        for piece in pieces(groups):
            futures.append(producer.send_arrow(self.table(piece), self.topic, on_error="skip"))
            while futures and (futures[0].done() or len(futures) > MAX_PENDING):
                self._settle(producer, futures.pop(0))

    def settle(self, producer: KafkaProducer) -> None:
        """Wait for every dead letter sent; raise the first failure."""
        while self.futures:
            self._settle(producer, self.futures.pop(0))

    def _settle(self, producer: KafkaProducer, future: ArrowSendFuture) -> None:
        """One call's dead letters acknowledged, or its failure raised. A dead letter too
        large for the topic is sent again without its value (a row too large left it out
        already), then without its key and the row's headers too; any other refusal fails
        the task with its error: a dead letter is never silently lost."""
        result = future.result(self.timeout_s)
        self.sent += result.records
        for r in result.refused:
            if r.error == _TOO_LARGE and r.data.column("value").null_count < len(r.data):
                again = producer.send_arrow(_without_values(r.data), self.topic, on_error="skip").result(self.timeout_s)
                self.sent += again.records
                for still in again.refused:
                    self._send_stripped(producer, still)
                continue
            self._send_stripped(producer, r)

    def _send_stripped(self, producer: KafkaProducer, r: RefusedRows) -> None:
        """Dead letters refused again: too large, without key and row headers; else as
        they were, failing the task with their error."""
        data = _stripped(r.data) if r.error == _TOO_LARGE else r.data
        self.sent += producer.send_arrow(data, self.topic).result(self.timeout_s).records

    def table(self, groups: list[RefusedRows]) -> pa.Table:
        """The dead letters of ``groups``: key, value and the row's headers, then kprod's."""
        import pyarrow as pa

        now = str(int(self.clock.wall_ms())).encode()
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        headers: list[list[dict[str, object]]] = []
        for r in groups:
            data = r.data
            cols = {name: data.column(name).to_pylist(maps_as_pydicts="lossy")
                    for name in ("key", "value", "topic", "partition", "headers") if name in data.column_names}
            message = r.message + (" (the dead letter leaves the value out)" if r.error == _TOO_LARGE else "")
            for i in range(len(r)):
                key = cols["key"][i] if "key" in cols else None
                value = None if r.error == _TOO_LARGE else cols["value"][i]
                keys.append(_as_bytes(key))
                values.append(_as_bytes(value))
                topic = r.topic or (cols["topic"][i] if "topic" in cols else None) or self.default_topic
                partition = r.partition if r.partition is not None else (
                    cols["partition"][i] if "partition" in cols else None)
                row_headers = list(cols["headers"][i] or []) if "headers" in cols else []
                ours = {"topic": topic, "partition": partition, "class": r.error, "message": message}
                row_headers += [{"key": HEADER_PREFIX + k, "value": str(v).encode()}
                                for k, v in ours.items() if v is not None]
                row_headers += [{"key": HEADER_PREFIX + k, "value": v.encode()} for k, v in self.context.items()]
                row_headers.append({"key": HEADER_PREFIX + "timestamp", "value": now})
                headers.append(row_headers)
        header_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
        return pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                         "headers": pa.array(headers, header_type)})


def pieces(groups: list[RefusedRows], max_rows: int = PIECE_ROWS,
           max_bytes: int = PIECE_BYTES) -> Iterator[list[RefusedRows]]:
    """``groups``' rows, in order, in pieces of at most ``max_rows`` rows and ``max_bytes``
    Arrow bytes (or one row), small groups together."""
    piece: list[RefusedRows] = []
    rows = nbytes = 0
    for r in groups:
        start = 0
        while start < len(r):
            take = rows_within(r.data, start, min(max_rows - rows, len(r) - start), max_bytes - nbytes)
            if take == 0 and not piece:
                take = 1  # a row larger than a piece: alone
            if take:
                part = r if take == len(r) else replace(r, rows=r.rows[start:start + take],
                                                        data=r.data.slice(start, take))
                piece.append(part)
                rows, nbytes, start = rows + take, nbytes + part.data.nbytes, start + take
            if not take or rows >= max_rows or nbytes >= max_bytes:
                yield piece
                piece, rows, nbytes = [], 0, 0
    if piece:
        yield piece


def rows_within(data: pa.Table, start: int, most: int, max_bytes: int) -> int:
    """The most rows from ``start`` (at most ``most``) whose Arrow bytes fit ``max_bytes``
    (a slice's ``nbytes`` counts only its rows), by bisection."""
    if most <= 0 or max_bytes <= 0:
        return 0
    if data.slice(start, most).nbytes <= max_bytes:
        return most
    low, high = 0, most - 1
    while low < high:
        mid = (low + high + 1) // 2
        if data.slice(start, mid).nbytes <= max_bytes:
            low = mid
        else:
            high = mid - 1
    return low


def _without_values(letters: pa.Table) -> pa.Table:
    """Dead letters too large for their topic, without their value (a refused struct's
    JSON can be far larger than the row), their message saying so."""
    return _lightened(letters, b" (the dead letter leaves the value out: too large for the dead-letter topic)",
                      keep_key=True)


def _stripped(letters: pa.Table) -> pa.Table:
    """Dead letters too large without their value: without their key and the row's own
    headers too, their message saying so."""
    return _lightened(letters, b" (and its key and the row's headers: too large with them)", keep_key=False)


def _lightened(letters: pa.Table, note: bytes, keep_key: bool) -> pa.Table:
    """``letters`` without their value, and unless ``keep_key`` without their key and the
    row's own headers (kprod's kept), ``note`` added to their message."""
    import pyarrow as pa

    message = HEADER_PREFIX + "message"
    headers = [[{"key": h["key"], "value": h["value"] + note if h["key"] == message else h["value"]}
                for h in hs if keep_key or h["key"].startswith(HEADER_PREFIX)]
               for hs in letters.column("headers").to_pylist()]
    nulls = pa.nulls(len(letters), pa.binary())
    return pa.table({"key": letters.column("key") if keep_key else nulls, "value": nulls,
                     "headers": pa.array(headers, letters.schema.field("headers").type)})


def _as_bytes(value: object) -> bytes | None:
    """A dead letter's key or value: bytes as they were, text as UTF-8, and a struct a
    format could not encode as its fields in JSON."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(_plain(value), ensure_ascii=False, separators=(",", ":")).encode()


def _plain(value: object) -> object:
    """``value`` (what Arrow's to_pylist gives) in JSON's types: binaries in base64, dates
    and timestamps in ISO 8601, decimals, NaN and infinities as strings (JSON has no
    number for the last two, and a decimal's digits should not pass through a float)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (date, time_of_day, decimal.Decimal, timedelta)):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    return value


def task_context() -> dict[str, str]:
    """The headers naming where a dead letter comes from: the microbatch (streaming), the
    Spark stage and the task (its partition)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return {}
    out = {"stage.id": str(ctx.stageId()), "task.id": str(ctx.partitionId())}
    batch = ctx.getLocalProperty("streaming.sql.batchId")
    if batch:
        out["batch.id"] = batch
    query = ctx.getLocalProperty("sql.streaming.queryId")
    if query:
        out["query.id"] = query
    return out


def check_ratio(what: str, good: int, reasons: dict[str, tuple[int, str]], max_ratio: float | None) -> None:
    """Raise BadRowsRatioError if more than ``max_ratio`` of a write's rows were refused."""
    bad = sum(count for count, _ in reasons.values())
    if max_ratio is None or not bad or bad <= max_ratio * (good + bad):
        return
    reason, (count, message) = max(reasons.items(), key=lambda item: item[1][0])
    raise BadRowsRatioError(
        f"kprod {what}: {bad} of {good + bad} rows ({bad / (good + bad):.1%}) were refused, more than "
        f"kprod.errors.maxRatio={max_ratio}; most common reason: {reason} ({count} rows), e.g. {message}")
