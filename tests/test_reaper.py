"""The processes a pytest run starts end with it, however it ends (tests/reaper.py): a
test's own child in a session of its own, as the suite's Kafka nodes and registries run,
is gone once the run that started it ends without its teardowns, by ``os._exit`` (as
pytest-timeout's thread method ends a stuck run) or a SIGKILL of xdist's controller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A test that starts a long-lived process the way kprod_broker starts a node, says so,
# and then ends its run at once (``exit``) or waits to be killed.
_TEST = """
import os, subprocess, sys, time
from pathlib import Path

def test_starts_a_child_and_ends_without_teardown():
    child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL)
    Path({out!r} + ".part").write_text(str(child.pid))
    Path({out!r} + ".part").rename({out!r})
    if {exit!r}:
        os._exit(1)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaping has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(condition: Callable[[], object], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("ending", ["os._exit", "xdist controller killed"])
def test_a_runs_children_end_with_the_run(tmp_path: Path, ending: str) -> None:
    out = tmp_path / "child"
    (tmp_path / "test_child.py").write_text(_TEST.format(out=str(out), exit=ending == "os._exit"))
    xdist = ["-n", "1"] if ending != "os._exit" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    # Its output to a file: a pipe would stay open as long as any process of the run lives.
    with open(tmp_path / "output", "wb") as output:
        run = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.reaper", *xdist,
             "test_child.py"], cwd=tmp_path, env=env, stdout=output, stderr=subprocess.STDOUT)
    child = None
    try:
        _wait_for(lambda: out.exists() or run.poll() is not None, "the child never started")
        assert out.exists(), (tmp_path / "output").read_text(errors="replace")
        child = int(out.read_text())
        if ending != "os._exit":  # (after os._exit the reaper may have ended it already)
            assert _alive(child)
            run.send_signal(signal.SIGKILL)  # the controller: its xdist worker started the child
        run.wait()
        _wait_for(lambda: not _alive(child), f"the run's child {child} outlived the run ({ending})")
    finally:
        run.kill()
        run.wait()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
