"""Every process a pytest process starts ends with it, however it ends.

The fixtures stop their Kafka nodes, registries and jobs in their teardowns, but an
interrupted run skips them: pytest-timeout's thread method and a lost xdist worker end
the process with ``os._exit``, a SIGKILL ends it at once, and the JVMs run in sessions of
their own (a Ctrl-C in the terminal is not theirs), so they went on running, ports,
memory and CPU taken, until someone killed them by hand.

``start()`` marks the process's environment with a token of its own, which every child
inherits (a JVM, its Python workers, a job's own Kafka node), and starts a reaper: a
small process that waits for the end of a pipe only this process holds, which closes
whatever way the process ends, then SIGKILLs every process still carrying the token.
Under xdist the controller and each worker have their own token and reaper; a worker
carries the controller's, so it too ends with the controller.
"""

from __future__ import annotations

import os
import sys
import uuid

VARIABLE = "KPROD_TEST_RUN"

# Reads its stdin to the end (this process's end), then kills the marked processes; a
# few rounds, for a process that one of them started meanwhile.
_REAPER = """
import os, signal, sys
sys.stdin.buffer.read()
mark = sys.argv[1].encode()
for _ in range(3):
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if mark in f.read().split(b"\\0"):
                        os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass
"""

_write_end: list[int] = []  # the pipe's: open for the process's life, never inherited


def pytest_configure() -> None:
    """As a pytest plugin (tests/conftest.py names it): in the controller and in each
    xdist worker, before any fixture starts a process."""
    start()


def start() -> str:
    """Mark this process's future children and start their reaper (once); the token."""
    if _write_end:
        return os.environ[VARIABLE]
    token = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    read, write = os.pipe()
    # Without the mark (a worker's reaper outlives its controller's), in a session of its
    # own (a Ctrl-C in the terminal ends the run, not its reaper); a process, not a Popen,
    # that is never waited for.
    env = {name: value for name, value in os.environ.items() if name != VARIABLE}
    try:
        os.posix_spawn(sys.executable, [sys.executable, "-c", _REAPER, f"{VARIABLE}={token}"], env,
                       file_actions=[(os.POSIX_SPAWN_DUP2, read, 0)], setsid=True)
    finally:
        os.close(read)
    _write_end.append(write)
    os.environ[VARIABLE] = token
    return token
