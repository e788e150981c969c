"""Spark's Python daemon for the suite's SparkSession, with pyarrow, pandas and kprod
imported before it forks a worker.

Spark stops a Python worker once it has been idle for a minute (a constant of its
PythonWorkerFactory, not a setting), and the suite's Spark tests on one pytest worker
often come more than a minute apart: each new worker imported them again, about 0.45 s
of CPU, several hundred times a run. Forked from this daemon it has them already, and
the module it runs (``sys.argv[1]``, as ``pyspark.daemon`` reads it) too.

Spark starts its task workers and its planning workers (data source lookup, creation,
write planning, commit, the streaming sink) with ``-m pyspark.daemon MODULE``, the
planners whatever ``spark.python.daemon.module`` says, so the suite's session runs
Python through ``python_wrapper`` (tests/spark/conftest.py), which sends all of them
here. Fresh imports in a worker are tested where they matter:
tests/encoder/test_host_process.py and the jobs run in child processes.
"""

import importlib
import sys

# Spark puts pyspark's and py4j's zips ahead of site-packages, where the same versions
# are installed. From the zips, every worker pays after its fork for Spark's
# importlib.invalidate_caches(): each of the ~16 zipimporters of pyspark.zip's packages
# reads the zip's directory again, in Python (0.3 s of CPU a worker). The suite's workers
# import them from site-packages; the jobs in child processes keep Spark's path.
sys.path[:] = [entry for entry in sys.path if not entry.endswith(".zip")]

import pandas  # noqa: E402, F401
import pyarrow  # noqa: E402, F401
from pyspark import daemon  # noqa: E402

import spark_sink.spark.source  # noqa: E402
import spark_sink.spark.writer  # noqa: E402, F401  (what the writers' pickles import)

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark"):
        importlib.import_module(sys.argv[1])
    daemon.manager()
