"""Faults for Spark tests, injected from the test process: a pause inside the JVM and a
SIGKILL of the Python worker that runs kprod's writer."""

from __future__ import annotations

import os
import random
import signal

from pyspark.sql import Column
from pyspark.sql import functions as F


def jvm_sleep(ms: int) -> Column:
    """An empty string, made after the JVM thread computing it sleeps ``ms``. A pause in
    the JVM lets the sink have the rows before it meanwhile (a Python UDF's output reaches
    the sink only once the UDF is done)."""
    return F.substring(F.expr(f"reflect('java.lang.Thread', 'sleep', {ms}L)"), 1, 0)


def kprod_writers(port: int) -> list[int]:
    """The Spark Python workers under this (test) process running kprod with a connection
    to ``port``: a write through a fault proxy's port is the only one connected there."""
    from tests import procs

    return procs.connected_to([p for p in procs.descendants(os.getpid()) if procs.loads_kprod(p)], port)


def kill_writer(port: int, rng: random.Random | None = None) -> int | None:
    """SIGKILL one writer connected to ``port`` (as an out-of-memory kill would): the only
    one, or one drawn by ``rng``; None if none is connected."""
    writers = kprod_writers(port)
    if rng is None:
        assert len(writers) == 1, f"expected one kprod writer connected to port {port}, found {writers}"
    if not writers:
        return None
    pid = rng.choice(writers) if rng is not None else writers[0]
    os.kill(pid, signal.SIGKILL)
    return pid
