"""Producers kept across tasks and microbatches in a Python worker, as Spark's Kafka sink
keeps them per executor.

Spark reuses its Python workers, so a producer that a task leaves behind, flushed and
healthy, can serve the next task with the same configuration: its connections, SASL and
TLS handshakes, metadata and producer id are already there. A producer is taken by one
task at a time; one whose task failed is closed, never handed out again; one idle longer
than its timeout is closed by a daemon thread. A worker that exits takes its sockets
with it: every producer in the pool was flushed when its task ended, so nothing is lost.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import KafkaProducer

log = logging.getLogger(__name__)

_Key = tuple[tuple[str, str], ...]
# Idle producers a worker keeps at most, each with its sender thread and sockets: an
# exactly-once write keys producers by transactional id, so without a bound a loop of
# writes (foreachBatch) would pile them up until their timeout.
MAX_IDLE = 32


class ProducerPool:
    """Idle producers by configuration; ``acquire`` one, ``release`` it when the task ends.
    ``clock`` is the pool's idle times' and its producers' (their timeouts and records'
    timestamps)."""

    def __init__(self, clock: Time = SYSTEM_TIME) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._idle: dict[_Key, list[tuple[KafkaProducer, float, float]]] = {}  # (producer, idle since, timeout)
        self._evictor: threading.Thread | None = None
        self._wake = threading.Event()

    def _now_s(self) -> float:
        return self._clock() / 1000.0

    def acquire(self, config: Mapping[str, str]) -> KafkaProducer:
        """An idle producer made with exactly ``config``, or a new one."""
        key = tuple(sorted(config.items()))
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    break
                producer = idle.pop()[0]
                if not idle:
                    del self._idle[key]
            if producer.usable:
                return producer
            producer.close(0)  # its sender died (a bug or a fatal error) since it was kept
        return KafkaProducer(dict(config), clock=self._clock)

    def release(self, producer: KafkaProducer, config: Mapping[str, str], *, healthy: bool,
                timeout_s: float) -> None:
        """Give back a producer whose task ended. Keep it only if the task succeeded (it
        flushed, so nothing of that task is pending) and caching is on (``timeout_s`` > 0)."""
        if not healthy or timeout_s <= 0:
            producer.close(None if healthy else 0)
            return
        key = tuple(sorted(config.items()))
        with self._lock:
            self._idle.setdefault(key, []).append((producer, self._now_s(), timeout_s))
            overflow = self._oldest_beyond(MAX_IDLE)
            if self._evictor is None:
                self._evictor = threading.Thread(target=self._evict_loop, name="kprod-producer-pool", daemon=True)
                self._evictor.start()
        self._wake.set()
        for old in overflow:
            old.close(0)

    def _oldest_beyond(self, limit: int) -> list[KafkaProducer]:
        """Take out the longest idle producers past ``limit`` (with the lock held)."""
        entries = sorted(((since, key, p) for key, idle in self._idle.items() for p, since, _ in idle),
                         key=lambda e: e[0])
        taken = [p for _, _, p in entries[:max(0, len(entries) - limit)]]
        for key in {k for _, k, p in entries if p in taken}:
            self._idle[key] = [e for e in self._idle[key] if e[0] not in taken]
            if not self._idle[key]:
                del self._idle[key]
        return taken

    def evict_idle(self, now: float | None = None) -> int:
        """Close the producers idle past their timeout; returns how many."""
        now = self._now_s() if now is None else now
        expired = []
        with self._lock:
            for key, idle in list(self._idle.items()):
                keep = [entry for entry in idle if now - entry[1] < entry[2]]
                expired += [entry[0] for entry in idle if now - entry[1] >= entry[2]]
                if keep:
                    self._idle[key] = keep
                else:
                    del self._idle[key]
        for producer in expired:
            producer.close(0)
        if expired:
            log.info("closed %d producer(s) idle past kprod.producer.cache.timeout", len(expired))
        return len(expired)

    def close_all(self) -> None:
        """Close every idle producer (worker shutdown)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for entries in idle.values():
            for producer, _, _ in entries:
                producer.close(0)

    def idle_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._idle.values())

    def _next_expiry(self) -> float | None:
        with self._lock:
            ends = [since + timeout for idle in self._idle.values() for _, since, timeout in idle]
        return min(ends) if ends else None

    def _evict_loop(self) -> None:
        while True:
            end = self._next_expiry()
            self._wake.wait(None if end is None else max(0.0, end - self._now_s()) + 0.01)
            self._wake.clear()
            self.evict_idle()


# No atexit hook: Spark's forked Python workers end with os._exit, which runs none, and
# every pooled producer was flushed when its task ended, so nothing is left to send.
POOL = ProducerPool()
