"""The clock every timeout and deadline in kprod's clients reads: monotonic milliseconds.

One function, so that the network layer, the producer and the admin client agree on what
"now" is, and so that nothing but this module reads ``time.monotonic`` for a deadline.
The parts that keep time take it as a ``Clock`` argument, which tests replace.
Record timestamps are wall-clock time (``time.time``) and do not come from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def now_ms() -> float:
    """Monotonic milliseconds: the clock of every timeout, backoff and deadline."""
    return time.monotonic() * 1000.0


# What the parts that keep time take (NetworkClient, Metadata, the Sender, the producer's
# metrics, KafkaProducer), as Java's take a Time: ``now_ms`` unless a test passes a clock
# it moves, so that a timeout passes without the test waiting for it.
Clock = Callable[[], float]
