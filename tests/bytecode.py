"""Bytecode inside the zips that Spark puts first on its Python workers' path.

Spark starts its Python daemons and workers with ``$SPARK_HOME/python/lib/pyspark.zip``
(and py4j's zip) ahead of site-packages, and Python cannot write bytecode into a zip: each
daemon compiled pyspark from source, 0.8 s of CPU against 0.13 s from bytecode, and a run
of the suite starts about a hundred of them. ``python -m tests.bytecode`` (``make test``
runs it) adds each module's bytecode beside its source in the venv's zips, as zipimport
reads it (``name.pyc`` next to ``name.py``), unchecked: the zips do not change after pip
installed them. Only the suite's venv: the sources stay as they were.

It also writes pytest's own cache of the test modules as rewritten for its assertions
(``__pycache__/*-pytest-*.pyc``). pytest reads that cache whatever the environment says,
but writes it only where bytecode may be written: with ``PYTHONDONTWRITEBYTECODE`` set, as
on the CI machine, each of the suite's xdist workers parsed, rewrote and compiled every
test module again: three workers' collection took 22.6 CPU s, 13.4 s with the cache,
which takes 2.7 s to write here.
"""

from __future__ import annotations

import ast
import importlib.util
import marshal
import shutil
import tempfile
import zipfile
from pathlib import Path


def _unchecked_pyc(source: bytes, filename: str) -> bytes:
    """A pyc whose header says "hash-based, do not check the source" (PEP 552)."""
    code = compile(source, filename, "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little")
    return header + importlib.util.source_hash(source) + marshal.dumps(code)


def add_bytecode(archive: Path) -> bool:
    """Rewrite ``archive`` with a .pyc beside each .py; False if it already has them."""
    with zipfile.ZipFile(archive) as old:
        names = old.namelist()
        if any(name.endswith(".pyc") for name in names):
            return False
        with tempfile.NamedTemporaryFile(dir=archive.parent, suffix=".zip", delete=False) as tmp:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as new:
                for info in old.infolist():
                    data = old.read(info)
                    new.writestr(info, data)
                    if info.filename.endswith(".py"):
                        pyc = zipfile.ZipInfo(info.filename + "c", info.date_time)
                        new.writestr(pyc, _unchecked_pyc(data, str(archive / info.filename)))
    shutil.copymode(archive, tmp.name)
    shutil.move(tmp.name, archive)
    return True


TESTS = Path(__file__).resolve().parent


def rewritten_modules(tests: Path = TESTS) -> list[Path]:
    """The files pytest rewrites in a run of the suite: the test modules and conftests,
    and the plugins the root conftest names in ``pytest_plugins``."""
    files = sorted({*tests.rglob("test_*.py"), *tests.rglob("conftest.py")})
    for node in ast.parse((tests / "conftest.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
            plugins = ast.literal_eval(node.value)
            files += [tests.parent.joinpath(*name.split(".")).with_suffix(".py") for name in plugins]
    return files


def write_rewritten(files: list[Path]) -> None:
    """Write pytest's cached rewrite of each file, as pytest names and checks it (the
    source's time and size in its header). pytest's own functions, private ones: pinned
    below 9.2 in pyproject.toml; should they move, the workers rewrite as before."""
    try:
        from _pytest.assertion.rewrite import PYC_TAIL, _rewrite_test, _write_pyc_fp, get_cache_dir
    except ImportError:
        return
    for source in files:
        stat, code = _rewrite_test(source, None)  # type: ignore[arg-type]  # no config: the defaults
        cache = get_cache_dir(source)
        cache.mkdir(exist_ok=True)
        pyc = cache / (source.name[:-3] + PYC_TAIL)
        # Written aside and renamed, as pytest does: a reader never sees half a file.
        with tempfile.NamedTemporaryFile(dir=cache, delete=False) as out:
            _write_pyc_fp(out, stat, code)
        Path(out.name).replace(pyc)


def main() -> None:
    from pyspark.find_spark_home import _find_spark_home

    write_rewritten(rewritten_modules())
    for archive in sorted(Path(_find_spark_home(), "python", "lib").glob("*.zip")):
        if add_bytecode(archive):
            print(f"tests/bytecode.py: bytecode added to {archive}")


if __name__ == "__main__":
    main()
