"""A reused Python worker freezes its long-lived objects once numba's encoder is loaded
(what kprod from a --py-files zip runs; the wheel's compiled extension adds no objects)."""

from __future__ import annotations

import gc

import numpy as np

from spark_sink.spark import writer


def test_long_lived_objects_are_frozen_once_with_the_encoder_loaded() -> None:
    from spark_sink.encoder import jit  # loads numba

    jit.murmur2_rows(np.zeros(1, np.uint8), np.array([0, 1], np.int32), np.zeros(0, np.bool_), 0,
                     np.empty(1, np.uint32))  # and compiles a loop
    assert gc.get_freeze_count() == 0
    try:
        writer._freeze_long_lived()
        frozen = gc.get_freeze_count()
        assert frozen > 50_000  # numba alone holds ~100,000
        garbage: list[list[object]] = [[]]
        garbage[0].append(garbage)  # a cycle made after the freeze is still collected
        del garbage
        assert gc.collect() >= 2
        kept: list[list[object]] = [[] for _ in range(1000)]  # made after the freeze, alive at the second call
        writer._freeze_long_lived()  # once per process: nothing more is frozen
        # At most as many: a frozen object can be freed since (under pytest-xdist, by
        # the thread that talks to the controller), but a second freeze would add ``kept``.
        assert gc.get_freeze_count() <= frozen, len(kept)
    finally:
        gc.unfreeze()
        writer._long_lived_frozen = False
