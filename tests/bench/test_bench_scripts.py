"""The scripts in bench/: each imports and answers --help; bench_partitions.py and
bench_avro.py run their --quick forms against the suite's Kafka node (and registry). No
figure is asserted: they are measurements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kprod_broker import KafkaCluster
from tests.brokers import subprocess_env
from tests.script_help import checked_help, help_text, help_texts, unknown_options

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))


def run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH / name), *args], env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)


def test_every_bench_script_is_listed() -> None:
    assert "bench_partitions.py" in SCRIPTS and len(SCRIPTS) >= 6, SCRIPTS


@pytest.fixture(scope="module")
def helps() -> dict[str, tuple[int, str, str]]:
    """Every script's --help, from one process: each would import pyarrow and kprod again."""
    return help_texts([BENCH / script for script in SCRIPTS])


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_names_only_options_the_script_has(helps: dict[str, tuple[int, str, str]], script: str) -> None:
    text = checked_help(helps[script])
    assert unknown_options(text) == set(), text


def test_kprod_perf_help_says_how_to_install_its_peers_from_a_clone() -> None:
    """No package index serves kprod: the help names the install that works from a clone."""
    text = help_text("spark_sink.perf")
    assert unknown_options(text) == set(), text
    assert "kprod[bench]" not in text and "pip install -e '.[bench]'" in " ".join(text.split()), text


def test_partitions_refuses_a_bad_shape_naming_it() -> None:
    done = run_script("bench_partitions.py", "--shapes", "8,16y4", timeout=60)
    assert done.returncode == 2 and "shape '16y4'" in done.stderr, done.stderr


# The quick runs start a Spark session and a Kafka run of their own: make bench runs them
# before the benchmarks (the suite checks the scripts' options with --help).
@pytest.mark.bench
@pytest.mark.timeout(600)  # a Spark session and 6 writes: minutes on a loaded 2-core machine
def test_partitions_quick_run(kafka: KafkaCluster) -> None:
    """The suite's form: small, one round, the Spark sink left out (its jars are fetched
    once, by the full benchmark); every write is checked by its topics' end offsets."""
    done = run_script("bench_partitions.py", "--quick", "--skip-spark-kafka", "--bootstrap-servers", kafka.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "checked 6 writes" in done.stderr, done.stderr[-3000:]  # each sink: an untimed write, a timed one
    assert "2x2 kprod" in " ".join(done.stdout.split()), done.stdout


@pytest.mark.bench
@pytest.mark.timeout(600)  # a Spark session and 8 writes, one per row in Python: minutes on a loaded machine
def test_avro_quick_run(kafka: KafkaCluster, schema_registry: str) -> None:
    """Small, one round, every sink: each timed write read back, its records counted and
    its Avro bodies the same as Spark's to_avro wrote."""
    done = run_script("bench_avro.py", "--quick", "--bootstrap-servers", kafka.bootstrap, "--registry-url",
                      schema_registry, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "read back 3 timed writes" in done.stderr, done.stderr[-3000:]
    assert "kprod vs confluent-kafka per row" in done.stdout, done.stdout


@pytest.mark.timeout(300)
def test_profile_partitions_quick_run(kafka: KafkaCluster) -> None:
    """In one process: an untimed write, a timed round of its CPU figures, the sending
    thread's profile."""
    done = run_script("profile_partitions.py", "--partitions", "4", "--rows", "20000", "--rounds", "1",
                      "--cprofile", "5", "--bootstrap-servers", kafka.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "round 1:" in done.stdout and "Produce requests" in done.stdout, done.stdout
    assert "cProfile, the sending thread" in done.stdout, done.stdout


# A parent killed while its child burns on: the child is reparented to init, so its CPU
# shows in no process of the tree by the end. Reading the tree only before and after a
# write missed such processes, and bench_partitions' rounds read negative CPU (issue 55 (8)).
_ORPHAN = """
import subprocess, sys, time
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from bench_partitions import TreeCpu
burn = "import time; end = time.process_time() + 0.8\\nwhile time.process_time() < end: pass"
with TreeCpu(subprocess.os.getpid()) as tree:
    parent = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{burn}' & echo $!; exec sleep 60"],
                              stdout=subprocess.PIPE, text=True)
    orphan = int(parent.stdout.readline())
    while str(orphan) not in tree._members:  # seen while its parent lives
        time.sleep(0.05)
    parent.kill(); parent.wait()
    def running():  # a zombie until init reaps it
        try:
            return open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    while running():
        time.sleep(0.05)
print(tree.seconds)
"""


def test_tree_cpu_counts_a_process_whose_parent_was_killed() -> None:
    done = subprocess.run([sys.executable, "-c", _ORPHAN, str(BENCH), str(BENCH.parent / "jobs")],
                          env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) >= 0.6, done.stdout
