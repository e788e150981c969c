"""Builds kprod's compiled encoder loops and send()'s per-record path
(spark_sink/encoder/_kernels.c) into the wheel; everything else is in pyproject.toml.

The loops are plain C over the buffers numpy hands them (no numpy headers), written
against Python's stable ABI, so one wheel serves every CPython from 3.11 on. Without a C
compiler the build goes on without them (optional): kprod then compiles the same loops
with numba (``kprod[jit]``) at first use, and send() runs its Python path.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[Extension("spark_sink.encoder._kernels", ["spark_sink/encoder/_kernels.c"],
                           py_limited_api=True, define_macros=[("Py_LIMITED_API", "0x030B0000")], optional=True)],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
