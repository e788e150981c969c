"""The suite's JVM harness (tests/jvms.py): one Spark home per machine, made of links to
the venv's jars however many runs make it at once, and the environment that sends the
suite's Spark JVMs to it and a user's install to its own."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark

from tests.brokers import subprocess_env
from tests.jvms import _publish, spark_home

ROOT = Path(__file__).resolve().parent.parent


def test_runs_at_once_publish_one_home_of_links_to_the_venvs_jars(tmp_path: Path) -> None:
    # Separate processes with their own cache, as concurrent clones on one machine.
    env = {**os.environ, "KPROD_CACHE": str(tmp_path)}
    runs = [subprocess.Popen([sys.executable, "-m", "tests.jvms", "home"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [run.communicate(timeout=240) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err for _, err in outputs]
    homes = {out.strip().rsplit(" ", 1)[-1] for out, _ in outputs}
    assert len(homes) == 1, homes
    home = Path(homes.pop())
    assert [path.name for path in (tmp_path / "spark").iterdir()] == [home.name]  # nothing partial left
    venv = Path(pyspark.__file__).parent
    jars = [jar for jar in (venv / "jars").rglob("*") if jar.is_file()]
    assert jars
    for jar in jars:
        linked, original = (home / jar.relative_to(venv)).stat(), jar.stat()
        # What the class archive checks: the path (the home's), the size and the time.
        assert (linked.st_size, linked.st_mtime_ns) == (original.st_size, original.st_mtime_ns), jar.name
        if linked.st_dev == original.st_dev:
            assert linked.st_ino == original.st_ino, f"{jar.name}: copied, not linked"
    assert (home / "bin" / "spark-submit").is_file()
    for archive in (home / "python" / "lib").glob("*.zip"):
        with zipfile.ZipFile(archive) as workers_zip:
            assert any(name.endswith(".pyc") for name in workers_zip.namelist()), archive.name


def test_a_published_file_is_never_replaced(tmp_path: Path) -> None:
    final = tmp_path / "archive.jsa"
    for content in ("first", "second"):
        partial = tmp_path / f"archive.jsa.{content}.partial"
        partial.write_text(content)
        _publish(partial, final)
        assert not partial.exists()
    assert final.read_text() == "first"


def test_the_suites_children_run_the_machines_home_and_a_users_python_its_own() -> None:
    assert subprocess_env()["SPARK_HOME"] == str(spark_home())
    assert subprocess_env()["PYSPARK_DRIVER_PYTHON"] == sys.executable
    users = subprocess_env("/elsewhere/bin/python")
    assert "SPARK_HOME" not in users and "PYTHONPATH" not in users
    assert users["PYSPARK_PYTHON"] == users["PYSPARK_DRIVER_PYTHON"] == "/elsewhere/bin/python"
