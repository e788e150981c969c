"""Spark's Python daemon for the suite's SparkSession, with pyarrow, pandas and kprod
imported before it forks a worker.

Spark stops a Python worker once it has been idle for a minute (a constant of its
PythonWorkerFactory, not a setting), and the suite's Spark tests on one pytest worker
often come more than a minute apart: each new worker imported them again, about 0.45 s
of CPU, over a hundred times a run. Forked from this daemon it has them already.
Spark's own planning workers (data source lookup, write planning, commit) keep
``pyspark.daemon``: Spark starts them with it whatever the setting says. Fresh imports
in a worker are tested where they matter: tests/encoder/test_host_process.py and the
jobs run in child processes.
"""

import pandas  # noqa: F401
import pyarrow  # noqa: F401
from pyspark import daemon

import spark_sink.spark  # noqa: F401

if __name__ == "__main__":
    daemon.manager()
