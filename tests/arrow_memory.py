"""The most Arrow memory a step allocates at once, for tests of what a step copies."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa


def arrow_peak(run: Callable[[], object]) -> int:
    """The most Arrow bytes allocated at once while ``run`` runs, on a pool of its own
    (set as the default meanwhile). What ``run`` returns is dropped at once: its buffers
    would outlive the pool they came from."""
    default = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(default)
    pa.set_memory_pool(pool)
    try:
        run()
        return pool.max_memory()
    finally:
        pa.set_memory_pool(default)
