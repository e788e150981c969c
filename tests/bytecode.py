"""Bytecode inside the zips that Spark puts first on its Python workers' path.

Spark starts its Python daemons and workers with ``$SPARK_HOME/python/lib/pyspark.zip``
(and py4j's zip) ahead of site-packages, and Python cannot write bytecode into a zip: each
daemon compiled pyspark from source, 0.8 s of CPU against 0.13 s from bytecode, and a run
of the suite starts about a hundred of them. ``python -m tests.bytecode`` (``make venv``
runs it) adds each module's bytecode beside its source in the venv's zips, as zipimport
reads it (``name.pyc`` next to ``name.py``), unchecked: the zips do not change after pip
installed them. Only the suite's venv: the sources stay as they were.
"""

from __future__ import annotations

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


def main() -> None:
    from pyspark.find_spark_home import _find_spark_home

    for archive in sorted(Path(_find_spark_home(), "python", "lib").glob("*.zip")):
        if add_bytecode(archive):
            print(f"tests/bytecode.py: bytecode added to {archive}")


if __name__ == "__main__":
    main()
