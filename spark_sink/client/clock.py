"""The clock every timeout and deadline in kprod's clients reads: monotonic milliseconds.

One function, so that the network layer, the producer and the admin client agree on what
"now" is, and so that nothing but this module reads ``time.monotonic`` for a deadline.
Record timestamps are wall-clock time (``time.time``) and do not come from here.
"""

from __future__ import annotations

import time


def now_ms() -> float:
    """Monotonic milliseconds: the clock of every timeout, backoff and deadline."""
    return time.monotonic() * 1000.0
