"""LastWill: a call that another process makes if this one dies before it is done.

The driver's commit and abort run in a Spark Python worker. A query.stop() in the middle
of a commit interrupts Spark, not the worker, which ends the commit; but a worker that
dies in the middle (the application exiting after the stop, when Spark's Python daemon
takes its workers' process group with it; the OOM killer) would leave the microbatch's
transactions open until ``transaction.timeout.ms``, holding back every read_committed
reader of their partitions, and Spark's abort fails or never comes. So the commit names,
at each step, what must happen if it dies there (abort everything, or end the commits it
has begun), and a small process of its own, started with the commit, carries that out
when the worker is gone.

The will process reads frames from a pipe: a pickled ``(function, args)`` replaces the
will, an empty frame says the worker is done. End of file before that (the worker's end
of the pipe closed by its death) runs the last will. It is started in a session of its
own, so that the daemon's end does not end it too; until the worker dies it imports
nothing of the producer.
"""

from __future__ import annotations

import logging
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Callable
from types import TracebackType
from typing import IO

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
# Will processes told that their worker is done, until they are seen to exit.
_done: list[subprocess.Popen[bytes]] = []


class LastWill:
    """``with LastWill() as will: will.set(f, *args); ...``: ``f(*args)`` runs in another
    process if this one dies inside the block (after the last ``set`` made)."""

    def __init__(self) -> None:
        _done[:] = [p for p in _done if p.poll() is None]  # reaps the wills that exited
        # The worker's import path (with Spark's zips and --py-files), for the will's imports.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self._proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                          stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as exc:
            self._gone(exc)

    def set(self, function: Callable[..., object], *args: object) -> None:
        """What to do if this process dies from now on: ``function(*args)`` (picklable)."""
        self._send(pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL))

    def close(self) -> None:
        """Done: the will process exits without doing anything."""
        self._send(b"")
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        _done.append(proc)  # not waited for: it may still be starting

    def _send(self, payload: bytes) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(_LENGTH.pack(len(payload)) + payload)
            proc.stdin.flush()
        except OSError as exc:
            self._gone(exc)

    def _gone(self, exc: OSError) -> None:
        # It could not start or died: the commit goes on without it (what it guards
        # against is then what a dead driver leaves: open until the timeout).
        log.warning("kprod: the commit's last-will process is gone (%s); if this worker is killed before "
                    "the commit ends, its transactions stay open until transaction.timeout.ms", exc)
        self._proc = None

    def __enter__(self) -> LastWill:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _read_frame(stream: IO[bytes]) -> bytes | None:
    """The next frame, or None at end of file (the worker died)."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    body = stream.read(length)
    return body if len(body) == length else None


def main() -> int:
    """The will process: wait for the frames; on end of file, run the last will."""
    will: bytes | None = None
    while (frame := _read_frame(sys.stdin.buffer)) is not None:
        if not frame:
            return 0
        will = frame
    if will is None:
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    function, args = pickle.loads(will)
    log.warning("kprod: the driver's worker died in the middle of a commit or abort (the application exited, "
                "or the OOM killer?); "
                "doing what it left to do: %s", function.__qualname__)
    function(*args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
