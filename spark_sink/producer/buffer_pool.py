"""BufferPool: bounds the bytes of records waiting to be sent (buffer.memory).

Python has no direct buffers to recycle, so the pool is the Java pool's accounting half:
a batch reserves its memory when it is created and gives it back when it completes, and
a producer that runs ahead of the brokers blocks up to max.block.ms, then fails.
"""

from __future__ import annotations

import threading
import time

from spark_sink.producer.errors import BufferExhaustedError, RecordTooLargeError


class BufferPool:
    """A counting semaphore over bytes, fair to waiters in arrival order."""

    def __init__(self, total_bytes: int) -> None:
        self.total = total_bytes
        self._available = total_bytes
        self._cond = threading.Condition(threading.Lock())
        self._waiters = 0

    @property
    def available(self) -> int:
        return self._available

    @property
    def exhausted(self) -> bool:
        """True while some sender is blocked waiting for memory (batches should go now)."""
        return self._waiters > 0

    def allocate(self, size: int, max_block_ms: float) -> None:
        """Reserve ``size`` bytes, waiting up to ``max_block_ms`` for them."""
        if size > self.total:
            raise RecordTooLargeError(
                f"a batch of {size} bytes is larger than buffer.memory ({self.total} bytes)")
        with self._cond:
            if self._available >= size and not self._waiters:
                self._available -= size
                return
            deadline = time.monotonic() + max_block_ms / 1000.0
            self._waiters += 1
            try:
                while self._available < size:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise BufferExhaustedError(
                            f"failed to allocate {size} bytes within max.block.ms ({max_block_ms:.0f} ms): "
                            f"buffer.memory ({self.total} bytes) is full of records waiting to be sent")
                    self._cond.wait(remaining)
                self._available -= size
            finally:
                self._waiters -= 1

    def deallocate(self, size: int) -> None:
        """Return ``size`` bytes and wake waiters."""
        with self._cond:
            self._available += size
            self._cond.notify_all()
