"""Builds the wheel with kprod's compiled encoder in it (everything else is in pyproject.toml).

Compiling the numba kernels takes seconds in every fresh process; a wheel that carries
them lets a new Spark executor write at once (see spark_sink/protocol/kernel_cache.py).
Editable installs skip this: they compile once, into the checkout, on first use.
"""

import os
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithKernels(build_py):
    """build_py, then compile the kernels into the built package's _kernel_cache/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib, "spark_sink", "protocol", "_kernel_cache").resolve()
        env = {**os.environ, "PYTHONPATH": os.path.abspath(self.build_lib)}
        for name in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_CACHE_DIR", "NUMBA_DISABLE_JIT"):
            env.pop(name, None)
        done = subprocess.run([sys.executable, "-m", "spark_sink.protocol.kernel_cache", str(target)],
                              env=env, cwd=self.build_lib)
        if done.returncode != 0:
            # A wheel without the cache still works: its first write compiles the kernels.
            print("warning: kprod's kernels were not precompiled into the wheel", file=sys.stderr)


setup(cmdclass={"build_py": BuildPyWithKernels})
