"""The README's first command on a bare machine: `make demo`'s venv needs only Python, Java
and a C compiler. Here its venv step runs on a copy of the checkout with `krb5-config` and
`mvn` on PATH failing (as on a machine without MIT Kerberos's headers and Maven), and the
venv it makes imports the sink and the demo's reader."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _copy_checkout(to: Path) -> None:
    """The files a clone would have (tracked and new ones, not what is ignored): the copy's
    editable install builds its own encoder, never touching this checkout's."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)


def _failing_tools(bin_dir: Path) -> None:
    bin_dir.mkdir()
    for tool in ("krb5-config", "mvn"):
        path = bin_dir / tool
        path.write_text(f"#!/bin/sh\necho '{tool}: not on this machine' >&2\nexit 1\n")
        path.chmod(0o755)


@pytest.mark.timeout(900)
def test_make_demo_venv_needs_no_kerberos_and_no_maven(tmp_path: Path) -> None:
    checkout = tmp_path / "kprod"
    _copy_checkout(checkout)
    _failing_tools(tmp_path / "bin")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    # The venv is made by the base interpreter this suite's venv came from, as a user's would be.
    base = Path(sys.base_prefix) / "bin" / "python3"
    done = subprocess.run(["make", "demo-venv", f"PYTHON={base}", "BYTECODE=0"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert subprocess.run([str(tmp_path / "bin" / "krb5-config")], capture_output=True).returncode == 1
    venv_python = checkout / ".venv" / "bin" / "python"
    check = subprocess.run(
        [str(venv_python), "-c",
         "import importlib.util, pyspark, confluent_kafka, spark_sink.encoder.kernels as k, spark_sink\n"
         "from spark_sink.spark import KProdDataSource\n"
         "assert importlib.util.find_spec('gssapi') is None, 'the demo venv built Kerberos'\n"
         "print(pyspark.__version__, k.__name__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr[-4000:]
    # BYTECODE=0 left out make demo's last step, `make bytecode`: the suite's own venv ran it
    # as make venv made it (its dev extra holds every package the demo extra does, at the
    # same versions), so compiling them again here (30 s of CPU) would test nothing new.
