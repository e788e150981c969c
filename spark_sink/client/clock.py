"""kprod's one clock: the only module that reads the system's clocks or sleeps on them.

``now_ms`` is the monotonic clock of every timeout, backoff and deadline, so that the
network layer, the producer and the admin client agree on what "now" is. The parts that
keep time take it as a ``Clock`` argument. The parts that also read the wall clock (a
marker's age, a token's expiry) or wait (a backoff, the abort's second fence) take a
``Time``: the same monotonic clock when called, plus ``wall_ms`` and ``sleep``, as Java
passes a ``Time`` (milliseconds, nanoseconds, sleep) into its clients. Tests pass one they
move, whose sleeps return at once (tests/clock.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


def now_ms() -> float:
    """Monotonic milliseconds: the clock of every timeout, backoff and deadline."""
    return time.monotonic() * 1000.0


# What the parts that keep time take (NetworkClient, Metadata, the Sender, the producer's
# metrics, KafkaProducer), as Java's take a Time: ``now_ms`` unless a test passes a clock
# it moves, so that a timeout passes without the test waiting for it. A ``Time`` is one.
Clock = Callable[[], float]


class Time(Protocol):
    """The whole clock: called, monotonic milliseconds (so a Time is a ``Clock``); the wall
    clock in milliseconds since the epoch; and sleeping."""

    def __call__(self) -> float: ...

    def wall_ms(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class SystemTime:
    """The system's clocks, and a real sleep."""

    def __call__(self) -> float:
        return time.monotonic() * 1000.0

    def wall_ms(self) -> float:
        return time.time() * 1000.0

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def __reduce__(self) -> str:
        return "SYSTEM_TIME"  # pickled (a last will's arguments) as the one instance


SYSTEM_TIME = SystemTime()


def record_clock(clock: Clock) -> Callable[[], int]:
    """The wall clock of record timestamps (nanoseconds since the epoch) that goes with
    ``clock``: a ``Time``'s own (a test's moves with it), else the system's, which is
    ``time.time_ns`` itself, not a wrapper: the producer reads it once per record."""
    wall_ms = getattr(clock, "wall_ms", None)
    if wall_ms is None or isinstance(clock, SystemTime):
        return time.time_ns
    # Whole microseconds first: nanoseconds since the epoch are past a float's 53 bits, and
    # a millisecond the clock gives exactly must stay that millisecond.
    return lambda: int(wall_ms() * 1000) * 1000
