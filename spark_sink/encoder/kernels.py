"""Which compiled loops the encoder runs: the C extension ``_kernels`` that kprod's wheel
(and an editable install) builds, else the same loops compiled by numba (``jit``) where
kprod runs from its source files, as from a ``--py-files`` zip."""

from __future__ import annotations

import functools
import importlib
from types import ModuleType


@functools.cache
def compiled() -> ModuleType:
    """The loops' module, loaded on first use (numba takes a second to import and seconds
    to compile: a program that only calls ``send()`` should not pay that)."""
    try:
        return importlib.import_module("spark_sink.encoder._kernels")  # the wheel's C extension
    except ImportError:
        pass
    try:
        from spark_sink.encoder import jit
    except ImportError as exc:
        raise ImportError("kprod's compiled encoder is not built here (kprod runs from its source files, as "
                          "from a --py-files zip), and numba, which would compile it, is not installed: "
                          "pip install numba, or install kprod's wheel") from exc
    return jit
