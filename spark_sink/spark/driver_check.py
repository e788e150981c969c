"""The driver's check before any task runs, and kprod's errors raised from one frame, so
that what Spark shows of them starts with their message, not kprod's call stack.

``check_write`` asks the cluster once (one Metadata request, every bootstrap address at
once) whether it can be reached and authenticated with and whether the ``topic`` option
and the exactly-once marker topic exist, so that a dead address, an unknown topic or a
wrong password fails the write once, on the driver, instead of every task after
max.block.ms. With a per-row ``topic`` column it checks the cluster alone.

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
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from spark_sink.protocol.errors import KProdError

if TYPE_CHECKING:
    from spark_sink.spark.options import SinkOptions

F = TypeVar("F", bound=Callable)


@functools.cache
def user_errors() -> tuple[type[KProdError], ...]:
    """Errors whose message says what to fix: their frames inside kprod would only push it
    down. Imported when first needed: this module is imported where the producer is not
    (see :mod:`spark_sink.spark.source`)."""
    from spark_sink.producer import (
        AuthenticationError, ColumnError, ConfigError, InvalidPartitionError, KafkaTimeoutError, RecordTooLargeError,
    )
    from spark_sink.protocol.errors import KafkaError

    return (ConfigError, ColumnError, AuthenticationError, KafkaTimeoutError, KafkaError, InvalidPartitionError,
            RecordTooLargeError)


def check_write(options: SinkOptions) -> None:
    """Raise the error a write's tasks would meet at their start: BrokersUnreachableError
    (each bootstrap address and what happened), SslAuthenticationError /
    SaslAuthenticationError, UnknownTopicError, or the broker's error for a topic."""
    from spark_sink.producer import BrokersUnreachableError, check_cluster

    if not options.check_timeout_ms:
        return
    topics = [options.topic] if options.topic else []
    if options.exactly_once is not None:
        topics.append(options.exactly_once.marker_topic)
    try:
        check_cluster(options.producer_config, topics, options.check_timeout_ms)
    except BrokersUnreachableError as exc:
        raise BrokersUnreachableError(f"{exc} (checked on the driver before any task ran; kprod.clusterCheck=false "
                                      "skips the check where only the executors reach the brokers)") from None


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
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except user_errors() as exc:  # evaluated only once an error is raised
            error = _without_traceback(exc)
        # Outside the except block, so the copy gets no context: nothing prints before it.
        raise error
    return wrapper  # type: ignore[return-value]
