"""Builds kprod's compiled encoder loops and send()'s per-record path
(spark_sink/encoder/_kernels.c), and the value formats' loops (_formats.c: Avro, JSON),
into the wheel; everything else is in pyproject.toml.

The loops are plain C over the buffers numpy hands them (no numpy headers), written
against Python's stable ABI, so one wheel serves every CPython from 3.11 on. Without a C
compiler the build goes on without them (optional): kprod then compiles the same loops
with numba (``kprod[jit]``) at first use, and send() runs its Python path; the value
formats (formats.py) have no such fallback and say so.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[Extension(f"spark_sink.encoder.{name}", [f"spark_sink/encoder/{name}.c"], py_limited_api=True,
                           define_macros=[("Py_LIMITED_API", "0x030B0000")], optional=True)
                 for name in ("_kernels", "_formats")],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
