"""Spark's Python workers as Linux sees them (/proc): which process runs kprod's writer
for a task, and how much memory it holds. Linux only, like the tests that use it."""

from __future__ import annotations

import contextlib
import os
import re
import threading
from pathlib import Path

_PROC = Path("/proc")


def _status(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (_PROC / str(pid) / "status").read_text()
    return ""


def _field(status: str, name: str) -> str | None:
    found = re.search(rf"^{name}:\s*(.*)$", status, re.MULTILINE)
    return found.group(1).strip() if found else None


def parent(pid: int) -> int | None:
    ppid = _field(_status(pid), "PPid")
    return int(ppid) if ppid else None


def descendants(root: int) -> list[int]:
    """Every live process under ``root`` (children, their children, ...), zombies left out."""
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            status = _status(int(entry.name))
            ppid = _field(status, "PPid")
            if ppid and not (_field(status, "State") or "").startswith("Z"):
                children.setdefault(int(ppid), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_bytes(pid: int) -> int | None:
    """Resident memory (VmRSS) now, or None once the process is gone."""
    value = _field(_status(pid), "VmRSS")  # "123456 kB"
    return int(value.split()[0]) * 1024 if value else None


def loads_kprod(pid: int) -> bool:
    """Whether the process has kprod's producer loaded: it maps the crc32c extension that
    only kprod's record encoder imports (a Python module itself leaves no trace in maps)."""
    with contextlib.suppress(OSError):
        return "crc32c" in (_PROC / str(pid) / "maps").read_text()
    return False


def connected_to(pids: list[int], port: int) -> list[int]:
    """Those of ``pids`` holding an established TCP connection to ``port`` on some host."""
    inodes = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (_PROC / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[3] == "01":  # 01: ESTABLISHED
                    inodes.add(fields[9])
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            links = {os.readlink(fd) for fd in (_PROC / str(pid) / "fd").iterdir()}
            if any(f"socket:[{inode}]" in links for inode in inodes):
                found.append(pid)
    return found


class RssSampler:
    """While running (a context manager), samples every ``every_s`` seconds the RSS of the
    processes under ``root`` that run kprod's writer with a connection to ``port``:
    ``first`` is each one's RSS when first seen connected (its imports done, its producer
    made), ``peak`` the most it held from then on."""

    def __init__(self, root: int, port: int, every_s: float = 0.05) -> None:
        self.root = root
        self.port = port
        self.every_s = every_s
        self.first: dict[int, int] = {}
        self.peak: dict[int, int] = {}
        self.at_start: frozenset[int] = frozenset()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def sample(self) -> None:
        pids = descendants(self.root)
        new = [pid for pid in pids if pid not in self.first and loads_kprod(pid)]
        for pid in [*(p for p in pids if p in self.first), *connected_to(new, self.port)]:
            rss = rss_bytes(pid)
            if rss is not None:
                self.first.setdefault(pid, rss)
                self.peak[pid] = max(self.peak.get(pid, 0), rss)

    def growth(self, from_the_start: bool = False) -> dict[int, int]:
        """Bytes each writer grew by, from its first sample to its peak; with
        ``from_the_start`` only the writers already connected when sampling began (a
        worker Spark starts for a task is first seen once it has read its first batch)."""
        return {pid: self.peak[pid] - self.first[pid] for pid in self.first
                if not from_the_start or pid in self.at_start}

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> RssSampler:
        self.sample()
        self.at_start = frozenset(self.first)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
