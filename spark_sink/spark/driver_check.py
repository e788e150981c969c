"""The driver's check before any task runs, and kprod's errors raised from one frame, so
that what Spark shows of them starts with their message, not kprod's call stack.

``check_write`` asks the cluster once (one Metadata request, every bootstrap address at
once) whether it can be reached and authenticated with and whether the ``topic`` option
and the exactly-once marker topic exist, so that a dead address, an unknown topic or a
wrong password fails the write once, on the driver, instead of every task after
max.block.ms. With a per-row ``topic`` column it checks the cluster alone.

Spark asks for a writer again for every microbatch of a streaming query, and a
``foreachBatch`` loop makes a batch write per microbatch, each from a Python planner
worker that Spark may or may not reuse. So a check that passed is remembered for
``CHECK_TTL_S`` in a file of ``CheckCache`` (under the OS temp directory, one per user,
named by a hash of the settings the check depends on), which every planner process on
the driver sees: a query checks at its start (unless the same check passed less than
``CHECK_TTL_S`` ago), then about every ``CHECK_TTL_S``, and again after any microbatch
or write with the same settings was aborted. A failed check
is never remembered.

Spark shows a Python data source's error as the worker's traceback text: "Traceback (most
recent call last):", every frame, and only then the error, with chained errors dropped
(its simplified traceback, on by default, clears ``__cause__``, which suppresses the
context too), so kprod cannot put its message above "Traceback". ``short_traceback``
raises the errors a user is to fix from one frame, so that their message comes right
after it.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.protocol.error_codes import KProdError

if TYPE_CHECKING:
    from spark_sink.spark.options import SinkOptions

F = TypeVar("F", bound=Callable)

log = logging.getLogger(__name__)

# How long a check that passed stands for the same settings. Long enough that a query of
# 1 s microbatches pays it once in hundreds; short enough that a query started minutes
# after the cluster changed (a topic deleted, a password rotated) is checked again.
CHECK_TTL_S = 300.0
# Entries kept at most: one per distinct (cluster, security settings, topics).
CHECK_CACHE_ENTRIES = 64

# The producer settings a check's outcome depends on: where the brokers are, how to reach
# and authenticate with them. Batching, timeouts or acks change nothing it looks at.
_CHECKED_SETTINGS = ("bootstrap.servers", "client.dns.lookup", "security.protocol", "ssl.", "sasl.")


class CheckCache:
    """Checks that passed, as empty files whose modification time is when: shared by every
    Python process of the driver (Spark's planner and commit workers, reused or not), so
    that a streaming query or a foreachBatch loop does not ask the cluster per microbatch.

    The directory is the user's own (mode 0700, checked on every use): the file names are
    hashes of settings that include passwords. Where it cannot be made safely, nothing is
    remembered and every write checks."""

    def __init__(self, directory: Path, ttl_s: float = CHECK_TTL_S, entries: int = CHECK_CACHE_ENTRIES, *,
                 clock: Time = SYSTEM_TIME) -> None:
        self.directory = directory
        self.ttl_s = ttl_s
        self.entries = entries
        self._clock = clock  # its wall clock, against the files' modification times

    @staticmethod
    def key(producer_config: Mapping[str, str], topics: Iterable[str]) -> str:
        """The name of a check's entry: a hash of the settings and topics it depends on."""
        settings = {k: v for k, v in producer_config.items() if k.startswith(_CHECKED_SETTINGS)}
        text = json.dumps({"settings": settings, "topics": sorted(set(topics))}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:40]

    def _usable(self) -> Path | None:
        """The directory, made if missing, or None unless it is a directory of this user
        that no one else may read or write (not a symbolic link someone else placed)."""
        try:
            self.directory.mkdir(mode=0o700, parents=False, exist_ok=True)
            info = os.lstat(self.directory)
        except OSError:
            return None
        if not stat.S_ISDIR(info.st_mode) or info.st_mode & 0o077:
            return None
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            return None
        return self.directory

    def passed_recently(self, key: str) -> bool:
        """Whether a check with this key passed less than ``ttl_s`` ago."""
        directory = self._usable()
        if directory is None:
            return False
        try:
            age = self._clock.wall_ms() / 1000 - os.stat(directory / key).st_mtime
        except OSError:
            return False
        return 0 <= age < self.ttl_s

    def passed(self, key: str) -> None:
        """Remember that the check with this key passed now; drop expired and excess entries."""
        directory = self._usable()
        if directory is None:
            return
        path = directory / key
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
            now = self._clock.wall_ms() / 1000  # the clock its reads compare with
            os.utime(path, (now, now))
        except OSError:
            return
        self._prune(directory)

    def forget(self, key: str) -> None:
        """The next write with this key checks again (its check failed, or a write with its
        settings was aborted)."""
        directory = self._usable()
        if directory is not None:
            try:
                os.unlink(directory / key)
            except OSError:
                pass

    def _prune(self, directory: Path) -> None:
        now = self._clock.wall_ms() / 1000
        try:
            aged = sorted((now - e.stat().st_mtime, e.path) for e in os.scandir(directory) if e.is_file())
        except OSError:
            return
        for rank, (age, path) in enumerate(aged):
            if rank >= self.entries or not 0 <= age < self.ttl_s:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _temp_root() -> str:
    """The OS temp directory, without ``tempfile.gettempdir()`` fixing it for the whole
    process (it stores its answer in ``tempfile.tempdir``)."""
    if tempfile.tempdir:
        return tempfile.tempdir
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isdir(value):
            return value
    return "/tmp" if os.name == "posix" else os.getcwd()


def _user_tag() -> str:
    if hasattr(os, "getuid"):
        return str(os.getuid())
    name = os.environ.get("USERNAME") or os.environ.get("USER") or "user"
    return hashlib.sha256(name.encode()).hexdigest()[:12]


@functools.cache
def check_cache() -> CheckCache:
    """The driver's cache of passed checks (one directory per user under the temp dir)."""
    return CheckCache(Path(_temp_root()) / f"kprod-cluster-checks-{_user_tag()}")


def _checked_topics(options: SinkOptions) -> list[str]:
    topics = [options.topic] if options.topic else []
    if options.exactly_once is not None:
        topics.append(options.exactly_once.marker_topic)
    if options.errors is not None and options.errors.dead_letter_topic:
        topics.append(options.errors.dead_letter_topic)
    return topics


@functools.cache
def user_errors() -> tuple[type[KProdError], ...]:
    """Errors whose message says what to fix: their frames inside kprod would only push it
    down. Imported when first needed: this module is imported where the producer is not
    (see :mod:`spark_sink.spark.source`)."""
    from spark_sink.producer import (
        AuthenticationError,
        ColumnError,
        ConfigError,
        InvalidPartitionError,
        KafkaTimeoutError,
        RecordTooLargeError,
    )
    from spark_sink.protocol.error_codes import KafkaError

    return (ConfigError, ColumnError, AuthenticationError, KafkaTimeoutError, KafkaError, InvalidPartitionError,
            RecordTooLargeError)


def check_write(options: SinkOptions, cache: CheckCache | None = None, clock: Time = SYSTEM_TIME) -> bool:
    """Raise the error a write's tasks would meet at their start: BrokersUnreachableError
    (each bootstrap address and what happened), SslAuthenticationError /
    SaslAuthenticationError, UnknownTopicError, or the broker's error for a topic.

    Returns whether the cluster was asked: not when ``kprod.clusterCheck=false``, nor when
    the same check passed less than ``CHECK_TTL_S`` ago (see :class:`CheckCache`)."""
    if not options.check_timeout_ms:
        return False
    cache = check_cache() if cache is None else cache
    topics = _checked_topics(options)
    key = cache.key(options.producer_config, topics)
    if cache.passed_recently(key):
        return False
    from spark_sink.client import check_cluster
    from spark_sink.producer import BrokersUnreachableError

    started = clock()
    try:
        check_cluster(options.producer_config, topics, options.check_timeout_ms, clock=clock)
    except BrokersUnreachableError as exc:
        cache.forget(key)
        raise BrokersUnreachableError(f"{exc} (checked on the driver before any task ran; kprod.clusterCheck=false "
                                      "skips the check where only the executors reach the brokers)") from None
    except BaseException as exc:
        cache.forget(key)
        dead = options.errors.dead_letter_topic if options.errors is not None else None
        if dead and isinstance(exc, KProdError) and repr(dead) in str(exc):
            raise type(exc)(f"option 'kprod.errors.deadLetterTopic': the dead-letter topic {dead!r} cannot be "
                            f"written: {exc}") from None
        raise
    cache.passed(key)
    log.info("kprod: the driver checked the cluster at %s (topics %s) in %.0f ms", options.producer_config.get(
        "bootstrap.servers"), topics, clock() - started)
    return True


def forget_check(options: SinkOptions, cache: CheckCache | None = None) -> None:
    """After an aborted write or microbatch: the next write with these settings checks the
    cluster again instead of trusting an earlier check."""
    if options.check_timeout_ms:
        cache = check_cache() if cache is None else cache
        cache.forget(cache.key(options.producer_config, _checked_topics(options)))


def _without_traceback(error: KProdError) -> KProdError:
    """A copy of ``error`` that was never raised: no frames, no chained errors."""
    try:
        return copy.copy(error)
    except Exception:  # a class that cannot be rebuilt from its args
        return KProdError(str(error))


def short_traceback(func: F) -> F:
    """Re-raise the errors of ``func`` that are the user's to fix (options, columns, the
    cluster, a record) from ``func`` itself, so that the traceback text Spark shows has one
    frame before kprod's message, not kprod's whole call stack."""
    @functools.wraps(func)
    def wrapper(*args: object, **kwargs: object) -> object:
        try:
            return func(*args, **kwargs)
        except user_errors() as exc:  # evaluated only once an error is raised
            error = _without_traceback(exc)
        # Outside the except block, so the copy gets no context: nothing prints before it.
        raise error
    return wrapper  # type: ignore[return-value]
