"""kprod installed the ways users install it, into fresh virtualenvs, for tests that must
not see this checkout: from its wheel, editable, or not at all (its dependencies only,
for executors that get kprod from what a job ships); and kprod zipped for --py-files."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _building_in_checkout() -> Iterator[None]:
    """Held while pip builds from this checkout: its builds write build/ and *.egg-info
    in it, so two at once (on two xdist workers) would trip over each other."""
    name = hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"kprod-build-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build_wheel(dist: Path) -> Path:
    """kprod's wheel, built as pip builds it (with its compiled encoder)."""
    with _building_in_checkout():
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
                       check=True, capture_output=True)
    (wheel,) = dist.glob("kprod-*.whl")
    return wheel


def venv_with_kprod(where: Path, source: str | Path | None) -> Path:
    """A new venv that sees this venv's dependencies but gets kprod only from ``source``:
    a wheel file, ``"editable"`` for ``pip install -e`` of this checkout, or None for no
    kprod at all. Returns its python.

    The dependencies come through a path line, whose own .pth files (this checkout's
    editable install among them) Python does not read.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "kprod_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if source is None:
        return python
    target = ["-e", str(ROOT)] if source == "editable" else [str(source)]
    # --ignore-installed: pip sees this venv's kprod (its metadata, through the path line)
    # and would skip the install as already satisfied, leaving the new venv without kprod.
    with _building_in_checkout() if source == "editable" else contextlib.nullcontext():
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--ignore-installed", *target], check=True, capture_output=True)
    return python


def kprod_zip(where: Path) -> Path:
    """kprod's own code (the spark_sink package and the pyspark_kprod shim) as a zip for
    ``spark-submit --py-files``: what ``zip -r kprod.zip spark_sink pyspark_kprod.py``
    in the checkout makes, without caches."""
    import zipfile

    with zipfile.ZipFile(where, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(ROOT / "pyspark_kprod.py", "pyspark_kprod.py")
        for source in sorted((ROOT / "spark_sink").rglob("*")):
            if source.is_file() and "__pycache__" not in source.parts:
                archive.write(source, source.relative_to(ROOT))
    return where
