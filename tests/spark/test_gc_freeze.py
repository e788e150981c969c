"""A reused Python worker freezes its long-lived objects once the compiled encoder is loaded."""

from __future__ import annotations

import gc

import pyarrow as pa

from spark_sink.producer.partitioner import murmur2_array
from spark_sink.spark import writer


def test_long_lived_objects_are_frozen_once_with_the_encoder_loaded():
    murmur2_array(pa.array([b"k"], pa.binary()))  # loads numba and compiles a kernel
    assert gc.get_freeze_count() == 0
    try:
        writer._freeze_long_lived()
        frozen = gc.get_freeze_count()
        assert frozen > 50_000  # numba alone holds ~100,000
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle made after the freeze is still collected
        del garbage
        assert gc.collect() >= 2
        writer._freeze_long_lived()  # once per process: nothing more is frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
        writer._long_lived_frozen = False
