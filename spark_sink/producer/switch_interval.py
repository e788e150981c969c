"""A short GIL switch interval while a thread encodes Arrow data beside the Sender thread.

CPython hands the GIL to a waiting thread only after the holder has run for the switch
interval (``sys.setswitchinterval``, 5 ms by default). While ``send_arrow`` encodes (pure
GIL-holding work for milliseconds at a time), the Sender thread, woken by a response,
waits up to that long before it can read the response and send the next request. 5 ms
is longer than a local broker takes for all five in-flight requests, so the broker goes
idle and the pipeline stalls (bench/RESULTS.md has the runs that showed it).

The interval is process-wide, so it is lowered only while some thread is inside
``short_switch_interval()`` and restored when the last one leaves, unless someone else
changed it meanwhile.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

SWITCH_INTERVAL_S = 0.0005

_lock = threading.Lock()
_holders = 0
_saved: float | None = None  # the interval to restore; None while nothing was lowered
_set: float | None = None  # what we set, as sys.getswitchinterval() reports it


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """Run the block with the switch interval at most ``SWITCH_INTERVAL_S``; nests and
    may be entered from several threads at once."""
    global _holders, _saved, _set
    with _lock:
        if _holders == 0:
            current = sys.getswitchinterval()
            if current > SWITCH_INTERVAL_S:
                sys.setswitchinterval(SWITCH_INTERVAL_S)
                _saved, _set = current, sys.getswitchinterval()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _saved is not None:
                if sys.getswitchinterval() == _set:  # nobody else changed it meanwhile
                    sys.setswitchinterval(_saved)
                _saved = _set = None
