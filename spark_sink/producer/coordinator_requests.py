"""The queue of a transactional producer's requests to its coordinators.

Requests wait in order and go one at a time: the Sender takes the head when it is due,
finds its coordinator first (:class:`~spark_sink.producer.coordinators.Coordinators`),
sends it, and hands the answer back. An answer ends a request, has it retried after
retry.backoff.ms (finding the coordinator again if it moved), or fails it for good, which
the TransactionManager turns into a failed transaction. The flow between requests is
written on them: a request names the one that follows it (``then``: AddOffsetsToTxn, then
the offsets themselves to the group's coordinator), and whether its answer settles its
result (``settles``: EndTxn's settles only once a new epoch, if one is needed, is in).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_sink.producer.batch import TopicPartition
from spark_sink.producer.coordinators import Coordinators
from spark_sink.producer.errors import KafkaTimeoutError
from spark_sink.protocol.errors import OperationNotAttemptedError
from spark_sink.protocol.messages import ApiKey

log = logging.getLogger(__name__)


class TransactionalResult:
    """The outcome of one transaction call, which the application waits for."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: Exception | None = None
        # A wait timed out before the outcome, and none has returned it since: the call is
        # to be retried, and the retry waits for this same result.
        self.retry_due = False

    def done(self, error: Exception | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout_s: float | None, what: str) -> None:
        if not self._done.wait(timeout_s):
            self.retry_due = True
            raise KafkaTimeoutError(f"{what} did not finish within {timeout_s * 1000:.0f} ms (max.block.ms); "
                                    f"the request goes on: call {what} again for its outcome")
        self.retry_due = False
        if self.error is not None:
            raise self.error


@dataclass(eq=False)
class TxnRequest:
    """A request to a coordinator, queued until the Sender can send it."""

    api_key: ApiKey
    coordinator: int  # TRANSACTION_COORDINATOR or GROUP_COORDINATOR
    key: str  # the transactional id or group id the coordinator is found by
    body: Any  # the request, an instance of its kmsg class
    handle: Callable[[Any], Exception | None]  # the answer's error, None when done
    result: TransactionalResult | None = None
    then: TxnRequest | None = None  # goes next once this one is done, and settles ``result``
    settles: bool = True  # False: ``handle`` settles ``result`` itself
    not_before: float = 0.0
    partitions: set[TopicPartition] = field(default_factory=set)  # AddPartitionsToTxn: the partitions it adds
    max_version: int | None = None  # the highest version it may go in (a transaction of protocol v1)


class CoordinatorRequests:
    """The requests waiting for their coordinators, the head one at most in flight."""

    def __init__(self, retry_backoff_ms: float) -> None:
        self._queue: deque[TxnRequest] = deque()
        self._retry_backoff_ms = retry_backoff_ms
        self.in_flight = False  # the head was sent (or its coordinator is being found)
        self.coordinators = Coordinators()

    def append(self, request: TxnRequest) -> None:
        self._queue.append(request)

    def push_first(self, request: TxnRequest) -> None:
        """``request`` goes before every waiting one."""
        self._queue.appendleft(request)

    def holds(self, api_key: ApiKey) -> bool:
        return any(r.api_key == api_key for r in self._queue)

    @property
    def head(self) -> TxnRequest | None:
        return self._queue[0] if self._queue else None

    def pop_head(self) -> TxnRequest:
        return self._queue.popleft()

    def due(self, now: float) -> TxnRequest | None:
        """The head, if it may be sent now."""
        head = self.head
        return None if self.in_flight or head is None or now < head.not_before else head

    def answered(self, request: TxnRequest, body: Any, error: Exception | None,
                 now: float) -> Exception | None:
        """``request``'s answer (``error`` if none came): None when it is done or to be
        retried, else the error that failed it (it leaves the queue)."""
        self.in_flight = False
        if error is None:
            error = request.handle(body)
        if error is not None:
            return self.failed(request, error, now)
        self._queue.remove(request)
        if request.then is not None:
            self._queue.appendleft(request.then)
        elif request.result is not None and request.settles:
            request.result.done()
        return None

    def failed(self, request: TxnRequest, error: Exception, now: float) -> Exception | None:
        """``request`` (or finding its coordinator) failed with ``error``: None when it is
        to be retried, else ``error`` (it leaves the queue)."""
        self.in_flight = False
        self.coordinators.failed(request.coordinator, request.key, error)
        if getattr(error, "retriable", False) or isinstance(error, OperationNotAttemptedError):
            log.debug("%s for %s: %s; retrying", request.api_key.name, request.key, error)
            request.not_before = now + self._retry_backoff_ms
            return None
        self._queue.remove(request)
        return error
