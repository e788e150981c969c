"""A pytest plugin, opt-in, that writes each test's CPU time as JSON lines: what the suite
spends its CPU on (on the 2-core CI machine the suite is CPU-bound, so that, not wall
time, is what to cut).

    PYTEST_ADDOPTS="-p tests.cpu_profile" make test          # writes suite-cpu.jsonl
    python -m tests.cpu_profile suite-cpu.jsonl               # the costliest files and tests

A test's CPU is that of its worker's process tree from its setup to its teardown: the
worker, its live descendants (its Kafka nodes and SparkSession included) and the
children they reaped. Processes that outlive their parent (a killed job's JVM) are not
counted, so the figures are lower bounds.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time
from collections.abc import Iterator

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
OUT = os.environ.get("KPROD_CPU_PROFILE", "suite-cpu.jsonl")


def _stat(pid: str) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants, with what each has reaped."""
    children: dict[int, list[list[str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = _stat(entry)
            except OSError:
                continue  # gone meanwhile
            children.setdefault(int(fields[1]), []).append([entry, *fields])
    total = sum(int(x) for x in _stat(str(pid))[11:15])  # utime, stime, cutime, cstime
    stack = [pid]
    while stack:
        for entry, *fields in children.get(stack.pop(), []):
            total += sum(int(x) for x in fields[11:15])
            stack.append(int(entry))
    return total / _TICK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before, started = tree_cpu(os.getpid()), time.monotonic()
    yield
    with open(OUT, "a") as out:
        out.write(json.dumps({"test": item.nodeid, "cpu": round(tree_cpu(os.getpid()) - before, 2),
                              "wall": round(time.monotonic() - started, 2),
                              "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\n")


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    by_file: collections.Counter[str] = collections.Counter()
    for row in rows:
        by_file[row["test"].split("::")[0]] += row["cpu"]
    print(f"{sum(r['cpu'] for r in rows):.0f} s of CPU in {len(rows)} tests")
    for name, cpu in by_file.most_common(15):
        print(f"{cpu:7.1f}  {name}")
    for row in sorted(rows, key=lambda r: -r["cpu"])[:15]:
        print(f"{row['cpu']:7.1f}  {row['wall']:6.1f} s wall  {row['test']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else OUT)
