"""A clock tests move, for the ``clock`` argument of NetworkClient, Metadata, the Sender
and KafkaProducer (as Java's tests pass MockTime): a timeout, backoff or idle limit passes
when the test says, not after the test has waited for it.

It is client/clock.py's clock plus however far the test moved it, not a frozen one: the
producer's own waits (flush, futures, a thread blocked for memory) pass in real time, and
a clock that stood still would never end them. Moving it forward makes every age on it
(a batch's linger and delivery timeout, a request's timeout) grow at once.
"""

from __future__ import annotations

import threading

from spark_sink.client.clock import now_ms


class MovedClock:
    """``now_ms()`` plus the milliseconds ``advance`` added; safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.moved_ms = 0.0

    def __call__(self) -> float:
        return now_ms() + self.moved_ms

    def advance(self, ms: float) -> None:
        """Let ``ms`` milliseconds pass at once."""
        with self._lock:
            self.moved_ms += ms
