"""What a producer measures, under the Java producer's metric names.

The Sender counts once per request, per batch it sends, retries or fails, and per
response: never per record, so the hot path pays a few additions per batch. Rates and
averages are over a sliding window as in Java (``metrics.sample.window.ms`` 30 s,
``metrics.num.samples`` 2): two samples, the older dropped once a newer one is a
window old; a rate over a producer younger than one window divides by a whole window,
as Java's does. Totals count from the producer's start.

Only the Sender's thread of the moment (under its I/O lock) records requests, batches
and responses, and the buffer pool records waits under its own lock; readers only read.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_sink.client.clock import Clock, now_ms

if TYPE_CHECKING:
    from spark_sink.producer.batch import ProducerBatch
    from spark_sink.producer.buffer_pool import BufferPool

WINDOW_S = 30.0  # Java's metrics.sample.window.ms
SAMPLES = 2  # Java's metrics.num.samples

# Each sample's counters, by index.
_RECORDS, _BYTES, _BATCHES, _REQUESTS, _RETRIES, _ERRORS, _RESPONSES, _LATENCY_SUM, _WAIT_S = range(9)
_LATENCY_MAX = 9  # a maximum, not a sum
_FIELDS = 10


_SUMMED = ("records_sent", "bytes_sent", "requests", "responses", "records_retried", "records_failed",
           "request_latency_sum_ms")


@dataclass(frozen=True)
class MetricTotals:
    """Counters from the producer's start, and the largest request latency since the
    previous ``checkpoint()`` (a task's own, when the task took the producer for itself)."""

    records_sent: int = 0
    bytes_sent: int = 0
    requests: int = 0
    responses: int = 0
    records_retried: int = 0
    records_failed: int = 0
    request_latency_sum_ms: float = 0.0
    request_latency_max_ms: float = 0.0

    def since(self, earlier: MetricTotals) -> MetricTotals:
        """What happened between ``earlier`` and this checkpoint (the maximum is this one's)."""
        summed = {f: getattr(self, f) - getattr(earlier, f) for f in _SUMMED}
        return MetricTotals(**summed, request_latency_max_ms=self.request_latency_max_ms)

    @classmethod
    def combine(cls, parts: Iterable[MetricTotals]) -> MetricTotals:
        """Several producers' (or tasks') totals added up; the maximum is the largest."""
        parts = list(parts)
        summed = {f: sum(getattr(p, f) for p in parts) for f in _SUMMED}
        return cls(**summed, request_latency_max_ms=max((p.request_latency_max_ms for p in parts), default=0.0))

    def describe(self) -> str:
        """For a log or summary line."""
        return (f"{self.records_retried} record(s) retried, {self.records_failed} failed; {self.responses} "
                f"request(s), latency avg {self.request_latency_avg_ms:.1f} ms, max {self.request_latency_max_ms:.1f} ms")

    @property
    def request_latency_avg_ms(self) -> float:
        return self.request_latency_sum_ms / self.responses if self.responses else 0.0


class ProducerMetrics:
    """The Sender's and the buffer pool's counters; ``metrics()`` names them as Java does."""

    def __init__(self, pool: BufferPool, clock: Clock = now_ms) -> None:
        self._pool = pool
        self._clock = clock  # milliseconds; a test moves its own
        now = self._seconds()
        # The current sample and the one before it: [start, counters].
        self._current: list = [now, [0] * _FIELDS]
        self._previous: list | None = None
        self._totals: list[Any] = [0] * _FIELDS
        self._checkpoint_max = 0.0

    def _seconds(self) -> float:
        return self._clock() / 1000.0

    def _window(self, now: float) -> tuple[list, list | None]:
        """The current and the previous sample as of ``now``: a new current one if this one
        is a window old. Changes nothing, so that readers can call it too."""
        current, previous = self._current, self._previous
        if now - current[0] >= WINDOW_S:
            # A sample older than the whole window (no traffic for a while) is dropped too.
            previous = current if now - current[0] < SAMPLES * WINDOW_S else None
            current = [now, [0] * _FIELDS]
        return current, previous

    def _sample(self, now: float) -> list[Any]:
        """The current sample's counters, a new sample started if this one is a window old."""
        self._current, self._previous = self._window(now)
        return self._current[1]

    def _add(self, now: float, index: int, amount: float) -> None:
        self._sample(now)[index] += amount
        self._totals[index] += amount

    # -- recorded by the Sender ------------------------------------------------

    def request_sent(self, batches: Iterable[ProducerBatch]) -> None:
        """A Produce request with these batches went to a broker (retries included, as in Java)."""
        records = nbytes = count = 0
        for batch in batches:
            records += batch.record_count
            nbytes += batch.wire_size
            count += 1
        sample = self._sample(self._seconds())
        for counters in (sample, self._totals):
            counters[_RECORDS] += records
            counters[_BYTES] += nbytes
            counters[_BATCHES] += count
            counters[_REQUESTS] += 1

    def response_received(self, latency_ms: float) -> None:
        """A broker answered a Produce request after ``latency_ms``."""
        sample = self._sample(self._seconds())
        for counters in (sample, self._totals):
            counters[_RESPONSES] += 1
            counters[_LATENCY_SUM] += latency_ms
            if latency_ms > counters[_LATENCY_MAX]:
                counters[_LATENCY_MAX] = latency_ms
        if latency_ms > self._checkpoint_max:
            self._checkpoint_max = latency_ms

    def batch_retried(self, batch: ProducerBatch) -> None:
        self._add(self._seconds(), _RETRIES, batch.record_count)

    def batch_failed(self, batch: ProducerBatch) -> None:
        self._add(self._seconds(), _ERRORS, batch.record_count)

    def buffer_waited(self, seconds: float) -> None:
        """A send waited ``seconds`` for buffer.memory (recorded by the pool)."""
        self._add(self._seconds(), _WAIT_S, seconds)

    # -- read -------------------------------------------------------------------

    def checkpoint(self) -> MetricTotals:
        """The totals now; starts a new maximum request latency for the next checkpoint."""
        t = self._totals
        totals = MetricTotals(t[_RECORDS], t[_BYTES], t[_REQUESTS], t[_RESPONSES], t[_RETRIES], t[_ERRORS],
                              t[_LATENCY_SUM], self._checkpoint_max)
        self._checkpoint_max = 0.0
        return totals

    def metrics(self) -> dict[str, float]:
        """The Java producer's ``producer-metrics`` that kprod measures, by name."""
        now = self._seconds()
        current, previous = self._window(now)  # without rolling them: only the Sender writes
        samples = [current[1]] if previous is None else [previous[1], current[1]]
        oldest = current[0] if previous is None else previous[0]
        # As Java's Rate: over the samples' span, but never less than (samples - 1) windows.
        elapsed = max(now - oldest, (SAMPLES - 1) * WINDOW_S)

        def total(index: int) -> float:
            return sum(s[index] for s in samples)

        def ratio(numerator: float, denominator: float) -> float:
            return numerator / denominator if denominator else 0.0

        t = self._totals
        return {
            "record-send-rate": total(_RECORDS) / elapsed,
            "record-send-total": t[_RECORDS],
            "byte-rate": total(_BYTES) / elapsed,
            "byte-total": t[_BYTES],
            "batch-size-avg": ratio(total(_BYTES), total(_BATCHES)),
            "records-per-request-avg": ratio(total(_RECORDS), total(_REQUESTS)),
            "request-rate": total(_REQUESTS) / elapsed,
            "request-total": t[_REQUESTS],
            "request-latency-avg": ratio(total(_LATENCY_SUM), total(_RESPONSES)),
            "request-latency-max": max(s[_LATENCY_MAX] for s in samples),
            "record-retry-rate": total(_RETRIES) / elapsed,
            "record-retry-total": t[_RETRIES],
            "record-error-rate": total(_ERRORS) / elapsed,
            "record-error-total": t[_ERRORS],
            "buffer-total-bytes": self._pool.total,
            "buffer-available-bytes": self._pool.available,
            # Java's bufferpool-wait-ratio under its older name: the share of time sends
            # spent waiting for buffer.memory.
            "bufferpool-wait-time": total(_WAIT_S) / elapsed,
            "bufferpool-wait-time-ns-total": t[_WAIT_S] * 1e9,
        }
