"""The task side (one producer per task; Spark's Arrow batches joined and sent with
``send_arrow``) and the driver side (commit and abort) of batch and streaming writes."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import (
    FormatValueError,
    MetricTotals,
    RowRefusals,
    RowsDigest,
    WireBudget,
    WireBudgetExceeded,
    serialize_columns,
)
from spark_sink.spark import exactly_once, exactly_once_abort, exactly_once_names, exactly_once_state
from spark_sink.spark.columns import ColumnPlan, plan_columns
from spark_sink.spark.dead_letters import TaskDeadLetters, check_ratio, rows_within, task_context
from spark_sink.spark.driver_check import check_write, forget_check, short_traceback
from spark_sink.spark.formats import prepare_formats
from spark_sink.spark.options import SinkOptions, parse_options
from spark_sink.spark.producer_pool import POOL
from spark_sink.spark.task_reports import (
    KProdCommitMessage,
    PartitionRanges,
    WriteSummary,
    append_report,
    extend_ranges,
    succeeded_tasks,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from spark_sink.producer import ArrowSendFuture, KafkaProducer, PreparedTransaction

log = logging.getLogger(__name__)

# Futures still unresolved before the task checks the oldest ones: bounds memory and
# surfaces a delivery failure early instead of after the whole partition was encoded.
_MAX_PENDING_SENDS = 64

# Spark hands a task Arrow batches of spark.sql.execution.arrow.maxRecordsPerBatch rows
# (10,000 unless set). send_arrow closes every partition's record batch at the end of a
# call, so 1,000 rows to a 48-partition topic would make record batches of ~20 records,
# each a broker must store and a request must carry, and small calls cost more CPU.
# Consecutive batches are therefore joined up to this many rows or bytes per call.
# Fewer, larger calls cost less per row, most with many partitions (each call pays Python
# per partition it holds rows for: bench/RESULTS.md, issue 55 (8)).
SEND_ROWS = 200_000
SEND_BYTES = 16 << 20
# ... and small enough that this many calls fit in buffer.memory: a call larger than the
# buffer blocks part-way whenever the brokers fall behind, and over a broker that stopped
# answering it would wait out delivery.timeout.ms once per buffer-full, failing the task
# only after several timeouts while holding the whole joined table. Two: one call is
# encoded and queued while the one before it is sent.
SEND_CALLS_PER_BUFFER = 2
# An Arrow batch costs a few KiB beyond its nbytes (its Python and C++ objects, each
# buffer's own allocation): with spark.sql.execution.arrow.maxRecordsPerBatch=1 a call's
# thousands of one-row batches would hold several times its bytes. Each run of this many
# batches joined is therefore copied into one.
COMPACT_BATCHES = 256
# A format's wire form can be many times a call's Arrow bytes (48 booleans: 53 bytes a row
# in Arrow, 105 in Avro, 775 in JSON), so a call is serialized in slices sized by the wire
# bytes per row measured on the slices before. Until one is measured, a slice takes this
# fraction of the call size in Arrow bytes, and each is sized to this share of the call
# size, so that a slice a little larger per row than the last still fits.
FIRST_SLICE_FRACTION = 64
SLICE_FILL = 0.875


def send_bytes_for(buffer_memory: int) -> int:
    """The most input bytes a task joins into one send_arrow call: what a writer holds
    beyond buffer.memory for the call being sent."""
    return min(SEND_BYTES, buffer_memory // SEND_CALLS_PER_BUFFER)


def _task_identity() -> tuple[int, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return -1, 0
    return ctx.partitionId(), ctx.attemptNumber()


def _prepare(batch: pa.RecordBatch, plan: ColumnPlan) -> pa.RecordBatch:
    """Spark's column names to the canonical ones; drop the overridden topic column."""
    import pyarrow as pa

    if not plan.renamed and not plan.drop:
        return batch
    keep = [i for i in range(batch.num_columns) if i not in plan.drop]
    return pa.RecordBatch.from_arrays([batch.column(i) for i in keep], names=[plan.names[i] for i in keep])


def coalesce(batches: Iterator[pa.RecordBatch], max_rows: int = SEND_ROWS,
             max_bytes: int = SEND_BYTES) -> Iterator[pa.Table]:
    """Consecutive non-empty batches, in order, joined into tables of at most ``max_rows``
    rows and about ``max_bytes`` bytes: each send_arrow call stays within the share of
    buffer.memory it was given. A batch that fills a call on its own goes at once, before
    the next is read, in slices of a call's size. Each COMPACT_BATCHES batches held are
    copied into one, so that tiny batches hold about their bytes."""
    import pyarrow as pa

    held: list[pa.RecordBatch] = []
    rows = nbytes = fresh = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if held and (rows + batch.num_rows > max_rows or nbytes + batch.nbytes > max_bytes):
            yield pa.Table.from_batches(held)
            held, rows, nbytes, fresh = [], 0, 0, 0
        if not held and (batch.num_rows >= max_rows or batch.nbytes >= max_bytes):
            # In calls of the call's size: send_arrow makes arrays of a few int64 per row
            # of a call (2 M one-byte rows in one batch: 88 MB of them).
            step = min(max_rows, max(1, batch.num_rows * max_bytes // max(1, batch.nbytes)))
            for start in range(0, batch.num_rows, step):
                yield pa.Table.from_batches([batch.slice(start, step)])
            continue
        held.append(batch)
        rows += batch.num_rows
        nbytes += batch.nbytes
        fresh += 1
        if fresh == COMPACT_BATCHES:
            # Only the run since the last compaction: every byte is copied once. The run
            # is small (COMPACT_BATCHES of them fit in max_bytes).
            held[-fresh:] = pa.Table.from_batches(held[-fresh:]).combine_chunks().to_batches()
            fresh = 0
    if held:
        yield pa.Table.from_batches(held)


class WireSlices:
    """A call's rows serialized into parts of at most ``max_bytes`` wire bytes (Arrow
    ``nbytes`` of what send_arrow is given) each, or one row: one slice serialized at a
    time, sized by the wire bytes per row the task's slices measured so far. The encoders
    stop at the size (a ``WireBudget``), so rows larger than those before cost a slice
    serialized again with the rows that fit, never more than the size in wire form; a
    slice larger by its other columns is cut into parts of the size before it is sent."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.per_row: float | None = None  # wire bytes per row of the last slice that kept a row

    def parts(self, table: pa.Table, serialize: Callable[[pa.Table, WireBudget], pa.Table],
              first: int = 0) -> Iterator[pa.Table]:
        """``table``'s rows, in order, through ``serialize`` (which may leave rows out, and
        raises WireBudgetExceeded past the budget it is given), in parts within the size. A
        row ``serialize`` refuses with a FormatValueError is numbered from ``first``
        (``table``'s first row), not from its slice."""
        start, rows = 0, table.num_rows
        while start < rows:
            if self.per_row is None:
                step = rows * (self.max_bytes // FIRST_SLICE_FRACTION) // max(1, table.nbytes)
            else:
                step = int(self.max_bytes * SLICE_FILL / self.per_row)
            step = max(1, min(step, rows - start))
            while True:
                try:
                    wire = serialize(table.slice(start, step), WireBudget(self.max_bytes))
                    break
                except WireBudgetExceeded as exc:  # one row always fits: this ends
                    step = max(1, min(exc.rows, step - 1))
                except FormatValueError as exc:
                    raise exc.counted_from(first + start) from None
            start += step
            if wire.num_rows:
                self.per_row = max(1.0, wire.nbytes / wire.num_rows)
                yield from self._cut(wire)

    def _cut(self, wire: pa.Table) -> Iterator[pa.Table]:
        """``wire`` in parts of at most ``max_bytes`` each (or one row)."""
        while wire.nbytes > self.max_bytes and wire.num_rows > 1:
            fit = max(1, rows_within(wire, 0, wire.num_rows - 1, self.max_bytes))  # the most rows that fit, or one
            yield wire.slice(0, fit)
            wire = wire.slice(fit)
        yield wire


def write_task(iterator: Iterator[pa.RecordBatch], options: SinkOptions, plan: ColumnPlan,
               clock: Time = SYSTEM_TIME) -> KProdCommitMessage:
    """Send every batch of one task and return only once all of it is acknowledged.

    Any failure (column, partition, delivery) propagates and fails the task: Spark then
    retries it or aborts the write, so nothing is swallowed. With kprod.errors.tolerance=all
    the rows with an error of their own are refused instead, counted, and sent to the
    dead-letter topic through the same producer (see ``dead_letters``).
    """
    task = _TaskWrite(options, clock)
    ok = False
    try:
        for table in coalesce((_prepare(batch, plan) for batch in iterator), max_bytes=task.slices.max_bytes):
            task.send(table)
        task.finish()
        ok = True
    finally:
        task.release(healthy=ok)
    return task.commit_message()


class _TaskWrite:
    """One task's write: its producer (opened at the first row), transaction, digest,
    dead letters and what its acknowledged sends add up to."""

    def __init__(self, options: SinkOptions, clock: Time) -> None:
        self.options = options
        self.clock = clock
        self.started = clock()
        self.partition_id, self.attempt = _task_identity()
        eo = self.eo = options.exactly_once
        # A batch write belongs to no query, even inside foreachBatch (whose tasks see the
        # stream's id): a named one run again outside the stream must find its own markers.
        self.query, self.run = exactly_once_names.query_run() if eo is not None and not eo.batch else (None, None)
        self.config = options.producer_config if eo is None else exactly_once_names.transactional_config(
            options.producer_config, eo.prefix_for(self.query), self.partition_id)
        # A batch write's own transactional ids: no later task could reuse the producer.
        self.keep_s = 0.0 if eo is not None and eo.one_write else options.producer_cache_timeout_s
        self.producer: KafkaProducer | None = None
        self.transaction: PreparedTransaction | None = None
        self.began_ms: float | None = None
        self.begun = False
        self.counts = self.before = MetricTotals()
        self.records = self.nbytes = 0
        self.rows_given = 0  # the task's input rows before the table being sent
        # With a format the call is held in Arrow and, a slice at a time, in its wire form:
        # each within half the call size, so that both stay within it.
        send_bytes = send_bytes_for(options.buffer_memory)
        self.slices = WireSlices(send_bytes if options.formats is None else send_bytes // 2)
        self.ranges: PartitionRanges = {}
        self.pending: list[ArrowSendFuture] = []
        # What a replay of this task tells it by (exactly-once, kprod.replayMatch=rows).
        self.digest = RowsDigest() if eo is not None and eo.replay_match == "rows" else None
        tolerance = options.errors
        self.on_error = "fail" if tolerance is None else "skip"
        self.dead = None if tolerance is None else TaskDeadLetters(
            tolerance.dead_letter_topic, options.topic, task_context(), clock=clock, timeout_s=options.flush_timeout_s)

    def open(self) -> KafkaProducer:
        """The task's producer, from the worker's pool (a producer an earlier task left,
        flushed) or new, and under exactly-once its transaction begun. Called at the first
        row: an empty task (a filter, the empty shuffle partitions of an aggregation)
        opens no producer and no transaction."""
        producer = self.producer = POOL.acquire(self.config)
        self.before = producer.metric_totals()  # a pooled producer's include earlier tasks'
        if self.dead is not None:
            self.dead.prepare(producer)
        eo = self.eo
        if eo is not None:
            exactly_once_state.register_prefix(self.options.producer_config, eo, eo.prefix_for(self.query), self.clock)
            self.began_ms = self.clock.wall_ms()
            exactly_once_names.fence_and_begin(producer)
            self.begun = True
        return producer

    def send(self, table: pa.Table) -> None:
        """Send one joined table; with a format, serialized and sent in parts within the
        call size (``WireSlices``)."""
        producer = self.producer if self.producer is not None else self.open()
        formats, dead = self.options.formats, self.dead
        first, self.rows_given = self.rows_given, self.rows_given + table.num_rows
        if formats is None:
            self.send_part(producer, table)
            return

        def serialize(rows: pa.Table, budget: WireBudget) -> pa.Table:
            # Rows a format cannot encode are dead letters with their fields as they were
            # (only once the slice fits: one past its budget is serialized again, smaller).
            refusals = None if dead is None else RowRefusals(rows)
            wire = serialize_columns(rows, self.options.topic, formats.key, formats.value, refusals, budget)
            if dead is not None and refusals is not None:
                dead.refused(producer, refusals.refused)
            return wire

        # A row a format refuses is named by its index among the task's rows.
        for part in self.slices.parts(table, serialize, first):
            self.send_part(producer, part)

    def send_part(self, producer: KafkaProducer, table: pa.Table) -> None:
        """One send_arrow call; settle the sends already done, and past the bound the oldest."""
        # After serializing: a replay is told by the bytes it sends (the digest is a sum
        # over the rows, whatever the parts).
        if self.digest is not None:
            self.digest.add(table)
        future = producer.send_arrow(table, self.options.topic, on_error=self.on_error)
        if self.dead is not None:
            # At once, not when the call settles: a call of huge refused rows behind one a
            # silent broker holds would keep them until the task fails.
            self.dead.refused(producer, future.take_refused())
        pending = self.pending
        pending.append(future)
        while pending and (pending[0].done() or len(pending) > _MAX_PENDING_SENDS):
            self.settle(pending.pop(0))

    def settle(self, future: ArrowSendFuture) -> None:
        """Count an acknowledged send (futures settle in send order; their refused rows
        went to the dead letters as they were sent)."""
        result = future.result(self.options.flush_timeout_s)
        self.records += result.records
        self.nbytes += result.bytes
        extend_ranges(self.ranges, result.partitions)

    def finish(self) -> None:
        """Wait for every send and dead letter; under exactly-once, prepare the transaction
        the driver commits with the others."""
        producer = self.producer
        if producer is None:
            if self.eo is not None and self.attempt > 0:
                # An earlier attempt may have opened a transaction under this id and died with it
                # open (a SIGKILLed worker), and this one, given other input, has no row to
                # open its own with: it fences the id all the same, or that transaction would
                # hold read_committed readers back until its timeout.
                _fence_earlier_attempts(self.config, self.keep_s)
            return
        producer.flush(self.options.flush_timeout_s)
        for future in self.pending:
            self.settle(future)
        if self.dead is not None:
            self.dead.settle(producer)
        self.counts = producer.metric_totals().since(self.before)  # before the pool may hand it on
        if self.eo is not None:
            self.transaction = producer.prepare_transaction()

    def release(self, healthy: bool) -> None:
        """The producer back to the pool only after a flush that succeeded; on failure its
        transaction aborted and it is closed without waiting for the rest: the task is
        failing anyway."""
        producer = self.producer
        if producer is None:
            return
        if self.begun and not healthy:
            exactly_once_abort.abort_in_task(producer)
        POOL.release(producer, self.config, healthy=healthy, timeout_s=self.keep_s)

    def commit_message(self) -> KProdCommitMessage:
        """What the task wrote, for the driver; logged with the task's time."""
        seconds = (self.clock() - self.started) / 1000
        log.info("kprod task %d (attempt %d): %d records, %d bytes acknowledged in %.2f s; %s",
                 self.partition_id, self.attempt, self.records, self.nbytes, seconds, self.counts.describe())
        dead, digest, transaction = self.dead, self.digest, self.transaction
        return KProdCommitMessage(
            partition_id=self.partition_id, attempt=self.attempt, records=self.records, bytes=self.nbytes,
            partitions=self.ranges, seconds=seconds, producer=self.counts, transaction=transaction,
            query_id=self.query, transaction_began_ms=self.began_ms if transaction is not None else None,
            rows_digest=str(digest) if digest is not None else None, run_id=self.run,
            refused={} if dead is None else dead.reasons, dead_letters=0 if dead is None else dead.sent)


def _fence_earlier_attempts(config: Mapping[str, str], keep_s: float) -> None:
    """Fence the task's transactional id (aborting what an earlier attempt left open
    under it) without opening a transaction: for a retried task with no rows."""
    producer = POOL.acquire(config)
    ok = False
    try:
        exactly_once_names.fence(producer)
        ok = True
    finally:
        POOL.release(producer, config, healthy=ok, timeout_s=keep_s)


def plan_write(options: Mapping[str, str], schema: StructType, streaming: bool = False,
               check: bool = True) -> tuple[SinkOptions, ColumnPlan]:
    """On the driver, before any task: the write's options and columns, checked, and
    (unless ``check`` is false, or the same check passed moments ago) the cluster asked
    whether the write can work (see :mod:`spark_sink.spark.driver_check`)."""
    parsed = parse_options(options, streaming=streaming)
    formats = parsed.formats
    plan = plan_columns(schema, parsed.topic, formats.formatted() if formats is not None else frozenset())
    if check:
        check_write(parsed)
    if formats is not None:
        prepare_formats(formats, schema, parsed.topic)
    return exactly_once.with_transaction_timeout(parsed), plan


def _driver_logging() -> None:
    """Make the commit summary visible: the Python worker that runs commit() on the
    driver has no logging configured, so INFO lines would be dropped."""
    root = logging.getLogger("spark_sink.spark")
    if root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.propagate = False


def _commit(options: SinkOptions, messages: list[WriterCommitMessage | None], batch_id: int | None,
            clock: Time = SYSTEM_TIME) -> None:
    _driver_logging()
    what = "batch write" if batch_id is None else f"microbatch {batch_id}"
    skipped: frozenset[int] = frozenset()
    if options.errors is not None:
        # Before anything is committed: a failed check aborts the write (its transactions).
        whole = WriteSummary.of(messages)
        check_ratio(what, whole.records, whole.refused, options.errors.max_ratio)
    if options.exactly_once is not None:
        committed = exactly_once.commit(options.producer_config, options.exactly_once, messages, batch_id, clock)
        what += f" (exactly-once, {committed.transactions} transaction(s) committed)"
        skipped = committed.skipped
    summary = WriteSummary.of(messages, already_committed=skipped)
    dead_letter_topic = options.errors.dead_letter_topic if options.errors is not None else None
    log.info("kprod %s committed: %s%s", what, summary.describe(), summary.describe_refused(dead_letter_topic))
    if options.delivery_report_path:
        append_report(options.delivery_report_path,
                      summary.report_line(batch_id, options.errors is not None, dead_letter_topic, clock))


def _abort(options: SinkOptions, messages: list[WriterCommitMessage | None], batch_id: int | None) -> None:
    _driver_logging()
    forget_check(options)  # a failure: the next write asks the cluster again
    done = succeeded_tasks(messages)
    what = "batch write" if batch_id is None else f"microbatch {batch_id}"
    if options.exactly_once is not None:
        try:
            exactly_once_abort.abort(options.producer_config, options.exactly_once, messages)
        except Exception as exc:
            # Not raised: Spark would report it ("Writing job failed") in place of the
            # task's error, which says what went wrong (a silent broker fails both).
            log.error("kprod %s: its transactions could not be aborted (%s); they stay open until the "
                      "next run fences their ids or transaction.timeout.ms ends them, and read_committed "
                      "readers of their partitions wait until then", what, exc)
            return
        log.warning("kprod %s aborted: the transactions of its %d finished task(s) were aborted; "
                    "nothing of it is visible to read_committed consumers", what, len(done))
    elif done:
        detail = ", ".join(f"partition {m.partition_id} ({m.records} records)" for m in done)
        log.warning(
            "kprod %s aborted: %d of %d task(s) had already delivered their records (%s); "
            "those records are in Kafka and a retry of the %s writes them again (at-least-once)",
            what, len(done), len(messages), detail, what)
    else:
        # Nothing was delivered: a query.stop() that killed its tasks, or a task's failure
        # that Spark reports itself; neither is a warning of kprod's.
        log.info("kprod %s aborted: none of its %d task(s) had completed; nothing of it was delivered",
                 what, len(messages))


class _TaskWriter:
    """The task side, shared by the batch and the streaming writer."""

    def __init__(self, options: SinkOptions, plan: ColumnPlan) -> None:
        self.options = options
        self.plan = plan

    @short_traceback
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return write_task(iterator, self.options, self.plan)


class KProdBatchWriter(_TaskWriter, DataSourceArrowWriter):
    """``df.write.format("kprod")``: each task writes its partition through one producer."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _commit(self.options, messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self.options, messages, None)


class KProdStreamWriter(_TaskWriter, DataSourceStreamArrowWriter):
    """``df.writeStream.format("kprod")``: one summary line (and report line) per microbatch."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self.options, messages, batchId)
