"""Where numba keeps the compiled encoder, so that a fresh process does not compile it.

Compiling ``kernels.py`` takes seconds, which every new Spark executor, Spark Connect
session or container would pay on its first write. So the wheel ships the compiled
kernels (``_kernel_cache/``, made when the wheel is built: see ``setup.py``) and this
module points numba's cache at them:

- the code is compiled for a generic x86-64 (or whatever the build machine's
  architecture is) with no CPU-specific features, so the shipped cache loads on any
  machine of that architecture; numba keys its cache by CPU name and features;
- the cache directory is ``_kernel_cache/`` itself when it is writable (an editable
  install, a virtualenv), else a per-user copy seeded from it (a read-only
  site-packages). numba checks each entry against a hash of ``kernels.py`` and its own
  version, and compiles again whatever does not match.

A process that set ``NUMBA_CPU_NAME`` or ``NUMBA_CACHE_DIR`` itself, or that compiled
numba code before kprod's first use, keeps its own settings; kprod then compiles its
kernels there once, as numba always does.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

SHIPPED = Path(__file__).with_name("_kernel_cache")
KERNELS = Path(__file__).with_name("kernels.py")


def configure() -> None:
    """Before numba is imported: portable code generation, unless the user chose otherwise.
    After numba is imported: register the locator of kprod's kernels."""
    if "numba" not in sys.modules and "NUMBA_CPU_NAME" not in os.environ and "NUMBA_CPU_FEATURES" not in os.environ:
        os.environ["NUMBA_CPU_NAME"] = "generic"
        os.environ["NUMBA_CPU_FEATURES"] = ""


def install_locator() -> None:
    """Put kprod's locator first among numba's cache locators (once)."""
    from numba.core.caching import CacheImpl

    locator = _kernel_locator_class()
    if locator not in CacheImpl._locator_classes:
        CacheImpl._locator_classes.insert(0, locator)


def _user_cache_dir() -> Path:
    base = os.environ.get("KPROD_CACHE") or Path.home() / ".cache" / "kprod"
    return Path(base) / "kernels"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        return True
    except OSError:
        return False


def cache_dir() -> Path:
    """The directory numba reads and writes kprod's compiled kernels in."""
    if _writable(SHIPPED):
        return SHIPPED
    target = _user_cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    if SHIPPED.is_dir():
        for entry in SHIPPED.iterdir():
            if entry.suffix in (".nbi", ".nbc") and not (target / entry.name).exists():
                shutil.copyfile(entry, target / entry.name)
    return target


_LOCATOR: type | None = None


def _kernel_locator_class() -> type:
    """numba's file-backed locator, for kernels.py only, with kprod's directory."""
    global _LOCATOR
    if _LOCATOR is None:
        from numba.core.caching import InTreeCacheLocator

        class KernelCacheLocator(InTreeCacheLocator):
            """kernels.py's compiled code in ``cache_dir()``; any other file: not ours."""

            def __init__(self, py_func: object, py_file: str) -> None:
                super().__init__(py_func, py_file)
                self._cache_path = str(cache_dir())

            @classmethod
            def from_function(cls, py_func: object, py_file: str) -> KernelCacheLocator | None:
                if os.environ.get("NUMBA_CACHE_DIR") or Path(py_file).resolve() != KERNELS.resolve():
                    return None
                return super().from_function(py_func, py_file)

        _LOCATOR = KernelCacheLocator
    return _LOCATOR


def warm() -> None:
    """Compile (or load) every kernel once. columnar passes every input as read-only
    binary columns, so each kernel has one build and one call compiles it."""
    import numpy as np
    import pyarrow as pa

    from spark_sink.protocol import kernels
    from spark_sink.protocol.columnar import HEADER_TYPE, binary_offsets, encode_groups

    keys = pa.array([b"k1", None, b"k3"], pa.binary())
    values = pa.array([b"v", b"", None], pa.binary())
    headers = pa.array([[{"key": "h", "value": b"x"}], [], None], HEADER_TYPE)
    timestamps = np.zeros(3, np.int64)
    encode_groups(keys, values, timestamps, headers, np.array([0, 1, 0], np.int64), 2, batch_size=16384, codec=0)
    encode_groups(None, values, timestamps, None, None, 1, batch_size=16384, codec=0)
    data, offsets, nulls = (np.frombuffer(keys.buffers()[2], np.uint8), binary_offsets(keys),
                            np.asarray(keys.is_null()))
    for a in (data, offsets, nulls):
        a.flags.writeable = False
    kernels.murmur2_rows(data, offsets, nulls, 0)  # the seed is an int64 whatever its value


if __name__ == "__main__":
    # setup.py's build step: compile into the package being built (its _kernel_cache/).
    target = Path(sys.argv[1]).resolve()
    if target != SHIPPED.resolve():
        sys.exit(f"kernel_cache: run with the built package first on PYTHONPATH ({SHIPPED} is not {target})")
    SHIPPED.mkdir(parents=True, exist_ok=True)
    warm()
    print(f"kprod: compiled kernels into {SHIPPED}: {sorted(p.name for p in SHIPPED.iterdir())}", file=sys.stderr)
