"""The scripts in bench/: each imports and answers --help; bench_partitions.py runs its
--quick form against the suite's Kafka node. No figure is asserted: they are measurements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.brokers import subprocess_env
from tests.script_help import help_text, unknown_options

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


def run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / name), *args], env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_every_bench_script_is_listed():
    assert "bench_partitions.py" in SCRIPTS and len(SCRIPTS) >= 6, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_names_only_options_the_script_has(script: str) -> None:
    text = help_text(BENCH / script)
    assert unknown_options(text) == set(), text


def test_kprod_perf_help_says_how_to_install_its_peers_from_a_clone() -> None:
    """No package index serves kprod: the help names the install that works from a clone."""
    text = help_text("spark_sink.perf")
    assert unknown_options(text) == set(), text
    assert "kprod[bench]" not in text and "pip install -e '.[bench]'" in " ".join(text.split()), text


def test_partitions_refuses_a_bad_shape_naming_it():
    done = run_script("bench_partitions.py", "--shapes", "8,16y4", timeout=60)
    assert done.returncode == 2 and "shape '16y4'" in done.stderr, done.stderr


@pytest.mark.timeout(600)  # a Spark session and 6 writes: minutes on a loaded 2-core machine
def test_partitions_quick_run(kafka):
    """The suite's form: small, one round, the Spark sink left out (its jars are fetched
    once, by the full benchmark); every write is checked by its topics' end offsets."""
    done = run_script("bench_partitions.py", "--quick", "--skip-spark-kafka", "--bootstrap-servers", kafka.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "checked 6 writes" in done.stderr, done.stderr[-3000:]  # each sink: an untimed write, a timed one
    assert "2x2 kprod" in " ".join(done.stdout.split()), done.stdout
