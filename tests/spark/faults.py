"""Faults for Spark tests, injected from the test process: a pause inside the JVM and a
SIGKILL of the Python worker that runs kprod's writer."""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F


def jvm_sleep(ms: int) -> Column:
    """An empty string, made after the JVM thread computing it sleeps ``ms``. A pause in
    the JVM lets the sink have the rows before it meanwhile (a Python UDF's output reaches
    the sink only once the UDF is done)."""
    return F.substring(F.expr(f"reflect('java.lang.Thread', 'sleep', {ms}L)"), 1, 0)


def json_input(directory: Path, files: int, rows_per_file: int) -> Path:
    """``files`` JSON files of ``rows_per_file`` rows each (``{"id": n}``, ids 0 and up) in
    ``directory/in``: a file source read one file per microbatch gives that many."""
    source = directory / "in"
    source.mkdir()
    for f in range(files):
        (source / f"{f:03d}.json").write_text(
            "\n".join(json.dumps({"id": f * rows_per_file + i}) for i in range(rows_per_file)) + "\n")
    return source


def paused_value(rows_per_file: int, pause_ms: int) -> Column:
    """A value column ("v") whose middle row of every file pauses the JVM ``pause_ms``:
    each microbatch keeps its transactions open that much longer."""
    return F.when(F.col("id") % rows_per_file == rows_per_file // 2,
                  F.concat(F.lit("v"), jvm_sleep(pause_ms))).otherwise(F.lit("v"))


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
