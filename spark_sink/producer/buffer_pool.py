"""BufferPool: bounds the bytes of records waiting to be sent (buffer.memory).

Python has no direct buffers to recycle, so the pool is the Java pool's accounting half:
a batch reserves its memory when it is created and gives it back when it completes, and
a producer that runs ahead of the brokers blocks up to max.block.ms, then fails.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.errors import BufferExhaustedError, RecordTooLargeError


class _Waiter:
    __slots__ = ("size", "cond")

    def __init__(self, size: int, lock: threading.Lock) -> None:
        self.size = size
        self.cond = threading.Condition(lock)


class BufferPool:
    """A counting semaphore over bytes, served to waiters in arrival order.

    As in Java's pool, each waiter has its own condition and is woken only once the bytes
    it asked for are there: a producer blocked for a large reservation is not woken (and
    does not take the GIL from the sender) for every small batch that completes.
    """

    def __init__(self, total_bytes: int, *, clock: Clock = now_ms) -> None:
        self.total = total_bytes
        self._clock = clock  # of max.block.ms and of how long each wait took
        # Called when a caller is about to wait: the memory is in batches someone must send.
        self.on_block: Callable[[], None] | None = None
        # Told how long each blocked allocation waited (bufferpool-wait-time); only blocked
        # ones: the fast path pays nothing.
        self.on_waited: Callable[[float], None] | None = None
        self._available = total_bytes
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()

    @property
    def available(self) -> int:
        return self._available

    @property
    def exhausted(self) -> bool:
        """True while some sender is blocked waiting for memory (batches should go now)."""
        return bool(self._waiters)

    def allocate(self, size: int, max_block_ms: float,
                 abandon: Callable[[], BaseException | None] | None = None) -> None:
        """Reserve ``size`` bytes, waiting up to ``max_block_ms`` for them; while waiting,
        raise what ``abandon()`` returns once it returns something (woken by wake_all())."""
        if size > self.total:
            raise RecordTooLargeError(
                f"a batch of {size} bytes is larger than buffer.memory ({self.total} bytes)")
        with self._lock:
            if self._available >= size and not self._waiters:
                self._available -= size
                return
            started = self._clock()
            deadline = started + max_block_ms
            waiter = _Waiter(size, self._lock)
            self._waiters.append(waiter)
            if self.on_block is not None:
                self.on_block()
            try:
                while self._available < size or self._waiters[0] is not waiter:
                    if abandon is not None and (reason := abandon()) is not None:
                        raise reason
                    remaining = deadline - self._clock()
                    if remaining <= 0:
                        raise BufferExhaustedError(
                            f"failed to allocate {size} bytes within max.block.ms ({max_block_ms:.0f} ms): "
                            f"buffer.memory ({self.total} bytes) is full of records waiting to be sent")
                    waiter.cond.wait(remaining / 1000.0)
                self._available -= size
            finally:
                self._waiters.remove(waiter)
                self._wake_first()
                if self.on_waited is not None:
                    self.on_waited((self._clock() - started) / 1000.0)

    def deallocate(self, size: int) -> None:
        """Return ``size`` bytes; wake the first waiter if it can now proceed."""
        with self._lock:
            self._available += size
            self._wake_first()

    def wake_all(self) -> None:
        """Wake every waiter to ask its ``abandon`` again (a call whose records failed
        meanwhile stops waiting for memory it no longer needs)."""
        with self._lock:
            for waiter in self._waiters:
                waiter.cond.notify()

    def _wake_first(self) -> None:
        # Called with the lock held.
        if self._waiters and self._available >= self._waiters[0].size:
            self._waiters[0].cond.notify()
