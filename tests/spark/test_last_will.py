"""LastWill: the call runs in its own process when the process that set it is killed in
the block, and not when the block ends; the latest will is the one that runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from spark_sink.spark.last_will import LastWill

# A worker that sets its wills, says it is ready, then waits to be killed (or ends the
# block when told to on stdin).
_WORKER = """
import sys
from pathlib import Path
from spark_sink.spark.last_will import LastWill
out = Path(sys.argv[1])
with LastWill() as will:
    will.set(Path.write_text, out, "first")
    will.set(Path.write_text, out, "second")
    print("ready", flush=True)
    sys.stdin.readline()
"""


def _worker(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    """What the will wrote, once it did: the file exists a moment before its text."""
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"the last will never wrote {path}"
        time.sleep(0.05)
    return path.read_text()


def test_a_killed_process_has_its_last_will_run(tmp_path: Path) -> None:
    out = tmp_path / "will"
    proc = _worker(out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _wait_for(out) == "second"


def test_a_block_that_ends_leaves_its_will_unrun(tmp_path: Path) -> None:
    out = tmp_path / "will"
    proc = _worker(out)
    proc.communicate("done\n", timeout=30)
    assert proc.returncode == 0
    # The will process has read the end of the block: a later death of nobody runs nothing.
    marker = tmp_path / "after"
    with LastWill() as will:
        will.set(Path.write_text, marker, "ran")
    time.sleep(1.0)
    assert not out.exists() and not marker.exists()
