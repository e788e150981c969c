"""What exactly-once writes keep in Kafka: a task's marker, the directory record and the
registry entry, as values with one encode and one decode each; the registry entry written
by a task, and the directory and markers read back by the driver's commit (which writes
them) and what they say was committed before.

They are offset metadata (strings) of consumer groups, read back by later runs of the
query, possibly by a later kprod: each decode reads every format an earlier release wrote
(tests/spark/test_exactly_once_state.py holds their bytes) and refuses a newer one, so
that a kprod never mistakes a format it does not know for "no marker" (a duplicate).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from spark_sink.admin import AdminClient
from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.spark.exactly_once_names import MARKER_PARTITION, directory_group, registry_group, transactional_id
from spark_sink.spark.options import ExactlyOnce

log = logging.getLogger(__name__)
# A replay later than the markers' retention less this (the driver's clock against the
# brokers') may have lost markers.
_CLOCK_MARGIN_MS = 3600 * 1000


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


# -- the registry: written by a task -------------------------------------------------

# When this process last recorded each (registry group, prefix) pair (its monotonic clock, s).
_registered: dict[tuple[str, str], float] = {}
# Kafka drops a group's offsets offsets.retention.minutes (7 days by default) after their
# last commit: a worker that lives longer records its prefix again well before that.
REGISTER_AGAIN_AFTER_S = 24 * 3600.0


def register_prefix(config: Mapping[str, str], eo: ExactlyOnce, prefix: str, clock: Time = SYSTEM_TIME) -> None:
    """Before a task's first transaction under a prefix derived from the query id, record
    the prefix where the driver's abort can find it (once per Python worker and day)."""
    key = (eo.options_key, prefix)
    last = _registered.get(key)
    if eo.prefix is not None or (last is not None and clock() / 1000 - last < REGISTER_AGAIN_AFTER_S):
        return
    with AdminClient(dict(config)) as admin:
        admin.commit_offsets(registry_group(eo.options_key),
                             {(eo.marker_topic, MARKER_PARTITION): (RegistryEntry.OFFSET, RegistryEntry(prefix).encode())})
    _registered[key] = clock() / 1000


# -- the directory and markers: read back by the driver's commit ----------------------


class PartlyCommittedError(RuntimeError):
    """A replayed microbatch was committed in part by a run that split it differently."""


def read_directory(admin: AdminClient, prefix: str, directory: tuple[str, int], query: str | None
                   ) -> tuple[int, int, DirectoryRecord | None]:
    """(the last microbatch whose commit started, the task ids any run has used, the whole
    record) as the directory holds them; (-1, 0, None) if it records nothing of this query."""
    group = directory_group(prefix)
    offset, metadata = admin.committed_offsets({group: [directory]})[group].get(directory, (-1, None))
    record = DirectoryRecord.decode(metadata)
    if offset < 0 or record is None or record.query != query:
        return -1, 0, None
    return offset, record.ids, record


def committed_before(markers: Mapping[int, tuple[int, Marker]], batch_id: int, *, tasks: int,
                     rows: Mapping[int, str]) -> set[int]:
    """The partitions of this microbatch whose rows an earlier run already committed: all of
    them if an earlier run split it otherwise and committed it whole.

    A marker stands for this run's task of the same number when the earlier run had as
    many tasks and that task's rows digest equals this one's (under kprod.replayMatch=tasks,
    where tasks report no digest, the count alone; a marker without a digest, from a run
    under tasks or an older kprod, matches no task with one). A marker of a later
    microbatch means this one was committed before it."""
    if not markers:
        return set()

    def same_task(p: int, offset: int, marker: Marker) -> bool:
        if marker.tasks != tasks:
            return False
        mine = rows.get(p)
        return offset > batch_id or mine is None or marker.rows == mine

    if all(same_task(p, offset, m) for p, (offset, m) in markers.items()):
        return set(markers)
    # Split otherwise: whole if every transaction of some earlier split has its marker.
    by_split: dict[int, list[Marker]] = {}
    for _, m in markers.values():
        by_split.setdefault(m.tasks, []).append(m)

    def transactions(split: int, of_split: list[Marker]) -> int:
        return max((m.txns for m in of_split if m.txns is not None), default=split)

    for earlier, of_earlier in by_split.items():
        if len(of_earlier) >= transactions(earlier, of_earlier):
            log.warning("kprod microbatch %d was committed whole by an earlier run (%s tasks) that split it "
                        "otherwise; this run (%d tasks) writes nothing", batch_id, earlier, tasks)
            return set(range(tasks))
    earlier, of_earlier = max(by_split.items(), key=lambda item: len(item[1]))
    expected = transactions(earlier, of_earlier)
    same_count = earlier == tasks
    how = (f"into {earlier} tasks, as this run does, but with other rows in them" if same_count
           else f"into {earlier} tasks; this run has {tasks}")
    unstable = ("; if the query's rows are not the same in every run (values computed with uuid(), rand() or "
                "current_timestamp()), or the earlier run wrote markers without rows digests (under "
                "kprod.replayMatch=tasks, or an older kprod) and the partitioning is unchanged, restart it with "
                "option kprod.replayMatch=tasks" if same_count else "")
    raise PartlyCommittedError(
        f"microbatch {batch_id} was committed in part ({len(of_earlier)} of {expected} transactions) by an earlier "
        f"run that split it {how}. Restart the query with the same partitioning (spark.sql.shuffle.partitions, "
        f"the source's partitions, the cores, repartition()) so that each task holds the rows it held, or the "
        f"rows of the committed tasks would be written twice{unstable}")


def markers_may_have_expired(admin: AdminClient, prefix: str, record: DirectoryRecord, clock: Time) -> bool:
    """Whether Kafka may have dropped the markers of the microbatch whose commit the
    directory ``record`` says started: its markers were committed after it, and each is
    kept offsets.retention.minutes (the cluster's, read from a broker) after its commit. An
    hour of margin covers the driver's clock against the brokers'."""
    at = record.at
    if at is None:
        return False  # written by an older kprod: not known
    minutes = admin.coordinator_config(transactional_id(prefix, 0), ["offsets.retention.minutes"]).get(
        "offsets.retention.minutes")
    retention_ms = int(minutes) * 60_000 if minutes else 7 * 24 * 3600 * 1000
    return clock.wall_ms() - at > retention_ms - _CLOCK_MARGIN_MS


def read_markers(admin: AdminClient, prefix: str, eo: ExactlyOnce, partitions: range, batch_id: int,
                 query: str | None) -> dict[int, tuple[int, Marker]]:
    """Per partition, the offset and marker of an earlier commit of this microbatch or a
    later one (same query)."""
    tp = (eo.marker_topic, MARKER_PARTITION)
    offsets = admin.committed_offsets({transactional_id(prefix, p): [tp] for p in partitions})
    found = {}
    for p in partitions:
        offset, metadata = offsets[transactional_id(prefix, p)].get(tp, (-1, None))
        marker = Marker.decode(metadata) if offset >= batch_id else None
        if marker is not None and marker.query == query:
            found[p] = (offset, marker)
    return found
