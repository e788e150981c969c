"""What exactly-once writes keep in Kafka, as values: a task's marker, the directory record
and the registry entry, each with one encode and one decode.

They are offset metadata (strings) of consumer groups, read back by later runs of the
query, possibly by a later kprod: each decode reads every format an earlier release wrote
(tests/spark/test_exactly_once_state.py holds their bytes) and refuses a newer one, so
that a kprod never mistakes a format it does not know for "no marker" (a duplicate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar


class StateFormatError(RuntimeError):
    """kprod's state in Kafka was written in a newer format than this kprod reads."""


def _object(text: str | None) -> dict[str, object] | None:
    """The JSON object ``text`` holds (None: not one, so not kprod's)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _check_version(value: dict[str, object], kind: str, known: int, text: str) -> bool:
    """Whether ``value`` carries a version this kprod reads (no version: an earlier
    release's). A newer one is StateFormatError; a version that is not a number, not ours."""
    version = _int(value.get("v", 0))
    if version is None:
        return False
    if version > known:
        raise StateFormatError(f"kprod's {kind} {text!r} was written by a newer kprod (format {version}; this one "
                               f"reads up to {known}): run the query with that kprod or a later one")
    return True


def _int(value: object) -> int | None:
    """``value`` if it is a JSON integer (not a boolean), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _encode(version: int, fields: dict[str, object]) -> str:
    return json.dumps({"v": version, **fields}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Marker:
    """What the driver commits with task ``n``'s transaction as the offset metadata of
    group ``<prefix>-n`` (the offset is the microbatch): the query, the run's task count,
    how many of its tasks had a transaction, and the task's rows digest.

    Formats: 1 (kprod's first exactly-once) ``query``, ``tasks``; 2 adds ``txns``; 3 adds
    ``rows`` where the task reported one; 4 (now) the version ``v``."""

    VERSION: ClassVar[int] = 4

    query: str | None
    tasks: int
    txns: int | None = None  # None: written before format 2
    rows: str | None = None  # None: no digest (format 1-2, or kprod.replayMatch=tasks)

    def encode(self) -> str:
        fields: dict[str, object] = {"query": self.query, "tasks": self.tasks}
        if self.txns is not None:
            fields["txns"] = self.txns
        if self.rows is not None:
            fields["rows"] = self.rows
        return _encode(self.VERSION, fields)

    @classmethod
    def decode(cls, text: str | None) -> Marker | None:
        """The marker ``text`` holds; None if it is not one of kprod's."""
        value = _object(text)
        if value is None or not _check_version(value, "marker", cls.VERSION, str(text)):
            return None
        query, tasks, txns, rows = _str(value.get("query")), _int(value.get("tasks")), _int(value.get("txns")), \
            _str(value.get("rows"))
        if tasks is None or (query, txns, rows) != (value.get("query"), value.get("txns"), value.get("rows")):
            return None  # a field missing or of another type
        return cls(query, tasks, txns, rows)


@dataclass(frozen=True, slots=True)
class DirectoryRecord:
    """What the driver commits to group ``<prefix>-dir`` before it ends a microbatch's
    transactions (the offset is the microbatch): the query, how many task ids any run has
    used, when the markers began to be written (the driver's wall clock, ms) and, once every
    EndTxn succeeded, that the commit ended whole.

    Formats: 1 ``query``, ``ids``; 2 adds ``at``; 3 adds ``done`` once ended; 4 (now) the
    version ``v``."""

    VERSION: ClassVar[int] = 4

    query: str | None
    ids: int
    at: int | None = None  # None: written before format 2
    done: bool = False

    def encode(self) -> str:
        fields: dict[str, object] = {"query": self.query, "ids": self.ids}
        if self.at is not None:
            fields["at"] = self.at
        if self.done:
            fields["done"] = True
        return _encode(self.VERSION, fields)

    @classmethod
    def decode(cls, text: str | None) -> DirectoryRecord | None:
        """The record ``text`` holds; None if it is not one of kprod's."""
        value = _object(text)
        if value is None or not _check_version(value, "directory record", cls.VERSION, str(text)):
            return None
        query, ids = _str(value.get("query")), _int(value.get("ids"))
        if ids is None or query != value.get("query"):
            return None
        return cls(query, ids, _int(value.get("at")), value.get("done") is True)


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """What a task records in group ``kprod-<hash of the options>-reg`` before its first
    transaction under a prefix derived from the query id: the prefix, for the driver's
    abort when no task reported.

    Format 1, the prefix as it is (offset 0), read by every kprod since the registry began.
    A prefix derived from a query id is ``kprod-`` and hex digits, so a later format can be
    told from it by a leading ``{``."""

    VERSION: ClassVar[int] = 1
    OFFSET: ClassVar[int] = 0

    prefix: str

    def __post_init__(self) -> None:
        if not self.prefix or self.prefix.startswith("{"):
            raise ValueError(f"not a prefix the registry can hold: {self.prefix!r}")

    def encode(self) -> str:
        return self.prefix

    @classmethod
    def decode(cls, text: str | None) -> RegistryEntry | None:
        """The entry ``text`` holds; None if there is none."""
        if not text:
            return None
        if text.startswith("{"):
            raise StateFormatError(f"kprod's registry entry {text!r} was written by a newer kprod: run the query "
                                   "with that kprod or a later one")
        return cls(text)
