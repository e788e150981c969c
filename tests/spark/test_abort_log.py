"""What the sink's abort says, as Spark's driver-side Python worker runs it (a process of
its own, logging to stderr): a microbatch whose tasks were all killed (query.stop()) or
failed delivered nothing, which is no warning of kprod's (Spark reports a failed task
itself)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.brokers import subprocess_env

ABORT = """
from spark_sink.spark.options import parse_options
from spark_sink.spark.writer import KProdStreamWriter
writer = KProdStreamWriter.__new__(KProdStreamWriter)
writer.options = parse_options({{"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"}})
writer.abort({messages}, 7)
"""


def abort_stderr(messages: str) -> str:
    done = subprocess.run([sys.executable, "-c", ABORT.format(messages=messages)],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("tasks", [1, 2, 5])
def test_an_abort_with_no_finished_task_is_info(tasks: int) -> None:
    stderr = abort_stderr(repr([None] * tasks))
    assert f"INFO spark_sink.spark.writer: kprod microbatch 7 aborted: none of its {tasks} task(s) had completed; " \
           "nothing of it was delivered" in stderr, stderr
    assert "WARNING" not in stderr and "ERROR" not in stderr, stderr
