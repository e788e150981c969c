"""A clock tests move, as Java's tests pass MockTime: for the ``clock`` argument of
NetworkClient, Metadata, the Sender and KafkaProducer (its monotonic part), and of the parts
that also read the wall clock or sleep (the Spark room, the OAUTHBEARER token cache, the
cluster check): a timeout, backoff, idle limit or expiry passes when the test says, not
after the test has waited for it.

It is the system's clocks plus however far the test moved it, not a frozen one: the
producer's own waits (flush, futures, a thread blocked for memory) pass in real time, and
a clock that stood still would never end them. Moving it forward makes every age on it
(a batch's linger and delivery timeout, a request's timeout, a marker's age) grow at once.
Its ``sleep`` moves it instead of waiting, so a backoff costs the test no time.
"""

from __future__ import annotations

import threading

from spark_sink.client.clock import SYSTEM_TIME


class MovedClock:
    """The system's clocks plus the milliseconds ``advance`` (or ``sleep``) added; safe
    from any thread. A ``Time`` (spark_sink.client.clock)."""

    def __init__(self, moved_ms: float = 0.0) -> None:
        self._lock = threading.Lock()
        self.moved_ms = moved_ms
        self.slept: list[float] = []  # every sleep asked for, in seconds

    def __call__(self) -> float:
        return SYSTEM_TIME() + self.moved_ms

    def wall_ms(self) -> float:
        return SYSTEM_TIME.wall_ms() + self.moved_ms

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass at once, without waiting."""
        self.slept.append(seconds)
        self.advance(seconds * 1000)

    def advance(self, ms: float) -> None:
        """Let ``ms`` milliseconds pass at once."""
        with self._lock:
            self.moved_ms += ms


def days_later(days: float) -> MovedClock:
    """A clock ``days`` ahead of the system's."""
    return MovedClock(days * 86_400_000)
