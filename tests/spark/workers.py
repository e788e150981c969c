"""Spark's Python workers for the suite: forked from ``tests.spark.daemon``, which has
pyarrow, pandas and kprod imported (it says why), in the suite's session and in the jobs
its tests run as child processes."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.brokers import subprocess_env


def python_wrapper(directory: Path) -> Path:
    """A ``python`` for the session's workers that runs ``-m pyspark.daemon MODULE`` as
    ``-m tests.spark.daemon MODULE`` (tests/spark/daemon.py says why), anything else as
    this interpreter would."""
    wrapper = directory / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = pyspark.daemon ]; then shift 2; set -- -m tests.spark.daemon "$@"; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def preloaded_env(directory: Path) -> dict[str, str]:
    """``subprocess_env()`` for a Spark job run as a child process whose Python workers
    fork from the suite's daemon (its wrapper written into ``directory``): a fault test's
    job starts a JVM per run, and each run's planning and task workers importing pyspark,
    pyarrow, pandas and kprod afresh cost most of its start on 2 cores. Fresh imports stay
    tested by tests/encoder/test_host_process.py and the jobs in tests/spark/test_jobs.py
    and test_cluster.py."""
    env = subprocess_env()
    env["PYSPARK_PYTHON"] = str(python_wrapper(directory))
    return env
