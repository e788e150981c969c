"""Services that a group of tests shares (a three-node cluster, a secured broker), started
on a worker's first test that uses one and stopped as soon as its next test does not.

As session fixtures they would run until the session ends: an idle Kafka node still costs
about 1.4 s of CPU a minute (three nodes with replication, 4.4 s), on a suite that is
CPU-bound on two cores. The tests that share one run one after another on one worker
(tests/conftest.py groups them), so each starts once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import TypeVar

T = TypeVar("T")


class Services:
    """Running services by fixture name, each with the stack that stops it."""

    def __init__(self) -> None:
        self._running: dict[str, tuple[contextlib.ExitStack, object]] = {}

    def get(self, name: str, start: Callable[[contextlib.ExitStack], T]) -> T:
        """The running service ``name``, started with ``start(stack)`` (which registers its
        own stopping on the stack) if it is not running."""
        if name not in self._running:
            with contextlib.ExitStack() as stack:
                value = start(stack)
                self._running[name] = (stack.pop_all(), value)
        return self._running[name][1]  # type: ignore[return-value]

    def stop_unneeded(self, needed: Collection[str]) -> None:
        """Stop every running service whose name is not in ``needed``."""
        for name in [name for name in self._running if name not in needed]:
            stack, _ = self._running.pop(name)
            stack.close()


SERVICES = Services()
