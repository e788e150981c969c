"""kprod's import graph, read from its source (ast over spark_sink/**/*.py, imports inside
functions included): no module imports itself back through others, and the layers import
only downwards (docs/architecture.md)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "spark_sink"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module ``name`` imports, by its full name (a name imported from a package is
    its submodule when there is one; other packages' modules as they are written). kprod
    writes no relative imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: a relative import"
            assert node.module is not None
            module = node.module
            found.update(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names)
    return found - {name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles among kprod's modules (strongly connected components of more
    than one module), each as its sorted module names."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in graph[name] & graph.keys():
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component: list[str] = []
            while not component or component[-1] != name:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


# The rooms and what each may import of kprod, as Java's import-control states it: a room
# is a package (or one module); "X." allows the modules inside X, "X" its public API only
# (the package's __init__). Every kprod module belongs to exactly one room.
ROOMS: dict[str, tuple[str, ...]] = {
    "spark_sink.protocol": ("spark_sink.protocol.",),
    "spark_sink.encoder": ("spark_sink.protocol.", "spark_sink.encoder."),
    "spark_sink.client": ("spark_sink.protocol.", "spark_sink.client."),
    "spark_sink.admin": ("spark_sink.protocol.", "spark_sink.client.", "spark_sink.admin."),
    # The Schema Registry client, a client beside the admin client (HTTP, not Kafka's protocol).
    "spark_sink.registry": ("spark_sink.protocol.", "spark_sink.client.", "spark_sink.registry."),
    # The producer's transactions read its batches, sequences and settings, nothing else.
    "spark_sink.producer.transactions": (
        "spark_sink.protocol.", "spark_sink.client.", "spark_sink.producer.transactions.",
        "spark_sink.producer.batch", "spark_sink.producer.partition_sequences", "spark_sink.producer.config"),
    # (serializers.py: the registry's client for the key and value formats.)
    "spark_sink.producer": ("spark_sink.protocol.", "spark_sink.encoder.", "spark_sink.client.",
                            "spark_sink.registry", "spark_sink.producer."),
    # The Spark adapter: the public API of the rooms below (kprod's error classes are public
    # too, imported from where they are defined so that the planner workers import no producer).
    # The clock likewise: the planner workers import it without the client's network.
    "spark_sink.spark": ("spark_sink.producer", "spark_sink.admin", "spark_sink.client", "spark_sink.registry",
                         "spark_sink.protocol.error_codes", "spark_sink.client.clock", "spark_sink._exports",
                         "spark_sink.spark."),
    # kprod-perf, beside the layers: times the producer's parts one by one.
    "spark_sink.perf": ("spark_sink.protocol.", "spark_sink.encoder.", "spark_sink.producer.",
                        "spark_sink.client.clock"),
    "spark_sink._exports": (),
    "spark_sink": ("spark_sink._exports", "spark_sink.producer", "spark_sink.admin", "spark_sink.spark.source",
                   "spark_sink.protocol.error_codes"),
}
# Only these producer modules drive the transactions room.
DRIVES_TRANSACTIONS = {"spark_sink.producer", "spark_sink.producer.producer", "spark_sink.producer.sender"}
# The exactly-once modules of the Spark room, by job, each importing only those before it:
# the names (and the tasks' reports), what is kept in Kafka, the abort, the commit.
EXACTLY_ONCE = ["spark_sink.spark.exactly_once_names", "spark_sink.spark.exactly_once_state",
                "spark_sink.spark.exactly_once_abort", "spark_sink.spark.exactly_once"]


def _room(name: str) -> str:
    return max((room for room in ROOMS if name == room or name.startswith(room + ".")), key=len)


def _allowed(name: str, target: str) -> bool:
    if not target.startswith("spark_sink"):
        return True
    if target.startswith("spark_sink.producer.transactions") and _room(name) == "spark_sink.producer":
        return name in DRIVES_TRANSACTIONS
    return any(target == rule or (rule.endswith(".") and (target + ".").startswith(rule))
               for rule in ROOMS[_room(name)]) or _room(target) == _room(name)


def test_every_room_imports_only_what_it_may() -> None:
    graph = _graph()
    wrong = {name: sorted(t for t in targets if not _allowed(name, t)) for name, targets in graph.items()}
    assert {name: targets for name, targets in wrong.items() if targets} == {}
    assert "spark_sink.protocol.compression" in graph["spark_sink.encoder.columnar"]  # edges are seen


def test_the_exactly_once_jobs_import_only_the_jobs_before_them() -> None:
    graph = _graph()
    assert set(EXACTLY_ONCE) <= graph.keys()
    assert {name: sorted(t for t in graph[name] if t in EXACTLY_ONCE[i:]) for i, name in enumerate(EXACTLY_ONCE)} == {
        name: [] for name in EXACTLY_ONCE}
    assert "spark_sink.spark.exactly_once_state" in graph["spark_sink.spark.exactly_once"]  # edges are seen


def test_the_rules_catch_a_wrong_import() -> None:
    assert not _allowed("spark_sink.protocol.framing", "spark_sink.client.network")
    assert not _allowed("spark_sink.client.network", "spark_sink.producer.config")
    assert not _allowed("spark_sink.spark.writer", "spark_sink.producer.sender")  # internals, not the API
    assert not _allowed("spark_sink.producer.accumulator", "spark_sink.producer.transactions.transaction_manager")
    assert _allowed("spark_sink.spark.writer", "spark_sink.producer")
    assert _allowed("spark_sink.producer.sender", "spark_sink.producer.transactions.transaction_manager")


# The modules that import the time module: the clock (docs/architecture.md, One clock), and
# kprod-perf, which times its own runs (perf_counter, process_time) beside the layers.
READS_TIME = ["spark_sink.client.clock", "spark_sink.perf"]


def test_only_the_clock_reads_the_systems_clocks() -> None:
    """Every timeout, backoff, wait and wall-clock reading comes through client/clock.py, so
    a test clock moves them all."""
    graph = _graph()
    assert sorted(name for name, targets in graph.items() if "time" in targets) == READS_TIME


def test_protocol_and_encoder_import_no_numba_and_protocol_no_third_party_io() -> None:
    graph = _graph()
    assert {name: sorted(t for t in targets if t.startswith(("numba", "llvmlite")))
            for name, targets in graph.items() if name.startswith("spark_sink.protocol")} == {
        name: [] for name in graph if name.startswith("spark_sink.protocol")}


def test_finding_and_creating_the_data_source_imports_no_producer() -> None:
    """What Spark's lookup and create workers do, each a fresh Python process per Spark
    application: import the ``pyspark_*`` module, ask the source its name, create it with
    options. The producer, numpy and pyarrow (half a second of CPU) wait for a writer."""
    script = ("import sys, pyspark_kprod\n"
              "source = pyspark_kprod.DefaultSource\n"
              "source(options={'topic': source.name()})\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('numpy', 'pyarrow', 'pandas')\n"
              "             or m.startswith(('spark_sink.producer', 'spark_sink.encoder'))))")
    done = subprocess.run([sys.executable, "-c", script], cwd=PACKAGE.parent, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
